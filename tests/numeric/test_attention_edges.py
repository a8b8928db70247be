"""Attention at its edges: non-finite input, empty and degenerate shapes, bad arguments, layer dtypes and weights.

The truths: keys that are absent for a query are the same as keys that are not
there at all (attention on the keys left, row by row), torch's
``scaled_dot_product_attention`` and ``nn.MultiheadAttention``, and its autograd.
"""

from __future__ import annotations

import gc

import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import numeric as nm

torch = pytest.importorskip("torch")

MAPS = ["softmax", "sparsemax", "entmax15"]
# the paths through attention: dense, query blocks, query and key blocks (softmax only has key blocks)
PATHS = {"dense": {}, "blocks": {"block": 2}, "key blocks": {"block": 3, "key_block": 2}}


def _softmax(s):
    e = np.exp(s - s.max())
    return e / e.sum()


def _sparsemax(s):
    z = np.sort(s)[::-1]
    k = np.arange(1, s.size + 1)
    support = 1 + k * z > np.cumsum(z)
    tau = (np.cumsum(z)[support][-1] - 1) / k[support][-1]
    return np.maximum(s - tau, 0)


def _entmax15(s):
    # p = [s/2 - tau]_+^2 summing to 1: bisection on tau (monotone), to float64 resolution
    s = s / 2
    lo, hi = s.max() - 1, s.max()
    for _ in range(200):
        mid = (lo + hi) / 2
        if (np.maximum(s - mid, 0) ** 2).sum() > 1:
            lo = mid
        else:
            hi = mid
    p = np.maximum(s - (lo + hi) / 2, 0) ** 2
    return p / p.sum()


REFERENCE = {"softmax": _softmax, "sparsemax": _sparsemax, "entmax15": _entmax15}


def _reference(mapping, q, k, v, allowed):
    """Attention computed query by query over the allowed keys only (the others are not there); 0 without keys."""
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], allowed.shape[:-2])
    L, S = q.shape[-2], k.shape[-2]
    q = np.broadcast_to(q, batch + q.shape[-2:])
    k = np.broadcast_to(k, batch + k.shape[-2:])
    v = np.broadcast_to(v, batch + v.shape[-2:])
    allowed = np.broadcast_to(allowed, batch + (L, S))
    out = np.zeros(batch + (L, v.shape[-1]))
    for b in np.ndindex(*batch):
        for i in range(L):
            keys = np.flatnonzero(allowed[b][i])
            if keys.size == 0:
                continue
            with np.errstate(invalid="ignore"):
                s = k[b][keys] @ q[b][i] / np.sqrt(q.shape[-1])
                if np.isnan(s).any() or (s == np.inf).any():
                    out[b][i] = np.nan
                    continue
                out[b][i] = REFERENCE[mapping](s) @ v[b][keys]
    return out


def _allowed(mask, causal, L, S):
    allowed = np.ones((L, S), bool) if mask is None else mask
    if causal:
        allowed = allowed & np.tri(L, S, dtype=bool)
    return allowed


# ------------------------------------------------------------------ non-finite input
@pytest.mark.parametrize("path", list(PATHS))
@given(seed=st.integers(0, 2**16), j=st.integers(0, 6), causal=st.booleans())
def test_a_nan_key_makes_the_rows_that_see_it_nan_on_every_path(path, seed, j, causal):
    """A NaN in a key's row is a NaN score for the queries that may attend to it: their rows are NaN, no others."""
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 7, 3)), rng.standard_normal((2, 7, 4))
    k[1, j, 0] = np.nan
    mask = rng.random((5, 7)) > 0.3
    mask[2, j] = False  # at least one query cannot see it
    got = nm.attention(q, k, v, mask=mask, causal=causal, **PATHS[path])
    want = _reference("softmax", q, k, v, _allowed(mask, causal, 5, 7))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("mapping", MAPS)
@pytest.mark.parametrize("path", list(PATHS))
@given(seed=st.integers(0, 2**16), j=st.integers(0, 5), bad=st.sampled_from([np.nan, np.inf, -np.inf]),
       additive=st.booleans())
def test_nonfinite_rows_of_absent_keys_change_nothing(mapping, path, seed, j, bad, additive):
    """A NaN or inf in the rows of k and v of a key that no query may attend to: as if the key were not there."""
    if path == "key blocks" and mapping != "softmax":
        return
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 6, 3)), rng.standard_normal((2, 6, 2))
    mask = rng.random((4, 6)) > 0.3
    mask[:, j] = False
    v[0, j, 1] = bad
    k[1, j, 2] = bad
    m = np.where(mask, 0.0, -np.inf) if additive else mask
    got = nm.attention(q, k, v, mapping=mapping, mask=m, **PATHS[path])
    assert np.isfinite(got).all()
    keep = np.delete(np.arange(6), j)
    want = nm.attention(q, k[:, keep], v[:, keep], mapping=mapping, mask=mask[:, keep])
    np.testing.assert_allclose(got, want, atol=1e-13)
    np.testing.assert_allclose(got, _reference(mapping, q, k, v, mask), atol=1e-9)
    if "key_block" in PATHS[path]:
        return
    dout = rng.standard_normal(got.shape)
    dq, dk, dv = nm.attention_backward(q, k, v, dout, mapping=mapping, mask=m, **PATHS[path])
    rq, rk, rv = nm.attention_backward(q, k[:, keep], v[:, keep], dout, mapping=mapping, mask=mask[:, keep])
    np.testing.assert_allclose(dq, rq, atol=1e-13)
    np.testing.assert_allclose(dk[:, keep], rk, atol=1e-13)
    np.testing.assert_allclose(dv[:, keep], rv, atol=1e-13)
    assert (dk[:, j] == 0).all() and (dv[:, j] == 0).all()


@pytest.mark.parametrize("path", list(PATHS))
def test_a_nan_value_in_the_future_is_seen_only_by_later_queries(path):
    """causal: v's row j reaches queries i >= j only; the others are torch SDPA's rows for any finite row j.

    (torch's own rows i < j are NaN there: 0 * NaN in its product of weights and values.)
    """
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 4))
    v = rng.standard_normal((2, 6, 4))
    v[:, 4, 0] = np.nan
    v_finite = v.copy()
    v_finite[:, 4, 0] = 7.0
    got = nm.attention(x, x, v, causal=True, **PATHS[path])
    assert np.isfinite(got[:, :4]).all()
    assert np.isnan(got[:, 4:, 0]).all() and np.isfinite(got[:, 4:, 1:]).all()
    t = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (x, x, v_finite)), is_causal=True)
    np.testing.assert_allclose(got[:, :4], t.numpy()[:, :4], atol=1e-12)
    np.testing.assert_allclose(got[:, 4:, 1:], t.numpy()[:, 4:, 1:], atol=1e-12)
    # the queries that cannot see the NaN get their gradients, and dv = P^T dout is finite
    # (dk is NaN: queries 4 and 5 see the NaN value, dP = dout v^T, and they attend to every earlier key)
    dout = rng.standard_normal(got.shape)
    dq, _, dv = nm.attention_backward(x, x, v, dout, causal=True, block=PATHS[path].get("block"))
    want_dq, _, want_dv = nm.attention_backward(x, x, v_finite, dout, causal=True)
    np.testing.assert_allclose(dq[:, :4], want_dq[:, :4], atol=1e-13)
    np.testing.assert_allclose(dv, want_dv, atol=1e-13)


def test_a_nan_query_spoils_only_its_own_row():
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((5, 3)), rng.standard_normal((6, 3)), rng.standard_normal((6, 2))
    q[2, 1] = np.nan
    for kwargs in PATHS.values():
        got = nm.attention(q, k, v, **kwargs)
        assert np.isnan(got[2]).all()
        np.testing.assert_allclose(np.delete(got, 2, 0), nm.attention(np.delete(q, 2, 0), k, v), atol=1e-13)


# ------------------------------------------------------------------ empty and degenerate shapes
def _torch_sdpa(q, k, v, causal=False):
    q, k, v = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return out, (q, k, v)


@pytest.mark.parametrize("L,S", [(0, 3), (3, 0), (0, 0)])
@pytest.mark.parametrize("mapping", MAPS)
@pytest.mark.parametrize("path", list(PATHS))
def test_no_queries_or_no_keys(L, S, mapping, path):
    """Empty results as torch gives them; without keys each query gets 0, and all gradients are 0."""
    if path == "key blocks" and mapping != "softmax":
        return
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, L, 4)), rng.standard_normal((2, S, 4)), rng.standard_normal((2, S, 5))
    dout = rng.standard_normal((2, L, 5))
    want, inputs = _torch_sdpa(q, k, v)
    want.backward(torch.from_numpy(dout))
    for causal in (False, True):
        out, w = nm.attention(q, k, v, mapping=mapping, causal=causal, return_weights=True,
                              block=PATHS[path].get("block"))
        assert out.shape == tuple(want.shape) and w.shape == (2, L, S)
        np.testing.assert_array_equal(out, want.detach().numpy())
        out = nm.attention(q, k, v, mapping=mapping, causal=causal, mask=np.ones((L, S), bool), **PATHS[path])
        np.testing.assert_array_equal(out, want.detach().numpy())
        grads = nm.attention_backward(q, k, v, dout, mapping=mapping, causal=causal, block=PATHS[path].get("block"))
        for g, t in zip(grads, inputs):
            assert g.shape == tuple(t.shape)
            np.testing.assert_array_equal(g, t.grad.numpy())


def test_no_batch_elements():
    q = np.zeros((0, 2, 3, 4))
    assert nm.attention(q, q, q).shape == (0, 2, 3, 4)
    assert [g.shape for g in nm.attention_backward(q, q, q, q)] == [(0, 2, 3, 4)] * 3


def _torch_mha(layer):
    E = layer.embed_dim
    t = torch.nn.MultiheadAttention(E, layer.num_heads, batch_first=True, dtype=torch.float64)
    P = layer.params
    with torch.no_grad():
        t.in_proj_weight.copy_(torch.from_numpy(np.concatenate([P["q_weight"], P["k_weight"], P["v_weight"]])))
        t.in_proj_bias.copy_(torch.from_numpy(np.concatenate([P["q_bias"], P["k_bias"], P["v_bias"]])))
        t.out_proj.weight.copy_(torch.from_numpy(P["out_weight"]))
        t.out_proj.bias.copy_(torch.from_numpy(P["out_bias"]))
    return t


@pytest.mark.parametrize("L,S", [(0, 3), (3, 0), (0, 0)])
def test_layers_with_no_queries_or_no_keys(L, S):
    """MultiHeadAttention against torch's nn.MultiheadAttention (output, input and parameter gradients)."""
    rng = np.random.default_rng(1)
    layer = nm.MultiHeadAttention(4, 2, dtype="float64", seed=0)
    for name in ("q_bias", "k_bias", "v_bias", "out_bias"):
        layer.params[name] = rng.standard_normal(4)
    x, kv = rng.standard_normal((2, L, 4)), rng.standard_normal((2, S, 4))
    dy = rng.standard_normal((2, L, 4))
    t = _torch_mha(layer)
    tx, tkv = torch.tensor(x, requires_grad=True), torch.tensor(kv, requires_grad=True)
    want, _ = t(tx, tkv, tkv)
    want.backward(torch.from_numpy(dy))
    y = layer.forward(x, kv)
    np.testing.assert_allclose(y, want.detach().numpy(), atol=1e-14)
    dx, dk, dv = layer.backward(dy)
    np.testing.assert_allclose(dx, tx.grad.numpy(), atol=1e-14)
    np.testing.assert_allclose(dk + dv, tkv.grad.numpy(), atol=1e-14)
    np.testing.assert_allclose(layer.grads["out_bias"], t.out_proj.bias.grad.numpy(), atol=1e-14)
    np.testing.assert_allclose(layer.grads["out_weight"], t.out_proj.weight.grad.numpy(), atol=1e-14)
    self_attention = nm.SelfAttention(4, seed=0)
    assert self_attention.forward(x).shape == (2, L, 4)
    assert self_attention.backward(dy).shape == (2, L, 4)


def test_bad_blocks_are_refused_by_name():
    q = np.zeros((3, 4))
    for value in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=rf"^block must be a positive integer or None, got {value!r}"):
            nm.attention(q, q, q, block=value)
        with pytest.raises(ValueError, match=rf"^key_block must be a positive integer or None, got {value!r}"):
            nm.attention(q, q, q, key_block=value)
        with pytest.raises(ValueError, match=rf"^block must be a positive integer or None, got {value!r}"):
            nm.attention_backward(q, q, q, q, block=value)


def test_degenerate_arguments_are_named_with_their_shapes():
    q = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match=r"q and k have no features \(q \(2, 3, 0\), k \(2, 5, 0\)\)"):
        nm.attention(np.zeros((2, 3, 0)), np.zeros((2, 5, 0)), np.zeros((2, 5, 1)))
    with pytest.raises(ValueError, match=r"no features"):
        nm.attention_backward(np.zeros((3, 0)), np.zeros((3, 0)), np.zeros((3, 1)), np.zeros((3, 1)))
    with pytest.raises(ValueError, match=r"0-d mask; the scores' shape is \(2, 3, 3\)"):
        nm.attention(q, q, q, mask=np.array(True))
    with pytest.raises(ValueError, match=r"mask of shape \(5, 2, 3, 3\) has batch dimensions that q \(2, 3, 4\)"):
        nm.attention(q, q, q, mask=np.ones((5, 2, 3, 3), bool))
    with pytest.raises(ValueError, match=r"mask of shape \(7, 3, 3\) has batch dimensions"):
        nm.attention_backward(q[0], q[0], q[0], q[0], mask=np.ones((7, 3, 3), bool))
    layer = nm.MultiHeadAttention(4, 2)
    layer.forward(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match=r"dy must have the shape of the last forward's output \(2, 3, 4\), got \(2, 4, 3\)"):
        layer.backward(np.zeros((2, 4, 3)))
    single = nm.SelfAttention(4)
    single.forward(np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"dy must have the shape of the last forward's output \(3, 4\), got \(4, 4\)"):
        single.backward(np.zeros((4, 4)))


def test_a_mask_of_keys_only():
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((2, 2, 3, 4)), rng.standard_normal((2, 2, 5, 4)), rng.standard_normal((2, 2, 5, 3))
    keys = np.array([True, False, True, True, False])
    np.testing.assert_allclose(nm.attention(q, k, v, mask=keys), nm.attention(q, k, v, mask=np.tile(keys, (3, 1))),
                               atol=1e-15)


# ------------------------------------------------------------------ layers: dtype and kept weights
@pytest.mark.parametrize("dtype", ["int32", np.int64, bool, "complex128", "U3", object])
def test_layers_refuse_non_float_dtypes(dtype):
    with pytest.raises(TypeError, match="dtype must be a floating type"):
        nm.MultiHeadAttention(8, 2, dtype=dtype)
    with pytest.raises(TypeError, match="dtype must be a floating type"):
        nm.SelfAttention(4, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", np.float64])
def test_layers_take_float_dtypes(dtype):
    layer = nm.MultiHeadAttention(8, 2, dtype=dtype, seed=0)
    single = nm.SelfAttention(4, dtype=dtype, seed=0)
    for params in (layer.params, single.params):
        assert all(p.dtype == np.dtype(dtype) for p in params.values())
        assert all(np.abs(p).max() > 0 for name, p in params.items() if "bias" not in name)


def test_weights_are_kept_only_when_asked():
    """SelfAttention and MultiHeadAttention keep no L x L array unless need_weights=True."""
    rng = np.random.default_rng(6)
    L = 1024
    x = rng.standard_normal((L, 4))
    single = nm.SelfAttention(4, seed=0)
    gc.collect()
    tracemalloc.start(8)
    try:
        before = tracemalloc.take_snapshot()
        y = single.forward(x)
        gc.collect()  # (kept: what is still referenced, not a cycle the collector has yet to free)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = [d for d in after.compare_to(before, "traceback") if d.size_diff > 0]
    kept = sum(d.size_diff for d in grown)
    assert single.attention_weights is None
    # x, q, k, v and y are L x 4 each (the message: where the largest growth was allocated)
    assert kept < L * L * 8 / 4, (kept, max(grown, key=lambda d: d.size_diff).traceback.format() if grown else None)
    np.testing.assert_array_equal(single.forward(x, need_weights=True), y)
    Q, K = single.params["Q"], single.params["K"]
    a = (x @ Q) @ (x @ K).T / 2
    np.testing.assert_allclose(single.attention_weights, np.exp(a - a.max(-1, keepdims=True)) /
                               np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True), atol=1e-13)
    layer = nm.MultiHeadAttention(4, 2, dtype="float64", seed=0)
    xb = rng.standard_normal((2, 5, 4))
    y = layer.forward(xb)
    assert layer.attention_weights is None
    np.testing.assert_array_equal(layer.forward(xb, need_weights=True), y)
    t = _torch_mha(layer)
    _, w = t(*(torch.from_numpy(xb),) * 3, average_attn_weights=False)
    np.testing.assert_allclose(layer.attention_weights, w.detach().numpy(), atol=1e-13)
