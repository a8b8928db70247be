"""The bounded reference (:mod:`derive.box`): ``0 <= p <= u``, ``sum p = c``.

Truths independent of its solve: the KKT conditions checked entry by entry from ``omega'`` alone, the plain
reference where there is no bound, central differences of the solve itself at 60 digits for the Jacobians
and of the loss for its gradients, and known values (sparsemax's bounded projection by hand).
"""

from __future__ import annotations

from functools import lru_cache

import mpmath
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from derive import Regularizer, derive_map
from derive.box import box_jacobians, box_loss, box_loss_gradients, solve_box
from derive.regularizers import gini, p as p_symbol, shannon, tsallis


@lru_cache(maxsize=None)
def derivation(name):
    regs = {"softmax": shannon(), "sparsemax": gini(), "entmax15": tsallis("3/2"),
            "shannon_gini": Regularizer.from_string("p*log(p) + p**2/2", name="shannon_gini")}
    return derive_map(regs[name])


NAMES = ["softmax", "sparsemax", "entmax15", "shannon_gini"]


def kkt_violation(dv, scores, p, upper, total, tau):
    """The largest violation of the bounded KKT conditions at ``tau``, from ``omega'`` and ``omega'(0+)``."""
    d1 = sp.lambdify(p_symbol, dv.omega_prime, "mpmath")
    worst = abs(mpmath.fsum(p) - total)
    clip = None if not dv.sparse else mpmath.mpf(str(dv.clip.evalf(60)))
    for s, q, u in zip(scores, p, upper):
        s, q, u = mpmath.mpf(s), mpmath.mpf(q), mpmath.mpf(u)
        worst = max(worst, -q, q - u)
        if q == u:
            worst = max(worst, tau - (s - d1(u)))  # mu = s - tau - omega'(u) >= 0
        elif q > 0:
            worst = max(worst, abs(s - tau - d1(q)))  # p = g(s - tau) on the free set
        elif clip is not None:
            worst = max(worst, s - tau - clip)  # off the support: s - tau <= omega'(0+)
        else:
            worst = max(worst, mpmath.mpf(1))  # a dense map has no zero where the bound is positive
    return worst


def test_sparsemax_with_one_bound_by_hand():
    """``s = (0.5, 0.4, 0.1, -1)``, ``u_0 = 0.3``: entry 0 saturates and the rest is sparsemax of the others
    with 0.7 to share: ``tau = -0.1``, ``p = (0.3, 0.5, 0.2, 0)``."""
    sol = solve_box(derivation("sparsemax"), [0.5, 0.4, 0.1, -1.0], upper=[0.3, 1, 1, 1])
    want = [mpmath.mpf("0.3"), mpmath.mpf(0.4) + mpmath.mpf("0.1"), mpmath.mpf(0.1) + mpmath.mpf("0.1"), 0]
    assert sol.saturated == [0] and abs(sol.tau + mpmath.mpf("0.1")) < 1e-15
    assert max(abs(a - b) for a, b in zip(sol.p, want)) < 1e-15


def test_budget_sparsemax_by_hand():
    """``u = 1``, ``c = 2``: the projection onto ``{0 <= p <= 1, sum p = 2}``; scores far apart saturate."""
    sol = solve_box(derivation("sparsemax"), [3.0, 2.5, 0.2, 0.1], upper=1, total=2)
    # entries 0 and 1 at 1 (s - tau >= 1), 2 and 3 at 0: any tau in [0.2, 1.5] holds; the solve gives one
    assert [float(q) for q in sol.p] == [1.0, 1.0, 0.0, 0.0] and sorted(sol.saturated) == [0, 1]
    sol = solve_box(derivation("sparsemax"), [0.3, 0.2, 0.1, -0.2], upper=1, total=2)
    with mpmath.workdps(70):
        tau = (mpmath.mpf(0.3) + mpmath.mpf(0.2) + mpmath.mpf(0.1) + mpmath.mpf(-0.2) - 2) / 4
        assert all(abs(q - (mpmath.mpf(s) - tau)) < 1e-40 for q, s in zip(sol.p, [0.3, 0.2, 0.1, -0.2]))


@pytest.mark.parametrize("name", NAMES)
def test_no_bound_is_the_plain_map(name):
    dv = derivation(name)
    scores = [0.7, -0.2, 0.4, -1.5, float("-inf")]
    got = solve_box(dv, scores, upper=None, total=1).p
    want = dv.evaluate(scores, digits=50)
    assert max(abs(a - b) for a, b in zip(got, want)) < mpmath.mpf(10) ** -45


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=6, deadline=None)
@given(scores=st.lists(st.floats(-3, 3), min_size=2, max_size=6), data=st.data())
def test_kkt_conditions_hold(name, scores, data):
    """Every solve satisfies the bounded KKT conditions to 40 digits, bounds and totals drawn feasible."""
    dv = derivation(name)
    n = len(scores)
    upper = data.draw(st.lists(st.sampled_from([0.05, 0.2, 0.5, 1.0, 3.0]), min_size=n, max_size=n))
    total = data.draw(st.floats(0.1, 1.0) if sum(upper) > 1 else st.floats(0.05, sum(upper)))
    total = min(total, sum(upper))
    sol = solve_box(dv, scores, upper=upper, total=total, digits=50)
    with mpmath.workdps(70):
        assert kkt_violation(dv, scores, sol.p, upper, total, sol.tau) < mpmath.mpf(10) ** -40


def test_infeasible_bounds_are_refused_by_name():
    dv = derivation("sparsemax")
    with pytest.raises(ValueError, match=r"infeasible bounds: .* sum to 0.5 < total = 1"):
        solve_box(dv, [0.1, 0.2], upper=[0.25, 0.25])
    with pytest.raises(ValueError, match="infeasible"):  # a masked entry's bound does not count
        solve_box(dv, [0.1, float("-inf")], upper=[0.5, 0.5])
    with pytest.raises(ValueError, match=">= 0"):
        solve_box(dv, [0.1, 0.2], upper=[-0.5, 2])


def _fd(fn, x, h):
    """Central differences of a vector function ``fn`` of the list ``x``: columns ``dfn/dx_b``."""
    cols = []
    for b in range(len(x)):
        up, down = list(x), list(x)
        up[b] += h
        down[b] -= h
        f1, f0 = fn(up), fn(down)
        cols.append([(a1 - a0) / (2 * h) for a1, a0 in zip(f1, f0)])
    return [[cols[b][a] for b in range(len(x))] for a in range(len(cols[0]))]


def _derivative_case():
    """``(scores, upper, total, h)`` of the derivative tests, in the working precision: entry 0 saturated, away from
    kinks; ``h`` the central differences' step."""
    return ([mpmath.mpf(v) for v in (1.6, 0.3, 0.2, -0.4)], [mpmath.mpf(v) for v in ("0.35", "0.3", 1, 1)],
            mpmath.mpf("0.9"), mpmath.mpf(10) ** -25)


@pytest.mark.parametrize("name", NAMES)
def test_jacobians_are_the_derivatives_of_the_solve(name):
    """dp/ds, dp/du and dp/dc of :func:`box_jacobians` against central differences of the solve at 60 digits."""
    dv = derivation(name)
    with mpmath.workdps(80):
        s, u, c, h = _derivative_case()
        jac = box_jacobians(dv, s, upper=u, total=c, digits=60)
        fd_s = _fd(lambda x: solve_box(dv, x, upper=u, total=c, digits=60).p, s, h)
        fd_u = _fd(lambda x: solve_box(dv, s, upper=x, total=c, digits=60).p, u, h)
        fd_c = _fd(lambda x: solve_box(dv, s, upper=u, total=x[0], digits=60).p, [c], h)
    saturated = solve_box(dv, s, upper=u, total=c).saturated
    assert saturated, "the case must saturate an entry"
    for key, fd in (("scores", fd_s), ("upper", fd_u)):
        assert max(abs(a - b) for ra, rb in zip(jac[key], fd) for a, b in zip(ra, rb)) < 1e-20, key
    assert max(abs(a - r[0]) for a, r in zip(jac["total"], fd_c)) < 1e-20


@pytest.mark.parametrize("name", NAMES)
def test_loss_gradients_are_the_derivatives_of_the_loss(name):
    """p - y, mu and tau against central differences of :func:`box_loss` at 60 digits; the loss is 0 at y = p."""
    dv = derivation(name)
    with mpmath.workdps(80):
        s, u, c, h = _derivative_case()
        y = [mpmath.mpf(v) for v in ("0.3", "0.3", "0.2", "0.1")]
        grad = box_loss_gradients(dv, s, y, upper=u, total=c, digits=60)
        fd_s = _fd(lambda x: [box_loss(dv, x, y, upper=u, total=c, digits=60)], s, h)[0]
        # the target stays in the box: u moves only where y is below it, c with y moved on a free entry
        fd_u = [(box_loss(dv, s, y, upper=u[:j] + [u[j] + h] + u[j + 1:], total=c, digits=60)
                 - box_loss(dv, s, y, upper=u[:j] + [u[j] - h] + u[j + 1:], total=c, digits=60)) / (2 * h)
                for j in (0, 2, 3)]
        # c and a free entry of y move together (y stays in the box): dL = tau + omega'(y_3) - s_3
        fd_c = (box_loss(dv, s, y[:3] + [y[3] + h], upper=u, total=c + h, digits=60)
                - box_loss(dv, s, y[:3] + [y[3] - h], upper=u, total=c - h, digits=60)) / (2 * h)
        d1 = sp.lambdify(p_symbol, dv.omega_prime, "mpmath")
        p = solve_box(dv, s, upper=u, total=c, digits=60).p
        at_p = box_loss(dv, s, p, upper=u, total=c, digits=60)
        assert max(abs(a - b) for a, b in zip(grad["scores"], fd_s)) < 1e-20
        assert max(abs(grad["upper"][j] - d) for j, d in zip((0, 2, 3), fd_u)) < 1e-20
        assert abs(grad["total"] + d1(y[3]) - s[3] - fd_c) < 1e-20
        assert grad["upper"][0] > 0  # the saturated entry's multiplier
        assert abs(at_p) < 1e-40


def test_a_link_steeper_than_the_digits_is_solved_with_more():
    """entmax at alpha = 100, bounds 1/3 and 1/6 summing (as floats, exactly) to just under 0.5, the total the
    bounds' sum: the only feasible p is the bounds themselves.  g_+ of 1/6 needs about 77 digits of s - tau
    (``(99 z + 1/100)^(1/99)``), more than the default 50: the reference used to return [1/3, 0], summing to 1/3."""
    dv = derive_map(tsallis(sp.Integer(100)))
    upper = [1 / 3, 1 / 6]
    with mpmath.workdps(60):
        room = mpmath.fsum(mpmath.mpf(v) for v in upper)
    sol = solve_box(dv, [1.0, 0.0], upper=upper, total=room)
    with mpmath.workdps(60):
        assert abs(mpmath.fsum(sol.p) - room) < mpmath.mpf(10) ** -45
        assert all(abs(p - mpmath.mpf(u)) < mpmath.mpf(10) ** -45 for p, u in zip(sol.p, upper))
