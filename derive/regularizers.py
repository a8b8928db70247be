"""Separable regularizers ``Omega(p) = sum_i omega(p_i)`` on the simplex.

A :class:`Regularizer` holds the scalar function ``omega(p)`` as a SymPy
expression in the symbol :data:`p` (positive), optionally with named real
parameters such as Tsallis' ``alpha``.  Construction checks what the
derivation relies on and raises :class:`~derive.errors.DerivationError` naming
the condition that failed:

* the only free symbols are ``p`` and the declared parameters;
* only differentiable functions from a whitelist occur (no ``Abs``, ``sign``,
  ``Max``, ``Piecewise``, ...);
* ``omega`` is real and finite on ``(0, 1]``;
* ``omega''(p) > 0`` on ``(0, 1]`` (strict convexity with a finite Jacobian
  weight ``w = 1/omega''``): proved exactly for rational ``omega''``, proved by
  SymPy's assumptions where it can, otherwise checked at a dense set of points
  (and :attr:`Regularizer.convexity` says which).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import cached_property

import mpmath
import sympy as sp

from ._parse import FUNCTIONS, parse_expression
from .errors import DerivationError

__all__ = [
    "p",
    "z",
    "alpha",
    "Parameter",
    "Regularizer",
    "shannon",
    "gini",
    "tsallis",
]

#: The probability symbol: every regularizer is an expression in ``p``.
p = sp.Symbol("p", positive=True)
#: The link argument ``z = s - tau``.
z = sp.Symbol("z", real=True)
#: Tsallis' entropic index, the parameter of :func:`tsallis` when left symbolic.
alpha = sp.Symbol("alpha", positive=True)

_ALLOWED_FUNCTIONS = frozenset(FUNCTIONS.values()) | {
    sp.LambertW,
    sp.asin,
    sp.acos,
    sp.acosh,
    sp.atanh,
}
_NON_DIFFERENTIABLE = (
    sp.Abs,
    sp.sign,
    sp.Heaviside,
    sp.DiracDelta,
    sp.Max,
    sp.Min,
    sp.floor,
    sp.ceiling,
    sp.frac,
    sp.Mod,
    sp.Piecewise,
    sp.re,
    sp.im,
    sp.arg,
    sp.conjugate,
)
# sample points in (0, 1] used where convexity cannot be proved symbolically
_CONVEXITY_POINTS = tuple(
    sorted(
        {mpmath.mpf(10) ** (-k / 4) for k in range(0, 4 * 14 + 1)}
        | {mpmath.mpf(j) / 400 for j in range(1, 401)}
    )
)


@dataclass(frozen=True)
class Parameter:
    """A real parameter of a regularizer, on the open interval ``(lower, upper)``.

    The derivation keeps it symbolic; checks that need numbers (convexity,
    sparsity, branch selection) use :meth:`samples`, a few points inside the
    interval.
    """

    symbol: sp.Symbol
    lower: sp.Expr = sp.S.NegativeInfinity
    upper: sp.Expr = sp.S.Infinity
    _shift: sp.Dummy = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.symbol, sp.Symbol):
            raise DerivationError(f"a parameter must be a SymPy Symbol, got {self.symbol!r}")
        lower, upper = sp.sympify(self.lower), sp.sympify(self.upper)
        if not (lower < upper):
            raise DerivationError(
                f"parameter {self.symbol} has an empty domain ({lower}, {upper})"
            )
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "_shift", sp.Dummy(f"{self.symbol.name}_shift", positive=True))

    def samples(self) -> tuple[sp.Rational, ...]:
        """Points inside ``(lower, upper)`` used for numeric checks."""
        lo, hi = self.lower, self.upper
        if lo.is_finite and hi.is_finite:
            return tuple(lo + (hi - lo) * sp.Rational(k, 10) for k in (1, 3, 5, 7, 9))
        if lo.is_finite:
            return tuple(lo + sp.Rational(k) for k in (sp.Rational(1, 4), sp.Rational(1, 2), 1, 2, 7))
        if hi.is_finite:
            return tuple(hi - sp.Rational(k) for k in (sp.Rational(1, 4), sp.Rational(1, 2), 1, 2, 7))
        return (sp.Integer(-2), sp.Integer(-1), sp.Integer(0), sp.Integer(1), sp.Integer(2))

    def assume(self) -> tuple[sp.Expr, sp.Symbol | None]:
        """An expression with SymPy assumptions that ranges over the domain.

        Returns ``(expr, dummy)`` with ``expr = lower + dummy`` (``dummy``
        positive) when the lower end is finite, ``upper - dummy`` when only the
        upper end is, and ``(symbol, None)`` otherwise; limits taken in ``dummy``
        then respect the domain.
        """
        if self.lower.is_finite:
            return self.lower + self._shift, self._shift
        if self.upper.is_finite:
            return self.upper - self._shift, self._shift
        return self.symbol, None


def _check_functions(expr: sp.Expr, what: str) -> None:
    for bad in _NON_DIFFERENTIABLE:
        if expr.has(bad):
            raise DerivationError(
                f"{what} contains {bad.__name__}, which is not differentiable; "
                "a regularizer must be twice differentiable on (0, 1]"
            )
    for node in sp.preorder_traversal(expr):
        if isinstance(node, sp.Function) and type(node) not in _ALLOWED_FUNCTIONS:
            raise DerivationError(
                f"{what} contains the function {type(node).__name__}, which is not supported; "
                f"allowed: {', '.join(sorted(f.__name__ for f in _ALLOWED_FUNCTIONS))}"
            )
        if isinstance(node, (sp.Derivative, sp.Integral, sp.Sum, sp.Product, sp.Subs)):
            raise DerivationError(f"{what} contains an unevaluated {type(node).__name__}")


def to_mpf(value: object) -> mpmath.mpf:
    """A SymPy number (exact rational, float, ...) as an mpmath number at the current precision."""
    value = sp.sympify(value)
    if value.is_Rational:
        return mpmath.mpf(int(value.p)) / int(value.q)
    return mpmath.mpf(value.evalf(mpmath.mp.dps + 5))


def _real_finite(value: object) -> bool:
    if isinstance(value, mpmath.mpc):
        if abs(value.imag) > mpmath.mpf(10) ** (-20) * max(1, abs(value.real)):
            return False
        value = value.real
    return isinstance(value, mpmath.mpf) and mpmath.isfinite(value)


@dataclass(frozen=True)
class Regularizer:
    """A separable, strictly convex regularizer ``Omega(p) = sum_i omega(p_i)``.

    Parameters
    ----------
    omega:
        ``omega(p)`` as a SymPy expression in :data:`derive.p`.  A plain
        ``Symbol("p")`` without assumptions is replaced by :data:`derive.p`.
    name:
        A label used in printed derivations.
    parameters:
        Real parameters that stay symbolic, as :class:`Parameter` objects or
        bare symbols (then ranging over the whole real line).

    Raises
    ------
    DerivationError
        If ``omega`` has a free symbol other than ``p`` and the parameters, a
        function that is not differentiable or not supported, is not real and
        finite on ``(0, 1]``, or has ``omega''(p) <= 0`` somewhere on ``(0, 1]``.

    Examples
    --------
    >>> from derive import Regularizer, p
    >>> Regularizer(p**3, name="cubic").omega
    p**3
    >>> Regularizer.from_string("p*log(p) + p**2/2").omega
    p**2/2 + p*log(p)
    """

    omega: sp.Expr
    name: str = "custom"
    parameters: tuple[Parameter, ...] = ()
    convexity: str = field(default="", init=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.omega, str):
            raise DerivationError(
                "Regularizer() takes a SymPy expression; use Regularizer.from_string() for text"
            )
        params = tuple(
            q if isinstance(q, Parameter) else Parameter(q) for q in (self.parameters or ())
        )
        object.__setattr__(self, "parameters", params)
        try:
            omega = sp.sympify(self.omega, strict=True)
        except (sp.SympifyError, TypeError) as exc:
            raise DerivationError(f"omega must be a SymPy expression, got {self.omega!r}") from exc
        plain = sp.Symbol("p")
        if plain in omega.free_symbols:
            omega = omega.subs(plain, p)
        object.__setattr__(self, "omega", omega)
        if not isinstance(self.name, str) or not self.name:
            raise DerivationError(f"name must be a non-empty str, got {self.name!r}")

        allowed = {p} | {q.symbol for q in params}
        extra = omega.free_symbols - allowed
        if extra:
            names = ", ".join(sorted(str(s) for s in extra))
            raise DerivationError(
                f"omega(p) = {omega} has free symbol(s) {names} other than p"
                + (" and its parameters" if params else "")
                + "; declare parameters with Regularizer(..., parameters=[...])"
            )
        if p not in omega.free_symbols:
            raise DerivationError(f"omega = {omega} does not depend on p")
        _check_functions(omega, f"omega(p) = {omega}")
        _check_functions(self.second_derivative, f"omega''(p) = {self.second_derivative}")
        object.__setattr__(self, "convexity", self._check_convexity())

    # ------------------------------------------------------------------ text
    @classmethod
    def from_string(
        cls, text: str, name: str = "custom", parameters: tuple = ()
    ) -> "Regularizer":
        """Build a regularizer from text such as ``"p*log(p) + p**2/2"``.

        The text is parsed into a syntax tree and converted node by node
        (see :mod:`derive._parse`); it is never evaluated as Python.  Accepted:
        numbers, ``p``, parameter names, ``pi``, ``E``, ``+ - * / ** ^`` and
        the functions in :data:`derive._parse.FUNCTIONS`.
        """
        params = tuple(q if isinstance(q, Parameter) else Parameter(q) for q in parameters)
        symbols = {"p": p} | {q.symbol.name: q.symbol for q in params}
        return cls(parse_expression(text, symbols), name=name, parameters=params)

    @property
    def text(self) -> str:
        """``omega(p)`` as text that :meth:`from_string` parses back."""
        return sp.sstr(self.omega)

    # ------------------------------------------------------------ derivatives
    @cached_property
    def first_derivative(self) -> sp.Expr:
        """``omega'(p)``."""
        return sp.simplify(sp.diff(self.omega, p))

    @cached_property
    def second_derivative(self) -> sp.Expr:
        """``omega''(p)``."""
        return sp.simplify(sp.diff(self.omega, p, 2))

    def parameter_samples(self) -> list[dict[sp.Symbol, sp.Rational]]:
        """Parameter assignments used for numeric checks (one empty dict if none)."""
        grids = [q.samples() for q in self.parameters]
        return [dict(zip((q.symbol for q in self.parameters), vals)) for vals in itertools.product(*grids)]

    def assumed(self, expr: sp.Expr) -> tuple[sp.Expr, dict]:
        """``expr`` with parameters replaced by expressions carrying their domain.

        Returns the substituted expression and the map that undoes it.
        """
        forward, back = {}, {}
        for q in self.parameters:
            value, dummy = q.assume()
            if dummy is not None:
                forward[q.symbol] = value
                back[dummy] = q.symbol - q.lower if q.lower.is_finite else q.upper - q.symbol
        return expr.subs(forward), back

    # -------------------------------------------------------------- checks
    def _check_convexity(self) -> str:
        d2 = self.second_derivative
        proved = self._prove_convexity(d2)
        if proved:
            return proved
        fn0 = sp.lambdify([p] + [q.symbol for q in self.parameters], self.omega, "mpmath")
        fn2 = sp.lambdify([p] + [q.symbol for q in self.parameters], d2, "mpmath")
        with mpmath.workdps(30):
            for values in self.parameter_samples():
                args = [to_mpf(values[q.symbol]) for q in self.parameters]
                where = "".join(f", {q.symbol} = {values[q.symbol]}" for q in self.parameters)
                for x in _CONVEXITY_POINTS:
                    try:
                        v0, v2 = fn0(x, *args), fn2(x, *args)
                    except (ZeroDivisionError, ValueError, OverflowError) as exc:
                        raise DerivationError(
                            f"omega(p) = {self.omega} cannot be evaluated at p = {mpmath.nstr(x, 6)}{where}: {exc}"
                        ) from None
                    if not _real_finite(v0):
                        raise DerivationError(
                            f"omega(p) = {self.omega} is not real and finite at p = {mpmath.nstr(x, 6)}{where} "
                            f"(value {mpmath.nstr(v0, 6)}); it must be on (0, 1]"
                        )
                    if not _real_finite(v2) or mpmath.re(v2) <= 0:
                        raise DerivationError(
                            f"omega is not strictly convex on (0, 1]: omega''(p) = {d2} = "
                            f"{mpmath.nstr(v2, 6)} at p = {mpmath.nstr(x, 6)}{where}"
                        )
        n = len(_CONVEXITY_POINTS) * len(self.parameter_samples())
        return f"omega''(p) > 0 checked numerically at {n} points of (0, 1]"

    def _prove_convexity(self, d2: sp.Expr) -> str:
        assumed, _ = self.assumed(d2)
        # p in (0, 1]: write p = 1/(1 + u) with u >= 0 so that SymPy's assumptions see the domain
        u = sp.Dummy("u", nonnegative=True)
        on_domain = sp.simplify(assumed.subs(p, 1 / (1 + u)))
        if on_domain.is_positive:
            return "omega''(p) > 0 on (0, 1], proved by SymPy's assumptions"
        if not self.parameters and d2.is_rational_function(p):
            num, den = sp.fraction(sp.together(d2))
            cuts = sorted(
                {sp.Rational(0), sp.Rational(1)}
                | {r for poly in (num, den) for r in sp.Poly(poly, p).real_roots() if 0 < r < 1}
            , key=float)
            for r in cuts[1:]:
                if num.subs(p, r) == 0 or den.subs(p, r) == 0:
                    raise DerivationError(
                        f"omega is not strictly convex on (0, 1]: omega''(p) = {d2} vanishes or is "
                        f"undefined at p = {r}"
                    )
            for a, b in zip(cuts, cuts[1:]):
                mid = (a + b) / 2
                if not d2.subs(p, mid) > 0:
                    raise DerivationError(
                        f"omega is not strictly convex on (0, 1]: omega''(p) = {d2} = "
                        f"{d2.subs(p, mid)} at p = {mid}"
                    )
            return "omega''(p) > 0 on (0, 1], proved from the real roots of the rational omega''"
        return ""


def shannon() -> Regularizer:
    """Shannon negentropy ``omega(p) = p log p``; its map is softmax."""
    return Regularizer(p * sp.log(p), name="shannon")


def gini() -> Regularizer:
    """Squared L2 ``omega(p) = p**2 / 2`` (Gini entropy up to sign and constant); sparsemax."""
    return Regularizer(p**2 / 2, name="gini")


def tsallis(alpha_value: object = None, *, lower: object = 1, upper: object = sp.oo) -> Regularizer:
    """Tsallis alpha-negentropy ``omega(p) = (p**alpha - p) / (alpha (alpha - 1))``.

    Its map is alpha-entmax: ``alpha = 2`` is sparsemax, ``alpha -> 1`` softmax.

    Parameters
    ----------
    alpha_value:
        A number ``> 0`` other than 1 (floats are read as the decimal they
        print as, so ``1.5`` is ``3/2``), or ``None`` / a SymPy symbol to keep
        alpha symbolic on the domain ``(lower, upper)``, by default ``(1, oo)``,
        the sparse entmax family.
    """
    if alpha_value is None or isinstance(alpha_value, sp.Symbol):
        sym = alpha if alpha_value is None else alpha_value
        a = Parameter(sym, lower, upper)
        if a.lower < 0 or (a.lower < 1 < a.upper):
            raise DerivationError(
                f"tsallis: the domain of {sym} must lie inside (0, 1) or (1, oo), got ({a.lower}, {a.upper})"
            )
        omega = (p**sym - p) / (sym * (sym - 1))
        return Regularizer(omega, name="tsallis", parameters=(a,))
    if isinstance(alpha_value, bool):
        raise DerivationError(f"tsallis: alpha must be a number, got {alpha_value!r}")
    if isinstance(alpha_value, float):
        a_value = sp.Rational(repr(alpha_value))
    else:
        try:
            a_value = sp.Rational(alpha_value) if isinstance(alpha_value, (int, str)) else sp.sympify(alpha_value, strict=True)
        except (TypeError, ValueError, sp.SympifyError):
            raise DerivationError(f"tsallis: alpha must be a number, got {alpha_value!r}") from None
    if not a_value.is_real or not a_value.is_number:
        raise DerivationError(f"tsallis: alpha must be a real number, got {alpha_value!r}")
    if a_value == 1:
        raise DerivationError("tsallis: alpha = 1 is the Shannon limit; use shannon()")
    if not a_value > 0:
        raise DerivationError(f"tsallis: alpha must be > 0, got {a_value}")
    omega = (p**a_value - p) / (a_value * (a_value - 1))
    return Regularizer(omega, name=f"tsallis(alpha={a_value})")
