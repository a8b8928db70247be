"""Continuous maps at their edges: the family read off the derived density (a Cauchy from -log p,
a wider Gaussian from 2 p log p), one-line refusals where no closed-form context exists, and the
Gauss-Legendre evaluation the generated CUDA kernel switches to where the closed form cancels,
all against mpmath quadrature at 30 digits."""

from __future__ import annotations

import ctypes
from functools import lru_cache
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

from derive import DerivationError, Regularizer, gini, shannon, tsallis
from derive.cli import main
from derive.codegen.files import load_module
from derive.codegen.compilers import host_kernels
from derive.codegen.continuous import generate_continuous_module, legendre_rule, quadrature_constants
from derive.continuous import c, check_density, derive_continuous, mu, s2, sigma2, t, u
from tests.derive.test_codegen_continuous import CACHE
from tests.numeric.test_continuous_edges import truth

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "numeric" / "_generated"


@lru_cache(maxsize=None)
def cmap(text):
    return derive_continuous(Regularizer.from_string(text, name=text))


def test_burg_entropy_gives_a_cauchy_density_labelled_general():
    cm = cmap("-log(p)")
    assert cm.family == "general" and not cm.closed_context
    scale = 2 * sp.pi * sigma2  # Cauchy(mu, 2 pi sigma2): p(u) = scale / (pi (u^2 + scale^2))
    assert sp.simplify(cm.density - scale / (sp.pi * (u**2 + scale**2))) == 0
    for expr in (cm.density, cm.level, cm.threshold):
        assert not expr.has(sp.exp_polar) and not expr.atoms(sp.polar_lift)
    # normalised and stationary, by quadrature over the line (check_density used to die on exp_polar)
    f = sp.lambdify([t], cm.density_at().subs({mu: sp.Rational(1, 3), sigma2: sp.Rational(2, 7)}), "mpmath")
    with mpmath.workdps(30):
        assert abs(mpmath.quad(f, [-mpmath.inf, 0, mpmath.mpf(1) / 3, 1, mpmath.inf]) - 1) < mpmath.mpf(10) ** -25
    norm, spread = check_density(cm, 0.3, 0.05)
    assert norm < mpmath.mpf(10) ** -25 and spread < mpmath.mpf(10) ** -25
    with pytest.raises(DerivationError, match="no closed form") as info:
        cm.rbf_expectation()
    assert "\n" not in str(info.value) and "not Gaussian" in str(info.value)
    with pytest.raises(DerivationError, match="no closed form"):
        cm.rbf_expectation_grad()
    text = cm.pretty()
    assert "(general)" in text and "(gaussian)" not in text and "(Gaussian, full support)" not in text
    assert "no closed form" in text and "density (full support, not Gaussian)" in text


@pytest.mark.parametrize("text, family, closed", [
    ("p*log(p)", "gaussian", True), ("p*log(p) - p", "gaussian", True), ("2*p*log(p)", "gaussian", True),
    ("p**2/2", "compact", True), ("p**2", "compact", True), ("p**3", "compact", False), ("-log(p)", "general", False),
])
def test_family_is_read_off_the_density(text, family, closed):
    cm = cmap(text)
    assert (cm.family, cm.closed_context) == (family, closed)
    if family == "gaussian":
        log_p = sp.expand(sp.expand_log(sp.log(cm.density), force=True))
        assert sp.Poly(log_p, u).degree() == 2
    if family == "compact":
        assert cm.density.is_polynomial(u) == closed


def test_tsallis_15_is_a_fixed_shape_biweight():
    cm = derive_continuous(tsallis(sp.Rational(3, 2)))
    x = sp.Symbol("x", real=True)
    assert sp.simplify(cm.shape().subs(sp.Symbol("x", real=True), x) - sp.Rational(15, 16) * (1 - x**2) ** 2) == 0
    assert cm.degree == 4 and derive_continuous(gini()).degree == 2
    assert derive_continuous(shannon()).shape() is None


@given(m=st.floats(-1, 1), var=st.floats(1e-3, 3), cc=st.floats(-1, 2), ss=st.floats(1e-2, 2))
def test_scaled_shannon_context_uses_the_density_it_derived(m, var, cc, ss):
    """2 p log p gives N(mu, 2 sigma^2): its context is N(c; mu, 2 sigma^2 + s2), checked by quadrature."""
    cm = cmap("2*p*log(p)")
    assert sp.simplify(cm.gaussian_variance - 2 * sigma2) == 0
    at = {mu: sp.Rational(m), sigma2: sp.Rational(var), c: sp.Rational(cc), s2: sp.Rational(ss)}
    dens = sp.lambdify([t], cm.density_at().subs(at), "mpmath")
    with mpmath.workdps(30):
        closed = mpmath.mpf(str(cm.rbf_expectation().subs(at).evalf(40)))
        cm_, s_ = mpmath.mpf(cc), mpmath.sqrt(mpmath.mpf(ss))
        psi = lambda x: mpmath.exp(-((x - cm_) ** 2) / (2 * s_**2)) / mpmath.sqrt(2 * mpmath.pi) / s_  # noqa: E731
        total = 2 * mpmath.mpf(var) + mpmath.mpf(ss)
        peak = (mpmath.mpf(m) * ss + cm_ * 2 * var) / total
        width = mpmath.sqrt(2 * var * ss / total)
        pts = [-mpmath.inf] + sorted({mpmath.mpf(m), cm_} | {peak + k * width for k in (-10, -3, 0, 3, 10)}) + [mpmath.inf]
        want = mpmath.quad(lambda x: dens(x) * psi(x), pts)
    assert abs(closed - want) <= mpmath.mpf(10) ** -25 * max(1, abs(want))


def test_derive_cli_shows_the_density_and_refuses_the_context(capsys):
    assert main(["derive", "--expr=-log(p)", "--continuous"]) == 0
    out = capsys.readouterr().out
    assert "(general)" in out and "(gaussian)" not in out and "no closed form" in out
    assert "π" in out and "σ²" in out  # the Cauchy density 2 sigma^2 / (4 pi^2 sigma^4 + (t - mu)^2)


def test_verify_cli_checks_the_density_then_refuses_in_one_line(capsys):
    rc = main(["verify", "--expr=-log(p)", "--continuous", "--samples", "2", "--points", "2"])
    captured = capsys.readouterr()
    assert rc == 2
    assert "general density" in captured.out and "(ok, bound 1e-25)" in captured.out
    err = captured.err.strip()
    assert err.count("\n") == 0 and err.startswith("regattn: error:") and "no closed form" in err
    assert "Traceback" not in captured.err + captured.out


def test_no_closed_context_generates_no_module():
    with pytest.raises(DerivationError, match="no closed form"):
        generate_continuous_module(cmap("-log(p)"), "continuous_burg")


@pytest.mark.parametrize("n", [4, 6, 8, 12, 16, 24, 32, 48, 64])
def test_legendre_rule_integrates_polynomials_exactly(n):
    nodes, weights = legendre_rule(n)
    assert len(nodes) == n // 2 and all(0 < x < 1 for x in nodes)
    for k in range(0, 2 * n, 2):  # even monomials up to degree 2n - 2: the halved rule sums f(x) + f(-x)
        got = mpmath.fsum(w * mpmath.mpf(x) ** k for x, w in zip(nodes, weights))
        assert abs(got - mpmath.mpf(2) / (k + 1)) < 4e-16


def exact_rule(n, nodes):
    """The ``n``-point Gauss-Legendre rule at 40 digits: the float ``nodes`` polished by Newton on
    ``mpmath.legendre`` and the weights ``2 / ((1 - x^2) P_n'(x)^2)``."""
    out = []
    with mpmath.workdps(40):
        for x in map(mpmath.mpf, nodes):
            for _ in range(5):
                dp = n * (x * mpmath.legendre(n, x) - mpmath.legendre(n - 1, x)) / (x * x - 1)
                x -= mpmath.legendre(n, x) / dp
            dp = n * (x * mpmath.legendre(n, x) - mpmath.legendre(n - 1, x)) / (x * x - 1)
            out.append((x, 2 * 2 / ((1 - x * x) * dp * dp)))  # doubled: the halved rule
    return out


@pytest.mark.parametrize("name", ["continuous_sparsemax", "continuous_entmax15"])
def test_node_counts_meet_the_error_bound(name):
    """At the largest gamma each rule serves, the exact n-point Gauss-Legendre rule on
    P(x) x^k exp(alpha x + beta x^2) is within the rounding unit of mpmath's integral
    (k = 0, 2; |alpha| + |beta| = gamma): the truncation error the node counts are chosen for."""
    from derive.codegen.builtins import CONTINUOUS_MAPS

    q = quadrature_constants(derive_continuous(CONTINUOUS_MAPS[name]()))
    shape = q["SHAPE"]
    for n, g64, g32, nodes, weights in q["QUADRATURE_RULES"]:
        rule = exact_rule(n, nodes)
        for (x, w), x64, w64 in zip(rule, nodes, weights):  # the printed rule is the exact one, rounded
            assert abs(x - x64) <= 2.0**-52 and abs(w - w64) <= 2.0**-52
        for gamma, unit in ((g64, 2.0**-53), (g32, 2.0**-24)):
            for alpha, beta in ((gamma, 0.0), (0.0, -gamma), (gamma / 2, gamma / 2)):
                for k in (0, 2):
                    with mpmath.workdps(40):
                        f = lambda x: sum(p * x**j for j, p in enumerate(shape)) * x**k * mpmath.exp(alpha * x + beta * x * x)  # noqa: E731
                        want = mpmath.quad(f, [-1, 0, 1])
                        got = mpmath.fsum(w * (f(x) + f(-x)) / 2 for x, w in rule)
                        assert abs(got - want) <= unit * max(1, abs(want)), (n, gamma, alpha, beta, k)


@lru_cache(maxsize=None)
def kernel(name, suffix):
    mod = load_module(GENERATED / f"continuous_{name}.py")
    lib = host_kernels(mod.CUDA_SOURCE, f"continuous_{name}", CACHE)
    fn = getattr(lib, f"continuous_{name}_rbf_context_{suffix}")
    ctype = ctypes.c_double if suffix == "f64" else ctypes.c_float
    fn.argtypes = [ctypes.POINTER(ctype)] * 4 + [ctypes.c_longlong] * 2 + [ctypes.POINTER(ctype)] * 3
    fn.restype = None
    return fn, ctypes.POINTER(ctype), (np.float64 if suffix == "f64" else np.float32)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("suffix, absolute", [("f64", 3e-14), ("f32", 3e-6)])
@given(log_var=st.floats(-12, 2), m=st.floats(-0.5, 1.5), cc=st.floats(0, 1), s=st.floats(0.02, 0.6))
def test_context_kernel_at_every_variance(name, suffix, absolute, log_var, m, cc, s):
    """The generated rbf_context kernel (host build) against quadrature, sigma2 from 1e-12 to 1e2."""
    fn, ptr, dtype = kernel(name, suffix)
    args = [np.array([x], dtype=dtype) for x in (m, 10.0**log_var, cc, s * s)]
    outs = [np.empty(1, dtype=dtype) for _ in range(3)]
    fn(*[a.ctypes.data_as(ptr) for a in args], 1, 1, *[o.ctypes.data_as(ptr) for o in outs])
    m, var, cc, s2_ = (float(a[0]) for a in args)  # the reference at the inputs the kernel saw
    rel = 1e-12 if suffix == "f64" else 1e-5
    for what, got, (want, scale) in zip(("E", "dE/dmu", "dE/dsigma2"), outs, truth(name, m, var, cc, np.sqrt(s2_))):
        assert abs(float(got[0]) - float(want)) <= rel * abs(float(want)) + absolute * float(scale), (what, float(got[0]), float(want))
