"""numeric.torch.attention against SDPA, gradcheck of what is torch's own (a callable's own tensor, dropout), and its
blocked path's memory.  Every map against numeric's NumPy attention, as JAX's: tests/attention/test_against_numpy.py;
gradient checks of the masks, causal rows and blocks on every framework: tests/attention/test_gradients.py; the
properties on every backend: tests/attention/test_properties.py."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import numeric as nm  # noqa: E402
from numeric.torch.attention import BLOCK_ENTRIES, attention  # noqa: E402
from numeric.torch.maps import get_map  # noqa: E402

from .conftest import RecordingMap  # noqa: E402

INF = math.inf
F64 = torch.float64
MAPPINGS = ["softmax", "sparsemax", "entmax15", "entmax"]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _qkv(seed, batch=(2, 3), L=5, S=4, E=3, Ev=2, dtype=F64, grad=True, kbatch=None, vbatch=None):
    g = _gen(seed)
    q = torch.randn(*batch, L, E, generator=g, dtype=dtype)
    k = torch.randn(*(batch if kbatch is None else kbatch), S, E, generator=g, dtype=dtype)
    v = torch.randn(*(batch if vbatch is None else vbatch), S, Ev, generator=g, dtype=dtype)
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def _bool_mask(seed, shape, p=0.3, dead_row=None):
    m = torch.rand(*shape, generator=_gen(seed)) > p
    if dead_row is not None:
        m[..., dead_row, :] = False
    return m


def _map(name, heads=3):
    """The TorchMap for ``name``; alpha-entmax gets one alpha per head (shape (H, 1, 1)) that requires grad."""
    if name == "entmax":
        alpha = torch.linspace(1.2, 1.9, heads, dtype=F64).reshape(heads, 1, 1).requires_grad_()
        return get_map("entmax", alpha=alpha)
    return get_map(name)


def _sm(s, dim):
    return torch.softmax(s, dim)


def _grads(out, inputs, seed=99):
    g = torch.randn(out.shape, generator=_gen(seed), dtype=out.dtype)
    return torch.autograd.grad((out * g).sum(), inputs, allow_unused=True)


# ------------------------------------------------------------------ SDPA (softmax)
@pytest.mark.parametrize("block", [None, 1, 2, 3])
@pytest.mark.parametrize("mapping", ["softmax", _sm], ids=["softmax-map", "softmax-callable"])
@pytest.mark.parametrize("case", ["plain", "bool", "float", "causal", "causal-long-L", "causal-long-S", "scale", "broadcast",
                                  "mask-2d", "mask-keys-only"])
def test_softmax_equals_sdpa(case, mapping, block):
    L, S = {"causal-long-L": (6, 3), "causal-long-S": (3, 6)}.get(case, (5, 4))
    kw, extra = {}, []
    kb = vb = None
    if case == "bool":
        kw["attn_mask"] = _bool_mask(1, (2, 3, L, S), dead_row=2)
    elif case == "float":
        m = torch.randn(3, L, S, generator=_gen(2), dtype=F64)
        m[0, 1, :] = -INF  # a fully masked row
        m[1, :, 0] = -INF
        kw["attn_mask"] = m.requires_grad_()
        extra = [m]
    elif case.startswith("causal"):
        kw["is_causal"] = True
    elif case == "scale":
        kw["scale"] = 0.37
    elif case == "broadcast":
        kb, vb = (1, 3), (2, 1)
    elif case == "mask-2d":
        kw["attn_mask"] = _bool_mask(3, (L, S))
    elif case == "mask-keys-only":
        kw["attn_mask"] = torch.tensor([True, False, True, True])
    q, k, v = _qkv(0, L=L, S=S, kbatch=kb, vbatch=vb)
    ref = dict(kw)
    if case == "mask-keys-only":  # SDPA wants at least (L, S)
        ref["attn_mask"] = kw["attn_mask"].expand(L, S)
    want = F.scaled_dot_product_attention(q, k, v, **ref)
    got = attention(q, k, v, mapping=mapping, block=block, **kw)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
    for a, b in zip(_grads(got, [q, k, v, *extra]), _grads(want, [q, k, v, *extra])):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


@given(seed=st.integers(0, 2**31 - 1), L=st.integers(1, 7), S=st.integers(1, 7), E=st.integers(1, 4),
       batch=st.sampled_from([(), (2,), (2, 2)]), kind=st.sampled_from(["none", "bool", "float"]),
       causal=st.booleans(), block=st.sampled_from([None, 1, 2, 5]), scale=st.sampled_from([None, 0.5, 2.0]))
def test_softmax_equals_sdpa_property(seed, L, S, E, batch, kind, causal, block, scale):
    q, k, v = _qkv(seed, batch=batch, L=L, S=S, E=E)
    kw = dict(is_causal=causal, scale=scale)
    if kind == "bool":
        kw["attn_mask"] = _bool_mask(seed, batch[-1:] + (L, S), p=0.4)
    elif kind == "float":
        m = torch.randn(L, S, generator=_gen(seed + 1), dtype=F64)
        kw["attn_mask"] = m.masked_fill(torch.rand(L, S, generator=_gen(seed + 2)) < 0.3, -INF)
    if causal and "attn_mask" in kw:  # SDPA takes one or the other; both: SDPA with the combined bool/float mask
        tri = torch.ones(L, S, dtype=torch.bool).tril()
        m = kw.pop("attn_mask")
        ref_mask = (m & tri) if m.dtype == torch.bool else m.masked_fill(~tri, -INF)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=ref_mask, scale=scale)
        kw["attn_mask"] = m
    else:
        want = F.scaled_dot_product_attention(q, k, v, **kw)
    got = attention(q, k, v, mapping="softmax", block=block, **kw)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-13)
    for a, b in zip(_grads(got, [q, k, v]), _grads(want, [q, k, v])):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_rows_whose_threshold_underflows_backward():
    """alpha-entmax at alpha = 200 on 64 keys: ``(1/64)**199`` is below float64's normal range, so ``tau`` does not
    carry ``p`` (``c = p_max**(1/k)`` underflows); the backward solves those rows again and equals NumPy's
    (``dv = p^T dout`` needs ``p``).  Every key comes twice: supports of two tied keys, ``w = 2**198``."""
    q, k, v = _qkv(30, L=5, S=64, E=4, Ev=3)
    k.data[..., 1::2, :] = k.data[..., 0::2, :]
    out = attention(q, k, v, mapping=get_map("entmax", alpha=200.0))
    np_map = nm.get_map("entmax", alpha=200.0)
    arrays = [t.detach().numpy() for t in (q, k, v)]
    np.testing.assert_allclose(out.detach().numpy(), nm.attention(*arrays, mapping=np_map), rtol=0, atol=1e-12)
    dout = torch.randn(out.shape, generator=_gen(31), dtype=F64)
    (got,) = torch.autograd.grad(out, (v,), dout)
    # (dq and dk are w = 2**198 times differences that vanish in exact arithmetic: rounding, on both sides)
    want = nm.attention_backward(*arrays, dout.numpy(), mapping=np_map)[2]
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


# ------------------------------------------------------------------ gradcheck
def test_gradcheck_callable_with_its_own_parameter():
    """A callable using a tensor of its own that requires grad: its gradient arrives (the checkpointed blocks)."""
    q, k, v = _qkv(30, batch=(3,), L=5, S=4)
    t = torch.tensor([0.7, 1.3, 2.0], dtype=F64).reshape(3, 1, 1).requires_grad_()
    mask = _bool_mask(31, (5, 4), dead_row=3)

    def f(q, k, v, t, block):
        return attention(q, k, v, attn_mask=mask, mapping=lambda s, dim: torch.softmax(s, dim) * t, block=block)

    assert torch.autograd.gradcheck(lambda *a: f(*a, 2), (q, k, v, t))
    got = _grads(f(q, k, v, t, 2), [q, k, v, t])
    want = _grads(f(q, k, v, t, None), [q, k, v, t])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-14)


def test_gradcheck_dropout_replays_its_masks():
    """With dropout the blocked backward regenerates the forward's masks: gradcheck of the seeded function."""
    q, k, v = _qkv(40, batch=(2,), L=6, S=5)

    def f(q, k, v, block):
        torch.manual_seed(7)
        return attention(q, k, v, mapping="entmax15", dropout_p=0.3, block=block)

    assert torch.autograd.gradcheck(lambda *a: f(*a, 2), (q, k, v))
    out = f(q, k, v, 2)
    assert bool((out != f(q, k, v, 2).detach()).sum() == 0)  # seeded: the same masks
    torch.manual_seed(8)
    assert not torch.equal(out, attention(q, k, v, mapping="entmax15", dropout_p=0.3, block=2))
    assert not torch.equal(out, attention(q, k, v, mapping="entmax15", block=2))


def test_no_grad_and_grad_paths_agree():
    q, k, v = _qkv(50, L=9, S=7)
    mask = _bool_mask(51, (9, 7), dead_row=4)
    for mapping in ["entmax15", _map("entmax"), _sm]:
        want = attention(q, k, v, attn_mask=mask, mapping=mapping)
        with torch.no_grad():
            got = attention(q, k, v, attn_mask=mask, mapping=mapping, block=2)
        assert not got.requires_grad
        torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-14)


def test_value_batch_wider_than_the_scores():
    """value's batch dimensions widen the output and a mask may carry them."""
    q, k, v = _qkv(60, batch=(1,), L=4, S=3, vbatch=(2,))
    mask = _bool_mask(61, (2, 4, 3), dead_row=0)
    for block in (None, 2):
        got = attention(q, k, v, attn_mask=mask, mapping="softmax", block=block)
        want = F.scaled_dot_product_attention(q.expand(2, 4, 3), k.expand(2, 3, 3), v, attn_mask=mask)  # SDPA does not widen
        torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
        for a, b in zip(_grads(got, [q, k, v]), _grads(want, [q, k, v])):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-14)


def test_no_queries_or_no_keys():
    q, k, v = _qkv(70, L=0, S=3)
    assert attention(q, k, v).shape == (2, 3, 0, 2)
    q, k, v = _qkv(71, L=4, S=0)
    out = attention(q, k, v, mapping="entmax15")
    assert out.shape == (2, 3, 4, 2) and bool((out == 0).all())
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert bool((dq == 0).all()) and dk.shape == k.shape and dv.shape == v.shape


# ------------------------------------------------------------------ memory: the blocks
def _max_saved(fn):
    """``(out, largest number of elements among the tensors autograd saves while fn runs)``."""
    sizes = [0]

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, max(sizes)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["map", "callable"])
def test_blocks_bound_the_scores_forward_and_backward(kind, causal):
    L = S = 64
    block = 8
    q, k, v = _qkv(80, batch=(2,), L=L, S=S, E=4, Ev=4)
    mask = _bool_mask(81, (L, S), p=0.1)
    rec = RecordingMap("entmax15")
    calls = []

    def recording_callable(s, dim):
        calls.append(tuple(s.shape))
        return torch.softmax(s, dim)

    mapping, seen = (rec, rec.calls) if kind == "map" else (recording_callable, calls)
    out, saved = _max_saved(lambda: attention(q, k, v, attn_mask=mask, is_causal=causal, mapping=mapping, block=block))
    forward = list(seen)
    assert saved <= max(t.numel() for t in (q, k, v, mask))  # only inputs are kept: nothing of L x S
    out.sum().backward()
    backward = seen[len(forward):]
    assert backward, "the backward pass recomputes the blocks' weights"
    for shape in forward + backward:
        assert shape[-2] <= block and shape[-1] <= S
    if causal:  # blocks above the diagonal are skipped: block i sees the keys up to its last query
        assert sorted({shape[-1] for shape in forward if shape[-2] == block}) == list(range(block, S + 1, block))
    want = attention(q, k, v, attn_mask=mask, is_causal=causal, mapping="entmax15" if kind == "map" else _sm)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-14)


def test_default_block_holds_block_entries():
    L, S = 300, 1 << 12
    q, k, v = _qkv(90, batch=(2,), L=L, S=S, E=2, Ev=1, dtype=torch.float32, grad=False)
    rec = RecordingMap("softmax")
    attention(q, k, v, mapping=rec)
    rows = BLOCK_ENTRIES // (2 * S)
    assert {shape for shape in rec.calls} == {(2, rows, S), (2, L % rows, S)}


def _largest_allocation(fn) -> int:
    """The largest single CPU allocation (bytes) while ``fn`` runs, as torch's profiler records them."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(e.self_cpu_memory_usage for e in prof.events())


@pytest.mark.parametrize("block", [None, 2])
def test_grouped_keys_and_values_are_not_copied_per_group(block):
    """Keys and values ``(B, H_kv, 1, S, E)`` shared by the ``g`` query heads ``(B, H_kv, g, L, E)`` of grouped-query
    attention: equal to the call with them repeated per head (forward and gradients), and no allocation, forward
    or backward, is as large as the repeated keys (torch.matmul's broadcasting would expand them per product)."""
    B, Hk, G, L, S, E = 1, 2, 4, 4, 2048, 64
    g = _gen(95)
    q = torch.randn(B, Hk, G, L, E, generator=g, dtype=F64, requires_grad=True)
    k, v = (torch.randn(B, Hk, 1, S, E, generator=g, dtype=F64, requires_grad=True) for _ in range(2))
    mask = torch.rand(B, 1, 1, L, S, generator=g) > 0.2
    repeated = B * Hk * G * S * E * 8

    def run(expand: bool):
        kk, vv = (x.expand(B, Hk, G, S, E) if expand else x for x in (k, v))
        out = attention(q, kk, vv, attn_mask=mask, mapping="entmax15", block=block)
        return out, torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    assert _largest_allocation(lambda: run(False)) < repeated
    assert _largest_allocation(lambda: run(True)) >= repeated  # (the check sees a copy where there is one)
    (out, grads), (want, want_grads) = run(False), run(True)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-13)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


_MEMORY_SCRIPT = textwrap.dedent("""
    import resource, torch
    from numeric.torch.attention import attention
    L = 8192
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, L, 64, requires_grad=True) for _ in range(3))
    w = torch.randn(1, 1, L, 64)
    attention(q[..., :512, :], k[..., :512, :], v[..., :512, :], is_causal=True, block=128).sum().backward()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    (attention(q, k, v, is_causal=True) * w).sum().backward()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
""")


def test_peak_memory_of_long_causal_attention():
    """Causal L = 8192 forward + backward in float32: the peak grows by less than half an L x S matrix (128 MiB)."""
    run = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    extra_mib = float(run.stdout.strip().splitlines()[-1])
    assert extra_mib < 128, f"forward + backward raised the peak RSS by {extra_mib:.0f} MiB"


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(("change", "error", "match"), [
    (lambda q, k, v: (q[0, 0, 0], k, v), ValueError, "query must have shape"),
    (lambda q, k, v: (q.numpy(), k, v), TypeError, "query must be a torch.Tensor"),
    (lambda q, k, v: (q, k.to(torch.int64), v), TypeError, "key must be a floating-point tensor"),
    (lambda q, k, v: (q, k.float(), v), TypeError, "same dtype"),
    (lambda q, k, v: (q, k, v.to("meta")), ValueError, "same device"),
    (lambda q, k, v: (q, k[..., :2], v), ValueError, "same feature size E"),
    (lambda q, k, v: (q, k, v[..., :3, :]), ValueError, "same length S"),
    (lambda q, k, v: (q, k[:1].expand(4, 3, 4, 3), v), ValueError, "do not broadcast"),
])
def test_input_errors(change, error, match):
    q, k, v = _qkv(100, grad=False)
    with pytest.raises(error, match=match):
        attention(*change(q, k, v))


@pytest.mark.parametrize(("kw", "error", "match"), [
    (dict(attn_mask=torch.ones(5, 3, dtype=torch.bool)), ValueError, "attn_mask of shape \\(5, 3\\) does not broadcast"),
    (dict(attn_mask=torch.ones(4, 2, 3, 5, 4, dtype=torch.bool)), ValueError, "adds batch dimensions"),
    (dict(attn_mask=torch.tensor(True)), ValueError, "attn_mask must have at least one dimension"),
    (dict(attn_mask=torch.ones(5, 4, dtype=torch.int64)), TypeError, "attn_mask must be boolean"),
    (dict(attn_mask=torch.zeros(5, 4, dtype=torch.float32)), TypeError, "attn_mask must be boolean"),
    (dict(attn_mask=torch.ones(5, 4, dtype=torch.bool, device="meta")), ValueError, "attn_mask must be on"),
    (dict(attn_mask=[[True] * 4] * 5), TypeError, "attn_mask must be a torch.Tensor"),
    (dict(mapping=3), TypeError, "mapping must be"),
    (dict(mapping="no_such_map"), Exception, "no_such_map"),
    (dict(block=0), ValueError, "block must be a positive integer"),
    (dict(dropout_p=1.0), ValueError, "dropout_p"),
    (dict(scale="1"), TypeError, "scale must be a real number"),
])
def test_argument_errors(kw, error, match):
    q, k, v = _qkv(101, grad=False)
    with pytest.raises(error, match=match):
        attention(q, k, v, **kw)


def test_map_parameter_errors_name_the_parameter():
    q, k, v = _qkv(102, grad=False)
    with pytest.raises(ValueError, match="alpha"):
        attention(q, k, v, mapping=get_map("entmax", alpha=torch.full((3, 1, 4), 1.5, dtype=F64)))
    with pytest.raises(ValueError, match="needs a value for alpha"):
        attention(q, k, v, mapping="entmax")
