"""Continuous attention at every variance: the context E_p[psi] and its derivatives in (mu, sigma2)
against mpmath quadrature at 30 digits, from sigma2 = 1e-12 (a support far narrower than any basis
function, where the closed forms of the compact maps cancel) to sigma2 = 1e2."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import numeric as nm
import numeric.continuous as nc
from tests.profile import crossed

MAPS = ["softmax", "sparsemax", "entmax15"]


def truth(name, m, var, c, s):
    """``[(value, scale)]`` for ``E``, ``dE/dmu`` and ``dE/dsigma2`` by mpmath quadrature at 30 digits.

    The densities written out (Martins et al. 2020): ``p(u) = P(u / a) / a`` with
    ``P = 3 (1 - x^2) / 4``, ``a = (3 sigma2 / 2)^(1/3)`` (sparsemax) and
    ``P = 15 (1 - x^2)^2 / 16``, ``a = (15 sigma2^2)^(1/5)`` (entmax15), so
    ``E = int P(x) psi(mu + a x) dx``, ``dE/dmu = int P psi'``, ``dE/dsigma2 = a'(sigma2) int P x psi'``;
    the Gaussian's are integrals over the line.  ``scale`` is what a rounding error is
    measured against: the size the quantity can reach for this basis function,
    ``1 / s`` for ``E`` (``psi <= 1 / (sqrt(2 pi) s)``), ``1 / s^2`` for ``dE/dmu`` and
    ``|a'(sigma2)| / s^2`` (compact) or ``1 / s^3`` (Gaussian) for ``dE/dsigma2``.
    """
    with mpmath.workdps(30):
        m, var, c, s = (mpmath.mpf(x) for x in (m, var, c, s))
        psi = lambda t: mpmath.exp(-((t - c) ** 2) / (2 * s * s)) / mpmath.sqrt(2 * mpmath.pi * s * s)  # noqa: E731
        dpsi = lambda t: (c - t) / (s * s) * psi(t)  # noqa: E731  d/dmu psi(mu + u) = psi'(t) in -t
        if name == "softmax":
            sd = mpmath.sqrt(var)
            dens = lambda t: mpmath.exp(-((t - m) ** 2) / (2 * var)) / mpmath.sqrt(2 * mpmath.pi * var)  # noqa: E731
            # d/dsigma2 of the Gaussian density: p ((t - m)^2 - var) / (2 var^2)
            ddens = lambda t: dens(t) * ((t - m) ** 2 - var) / (2 * var * var)  # noqa: E731
            peak = (m * s * s + c * var) / (var + s * s)
            width = mpmath.sqrt(var * s * s / (var + s * s))
            pts = sorted({m, c, peak} | {peak + k * width for k in (-12, -4, 4, 12)} | {m + k * sd for k in (-12, 12)})
            pts = [-mpmath.inf] + pts + [mpmath.inf]
            parts = [lambda t: dens(t) * psi(t), lambda t: dens(t) * dpsi(t), lambda t: ddens(t) * psi(t)]
            scales = [1 / s, 1 / s**2, 1 / s**3]
        else:
            if name == "sparsemax":
                a = mpmath.cbrt(mpmath.mpf(3) / 2 * var)
                shape = lambda x: mpmath.mpf(3) / 4 * (1 - x * x)  # noqa: E731
                da = a / (3 * var)
            else:
                a = (15 * var**2) ** (mpmath.mpf(1) / 5)
                shape = lambda x: mpmath.mpf(15) / 16 * (1 - x * x) ** 2  # noqa: E731
                da = 2 * a / (5 * var)
            x0, w = (c - m) / a, s / a
            pts = sorted({mpmath.mpf(-1), mpmath.mpf(0), mpmath.mpf(1)}
                         | {x0 + k * w for k in (-12, -4, -1, 0, 1, 4, 12) if -1 < x0 + k * w < 1})
            parts = [lambda x: shape(x) * psi(m + a * x), lambda x: shape(x) * dpsi(m + a * x),
                     lambda x: da * shape(x) * x * dpsi(m + a * x)]
            scales = [1 / s, 1 / s**2, da / s**2]
        finite = [x for x in pts if mpmath.isfinite(x)]
        grid = finite + [finite[0] + (finite[-1] - finite[0]) * k / 400 for k in range(401)]
        out = []
        for f, scale in zip(parts, scales):
            # mpmath.quad stops at an absolute error near 10^-dps: integrate f / max|f| for relative accuracy
            size = max(abs(f(x)) for x in grid) or mpmath.mpf(1)
            out.append((size * mpmath.quad(lambda x, f=f, size=size: f(x) / size, pts), scale))
        return out


def close(got, want, scale, rel=1e-12, absolute=3e-14):
    """``|got - want| <= rel |want| + absolute * scale`` (``scale`` from :func:`truth`)."""
    return abs(got - float(want)) <= rel * abs(float(want)) + absolute * float(scale)


@pytest.mark.parametrize("name", MAPS)
@given(log_var=st.floats(-12, 2), m=st.floats(-0.5, 1.5), c=st.floats(0, 1), s=st.floats(0.02, 0.6))
def test_expectation_and_derivatives_match_quadrature_at_every_variance(name, log_var, m, c, s):
    var = 10.0**log_var
    got = nc.get_continuous_map(name).expectation_grad(np.array(m), np.array(var), nc.GaussianBasis([c], [s * s]))
    for what, g, (want, scale) in zip(("E", "dE/dmu", "dE/dsigma2"), got, truth(name, m, var, c, s)):
        assert close(float(g[0]), want, scale), (what, float(g[0]), float(want), float(scale))


def _context_truth(values, m, var, name, basis, ridge):
    """``G`` and ``r = E_p[psi]``, ``dr/dmu``, ``dr/dsigma2`` for every basis function, from quadrature."""
    G = nc.readout(values.shape[-2], basis, ridge)
    rows = [truth(name, m, var, c, math.sqrt(s2)) for c, s2 in zip(basis.centers, basis.variances)]
    r, r_mu, r_var = (np.array([float(row[k][0]) for row in rows]) for k in range(3))
    return G, r, r_mu, r_var


# (the reference's quadrature takes 1 to 3 s a case: the CI profile takes each variance with one map, the two maps in
# turn, the thorough profile both)
@pytest.mark.parametrize(("var", "name"), crossed([1e-12, 1e-10, 1e-8, 1e-6, 1e-4, 1e-2, 1.0, 1e2], ["sparsemax", "entmax15"]))
def test_context_and_backward_at_tiny_and_large_variance(name, var):
    """``continuous_attention(V, [0.5], [1e-10], mapping="entmax15")`` and its backward pass at
    variances from 1e-12 to 1e2, against the context written out with ``r = E_p[psi]`` from quadrature."""
    rng = np.random.default_rng(7)
    values = rng.standard_normal((1, 24, 3))
    dout = rng.standard_normal((1, 3))
    basis = nc.GaussianBasis.uniform(16)
    ridge = 1e-3
    G, r, r_mu, r_var = _context_truth(values, 0.5, var, name, basis, ridge)
    want = (G @ r) @ values[0]
    got = nm.continuous_attention(values, [0.5], [var], mapping=name, basis=basis, ridge=ridge)
    np.testing.assert_allclose(got[0], want, rtol=1e-11, atol=1e-12 * np.abs(want).max())
    dvalues, dmu, dvar = nc.continuous_attention_backward(values, np.array([0.5]), np.array([var]), dout,
                                                          mapping=name, basis=basis, ridge=ridge)
    dr = (values[0] @ dout[0]) @ G
    np.testing.assert_allclose(dvalues[0], np.outer(G @ r, dout[0]), rtol=1e-11, atol=1e-13)
    assert dmu[0] == pytest.approx(dr @ r_mu, rel=1e-11, abs=1e-12 * np.abs(dr).sum() * np.abs(r_mu).max())
    assert dvar[0] == pytest.approx(dr @ r_var, rel=1e-11, abs=1e-12 * np.abs(dr).sum() * np.abs(r_var).max())


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_quadrature_and_closed_form_agree_at_the_switch(name):
    """Either side of ``a = QUADRATURE_BELOW s`` the two evaluations give the same numbers, so the
    context is continuous in sigma2 where the method changes."""
    cmap = nc.get_continuous_map(name)
    mod = cmap.module
    s = 0.1
    basis = nc.GaussianBasis(np.linspace(0.2, 0.8, 13), np.full(13, s * s))
    # sigma2 at which the support radius is exactly QUADRATURE_BELOW * s, and a hair either side
    grid = np.geomspace(1e-8, 1.0, 20001)
    var = float(grid[np.argmin(np.abs(mod.support_radius(grid) - mod.QUADRATURE_BELOW * s))])
    below, above = (cmap.expectation_grad(np.array([0.5]), np.array([v]), basis) for v in (var * (1 - 1e-9), var * (1 + 1e-9)))
    for lo, hi in zip(below, above):
        np.testing.assert_allclose(lo, hi, rtol=1e-8, atol=1e-13 / s**2)


def test_quadrature_is_used_only_where_the_module_says():
    """Modules without quadrature rules (the Gaussian) keep the closed form, which does not cancel."""
    gauss = nc.get_continuous_map("softmax")
    assert gauss.module.SHAPE is None and gauss.module.QUADRATURE_RULES == ()
    got = gauss.expectation(0.5, 1e-12, nc.GaussianBasis([0.55], [0.25]))[0]
    assert got == pytest.approx(math.exp(-(0.05**2) / (2 * (0.25 + 1e-12))) / math.sqrt(2 * math.pi * (0.25 + 1e-12)), rel=1e-15)
