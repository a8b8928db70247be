"""Derivatives of torch's and JAX's maps: against NumPy's ``vjp``, ``jvp`` and ``vjp_params`` (which
tests/maps/test_reference.py checks against the mpmath reference and SymPy's Jacobian), against finite differences
(torch's gradcheck and gradgradcheck, ``jax.test_util.check_grads``, to second order), in the scores and in alpha
(a number, per row, per head, along another axis), each written once for both frameworks.

Every gradient check of a masked score goes through ``where(finite, x, -inf)``: finite differences move the live
scores only, and a masked score or a fully masked row gets a zero gradient.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import numeric as nm
from tests.backends import backend_params
from tests.profile import backend_grid, crossed
from tests.numeric.conftest import FRAMEWORK_IDS as IDS
from tests.numeric.conftest import FRAMEWORK_MAPS as MAPS

INF = math.inf
ROWS = (12, 9)
FRAMEWORKS = backend_params("autodiff")


def _scores(seed, shape=ROWS, scale=3.0):
    return np.random.default_rng(seed).normal(size=shape) * scale


def _live(x):
    """``x`` with a masked score (row 1) and a fully masked row (row 2); every other row has a support."""
    x = np.array(x)
    x[1, 3] = -INF
    x[2] = -INF
    return x


def _close(a, b, atol=1e-12):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=0, atol=atol)


def _entmax(backend, x, alpha, axis=-1):
    return backend.call(backend.get_map("entmax", alpha=alpha), x, axis)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", FRAMEWORKS, indirect=True)
def test_vjp_and_jvp_equal_numpy(backend, name, params):
    m = nm.get_map(name, **params)
    fm = backend.get_map(name, **params)
    x = _live(_scores(6))
    v = _scores(7, scale=1.0)
    p = m(x)
    g = backend.grad(lambda x: (backend.call(fm, x) * backend.array(v)).sum(), backend.array(x))
    _close(g, m.vjp(p, v))
    assert np.all(g[2] == 0) and g[1, 3] == 0
    if "forward" in backend.features:
        p_f, jv = backend.jvp(lambda x: backend.call(fm, x), backend.array(x), backend.array(v))
        _close(p_f, p)
        _close(jv, m.jvp(p, v))


# (the CI profile checks each map in one framework, the other framework's pairs in tests/losses/test_fenchel_young.py,
# whose Hessian is the map's Jacobian: between them every pair; the thorough profile every pair in each)
@pytest.mark.parametrize(("backend", "name", "params"), backend_grid(crossed(zip(IDS, MAPS), FRAMEWORKS)),
                         indirect=["backend"])
def test_gradient_checks_to_second_order(backend, name, params):
    """Finite differences of the map, to second order, on rows with and without masked scores; zero gradients at a
    masked score and in a fully masked row."""
    fm = backend.get_map(name, **params)
    x = _scores(8, scale=1.5)
    backend.check_grads(lambda x: backend.call(fm, x), backend.array(x), order=2)
    masked = x.copy()
    masked[1, 2] = masked[3] = -INF
    live = backend.array(np.isfinite(masked))

    def f(x):
        return backend.call(fm, backend.xp.where(live, x, -INF))

    backend.check_grads(f, backend.array(x), order=2)
    g = backend.grad(lambda x: f(x)[:, 0].sum() + f(x)[3].sum(), backend.array(x))
    assert np.all(g[3] == 0) and g[1, 2] == 0


@pytest.mark.parametrize("backend", FRAMEWORKS, indirect=True)
def test_fully_masked_row_has_zero_gradient(backend):
    x = backend.array([[-INF, -INF, -INF], [0.0, 1.0, 2.0]])
    for name, params in (("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.7})):
        fm = backend.get_map(name, **params)
        g = backend.grad(lambda x: backend.call(fm, x).sum(), x)
        assert np.array_equal(g[0], np.zeros(3))


# -------------------------------------------------------------------- alpha
@pytest.mark.parametrize("alpha", [1.01, 1.3, 1.6, 2.0, 3.5])
@pytest.mark.parametrize("backend", FRAMEWORKS, indirect=True)
def test_alpha_gradient_as_a_number(backend, alpha):
    """The gradient in one alpha is NumPy's ``vjp_params``; finite differences in alpha to second order, and in the
    scores and alpha together."""
    x = backend.array(_live(_scores(9)))
    u = _scores(10, scale=1.0)
    m = nm.get_map("entmax", alpha=alpha)
    g = backend.grad(lambda a: (_entmax(backend, x, a) * backend.array(u)).sum(), backend.array(alpha))
    np.testing.assert_allclose(float(g), m.vjp_params(m(backend.numpy(x)), u, reduce=True)["alpha"], rtol=1e-12,
                               atol=1e-12)
    # (a step of 1e-6, torch's: the map's higher derivatives in alpha are large, and at alpha = 1.6 and 1.7 central
    # differences of the gradient with JAX's default step, 1e-4, are 4e-5 off (relative) where JAX's tolerance is
    # 1e-5; with the step 1e-6 they agree with the second derivative to 1e-9, as torch's does)
    backend.check_grads(lambda a: _entmax(backend, x, a), backend.array(alpha), order=2, eps=1e-6)
    backend.check_grads(lambda x, a: _entmax(backend, x, a), backend.array(_scores(11, scale=1.0)),
                        backend.array(alpha), order=2, eps=1e-6)


@pytest.mark.parametrize("backend", FRAMEWORKS, indirect=True)
def test_alpha_gradient_per_row(backend):
    """One alpha per row (on both sides of 2, close to 1): values and the gradient against NumPy's; finite
    differences in alpha to second order, and in the scores and alpha together."""
    x = _live(_scores(12))
    alpha = np.linspace(1.05, 3.0, 12).reshape(12, 1)
    u = _scores(13, scale=1.0)
    m = nm.get_map("entmax", alpha=alpha)
    p = m(x)
    _close(backend.numpy(_entmax(backend, backend.array(x), backend.array(alpha))), p)
    g = backend.grad(lambda a: (_entmax(backend, backend.array(x), a) * backend.array(u)).sum(), backend.array(alpha))
    assert g.shape == (12, 1)
    _close(g, m.vjp_params(p, u, reduce=True)["alpha"])
    backend.check_grads(lambda a: _entmax(backend, backend.array(x), a), backend.array(alpha), order=2)
    backend.check_grads(lambda x, a: _entmax(backend, x, a), backend.array(_scores(11, scale=1.0)),
                        backend.array(alpha), order=2)


@pytest.mark.parametrize("backend", FRAMEWORKS, indirect=True)
def test_alpha_gradient_per_head_and_along_another_axis(backend):
    """alpha (2, 1, 1) for scores (2, 6, 9): values against one NumPy map per head, the gradient against NumPy's
    ``vjp_params`` (summed over each head's rows) and central differences; and along axis 1 with size 1 there."""
    xh = _scores(14, shape=(2, 6, 9))
    ah = np.array([[[1.2]], [[1.8]]])
    u = _scores(15, shape=(2, 6, 9), scale=1.0)
    p = np.stack([nm.entmax(xh[i], float(ah[i, 0, 0])) for i in range(2)])
    _close(backend.numpy(_entmax(backend, backend.array(xh), backend.array(ah))), p)

    def f(a):
        return (_entmax(backend, backend.array(xh), a) * backend.array(u)).sum()

    g = backend.grad(f, backend.array(ah))
    assert g.shape == ah.shape
    _close(g, nm.get_map("entmax", alpha=ah).vjp_params(p, u, reduce=True)["alpha"], atol=1e-10)
    h = 1e-6
    for i in range(2):
        up, down = ah.copy(), ah.copy()
        up[i] += h
        down[i] -= h
        fd = (float(f(backend.array(up))) - float(f(backend.array(down)))) / (2 * h)
        assert abs(fd - float(g[i, 0, 0])) < 1e-6 * max(1, abs(fd))
    backend.check_grads(lambda a: _entmax(backend, backend.array(xh), a), backend.array(ah), order=1)
    # along axis 1: size 1 there (scores (2, 9, 6))
    xa = np.moveaxis(xh, 2, 1)
    aa = np.array([[[1.2, 1.5, 2.5, 1.1, 1.7, 1.3]]])
    want = np.moveaxis(nm.entmax(xh, np.moveaxis(aa, 2, 1)), 2, 1)
    _close(backend.numpy(_entmax(backend, backend.array(xa), backend.array(aa), axis=1)), want)
    backend.check_grads(lambda a: _entmax(backend, backend.array(xa), a, axis=1), backend.array(aa), order=1)


@pytest.mark.parametrize("backend", FRAMEWORKS, indirect=True)
def test_float32_alpha_gradient_is_accurate_near_one(backend):
    x = _live(_scores(15))
    u = _scores(16, scale=1.0)
    m = nm.get_map("entmax", alpha=1.001)
    expected = m.vjp_params(m(x), u, reduce=True)["alpha"]
    x32, u32 = backend.array(x, np.float32), backend.array(u, np.float32)
    g = backend.grad(lambda a: (_entmax(backend, x32, a) * u32).sum(), backend.array(1.001, np.float32))
    np.testing.assert_allclose(float(g), expected, rtol=2e-3)
