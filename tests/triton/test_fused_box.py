"""The fused Triton attention with bounds (``upper=``), in Triton's interpreter, against NumPy's bounded attention
in float64.

``attention_forward`` with ``SET = "box"`` solves ``p = min(u, g_+(s - tau))``, ``sum p = 1`` with the pieces of
:func:`numeric.constraints.box.box_solve` traced, and the backward kernels give the gradients in the scores (through
q and k), the values and the bounds.  The reference is :func:`numeric.attention` and
:func:`numeric.attention_backward` (``param_grads=True``: ``grads["upper"]``) in float64 on the same (float32)
inputs.

Tolerance: the kernels compute in float32 (unit roundoff ``2**-24``).  Each quantity is compared entry by entry
to ``TOL`` times the largest magnitude of its reference (a few hundred roundoffs: the scores' products of
``E = 8`` terms, the threshold solved to ``4 eps`` of ``F = 1``, the sums of up to 40 keys); a wrong
classification of an entry (free or at its bound) or a missing term moves them by ``1e-2`` or more.  The bounds
keep away from ties (an entry exactly at its bound where the map alone would put it: there the bounded map is
not differentiable and either one-sided derivative is right).
"""

from __future__ import annotations

import warnings

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from derive.box import box_jacobians, solve_box
from tests.profile import THOROUGH, crossed

from .conftest import interpreter_reason

pytestmark = pytest.mark.skipif(interpreter_reason() is not None, reason=str(interpreter_reason()))

if interpreter_reason() is None:
    import torch

    import numeric as nm
    from numeric.torch import attention, get_map

    from .test_fused_attention import _inputs, _mask  # (the same inputs and masks as the unbounded kernels' tests)

#: the largest error allowed, relative to the largest magnitude of each reference (see the module's docstring)
TOL = 2e-5


def _allowed(mask, causal, L, S):
    keep = np.ones((1, 1, L, S), bool)
    if mask is not None:
        m = mask.numpy()
        keep = keep & (m if m.dtype == bool else m > -np.inf)
    if causal:
        keep = keep & np.tril(np.ones((L, S), bool))
    return keep


def _bounds(shape, mask, causal, seed=5):
    """Bounds in ``[0.05, 0.5)`` of ``shape`` (broadcasting to the scores), each query's on its allowed keys
    raised to sum to at least 1.3 (feasible, away from ties)."""
    g = np.random.default_rng(seed)
    L, S = shape[-2:]
    u = g.uniform(0.05, 0.5, shape)
    keep = np.broadcast_to(_allowed(mask, causal, L, S), np.broadcast_shapes(shape, _allowed(mask, causal, L, S).shape))
    room = np.where(keep, np.broadcast_to(u, keep.shape), 0).sum(-1, keepdims=True)
    factor = np.where(room < 1.3, 1.3 / np.where(room > 0, room, 1), 1.0)
    # (one factor per query row of the bounds: the largest over what they broadcast to)
    factor = factor.max(axis=tuple(i for i in range(keep.ndim - 2) if shape[i] == 1), keepdims=True)
    return torch.tensor(u * factor, dtype=torch.float32)


def _check(name, params, L, S, causal, mask_kind, upper_shape=(2, 1), seed=0, scalar=None):
    q, k, v, do = _inputs(seed, L=L, S=S)
    mask = _mask(mask_kind, L, S)
    upper = (scalar if scalar is not None else
             _bounds(tuple(upper_shape) + (L, S), mask, causal).requires_grad_())
    mapping = get_map(name, **{n: torch.as_tensor(p, dtype=torch.float32) if isinstance(p, np.ndarray) else p
                               for n, p in params.items()})
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    inputs = leaves + ([upper] if scalar is None else [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the kernels ran
        out = attention(*leaves, attn_mask=mask, is_causal=causal, mapping=mapping, backend="triton", upper=upper)
        grads = torch.autograd.grad(out, inputs, do)
    np_map = nm.get_map(name, **{n: np.asarray(p, float) for n, p in params.items()})
    args = [t.double().numpy() for t in (q, k, v)]
    np_mask = None if mask is None else mask.numpy().astype(bool if mask.dtype == torch.bool else np.float64)
    np_upper = scalar if scalar is not None else upper.detach().double().numpy()
    want = nm.attention(*args, mapping=np_map, mask=np_mask, causal=causal, upper=np_upper)
    dq, dk, dv, extra = nm.attention_backward(*args, do.double().numpy(), mapping=np_map, mask=np_mask,
                                              causal=causal, upper=np_upper, param_grads=True)
    refs = [want, dq, dk, dv] + ([extra["upper"]] if scalar is None else [])
    for label, got, ref in zip(("out", "dq", "dk", "dv", "du"), (out, *grads), refs):
        err = np.abs(got.detach().double().numpy() - ref)
        assert err.max() <= TOL * max(np.abs(ref).max(), 1.0), (label, float(err.max()))
    if mask_kind is not None:  # a fully masked row: output 0
        dead = ~_allowed(mask, causal, L, S).any(-1)
        dead = np.broadcast_to(dead, out.shape[:-1])
        assert np.all(out.detach().numpy()[dead] == 0)
    return out


MAPS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 0.6}), ("entmax", {"alpha": 1.3})]
IDS = ["softmax", "sparsemax", "entmax15", "entmax-0.6", "entmax-1.3"]


#: (L, S, causal, mask) by name
LAYOUTS = {"ragged": (21, 19, False, None), "causal-bool": (21, 19, True, "bool"), "L<S-float": (7, 40, False, "float")}
# (the CI profile runs each map on one layout, each layout with a map or more; the thorough one every pair)
GRID = crossed(zip(IDS, MAPS), LAYOUTS)


@pytest.mark.parametrize(("name", "params", "layout"), [(*m, layout) for (_, m), layout in GRID],
                         ids=[f"{i}-{layout}" for (i, _), layout in GRID])
def test_bounded_attention_against_numpy(name, params, layout):
    _check(name, params, *LAYOUTS[layout])


def test_a_map_without_closed_form_link():
    # gini_log1p: its link inverted by the traced Newton inside box_sums
    _check("gini_log1p", {}, 21, 19, True, None)


def test_bounds_per_head_and_a_number():
    _check("entmax15", {}, 21, 19, False, None, upper_shape=(1, 2))
    _check("sparsemax", {}, 21, 19, False, None, upper_shape=())
    _check("sparsemax", {}, 21, 19, False, "bool", scalar=0.2)


def test_alpha_per_head_across_one():
    # the heads of each case through their case's kernels (numeric.torch.fused.case_groups), bounds per head
    _check("entmax", {"alpha": np.array([0.7, 1.4]).reshape(2, 1, 1)}, 21, 19, True, None, upper_shape=(2, 2))


def test_bounds_that_bind_nowhere_give_the_plain_kernels():
    q, k, v, _ = _inputs(1)
    for name in ("softmax", "entmax15"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            plain = attention(q, k, v, is_causal=True, mapping=name, backend="triton")
            bounded = attention(q, k, v, is_causal=True, mapping=name, backend="triton", upper=1.0)
        np.testing.assert_allclose(bounded.numpy(), plain.numpy(), rtol=0, atol=TOL)


def test_infeasible_bounds_are_refused_before_the_kernels():
    q, k, v, _ = _inputs(2)
    with pytest.raises(ValueError, match="infeasible bounds"):
        attention(q, k, v, is_causal=True, mapping="sparsemax", backend="triton", upper=0.5)
    with pytest.raises(ValueError, match="upper must be >= 0"):
        attention(q, k, v, mapping="sparsemax", backend="triton", upper=torch.full((21, 19), -1.0))


def test_multihead_attention_layer_with_bounds_runs_the_kernels(monkeypatch):
    """The torch layer's forward(..., upper=) with backend="triton" runs the bounded kernels (once per call), its
    output and input gradient equal to the layer's on the torch path in float64 within TOL of their scale."""
    from numeric.torch import MultiheadAttention, fused

    calls = []
    run = fused.fused_attention
    monkeypatch.setattr(fused, "fused_attention", lambda *a, **kw: calls.append(1) or run(*a, **kw))
    torch.manual_seed(0)
    fused_layer = MultiheadAttention(16, 2, batch_first=True, mapping="sparsemax", backend="triton")
    ref_layer = MultiheadAttention(16, 2, batch_first=True, mapping="sparsemax", backend="torch").double()
    ref_layer.load_state_dict({n: t.double() for n, t in fused_layer.state_dict().items()})
    x = torch.randn(2, 12, 16, requires_grad=True)
    xd = x.detach().double().requires_grad_()
    upper = _bounds((12, 12), None, True).reshape(12, 12)
    causal = torch.ones(12, 12, dtype=torch.bool).triu(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, _ = fused_layer(x, x, x, need_weights=False, is_causal=True, attn_mask=causal, upper=upper)
    ref, _ = ref_layer(xd, xd, xd, need_weights=False, is_causal=True, attn_mask=causal, upper=upper.double())
    assert calls == [1]
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=TOL * float(ref.detach().abs().max()))
    (g,) = torch.autograd.grad(out.sum(), x)
    (gd,) = torch.autograd.grad(ref.sum(), xd)
    torch.testing.assert_close(g.double(), gd, rtol=0, atol=TOL * float(gd.abs().max()))


def _edge_rows(backend, upper, name="entmax15"):
    """(out, dq, dk, dv) of bounded attention whose float mask puts a ``+inf`` score in query 1 and a NaN score in
    query 3, and masks query 2 fully (in float64 on the torch path, float32 in the kernels)."""
    q, k, v, do = _inputs(4, B=1, H=2, L=6, S=7)
    mask = torch.zeros(6, 7)
    mask[1, 2], mask[3, 5], mask[2] = float("inf"), float("nan"), float("-inf")
    dtype = torch.float64 if backend == "torch" else torch.float32
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=RuntimeWarning)  # (the interpreter's NumPy on NaN and inf)
        out = attention(*leaves, attn_mask=mask.to(dtype), mapping=name, backend=backend,
                        upper=upper if not isinstance(upper, torch.Tensor) else upper.to(dtype))
        grads = torch.autograd.grad(out, leaves, do.to(dtype))
    return [t.detach().double().numpy() for t in (out, *grads)]


def test_a_plus_inf_or_nan_score_gives_a_nan_row_as_on_the_torch_path():
    """A query whose scores hold ``+inf`` (or NaN) gives NaN, in the kernels as on the torch path and in NumPy (and
    as the unbounded map gives); a fully masked query zeros; the other queries are the map.  (The kernels gave a
    plausible row for the ``+inf`` score: the threshold came out infinite and was read as a fully masked row's.)
    The gradients are NaN where the torch path's are."""
    got = _edge_rows("triton", 0.6)
    want = _edge_rows("torch", 0.6)
    assert np.isnan(got[0][:, :, [1, 3]]).all() and np.isnan(want[0][:, :, [1, 3]]).all()
    assert np.all(got[0][:, :, 2] == 0)
    keep = [0, 2, 4, 5]
    np.testing.assert_allclose(got[0][:, :, keep], want[0][:, :, keep], rtol=0, atol=TOL * np.abs(want[0][:, :, keep]).max())
    for label, g, w in zip(("dq", "dk", "dv"), got[1:], want[1:]):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=label)
    assert np.isnan(got[1][:, :, [1, 3]]).all()


def test_nan_or_negative_bounds_the_host_cannot_check_give_nan_rows(monkeypatch):
    """Where the host cannot read the bounds (a traced call: its checks, numeric.torch.fused.check_bounds, do not
    run), a query with a NaN or negative bound gives NaN in the kernels, as numeric.constraints.box.box_solve gives."""
    from numeric.torch import fused

    monkeypatch.setattr(fused, "check_bounds", lambda *a, **kw: None)
    q, k, v, _ = _inputs(6, B=1, H=2, L=6, S=7)
    upper = torch.full((6, 7), 0.5)
    upper[1, 3], upper[4, 0] = float("nan"), -0.25
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=RuntimeWarning)
        out = attention(q, k, v, mapping="sparsemax", backend="triton", upper=upper).numpy()
    want = nm.attention(*(t.double().numpy() for t in (q, k, v)), mapping="sparsemax", upper=0.5)
    assert np.isnan(out[:, :, [1, 4]]).all()
    keep = [0, 2, 3, 5]
    np.testing.assert_allclose(out[:, :, keep], want[:, :, keep], rtol=0, atol=TOL * np.abs(want).max())


# ------------------------------------------------------------------ issue 43, items 3 and 4: rows at the kinks
def _rows(name, params, scores, upper, dy, backend="triton"):
    """``(p, d<p, dy>/du)`` of bounded attention whose rows have the scores ``scores`` (one row of keys, E = 1,
    q = 1, scale 1) and the bounds ``upper`` (one row per query), with identity values so that the output is
    ``p`` (float32 in the kernels, float64 on the torch path)."""
    dtype = torch.float32 if backend == "triton" else torch.float64
    upper = torch.tensor(upper, dtype=dtype)
    L, S = upper.shape
    q = torch.ones(1, 1, L, 1, dtype=dtype)
    k = torch.tensor(scores, dtype=dtype).reshape(1, 1, S, 1)
    v = torch.eye(S, dtype=dtype).reshape(1, 1, S, S)
    bounds = upper.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no fallback: the kernels ran)
        out = attention(q, k, v, scale=1.0, mapping=get_map(name, **params), backend=backend, upper=bounds)
        (du,) = torch.autograd.grad(out, bounds, torch.tensor(dy, dtype=dtype).reshape(out.shape))
    return out.detach().double().numpy().reshape(L, S), du.double().numpy()


def _box_reference(dv, scores, upper, dy):
    """``(p, d<p, dy>/du)`` of derive.box per row (the right-derivative in the bounds where no entry is free)."""
    ps, dus = [], []
    for u, g in zip(upper, dy):
        ps.append([float(a) for a in solve_box(dv, scores, upper=list(u)).p])
        jac = box_jacobians(dv, scores, upper=list(u))
        dus.append([float(mpmath.fsum(g[a] * jac["upper"][a][j] for a in range(len(scores))))
                    for j in range(len(scores))])
    return np.array(ps), np.array(dus)


def test_bounds_gradient_where_no_entry_is_free():
    """Issue 43, item 3: sparsemax [3, 2.9, 0.1] with bounds 0.5 is [0.5, 0.5, 0]: no entry free, every one at a
    bound; sum p = 1 always, so d sum(p)/du = 0.  The rule (derive.box.box_jacobians, numeric.constraints.box.box_exits):
    the right-derivative, the saturated entry leaving its bound first (least s - omega'(u): the second) standing
    in for the free ones: dy = [1, 2, 3] gives [-1, 0, 0] (the kernels gave [1, 2, 0], the dy on the saturated
    entries); dy = 1 gives d sum(p)/du = 0 (the kernels gave [1, 1, 0]).  The third row (bounds 0.6) has free
    entries, for contrast."""
    scores, upper = [3.0, 2.9, 0.1], [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0.6, 0.6, 0.6]]
    dy = [[1.0, 2.0, 3.0], [1.0, 1.0, 1.0], [1.0, 2.0, 3.0]]
    p, du = _rows("sparsemax", {}, scores, upper, dy)
    want_p, want_du = _box_reference(_derivation("sparsemax"), scores, upper, dy)
    np.testing.assert_allclose(want_du[0], [-1.0, 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(p, want_p, rtol=0, atol=TOL)
    np.testing.assert_allclose(du, want_du, rtol=0, atol=TOL * np.abs(want_du).max())
    np.testing.assert_allclose(du[1], 0.0, atol=TOL)  # d sum(p)/du = 0 (dy = 1)
    _, torch_du = _rows("sparsemax", {}, scores, upper, dy, backend="torch")
    np.testing.assert_allclose(du, torch_du, rtol=0, atol=TOL * np.abs(torch_du).max())


def test_large_alpha_rows_sum_to_one():
    """Issue 43, item 4, in the kernels' range of alpha (entmax up to alpha = 3: a steeper link falls back to the
    torch path): entmax([1, 2, 3], alpha=3) with bounds [0.5, 0.49995, 0.49995] leaves 1e-4 for the first entry,
    below float32's resolution of its link (g jumps from 0 to ~7e-4 between neighbouring thresholds).  The kernels
    gave [0, 0.49995, 0.49995] (sum 0.9999); box_solve's rule (box_between) gives the jump's entries the rest:
    [1e-4, 0.49995, 0.49995].  The second row's first bound (3e-4) is below the jump too: there the entry is at its
    bound at both ends of the bracket, and the output is blended between them."""
    scores = [1.0, 2.0, 3.0]
    upper = [[0.5, 0.49995, 0.49995], [3e-4, 0.49995, 0.49995]]
    dy = [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
    p, du = _rows("entmax", {"alpha": 3.0}, scores, upper, dy)
    want_p, want_du = _box_reference(_derivation("entmax", 3), scores, upper, dy)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=0, atol=TOL)
    np.testing.assert_allclose(p, want_p, rtol=0, atol=TOL)
    np.testing.assert_allclose(du, want_du, rtol=0, atol=TOL * np.abs(want_du).max())


@pytest.mark.skipif(not THOROUGH, reason="several key blocks in the interpreter: the thorough profile")
@pytest.mark.parametrize(("name", "params", "alpha"), [("sparsemax", {}, None), ("entmax", {"alpha": 3.0}, 3)],
                         ids=["sparsemax", "entmax-3"])
def test_rows_at_the_kinks_across_key_blocks(name, params, alpha):
    """Items 3 and 4 over 40 keys (several key blocks): scores 0.5 apart, the first rows' bounds 0.25 on every key
    (the top four saturate, none free), the others' with the fifth bound just above what the rest leaves
    (``1 - 4 u`` with ``u`` a little under 0.25: below float32's resolution of entmax-3's link there)."""
    scores = [20.0 - 0.5 * j for j in range(40)]
    rows = [[0.25] * 40, [0.3] * 4 + [0.2] * 36, [0.249999] * 4 + [0.5] * 36, [0.24999] * 4 + [2e-5] + [0.5] * 35]
    dy = [[float((3 * a + 7 * j) % 11) for j in range(40)] for a in range(len(rows))]
    p, du = _rows(name, params, scores, rows, dy)
    dv = _derivation("sparsemax") if alpha is None else _derivation("entmax", alpha)
    want_p, want_du = _box_reference(dv, scores, rows, dy)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=0, atol=TOL)
    np.testing.assert_allclose(p, want_p, rtol=0, atol=TOL)
    np.testing.assert_allclose(du, want_du, rtol=0, atol=TOL * np.abs(want_du).max())
    _, torch_du = _rows(name, params, scores, rows, dy, backend="torch")
    np.testing.assert_allclose(du, torch_du, rtol=0, atol=TOL * np.abs(torch_du).max())


def _derivation(name, alpha=None):
    import sympy as sp

    from derive import derive_map
    from derive.regularizers import gini, tsallis

    return derive_map(gini() if name == "sparsemax" else tsallis(sp.Integer(alpha)))


# ------------------------------------------------------------------ issue 43, item 5: the bounds in float32
#: float32's machine epsilon
EPS32 = float(np.finfo(np.float32).eps)


def _weights_of_rows(name, x, upper, dy):
    """The fused bounded forward's weights ``p`` (float32) of the rows of scores ``x`` (``(L, n)``, ``L <= 16``: one
    query block) under the bounds ``upper`` (``(L, n)``), and the gradients ``(dq, dk, dv, du)`` of ``<p, dy>``; then
    the same of NumPy's bounded attention (box_solve, box_vjp) in float64 on the same float32 inputs.  Each query
    sees its own row: ``q = I`` (``E = L``), ``k = x^T``, scale 1; the values are the identity, so that the output
    is ``p`` itself."""
    L, n = x.shape
    q = torch.eye(L).reshape(1, 1, L, L)
    k = torch.tensor(x.T.copy()).reshape(1, 1, n, L)
    v = torch.eye(n).reshape(1, 1, n, n)
    bounds = torch.tensor(upper).requires_grad_()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no fallback: the kernels ran)
        # (the interpreter's NumPy on an exp overflowing to inf, as a GPU's exp does, at a threshold far left)
        warnings.filterwarnings("ignore", message="overflow encountered", category=RuntimeWarning)
        out = attention(*leaves, scale=1.0, mapping=name, backend="triton", upper=bounds)
        grads = torch.autograd.grad(out, leaves + [bounds], torch.tensor(dy).reshape(out.shape))
    args = [t.double().numpy() for t in (q, k, v)]
    # (float32 bounds summing to 1 may sum to 1 less a few float32 roundings, feasible within float32's sqrt(eps)
    # but not float64's: the reference raises them to sum to 1, a change of order n float32 eps, far below TOL)
    u64 = upper.astype(np.float64)
    u64 = u64 * np.maximum(1.0, 1.0 / u64.sum(-1, keepdims=True))
    want = nm.attention(*args, mapping=name, scale=1.0, upper=u64).reshape(L, n)
    dq, dk, dv, extra = nm.attention_backward(*args, dy.astype(np.float64).reshape(1, 1, L, n), mapping=name,
                                              scale=1.0, upper=u64, param_grads=True)
    got = [out.detach().numpy().reshape(L, n)] + [g.double().numpy() for g in grads]
    return got, [want, dq, dk, dv, extra["upper"]]


def _assert_bounded_weights(name, x, upper, dy):
    """``0 <= p <= u`` with no allowance and ``|sum p - 1| <= 2 n eps`` (float32), the bounds
    numeric.constraints.box.box_solve is held to (tests/constraints/test_box_defects.py::
    test_float32_keeps_the_bounds), and ``p`` and the gradients within ``TOL`` of NumPy's in float64.

    No allowance on ``p <= u``: the output is ``p`` exactly (each entry one product by 1, the others by 0, in
    float32), and p is capped at the float32 bound itself.  The sum: ``n`` float32 terms (the free entries'
    divisor and the sum's rounding, ``n eps``) and what the caps take off the free entries (their excess over the
    bound is the rounding of the divisor)."""
    (p, *grads), (want, *ref_grads) = _weights_of_rows(name, x, upper, dy)
    n = x.shape[1]
    over = (p - upper) / upper
    assert np.all(p >= 0) and np.all(p <= upper), (name, float(over.max()), np.unravel_index(over.argmax(), p.shape))
    assert np.abs(p.astype(np.float64).sum(-1) - 1).max() <= 2 * n * EPS32
    np.testing.assert_allclose(p, want, rtol=0, atol=TOL * max(np.abs(want).max(), 1.0))
    for label, got, ref in zip(("dq", "dk", "dv", "du"), grads, ref_grads):
        err = np.abs(got - ref)
        assert err.max() <= TOL * max(np.abs(ref).max(), 1.0), (label, float(err.max()))


def test_free_entries_keep_their_bounds_in_float32():
    """Issue 43, item 5: sparsemax of 16 rows of 40 scores ``5 N(0, 1)``, every bound ``1/40`` in float32 (their sum
    1 + 1.5e-8: each row has every entry at its bound but the one of least score, free just below it).  The output
    pass scaled that entry by 1 less the saturated ones over the free ones' sum, a ratio 1 + (the rounding of F) /
    (its small share), after the sums: it came out 1.4e-6 u above its bound in 10 of the 16 rows.  Scaled and
    capped at its bound (as box_solve caps), it is at most u; where it is capped it counts as saturated in the
    backward (the row has no free entry: the right-derivative in the bounds, numeric.constraints.box.box_exits),
    as in NumPy's."""
    g = np.random.default_rng(0)
    x = (5 * g.standard_normal((16, 40))).astype(np.float32)
    upper = np.full((16, 40), 1 / 40, dtype=np.float32)
    _assert_bounded_weights("sparsemax", x, upper, g.standard_normal((16, 40)).astype(np.float32))


@pytest.mark.skipif(not THOROUGH, reason="1000 keys in the interpreter (about 30 s): the thorough profile")
def test_the_measured_row_keeps_its_bounds():
    """Issue 43, item 5 as measured: sparsemax of 1000 scores ``5 N(0, 1)`` (seed 0), bounds ``1/1000`` in float32:
    the free entry came out 7.6e-4 u above its bound."""
    g = np.random.default_rng(0)
    x = (5 * g.standard_normal((1, 1000))).astype(np.float32)
    upper = np.full((1, 1000), 1 / 1000, dtype=np.float32)
    _assert_bounded_weights("sparsemax", x, upper, g.standard_normal((1, 1000)).astype(np.float32))


@st.composite
def _bounded_rows(draw):
    """``(name, scores, bounds, dy)``: 16 rows of ``n`` keys (2 to 40), scores ``c N(0, 1)``; bounds ``equal`` (1/n),
    ``tight`` (random, summing to 1 in float64, to 1 to rounding in float32) or ``slack`` (tight ones times a factor
    in [1.25, 3]: some bind, some do not)."""
    name = draw(st.sampled_from(["softmax", "sparsemax", "entmax15"]))
    n = draw(st.integers(2, 40))
    kind = draw(st.sampled_from(["equal", "tight", "slack"]))
    c = draw(st.sampled_from([0.5, 5.0, 20.0]))
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = (c * g.standard_normal((16, n))).astype(np.float32)
    if kind == "equal":
        upper = np.full((16, n), 1 / n)
    else:
        w = g.uniform(0.05, 1.0, (16, n))
        upper = w / w.sum(-1, keepdims=True)
        if kind == "slack":
            upper = upper * g.uniform(1.25, 3.0, (16, 1))
    return name, x, upper.astype(np.float32), g.standard_normal((16, n)).astype(np.float32)


@given(_bounded_rows())
def test_bounded_weights_keep_their_bounds(case):
    """Every map's bounded weights in float32 lie in ``[0, u]``, sum to 1 and are NumPy's (with their gradients),
    for bounds that sum to the total and bounds that leave room."""
    _assert_bounded_weights(*case)
