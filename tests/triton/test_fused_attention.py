"""The generated Triton attention kernels, run in Triton's interpreter, against numeric's NumPy attention (float64).

Forward and backward, several block layouts (L and S below, equal to and above
the 16-row blocks, ragged), causal, boolean and float masks, fully masked rows,
for softmax, sparsemax, entmax15, alpha-entmax (alpha = 1.3, 1.7, and one alpha per
head), a map generated from ``--expr`` (``p**3``) and two whose link has no closed form.

Tolerances: a first-order float32 error bound per output entry
(:func:`_bounds`), computed from the float64 solution; see its docstring.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from tests.profile import THOROUGH, crossed

from .conftest import interpreter_reason

pytestmark = pytest.mark.skipif(interpreter_reason() is not None, reason=str(interpreter_reason()))

if interpreter_reason() is None:
    import torch
    import triton
    import triton.language as tl  # noqa: F401 (visible to the jit function below, as the interpreter requires)

    import numeric as nm
    from numeric.kernels import triton_attention as _kernels
    from numeric.torch import attention, get_map

    _tail_model = _kernels._tail_model

    @triton.jit
    def _halved_tail_model(tail, rate, eta, d):
        # the kernels' tail model with its value at d = 0 kept and its change halved (its slope and curvature
        # off by a factor of 2; test_trusted_steps_are_measured_by_the_output_pass)
        rest, drop, bend = _tail_model(tail, rate, eta, d)
        return tail + 0.5 * (rest - tail), 0.5 * drop, 0.5 * bend

    @triton.jit
    def _round_kernel(T, LO, HI, F, W, M0, FIXED, POINT, OUT, N: tl.constexpr):
        # the rounds of the kernels' passes (narrow_bracket, threshold_round) on a block of N rows (first step:
        # the point needs only lie in the bracket)
        offs = tl.arange(0, N)
        tau = tl.load(T + offs)
        going = tl.load(FIXED + offs) == 0
        f = tl.load(F + offs)
        lo, hi = _kernels.narrow_bracket(tau, tl.load(LO + offs), tl.load(HI + offs), going, f)
        width = hi - lo
        new, _, _, going, _, took = _kernels.threshold_round(tau, lo, hi, width, width, going, f, -tl.load(W + offs),
                                                             tl.load(POINT + offs), tl.load(W + offs) > 0,
                                                             1.0 + tl.abs(tl.load(M0 + offs)), True)
        tl.store(OUT + offs, new)
        tl.store(OUT + N + offs, (going == 0).to(tl.float32))
        tl.store(OUT + 2 * N + offs, took.to(tl.float32))

U = 2.0**-24  # float32's unit roundoff


def _gamma(n):
    return n * U / (1 - n * U)


MAPS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3}), ("entmax", {"alpha": 1.7}),
        ("cube", {})]
IDS = ["softmax", "sparsemax", "entmax15", "entmax-1.3", "entmax-1.7", "cube-expr"]


def _inputs(seed, B=2, H=2, L=21, S=19, E=8, EV=4):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, H, L, E, generator=g), torch.randn(B, H, S, E, generator=g)
    v, do = torch.randn(B, H, S, EV, generator=g), torch.randn(B, H, L, EV, generator=g)
    return q, k, v, do


def _mask(kind, L, S, seed=3):
    if kind is None:
        return None
    g = torch.Generator().manual_seed(seed)
    if kind == "bool":
        m = torch.rand(L, S, generator=g) > 0.3
        m[min(2, L - 1)] = False  # a fully masked row
        return m
    m = torch.randn(2, 1, L, S, generator=g)  # float, per batch, added
    m[0, 0, min(1, L - 1)] = -math.inf  # a fully masked row in one batch
    m[1, 0, :, 0] = -math.inf
    return m


def _dense(name, params, q, k, v, do, mask, causal, scale):
    """Float64 scores, weights p, w = weight(p) and the gradients, densely (small shapes)."""
    q, k, v, do = (t.double().numpy() for t in (q, k, v, do))
    s = scale * q @ np.swapaxes(k, -1, -2)
    L, S = s.shape[-2:]
    if mask is not None:
        m = mask.numpy()
        s = np.where(m, s, -np.inf) if m.dtype == bool else s + m
    if causal:
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    nmap = nm.get_map(name, **{n: np.asarray(p, float) for n, p in params.items()})
    p = nmap(s)
    live = p > 0
    safe = np.where(live, p, 1.0)
    module = nmap.module
    pv = [nmap.params[n] for n in module.PARAMETERS]
    w = np.where(live, module.weight(safe, *pv), 0.0)
    wprime = np.where(live, np.abs(module.weight_d2(safe, *pv) / module.weight(safe, *pv)), 0.0)
    dp = do @ np.swapaxes(v, -1, -2)
    wsum = w.sum(-1, keepdims=True)
    c = np.where(wsum > 0, (w * dp).sum(-1, keepdims=True) / np.where(wsum > 0, wsum, 1), 0.0)
    ds = w * (dp - c)
    grads = (scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ do)
    return dict(q=q, k=k, v=v, do=do, s=s, p=p, w=w, wprime=wprime, dp=dp, c=c, ds=ds, wsum=wsum, out=p @ v,
                grads=grads, module=module, pv=pv, mask=None if mask is None else mask.double().numpy())


def _bounds(d, scale):
    """First-order float32 error bounds of the output and of dq, dk, dv, entry by entry.

    The kernels compute in float32 (unit roundoff ``u``; ``gamma_n = n u / (1 - n u)``
    bounds the rounding of a sum of ``n`` terms relative to the sum of their
    absolute values).  To first order in ``u``:

    * scores: ``|ds_ij| <= gamma_(E+1) scale sum_e |q_ie k_je| + u |mask_ij|``;
    * weights: ``dp = J ds + (rounding of g) + (threshold)``, with
      ``|J| <= diag(w) + w w^T / sum(w)`` (``J = diag(w) - w w^T / sum(w)``), a
      relative error ``rho = (16 + 2 |ln p|) u`` of each link value (exp, log, a few
      products; ``exp(k log base)`` for powers), and the threshold's stopping
      error ``dtau <= 4 u / sum(w) + 4 u (|m| + |omega'(1)| + |omega'(1/n)|)``
      (``|F - 1| <= 2u`` or ``tau`` still at ``u`` of the bracket's scale), which moves
      ``p_j = g(s_j - tau) / F`` by ``(w_j + p_j sum(w)) dtau``;
    * output: ``sum_j |dp_ij| |v_j| + gamma_S sum_j p_ij |v_j| + u |o_i|``;
    * backward: ``dP = dO v^T`` with ``gamma_Ev sum |dO v|``; ``w`` moves by
      ``|w'(p)| |dp| + rho w``; ``c = sum w dP / sum w``, ``dS = w (dP - c)``, and the
      products ``dq = scale dS k``, ``dk = scale dS^T q``, ``dv = p^T dO`` add
      ``gamma`` of their lengths.

    Returns ``(out bound, (dq, dk, dv) bounds)``.
    """
    q, k, v, do, s, p, w, wp = (d[n] for n in ("q", "k", "v", "do", "s", "p", "w", "wprime"))
    L, S, E, EV = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    finite = np.isfinite(s)
    ds = _gamma(E + 1) * scale * np.abs(q) @ np.swapaxes(np.abs(k), -1, -2)
    if d["mask"] is not None and d["mask"].dtype != bool:
        ds = ds + U * np.abs(np.where(np.isfinite(d["mask"]), d["mask"], 0))
    ds = np.where(finite, ds, 0.0)
    wsum = w.sum(-1, keepdims=True)
    safe_wsum = np.where(wsum > 0, wsum, 1.0)
    rho = np.where(p > 0, (16 + 2 * np.abs(np.log(np.where(p > 0, p, 1.0)))) * U, 0.0)
    m = np.where(finite.any(-1, keepdims=True), np.where(finite, s, -np.inf).max(-1, keepdims=True), 0.0)
    n = np.maximum(finite.sum(-1, keepdims=True), 1)
    op = d["module"].omega_prime
    ends = np.abs(op(1.0, *d["pv"])) + np.abs(op(1.0 / n, *d["pv"]))
    dtau = 4 * U / safe_wsum + 4 * U * (np.abs(m) + ends)
    dp = w * ds + w * (w * ds).sum(-1, keepdims=True) / safe_wsum + rho * p + (w + p * wsum) * dtau
    out = dp @ np.abs(v) + _gamma(S) * p @ np.abs(v) + U * np.abs(d["out"])
    ddp = _gamma(EV) * np.abs(do) @ np.swapaxes(np.abs(v), -1, -2)
    dw = wp * dp + rho * w
    r = np.abs(d["dp"] - d["c"])
    dc = ((dw * r + w * ddp).sum(-1, keepdims=True) + _gamma(S) * (w * np.abs(d["dp"])).sum(-1, keepdims=True)) / safe_wsum
    dds = dw * r + w * (ddp + dc) + 2 * U * np.abs(d["ds"])
    dq = scale * (dds + _gamma(S) * np.abs(d["ds"])) @ np.abs(k) + U * np.abs(d["grads"][0])
    dk = scale * np.swapaxes(dds + _gamma(L) * np.abs(d["ds"]), -1, -2) @ np.abs(q) + U * np.abs(d["grads"][1])
    dv = np.swapaxes(dp + _gamma(L) * p, -1, -2) @ np.abs(do) + U * np.abs(d["grads"][2])
    return out, (dq, dk, dv)


def _check(name, params, L, S, causal, mask_kind, seed=0, dtype=None, inputs=None):
    q, k, v, do = _inputs(seed, L=L, S=S) if inputs is None else inputs
    mask = _mask(mask_kind, L, S)
    scale = 1 / math.sqrt(q.shape[-1])
    mapping = get_map(name, **{n: torch.as_tensor(p, dtype=torch.float32) if isinstance(p, np.ndarray) else p
                               for n, p in params.items()})
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the kernels ran
        out = attention(*leaves, attn_mask=mask, is_causal=causal, mapping=mapping, backend="triton")
        grads = torch.autograd.grad(out, leaves, do)
    d = _dense(name, params, q, k, v, do, mask, causal, scale)
    # the dense float64 reference is numeric's NumPy attention
    np_mask = None if mask is None else mask.numpy()
    np_map = nm.get_map(name, **{n: np.asarray(p, float) for n, p in params.items()})
    ref = nm.attention(d["q"], d["k"], d["v"], mapping=np_map, mask=np_mask, causal=causal)
    np.testing.assert_allclose(d["out"], ref, rtol=0, atol=1e-12)
    ref_grads = nm.attention_backward(d["q"], d["k"], d["v"], d["do"], mapping=np_map, mask=np_mask, causal=causal)
    for a, b in zip(d["grads"], ref_grads):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    out_bound, grad_bounds = _bounds(d, scale)
    worst = []
    for got, want, bound in zip((out, *grads), (d["out"], *d["grads"]), (out_bound, *grad_bounds)):
        err = np.abs(got.detach().double().numpy() - want)
        assert np.all(err <= bound), (float((err / np.maximum(bound, 1e-300)).max()), float(err.max()))
        worst.append(float((err / np.maximum(bound, 1e-300)).max()))
    dead = d["wsum"][..., 0] == 0  # fully masked rows: output and dq exactly 0
    assert np.all(out.detach().numpy()[dead] == 0) and np.all(grads[0].numpy()[dead] == 0)
    return worst


#: (L, S, causal, mask) by name
LAYOUTS = {"ragged": (21, 19, False, None), "causal-bool": (21, 19, True, "bool"), "one-block-causal": (16, 16, True, None),
           "L<S-float": (7, 40, False, "float"), "L>S-causal-float": (33, 5, True, "float")}
# (a map's code in the kernels is its functions, a layout's the masking and blocking around them: the CI profile runs
# each map on two layouts and each layout with two maps or more, the thorough one every pair)
GRID = crossed(zip(IDS, MAPS), LAYOUTS, per=2)


@pytest.mark.parametrize(("name", "params", "layout"), [(*m, layout) for (_, m), layout in GRID],
                         ids=[f"{i}-{layout}" for (i, _), layout in GRID])
def test_forward_and_backward_against_numpy(name, params, layout):
    _check(name, params, *LAYOUTS[layout])


#: maps whose link has no closed form (its inversion traced into Triton): one dense, one sparse
TYPED = [("shannon_gini", {}), ("gini_log1p", {})]
# (the interpreter runs the traced Newton inversion one NumPy operation at a time, 7 to 11 s a case: the CI profile
# takes each map on one layout, the thorough one on four)
TYPED_GRID = crossed(TYPED, ["ragged", "L>S-causal-float", "causal-bool", "L<S-float"])


@pytest.mark.parametrize(("name", "params", "layout"), [(*m, layout) for m, layout in TYPED_GRID],
                         ids=[f"{layout}-{m[0]}" for m, layout in TYPED_GRID])
def test_maps_without_closed_form_link(name, params, layout):
    """A typed map runs the fused kernels (no fallback warning) with its link inverted by the traced Newton
    solver, within the same float32 bounds as the built-ins."""
    module = nm.get_map(name).module
    assert module.link is None and "def link(z, params)" in module.TRITON_SOURCE
    _check(name, params, *LAYOUTS[layout])


def test_one_alpha_per_head():
    _check("entmax", {"alpha": np.array([1.3, 1.7]).reshape(2, 1, 1)}, 21, 19, True, "bool")


def test_a_map_missing_a_parameter_is_named_on_every_backend():
    """A family with no alpha bound says so on the fused path as on the torch path (the fused path's grouping of
    heads by case read the missing value and raised a TypeError about float(None))."""
    q = torch.randn(1, 2, 4, 8)
    for backend in ("triton", "torch"):
        with pytest.raises(ValueError, match="needs a value for alpha"):
            attention(q, q, q, mapping="entmax", backend=backend)


def test_the_entmax_family_below_one_per_head():
    """The family entmax with every head below 1 runs its dense case's kernels (numeric.family.resolve): no
    fallback, within the float32 bounds."""
    _check("entmax", {"alpha": np.array([0.5, 0.8]).reshape(2, 1, 1)}, 21, 19, True, "bool")


@pytest.mark.parametrize("alphas", [(0.7, 1.4), (1.0, 1.4), (0.6, 1.0), (1.0, 1.0)])
def test_the_entmax_family_across_one_per_head(alphas):
    """Heads on both sides of 1, or at 1: each case's heads run that case's kernels (the dense case's, softmax's
    at the point 1, the sparse case's) and come back in the heads' order; no fallback (it fell back to the torch
    path), within the float32 bounds."""
    _check("entmax", {"alpha": np.array(alphas).reshape(2, 1, 1)}, 21, 19, True, "bool")


def test_the_entmax_family_at_one():
    """alpha = 1 given as a number is softmax's point: softmax's kernels run (the family fell back)."""
    from numeric.torch import fused

    groups = fused.case_groups(get_map("entmax", alpha=1.0), (1, 2))
    assert len(groups) == 1 and groups[0][1].name == "softmax" and groups[0][0].tolist() == [0, 1]
    assert fused.case_groups(get_map("entmax", alpha=1.5), (1, 2)) is None  # one open case: the map as it is


def test_a_family_module_has_no_kernels_of_its_own():
    """The kernels' functions are a case's: a family module handed to them is refused by name."""
    from numeric.torch import fused

    with pytest.raises(TypeError, match="entmax is a family"):
        fused.map_functions(nm.get_map("entmax", alpha=1.5).module)


@pytest.fixture(scope="module")
def tsallis_below_one(tmp_path_factory):
    """The Tsallis family with ``a in (0, 1)`` as a user generates it (dense, heavy tails, no closed-form threshold)."""
    from tests.numeric.conftest import importable_map

    with importable_map(tmp_path_factory.mktemp("tsallis_low_triton"), "(p**a - p)/(a*(a-1))", "tsallis_low",
                        ("a in (0, 1)",)):
        yield "tsallis_low"


def test_tsallis_below_one_per_head(tsallis_below_one):
    """alpha below 1 in the fused kernels: the typed Tsallis map with a in (0, 1), one a per head, forward and
    backward within the float32 bounds, no fallback."""
    _check(tsallis_below_one, {"a": np.array([0.3, 0.8]).reshape(2, 1, 1)}, 21, 19, True, "bool")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_inputs_compute_in_float32(dtype):
    """Half inputs: the float32 computation of the rounded inputs except that the weights are rounded to the half
    type before their product with v (as FlashAttention does), and the output once more: |error| <= u_h sum p |v|
    + u_h |o| <= eps_h max |v| (u_h = eps_h / 2, the weights summing to 1 and |o| <= max |v|), the float32 terms
    being far below; the gradients are finite and of the input's dtype."""
    dt = getattr(torch, dtype)
    q, k, v, do = _inputs(5, L=20, S=18)
    q, k, v, do = (t.to(dt) for t in (q, k, v, do))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention(*leaves, is_causal=True, mapping="entmax15", backend="triton")
    assert out.dtype == dt
    want = attention(q.float(), k.float(), v.float(), is_causal=True, mapping="entmax15", backend="triton")
    np.testing.assert_allclose(out.detach().float().numpy(), want.numpy(), rtol=0,
                               atol=float(torch.finfo(dt).eps) * float(v.float().abs().max()))
    grads = torch.autograd.grad(out, leaves, do)
    assert all(g.dtype == dt and bool(torch.isfinite(g).all()) for g in grads)


def test_support_skips_blocks_and_backward_reuses_it():
    """Sparse weights: the forward records which key blocks hold a weight above 0 (per query block), and the
    backward, which skips the others, gives the reference gradients within the bound."""
    from numeric.torch import fused

    q, _, v, do = _inputs(7, B=1, H=1, L=48, S=48)
    q = k = q * 3  # each query's largest score is with its own key: support in the diagonal blocks
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention(*leaves, mapping="sparsemax", backend="triton")
    node = out.grad_fn
    while not hasattr(node, "saved_tensors") or len(node.saved_tensors) < 9:
        node = node.next_functions[0][0]
    support = node.saved_tensors[8]  # (q, k, v, mask, upper, params, tau, fsum, support, ...)
    assert fused.BLOCK["cpu"] == 16 and support.dtype == torch.int8 and support.shape == (1, 3, 3)
    d = _dense("sparsemax", {}, q, k, v, do, None, False, 1 / math.sqrt(8))
    blocks = d["p"][0, 0].reshape(3, 16, 3, 16).max(axis=(1, 3)) > 0
    assert 0 < blocks.sum() < blocks.size  # some blocks are skipped
    assert np.array_equal(support[0].numpy() != 0, blocks)
    grads = torch.autograd.grad(out, leaves, do)
    _, bounds = _bounds(d, 1 / math.sqrt(8))
    for got, want, bound in zip(grads, d["grads"], bounds):
        assert np.all(np.abs(got.double().numpy() - want) <= bound)


@pytest.mark.parametrize("name", ["softmax", "entmax15"])
def test_backward_takes_c_from_the_forward(name, monkeypatch):
    """The backward reads c = sum w dP / sum w off the forward's U = sum w v (dO . U / sum w) instead of a pass
    over the keys: 7 block products per (query block, key block) pair (Q K^T, dO V^T and dS K for dQ; Q K^T,
    P^T dO, dO V^T and dS^T Q for dK and dV), where every pair holds weights; the forward makes one product more
    for it (none for softmax, whose U is its output); the gradients are the reference's within the bound."""

    q, k, v, do = _inputs(5, B=1, H=1, L=32, S=32)
    q = q * 0.05  # small scores: entmax15's weights are all positive, every pair has support
    calls = count_products(monkeypatch)
    with torch.no_grad():
        attention(q, k, v, mapping=name, backend="triton")
    inference, calls[0] = calls[0], 0
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention(*leaves, mapping=name, backend="triton")
    forward, calls[0] = calls[0], 0
    grads = torch.autograd.grad(out, leaves, do)
    pairs = 4
    assert forward == inference + (0 if name == "softmax" else pairs)
    assert calls[0] == 7 * pairs
    d = _dense(name, {}, q, k, v, do, None, False, 1 / math.sqrt(8))
    assert np.all(d["p"] > 0)
    _, bounds = _bounds(d, 1 / math.sqrt(8))
    for got, want, bound in zip(grads, d["grads"], bounds):
        assert np.all(np.abs(got.double().numpy() - want) <= bound)


@pytest.mark.parametrize("alpha", [2.5, 3.0])
def test_threshold_does_not_cycle_at_a_kink(alpha):
    """alpha-entmax beyond 2: the link has an infinite slope at the clip, so F' jumps where a score enters the
    support and plain Newton cycled between the two sides of the kink (a row of these inputs stopped at
    F = 1.009: errors 47 times the bound at alpha = 2.5); rtsafe's safeguard bisects instead."""
    _check("entmax", {"alpha": alpha}, 21, 19, False, None)


@pytest.mark.parametrize("alpha", [4.0, 10.0])
def test_links_too_steep_at_the_clip_fall_back(alpha):
    """Beyond alpha = 3 (k = 1/(alpha - 1) < 1/2) one float32 ulp of tau moves an entering score's p by about
    (a ulp)**k: the torch path runs, with a warning that says why, and equals backend="torch"."""
    from numeric.torch import fused

    q, k, v, do = _inputs(0, L=21, S=19)
    mapping = get_map("entmax", alpha=alpha)
    fused._warned.clear()
    with pytest.warns(RuntimeWarning, match="steeper than the kernels' float32 threshold resolves"):
        out = attention(q, k, v, mapping=mapping, backend="triton")
    torch.testing.assert_close(out, attention(q, k, v, mapping=mapping, backend="torch"), rtol=0, atol=0)
    assert fused.steep_at_clip(get_map("entmax", alpha=3.0).module, {"alpha": 3.0}) is None


def test_steep_links_are_read_off_the_weight(tmp_path):
    """The fallback's test on typed maps (no closed-form link) as on the built-ins: w(p) ~ p**(1 - 1/k) near
    p = 0, steep where it grows faster than 1/p.  p**4 exp(p) (k = 1/3) is steep, p**3 (k = 1/2: the cube map,
    run by the kernels above) and p**2/2 + p log(1 + p) (gini_log1p, k = 1) are not, nor is any dense map."""
    from derive import Regularizer, derive_map, generate_module
    from derive.codegen.files import load_module
    from numeric.torch import fused

    path = tmp_path / "quartic_exp.py"
    path.write_text(generate_module(derive_map(Regularizer.from_string("p**4*exp(p)", name="quartic_exp")),
                                    "quartic_exp"))
    steep = load_module(path)
    assert steep.link is None  # a typed map
    reason = fused.steep_at_clip(steep, {})
    assert reason is not None and "k = 0.333" in reason
    for name in ("cube", "gini_log1p", "shannon_gini", "softmax", "sparsemax", "entmax15"):
        assert fused.steep_at_clip(nm.get_map(name).module, {}) is None, name


def test_fallbacks_warn_once_and_say_why():
    from numeric.torch import fused

    q, k, v, _ = _inputs(9, L=5, S=6)
    fused._warned.clear()
    with pytest.warns(RuntimeWarning, match="dropout is not fused"):
        attention(q, k, v, mapping="entmax15", dropout_p=0.1, backend="triton")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same reason again: no second warning
        attention(q, k, v, mapping="entmax15", dropout_p=0.1, backend="triton")
    with pytest.warns(RuntimeWarning, match="dtype torch.float64"):
        attention(q.double(), k.double(), v.double(), mapping="entmax15", backend="triton")
    with pytest.warns(RuntimeWarning, match="plain callable"):
        attention(q, k, v, mapping=lambda s, dim: torch.softmax(s, dim), backend="triton")
    alpha = torch.tensor(1.5, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="parameter alpha requires grad"):
        attention(q, k, v, mapping=get_map("entmax", alpha=alpha), backend="triton")
    with pytest.raises(ValueError, match="backend must be"):
        attention(q, k, v, backend="cuda")
    # on CPU tensors "auto" takes the torch path, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(attention(q, k, v, mapping="entmax15"),
                                   attention(q, k, v, mapping="entmax15", backend="torch"))


def test_multihead_attention_layer_runs_the_kernels(monkeypatch):
    """numeric.torch.MultiheadAttention with backend="triton" and need_weights=False runs the kernels (once per
    call), and its output and input gradient equal the layer's on the torch path in float64 to float32's rounding
    (projections: sums of 16 products of size ~1, about 16 u ~ 1e-6 each; the attention within its bound above)."""
    from numeric.torch import MultiheadAttention, fused

    calls = []
    run = fused.fused_attention
    monkeypatch.setattr(fused, "fused_attention", lambda *a, **kw: calls.append(1) or run(*a, **kw))
    torch.manual_seed(0)
    fused_layer = MultiheadAttention(16, 2, batch_first=True, mapping="entmax15", backend="triton")
    ref_layer = MultiheadAttention(16, 2, batch_first=True, mapping="entmax15", backend="torch").double()
    ref_layer.load_state_dict({n: t.double() for n, t in fused_layer.state_dict().items()})
    x = torch.randn(2, 12, 16, requires_grad=True)
    xd = x.detach().double().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, _ = fused_layer(x, x, x, need_weights=False, is_causal=True,
                             attn_mask=torch.ones(12, 12, dtype=torch.bool).triu(1))
    ref, _ = ref_layer(xd, xd, xd, need_weights=False, is_causal=True,
                       attn_mask=torch.ones(12, 12, dtype=torch.bool).triu(1))
    assert calls == [1]
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=2e-5)
    (g,) = torch.autograd.grad(out.sum(), x)
    (gd,) = torch.autograd.grad(ref.sum(), xd)
    torch.testing.assert_close(g.double(), gd, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="backend must be"):
        MultiheadAttention(16, 2, backend="gpu")


def test_threshold_passes_skip_blocks_without_weight(monkeypatch):
    """The forward's threshold and output passes skip a key block where s_ij - m_i <= clip - omega'(1) for every
    row i of the query block (tau_i >= m_i - omega'(1)): with queries and keys of block b near 4 e_b, the scores of
    the other blocks are computed once (the first pass), those of the diagonal blocks in every pass, and the output
    is within its bound.  (Newton from the left stops in a few steps: a step landing on the bracket's end by
    rounding is the root; with strict ends it fell back to halving and took 16 to 19 steps on these rows.)"""
    from numeric.kernels import triton_attention as mod

    g = torch.Generator().manual_seed(8)
    blocks = torch.arange(64) // 16
    x = (4 * torch.nn.functional.one_hot(blocks, 8).float() + 0.1 * torch.randn(64, 8, generator=g))[None, None]
    v = torch.randn(1, 1, 64, 4, generator=g)
    calls = []
    scores = mod.block_scores
    monkeypatch.setattr(mod, "block_scores", lambda *a: calls.append((int(a[6].handle.data.ravel()[0]) // 16,
                                                                 int(a[7]) // 16)) or scores(*a))
    out = attention(x, x, v, mapping="sparsemax", backend="triton")
    counts = {(i, j): calls.count((i, j)) for i in range(4) for j in range(4)}
    assert all(counts[i, j] == 1 for i in range(4) for j in range(4) if i != j), counts
    d = _dense("sparsemax", {}, x, x, v, torch.zeros(1, 1, 64, 4), None, False, 1 / math.sqrt(8))
    # the first pass and the output pass; where a row's support has all 16 of its largest scores, Newton's steps
    # from the left in between (on a convex piecewise-linear F: at most one per key that enters the support, 16
    # in a block, and the step that stops), otherwise none: the threshold of the 16 largest is the row's
    sizes = (d["p"][0, 0] > 0).sum(-1).reshape(4, 16).max(-1)
    for i in range(4):
        assert counts[i, i] == 2 if sizes[i] < 16 else 3 <= counts[i, i] <= 1 + 17 + 1, (counts, sizes)
    bound, _ = _bounds(d, 1 / math.sqrt(8))
    assert np.all(np.abs(out.double().numpy() - d["out"]) <= bound)


def count_products(monkeypatch) -> list:
    """``[n]``: the block products (``block_product``) the kernels make from here on, forward and backward (each
    kernel module's name for it patched, ``PRODUCT_MODULES``)."""
    import importlib

    calls = [0]
    for name in _kernels.PRODUCT_MODULES:
        module = importlib.import_module(name)
        product = module.block_product
        monkeypatch.setattr(module, "block_product",
                            lambda *a, product=product: calls.__setitem__(0, calls[0] + 1) or product(*a))
    return calls


def _forward_products(monkeypatch, q, k, v, mapping):
    """``(products, out)``: the block products per (query block, key block) pair of a forward with no gradient, and
    that forward's output."""

    calls = count_products(monkeypatch)
    with torch.no_grad():
        out = attention(q, k, v, mapping=mapping, backend="triton")
    return calls[0] / (q.shape[0] * q.shape[1] * math.ceil(q.shape[-2] / 16) * math.ceil(k.shape[-2] / 16)), out


#: maps whose rows' supports pass 16 of 40 keys: two sparse, one dense typed (its link traced)
#: (a dense typed map, shannon_gini, in the thorough profile: its link inverted in the interpreter takes a minute)
BEYOND = [("entmax", {"alpha": 1.3}), ("entmax15", {})] + ([("shannon_gini", {})] if THOROUGH else [])


@pytest.mark.parametrize(("name", "params"), BEYOND, ids=[n if n != "entmax" else "entmax-1.3" for n, _ in BEYOND])
def test_rows_beyond_the_kept_scores(name, params, monkeypatch):
    """Rows whose support passes the kept largest scores (16 kept here, 40 keys) take the tail model's steps:
    the forward makes more than the first pass and the output pass (3 products per pair), and the output and
    gradients are within the float32 bounds; among the keys are 8 repeated 4 times, so that scores tie with
    the smallest kept one (the tail counts the copies the kept do not hold)."""
    from numeric.torch import fused

    monkeypatch.setitem(fused.KEEP, "cpu", 16)
    q, k, v, do = _inputs(11, L=40, S=40)
    k[..., 8:40, :] = k[..., 8:16, :].repeat(1, 1, 4, 1)
    mapping = get_map(name, **params)
    assert _forward_products(monkeypatch, q, k, v, mapping)[0] > 3
    # (the CI profile checks each map in one layout, the maps in turn; the thorough profile in both)
    for _, (causal, mask) in crossed([name], [(False, None), (True, "bool")], start=BEYOND.index((name, params))):
        _check(name, params, 40, 40, causal, mask, inputs=(q, k, v, do))


@pytest.mark.parametrize("alpha", [1.05, 3.0])
def test_tail_steps_at_the_ends_of_alpha(alpha, monkeypatch):
    """The tail model across the Tsallis family's range in the kernels: alpha = 1.05 (near softmax: a tail of
    high power, nearly exponential) and alpha = 3 (g concave, an infinite slope where a score enters: eta > 1),
    with 16 of 40 scores kept, causal with a boolean mask, within the float32 bounds."""
    from numeric.torch import fused

    monkeypatch.setitem(fused.KEEP, "cpu", 16)
    _check("entmax", {"alpha": alpha}, 40, 40, True, "bool")


def test_trusted_steps_are_measured_by_the_output_pass(monkeypatch):
    """With every step trusted (TRUST huge) and the tail's model falling half as fast as it should, the trusted
    thresholds are wrong: the output pass finds their F off 1, those rows take measured steps again, and the
    results stay within the float32 bounds."""
    from numeric.torch import fused

    monkeypatch.setitem(fused.KEEP, "cpu", 16)
    monkeypatch.setattr(_kernels, "TRUST", 1e30)
    monkeypatch.setattr(_kernels, "_tail_model", _halved_tail_model)
    _check("entmax", {"alpha": 1.3}, 40, 40, False, None, seed=12)


def test_a_step_below_the_resolution_is_taken():
    """A row whose step to its point is below the resolution of s - tau is done, and takes that step.

    Alpha-entmax 1.3 at L = 1024 left three rows' F 2.3e-6 to 2.5e-6 off 1 after its kept scores' solve.
    Each had stopped one step of 2 to 3 ulps of tau short of its model's root, with sum w near 2.8.
    The output pass allows sum w times the resolution, and those rows were just past it, so each
    took another tail pass and another output pass (docs/benchmarks.md).
    """
    n = 16
    tau = torch.full((n,), 3.9409907)
    m0 = torch.full((n,), 3.11371)
    w = torch.full((n,), 2.8)
    resolution = _kernels.RESOLUTION.value * (1 + 3.9409907 + 3.11371)
    # rows 0-7: a step of a few ulps (below the resolution); 8-11: a step of 100 resolutions; 12-15 fixed
    step = torch.tensor([2.4e-7, -2.4e-7, 4.8e-7, -4.8e-7, 6e-7, 2.4e-7, 4.8e-7, -2.4e-7] + [100 * resolution] * 4
                        + [4.8e-7] * 4)
    point = tau + step
    f = 1 + w * step  # F(tau) with slope -w: the point is Newton's
    lo, hi = tau - 1, tau + 1
    fixed = torch.zeros(n)
    fixed[12:] = 1
    out = torch.empty(3 * n)
    _round_kernel[(1,)](tau, lo, hi, f, w, m0, fixed, point, out, N=n)
    new, done, took = out[:n], out[n:2 * n] != 0, out[2 * n:] != 0
    assert took[:12].all() and done[:8].all() and not done[8:12].any() and done[12:].all()
    assert torch.equal(new[:12], point[:12])  # (before: the rows done by their small step kept tau)
    assert torch.equal(new[12:], tau[12:])
    assert float((new[:8] - tau[:8]).abs().max()) <= resolution


#: maps and the block products per pair their inference forward makes at most (L = S = 128, E = 64, 64 scores
#: kept): the first pass and the output pass where a row's support fits in the kept scores; one tail pass more
#: where it does not (alpha = 1.2: supports of about 80 keys; a dense map: all 128)
PASSES = [("sparsemax", {}, 3), ("entmax15", {}, 3), ("entmax", {"alpha": 1.2}, 4)] + (
    [("shannon_gini", {}, 4)] if THOROUGH else [])  # (as BEYOND)


@pytest.mark.parametrize(("name", "params", "most"), PASSES, ids=[p[0] if p[0] != "entmax" else "entmax-1.2" for p in PASSES])
def test_forward_makes_at_most_twice_softmax_products(name, params, most, monkeypatch):
    """Issue 23's goal for the fused forward: at most twice softmax's 2 block products per (query block, key block)
    pair on random normal scores, and the output within the float32 bound of the float64 reference."""
    from numeric.torch import fused

    assert fused.KEEP["cpu"] == 64
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 128, 64, generator=g) for _ in range(3))
    mapping = get_map(name, **params)
    products, out = _forward_products(monkeypatch, q, k, v, mapping)
    assert products <= most
    d = _dense(name, params, q, k, v, torch.zeros_like(v), None, False, 1 / 8)
    if most == 4:
        assert (d["p"] > 0).sum(-1).max() > 64  # (rows beyond the kept scores)
    bound, _ = _bounds(d, 1 / 8)
    assert np.all(np.abs(out.double().numpy() - d["out"]) <= bound)


def test_a_length_scale_runs_the_kernels_on_scaled_queries():
    """``length_scale=`` is a factor per query row, so the kernels take it on the queries: no fallback, and the
    output and the gradients (the coefficient's, one per head, too) equal the torch path's."""
    from numeric.modifiers import llama4, ssmax

    q, k, v, do = _inputs(5, L=21, S=19)
    coef = torch.tensor([0.8, 1.2])
    for make in (ssmax, lambda c: llama4(c, floor=4)):
        got = []
        for backend in ("triton", "torch"):
            leaves = [t.clone().requires_grad_() for t in (q, k, v, coef)]
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no fallback: the kernels ran
                out = attention(*leaves[:3], is_causal=True, mapping="entmax15", backend=backend,
                                length_scale=make(leaves[3]))
            got.append([out, *torch.autograd.grad(out, leaves, do)])
        for a, b in zip(*got):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-4, atol=1e-5)


#: (map, L, S, window, cap): each map with each layout in the thorough profile, a map per layout in the CI one (the
#: three passes the maps take, softmax's online one, sparsemax's and entmax15's threshold, all run)
LAYOUTS_MODIFIED = {"window": (37, 37, 5, None), "softcap": (37, 37, None, 1.5), "both-L>S": (40, 23, 20, 2.0),
                    "w1": (21, 19, 1, 3.0)}
MODIFIED = ([(n, c) for n in ("softmax", "entmax15", "sparsemax") for c in LAYOUTS_MODIFIED] if THOROUGH else
            [("softmax", "window"), ("entmax15", "softcap"), ("entmax15", "both-L>S"), ("sparsemax", "w1")])


@pytest.mark.parametrize(("name", "layout"), MODIFIED, ids=[f"{n}-{c}" for n, c in MODIFIED])
def test_softcap_and_window_run_in_the_kernels(name, layout):
    """``softcap=`` and ``window=`` run in the kernels (no fallback): output and gradients within float32 rounding
    of the float64 reference, NumPy's attention with the same keywords."""
    L, S, window, cap = LAYOUTS_MODIFIED[layout]
    q, k, v, do = _inputs(7, L=L, S=S)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the kernels ran
        out = attention(*leaves, is_causal=window is None, mapping=name, backend="triton", window=window,
                        softcap=cap)
        grads = torch.autograd.grad(out, leaves, do)
    d = [t.double().numpy() for t in (q, k, v, do)]
    want = nm.attention(*d[:3], mapping=name, causal=True, window=window, softcap=cap)
    want_grads = nm.attention_backward(*d, mapping=name, causal=True, window=window, softcap=cap)
    np.testing.assert_allclose(out.detach().double().numpy(), want, rtol=2e-5, atol=2e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g.double().numpy(), w, rtol=1e-4, atol=1e-4)


def test_a_window_skips_the_key_blocks_before_it(monkeypatch):
    """With ``window=8`` and 16-row blocks, query block ``qb`` of 8 sees key blocks ``qb - 1`` and ``qb`` (the first
    sees one): 15 (query block, key block) pairs against causal attention's 36.  Softmax's forward makes 2 block
    products per pair it visits, so exactly 30 with the window; its backward at most 7 per pair (3 in the rows'
    kernel, 4 in the keys')."""

    q, k, v, do = _inputs(3, B=1, H=1, L=128, S=128)
    calls = count_products(monkeypatch)
    counts = {}
    for window in (8, None):
        calls[0] = 0
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = attention(*leaves, is_causal=True, mapping="softmax", backend="triton", window=window)
        forward = calls[0]
        torch.autograd.grad(out, leaves, do)
        counts[window] = forward, calls[0] - forward
    assert counts[8][0] == 2 * 15 and counts[None][0] == 2 * 36
    assert counts[8][1] <= 7 * 15 < counts[None][1]


def test_softcap_and_window_on_the_box():
    """The box's bounds with a window and a cap: its feasibility read with the window's band (a row's first key
    alone must take weight 1: bound 1 on the diagonal), output and gradients as NumPy's."""
    q, k, v, do = _inputs(9, L=37, S=37)
    u = torch.full((37, 37), 0.4)
    u.diagonal().fill_(1.0)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the kernels ran
        out = attention(*leaves, mapping="entmax15", backend="triton", window=6, softcap=2.0, upper=u)
        grads = torch.autograd.grad(out, leaves, do)
    d = [t.double().numpy() for t in (q, k, v, do)]
    keywords = dict(mapping="entmax15", window=6, softcap=2.0, upper=u.double().numpy())
    np.testing.assert_allclose(out.detach().double().numpy(), nm.attention(*d[:3], **keywords), rtol=2e-5, atol=2e-5)
    for g, w in zip(grads, nm.attention_backward(*d, **keywords)):
        np.testing.assert_allclose(g.double().numpy(), w, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="infeasible bounds"):  # (row 0 sees one key, bound 0.4)
        attention(q, k, v, mapping="entmax15", backend="triton", window=6, upper=0.4)


def _sink_case(name, L, S, sink, causal=True, seed=13, params=None, **keywords):
    """The kernels (no fallback) with ``sink=`` against NumPy's attention with the same sink in float64: output and
    gradients in q, k, v and a tensor sink."""
    q, k, v, do = _inputs(seed, L=L, S=S)
    b = sink.clone().requires_grad_() if isinstance(sink, torch.Tensor) else sink
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the kernels ran
        out = attention(*leaves, mapping=get_map(name, **(params or {})), backend="triton", is_causal=causal, sink=b,
                        **keywords)
        grads = torch.autograd.grad(out, leaves + ([b] if isinstance(b, torch.Tensor) else []), do)
    d = [t.double().numpy() for t in (q, k, v, do)]
    np_sink = sink.double().numpy() if isinstance(sink, torch.Tensor) else sink
    mapping = nm.get_map(name, **(params or {}))
    want = nm.attention(*d[:3], mapping=mapping, causal=causal, sink=np_sink, **keywords)
    *want_grads, extra = nm.attention_backward(*d, mapping=mapping, causal=causal, sink=np_sink, param_grads=True,
                                               **keywords)
    if isinstance(sink, torch.Tensor):
        want_grads.append(extra["sink"])
    np.testing.assert_allclose(out.detach().double().numpy(), want, rtol=2e-5, atol=2e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g.double().numpy(), w, rtol=1e-4, atol=1e-4)
    return want


#: the maps of the sink's tests (sparsemax's sink also in test_a_sparse_head_attends_to_nothing_in_the_kernels)
SINK_MAPS = [("softmax", {}), ("entmax15", {}), ("entmax_dense", {"alpha": 0.5})] + (
    [("sparsemax", {})] if THOROUGH else [])


@pytest.mark.parametrize(("name", "params"), SINK_MAPS, ids=[n if n != "entmax_dense" else "dense-0.5" for n, _ in SINK_MAPS])
def test_sinks_per_head_run_in_the_kernels(name, params):
    """``sink=`` (one per head, a tensor with its gradient; a number, softmax1's 0) runs in the kernels: the sink is
    one more score without a value (:mod:`numeric.constraints.sink`), against NumPy's attention in float64 (a dense
    map's first pass sums the sink's exp(b - m) too)."""
    _sink_case(name, 37, 37, torch.tensor([0.5, -0.3]), params=params)
    _sink_case(name, 21, 40, 0.0, causal=False, params=params)


def test_sinks_per_row_with_a_window_and_a_softcap():
    """A sink per row (``(B, H, L, 1)``) with the scores' modifiers, and rows whose support passes the kept scores
    (16 kept of 40 keys: the sink in the tail of some rows)."""
    from numeric.torch import fused

    sink = torch.randn(2, 2, 40, 1, generator=torch.Generator().manual_seed(2))
    q, k, v, _ = _inputs(11, L=40, S=40)
    _, weights = nm.attention(q.double().numpy(), k.double().numpy(), v.double().numpy(),
                              mapping=nm.get_map("entmax", alpha=1.3), sink=sink.double().numpy() - 1.0,
                              return_weights=True)
    assert ((weights > 0).sum(-1) > 16).any()  # (rows beyond the 16 kept scores: their tails take steps)
    _sink_case("entmax15", 40, 40, sink, window=9, softcap=2.0)
    old = fused.KEEP["cpu"]
    fused.KEEP["cpu"] = 16
    try:
        _sink_case("entmax", 40, 40, sink - 1.0, causal=False, seed=11, params={"alpha": 1.3})
    finally:
        fused.KEEP["cpu"] = old


def test_a_sparse_head_attends_to_nothing_in_the_kernels():
    """A sink far above the scores takes every weight of a sparse map: output exactly 0 on those rows, and the
    gradients 0 in q, k, v (the sink's too: ``p_b = 1`` whatever ``b``)."""
    want = _sink_case("sparsemax", 21, 19, torch.tensor([50.0, 0.0]))
    assert np.all(want[:, 0] == 0) and np.any(want[:, 1] != 0)


@pytest.mark.parametrize(("name", "keywords"), [("sigmoid", {}), ("relu", {}), ("entmax15", {"total": None}),
                                                ("sigmoid", {"window": 5, "softcap": 2.0})],
                         ids=["sigmoid", "relu", "entmax15-nosum", "sigmoid-window-softcap"])
def test_maps_without_a_sum_run_in_the_kernels(name, keywords, monkeypatch):
    """A map without a sum (``sigmoid``, ``relu``, any map with ``total=None``) runs in the kernels with no threshold:
    ``p = g_+(s)``, 2 block products per pair in the inference forward (softmax's), ``c = 0`` in the backward (its
    Jacobian is diagonal); output and gradients as NumPy's in float64, to float32 rounding of their scale."""

    q, k, v, do = _inputs(17, L=37, S=37)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the kernels ran
        out = attention(*leaves, mapping=name, backend="triton", is_causal=True, **keywords)
        grads = torch.autograd.grad(out, leaves, do)
    d = [t.double().numpy() for t in (q, k, v, do)]
    want = nm.attention(*d[:3], mapping=name, causal=True, **keywords)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(out.detach().double().numpy(), want, rtol=2e-5, atol=2e-6 * scale)
    for g, w in zip(grads, nm.attention_backward(*d, mapping=name, causal=True, **keywords)):
        np.testing.assert_allclose(g.double().numpy(), w, rtol=1e-4, atol=2e-6 * float(np.abs(w).max()))
    calls = count_products(monkeypatch)
    x = torch.randn(1, 1, 64, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        attention(x, x, x, mapping=name, backend="triton", **{n: v for n, v in keywords.items() if n == "total"})
    assert calls[0] == 2 * 16  # (4 x 4 pairs)


def test_a_bounded_map_without_a_sum_falls_back():
    q, k, v, _ = _inputs(1, L=8, S=8)
    with pytest.warns(RuntimeWarning, match="maps without a sum unbounded only"):
        out = attention(q, k, v, mapping="relu", backend="triton", upper=0.5)
    np.testing.assert_allclose(out.double().numpy(), nm.attention(*(t.double().numpy() for t in (q, k, v)),
                                                                 mapping="relu", upper=0.5), rtol=1e-5, atol=1e-6)


def test_a_typed_map_with_a_sink_and_without_a_sum_in_the_kernels():
    """A typed map whose link has no closed form (``gini_log1p``: its inversion traced into Triton) with a sink per
    head and a window, and without a sum, through the kernels, as NumPy's attention in float64."""
    _sink_case("gini_log1p", 16, 16, torch.tensor([0.4, -0.6]), window=7)  # (one block: the interpreter is slow)
    q, k, v, do = _inputs(19, L=16, S=16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the kernels ran
        out = attention(*leaves, mapping="gini_log1p", backend="triton", is_causal=True, total=None)
        grads = torch.autograd.grad(out, leaves, do)
    d = [t.double().numpy() for t in (q, k, v, do)]
    want = nm.attention(*d[:3], mapping="gini_log1p", causal=True, total=None)
    np.testing.assert_allclose(out.detach().double().numpy(), want, rtol=2e-5, atol=2e-6 * float(np.abs(want).max()))
    for g, w in zip(grads, nm.attention_backward(*d, mapping="gini_log1p", causal=True, total=None)):
        np.testing.assert_allclose(g.double().numpy(), w, rtol=1e-4, atol=2e-6 * float(np.abs(w).max()))
