"""derive_map: the derived pieces equal the textbook forms and satisfy the KKT algebra."""

from __future__ import annotations

import mpmath
import pytest
import sympy as sp

import derive.argmax

from derive import DerivationError, Regularizer, alpha, derive_map, p, z
from derive.argmax import S1, S2, d, i, k, s, s_max, tau

from ._maps import ALL, derivation

j = sp.Symbol("j", integer=True, positive=True)


def _sample_z(dv, count=6):
    """Points z inside the link's domain (clip, omega'(1)]."""
    subs = {q.symbol: v for q, v in zip(dv.parameters, params_sym(dv))}
    top = dv.omega_prime.subs(p, 1).subs(subs)
    return [dv.omega_prime.subs(p, q).subs(subs) for q in (sp.Rational(1, 1000), sp.Rational(1, 7), sp.Rational(1, 2), 1)] + [top]


def params_sym(dv):
    return [sp.Rational(13, 10) for _ in dv.parameters]


# ----------------------------------------------------------- textbook forms
def test_softmax_textbook():
    dv = derivation("softmax")
    assert dv.link == sp.exp(z - 1)
    assert dv.weight == p
    assert not dv.sparse and dv.clip == -sp.oo
    assert dv.threshold.kind == "closed"
    # p_i = g(s_i - tau) with the closed tau is exp(s_i) / sum_j exp(s_j)
    p_i = dv.link.subs(z, s[i] - dv.threshold.explicit)
    softmax = sp.exp(s[i]) / sp.Sum(sp.exp(s[i]), (i, 1, d))
    assert sp.simplify(p_i - softmax) == 0


def test_softmax_conjugate_is_logsumexp():
    dv = derivation("softmax")
    assert sp.simplify(dv.conjugate - sp.log(sp.Sum(sp.exp(s[i]), (i, 1, d)))) == 0


def test_sparsemax_textbook():
    dv = derivation("sparsemax")
    assert dv.link == z and dv.weight == 1
    assert dv.sparse and dv.clip == 0
    th = dv.threshold
    assert th.kind == "sort" and th.degree == 1
    # Martins & Astudillo: tau_k = (sum_{j<=k} s_(j) - 1) / k, support where s_(k) > tau_k
    assert sp.simplify(th.candidate - (S1 - 1) / k) == 0


def test_entmax15_textbook():
    dv = derivation("entmax15")
    assert dv.weight == sp.sqrt(p)
    assert dv.sparse and dv.clip == sp.Rational(-4, 3)
    th = dv.threshold
    assert th.kind == "sort" and th.degree == 2
    # Peters et al.: p_i = [s_i/2 - t]_+^2 with t = tau/2 - 2/3 ...
    t = tau / 2 - sp.Rational(2, 3)
    sc = sp.Symbol("sc", real=True)
    assert sp.expand(dv.link.subs(z, sc - tau) - (sc / 2 - t) ** 2) == 0
    # ... and t_k = M - sqrt(M^2 - (S2/4 - 1)/k), M = S1 / (2k), on the scaled scores s/2
    m = S1 / (2 * k)
    textbook = m - sp.sqrt(m**2 - (S2 / 4 - 1) / k)
    mine = th.candidate / 2 - sp.Rational(2, 3)
    for kk, s1, s2 in [(1, sp.Rational(1, 2), sp.Rational(1, 4)), (2, sp.Rational(1, 2), sp.Rational(1, 4)), (3, 1, 2), (4, -3, 5)]:
        vals = {k: kk, S1: s1, S2: s2}
        if (m**2 - (S2 / 4 - 1) / k).subs(vals) >= 0:
            assert sp.simplify((mine - textbook).subs(vals)) == 0


def test_alpha_entmax_textbook():
    dv = derivation("entmax_alpha")
    assert sp.simplify(dv.weight - p ** (2 - alpha)) == 0
    assert dv.sparse
    assert sp.simplify(dv.clip + 1 / (alpha * (alpha - 1))) == 0
    assert dv.threshold.kind == "root"
    # Peters et al.: p_i = [(alpha - 1) s_i - t]_+^(1/(alpha - 1)) with t = (alpha - 1) tau - 1/alpha
    sc = sp.Symbol("sc", real=True)
    t = (alpha - 1) * tau - 1 / alpha
    textbook = ((alpha - 1) * sc - t) ** (1 / (alpha - 1))
    assert sp.simplify(dv.link.subs(z, sc - tau) - textbook) == 0


def test_tsallis_two_is_sparsemax_up_to_threshold_shift():
    dv2, dvg = derivation("tsallis2"), derivation("sparsemax")
    assert dv2.threshold.kind == "sort"
    assert sp.simplify(dv2.link - (z + sp.Rational(1, 2))) == 0
    assert dv2.weight == dvg.weight == 1


@pytest.mark.parametrize(
    "name, sparse, kind, method",
    [
        ("softmax", False, "closed", "closed"),
        ("sparsemax", True, "sort", "closed"),
        ("entmax15", True, "sort", "closed"),
        ("tsallis2", True, "sort", "closed"),
        ("tsallis3", True, "root", "closed"),
        ("tsallis_half", False, "root", "closed"),
        ("entmax_alpha", True, "root", "closed"),
        ("lambertw", False, "root", "newton"),
        ("cube", True, "root", "closed"),
        ("quartic", True, "root", "newton"),
    ],
)
def test_classification(name, sparse, kind, method):
    dv = derivation(name)
    assert dv.sparse is sparse
    assert dv.threshold.kind == kind
    assert dv.inversion.method == method
    assert dv.inversion.reason


def test_lambertw_link_is_recorded():
    dv = derivation("lambertw")
    assert dv.link == sp.LambertW(sp.exp(z - 1))
    assert dv.inversion.special == ("LambertW",)
    assert "Newton" in dv.inversion.reason
    assert sp.simplify(dv.weight - p / (p + 1)) == 0


def test_cubic_link_is_recorded_with_newton():
    dv = derivation("quartic")
    assert dv.link is not None  # Cardano's formula, kept for the record
    assert "Cardano" in dv.inversion.reason
    # the recorded Newton step is p - (omega'(p) - z) / omega''(p)
    assert sp.simplify(dv.inversion.newton_step - (p - (p + p**2 + p**3 - z) / (1 + 2 * p + 3 * p**2))) == 0
    assert dv.conjugate is None and dv.loss is None


@pytest.mark.parametrize("text, parameters", [("p**2/2 + p**4/4", {}), ("c*p**4 + p**2/2 + p", {"c": (0, 10)})])
def test_a_cubic_without_a_square_term_has_a_hyperbolic_link(text, parameters):
    """omega' = a p**3 + c p + e with a, c > 0: the link is the one real root in the hyperbolic form (no nested
    radicals), and in floating point it keeps its relative accuracy near the support's edge, where Cardano's two
    cube roots cancel: against the root of omega'(p) = z to 40 digits (mpmath's polyroots), z from 1e-12 to 1e6
    above omega'(0)."""
    import numpy as np

    dv = derive_map(Regularizer.from_string(text, name="cubic", parameters=parameters))
    assert dv.inversion.method == "closed" and "hyperbolic" in dv.inversion.reason
    assert dv.link.has(sp.asinh, sp.sinh) and not dv.link.has(sp.I)
    values = {q.symbol: sp.Rational(7, 3) for q in dv.parameters}
    prime = dv.omega_prime.subs(values)
    link = sp.lambdify(z, dv.link.subs(values), "numpy")
    edge = float(prime.subs(p, 0))
    with mpmath.workdps(40):
        for above in (1e-12, 1e-6, 1e-2, 1.0, 1e2, 1e6):
            at = edge + above
            coefficients = [mpmath.mpf(sp.Rational(c)) for c in sp.Poly(prime - sp.Rational(at), p).all_coeffs()]
            want = next(root.real for root in mpmath.polyroots(coefficients, maxsteps=200, extraprec=200)
                        if abs(root.imag) < 1e-30)
            # (asinh's value grows as log(z): its rounding, a few ulps of it, is that many ulps of p)
            assert abs(link(np.float64(at)) - want) <= 4e-16 * (1 + np.log1p(above)) * abs(want), (above, link(at), want)


def _solves_for_p(monkeypatch):
    """The equations SymPy's solve is asked to solve for ``p`` while the context's test runs (every map derived
    afresh)."""
    monkeypatch.setattr(derive.argmax, "_DERIVED", {})
    calls, solve = [], sp.solve
    monkeypatch.setattr(sp, "solve", lambda eq, *args, **kw: (args[:1] == (p,) and calls.append(eq)) or solve(eq, *args, **kw))
    return calls


@pytest.mark.parametrize("text, parameters, degree", [
    ("(p**(3/2) - p)/(3/4) + p**3", {}, "degree 4 in p**(1/2)"),  # (solve took its whole 20-s limit on it)
    ("p**5/5 + p**2/2", {}, "degree 4 in p"),
    ("c*p**6 + p*log(1 + p)", {}, None),  # (not a polynomial: solve decides)
    ("c*p**6 + p**2/2", {"c": (0, 1)}, "degree 5 in p"),
])
def test_a_polynomial_link_of_degree_four_or_more_is_left_to_newton_unsolved(monkeypatch, text, parameters, degree):
    """omega' a polynomial of degree >= 4 in a root of p that is not a shifted power has no root that nests no
    radical (Ferrari's radicals, or none past degree 4): the derivation says so from the coefficients, without
    asking SymPy's solve, and the root rule solves it; the map is the reference's still (sums to 1, KKT)."""
    if degree is None:
        parameters = {"c": (0, 1)}
    calls = _solves_for_p(monkeypatch)
    dv = derive_map(Regularizer.from_string(text, name="poly", parameters=parameters))
    assert dv.inversion.method == "newton" and "Newton" in dv.inversion.reason
    if degree is None:
        assert calls  # (left to solve)
        return
    assert not calls and degree in dv.inversion.reason and dv.link is None
    values = {q.symbol.name: 0.5 for q in dv.parameters}
    x = [0.3, -0.2, 1.1, 0.9]
    prob = dv.evaluate(x, digits=30, **values)
    assert sum(prob) == pytest.approx(1, abs=1e-25)


@pytest.mark.parametrize("text", ["(p + 1)**5", "p**5 / 5"])
def test_a_shifted_power_is_still_solved_in_closed_form(monkeypatch, text):
    """a (t + b)**n + c: its root ((z - c)/a)**(1/n) - b nests no radical, so SymPy's solve is asked and the link
    is closed."""
    calls = _solves_for_p(monkeypatch)
    dv = derive_map(Regularizer.from_string(text, name="power"))
    assert calls and dv.inversion.method == "closed"


def test_a_monotone_cubic_takes_the_hyperbolic_root_unsolved(monkeypatch):
    """omega' = p**3 + p (omega = p**2/2 + p**4/4): the hyperbolic root, without Cardano's formula first."""
    calls = _solves_for_p(monkeypatch)
    dv = derive_map(Regularizer.from_string("p**2/2 + p**4/4", name="cubic"))
    assert not calls and dv.inversion.method == "closed" and "hyperbolic" in dv.inversion.reason


def test_no_closed_inverse_falls_back_to_newton():
    dv = derive_map(Regularizer(p * sp.log(p) + p**4, name="nolink"))
    assert dv.link is None and dv.inversion.method == "newton"
    assert dv.threshold.kind == "root"
    assert dv.conjugate is None
    assert sum(dv.evaluate([1, 2, 3], digits=30)) == pytest.approx(1, abs=1e-25)


# ----------------------------------------------------------- KKT algebra
@pytest.mark.parametrize("name", [n for n in ALL if derivation(n).link is not None])
def test_link_inverts_omega_prime(name):
    """omega'(g(z)) = z and g'(z) = w(g(z)) on the link's domain."""
    dv = derivation(name)
    subs = {q.symbol: v for q, v in zip(dv.parameters, params_sym(dv))}
    link = dv.link.subs(subs)
    for zz in _sample_z(dv):
        with mpmath.workdps(60):
            pz = sp.N(link.subs(z, zz), 50)
            pz = sp.re(pz) if abs(sp.im(pz)) < 1e-40 else pz
            assert abs(sp.N(dv.omega_prime.subs(subs).subs(p, pz), 50) - zz) < 1e-40
            slope = sp.N(sp.diff(link, z).subs(z, zz), 50)
            assert abs(sp.re(slope) - sp.N(dv.weight.subs(subs).subs(p, pz), 50)) < 1e-35


@pytest.mark.parametrize("name", ALL)
def test_weight_is_inverse_curvature(name):
    dv = derivation(name)
    assert sp.simplify(dv.weight * dv.omega_second - 1) == 0


@pytest.mark.parametrize("name", ALL)
def test_halley_derivatives(name):
    dv = derivation(name)
    th = dv.threshold
    assert th.dlink == dv.weight
    assert sp.simplify(th.d2link - sp.diff(dv.weight, p) * dv.weight) == 0
    if dv.link is not None and th.dlink_z is not None:
        # equal on the link's domain (SymPy cannot simplify symbolic exponents without it)
        subs = {q.symbol: v for q, v in zip(dv.parameters, params_sym(dv))}
        for zz in _sample_z(dv):
            at = {**subs, z: zz}
            want = sp.N(sp.diff(dv.link, z).subs(at), 40)
            assert abs(sp.N(th.dlink_z.subs(at), 40) - want) < 1e-30 * max(1, abs(want))
            want2 = sp.N(sp.diff(dv.link, z, 2).subs(at), 40)
            assert abs(sp.N(th.d2link_z.subs(at), 40) - want2) < 1e-30 * max(1, abs(want2))


@pytest.mark.parametrize("name", ALL)
def test_bracket_is_max_minus_omega_prime(name):
    dv = derivation(name)
    lo, hi = dv.threshold.bracket
    assert sp.simplify(lo - (s_max - dv.omega_prime.subs(p, 1))) == 0
    assert sp.simplify(hi - (s_max - dv.omega_prime.subs(p, 1 / d))) == 0


def test_latex_and_text_show_each_step():
    dv = derivation("entmax15")
    tex, text = dv.latex(), dv.pretty()
    for title in ("Problem", "Derivatives", "KKT conditions", "Link", "Support", "Jacobian", "Threshold", "Conjugate", "Fenchel-Young loss"):
        assert title in tex and title in text
    assert sp.latex(dv.link) in tex and r"\begin{align*}" in tex
    assert tex.count(r"\begin{align*}") == tex.count(r"\end{align*}")
    assert str(dv) == text


def test_derive_map_rejects_non_regularizers():
    with pytest.raises(DerivationError, match="Regularizer"):
        derive_map(p**2)


def test_unbounded_slope_at_one_is_rejected():
    # omega = -sqrt(1 - p): convex, but omega'(1) = +oo leaves no threshold bracket
    with pytest.raises(DerivationError):
        derive_map(Regularizer(-sp.sqrt(1 - p) + p**2))


@pytest.mark.parametrize("name", ALL)
def test_latex_is_balanced(name):
    tex = derivation(name).latex()
    assert tex.count("{") == tex.count("}")
    for line in tex.splitlines():
        if line.startswith(r"\paragraph"):
            assert line.replace(r"\$", "").count("$") % 2 == 0, line


def test_tsallis_with_alpha_declared_below_one_is_dense():
    """``(p**a - p)/(a (a - 1))`` with ``a in (0, 1)``: omega'(0+) = -oo is decided (the parameter carries both ends of
    its domain into SymPy's limit: ``a - 1 < 0`` as well as ``a > 0``), the map is dense, and at ``a = 1/2`` its
    reference is the one derived with alpha fixed at 1/2."""
    a = sp.Symbol("a", real=True)
    dv = derive_map(Regularizer.from_string("(p**a - p)/(a*(a-1))", name="tsallis_low", parameters=("a in (0, 1)",)))
    assert not dv.sparse and dv.clip == -sp.oo
    assert sp.simplify(dv.weight.subs(a, sp.Rational(1, 2)) - derivation("tsallis_half").weight) == 0
    scores = [-2.0, 0.0, 0.5, 3.0]
    got = dv.evaluate(scores, digits=50, a=sp.Rational(1, 2))
    want = derivation("tsallis_half").evaluate(scores, digits=50)
    assert max(abs(g - w) for g, w in zip(got, want)) < mpmath.mpf(10) ** -40
