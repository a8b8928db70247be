"""numeric.special.erf against mpmath at 40 digits."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numeric.special import erf

EPS = np.finfo(np.float64).eps


def _exact(x: float) -> float:
    with mpmath.workdps(40):
        return float(mpmath.erf(mpmath.mpf(x)))


@given(st.lists(st.floats(-8, 8, allow_subnormal=True), min_size=1, max_size=30))
def test_erf_relative_error_is_a_few_ulp(xs):
    got = erf(np.array(xs))
    for x, g in zip(xs, got):
        exact = _exact(x)
        assert abs(g - exact) <= 8 * EPS * abs(exact) + 1e-300, (x, g, exact)


def test_erf_grid_both_expansions_and_the_crossover():
    xs = np.concatenate([np.linspace(-6, 6, 4001), [1.9999999999, 2.0, 2.0000000001], -np.geomspace(1e-300, 1, 40)])
    got = erf(xs)
    worst = max(abs(g - _exact(x)) / abs(_exact(x)) for x, g in zip(xs, got) if x != 0)
    assert worst <= 8 * EPS
    assert erf(np.array(0.0)) == 0.0 and np.signbit(erf(np.array(-0.0)))


def test_erf_special_values_dtypes_and_shapes():
    out = erf(np.array([np.inf, -np.inf, np.nan, 1e300, -1e300, 40.0]))
    assert out[0] == 1.0 and out[1] == -1.0 and np.isnan(out[2]) and out[3] == 1.0 and out[4] == -1.0 and out[5] == 1.0
    x32 = np.linspace(-3, 3, 7, dtype=np.float32)
    assert erf(x32).dtype == np.float32
    np.testing.assert_array_equal(erf(x32), erf(x32.astype(np.float64)).astype(np.float32))
    assert erf(np.arange(3)).dtype == np.float64
    assert erf(np.zeros((2, 3, 4))).shape == (2, 3, 4) and erf(np.float32(0.5)).shape == ()
    with pytest.raises(TypeError, match="real numbers"):
        erf(np.array([1j]))


@given(st.floats(-6, 6))
def test_erf_is_odd_and_increasing(x):
    a, b = erf(np.array([x, -x]))
    assert a == -b
    lo, hi = erf(np.array([x, np.nextafter(x, np.inf) + 1e-9]))
    assert hi >= lo
