"""numeric maps on CuPy arrays: the same answers as NumPy and the reference, on the device (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import numeric as nm

from ._device import GPU, cp

pytestmark = GPU

MAPS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3}), ("entmax", {"alpha": 0.6})]


@pytest.mark.parametrize("name, params", MAPS)
@pytest.mark.parametrize("dtype, atol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_forward_matches_numpy(name, params, dtype, atol):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 17, 300)) * 4).astype(dtype)
    x[0, 0, ::2] = -np.inf
    x[0, 1, :] = -np.inf
    x[1, 2, 5] = np.nan
    m = nm.get_map(name, **params)
    got = m(cp.asarray(x), axis=-1)
    assert isinstance(got, cp.ndarray) and got.dtype == dtype
    want = m(x.astype(np.float64))
    np.testing.assert_allclose(cp.asnumpy(got), want, atol=atol, equal_nan=True)
    got1 = m(cp.asarray(x), axis=1)
    np.testing.assert_allclose(cp.asnumpy(got1), m(x.astype(np.float64), axis=1), atol=atol, equal_nan=True)


@pytest.mark.parametrize("name, params", MAPS)
def test_jvp_and_loss_match_numpy(name, params):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 50))
    v = rng.standard_normal((8, 50))
    labels = rng.integers(0, 50, 8)
    m = nm.get_map(name, **params)
    y = m(x)
    np.testing.assert_allclose(cp.asnumpy(m.jvp(cp.asarray(y), cp.asarray(v))), m.jvp(y, v), atol=1e-12)
    value, grad = m.loss_and_grad(cp.asarray(x), cp.asarray(labels))
    want_value, want_grad = m.loss_and_grad(x, labels)
    assert float(value) == pytest.approx(float(want_value), abs=1e-10)
    np.testing.assert_allclose(cp.asnumpy(grad), want_grad, atol=1e-12)


def test_float16_on_device():
    x = cp.asarray(np.array([[-1.0, 0.0, 0.5, 2.0]], dtype=np.float16))
    y = nm.entmax15(x)
    assert y.dtype == np.float16 and isinstance(y, cp.ndarray)


@pytest.mark.parametrize("name, params", MAPS)
def test_every_constraint_set_runs_on_the_device(name, params):
    """The box (a constraint set with no kernel of its own) on CuPy arrays: the set's solve and derivatives on the
    generic row operations (numeric.core.array_ops.ArrayOps on cupy), the answers NumPy's."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 40)) * 3
    upper = rng.uniform(0.05, 0.3, size=x.shape)
    dy = rng.standard_normal(x.shape)
    m = nm.get_map(name, **params)
    got = m(cp.asarray(x), upper=cp.asarray(upper), total=1.5)
    assert isinstance(got, cp.ndarray)
    want = m(x, upper=upper, total=1.5)
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=0, atol=1e-12)
    bounds = m.vjp_bounds(got, cp.asarray(dy), upper=cp.asarray(upper), total=1.5, x=cp.asarray(x))
    np.testing.assert_allclose(cp.asnumpy(bounds["upper"]), m.vjp_bounds(want, dy, upper=upper, total=1.5, x=x)["upper"],
                               rtol=0, atol=1e-12)
