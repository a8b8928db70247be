"""The mpmath reference where the link is steep at the clip: alpha-entmax at large alpha.

``g(z) = ((alpha - 1) z + 1/alpha)**(1/(alpha - 1))`` has infinite slope at the clip for
alpha > 2: a probability there is ``p = ((alpha - 1) y)**(1/(alpha - 1))`` with
``y = z - omega'(0+)`` far below ``10**-digits``.  The reference must still return a
point of the simplex whose every entry is right to the digits asked for.

Truths independent of the reference: symmetry (a constant row is uniform), rows with
two distinct values (``m P + r Q = 1`` and ``h(P) - h(Q) = gap`` with
``h(p) = p**(alpha - 1) / (alpha - 1)``, solved by bisection in ``Q``, or in closed form
for alpha = 3 and for ``omega = p**3``), sparsemax in exact rational arithmetic
(alpha = 2), the sort-based 1.5-entmax, and the same call at twice the digits.
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

from derive import Regularizer, derive_map, tsallis

from ._maps import derivation

DIGITS = 50
EXACT = mpmath.mpf(10) ** -DIGITS

alphas_large = st.one_of(
    st.floats(min_value=2.0, max_value=1000.0, allow_nan=False),
    st.sampled_from([2.5, 3.0, 20.0, 400.0, 1000.0]),
)


def entmax_alpha():
    return derivation("entmax_alpha")


def assert_close(got, want, tol=EXACT):
    assert len(got) == len(want)
    with mpmath.workdps(2 * DIGITS):
        worst = max(abs(mpmath.mpf(g) - mpmath.mpf(w)) for g, w in zip(got, want))
        assert worst <= tol, f"max |p - truth| = {mpmath.nstr(worst, 5)}"
        assert abs(mpmath.fsum(got) - 1) <= tol


def uniform(n):
    with mpmath.workdps(2 * DIGITS):
        return [mpmath.mpf(1) / n] * n


def h(q, alpha):
    """``omega'(q) - omega'(0+)`` for Tsallis alpha, written out here (not taken from derive)."""
    return q ** (alpha - 1) / (alpha - 1)


def two_level_truth(m, r, gap, alpha):
    """``(P, Q)`` for ``m`` scores at 0 and ``r`` at ``-gap`` (gap > 0), by bisection in ``Q``.

    ``phi(Q) = h((1 - r Q) / m) - h(Q) - gap`` decreases on ``[0, 1/(m + r)]`` and is
    ``-gap < 0`` at the right end; ``Q = 0`` where ``phi(0) <= 0`` (the lower level is
    off the support or at its edge).
    """
    with mpmath.workdps(3 * DIGITS):
        alpha = mpmath.mpf(alpha)
        gap = mpmath.mpf(gap)

        def phi(q):
            return h((1 - r * q) / m, alpha) - h(q, alpha) - gap

        lo, hi = mpmath.mpf(0), mpmath.mpf(1) / (m + r)
        if phi(lo) <= 0:
            return mpmath.mpf(1) / m, mpmath.mpf(0)
        for _ in range(600):
            mid = (lo + hi) / 2
            if phi(mid) > 0:
                lo = mid
            else:
                hi = mid
        q = (lo + hi) / 2
        return (1 - r * q) / m, q


# ---------------------------------------------------------------- constant rows
@pytest.mark.parametrize("alpha", [2.5, 20, 400, 1000])
@pytest.mark.parametrize("n", [2, 36, 500])
def test_constant_row_is_uniform(alpha, n):
    got = entmax_alpha().evaluate([0.0] * n, digits=DIGITS, alpha=alpha)
    assert_close(got, uniform(n))


@given(
    value=st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    n=st.integers(min_value=1, max_value=120),
    alpha=alphas_large,
)
def test_constant_row_is_uniform_any_alpha(value, n, alpha):
    got = entmax_alpha().evaluate([value] * n, digits=DIGITS, alpha=alpha)
    assert_close(got, uniform(n))


# ---------------------------------------------------------- two distinct values
def kink_gap(m, alpha, offset):
    """The gap that puts the lower level at the edge of the support (``h(1/m)``), moved by ``offset``.

    As a 45-digit binary number: exactly representable in the reference's input, and
    below float range at large alpha.
    """
    with mpmath.workprec(150):
        return +(h(mpmath.mpf(1) / m, mpmath.mpf(alpha)) * (1 + mpmath.mpf(offset)))


@pytest.mark.parametrize("alpha", [3, 20, 400, 1000])
@pytest.mark.parametrize("offset", [0, 1e-30, -1e-30, 1e-3, -1e-3])
@pytest.mark.parametrize("m,r", [(1, 1), (2, 3)])
def test_two_levels_at_the_kink(alpha, offset, m, r):
    gap = kink_gap(m, alpha, offset)
    scores = [mpmath.mpf(0)] * m + [mpmath.fneg(gap, exact=True)] * r
    big, small = two_level_truth(m, r, gap, alpha)
    got = entmax_alpha().evaluate(scores, digits=DIGITS, alpha=alpha)
    assert_close(got, [big] * m + [small] * r)


def test_two_levels_at_float_kink_alpha_20():
    """Float scores: the gap 1/19 rounded to binary64 leaves the second score a hair inside the support."""
    gap = 1 / 19
    big, small = two_level_truth(1, 1, gap, 20)
    assert 0 < small < 1e-15
    got = entmax_alpha().evaluate([0.0, -gap], digits=DIGITS, alpha=20)
    assert_close(got, [big, small])


@given(
    m=st.integers(min_value=1, max_value=4),
    r=st.integers(min_value=1, max_value=4),
    alpha=alphas_large,
    offset=st.one_of(
        st.just(0.0),
        st.floats(min_value=-1e-3, max_value=1e-3, allow_nan=False),
        st.integers(min_value=-60, max_value=-10).map(lambda e: 10.0**e),
        st.integers(min_value=-60, max_value=-10).map(lambda e: -(10.0**e)),
    ),
    shift=st.floats(min_value=-100, max_value=100, allow_nan=False),
)
def test_two_levels_near_the_kink(m, r, alpha, offset, shift):
    gap = kink_gap(m, alpha, offset)
    with mpmath.workprec(400):
        scores = [mpmath.mpf(shift)] * m + [mpmath.fsub(shift, gap, exact=True)] * r
    big, small = two_level_truth(m, r, gap, alpha)
    got = entmax_alpha().evaluate(scores, digits=DIGITS, alpha=alpha)
    assert_close(got, [big] * m + [small] * r)


@given(gap=st.floats(min_value=0, max_value=0.75, allow_nan=False, exclude_min=True))
def test_two_levels_closed_form_alpha_3(gap):
    """alpha = 3: ``(P**2 - Q**2)/2 = gap`` and ``P + Q = 1`` give ``Q = (1 - 2 gap)/2`` (0 past gap 1/2)."""
    with mpmath.workdps(2 * DIGITS):
        small = max(mpmath.mpf(0), (1 - 2 * mpmath.mpf(gap)) / 2)
        want = [1 - small, small]
    assert_close(entmax_alpha().evaluate([0.0, -gap], digits=DIGITS, alpha=3), want)
    assert_close(derivation("tsallis3").evaluate([0.0, -gap], digits=DIGITS), want)


@given(gap=st.floats(min_value=0, max_value=4, allow_nan=False, exclude_min=True))
def test_two_levels_closed_form_cube(gap):
    """``omega = p**3`` (``g = sqrt(y/3)``): ``3 (P**2 - Q**2) = gap`` gives ``Q = (1 - gap/3)/2`` (0 past 3)."""
    with mpmath.workdps(2 * DIGITS):
        small = max(mpmath.mpf(0), (1 - mpmath.mpf(gap) / 3) / 2)
        want = [1 - small, small]
    assert_close(derivation("cube").evaluate([0.0, -gap], digits=DIGITS), want)


# ------------------------------------------------------ sort-based exact maps
def sparsemax_exact(scores):
    """Sparsemax in exact rational arithmetic (sort, largest k with s_(k) > tau_k)."""
    s = [Fraction(v) for v in scores]
    ordered = sorted(s, reverse=True)
    total, tau = Fraction(0), None
    for k, v in enumerate(ordered, start=1):
        total += v
        candidate = (total - 1) / k
        if v > candidate:
            tau = candidate
    return [max(Fraction(0), v - tau) for v in s]


def entmax15_sorted(scores):
    """1.5-entmax by the sort-based rule of Peters et al. (2019), at 150 digits."""
    with mpmath.workdps(150):
        x = [mpmath.mpf(v) / 2 for v in scores]
        ordered = sorted(x, reverse=True)
        tau_star = None
        s1 = s2 = mpmath.mpf(0)
        for k, v in enumerate(ordered, start=1):
            s1 += v
            s2 += v * v
            mean = s1 / k
            delta = (1 - (s2 - k * mean * mean)) / k
            tau = mean - mpmath.sqrt(max(delta, 0))
            if tau <= v:
                tau_star = tau
        return [max(mpmath.mpf(0), v - tau_star) ** 2 for v in x]


rows = st.lists(
    st.one_of(
        st.floats(min_value=-3, max_value=3, allow_nan=False),
        st.integers(min_value=-4, max_value=4).map(lambda v: v / 4),  # ties and exact kinks
    ),
    min_size=1,
    max_size=12,
)


@given(scores=rows)
def test_alpha_2_is_exact_sparsemax(scores):
    with mpmath.workdps(2 * DIGITS):
        want = [mpmath.mpf(q.numerator) / q.denominator for q in sparsemax_exact(scores)]
    assert_close(entmax_alpha().evaluate(scores, digits=DIGITS, alpha=2), want)


@given(scores=rows)
def test_alpha_three_halves_is_sorted_entmax15(scores):
    want = entmax15_sorted(scores)
    assert_close(entmax_alpha().evaluate(scores, digits=DIGITS, alpha=sp.Rational(3, 2)), want)


# --------------------------------------------- self-consistency at twice the digits
def near_kink_row(base, alpha):
    """``base`` with an entry added where the support of the ``base`` row ends (to float rounding)."""
    with mpmath.workdps(80):
        probs = entmax_alpha().evaluate(base, digits=60, alpha=alpha)
        k = max(range(len(base)), key=lambda i: (probs[i], -i))
        edge = base[k] - float(h(probs[k], mpmath.mpf(alpha)))  # y = 0 at s_k - h(p_k)
    return [*base, edge]


@given(
    base=st.lists(st.floats(min_value=-0.1, max_value=0.1, allow_nan=False), min_size=1, max_size=8),
    alpha=alphas_large,
    at_edge=st.booleans(),
)
def test_twice_the_digits_agree(base, alpha, at_edge):
    scores = near_kink_row(base, alpha) if at_edge else base
    got = entmax_alpha().evaluate(scores, digits=DIGITS, alpha=alpha)
    with mpmath.workdps(2 * DIGITS + 20):
        want = entmax_alpha().evaluate(scores, digits=2 * DIGITS, alpha=alpha)
    assert_close(got, want)


@pytest.mark.parametrize("alpha", [20, 400, 1000])
def test_long_rows(alpha):
    """A few thousand scores: a constant row, and a row whose entries cross the clip by tiny margins."""
    n = 2000
    assert_close(entmax_alpha().evaluate([1.0] * n, digits=DIGITS, alpha=alpha), uniform(n))
    scores = [0.0] * 3 + [-(2.0**-40) * i for i in range(1, n - 2)]
    got = entmax_alpha().evaluate(scores, digits=DIGITS, alpha=alpha)
    with mpmath.workdps(2 * DIGITS + 20):
        want = entmax_alpha().evaluate(scores, digits=2 * DIGITS, alpha=alpha)
    assert_close(got, want)


def test_user_regularizer_with_steep_link():
    """``omega = p**5 / 20`` (``g(y) = y**(1/4)``): a two-level row, ``(P**4 - Q**4)/4 = gap``, by bisection."""
    dv = derive_map(Regularizer.from_string("p**5/20", name="quintic"))
    gap = 0.25 - 2.0**-60  # the second score a hair inside the support of (1, 0)
    with mpmath.workdps(3 * DIGITS):
        lo, hi = mpmath.mpf(0), mpmath.mpf(1) / 2
        for _ in range(600):
            mid = (lo + hi) / 2
            if ((1 - mid) ** 4 - mid**4) / 4 - mpmath.mpf(gap) > 0:
                lo = mid
            else:
                hi = mid
        small = (lo + hi) / 2
        want = [1 - small, small]
    assert 0 < small < 1e-3
    assert_close(dv.evaluate([0.0, -gap], digits=DIGITS), want)


def test_tsallis_with_numeric_alpha_at_large_alpha():
    """A built-in alpha (not a parameter): ``tsallis(40)`` on a constant row and at a kink."""
    dv = derive_map(tsallis(40))
    assert_close(dv.evaluate([0.5] * 7, digits=DIGITS), uniform(7))
    gap = kink_gap(1, 40, 0)
    assert_close(dv.evaluate([mpmath.mpf(0), mpmath.fneg(gap, exact=True)], digits=DIGITS), [1, 0])
