"""alpha-entmax for every alpha > 0: the family ``entmax`` (:mod:`derive.family`, :mod:`numeric.family`).

Dense below 1, softmax at 1, sparse above; checked against the 50-digit reference of each case's derivation
(:mod:`derive.reference`), the KKT conditions, finite differences for the gradients in alpha (through 1, where
the point case's first-order terms carry it), and a user's family with no closed-form link of its own kind.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import numeric as nm
from derive import DerivationError, alpha, derive_map, p, tsallis
from derive import reference
from derive.family import derive_family, split_points
from numeric import family

from .conftest import importable_map

ENTMAX = nm.get_map("entmax", alpha=1.5).module


@pytest.fixture(scope="module")
def cases():
    """The derivations of the three cases, (0, 1), alpha = 1, (1, oo)."""
    return [derive_map(c.regularizer) for c in derive_family(tsallis(lower=0)).cases]


def want(cases, x, a, digits=50):
    """The reference of the case holding ``a``."""
    dv = cases[0] if a < 1 else cases[1] if a == 1 else cases[2]
    params = {} if a == 1 else {"alpha": mpmath.mpf(a)}
    return np.array([float(v) for v in reference.evaluate(dv, list(map(float, x)), digits=digits, **params)])


# ------------------------------------------------------------------ derive
def test_the_family_splits_at_one_and_names_its_cases():
    reg = tsallis(lower=0)
    assert split_points(reg.omega, reg.parameters[0]) == (1,)
    fam = derive_family(reg)
    assert fam.describe() == "(0, 1), alpha = 1, (1, oo)"
    kinds = [derive_map(c.regularizer) for c in fam.cases]
    assert [d.sparse for d in kinds] == [False, False, True]
    assert sp.simplify(fam.cases[1].regularizer.omega - p * sp.log(p)) == 0
    with pytest.raises(DerivationError, match=r"cases are \(0, 1\), alpha = 1, \(1, oo\)"):
        derive_map(reg)
    # a domain inside one case is one map; one holding no split point is not a family
    assert derive_map(tsallis(lower=0, upper=1)).sparse is False
    with pytest.raises(DerivationError, match="one map"):
        derive_family(tsallis())


def test_the_point_limits_are_the_derivatives_in_alpha():
    """lim d omega'/d alpha and d omega/d alpha at 1 against central differences of the formula at 60 digits."""
    fam = derive_family(tsallis(lower=0))
    d_prime, d_omega = fam.derivatives[1]
    omega = (p**alpha - p) / (alpha * (alpha - 1))
    f0 = sp.lambdify((p, alpha), omega, "mpmath")
    f1 = sp.lambdify((p, alpha), sp.diff(omega, p), "mpmath")
    with mpmath.workdps(60):
        h = mpmath.mpf("1e-15")
        for v in ("1e-6", "0.03", "0.5", "1"):
            v = mpmath.mpf(v)
            # the derivative at 1 as the limit of the derivative at 1 +- h (0/0 at 1 itself)
            fd1 = (f1(v, 1 + 2 * h) - f1(v, 1 + h)) / h / 2 + (f1(v, 1 - h) - f1(v, 1 - 2 * h)) / h / 2
            fd0 = (f0(v, 1 + 2 * h) - f0(v, 1 + h)) / h / 2 + (f0(v, 1 - h) - f0(v, 1 - 2 * h)) / h / 2
            assert abs(fd1 - d_prime.subs(p, v).evalf(50)) < 1e-12
            assert abs(fd0 - d_omega.subs(p, v).evalf(50)) < 1e-12
            assert float(ENTMAX.omega_prime_d_alpha_case1(float(v))) == pytest.approx(float(fd1), rel=1e-13, abs=1e-14)


# ------------------------------------------------------------------ values
@settings(max_examples=25, deadline=None)
@given(x=st.lists(st.floats(-30, 30), min_size=1, max_size=10),
       a=st.sampled_from([0.05, 0.4, 0.9, 1 - 1e-7, 1.0, 1 + 1e-7, 1.2, 2.0, 4.5]))
def test_matches_the_reference_of_its_case(cases, x, a):
    x = np.array(x)
    got = nm.entmax(x, alpha=a)
    np.testing.assert_allclose(got, want(cases, x, a), rtol=0, atol=1e-13)
    assert got.sum() == pytest.approx(1, abs=1e-14)
    if a <= 1:
        assert (got > 0).all()  # dense up to 1 (heavy tails below)


def test_continuous_through_one(cases):
    x = np.array([-3.0, -0.5, 0.0, 0.4, 2.0])
    at_one = nm.softmax(x)
    for h in (1e-3, 1e-6, 1e-9, 1e-12):
        for a in (1 - h, 1 + h):
            assert np.abs(nm.entmax(x, alpha=a) - at_one).max() < 4 * h
    np.testing.assert_allclose(nm.entmax(x, alpha=1.0), at_one, rtol=1e-15, atol=0)


def test_one_value_per_row_across_cases_is_each_value_alone():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 9)) * 3
    a = np.array([0.3, 0.99, 1.0, 1.0 + 1e-9, 1.5, 3.0])[:, None]
    m = nm.get_map("entmax", alpha=a)
    rows = np.stack([nm.entmax(x[i], alpha=float(a[i, 0])) for i in range(6)])
    np.testing.assert_array_equal(m(x), rows)
    assert m.sparse is None and nm.get_map("entmax", alpha=0.5).sparse is False and nm.get_map("entmax", alpha=2.0).sparse


def _fd_alpha(x, a, dy, h=1e-6):
    """d <dy, p> / d alpha by central differences of the 50-digit reference."""
    dvs = [derive_map(c.regularizer) for c in derive_family(tsallis(lower=0)).cases]
    at = lambda v: want(dvs, x, v)  # noqa: E731
    if a == 1:  # from either side, each a one-sided second-order difference, averaged
        up = (-3 * at(1.0) + 4 * at(1 + h) - at(1 + 2 * h)) / (2 * h)
        down = (3 * at(1.0) - 4 * at(1 - h) + at(1 - 2 * h)) / (2 * h)
        return float(dy @ up), float(dy @ down)
    g = float(dy @ ((at(a + h) - at(a - h)) / (2 * h)))
    return g, g


@pytest.mark.parametrize("a", [0.6, 1.0, 1.3])
def test_gradient_in_alpha_matches_finite_differences_through_one(a):
    x = np.array([-1.0, 0.0, 0.3, 0.8, 1.5])
    dy = np.array([0.3, -1.0, 0.5, 0.2, 1.0])
    m = nm.get_map("entmax", alpha=a)
    g = m.vjp_params(m(x), dy)["alpha"]
    up, down = _fd_alpha(x, a, dy)
    assert float(g) == pytest.approx(up, abs=1e-7)
    assert float(g) == pytest.approx(down, abs=1e-7)


def test_gradient_in_alpha_is_continuous_through_one():
    x = np.array([-1.0, 0.0, 0.3, 0.8, 1.5])
    dy = np.array([0.3, -1.0, 0.5, 0.2, 1.0])
    g = lambda a: float(nm.get_map("entmax", alpha=a).vjp_params(nm.entmax(x, alpha=a), dy)["alpha"])  # noqa: E731
    at_one = g(1.0)
    for h in (1e-4, 1e-6, 1e-8):
        assert abs(g(1 - h) - at_one) < 10 * h and abs(g(1 + h) - at_one) < 10 * h


def test_the_loss_and_its_parameter_gradient_through_one(cases):
    x = np.array([[-1.0, 0.0, 0.3, 0.8, 1.5]])
    y = np.array([[0.1, 0.2, 0.0, 0.3, 0.4]])
    values = {a: nm.get_map("entmax", alpha=a).loss(x, y) for a in (1 - 1e-7, 1.0, 1 + 1e-7)}
    assert values[1.0] == pytest.approx(nm.get_map("softmax").loss(x, y), rel=1e-14)
    assert abs(values[1 - 1e-7] - values[1.0]) < 1e-6 and abs(values[1 + 1e-7] - values[1.0]) < 1e-6


# ------------------------------------------------------------------ errors
def test_refusals():
    with pytest.raises(ValueError, match=r"outside \(0.0, inf\)"):
        nm.entmax(np.zeros(3), alpha=0.0)
    with pytest.raises(ValueError, match="sort"):
        nm.get_map("entmax", alpha=1.5, threshold="sort")
    with pytest.raises(DerivationError, match="inside"):
        tsallis(lower=-1)


# --------------------------------------------------------- a user's family
TYPED = "(p**a - p)/(a*(a-1)) + p**3/3"


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    with importable_map(tmp_path_factory.mktemp("typed_family"), TYPED, "tsallis_cubed", ("a in (0, oo)",)) as module:
        yield module


def test_a_user_family_is_generated_case_by_case(typed):
    assert family.is_family(typed)
    assert [name for _, _, name in typed.CASES] == ["tsallis_cubed_case0", "tsallis_cubed_case1", "tsallis_cubed_case2"]
    assert [m.SPARSE for m in family.case_modules(typed)] == [False, False, True]


@pytest.mark.parametrize("a", [0.5, 1.0, 1.7])
def test_a_user_family_meets_its_kkt_conditions(typed, a):
    """omega'(p_i) = s_i - tau on the support, omega' at 60 digits (at 1: the limit p log p + p**3/3)."""
    x = np.array([-4.0, -1.0, 0.0, 0.6, 2.0])
    got = nm.get_map(typed, a=a)(x)
    q = sp.Symbol("a", positive=True)
    omega = (p**q - p) / (q * (q - 1)) + p**3 / 3
    d1 = sp.diff(omega if a != 1 else sp.limit(omega, q, 1), p)
    f1 = sp.lambdify((p, q), d1, "mpmath")
    with mpmath.workdps(60):
        gaps = [f1(mpmath.mpf(float(v)), mpmath.mpf(a)) - mpmath.mpf(float(s)) for v, s in zip(got, x) if v > 0]
    assert sum(got) == pytest.approx(1, abs=1e-14)
    assert float(max(gaps) - min(gaps)) < 1e-10 * max(1, float(max(abs(g) for g in gaps)))


def test_a_user_family_gradient_in_its_parameter_is_continuous(typed):
    x = np.array([-1.0, 0.0, 0.3, 0.8, 1.5])
    dy = np.array([0.3, -1.0, 0.5, 0.2, 1.0])

    def g(a):
        m = nm.get_map(typed, a=a)
        return float(m.vjp_params(m(x), dy)["a"])

    at_one = g(1.0)
    fd = (nm.get_map(typed, a=1 + 1e-6)(x) - nm.get_map(typed, a=1 - 1e-6)(x)) @ dy / 2e-6
    assert at_one == pytest.approx(float(fd), abs=1e-7)
    assert abs(g(1 + 1e-7) - at_one) < 1e-6 and abs(g(1 - 1e-7) - at_one) < 1e-6


def test_the_entmax_package_agrees_below_and_above_one():
    entmax = pytest.importorskip("entmax")
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(3).normal(size=(4, 7)) * 2
    for a in (0.5, 1.5, 2.5):
        theirs = entmax.entmax_bisect(torch.tensor(x), alpha=a, n_iter=200).numpy()
        np.testing.assert_allclose(nm.entmax(x, alpha=a), theirs, atol=1e-12)
    assert not math.isnan(nm.entmax(x, alpha=1e-3).sum())
