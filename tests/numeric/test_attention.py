"""Attention and layers: gradients by finite differences, invariances, the textbook formula (causality, masked keys,
permutations and the simplex on every backend: tests/attention/test_properties.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import numeric as nm

MAPS = ["softmax", "sparsemax", "entmax15", "cube"]  # cube: a user-derived map (tests/numeric/conftest.py)


def _fd(f, x, h=1e-6):
    """Central differences of the scalar f at x, entry by entry."""
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        g[idx] = (f(x + e) - f(x - e)) / (2 * h)
    return g


def _stable(mapping, q, k, mask=None, causal=False, h=1e-6):
    """True when no attention weight is within reach of a support change (sparse maps have kinks)."""
    _, w = nm.attention(q, k, np.zeros(k.shape[:-1] + (1,)), mapping=mapping, mask=mask, causal=causal, return_weights=True)
    return bool(np.all((w == 0) | (w > 1e-3)))


@pytest.mark.parametrize("mapping", MAPS)
@pytest.mark.parametrize("causal", [False, True])
@given(seed=st.integers(0, 2**16))
def test_attention_gradients(mapping, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5, 2))
    dout = rng.standard_normal((2, 4, 2))
    assume(_stable(mapping, q, k, causal=causal))
    dq, dk, dv = nm.attention_backward(q, k, v, dout, mapping=mapping, causal=causal)
    loss = lambda q_, k_, v_: float((nm.attention(q_, k_, v_, mapping=mapping, causal=causal) * dout).sum())  # noqa: E731
    np.testing.assert_allclose(dq, _fd(lambda a: loss(a, k, v), q), atol=1e-6)
    np.testing.assert_allclose(dk, _fd(lambda a: loss(q, a, v), k), atol=1e-6)
    np.testing.assert_allclose(dv, _fd(lambda a: loss(q, k, a), v), atol=1e-6)


@pytest.mark.parametrize("mapping", MAPS)
@given(seed=st.integers(0, 2**16), block=st.integers(1, 7), causal=st.booleans())
def test_blocked_equals_dense(mapping, seed, block, causal):
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((3, 7, 4)), rng.standard_normal((3, 7, 4)), rng.standard_normal((3, 7, 5))
    mask = rng.random((7, 7)) > 0.2
    dense = nm.attention(q, k, v, mapping=mapping, mask=mask, causal=causal)
    blocked = nm.attention(q, k, v, mapping=mapping, mask=mask, causal=causal, block=block)
    np.testing.assert_allclose(blocked, dense, atol=1e-14)
    dout = rng.standard_normal(dense.shape)
    for a, b in zip(nm.attention_backward(q, k, v, dout, mapping=mapping, mask=mask, causal=causal, block=block),
                    nm.attention_backward(q, k, v, dout, mapping=mapping, mask=mask, causal=causal)):
        np.testing.assert_allclose(a, b, atol=1e-13)


@pytest.mark.parametrize("mapping", MAPS)
@given(seed=st.integers(0, 2**16), data=st.data())
def test_permutation_equivariance(mapping, seed, data):
    rng = np.random.default_rng(seed)
    layer = nm.MultiHeadAttention(6, 2, mapping=mapping, dtype="float64", seed=seed)
    x = rng.standard_normal((2, 5, 6))
    perm = np.array(data.draw(st.permutations(range(5))))
    np.testing.assert_allclose(layer.forward(x[:, perm]), layer.forward(x)[:, perm], atol=1e-12)


def _sdpa(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d) + mask) v written out directly."""
    a = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        a = np.where(mask, a, -np.inf)
    a = a - a.max(-1, keepdims=True)
    e = np.exp(a)
    return (e / e.sum(-1, keepdims=True)) @ v


@given(seed=st.integers(0, 2**16), causal=st.booleans())
def test_softmax_layer_is_the_textbook_formula(seed, causal):
    rng = np.random.default_rng(seed)
    E, H, L = 8, 4, 5
    layer = nm.MultiHeadAttention(E, H, dtype="float64", seed=seed, causal=causal)
    for name in ("q_bias", "k_bias", "v_bias", "out_bias"):
        layer.params[name] = rng.standard_normal(E)
    x = rng.standard_normal((3, L, E))
    P = layer.params
    D = E // H
    mask = np.tril(np.ones((L, L), bool)) if causal else None
    heads = []
    for h in range(H):
        rows = slice(h * D, (h + 1) * D)
        q = x @ P["q_weight"][rows].T + P["q_bias"][rows]
        k = x @ P["k_weight"][rows].T + P["k_bias"][rows]
        v = x @ P["v_weight"][rows].T + P["v_bias"][rows]
        heads.append(_sdpa(q, k, v, mask))
    want = np.concatenate(heads, axis=-1) @ P["out_weight"].T + P["out_bias"]
    np.testing.assert_allclose(layer.forward(x), want, atol=1e-12)


@pytest.mark.parametrize("mapping", MAPS)
def test_multihead_is_concatenated_single_heads(mapping):
    rng = np.random.default_rng(3)
    E, H = 6, 3
    layer = nm.MultiHeadAttention(E, H, mapping=mapping, dtype="float64", seed=1, bias=False)
    x = rng.standard_normal((2, 4, E))
    P = layer.params
    D = E // H
    heads = [
        nm.attention(x @ P["q_weight"][h * D:(h + 1) * D].T, x @ P["k_weight"][h * D:(h + 1) * D].T,
                     x @ P["v_weight"][h * D:(h + 1) * D].T, mapping=mapping)
        for h in range(H)
    ]
    np.testing.assert_allclose(layer.forward(x, need_weights=True), np.concatenate(heads, -1) @ P["out_weight"].T, atol=1e-13)
    assert layer.attention_weights.shape == (2, H, 4, 4)


@pytest.mark.parametrize("mapping", MAPS)
@pytest.mark.parametrize("positional", [None, "learned", "sinusoidal"])
def test_layer_gradients(mapping, positional):
    for seed in range(7, 100):  # the first draw whose weights are away from support changes
        rng = np.random.default_rng(seed)
        layer = nm.MultiHeadAttention(4, 2, mapping=mapping, dtype="float64", seed=seed, causal=True,
                                      positional=positional, max_len=8)
        for name in ("q_bias", "k_bias", "v_bias", "out_bias"):
            layer.params[name] = 0.1 * rng.standard_normal(4)
        x = rng.standard_normal((2, 3, 4))
        dy = rng.standard_normal((2, 3, 4))
        layer.forward(x, need_weights=True)
        if np.all((layer.attention_weights == 0) | (layer.attention_weights > 1e-3)):
            break
    dx = layer.backward(dy)
    grads = dict(layer.grads)

    def loss():
        return float((layer.forward(x) * dy).sum())

    np.testing.assert_allclose(dx, _fd(lambda a: float((layer.forward(a) * dy).sum()), x), atol=1e-6)
    for name, value in layer.params.items():
        original = value.copy()

        def f(a, name=name):
            layer.params[name] = a
            return loss()

        fd = _fd(f, original)
        layer.params[name] = original
        np.testing.assert_allclose(grads[name], fd, atol=1e-6, err_msg=name)


def test_cross_attention_gradients_and_mask():
    rng = np.random.default_rng(11)
    layer = nm.MultiHeadAttention(4, 2, mapping="entmax15", dtype="float64", seed=2)
    q, kv = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4))
    mask = rng.random((2, 1, 3, 5)) > 0.3
    mask[..., 0] = True
    dy = rng.standard_normal((2, 3, 4))
    layer.forward(q, kv, mask=mask)
    dq, dk, dv = layer.backward(dy)
    f = lambda a, b: float((layer.forward(a, b, mask=mask) * dy).sum())  # noqa: E731
    np.testing.assert_allclose(dq, _fd(lambda a: f(a, kv), q), atol=1e-6)
    np.testing.assert_allclose(dk + dv, _fd(lambda b: f(q, b), kv), atol=1e-6)


def test_self_attention_of_the_seed_notes():
    rng = np.random.default_rng(0)
    layer = nm.SelfAttention(4, seed=0)
    x = rng.standard_normal((5, 4))
    Q, K, V = (layer.params[n] for n in "QKV")
    a = (x @ Q) @ (x @ K).T / np.sqrt(4)
    w = np.exp(a - a.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(layer.forward(x), w @ (x @ V), atol=1e-13)
    dy = rng.standard_normal((5, 4))
    dx = layer.backward(dy)
    np.testing.assert_allclose(dx, _fd(lambda a: float((layer.forward(a) * dy).sum()), x), atol=1e-6)
    layer.forward(x)
    layer.backward(dy)
    for name in "QKV":
        orig = layer.params[name].copy()

        def f(a, name=name):
            layer.params[name] = a
            return float((layer.forward(x) * dy).sum())

        fd = _fd(f, orig)
        layer.params[name] = orig
        np.testing.assert_allclose(layer.grads[name], fd, atol=1e-6)


def test_masks():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((4, 3)), rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    mask = rng.random((4, 5)) > 0.4
    mask[2] = False  # a query with nothing to attend to
    out = nm.attention(q, k, v, mask=mask, mapping="sparsemax")
    assert (out[2] == 0).all()
    additive = np.where(mask, 0.0, -np.inf)
    np.testing.assert_array_equal(nm.attention(q, k, v, mask=additive, mapping="sparsemax"), out)
    dq, dk, dv = nm.attention_backward(q, k, v, np.ones((4, 2)), mask=mask, mapping="sparsemax")
    assert np.isfinite(dq).all() and (dq[2] == 0).all()


def test_bad_input():
    q = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="feature size"):
        nm.attention(q, np.zeros((2, 3, 5)), np.zeros((2, 3, 5)))
    with pytest.raises(ValueError, match="same length"):
        nm.attention(q, np.zeros((2, 3, 4)), np.zeros((2, 4, 4)))
    with pytest.raises(ValueError, match="does not broadcast"):
        nm.attention(q, q, q, mask=np.ones((2, 2), bool))
    with pytest.raises(TypeError, match="boolean"):
        nm.attention(q, q, q, mask=np.ones((3, 3), int))
    with pytest.raises(ValueError, match="does not divide"):
        nm.MultiHeadAttention(6, 4)
    layer = nm.MultiHeadAttention(4, 2)
    with pytest.raises(ValueError, match=r"query must have shape \(N, length, 4\)"):
        layer.forward(np.zeros((2, 3, 5)))
    with pytest.raises(RuntimeError, match="forward"):
        nm.MultiHeadAttention(4, 2).backward(np.zeros((1, 1, 4)))


@given(seed=st.integers(0, 2**16), block=st.sampled_from([None, 1, 3]), key_block=st.integers(1, 9), causal=st.booleans())
def test_online_key_blocks_equal_dense(seed, block, key_block, causal):
    """Softmax (a closed threshold) accumulates over key blocks with rescaling; same result as dense."""
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((2, 6, 3)) * 3, rng.standard_normal((2, 9, 3)) * 3, rng.standard_normal((2, 9, 4))
    mask = rng.random((6, 9)) > 0.3
    mask[1] = False
    dense = nm.attention(q, k, v, mask=mask, causal=causal)
    online = nm.attention(q, k, v, mask=mask, causal=causal, block=block, key_block=key_block)
    np.testing.assert_allclose(online, dense, atol=1e-13)
    assert (online[:, 1] == 0).all()


@pytest.mark.parametrize("mapping", ["softmax", "entmax15"])
def test_heads_on_all_cores_equal_serial(mapping, monkeypatch):
    """Batch elements spread over threads (BLAS pinned to one thread each) give the serial numbers."""
    import importlib

    A = importlib.import_module("numeric.attention")  # the package exports a function of that name
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((2, 3, 6, 4)), rng.standard_normal((1, 3, 7, 4)), rng.standard_normal((2, 1, 7, 5))
    mask = rng.random((6, 7)) > 0.3
    dout = rng.standard_normal((2, 3, 6, 5))
    serial = A.attention(q, k, v, mapping=mapping, mask=mask, causal=True)
    serial_grads = A.attention_backward(q, k, v, dout, mapping=mapping, mask=mask, causal=True)
    monkeypatch.setattr(A, "PARALLEL_FROM", 1)
    np.testing.assert_allclose(A.attention(q, k, v, mapping=mapping, mask=mask, causal=True), serial, atol=1e-14)
    for a, b in zip(A.attention_backward(q, k, v, dout, mapping=mapping, mask=mask, causal=True), serial_grads):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-13)


def test_layer_without_weights_gives_the_same_output():
    rng = np.random.default_rng(2)
    layer = nm.MultiHeadAttention(8, 2, mapping="entmax15", causal=True, dtype="float64", seed=3)
    x = rng.standard_normal((2, 5, 8))
    with_weights = layer.forward(x, need_weights=True)
    assert layer.attention_weights.shape == (2, 2, 5, 5)
    dx = layer.backward(np.ones_like(with_weights))
    without = layer.forward(x, need_weights=False)
    assert layer.attention_weights is None
    np.testing.assert_array_equal(without, with_weights)
    np.testing.assert_allclose(layer.backward(np.ones_like(without)), dx, atol=1e-15)
