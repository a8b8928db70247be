"""torch's and JAX's maps against NumPy's (which tests/maps/test_reference.py checks against the mpmath reference):
values with every threshold rule, along other axes, long rows, float32, scores far from 0, half precision, alpha
far above 1, each written once for both frameworks.

The scores of almost every test have, or flatten to, rows of ``ROWS`` = (12, 9): JAX compiles one program per map,
shape and dtype (and one per derivative), so sharing a shape keeps its share of the suite's time small.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import numeric as nm
from tests.backends import backend_params
from tests.numeric.conftest import FRAMEWORK_IDS as IDS
from tests.numeric.conftest import FRAMEWORK_MAPS as MAPS
from tests.numeric.conftest import hard_rows

INF = math.inf
#: the shape of (almost) every test's rows
ROWS = (12, 9)
FRAMEWORKS = backend_params("autodiff")


def _scores(seed, shape=ROWS, scale=3.0):
    return np.random.default_rng(seed).normal(size=shape) * scale


def _run(backend, m, x, axis=-1, dtype=np.float64):
    """``m`` on ``backend`` applied to the NumPy ``x`` (in ``dtype``), as a float64 NumPy array."""
    return np.asarray(backend.numpy(backend.call(m, backend.array(x, dtype), axis)), np.float64)


def _close(a, b, atol=1e-12):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    assert np.array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(a, b, rtol=0, atol=atol, equal_nan=True)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("threshold", ["auto", "root", "sort"])
@pytest.mark.parametrize("backend", FRAMEWORKS, indirect=True)
def test_values_match_numpy(backend, name, params, threshold):
    """Hard rows (a masked score, a fully masked row, a NaN, a constant row, ties, a wide spread, a large offset) with
    each rule the map has, eagerly and (JAX) under jit."""
    m = nm.get_map(name, **params)
    if threshold == "sort" and m.module.THRESHOLD != "sort":
        pytest.skip("the sort rule is only for maps whose link is a polynomial of degree 1 or 2")
    x = hard_rows(_scores(0))
    expected = m(x)
    fm = backend.get_map(name, threshold=threshold, **params)
    p = backend.call(fm, backend.array(x))
    assert p.dtype == backend.xp.float64 and tuple(p.shape) == x.shape
    p = backend.numpy(p)
    _close(p, expected)
    assert np.all(p[2] == 0) and np.all(np.isnan(p[3])) and p[1, 3] == 0
    if "jit" in backend.features and threshold == "auto":
        _close(backend.numpy(backend.jit(lambda x: backend.call(fm, x))(backend.array(x))), expected)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", FRAMEWORKS, indirect=True)
def test_values_along_other_axes_and_long_rows(backend, name, params):
    m = nm.get_map(name, **params)
    fm = backend.get_map(name, **params)
    for shape, axis, numpy_axis in (((3, 9, 4), 1, 1), ((9, 3, 4), -3, 0), ((3, 300, 2), 1, 1)):
        x = _scores(1, shape=shape)
        _close(_run(backend, fm, x, axis), m(x, axis=numpy_axis))
    long = _scores(2, shape=(4, 5000), scale=2.0)
    _close(_run(backend, fm, long), m(long))


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", FRAMEWORKS, indirect=True)
def test_float32_close_to_float64(backend, name, params):
    x = _scores(3)
    p32 = backend.call(backend.get_map(name, **params), backend.array(x, np.float32))
    assert p32.dtype == backend.xp.float32
    p32 = np.asarray(backend.numpy(p32), np.float64)
    np.testing.assert_allclose(p32, nm.get_map(name, **params)(x), rtol=0, atol=2e-5)
    np.testing.assert_allclose(p32.sum(-1), 1, atol=1e-5)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", FRAMEWORKS, indirect=True)
def test_float32_far_rows(backend, name, params):
    """Scores far from 0 in float32 (a grid of 1/4 shifted, exact in float32): the map of the unshifted scores,
    to float32's rounding (the solvers shift each row by its maximum first)."""
    x = np.round(_scores(4) * 4) / 4
    want = nm.get_map(name, **params)(x)
    fm = backend.get_map(name, **params)
    for shift in (1e3, 1e5, -1e5):
        np.testing.assert_allclose(_run(backend, fm, x + shift, dtype=np.float32), want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("alpha", [40.0, 1000.0, 1e6])
@pytest.mark.parametrize("backend", FRAMEWORKS, indirect=True)
def test_constant_rows_at_huge_alpha(backend, alpha, dtype):
    """``(1/n)**(alpha - 1)`` below the normal range (``c = p_max**(1/k)`` underflows; the rows are solved in
    ``log(a / c)``): a constant row is uniform, to the rounding of its sum, with alpha a number or per row."""
    x = np.zeros((3, 346))
    x[1] = -1e6
    x[2, -1] = -INF
    counts = np.isfinite(x).sum(-1)
    eps = np.finfo(dtype).eps
    for a in (alpha, backend.array(np.full((3, 1), alpha), dtype)):
        p = _run(backend, backend.get_map("entmax", alpha=a), x, dtype=dtype)
        for row, count in enumerate(counts):
            assert (p[row, :count] == p[row, 0]).all() and (p[row, count:] == 0).all()
            np.testing.assert_allclose(p[row, :count], 1 / count, rtol=eps * (16 + count / 8), atol=0)


@pytest.mark.parametrize("alpha", [20.0, 40.0])
@pytest.mark.parametrize("backend", FRAMEWORKS, indirect=True)
def test_float32_rows_at_huge_alpha_match_float64(backend, alpha):
    """float32 rows whose ``c`` underflows in float32 but not in float64: two different solves agree to float32."""
    x = _scores(14, shape=(16, 300), scale=0.01).astype(np.float32).astype(np.float64)
    p32 = _run(backend, backend.get_map("entmax", alpha=alpha), x, dtype=np.float32)
    np.testing.assert_allclose(p32, nm.entmax(x, alpha), rtol=0, atol=4e-7)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("name", "params"), MAPS[:4], ids=IDS[:4])
@pytest.mark.parametrize("backend", FRAMEWORKS, indirect=True)
def test_half_precision_computes_in_float32(backend, name, params, dtype):
    """Half-precision scores are solved in float32 and the result rounded once to the half format; the gradient
    keeps the scores' dtype."""
    dtype = getattr(backend.xp, dtype)
    x = backend.astype(backend.array(_scores(4)), dtype)
    fm = backend.get_map(name, **params)
    p = backend.call(fm, x)
    assert p.dtype == dtype
    rounded = backend.numpy(backend.astype(x, backend.xp.float64))
    expected = nm.get_map(name, **params)(rounded)  # the map of the rounded scores
    got = backend.numpy(backend.astype(p, backend.xp.float64))
    np.testing.assert_allclose(got, expected, rtol=0, atol=float(backend.xp.finfo(dtype).eps))
    weights = backend.astype(backend.array(np.arange(9.0)), dtype)
    g = backend.grad(lambda x: (backend.call(fm, x) * weights).sum(), x, native=True)
    assert g.dtype == dtype
    assert np.isfinite(backend.numpy(backend.astype(g, backend.xp.float64))).all()


@pytest.mark.parametrize("alpha", [1.01, 1.3, 2.0, 5.0])
@pytest.mark.parametrize("backend", FRAMEWORKS, indirect=True)
def test_alpha_values_match_numpy(backend, alpha):
    """alpha-entmax at one alpha and with one alpha per row (every other row at 1.5)."""
    x = _scores(12, shape=(20, 50))
    _close(_run(backend, backend.get_map("entmax", alpha=alpha), x), nm.entmax(x, alpha))
    per_row = np.full((20, 1), alpha)
    per_row[::2] = 1.5
    _close(_run(backend, backend.get_map("entmax", alpha=backend.array(per_row)), x), nm.entmax(x, per_row))
