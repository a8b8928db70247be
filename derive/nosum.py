"""The ground truth with no sum constraint: ``p = argmax <p, s> - Omega(p)`` over ``0 <= p <= u`` alone.

For a separable ``Omega`` the problem splits into one problem per score, ``p_i = argmax_{0 <= q <= u_i} q s_i -
omega(q)``: a concave function of ``q`` whose derivative ``s_i - omega'(q)`` decreases, so ``p_i`` is the root of
``omega'(q) = s_i`` clipped to ``[0, u_i]``: 0 where ``s_i <= omega'(0+)``, ``u_i`` where ``s_i >= omega'(u_i)``.
That is the link at the score itself, ``p_i = min(u_i, g_+(s_i))``, with no threshold.

* The Jacobian in the scores is diagonal, ``w_i = 1 / omega''(p_i)`` on the free entries ``0 < p_i < u_i``;
  ``dp_j/du_j = 1`` on the saturated ones ``p_j = u_j > 0`` (0 elsewhere).
* The Fenchel-Young loss ``sum_i q_i s_i - omega(q_i) |_{q = p} + omega(y_i) - s_i y_i`` has the gradient ``p - y``
  in the scores and, in each bound, the multiplier ``mu_i = [s_i - omega'(u_i)]_+`` (Danskin).
* The binary entropy ``p log p + (1 - p) log(1 - p)`` gives ``p = 1 / (1 + e^-s)`` and the logistic loss; Gini
  ``p^2 / 2`` gives ``max(s, 0)``.

Solved here without the link: each ``p_i`` by bisection on ``omega'(q) - s_i`` in mpmath (the bracket widened
until ``omega'`` passes the score), independent of :mod:`numeric` and of the derivation's inverse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mpmath
import sympy as sp

from .reference import GUARD_DIGITS, compiled, to_mp_vector
from .regularizers import z

if TYPE_CHECKING:
    from .derivation import Derivation

__all__ = ["solve_nosum", "nosum_jacobians", "nosum_loss", "nosum_loss_gradients", "describe"]


def _bounds(values, upper):
    if upper is None:
        return [mpmath.inf] * len(values)
    u = [mpmath.mpf(b) for b in (upper.tolist() if hasattr(upper, "tolist") else upper)] \
        if hasattr(upper, "__len__") else [mpmath.mpf(upper)] * len(values)
    if len(u) != len(values) or any(b < 0 for b in u):
        raise ValueError("upper must be one bound >= 0 per score, or a number")
    return u


def _one(comp, s, u, digits):
    """``argmax_{0 <= q <= u} q s - omega(q)`` by bisection on ``omega'(q) = s``."""
    if s == -mpmath.inf or u == 0:
        return mpmath.mpf(0)
    lo, hi = mpmath.mpf(10) ** -(digits + 30), mpmath.mpf(1)
    while comp.d1(lo) >= s:  # (a dense map's p far below 1, down to 10**-10**5: else omega' at 0+ reaches s, q = 0)
        if lo < mpmath.mpf(10) ** -100000:
            return mpmath.mpf(0)
        lo = lo * lo
    while hi < u:
        try:
            slope = comp.d1(hi)
        except (ValueError, ZeroDivisionError):  # (the domain ends before hi: omega' -> +inf at its end)
            slope = mpmath.inf
        if not mpmath.isfinite(slope) and slope != mpmath.inf or slope >= s:
            break
        lo, hi = hi, 2 * hi
    else:
        if comp.d1(u) <= s:
            return u
        hi = u
    # to digits + 10 significant digits, across decades by the geometric mean (a p far below 1: a dense map's tail)
    tol = mpmath.mpf(10) ** -(digits + 10)
    while hi - lo > tol * hi:
        mid = mpmath.sqrt(lo * hi) if hi > 4 * lo else (lo + hi) / 2
        try:
            slope = comp.d1(mid)
        except (ValueError, ZeroDivisionError):
            slope = mpmath.inf
        if mpmath.im(slope) != 0 or slope >= s:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def solve_nosum(dv: Derivation, scores: Any, upper: Any = None, digits: int = 50, **params: Any) -> list:
    """``p`` with no sum constraint for one score vector (``-inf``: masked, 0; ``upper``: a number or one bound per
    score, ``None`` for none)."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        comp = compiled(dv, params)
        values = to_mp_vector(scores)
        return [_one(comp, s, b, digits) for s, b in zip(values, _bounds(values, upper))]


def nosum_jacobians(dv: Derivation, scores: Any, upper: Any = None, digits: int = 50, **params: Any) -> dict:
    """``{"scores": dp/ds, "upper": dp/du}``, both diagonal (``n x n``, row ``a``, column ``b``: ``dp_a/ds_b``)."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        comp = compiled(dv, params)
        values = to_mp_vector(scores)
        u = _bounds(values, upper)
        p = [_one(comp, s, b, digits) for s, b in zip(values, u)]
        tol = mpmath.mpf(10) ** -(digits + 5)
        n = len(p)
        zero = mpmath.mpf(0)
        below = [b == mpmath.inf or q < b - tol * (1 + b) for q, b in zip(p, u)]  # (inf - inf is NaN)
        free = [q > tol and c for q, c in zip(p, below)]
        saturated = [q > tol and not c for q, c in zip(p, below)]
        js = [[comp.weight(p[a]) if a == b and free[a] else zero for b in range(n)] for a in range(n)]
        ju = [[mpmath.mpf(1) if a == b and saturated[a] else zero for b in range(n)] for a in range(n)]
        return {"scores": js, "upper": ju}


def nosum_loss(dv: Derivation, scores: Any, target: Any, upper: Any = None, digits: int = 50, **params: Any):
    """The Fenchel-Young loss with no sum: ``sum_i p_i s_i - omega(p_i) + omega(y_i) - s_i y_i`` (masked scores left
    out; a target with mass on one gives ``+inf``); the target in the box, ``0 <= y <= u``."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        comp = compiled(dv, params)
        values = to_mp_vector(scores)
        u = _bounds(values, upper)
        ys = to_mp_vector(target)
        if len(ys) != len(values):
            raise ValueError(f"target has length {len(ys)}, scores {len(values)}")
        if any(t < 0 or t > b for t, b in zip(ys, u)):
            raise ValueError("target must lie in the box (0 <= y <= upper)")
        total = mpmath.mpf(0)
        for s, t, b in zip(values, ys, u):
            if s == -mpmath.inf:
                if t > 0:
                    return mpmath.inf
                continue
            q = _one(comp, s, b, digits)
            om = (lambda v: comp.omega(v) if v > 0 else comp.omega_zero())
            total += q * s - om(q) + om(t) - s * t
        return total


def nosum_loss_gradients(dv: Derivation, scores: Any, target: Any, upper: Any = None, digits: int = 50,
                         **params: Any) -> dict:
    """``{"scores": p - y, "upper": mu}``, ``mu_i = [s_i - omega'(u_i)]_+`` where ``u_i`` is finite."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        comp = compiled(dv, params)
        values = to_mp_vector(scores)
        u = _bounds(values, upper)
        ys = to_mp_vector(target)
        p = [_one(comp, s, b, digits) for s, b in zip(values, u)]
        mu = [max(mpmath.mpf(0), s - comp.d1(b)) if mpmath.isfinite(b) and b > 0 and s != -mpmath.inf
              else mpmath.mpf(0) for s, b in zip(values, u)]
        return {"scores": [q - t for q, t in zip(p, ys)], "upper": mu}


def describe(dv: Derivation, latex: bool = False) -> str:
    """The map of ``dv``'s regularizer with no sum, its Jacobian and its loss, as text (or LaTeX math): what
    ``regattn derive`` prints after the simplex's derivation for a name that binds ``total=None`` (``sigmoid``,
    ``relu``)."""
    show = sp.latex if latex else sp.sstr
    at = {z: sp.Symbol("s", real=True)}
    link = ("omega'(p) = s solved by safeguarded Newton" if dv.link is None or dv.inversion.method != "closed"
            else f"g(s) = {show(dv.link.subs(at))}")
    lines = [
        "Without a sum (total=None)",
        "   p_i = argmax_{0 <= q <= u_i} q s_i - omega(q) = min(u_i, g_+(s_i)): each score on its own, no threshold",
        f"   {link}",
        f"   J = diag(w) on 0 < p_i < u_i, w(p) = {show(dv.weight)}",
    ]
    if dv.scalar_conjugate is not None:
        lines.append(f"   omega*(s) = {show(dv.scalar_conjugate.subs(at))}")
    lines.append("   L(s; y) = sum_i omega*_+(s_i) + omega(y_i) - s_i y_i (omega*_+ = -omega(0+) where s_i <= omega'(0+)), gradient p - y in s")
    return "\n".join(lines) + "\n"
