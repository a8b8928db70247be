"""High-precision evaluation of a :class:`~derive.derivation.Derivation`: the ground truth.

Every numeric result in regattn is compared with these functions.  They work
with mpmath at ``digits`` significant digits (plus guard digits) directly from
the KKT conditions the derivation recorded, ``p_i = g_+(s_i - tau)`` with
``sum_i p_i = 1``:

* the derivation's threshold rule (closed form or sort-based support) gives a
  first ``tau``; the root solve of :func:`_relative_solve` (the whole solve for
  a ``"root"`` threshold) then finds ``p*`` in one unknown tied to one entry
  ``k``: ``p_k`` itself, or ``s_k - tau - omega'(0+)`` when ``k`` is off the
  support, with every other entry at the exact score difference ``s_i - s_k``
  from it.  ``omega'`` and the link are measured from the clip ``omega'(0+)``
  with the cancellation done symbolically, so a probability whose
  ``z - omega'(0+)`` is far below ``10**-digits`` (alpha-entmax at large alpha:
  ``p = ((alpha - 1) y)**(1/(alpha - 1))``) keeps its digits;
* the result is accepted on an a-posteriori bound on ``max_i |p_i - p*_i|``
  (``|sum p - 1|`` plus each ``p_i``'s rounding), not on ``tau``: above
  ``10**-(digits + 5)`` the solve is referred to the entry nearest the clip,
  then the working precision is raised, and where that does not help either
  the functions raise :class:`~derive.errors.DerivationError`;
* the link by its closed form, or where the derivation says ``"newton"`` by the
  safeguarded Newton solve of ``omega'(p) = z`` in ``log p`` that the NumPy and
  CUDA links run too (:func:`numeric.newton.invert_link`), here at the working
  precision, where its stopping rule leaves ``p`` exact to the last digits.

Scores equal to ``-inf`` are masked: they get probability exactly 0 and the
rest is solved as if they were absent; an all ``-inf`` vector gives zeros.
The threshold is solved for the scores shifted by their maximum (exactly;
``p*`` does not change, ``tau`` moves by the shift), so scores as large as
``1e300`` keep the bracket at the scale of ``omega'``.  Where the arithmetic still fails
(a division by zero or an overflow at the working precision) the functions
raise :class:`~derive.errors.DerivationError` with a one-line message.

Each function takes the derivation ``dv`` and reads its fields only; the
record's own module imports this one (:meth:`~derive.derivation.Derivation.evaluate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mpmath
import numpy as np
import sympy as sp

from numeric.newton import WIDEN_STEPS, ScalarOps, invert_link

from .errors import DerivationError
from .regularizers import p, to_mpf, z
from .symbols import S, S1, S2, k, score

__all__ = [
    "evaluate",
    "threshold",
    "conjugate",
    "loss",
    "jacobian",
    "kkt_residual",
    "to_mp_vector",
    "target_slack",
    "fenchel_young",
    "compiled",
    "Compiled",
    "GUARD_DIGITS",
]

#: Digits carried beyond those asked for: every function of this module (and of :mod:`derive.box`,
#: :mod:`derive.normmax`) works at ``digits + GUARD_DIGITS``.
GUARD_DIGITS = 20


def _real(value):
    """The real part of a link value: a printed closed form (a root, a power of a negative base) may
    come back from mpmath as a complex number with a vanishing imaginary part on the real branch."""
    return value.real if isinstance(value, mpmath.mpc) else value


def to_mp_vector(scores: Any) -> list[mpmath.mpf]:
    """Scores (a sequence or 1-D array of numbers, strings or SymPy numbers) as mpmath numbers.

    Floats and mpmath numbers are taken exactly (whatever the working precision);
    other numbers are rounded to it.  ``-inf`` is kept (masked); ``nan`` and ``+inf``
    raise :class:`ValueError`.
    """
    if hasattr(scores, "tolist"):
        scores = scores.tolist()
    if not isinstance(scores, Sequence) or isinstance(scores, str):
        raise ValueError(f"scores must be a 1-D sequence of numbers, got {type(scores).__name__}")
    out = []
    for idx, value in enumerate(scores):
        if isinstance(value, Sequence) and not isinstance(value, str):
            raise ValueError(f"scores must be 1-D, entry {idx} is {value!r}")
        if isinstance(value, sp.Basic):
            v = to_mpf(value)
        elif isinstance(value, mpmath.mpf):
            v = value
        else:
            v = mpmath.mpf(value)
        if mpmath.isnan(v) or v == mpmath.inf:
            raise ValueError(f"score {idx} is {value!r}; the reference accepts finite numbers and -inf")
        out.append(v)
    if not out:
        raise ValueError("scores must hold at least one entry")
    return out


class Compiled:
    """The derivation's expressions as mpmath functions, for fixed parameter values (made by :func:`compiled`).

    Attributes: ``omega``, ``d1`` (``omega'``), ``d2`` (``omega''``), ``weight`` (``w``), functions of ``p``;
    ``clip`` and ``omega_zero``, functions of no argument; methods :meth:`g` (the clipped link ``g_+(z)``),
    :meth:`link_from_clip` and :meth:`tau` (the threshold of finite scores).  Each evaluates at mpmath's working
    precision.
    """

    def __init__(self, dv, params: dict[str, Any]):
        names = {q.symbol.name: q for q in dv.parameters}
        unknown = set(params) - set(names)
        if unknown:
            raise ValueError(f"unknown parameter(s) {sorted(unknown)} for {dv.name}; it has {sorted(names)}")
        missing = set(names) - set(params)
        if missing:
            raise ValueError(f"{dv.name} needs values for parameter(s) {sorted(missing)}")
        raw = []
        for name, q in names.items():
            value = params[name]
            exact = sp.Rational(value) if isinstance(value, (int, str)) else sp.sympify(value)
            if not (q.lower < exact < q.upper):
                raise ValueError(f"parameter {name} = {value} is outside ({q.lower}, {q.upper})")
            # floats at their exact binary value; other numbers exactly, at the working precision
            raw.append(value if isinstance(value, float) else exact)
        symbols = [q.symbol for q in names.values()]
        self.dv = dv

        def values():
            return [mpmath.mpf(r) if isinstance(r, float) else to_mpf(r) for r in raw]

        def fn(expr, *args):
            # parameters stay symbols in the lambdified code (substituting a long binary
            # rational into SymPy expressions makes SymPy expand huge exact powers)
            f = sp.lambdify(list(args) + symbols, expr, modules="mpmath")
            return lambda *a: f(*a, *values())

        self.sparse = dv.sparse
        self.clip = fn(dv.clip)
        self.omega = fn(dv.omega, p)
        if dv.omega_one is not None:  # (a domain that ends at 1: the formula is undefined there)
            inside, one = self.omega, fn(dv.omega_one)
            self.omega = lambda q: one() if q == 1 else inside(q)
        self.omega_zero = fn(dv.omega_zero)
        self.d1 = fn(dv.omega_prime, p)
        self.d2 = fn(dv.omega_second, p)
        if dv.omega_one is not None:  # (omega's domain ends at 1: omega' and omega'' are +oo there, as in floats)
            d1, d2 = self.d1, self.d2
            self.d1 = lambda q: mpmath.inf if q >= 1 else d1(q)
            self.d2 = lambda q: mpmath.inf if q >= 1 else d2(q)
        self.weight = fn(dv.weight, p)
        inv = dv.inversion
        self.link = fn(inv.closed_form, z) if inv.closed_form is not None and inv.method == "closed" else None
        if inv.method != "closed" and inv.special == ("LambertW",):
            self.link = fn(inv.closed_form, z)  # mpmath's lambertw is accurate
        # The link and omega' measured from the clip, y = z - omega'(0+), with the
        # cancellation of omega'(0+) done symbolically: alpha-entmax's link
        # ((alpha - 1) z + 1/alpha)**(1/(alpha - 1)) becomes ((alpha - 1) y)**(1/(alpha - 1)),
        # exact for y far below 10**-dps, where the clipped form has lost every digit.
        relative = _relative_forms(dv)
        self.h = fn(relative["h"], p)
        self.link_y = fn(relative["link_y"], _Y) if relative["link_y"] is not None else None
        th = dv.threshold
        if th.kind == "closed":
            self.term = fn(th.term, score)
            self.solution = fn(th.solution, S)
        elif th.kind == "sort":
            self.candidate = fn(th.candidate, k, S1, S2)
            self.discriminant = fn(th.discriminant, k, S1, S2) if th.discriminant is not None else None

    # ------------------------------------------------------------ the link
    def g(self, zz: mpmath.mpf) -> mpmath.mpf:
        """Clipped link ``g_+(z)``."""
        if zz == -mpmath.inf or (self.sparse and zz <= self.clip()):
            return mpmath.mpf(0)
        if zz == mpmath.inf:  # (the end of omega's domain: 1 where it ends there)
            return mpmath.mpf(1) if self.dv.omega_one is not None else mpmath.inf
        if self.link is not None:
            return _real(self.link(zz))
        return self._newton_link(zz)

    def link_from_clip(self, yy: mpmath.mpf) -> mpmath.mpf:
        """``g_+`` as a function of ``y = z - omega'(0+)`` (of ``y = z`` for a dense map)."""
        if not self.sparse:
            return self.g(yy)
        if yy <= 0:
            return mpmath.mpf(0)
        if self.link_y is not None:
            return _real(self.link_y(yy))
        return self._newton_link(yy, self.h)

    def _newton_link(self, zz: mpmath.mpf, d1=None) -> mpmath.mpf:
        """``d1(p) = z`` for ``p`` (``d1 = omega'``, or ``omega' - omega'(0+)``) by :func:`numeric.newton.invert_link`."""
        d1 = self.d1 if d1 is None else d1
        if not self.dv.regularizer.ends_at_one and d1(mpmath.exp(WIDEN_STEPS)) < zz:
            raise DerivationError(f"omega'(p) = z = {zz} has no root for p <= e^{WIDEN_STEPS}")
        return invert_link(_MpmathOps(), zz, d1, self.d2)

    # ------------------------------------------------------- the threshold
    def tau(self, finite: list[mpmath.mpf]) -> mpmath.mpf:
        kind = self.dv.threshold.kind
        if kind == "closed":
            return self.solution(mpmath.fsum(self.term(v) for v in finite))
        if kind == "sort":
            return self._sort_tau(finite)
        return self._root_tau(finite)

    def _sort_tau(self, finite: list[mpmath.mpf]) -> mpmath.mpf:
        ordered = sorted(finite, reverse=True)
        clip = self.clip()
        s1 = s2 = mpmath.mpf(0)
        best = None
        for kk, v in enumerate(ordered, start=1):
            s1 += v
            s2 += v * v
            if self.discriminant is not None and self.discriminant(kk, s1, s2) < 0:
                continue
            t = self.candidate(kk, s1, s2)
            if isinstance(t, mpmath.mpc):
                t = t.real
            if v - t > clip:
                best = t
        if best is None:  # cannot happen for a valid derivation: k = 1 always qualifies
            raise DerivationError("the sort-based support rule found no support")
        return best

    def _root_tau(self, finite: list[mpmath.mpf]) -> mpmath.mpf:
        """``tau`` by the root solve of :func:`_relative_solve` (referred to ``max(s)``)."""
        top = max(finite)
        floor = mpmath.mpf(2) ** (-mpmath.mp.prec + 8) * len(finite)  # |sum p - 1| at rounding level
        sol = _relative_solve(self, [mpmath.fsub(v, top, exact=True) for v in finite], floor)
        return sol.t + top


class _MpmathOps(ScalarOps):
    """:class:`numeric.newton.ScalarOps` on ``mpmath`` numbers at the working precision."""

    number = staticmethod(mpmath.mpf)
    exp = staticmethod(mpmath.exp)

    def __init__(self):
        prec = mpmath.mp.prec
        self.eps = mpmath.mpf(2) ** (-prec)
        self.log_tiny = mpmath.mpf(-(2**20))  # p = e^-1e6 is 0 beside anything a float holds
        self.newton_steps = 8 * prec + 64  # bisection alone: 21 bits of bracket, then prec bits


def compiled(dv, params: dict[str, Any]) -> Compiled:
    """The :class:`Compiled` functions of the derivation ``dv`` at the parameter values ``params`` (a name -> value
    mapping, every parameter once), made once and kept on ``dv`` for later calls with the same values.

    Raises :class:`ValueError` for an unknown or missing parameter or a value outside its domain.
    """
    key = tuple(sorted((n, repr(v)) for n, v in params.items()))
    cache = dv._cache.setdefault("reference", {})
    if key not in cache:
        cache[key] = Compiled(dv, params)
    return cache[key]


def _solve(dv, scores: Any, digits: int, params: dict):
    if not isinstance(digits, int) or digits < 5:
        raise ValueError(f"digits must be an int >= 5, got {digits!r}")
    comp = compiled(dv, params)
    values = to_mp_vector(scores)
    finite = [v for v in values if v != -mpmath.inf]
    if not finite:
        return comp, values, None, [mpmath.mpf(0)] * len(values)
    try:
        return _solve_shifted(comp, values, finite, digits)
    except (ZeroDivisionError, OverflowError, ValueError, TypeError) as exc:
        if isinstance(exc, DerivationError):
            raise
        raise DerivationError(
            f"the reference evaluation of {dv.name} at {len(values)} scores in "
            f"[{mpmath.nstr(min(finite), 6)}, {mpmath.nstr(max(finite), 6)}] failed at {digits} digits: "
            f"{type(exc).__name__} {str(exc).splitlines()[0] if str(exc) else ''}".rstrip()
        ) from exc


_Y = sp.Symbol("y", positive=True)
_FIRST_BUDGET = 40


def _cancel_sums(expr: sp.Expr) -> sp.Expr:
    """``expr`` with every sum put over a common denominator and cancelled, innermost first."""
    return sp.bottom_up(expr, lambda e: sp.factor_terms(sp.cancel(e)) if e.is_Add else e)


def _relative_forms(dv) -> dict:
    """``h(p) = omega'(p) - omega'(0+)`` and the link in ``y = z - omega'(0+)``, cancelled symbolically.

    A dense map (``omega'(0+) = -oo``) keeps ``h = omega'`` and its link in ``z``.
    """
    cache = dv._cache
    if "reference_relative" not in cache:
        inv = dv.inversion
        usable = inv.closed_form is not None and (inv.method == "closed" or inv.special == ("LambertW",))
        if dv.sparse:
            h = _cancel_sums(dv.omega_prime - dv.clip)
            link_y = _cancel_sums(inv.closed_form.subs(z, _Y + dv.clip)) if usable else None
        else:
            h, link_y = dv.omega_prime, None
        cache["reference_relative"] = {"h": h, "link_y": link_y}
    return cache["reference_relative"]


@dataclass(frozen=True)
class _Solution:
    """A solve of ``sum_i g_+(s_i - tau) = 1`` referred to entry ``k`` (see :func:`_relative_solve`).

    ``v`` the unknown, ``t = tau - max(s)``, ``probs`` and ``ys`` (``y_i`` or ``z_i``)
    per entry, ``residual = |sum p - 1|``, ``errors`` the rounding bound per entry.
    """

    k: int
    v: mpmath.mpf
    t: mpmath.mpf
    probs: list
    ys: list
    residual: mpmath.mpf
    errors: list

    @property
    def error(self) -> mpmath.mpf:
        """Bound on ``max_i |p_i - p*_i|``: ``|sum p - 1|`` plus the rounding of each ``p_i``."""
        return self.residual + max(self.errors)


def _split(lo: mpmath.mpf, hi: mpmath.mpf) -> mpmath.mpf:
    """A point inside ``(lo, hi)``: 0 if the bracket holds it, the geometric mean across decades."""
    if lo < 0 < hi:
        return mpmath.mpf(0)
    if lo > 0 and hi > 4 * lo:
        return mpmath.sqrt(lo * hi)
    if hi < 0 and lo < 4 * hi:
        return -mpmath.sqrt(lo * hi)
    return (lo + hi) / 2


def _relative_solve(
    comp: Compiled, d: list, tol: mpmath.mpf, k: int | None = None, start=None, budget: int | None = None
) -> _Solution:
    """``p*`` for the scores ``d`` (``max(d) = 0``, exact), solved in one variable ``v`` tied to entry ``k``.

    With ``y_i = s_i - tau - omega'(0+)`` (``z_i = s_i - tau`` for a dense map), the
    unknown is ``v = p_k`` while entry ``k`` is in the support (``y_k = h(v)``,
    ``h = omega' - omega'(0+)``) and ``v = y_k <= 0`` outside it; every other entry is
    ``p_i = g_+(a_i + y_k)`` with ``a_i = s_i - s_k`` exact.  ``F(v) = sum_i p_i - 1`` is
    increasing, with slope ``1 + sum_{i != k} w_i / w(v)`` (``sum_{i != k} w_i`` for
    ``v <= 0``), and is solved by Newton's method in a shrinking bracket until
    ``|F(v)| <= tol / 2``.  As every ``p_i`` increases with ``v``, ``|p_i - p*_i| <= |F(v)|``
    for exactly evaluated ``p_i``; the rounding of ``a_i + y_k`` (about ``eps |y_k|``,
    large in ``p_i`` where ``g`` is steep, i.e. ``y_i`` near 0 for alpha > 2) is bounded
    per entry by ``g_+(y_i + delta) - g_+(y_i - delta)``.  Referring to the entry
    nearest the clip keeps ``|y_k| <= |y_i|``, so that bound is about ``eps p_i``.
    ``k`` defaults to an entry with ``d_k = 0``, ``start`` is a first guess for ``v``,
    ``budget`` caps the number of iterations (default: enough to bisect to the working precision).
    """
    n = len(d)
    one = mpmath.mpf(1)
    if k is None:
        k = d.index(max(d))
    a = [mpmath.fsub(x, d[k], exact=True) for x in d]
    sparse = comp.sparse
    clip = comp.clip() if sparse else mpmath.mpf(0)

    def at(v):
        yk = comp.h(v) if v > 0 else v
        ys = [x + yk for x in a]
        ys[k] = yk
        probs = [comp.link_from_clip(yy) for yy in ys]
        probs[k] = v if v > 0 else mpmath.mpf(0)
        return v, ys, probs, mpmath.fsum(probs) - 1

    def slope(v, probs):
        others = mpmath.fsum(comp.weight(q) for i, q in enumerate(probs) if i != k and q > 0)
        return 1 + others / comp.weight(v) if v > 0 else others

    # p_max lies in [1/n, 1], so y_k lies in [d_k + h(1/n), d_k + h(1)] and v in [V(.), 1]
    hi = one
    if d[k] == 0:
        lo = one / n
    else:
        h_min = comp.h(one / n)
        y_lo = d[k] + h_min - mpmath.mpf(2) ** (-mpmath.mp.prec + 4) * (abs(d[k]) + abs(h_min))
        lo = comp.link_from_clip(y_lo) if y_lo > 0 else y_lo
    cur = at(lo)
    if cur[3] > 0 and d[k] != 0:
        lo = d[k] - 1  # every y_i < 0: F = -1
        cur = at(lo)
    best = cur
    if cur[3] < 0:
        cur = at(hi)
        best = min(best, cur, key=lambda e: abs(e[3]))
        t = start if start is not None and lo < start < hi else _split(lo, hi)
        step_old = hi - lo
        for _ in range(budget or 8 * mpmath.mp.prec + 64):
            if abs(best[3]) <= tol / 2 or not lo < t < hi:
                break
            cur = at(t)
            if abs(cur[3]) < abs(best[3]):
                best = cur
            if cur[3] < 0:
                lo = t
            elif cur[3] > 0:
                hi = t
            else:
                break
            deriv = slope(t, cur[2])
            newton = t - cur[3] / deriv if deriv > 0 else None
            if newton is not None and lo < newton < hi and abs(newton - t) < abs(step_old) / 2:
                step_old, t = newton - t, newton
            else:
                step_old, t = hi - lo, _split(lo, hi)
    v, ys, probs, residual = best
    eps = mpmath.mpf(2) ** (-mpmath.mp.prec + 4)
    errors = []
    for i, (x, yy, q) in enumerate(zip(a, ys, probs)):
        if i == k:
            errors.append(eps * q)
            continue
        delta = eps * (abs(x) + abs(ys[k]))
        errors.append(comp.link_from_clip(yy + delta) - comp.link_from_clip(yy - delta) + eps * q)
    t = d[k] - clip - ys[k]
    return _Solution(k, v, t, probs, ys, abs(residual), errors)


def _reference_solve(comp: Compiled, d: list, tol: mpmath.mpf) -> _Solution:
    """:func:`_relative_solve`, started from the derivation's threshold rule where it has one.

    While the error bound exceeds ``tol`` the solve is referred to another entry:
    the one nearest the clip (smallest ``|y_i|``: its rounding and the resolution of
    ``v`` are then at the scale of every ``y_i``), else the one with the largest
    rounding bound.
    """
    start = None
    if comp.dv.threshold.kind != "root":
        t = comp.tau(d)
        yk = -t - (comp.clip() if comp.sparse else 0)
        start = comp.link_from_clip(yk) if (yk > 0 or not comp.sparse) else yk
    # Newton converges in a few steps where the reference is well chosen; a first solve
    # that stalls (an entry past a kink of infinite slope) hands over to a better reference.
    sol = _relative_solve(comp, d, tol, start=start, budget=_FIRST_BUDGET)
    tried = {sol.k}
    for _ in range(16):
        if sol.error <= tol:
            break
        fresh = []
        if comp.sparse:
            nearest = min(range(len(d)), key=lambda i: abs(sol.ys[i]))
            roughest = max(range(len(d)), key=lambda i: sol.errors[i])
            fresh = [i for i in (nearest, roughest) if i not in tried]
        if not fresh:
            if sol.k == next(iter(tried)) and len(tried) == 1:
                sol = _relative_solve(comp, d, tol, k=sol.k, start=sol.v)  # the first solve, unlimited
            break
        k = fresh[0]
        tried.add(k)
        yk = sol.ys[k]
        sol = _relative_solve(comp, d, tol, k=k, start=comp.link_from_clip(yk) if yk > 0 else yk)
    return sol


def _solve_shifted(comp: Compiled, values, finite, digits: int):
    # p*(s + c) = p*(s) and tau(s + c) = tau(s) + c: solving for s - max(s) (exact) keeps the
    # bracket at the scale of omega' however large the scores are.  The working precision
    # is raised until the a-posteriori bound on max_i |p_i - p*_i| (see _relative_solve)
    # is below 10**-(digits + 5).
    top = max(finite)
    shifted = [mpmath.fsub(v, top, exact=True) for v in finite]
    target = mpmath.mpf(10) ** -(digits + 5)
    for extra in (0, 40, 120, 360, 1080):
        with mpmath.workdps(mpmath.mp.dps + extra):
            sol = _reference_solve(comp, shifted, target)
            if sol.error <= target:
                break
    else:
        raise DerivationError(
            f"the reference evaluation of {comp.dv.name} could not resolve p to {digits} digits "
            f"(error bound {mpmath.nstr(sol.error, 3)} at {mpmath.mp.dps + extra} digits)"
        )
    probs = iter(sol.probs)
    out = [mpmath.mpf(0) if v == -mpmath.inf else +next(probs) for v in values]
    return comp, values, sol.t + top, out


def evaluate(dv, scores: Any, digits: int = 50, **params: Any) -> list[mpmath.mpf]:
    """``p*(s)`` for one score vector, accurate to about ``digits`` significant digits.

    The values are mpmath ``mpf`` numbers that keep the working precision's digits, but an ``mpf`` prints at
    mpmath's global precision (``mpmath.mp.dps``, 15 digits by default): ``mpmath.nstr(v, digits)`` shows them
    in full.

    Parameters
    ----------
    dv:
        The derivation.
    scores:
        1-D scores; ``-inf`` entries are masked (probability 0).
    digits:
        Significant digits (computed with 20 guard digits).
    **params:
        Values of the regularizer's parameters, e.g. ``alpha=1.3`` (floats are
        taken at their exact binary value).
    """
    with mpmath.workdps(digits + GUARD_DIGITS):
        return _solve(dv, scores, digits, params)[3]


def threshold(dv, scores: Any, digits: int = 50, **params: Any) -> mpmath.mpf | None:
    """The threshold ``tau(s)`` (``None`` when every score is ``-inf``)."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        return _solve(dv, scores, digits, params)[2]


def conjugate(dv, scores: Any, digits: int = 50, **params: Any) -> mpmath.mpf:
    """``Omega*(s) = <p*, s> - Omega(p*)`` over the finite scores."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        comp, values, _, probs = _solve(dv, scores, digits, params)
        return _conjugate_value(comp, values, probs)


def _conjugate_value(comp: Compiled, values, probs) -> mpmath.mpf:
    total = mpmath.mpf(0)
    for v, q in zip(values, probs):
        if v == -mpmath.inf:
            continue
        total += (q * v - comp.omega(q)) if q > 0 else -comp.omega_zero()
    return total


def loss(dv, scores: Any, target: Any, digits: int = 50, **params: Any) -> mpmath.mpf:
    """Fenchel-Young loss ``Omega*(s) + Omega(y) - <s, y>`` (``target`` on the simplex)."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        comp, values, _, probs = _solve(dv, scores, digits, params)
        ys = to_mp_vector(target)
        if len(ys) != len(values):
            raise ValueError(f"target has length {len(ys)}, scores {len(values)}")
        if any(t < 0 for t in ys) or abs(mpmath.fsum(ys) - 1) > target_slack(target, ys, 1, digits):
            raise ValueError(f"target must lie on the simplex (non-negative, summing to 1), got sum "
                             f"{mpmath.nstr(mpmath.fsum(ys), 17)}")
        return fenchel_young(comp, values, probs, ys)


def target_slack(target: Any, ys, total, digits: int) -> mpmath.mpf:
    """How far a target's sum may be from its ``total`` (and an entry above its bound): the target's own rounding.
    Floats are the roundings of the values meant, each within ``eps/2`` of its magnitude, and a computed target
    (normalized, subtracted) carries the rounding of its computation: ``n eps max(sum |y|, total)``, with ``eps``
    the format's (a floating array's dtype's, else float64's where an entry is a Python float); exact entries
    (mpmath numbers, strings, SymPy numbers) ``10**-digits`` of the total."""
    values = target.tolist() if hasattr(target, "tolist") else list(target)
    kind = getattr(getattr(target, "dtype", None), "kind", None)
    if kind == "f":
        eps = mpmath.mpf(float(np.finfo(target.dtype).eps))
    elif any(isinstance(v, float) for v in values):
        eps = mpmath.mpf(2) ** -52
    else:
        return mpmath.mpf(10) ** -digits * abs(total)
    scale = max(mpmath.fsum(abs(t) for t in ys), abs(mpmath.mpf(total)))
    return max(len(ys) * eps * scale, mpmath.mpf(10) ** -digits * abs(total))


def fenchel_young(comp: Compiled, values, probs, ys) -> mpmath.mpf:
    """``<p, s> - Omega(p) + Omega(y) - <s, y>`` over the finite scores, ``+inf`` where ``y`` puts mass on a masked
    one (the loss of :func:`loss` and of :func:`derive.box.box_loss`, ``p`` the solution on each's set)."""
    total = _conjugate_value(comp, values, probs)
    for v, t in zip(values, ys):
        if t > 0 and v == -mpmath.inf:
            return mpmath.inf
        if v != -mpmath.inf:
            total += (comp.omega(t) if t > 0 else comp.omega_zero()) - v * t
    return total


def jacobian(dv, scores: Any, digits: int = 50, **params: Any) -> list[list[mpmath.mpf]]:
    """``J = diag(w) - w w^T / sum(w)`` with ``w_i = w(p_i)`` on the support, 0 off it."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        comp, values, _, probs = _solve(dv, scores, digits, params)
        w = [comp.weight(q) if q > 0 else mpmath.mpf(0) for q in probs]
        total = mpmath.fsum(w)
        n = len(w)
        if total == 0:
            return [[mpmath.mpf(0)] * n for _ in range(n)]
        return [[(w[a] if a == b else 0) - w[a] * w[b] / total for b in range(n)] for a in range(n)]


def kkt_residual(dv, scores: Any, probs: Sequence, digits: int = 50, **params: Any) -> mpmath.mpf:
    """Largest violation of the KKT conditions by ``probs`` for ``scores``.

    Uses only ``omega'`` and ``omega'(0+)``, not the threshold rule or the link:
    ``|sum p - 1|``, ``max(-p_i)``, the spread of ``tau_i = s_i - omega'(p_i)``
    over the support, and ``s_i - tau - omega'(0+)`` (must be ``<= 0``) off it.
    Masked (``-inf``) scores must have ``p_i = 0``.  Computed at ``digits``
    (plus guard) significant digits.
    """
    with mpmath.workdps(digits + GUARD_DIGITS):
        return _kkt_residual(compiled(dv, params), scores, probs)


def _kkt_residual(comp: Compiled, scores: Any, probs: Sequence) -> mpmath.mpf:
    values = to_mp_vector(scores)
    probs = [mpmath.mpf(q) for q in probs]
    if len(probs) != len(values):
        raise ValueError(f"probs has length {len(probs)}, scores {len(values)}")
    residual = max(abs(q) for q, v in zip(probs, values) if v == -mpmath.inf) if -mpmath.inf in values else mpmath.mpf(0)
    if all(v == -mpmath.inf for v in values):
        return residual
    residual = max([residual, abs(mpmath.fsum(probs) - 1)] + [max(0, -q) for q in probs])
    taus = [v - comp.d1(q) for v, q in zip(values, probs) if q > 0]
    if not taus:
        return max(residual, mpmath.mpf(1))
    center = mpmath.fsum(taus) / len(taus)
    residual = max([residual] + [abs(t - center) for t in taus])
    if comp.sparse:
        clip = comp.clip()
        for v, q in zip(values, probs):
            if q == 0 and v != -mpmath.inf:
                residual = max(residual, v - center - clip)
    return residual
