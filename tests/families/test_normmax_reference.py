"""normmax's reference (:mod:`derive.normmax`): ``argmax_{p in simplex} <p, s> - ||p||_alpha``.

Truths independent of the reduction it solves by: the KKT conditions of the original problem from the norm's
gradient, that no point of the simplex nearby does better, central differences of the solve at 60 digits for
the Jacobian and of the loss for its gradient, and known values (alpha = 2 on two scores by hand).
"""

from __future__ import annotations

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from derive.normmax import (normmax_derivation, normmax_jacobian, normmax_kkt_residual, normmax_loss, reduced_alpha,
                            solve_normmax)

ALPHAS = ["1.25", 2, 3, "7.5"]
scores = st.lists(st.one_of(st.floats(-3, 3), st.just(-mpmath.inf)), min_size=1, max_size=7).filter(
    lambda v: any(x != -mpmath.inf for x in v))


@pytest.mark.parametrize("alpha", ALPHAS)
@settings(max_examples=15, deadline=None)
@given(s=scores)
def test_kkt_of_the_original_problem(alpha, s):
    p, tau = solve_normmax(s, alpha, digits=40)
    assert normmax_kkt_residual(s, p, alpha, digits=40) < mpmath.mpf(10) ** -35
    assert all(q == 0 for q, v in zip(p, s) if v == -mpmath.inf)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_no_nearby_point_of_the_simplex_does_better(alpha):
    s = [0.3, -0.2, 1.1, 0.8, -2.0]
    with mpmath.workdps(40):
        a = mpmath.mpf(alpha) if not isinstance(alpha, str) else mpmath.mpf(alpha)
        p, _ = solve_normmax(s, alpha, digits=40)

        def objective(q):
            return mpmath.fsum(x * v for x, v in zip(q, s)) - mpmath.fsum(x**a for x in q) ** (1 / a)

        best = objective(p)
        eps = mpmath.mpf(10) ** -6
        for i in range(5):
            for j in range(5):
                if i != j and p[j] >= eps:
                    q = list(p)
                    q[i] += eps
                    q[j] -= eps
                    assert objective(q) < best


def test_alpha_two_by_hand():
    """Two scores 1 and 0 at alpha = 2: ``(1 - tau)^2 + tau^2 = 1`` has ``tau = 0`` on one score's support edge
    ((1 - tau)^2 = 1 with the second off), so ``p = (1, 0)``; scores 0.5, 0: ``(0.5 - tau)^2 + tau^2 = 1`` with
    both on, ``tau = (0.5 - sqrt(1.75)) / 2``, ``p`` proportional to ``(0.5 - tau, -tau)``."""
    p, tau = solve_normmax([1.0, 0.0], 2, digits=30)
    assert abs(tau) < mpmath.mpf(10) ** -30 and p[1] == 0
    p, tau = solve_normmax([0.5, 0.0], 2, digits=30)
    with mpmath.workdps(40):
        t = (mpmath.mpf(0.5) - mpmath.sqrt(mpmath.mpf(1.75))) / 2
        assert abs(tau - t) < mpmath.mpf(10) ** -30
        assert abs(p[0] - (0.5 - t) / (0.5 - 2 * t)) < mpmath.mpf(10) ** -30


@pytest.mark.parametrize("alpha", ALPHAS)
def test_jacobian_is_central_differences(alpha):
    s = [1.0, 0.5, -1.0, 0.2, 0.45]
    jac = normmax_jacobian(s, alpha, digits=60)
    h = mpmath.mpf(10) ** -25
    with mpmath.workdps(80):
        for b in range(len(s)):
            up, down = [mpmath.mpf(v) for v in s], [mpmath.mpf(v) for v in s]
            up[b] += h
            down[b] -= h
            pu, _ = solve_normmax(up, alpha, digits=70)
            pd, _ = solve_normmax(down, alpha, digits=70)
            for a in range(len(s)):
                assert abs((pu[a] - pd[a]) / (2 * h) - jac[a][b]) < mpmath.mpf(10) ** -40
            assert abs(mpmath.fsum(jac[a][b] for a in range(len(s)))) < mpmath.mpf(10) ** -50  # sum p stays 1
    assert all(abs(jac[a][b] - jac[b][a]) < mpmath.mpf(10) ** -50 for a in range(5) for b in range(5))


@pytest.mark.parametrize("alpha", ALPHAS)
def test_loss_is_zero_at_the_map_and_its_gradient_is_p_minus_y(alpha):
    s = [1.0, 0.5, -1.0, 0.2]
    y = [0.25, 0.5, 0.125, 0.125]
    p, _ = solve_normmax(s, alpha, digits=40)
    assert abs(normmax_loss(s, p, alpha, digits=40)) < mpmath.mpf(10) ** -35
    assert normmax_loss(s, y, alpha, digits=40) > 0
    h = mpmath.mpf(10) ** -20
    with mpmath.workdps(60):
        for b in range(4):
            up, down = [mpmath.mpf(v) for v in s], [mpmath.mpf(v) for v in s]
            up[b] += h
            down[b] -= h
            fd = (normmax_loss(up, y, alpha, digits=55) - normmax_loss(down, y, alpha, digits=55)) / (2 * h)
            assert abs(fd - (p[b] - y[b])) < mpmath.mpf(10) ** -30


def test_the_derivation():
    d = normmax_derivation()
    a = d.alpha
    assert d.exponent.equals(a / (a - 1))
    assert d.reduced_alpha.equals((2 * a - 1) / a)
    assert float(d.reduced_alpha.subs(a, 2)) == reduced_alpha(2) == 1.5  # alpha = 2 reduces to 1.5-entmax
    with pytest.raises(ValueError, match="alpha > 1"):
        solve_normmax([0.0, 1.0], 1)
