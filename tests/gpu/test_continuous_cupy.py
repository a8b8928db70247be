"""Continuous attention on CuPy arrays (the generated rbf_context kernel): the same numbers as NumPy
(skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import numeric as nm

from ._device import GPU, cp

pytestmark = GPU

MAPS = ["softmax", "sparsemax", "entmax15"]


@pytest.mark.parametrize("name", MAPS)
def test_expectation_kernel_matches_numpy(name):
    rng = np.random.default_rng(0)
    mu, var = rng.uniform(0, 1, (4, 6)), rng.uniform(1e-3, 0.2, (4, 6))
    basis = nm.GaussianBasis.uniform(32)
    cmap = nm.get_continuous_map(name)
    got = cmap.expectation_grad(cp.asarray(mu), cp.asarray(var), basis)
    want = cmap.expectation_grad(mu, var, basis)
    for g, w in zip(got, want):
        assert isinstance(g, cp.ndarray)
        np.testing.assert_allclose(cp.asnumpy(g), w, rtol=1e-10, atol=1e-10 * np.abs(w).max())


@pytest.mark.parametrize("name", MAPS)
def test_layer_forward_backward_match_numpy(name):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 40, 8))
    dy = rng.standard_normal((3, 8))
    layer = nm.ContinuousAttention(8, mapping=name, seed=0)
    y, dx = layer.forward(x), layer.backward(dy)
    grads = dict(layer.grads)
    layer.to("cupy")
    y_gpu = layer.forward(cp.asarray(x))
    dx_gpu = layer.backward(cp.asarray(dy))
    np.testing.assert_allclose(cp.asnumpy(y_gpu), y, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(cp.asnumpy(dx_gpu), dx, rtol=1e-8, atol=1e-11)
    for key, value in grads.items():
        np.testing.assert_allclose(cp.asnumpy(layer.grads[key]), value, rtol=1e-8, atol=1e-11, err_msg=key)
