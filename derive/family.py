"""A regularizer whose map changes kind inside a parameter's domain: its cases, derived one by one.

Tsallis' ``omega(p) = (p**alpha - p) / (alpha (alpha - 1))`` on ``alpha > 0`` is
three maps: dense with heavy tails for ``alpha < 1`` (``omega'(0+) = -oo``),
softmax at ``alpha = 1`` (the limit ``p log p``), sparse for ``alpha > 1``
(``omega'(0+) = -1 / (alpha (alpha - 1))``, finite).  One derivation cannot cover
them (the clipping rule and the threshold differ, and the formulas are ``0/0`` at
the point), so :func:`derive_family` finds where the formulas change
(:func:`split_points`), derives each open interval and each point between them
with :func:`derive.argmax.derive_map`, and at each point the limits of
``d omega'/dq`` and ``d omega/dq``: the first-order terms that keep the
gradient in ``q`` continuous through the point.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from ._timelimit import TimeLimit
from .errors import DerivationError

from .regularizers import Parameter, Regularizer, describe, p, singular_points

__all__ = ["Case", "Family", "split_points", "derive_family"]

_LIMIT_SECONDS = 20


def split_points(omega: sp.Expr, q: Parameter) -> tuple[sp.Expr, ...]:
    """The points strictly inside ``q``'s domain where ``omega``'s map may change kind, in increasing order.

    They are the real zeros of an exponent of ``p`` that depends on ``q`` (in ``omega'``: ``p**(alpha - 1)``
    goes from infinite to finite at 0 as the exponent changes sign, so the map goes from dense to sparse), and of
    a factor of ``omega``'s denominator in ``q`` alone (where the formula is ``0/0``).
    """
    sym = q.symbol
    candidates: set[sp.Expr] = set()
    d1 = sp.diff(omega, p)
    for expr in (omega, d1):
        for node in sp.preorder_traversal(expr):
            if isinstance(node, sp.Pow) and node.base.has(p) and node.exp.has(sym) and not node.exp.has(p):
                candidates.update(_real_roots(node.exp, sym))
    candidates.update(singular_points(omega, sym))
    inside = [c for c in candidates if bool(q.lower < c) and bool(c < q.upper)]
    return tuple(sorted(inside, key=lambda c: float(c)))


def _real_roots(expr: sp.Expr, sym: sp.Symbol) -> list[sp.Expr]:
    try:
        roots = sp.solve(sp.Eq(expr, 0), sym)
    except (NotImplementedError, ValueError, TypeError):
        return []
    return [r for r in roots if r.is_real and r.is_number]


@dataclass(frozen=True)
class Case:
    """One case of a :class:`Family`: the open interval ``(lower, upper)`` of the parameter, or the point
    ``lower == upper``, with the regularizer on it (at a point: the limit, without that parameter)."""

    lower: sp.Expr
    upper: sp.Expr
    regularizer: Regularizer

    @property
    def is_point(self) -> bool:
        return self.lower == self.upper


@dataclass(frozen=True)
class Family:
    """A regularizer split by :func:`derive_family`: ``cases`` in increasing order of ``parameter``, and at each point
    case's index the limits ``(d omega'/dq, d omega/dq)`` of the open cases beside it (functions of ``p``)."""

    regularizer: Regularizer
    parameter: Parameter
    cases: tuple[Case, ...]
    derivatives: dict

    def describe(self) -> str:
        """The cases as text: ``(0, 1), alpha = 1, (1, oo)``."""
        q = self.parameter.symbol
        return ", ".join(f"{q} = {c.lower}" if c.is_point else f"({c.lower}, {c.upper})" for c in self.cases)


def _limit(expr: sp.Expr, sym: sp.Symbol, point: sp.Expr, side: str, what: str) -> sp.Expr:
    try:
        value = TimeLimit(_LIMIT_SECONDS, what).run(sp.limit, expr, sym, point, side)
    except DerivationError:
        raise
    except (NotImplementedError, ValueError, TypeError) as exc:
        raise DerivationError(f"cannot find {what}: SymPy's limit failed ({type(exc).__name__})") from None
    if value.has(sp.Limit, sp.AccumBounds) or value.has(sp.oo, -sp.oo, sp.zoo, sp.nan):
        raise DerivationError(f"cannot find {what}: SymPy returned {describe(value)}")
    return sp.simplify(value)


def _point_limit(expr: sp.Expr, sym: sp.Symbol, point: sp.Expr, what: str) -> sp.Expr:
    """The two-sided limit of ``expr`` at ``sym = point`` (both one-sided limits, which must agree)."""
    below = _limit(expr, sym, point, "-", f"{what} from below")
    above = _limit(expr, sym, point, "+", f"{what} from above")
    if sp.simplify(below - above) != 0:
        raise DerivationError(f"{what} differs from below ({describe(below)}) and above ({describe(above)}): the map "
                              f"is not continuous in {sym} there")
    return below


def split_parameter(reg: Regularizer) -> tuple[Parameter, tuple[sp.Expr, ...]] | None:
    """``(parameter, points)`` for the first parameter of ``reg`` with :func:`split_points` inside its domain,
    else ``None``."""
    for q in reg.parameters:
        points = split_points(reg.omega, q)
        if points:
            return q, points
    return None


def derive_family(reg: Regularizer) -> Family:
    """Split ``reg`` at the :func:`split_points` of its parameter into cases, each a regularizer
    :func:`derive.argmax.derive_map` can derive.

    Raises :class:`DerivationError` if no parameter has a point inside its domain (then ``reg`` is one map:
    use :func:`derive.derive_map`), or if ``omega`` or its derivatives in the parameter have no limit at a point.

    >>> import sympy as sp
    >>> from derive import tsallis
    >>> from derive.family import derive_family
    >>> fam = derive_family(tsallis(lower=0))
    >>> fam.describe()
    '(0, 1), alpha = 1, (1, oo)'
    >>> fam.cases[1].regularizer.omega
    p*log(p)
    """
    if not isinstance(reg, Regularizer):
        raise DerivationError(f"derive_family expects a Regularizer, got {type(reg).__name__}")
    found = split_parameter(reg)
    if found is None:
        raise DerivationError(f"omega(p) = {describe(reg.omega)} does not change kind inside its parameters' domains: "
                              "it is one map (derive_map)")
    q, points = found
    others = tuple(o for o in reg.parameters if o.symbol != q.symbol)
    ends = (q.lower, *points, q.upper)
    cases: list[Case] = []
    derivatives = {}
    d1 = sp.diff(reg.omega, p)
    for i, point in enumerate(points):
        lo = ends[i]
        cases.append(Case(lo, point, Regularizer(reg.omega, name=reg.name, parameters=(Parameter(q.symbol, lo, point), *others))))
        at = f"at {q.symbol} = {point}"
        omega_at = _point_limit(reg.omega, q.symbol, point, f"the limit of omega {at}")
        name = f"{reg.name}({q.symbol}={point})"
        cases.append(Case(point, point, Regularizer(omega_at, name=name, parameters=others)))
        derivatives[len(cases) - 1] = (
            _point_limit(sp.diff(d1, q.symbol), q.symbol, point, f"the limit of d omega'/d{q.symbol} {at}"),
            _point_limit(sp.diff(reg.omega, q.symbol), q.symbol, point, f"the limit of d omega/d{q.symbol} {at}"),
        )
    cases.append(Case(points[-1], q.upper, Regularizer(reg.omega, name=reg.name,
                                                       parameters=(Parameter(q.symbol, points[-1], q.upper), *others))))
    return Family(reg, q, tuple(cases), derivatives)


def stated_cases(reg: Regularizer) -> str | None:
    """Where ``reg``'s map changes kind inside a parameter's domain, a sentence naming the cases (for
    :func:`derive.derive_map`'s error), else ``None``."""
    found = split_parameter(reg)
    if found is None:
        return None
    q, points = found
    ends = (q.lower, *points, q.upper)
    parts = []
    for i, point in enumerate(points):
        parts += [f"({ends[i]}, {point})", f"{q.symbol} = {point}"]
    parts.append(f"({points[-1]}, {q.upper})")
    return (f"the map of omega(p) = {describe(reg.omega)} changes kind inside ({q.lower}, {q.upper}) at "
            f"{q.symbol} = {', '.join(map(str, points))}: its cases are {', '.join(parts)}; derive one case "
            "(a domain inside one of them), or all of them with derive.family.derive_family")
