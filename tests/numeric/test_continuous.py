"""Continuous attention in numeric: expectations against quadrature, contexts against the
regression written out, gradients against central differences."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import numeric.continuous as nc

MAPS = ["softmax", "sparsemax", "entmax15"]


def density_from_the_maths(name, u, var):
    """The densities of Martins et al. (2020), written out: Gaussian, truncated parabola, biweight."""
    if name == "softmax":
        return mpmath.exp(-(u**2) / (2 * var)) / mpmath.sqrt(2 * mpmath.pi * var)
    if name == "sparsemax":
        a = mpmath.cbrt(mpmath.mpf(3) / 2 * var)
        return (a**2 - u**2) / (2 * var) if abs(u) < a else mpmath.mpf(0)
    a = (15 * var**2) ** (mpmath.mpf(1) / 5)
    return (a**2 - u**2) ** 2 / (16 * var**2) if abs(u) < a else mpmath.mpf(0)


def support_from_the_maths(name, var):
    return {"softmax": mpmath.inf, "sparsemax": mpmath.cbrt(1.5 * var), "entmax15": (15 * var**2) ** 0.2}[name]


@pytest.mark.parametrize("name", MAPS)
@given(m=st.floats(-0.5, 1.5), var=st.floats(1e-3, 0.5), c=st.floats(0, 1), s=st.floats(0.02, 0.6))
def test_expectation_matches_quadrature(name, m, var, c, s):
    cmap = nc.get_continuous_map(name)
    basis = nc.GaussianBasis([c], [s * s])
    got = cmap.expectation(np.array(m), np.array(var), basis)[0]
    with mpmath.workdps(30):
        a = support_from_the_maths(name, mpmath.mpf(var))
        psi = lambda x: mpmath.exp(-((x - c) ** 2) / (2 * s * s)) / mpmath.sqrt(2 * mpmath.pi * s * s)  # noqa: E731
        f = lambda x: density_from_the_maths(name, x - m, mpmath.mpf(var)) * psi(x)  # noqa: E731
        pts = [m - a, m, c, m + a] if mpmath.isfinite(a) else [-mpmath.inf, m, c, mpmath.inf]
        pts = sorted(x for x in pts if (not mpmath.isfinite(a)) or (m - a <= x <= m + a))
        want = mpmath.quad(f, pts)
    assert abs(got - float(want)) <= 1e-10 * (1 + abs(float(want))) / s


@given(m=st.floats(-1, 2), var=st.floats(1e-4, 1), c=st.floats(0, 1), s=st.floats(0.01, 1))
def test_gaussian_expectation_is_a_gaussian_of_the_centre(m, var, c, s):
    got = nc.get_continuous_map("softmax").expectation(m, var, nc.GaussianBasis([c], [s * s]))[0]
    total = var + s * s
    assert got == pytest.approx(math.exp(-((c - m) ** 2) / (2 * total)) / math.sqrt(2 * math.pi * total), rel=1e-12)


@pytest.mark.parametrize("name", MAPS)
def test_support_and_density(name):
    cmap = nc.get_continuous_map(name)
    lo, hi = cmap.support(np.array([0.2, 0.7]), np.array([0.01, 0.04]))
    a = [float(support_from_the_maths(name, v)) for v in (0.01, 0.04)]
    np.testing.assert_allclose(hi - np.array([0.2, 0.7]), a, rtol=1e-14)
    np.testing.assert_allclose(np.array([0.2, 0.7]) - lo, a, rtol=1e-14)
    ts = np.linspace(-1, 2, 3001)
    dens = cmap.density(ts, 0.4, 0.02)
    assert np.trapezoid(dens, ts) == pytest.approx(1, abs=1e-5)
    if name != "softmax":
        assert np.all(dens[np.abs(ts - 0.4) >= a[0] * (0.02 / 0.01) ** (1 / 3 if name == "sparsemax" else 2 / 5)] == 0)


def context_from_the_definition(values, m, var, name, basis, ridge, grid=40001):
    """``int p(t) B psi(t) dt`` with ``B`` from the ridge normal equations, by Simpson's rule on the support."""
    L = values.shape[0]
    F = basis(nc.positions(L)).T
    B = np.linalg.solve(F @ F.T + ridge * np.eye(len(basis)), F @ values).T  # (d, N)
    a = float(support_from_the_maths(name, var))
    half = min(a, 12 * math.sqrt(var))
    ts = np.linspace(m - half, m + half, grid)
    dens = np.array([float(density_from_the_maths(name, mpmath.mpf(t - m), mpmath.mpf(var))) for t in ts])
    integrand = dens[:, None] * basis(ts)  # (grid, N)
    h = ts[1] - ts[0]
    weights = np.ones(grid)
    weights[1:-1:2], weights[2:-1:2] = 4, 2
    r = (weights[:, None] * integrand).sum(axis=0) * h / 3
    return B @ r


@pytest.mark.parametrize("name", MAPS)
def test_context_is_the_expected_value_function(name):
    rng = np.random.default_rng(1)
    values = rng.standard_normal((30, 4))
    basis = nc.GaussianBasis.uniform(12, widths=(0.05, 0.2))
    for m, var in [(0.3, 0.01), (0.6, 0.002), (0.5, 0.2)]:
        got = nc.continuous_attention(values, m, var, mapping=name, basis=basis, ridge=0.01)
        want = context_from_the_definition(values, m, var, name, basis, 0.01)
        np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-7 * np.abs(want).max())


def _fd(f, x, h):
    """Five-point central differences (error O(h^4)): the closed forms cancel to ~1e-13 where the
    support is narrow next to a basis function, so h must stay well above that over the precision."""
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        def at(k):
            y = x.copy()
            y[i] += k * h
            return f(y)

        g[i] = (8 * (at(1) - at(-1)) - (at(2) - at(-2))) / (12 * h)
    return g


@pytest.mark.parametrize("name", MAPS)
@given(seed=st.integers(0, 2**16), m=st.floats(0.1, 0.9), var=st.floats(5e-3, 0.3))
def test_backward_matches_finite_differences(name, seed, m, var):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((2, 9, 3))
    mu, sigma2 = np.array([m, 1 - m]), np.array([var, 2 * var])
    dout = rng.standard_normal((2, 3))
    basis = nc.GaussianBasis.uniform(8)
    kw = dict(mapping=name, basis=basis, ridge=0.01)
    dvalues, dmu, dvar = nc.continuous_attention_backward(values, mu, sigma2, dout, **kw)

    def loss(v=values, mu_=mu, s=sigma2):
        return float((nc.continuous_attention(v, mu_, s, **kw) * dout).sum())

    h = var / 200  # the density changes on the scale of its variance
    np.testing.assert_allclose(dvalues, _fd(lambda v: loss(v=v), values, 1e-3), rtol=1e-9, atol=1e-12)  # linear
    np.testing.assert_allclose(dmu, _fd(lambda q: loss(mu_=q), mu, h), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dvar, _fd(lambda q: loss(s=q), sigma2, h), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", MAPS)
def test_layer_gradients_match_finite_differences(name):
    layer = nc.ContinuousAttention(5, mapping=name, basis=nc.GaussianBasis.uniform(10), seed=3)
    layer.params["value_bias"] = np.random.default_rng(4).standard_normal(5)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 11, 5))
    dout = rng.standard_normal((2, 5))
    layer.forward(x)
    dx = layer.backward(dout)
    grads = {k: v.copy() for k, v in layer.grads.items()}

    def loss(x_=x):
        return float((layer.forward(x_) * dout).sum())

    np.testing.assert_allclose(dx, _fd(loss, x, 1e-4), rtol=1e-5, atol=1e-8)
    for key in layer.params:
        original = layer.params[key].copy()

        def f(value, key=key):
            layer.params[key] = value
            return loss()

        numeric_grad = _fd(f, original, 1e-4)
        layer.params[key] = original
        np.testing.assert_allclose(grads[key], numeric_grad, rtol=1e-5, atol=1e-8, err_msg=key)


def test_layer_mean_and_variance_follow_the_discrete_softmax():
    layer = nc.ContinuousAttention(4, mapping="sparsemax", seed=0)
    x = np.random.default_rng(0).standard_normal((3, 16, 4))
    layer.forward(x)
    t = nc.positions(16)
    s = x @ layer.params["query"] / 2
    pi = np.exp(s - s.max(axis=-1, keepdims=True))
    pi /= pi.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(layer.mu, pi @ t, rtol=1e-12)
    np.testing.assert_allclose(layer.sigma2, pi @ t**2 - (pi @ t) ** 2 + layer.min_variance, rtol=1e-10)


def test_sparse_density_ignores_far_positions():
    """With compact support and narrow basis functions, values far outside the support barely move the context."""
    basis = nc.GaussianBasis.uniform(64, widths=(0.01,))
    values = np.zeros((64, 1))
    values[:16] = 1.0  # positions below 0.25
    ctx_sparse = nc.continuous_attention(values, 0.75, 0.001, mapping="sparsemax", basis=basis)
    ctx_dense = nc.continuous_attention(values, 0.75, 0.05, mapping="softmax", basis=basis)
    assert abs(ctx_sparse[0]) < 1e-6 < abs(ctx_dense[0])


def test_errors():
    with pytest.raises(ValueError, match="no continuous map"):
        nc.get_continuous_map("nope")
    with pytest.raises(TypeError, match="not a generated continuous module"):
        nc.get_continuous_map(np)
    with pytest.raises(ValueError, match="sigma2 must be positive"):
        nc.continuous_attention(np.zeros((4, 2)), 0.5, 0.0)
    with pytest.raises(ValueError, match="batch shape"):
        nc.continuous_attention(np.zeros((3, 4, 2)), 0.5, 0.1)
    with pytest.raises(ValueError, match="multiple"):
        nc.GaussianBasis.uniform(5)
    with pytest.raises(ValueError, match="positive"):
        nc.GaussianBasis([0.0], [0.0])
    with pytest.raises(ValueError, match="ridge"):
        nc.continuous_attention(np.zeros((4, 2)), 0.5, 0.1, ridge=0)
    with pytest.raises(ValueError, match="dout"):
        nc.continuous_attention_backward(np.zeros((4, 2)), 0.5, 0.1, np.zeros(3))
    with pytest.raises(RuntimeError, match="forward"):
        nc.ContinuousAttention(2).backward(np.zeros(2))
    with pytest.raises(ValueError, match="input must have shape"):
        nc.ContinuousAttention(2).forward(np.zeros((3, 4)))


def test_float32_values_keep_their_dtype():
    values = np.random.default_rng(0).standard_normal((2, 10, 3)).astype(np.float32)
    out = nc.continuous_attention(values, np.array([0.3, 0.6]), np.array([0.01, 0.02]), mapping="sparsemax")
    assert out.dtype == np.float32
    ref = nc.continuous_attention(values.astype(np.float64), np.array([0.3, 0.6]), np.array([0.01, 0.02]), mapping="sparsemax")
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_continuous_attention_never_imports_sympy():
    import subprocess
    import sys

    code = ("import sys, numpy as np, numeric as nm; l = nm.ContinuousAttention(3, mapping='sparsemax'); "
            "l.backward(l.forward(np.ones((2, 5, 3)))); assert 'sympy' not in sys.modules, 'sympy imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
