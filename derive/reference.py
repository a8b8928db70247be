"""High-precision evaluation of a :class:`~derive.argmax.Derivation`: the ground truth.

Every numeric result in regattn is compared with these functions.  They work
with mpmath at ``digits`` significant digits (plus guard digits) directly from
the KKT conditions the derivation recorded:

* the threshold ``tau`` by the derivation's rule: the closed form
  (``tau = solution(sum_i term(s_i))``), the sort-based support rule (largest
  ``k`` with ``s_(k) - tau_k > omega'(0+)``), or a Newton iteration with a
  bisection safeguard on the bracket ``[max(s) - omega'(1), max(s) - omega'(1/d)]``
  using the exact derivative ``d/dtau sum_i g(s_i - tau) = -sum_i w(p_i)``;
* the link by its closed form, or where the derivation says ``"newton"`` by a
  safeguarded Newton solve of ``omega'(p) = z`` in ``log p``.

Scores equal to ``-inf`` are masked: they get probability exactly 0 and the
rest is solved as if they were absent; an all ``-inf`` vector gives zeros.
The threshold is solved for the scores shifted by their maximum (``p*`` does
not change, ``tau`` moves by the shift), so scores as large as ``1e300`` keep
the bracket at the scale of ``omega'``.  Where the arithmetic still fails
(a division by zero or an overflow at the working precision) the functions
raise :class:`~derive.errors.DerivationError` with a one-line message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mpmath
import sympy as sp

from .argmax import S, S1, S2, Derivation, k, score
from .errors import DerivationError
from .regularizers import p, to_mpf, z

__all__ = [
    "evaluate",
    "threshold",
    "conjugate",
    "loss",
    "jacobian",
    "kkt_residual",
    "to_mp_vector",
]

_GUARD = 20


def to_mp_vector(scores: Any) -> list[mpmath.mpf]:
    """Scores (a sequence or 1-D array of numbers, strings or SymPy numbers) as mpmath numbers.

    Floats convert exactly.  ``-inf`` is kept (masked); ``nan`` and ``+inf``
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
        else:
            v = mpmath.mpf(value)
        if mpmath.isnan(v) or v == mpmath.inf:
            raise ValueError(f"score {idx} is {value!r}; the reference accepts finite numbers and -inf")
        out.append(v)
    if not out:
        raise ValueError("scores must hold at least one entry")
    return out


class _Compiled:
    """The derivation's expressions as mpmath functions, for fixed parameter values."""

    def __init__(self, dv: Derivation, params: dict[str, Any]):
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
        self.omega_zero = fn(dv.omega_zero)
        self.d1 = fn(dv.omega_prime, p)
        self.d2 = fn(dv.omega_second, p)
        self.weight = fn(dv.weight, p)
        inv = dv.inversion
        self.link = fn(inv.closed_form, z) if inv.closed_form is not None and inv.method == "closed" else None
        if inv.method != "closed" and inv.special == ("LambertW",):
            self.link = fn(inv.closed_form, z)  # mpmath's lambertw is accurate
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
        if self.link is not None:
            value = self.link(zz)
            if isinstance(value, mpmath.mpc):
                value = value.real
            return value
        return self._newton_link(zz)

    def _newton_link(self, zz: mpmath.mpf) -> mpmath.mpf:
        # omega'(e^u) = z, increasing in u; bracket u in [lo, hi]
        hi = mpmath.mpf(0)
        while self.d1(mpmath.exp(hi)) < zz:
            hi += 1
            if hi > 60:
                raise DerivationError(f"omega'(p) = z = {zz} has no root for p <= e^60")
        lo = hi - 1
        while self.d1(mpmath.exp(lo)) > zz:
            lo = 2 * lo - 1
            if lo < -(10**7):
                raise DerivationError(f"omega'(p) = z = {zz} has no root for p >= e^{lo}")
        q = mpmath.exp(
            _safeguarded_newton(
                lambda u: self.d1(mpmath.exp(u)) - zz,
                lambda u: self.d2(mpmath.exp(u)) * mpmath.exp(u),
                lo,
                hi,
                increasing=True,
            )
        )
        # u = log p carries an absolute error of eps |u|; one Newton step in p makes p relatively exact
        nxt = q - (self.d1(q) - zz) / self.d2(q)
        return nxt if nxt > 0 else q

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
        n = len(finite)
        top = max(finite)
        lo = top - self.d1(mpmath.mpf(1))
        hi = top - self.d1(mpmath.mpf(1) / n)

        def f(t):
            return mpmath.fsum(self.g(v - t) for v in finite) - 1

        def fprime(t):
            return -mpmath.fsum(self.weight(q) for q in (self.g(v - t) for v in finite) if q > 0)

        return _safeguarded_newton(f, fprime, lo, hi, increasing=False)


def _safeguarded_newton(f, fprime, lo, hi, *, increasing: bool) -> mpmath.mpf:
    """Root of a monotone ``f`` on ``[lo, hi]``: Newton kept inside a shrinking bracket.

    A Newton step is taken only when it stays strictly inside the bracket and
    at least halves the step before last (as in Numerical Recipes' rtsafe);
    otherwise the bracket is bisected.  So the iteration converges
    quadratically on smooth pieces and at least linearly across kinks and
    infinite slopes (``g'(0+) = oo`` for ``omega = p**3``).  It stops when the
    bracket or a Newton step with a residual at rounding level is below the
    working precision.
    """
    eps = mpmath.mpf(2) ** (-mpmath.mp.prec + 8)
    sign = 1 if increasing else -1
    f_lo, f_hi = sign * f(lo), sign * f(hi)
    if f_lo >= -16 * eps:  # the root is at lo (to working precision)
        return lo
    if f_hi <= 16 * eps:
        return hi
    t = (lo + hi) / 2
    step_old = step = hi - lo
    for _ in range(8 * mpmath.mp.prec):
        val = sign * f(t)
        if val == 0:
            return t
        if val > 0:
            hi = t
        else:
            lo = t
        tol = eps * max(1, abs(t))
        if hi - lo <= tol:
            return (lo + hi) / 2
        deriv = sign * fprime(t)
        newton = t - val / deriv if deriv > 0 else None
        if newton is not None and abs(newton - t) <= tol and abs(val) <= 16 * eps:
            return newton  # converged: the step is below the resolution of t
        if newton is not None and lo < newton < hi and abs(newton - t) < abs(step_old) / 2:
            step_old, step = step, newton - t
            t = newton
        else:
            step_old, step = step, (hi - lo) / 2
            t = (lo + hi) / 2
    raise DerivationError("the safeguarded Newton iteration did not converge")  # pragma: no cover


def _compiled(dv: Derivation, params: dict[str, Any]) -> _Compiled:
    key = tuple(sorted((n, repr(v)) for n, v in params.items()))
    cache = dv._cache.setdefault("reference", {})
    if key not in cache:
        cache[key] = _Compiled(dv, params)
    return cache[key]


def _solve(dv: Derivation, scores: Any, digits: int, params: dict):
    if not isinstance(digits, int) or digits < 5:
        raise ValueError(f"digits must be an int >= 5, got {digits!r}")
    comp = _compiled(dv, params)
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


def _solve_shifted(comp: _Compiled, values, finite, digits: int):
    # p*(s + c) = p*(s) and tau(s + c) = tau(s) + c: solving for s - max(s) keeps the bracket
    # [-omega'(1), -omega'(1/d)] at the scale of omega' however large the scores are (with
    # max(s) = 1e300 the unshifted bracket ends round to the same number)
    top = max(finite)
    shifted = [v - top for v in finite]
    # A score right at the support boundary of a map whose link has an infinite slope
    # there (omega = p**3: g(z) = sqrt(z/3)) makes sum_i p_i - 1 ~ sqrt(error of tau): the
    # working precision is raised until the simplex holds to the digits asked for.
    target = mpmath.mpf(10) ** -(digits + 5)
    for extra in (0, 40, 120, 360):
        with mpmath.workdps(mpmath.mp.dps + extra):
            t = comp.tau(shifted)
            probs = [comp.g((v - top) - t) for v in values]
            if abs(mpmath.fsum(probs) - 1) <= target:
                break
    return comp, values, t + top, probs


def evaluate(dv: Derivation, scores: Any, digits: int = 50, **params: Any) -> list[mpmath.mpf]:
    """``p*(s)`` for one score vector, accurate to about ``digits`` significant digits.

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
    with mpmath.workdps(digits + _GUARD):
        return _solve(dv, scores, digits, params)[3]


def threshold(dv: Derivation, scores: Any, digits: int = 50, **params: Any) -> mpmath.mpf | None:
    """The threshold ``tau(s)`` (``None`` when every score is ``-inf``)."""
    with mpmath.workdps(digits + _GUARD):
        return _solve(dv, scores, digits, params)[2]


def conjugate(dv: Derivation, scores: Any, digits: int = 50, **params: Any) -> mpmath.mpf:
    """``Omega*(s) = <p*, s> - Omega(p*)`` over the finite scores."""
    with mpmath.workdps(digits + _GUARD):
        comp, values, _, probs = _solve(dv, scores, digits, params)
        return _conjugate_value(comp, values, probs)


def _conjugate_value(comp: _Compiled, values, probs) -> mpmath.mpf:
    total = mpmath.mpf(0)
    for v, q in zip(values, probs):
        if v == -mpmath.inf:
            continue
        total += (q * v - comp.omega(q)) if q > 0 else -comp.omega_zero()
    return total


def loss(dv: Derivation, scores: Any, target: Any, digits: int = 50, **params: Any) -> mpmath.mpf:
    """Fenchel-Young loss ``Omega*(s) + Omega(y) - <s, y>`` (``target`` on the simplex)."""
    with mpmath.workdps(digits + _GUARD):
        comp, values, _, probs = _solve(dv, scores, digits, params)
        ys = to_mp_vector(target)
        if len(ys) != len(values):
            raise ValueError(f"target has length {len(ys)}, scores {len(values)}")
        if any(t < 0 for t in ys) or abs(mpmath.fsum(ys) - 1) > mpmath.mpf(10) ** (-digits):
            raise ValueError("target must lie on the simplex (non-negative, summing to 1)")
        total = _conjugate_value(comp, values, probs)
        for v, t in zip(values, ys):
            if t > 0 and v == -mpmath.inf:
                return mpmath.inf
            if v != -mpmath.inf:
                total += (comp.omega(t) if t > 0 else comp.omega_zero()) - v * t
        return total


def jacobian(dv: Derivation, scores: Any, digits: int = 50, **params: Any) -> list[list[mpmath.mpf]]:
    """``J = diag(w) - w w^T / sum(w)`` with ``w_i = w(p_i)`` on the support, 0 off it."""
    with mpmath.workdps(digits + _GUARD):
        comp, values, _, probs = _solve(dv, scores, digits, params)
        w = [comp.weight(q) if q > 0 else mpmath.mpf(0) for q in probs]
        total = mpmath.fsum(w)
        n = len(w)
        if total == 0:
            return [[mpmath.mpf(0)] * n for _ in range(n)]
        return [[(w[a] if a == b else 0) - w[a] * w[b] / total for b in range(n)] for a in range(n)]


def kkt_residual(dv: Derivation, scores: Any, probs: Sequence, digits: int = 50, **params: Any) -> mpmath.mpf:
    """Largest violation of the KKT conditions by ``probs`` for ``scores``.

    Uses only ``omega'`` and ``omega'(0+)``, not the threshold rule or the link:
    ``|sum p - 1|``, ``max(-p_i)``, the spread of ``tau_i = s_i - omega'(p_i)``
    over the support, and ``s_i - tau - omega'(0+)`` (must be ``<= 0``) off it.
    Masked (``-inf``) scores must have ``p_i = 0``.  Computed at ``digits``
    (plus guard) significant digits.
    """
    with mpmath.workdps(digits + _GUARD):
        return _kkt_residual(_compiled(dv, params), scores, probs)


def _kkt_residual(comp: _Compiled, scores: Any, probs: Sequence) -> mpmath.mpf:
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
