"""Continuous maps: closed forms against mpmath quadrature at 30 digits."""

from __future__ import annotations

from functools import lru_cache

import mpmath
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

from derive import DerivationError, Regularizer, derive_map, gini, shannon, tsallis
from derive.continuous import c, derive_continuous, mu, radius, s2, sigma2, t, theta1, theta2, u
from derive.regularizers import p

REGS = {"shannon": shannon, "gini": gini, "tsallis15": lambda: tsallis(sp.Rational(3, 2))}


@lru_cache(maxsize=None)
def cmap(name):
    return derive_continuous(REGS[name]())


def test_known_forms():
    g = cmap("shannon")
    assert g.family == "gaussian"
    assert sp.simplify(g.density - sp.exp(-(u**2) / (2 * sigma2)) / sp.sqrt(2 * sp.pi * sigma2)) == 0
    sparse = cmap("gini")
    assert sparse.family == "compact"
    assert sp.simplify(sparse.support_radius - (sp.Rational(3, 2) * sigma2) ** sp.Rational(1, 3)) == 0
    assert sp.simplify(sparse.density - (radius**2 - u**2) / (2 * sigma2)) == 0  # a truncated parabola
    biweight = cmap("tsallis15")
    assert sp.simplify(biweight.support_radius - (15 * sigma2**2) ** sp.Rational(1, 5)) == 0
    assert sp.simplify(biweight.density - (radius**2 - u**2) ** 2 / (16 * sigma2**2)) == 0
    assert sp.simplify(g.mean - (-theta1 / (2 * theta2))) == 0 and sp.simplify(g.variance + 1 / (2 * theta2)) == 0


params = st.tuples(
    st.floats(-3, 3), st.floats(0.05, 4), st.floats(-4, 4), st.floats(0.05, 3)
).map(lambda v: {mu: sp.Rational(v[0]), sigma2: sp.Rational(v[1]), c: sp.Rational(v[2]), s2: sp.Rational(v[3])})


def _density(name, values):
    cm = cmap(name)
    fn = sp.lambdify([t], cm.density_at().subs(values), "mpmath")
    half = float(cm.support_radius.subs(values)) if cm.family == "compact" else None
    center = mpmath.mpf(sp.Rational(values[mu]).p) / sp.Rational(values[mu]).q

    def p_of(x):
        if half is not None and abs(x - center) >= cm.support_radius.subs(values).evalf(40):
            return mpmath.mpf(0)
        return fn(x)

    lo, hi = (center - half, center + half) if half is not None else (-mpmath.inf, mpmath.inf)
    return p_of, (lo, hi) if half is not None else (-mpmath.inf, mpmath.inf), center


@pytest.mark.parametrize("name", list(REGS))
@given(values=params)
def test_density_is_normalised_and_stationary(name, values):
    p_of, (lo, hi), center = _density(name, values)
    with mpmath.workdps(30):
        total = mpmath.quad(p_of, [lo, center, hi])
        assert abs(total - 1) < mpmath.mpf(10) ** -25
        # stationarity: omega'(p(t)) - f(t) is the same constant on the support, with
        # f(t) = -(t - mu)^2 / (2 sigma^2) (up to a constant, which tau absorbs)
        d1 = sp.lambdify([p], REGS[name]().first_derivative, "mpmath")
        var = mpmath.mpf(sp.Rational(values[sigma2]).p) / sp.Rational(values[sigma2]).q
        width = (hi - lo) / 4 if mpmath.isfinite(hi) else mpmath.sqrt(var)
        taus = [d1(p_of(center + k * width)) + (k * width) ** 2 / (2 * var) for k in (-1, 0, mpmath.mpf(1) / 3, 1)]
        assert max(taus) - min(taus) < mpmath.mpf(10) ** -20


@pytest.mark.parametrize("name", list(REGS))
@given(values=params)
def test_rbf_expectation_matches_quadrature(name, values):
    cm = cmap(name)
    closed = cm.rbf_expectation().subs(values).evalf(40)
    p_of, (lo, hi), center = _density(name, values)
    cc = mpmath.mpf(sp.Rational(values[c]).p) / sp.Rational(values[c]).q
    ss = mpmath.mpf(sp.Rational(values[s2]).p) / sp.Rational(values[s2]).q
    with mpmath.workdps(30):
        psi = lambda x: mpmath.exp(-((x - cc) ** 2) / (2 * ss)) / mpmath.sqrt(2 * mpmath.pi * ss)  # noqa: E731
        # break the integral where p psi is largest: for the Gaussian the product peaks at the
        # precision-weighted mean with width sqrt(sigma2 s2 / (sigma2 + s2))
        var = mpmath.mpf(sp.Rational(values[sigma2]).p) / sp.Rational(values[sigma2]).q
        peak, width = (center * ss + cc * var) / (var + ss), mpmath.sqrt(var * ss / (var + ss))
        inner = {center, cc, peak} | {peak + k * width for k in (-8, -3, 3, 8)}
        if mpmath.isfinite(hi):
            points = sorted(x for x in inner | {lo, hi} if lo <= x <= hi)
        else:
            points = [-mpmath.inf] + sorted(inner) + [mpmath.inf]
        numeric = mpmath.quad(lambda x: p_of(x) * psi(x), points if len(points) > 1 else [lo, hi])
        assert abs(numeric - mpmath.mpf(str(closed))) < mpmath.mpf(10) ** -25 * max(1, abs(numeric))


def test_continuous_errors():
    with pytest.raises(DerivationError, match="parameters"):
        derive_continuous(tsallis())
    with pytest.raises(DerivationError, match="closed form"):
        derive_continuous(Regularizer.from_string("p*log(p) + p**2/2"))


@pytest.mark.parametrize("name", list(REGS))
@given(th1=st.floats(-3, 3), th2=st.floats(-3, -0.1), cc=st.floats(-3, 3), ss=st.floats(0.1, 2))
def test_rbf_expectation_gradient_matches_finite_differences(name, th1, th2, cc, ss):
    value, g1, g2 = cmap(name).rbf_expectation_theta()
    values = {c: sp.Rational(cc), s2: sp.Rational(ss)}
    f = sp.lambdify([theta1, theta2], value.subs(values), "mpmath")
    grads = [sp.lambdify([theta1, theta2], g.subs(values), "mpmath") for g in (g1, g2)]
    a, b = mpmath.mpf(th1), mpmath.mpf(th2)
    with mpmath.workdps(40):
        h = mpmath.mpf(10) ** -12
        fd1 = (f(a + h, b) - f(a - h, b)) / (2 * h)
        fd2 = (f(a, b + h) - f(a, b - h)) / (2 * h)
        assert abs(fd1 - grads[0](a, b)) < mpmath.mpf(10) ** -15 * max(1, abs(fd1))
        assert abs(fd2 - grads[1](a, b)) < mpmath.mpf(10) ** -15 * max(1, abs(fd2))


@pytest.mark.parametrize("name", list(REGS))
def test_rendering_names_every_step(name):
    cm = cmap(name)
    latex, text, md = cm.latex(), cm.pretty(), cm.markdown()
    for title in ("scores", "mean and variance", "context of a Gaussian basis function"):
        assert title in latex and title in text and title.capitalize() in md
    assert ("radius" in text) == (cm.family == "compact")
    assert r"\operatorname{erf}" in latex if cm.family == "compact" else "erf" not in latex
    assert latex.count("$") == 0 and md.count("$$") % 2 == 0


def test_non_polynomial_density_has_no_closed_context():
    cm = derive_continuous(Regularizer.from_string("p**3", name="cube"))
    assert cm.family == "compact" and not cm.density.is_polynomial(u)
    # normalised all the same: int_{-a}^{a} sqrt((a^2 - u^2) / (6 sigma^2)) du = 1, checked by quadrature
    var = sp.Rational(1, 7)
    a = cm.support_radius.subs(sigma2, var)
    f = sp.lambdify([u], cm.density.subs(radius, a).subs(sigma2, var), "mpmath")
    with mpmath.workdps(30):
        half = mpmath.mpf(str(a.evalf(40)))
        assert abs(mpmath.quad(f, [-half, 0, half]) - 1) < mpmath.mpf(10) ** -25
    with pytest.raises(DerivationError, match="not a polynomial"):
        cm.rbf_expectation()
    assert "no closed form" in cm.pretty() and "no closed form" in cm.latex()


@pytest.mark.parametrize("name", list(REGS))
@given(th1=st.floats(-4, 4), th2=st.floats(-8, -0.2), frac=st.floats(-0.99, 0.99))
def test_threshold_satisfies_the_stationarity_conditions(name, th1, th2, frac):
    """omega'(p(t)) = f(t) - tau on the support and f(t) - tau <= omega'(0+) off it, f(t) = theta_1 t + theta_2 t^2."""
    cm = cmap(name)
    reg = REGS[name]()
    at = {theta1: sp.Rational(th1), theta2: sp.Rational(th2)}
    with mpmath.workdps(40):
        tau = mpmath.mpf(str(cm.threshold.subs(at).evalf(45)))
        m = mpmath.mpf(str(cm.mean.subs(at).evalf(45)))
        var = mpmath.mpf(str(cm.variance.subs(at).evalf(45)))
        f = lambda x: mpmath.mpf(th1) * x + mpmath.mpf(th2) * x**2  # noqa: E731
        dens = sp.lambdify([t, mu, sigma2], cm.density_at(), "mpmath")
        d1 = sp.lambdify([p], reg.first_derivative, "mpmath")
        if cm.family == "compact":
            a = mpmath.mpf(str(cm.support_radius.subs(sigma2, cm.variance.subs(at)).evalf(45)))
            inside = m + frac * a
            assert abs(d1(dens(inside, m, var)) - (f(inside) - tau)) < mpmath.mpf(10) ** -30
            clip = mpmath.mpf(str(derive_map(reg).clip.evalf(45)))
            assert f(m + a) - tau == pytest.approx(clip, abs=1e-30)  # the edge of the support
            assert f(m + (1.01 + abs(frac)) * a) - tau < clip
        else:
            point = m + 4 * frac * mpmath.sqrt(var)
            assert abs(d1(dens(point, m, var)) - (f(point) - tau)) < mpmath.mpf(10) ** -30
