"""Attention and layers on CuPy arrays: same numbers as NumPy, outputs on the device (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import numeric as nm

from ._device import GPU, cp

pytestmark = GPU


@pytest.mark.parametrize("mapping", ["softmax", "sparsemax", "entmax15"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_numpy(mapping, causal):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 40, 16)) for _ in range(3))
    dout = rng.standard_normal((2, 3, 40, 16))
    got = nm.attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), mapping=mapping, causal=causal)
    assert isinstance(got, cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(got), nm.attention(q, k, v, mapping=mapping, causal=causal), atol=1e-10)
    grads = nm.attention_backward(cp.asarray(q), cp.asarray(k), cp.asarray(v), cp.asarray(dout), mapping=mapping, causal=causal)
    for g, w in zip(grads, nm.attention_backward(q, k, v, dout, mapping=mapping, causal=causal)):
        np.testing.assert_allclose(cp.asnumpy(g), w, atol=1e-9)


def test_multihead_layer_on_device():
    rng = np.random.default_rng(1)
    layer = nm.MultiHeadAttention(16, 4, mapping="entmax15", dtype="float64", seed=0, causal=True)
    x = rng.standard_normal((2, 10, 16))
    want = layer.forward(x)
    want_dx = layer.backward(np.ones_like(want))
    layer.to("cupy")
    got = layer.forward(cp.asarray(x))
    dx = layer.backward(cp.ones_like(got))
    assert isinstance(got, cp.ndarray) and isinstance(layer.grads["q_weight"], cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(got), want, atol=1e-10)
    np.testing.assert_allclose(cp.asnumpy(dx), want_dx, atol=1e-9)
    with pytest.raises(TypeError, match="mixed NumPy and CuPy"):
        nm.attention(cp.asarray(x), x, x)
