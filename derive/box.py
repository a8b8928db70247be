"""The ground truth with box constraints: ``p = argmax <p, s> - Omega(p)`` over ``0 <= p <= u``, ``sum p = c``.

For a separable ``Omega(p) = sum_i omega(p_i)`` the KKT conditions of the bounded problem are those of the
simplex with each entry clipped at its bound: with a multiplier ``tau`` for the sum and ``mu_i >= 0`` for
``p_i <= u_i``,

    p_i = min(u_i, g_+(s_i - tau)),        sum_i p_i = c,
    mu_i = s_i - tau - omega'(u_i) >= 0    where p_i = u_i (the saturated set S),

and ``F(tau) = sum_i min(u_i, g_+(s_i - tau))`` decreases in ``tau`` (``g_+ = inf`` beyond ``omega'(inf)`` where
``omega'`` is bounded above, as Tsallis' with ``alpha < 1``), so ``tau`` is its one root of
``F = c``.  It exists where the bounds of the unmasked entries allow the sum, ``sum u_i >= c``.
With ``u = 1`` and ``c = k`` this is the budget (k-subset) map; with ``u = inf`` and ``c = 1`` the plain one.

Derivatives, on the free set ``F = {0 < p_i < u_i}`` with weights ``w_i = 1 / omega''(p_i)`` there and 0
elsewhere (``W = sum_F w``):

* in the scores, ``J = diag(w) - w w^T / W`` (the simplex's Jacobian restricted to ``F``);
* in the bound of a saturated entry ``j``, ``dp/du_j = e_j - w / W`` (the mass it takes is taken from the free
  entries in proportion to their weights), 0 for an entry not saturated;
* in the total, ``dp/dc = w / W``.

Where no entry is free (``W = 0``: every live entry at 0 or at its bound, as budget sparsemax's ``[1, 1, 0]``)
``p`` is locally constant in the scores (``dp/ds = 0``) but has a kink in the bounds and the total at the point
itself: ``sum p = c`` always, so a bound raised must take its mass from another entry, and which one depends on
the side.  The derivatives given are the one-sided ones on the side where ``tau`` rises: the right-derivative in
each bound and the left-derivative in the total (the side that stays feasible where the bounds sum to the total).
As ``tau`` rises, the saturated entries that leave their bound first, ``K`` (the least ``s_k - omega'(u_k)``),
become free; they take the free entries' place with their weights at the bound, ``w_k = 1 / omega''(u_k)``:
``dp/du_j = e_j - w_K / W_K`` for a saturated ``j`` outside ``K``, 0 for ``j`` in ``K``, ``dp/dc = w_K / W_K``,
so that ``d sum(p)/du = 0`` and ``d sum(p)/dc = 1`` (:func:`numeric.constraints.box.box_exits`, the same rule).

The Fenchel-Young loss ``L(s, y) = Omega*_C(s) + Omega(y) - <s, y>`` with ``C`` the box gives ``p - y`` in
the scores, ``mu`` in the bounds and ``tau`` in the total (Danskin: the multipliers of the constraints).

Solved here independently of :mod:`numeric`: a bracket of ``tau`` and bisection, with Newton steps taken where
they land inside it, in mpmath at ``digits`` significant digits plus guard digits, until ``|F - c|`` is below
``10**-(digits + 10)`` of ``c``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mpmath
import sympy as sp

from .errors import DerivationError
from .reference import GUARD_DIGITS, compiled, fenchel_young, target_slack, to_mp_vector
from .regularizers import p as p_symbol
from .regularizers import to_mpf

if TYPE_CHECKING:
    from .derivation import Derivation

__all__ = ["BoxSolution", "solve_box", "box_jacobians", "box_loss", "box_loss_gradients"]

_MAX_STEPS = 4000
#: The most digits :func:`solve_box` takes, doubling them from the caller's while its sum misses the total.
_MAX_DIGITS = 800


@dataclass(frozen=True)
class BoxSolution:
    """``p``, ``tau`` (``None`` for a fully masked row) and the saturated entries (``p_i = u_i > 0``)."""

    p: list
    tau: Any
    saturated: list


def _bounds(values, upper, total):
    n = len(values)
    if upper is None:
        u = [mpmath.inf] * n
    else:
        if hasattr(upper, "tolist"):
            upper = upper.tolist()
        u = [mpmath.mpf(upper)] * n if not isinstance(upper, (list, tuple)) else [mpmath.mpf(v) for v in upper]
        if len(u) != n:
            raise ValueError(f"upper has length {len(u)}, scores {n}")
    if any(mpmath.isnan(v) or v < 0 for v in u):
        raise ValueError("upper bounds must be >= 0 (inf: no bound)")
    c = mpmath.mpf(total)
    if not (c > 0) or c == mpmath.inf:
        raise ValueError(f"total must be a finite number > 0, got {total!r}")
    room = mpmath.fsum(b for b, v in zip(u, values) if v != -mpmath.inf)
    if room < c:
        raise ValueError(f"infeasible bounds: the upper bounds of the unmasked entries sum to "
                         f"{mpmath.nstr(room, 8)} < total = {mpmath.nstr(c, 8)}")
    return u, c


def solve_box(dv: Derivation, scores: Any, upper: Any = None, total: Any = 1, digits: int = 50,
              **params: Any) -> BoxSolution:
    """The bounded map's ``p`` and ``tau`` for one score vector (``-inf``: masked, ``p = 0``); ``upper`` a number
    or one bound per score (``inf``: none), ``total`` the sum.  Raises :class:`ValueError` for infeasible bounds."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        return _solve_box(dv, scores, upper, total, digits, params)


def _solve_box(dv, scores, upper, total, digits, params) -> BoxSolution:
    comp = compiled(dv, params)
    values = to_mp_vector(scores)
    u, c = _bounds(values, upper, total)
    live = [i for i, v in enumerate(values) if v != -mpmath.inf and u[i] > 0]
    zeros = [mpmath.mpf(0)] * len(values)
    if not live:  # (feasible only where every entry is masked or bounded at 0 and c = 0: refused above)
        return BoxSolution(zeros, None, [])
    top = max(values[i] for i in live)
    y = {i: mpmath.fsub(values[i], top, exact=True) for i in live}

    ceiling = _ceiling(dv, params)

    def parts(t):
        p, slope = {}, mpmath.mpf(0)
        for i in live:
            g = mpmath.inf if y[i] - t >= ceiling else comp.g(y[i] - t)
            if g >= u[i]:
                p[i] = u[i]
            else:
                p[i] = g
                if g > 0:
                    slope += comp.weight(g)
        return p, mpmath.fsum(p.values()), slope

    n = mpmath.mpf(len(live))
    hi = -comp.d1(c / n)  # every g_+(y_i - hi) <= c / n: F(hi) <= c
    lo = min(y[i] - comp.d1(min(u[i], c)) for i in live)  # each entry at least min(u_i, c): F(lo) >= c
    lo = min(lo, hi)
    tol = c * mpmath.mpf(10) ** -(digits + 10)
    t = (lo + hi) / 2
    for _ in range(_MAX_STEPS):
        p, f, slope = parts(t)
        if abs(f - c) <= tol:
            break
        if f > c:
            lo = t
        else:
            hi = t
        newton = t + (f - c) / slope if slope > 0 else None
        t = newton if newton is not None and lo < newton < hi else (lo + hi) / 2
        if hi - lo <= mpmath.mpf(2) ** (-mpmath.mp.prec + 4) * (1 + abs(t)):
            p, f, slope = parts(t)
            if abs(f - c) > tol:
                p = _level(dv, values, live, u, c, parts(lo)[0], parts(hi)[0], tol)
            break
    else:
        raise DerivationError(f"the bounded reference of {dv.name} did not converge in {_MAX_STEPS} steps")
    out = list(zeros)
    for i in live:
        out[i] = p[i]
    if abs(mpmath.fsum(out) - c) > tol:
        # a link too steep for the working precision: F's values at the bracket's ends were computed with
        # cancellation (entmax at alpha = 100: g_+(z) = (99 z + 1/100)^(1/99) of 1/6 needs 77 digits of z), so
        # the bracket was not one; solve again with twice the digits, up to _MAX_DIGITS, or raise
        if digits >= _MAX_DIGITS:
            raise DerivationError(f"the bounded reference of {dv.name} did not reach the total at {digits} digits")
        with mpmath.workdps(2 * digits + GUARD_DIGITS):
            return _solve_box(dv, scores, upper, total, 2 * digits, params)
    saturated = [i for i in live if p[i] == u[i]]
    return BoxSolution(out, t + top, saturated)


def _level(dv, values, live, u, c, p_lo, p_hi, tol):
    """``p`` where ``F`` jumps across ``c`` between two thresholds ``lo < hi`` that the working precision cannot
    tell apart (a link steeper than it: alpha-entmax at large alpha, ``g_+(z) = ((alpha - 1) z)^(1/(alpha - 1))``
    past the clip).  The entries that move between them by more than ``tol`` share ``s_i - tau`` to that
    precision, so their scores must be equal (else :class:`DerivationError`: more digits are needed); they share
    one value ``q`` of the link, ``p_i = min(u_i, q)``, with ``q`` the level that makes the sum ``c`` (water
    filling: each bound below ``q`` is full).  The other entries keep their value (the same at both ends to
    ``tol``)."""
    moving = [i for i in live if abs(p_lo[i] - p_hi[i]) > tol]
    if len({values[i] for i in moving}) > 1:
        raise DerivationError(f"the bounded reference of {dv.name}: the sum jumps across the total between two "
                              f"thresholds {mpmath.mp.dps} digits cannot tell apart at entries {moving} of different "
                              f"scores; raise digits")
    p = {i: p_lo[i] for i in live}
    need = c - mpmath.fsum(p[i] for i in live if i not in moving)
    left = sorted(moving, key=lambda i: u[i])
    while left:  # the smallest bound first: full where the even share of what is left reaches it
        share = need / len(left)
        if u[left[0]] > share:
            for i in left:
                p[i] = share
            break
        p[left[0]] = u[left[0]]
        need -= u[left[0]]
        left.pop(0)
    return p


def _ceiling(dv, params):
    """``omega'(inf)``, the limit for the parameters' exact values: where ``omega'`` is bounded above (Tsallis with
    ``alpha < 1``: ``1 / (alpha (1 - alpha))``) no ``p`` has ``omega'(p) = z`` for ``z`` at or beyond it, and
    ``g_+(z) = inf`` there (every bound saturates); ``inf`` where ``omega'`` is not bounded."""
    key = ("box_ceiling",) + tuple(sorted((n, repr(v)) for n, v in params.items()))
    if key not in dv._cache:
        exact = {q.symbol: sp.Rational(params[q.symbol.name]) if isinstance(params[q.symbol.name], float)
                 else sp.sympify(params[q.symbol.name]) for q in dv.parameters}
        top = sp.limit(dv.omega_prime.subs(exact), p_symbol, sp.oo)
        dv._cache[key] = top if top.is_finite else None
    top = dv._cache[key]
    return mpmath.inf if top is None else to_mpf(top)


def _free_weights(comp, sol, u, tol):
    """``w`` on the free entries, 0 elsewhere: an entry within the solve's ``tol`` of 0 or of its bound is not free
    (where ``F`` is flat, the threshold the solve stops at may leave such a residue at a kink)."""
    return [comp.weight(q) if tol < q < b - tol else mpmath.mpf(0) for q, b in zip(sol.p, u)]


def box_jacobians(dv: Derivation, scores: Any, upper: Any = None, total: Any = 1, digits: int = 50,
                  **params: Any) -> dict:
    """``{"scores": dp/ds, "upper": dp/du, "total": dp/dc}`` of the bounded map at ``scores`` (module docstring):
    ``n x n`` matrices (row ``a``, column ``b``: ``dp_a / ds_b``) and a vector."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        sol = _solve_box(dv, scores, upper, total, digits, params)
        comp = compiled(dv, params)
        u, c = _bounds(to_mp_vector(scores), upper, total)
        tol = c * mpmath.mpf(10) ** -(digits + 5)
        w = _free_weights(comp, sol, u, tol)
        big = mpmath.fsum(w)
        n = len(w)
        zero = mpmath.mpf(0)
        saturated = [j for j, (q, b) in enumerate(zip(sol.p, u)) if q > tol and q >= b - tol]
        if big == 0:  # no entry free: dp/ds = 0; the bounds' and the total's one-sided (module docstring)
            js = [[zero] * n for _ in range(n)]
            values = to_mp_vector(scores)
            gap = {j: values[j] - comp.d1(u[j]) for j in saturated}
            least = min(gap.values())
            first = [j for j in saturated if gap[j] - least <= mpmath.mpf(10) ** -digits * (1 + abs(least))]
            w = [comp.weight(u[a]) if a in first else zero for a in range(n)]
            big = mpmath.fsum(w)
            saturated = [j for j in saturated if j not in first]
        else:
            js = [[(w[a] if a == b else 0) - w[a] * w[b] / big for b in range(n)] for a in range(n)]
        ju = [[((1 if a == b else 0) - w[a] / big) if b in saturated else zero for b in range(n)] for a in range(n)]
        return {"scores": js, "upper": ju, "total": [w[a] / big for a in range(n)]}


def box_loss(dv: Derivation, scores: Any, target: Any, upper: Any = None, total: Any = 1, digits: int = 50,
             **params: Any):
    """The Fenchel-Young loss with the box: ``Omega*_C(s) + Omega(y) - <s, y>``; the target must lie in the box
    (``0 <= y <= u``, ``sum y = c``)."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        comp = compiled(dv, params)
        values = to_mp_vector(scores)
        u, c = _bounds(values, upper, total)
        ys = to_mp_vector(target)
        if len(ys) != len(values):
            raise ValueError(f"target has length {len(ys)}, scores {len(values)}")
        slack = target_slack(target, ys, c, digits)  # (the target's own rounding)
        if any(t < 0 or t > b + slack for t, b in zip(ys, u)) or abs(mpmath.fsum(ys) - c) > slack:
            raise ValueError(f"target must lie in the box (0 <= y <= upper, sum y = total), got sum "
                             f"{mpmath.nstr(mpmath.fsum(ys), 17)} for total {mpmath.nstr(c, 17)}")
        return fenchel_young(comp, values, _solve_box(dv, scores, upper, total, digits, params).p, ys)


def box_loss_gradients(dv: Derivation, scores: Any, target: Any, upper: Any = None, total: Any = 1,
                       digits: int = 50, **params: Any) -> dict:
    """``{"scores": p - y, "upper": mu, "total": tau}``: the loss's gradients (module docstring), ``mu_j =
    s_j - tau - omega'(u_j)`` on the saturated entries and 0 elsewhere."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        comp = compiled(dv, params)
        values = to_mp_vector(scores)
        u, _ = _bounds(values, upper, total)
        ys = to_mp_vector(target)
        sol = _solve_box(dv, scores, upper, total, digits, params)
        mu = [values[j] - sol.tau - comp.d1(u[j]) if j in sol.saturated else mpmath.mpf(0) for j in range(len(values))]
        return {"scores": [q - t for q, t in zip(sol.p, ys)], "upper": mu, "total": sol.tau}
