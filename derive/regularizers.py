"""Separable regularizers ``Omega(p) = sum_i omega(p_i)`` on the simplex.

A :class:`Regularizer` holds the scalar function ``omega(p)`` as a SymPy
expression in the symbol :data:`p` (positive), optionally with named real
parameters such as Tsallis' ``alpha``.  Construction checks what the
derivation relies on and raises :class:`~derive.errors.DerivationError` naming
the condition that failed:

* the only free symbols are ``p`` and the declared parameters;
* only differentiable functions from a whitelist occur (no ``Abs``, ``sign``,
  ``Max``, ``Piecewise``, ...): :data:`FUNCTIONS` in text, those and
  ``LambertW``, ``asin``, ``acos``, ``acosh``, ``atanh`` in SymPy expressions;
* the expression is small enough for SymPy to handle in reasonable time
  (structural limits, checked first: at most :data:`MAX_NODES` nodes, functions
  nested at most :data:`MAX_FUNCTION_DEPTH` deep, exponents of at most
  :data:`MAX_EXPONENT` on ``p`` and :data:`MAX_POWER_OF_SUM` on a sum);
* ``omega`` is real (no ``sqrt(-1)``; every constant real, nonzero constants
  within ``[1e-100, 1e100]`` in magnitude) and finite on ``(0, 1]``; or its
  domain ends at 1 where the simplex does (``omega'(p) -> +oo`` as ``p -> 1``,
  the binary entropy: :attr:`Regularizer.ends_at_one`), and then it is finite
  on ``(0, 1)`` with a finite limit ``omega(1-)``;
* ``omega''(p) > 0`` on ``(0, 1]`` (``(0, 1)`` where the domain ends at 1:
  strict convexity with a finite Jacobian weight ``w = 1/omega''``): proved exactly for rational ``omega''``, proved by
  SymPy's assumptions where it can, otherwise checked at a dense set of points
  (and :attr:`Regularizer.convexity` says which).

The checks after the structural ones run under a time limit
(:data:`~derive._timelimit.DEFAULT_TIMEOUT` seconds, or ``$REGATTN_TIMEOUT``;
``timeout=`` of :meth:`Regularizer.from_string`); past it construction raises
:class:`~derive.errors.DerivationTimeout`.
"""

from __future__ import annotations

import functools
import itertools
import sys
from dataclasses import InitVar, dataclass, field
from functools import cached_property

import mpmath
import sympy as sp

from ._parse import FUNCTIONS, parse_expression
from ._timelimit import TimeLimit
from .errors import DerivationError
from .parameters import RESERVED_NAMES, Parameter, check_parameter_name, coerce_parameters

__all__ = [
    "p",
    "z",
    "alpha",
    "Parameter",
    "Regularizer",
    "RESERVED_NAMES",
    "check_parameter_name",
    "shannon",
    "gini",
    "tsallis",
    "FAMILIES",
    "FUNCTIONS",
    "MAX_NODES",
    "MAX_FUNCTION_DEPTH",
    "MAX_EXPONENT",
    "MAX_POWER_OF_SUM",
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
#: Structural limits on ``omega``, checked before any SymPy work: nodes in the expression tree,
MAX_NODES = 400
#: depth of nested function calls (``exp(exp(p))`` is 2),
MAX_FUNCTION_DEPTH = 5
#: magnitude of a numeric exponent of ``p`` (or of any power),
MAX_EXPONENT = 1000
#: and of a numeric exponent of a sum or other compound base such as ``(p + 1)**n``.
MAX_POWER_OF_SUM = 32
# nonzero constants must lie in [10**-_MAX_DECADE, 10**_MAX_DECADE] in magnitude
_MAX_DECADE = 100
# sample points in (0, 1] used where convexity cannot be proved symbolically
_CONVEXITY_POINTS = tuple(
    sorted(
        {mpmath.mpf(10) ** (-k / 4) for k in range(0, 4 * 14 + 1)}
        | {mpmath.mpf(j) / 400 for j in range(1, 401)}
    )
)



def sympy_failure(exc: BaseException) -> str:
    """Words for an exception SymPy (or mpmath) raised on an expression: ``SymPy failed with TYPE: message``.

    Python's limit on the digits of an integer converted to text (``ValueError: Exceeds the limit (4300
    digits) for integer string conversion``), which SymPy's exact arithmetic meets on exponents with large
    denominators such as ``p**(10001/10000)``, is said in words with what to do instead."""
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        digits = getattr(sys, "get_int_max_str_digits", lambda: 4300)()
        return (f"SymPy's exact arithmetic needs integers of more than {digits} digits (Python's limit on "
                "converting an integer to text), as an exponent with a large denominator such as 10001/10000 "
                "makes it do; write the exponent as a simpler fraction")
    return f"SymPy failed with {type(exc).__name__}: {one_line(exc)}"


def one_line(text: str, limit: int = 100) -> str:
    """``text`` on one line, shortened to ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(expr: sp.Expr, limit: int = 80) -> str:
    """``expr`` as one line of text, shortened to about ``limit`` characters."""
    return one_line(sp.sstr(expr), limit)


def _check_structure(omega: sp.Expr) -> None:
    """Cheap structural limits, so that no SymPy call gets an expression it takes minutes over."""
    nodes = 0
    stack = [(omega, 0)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise DerivationError(f"omega(p) = {describe(omega)} has more than {MAX_NODES} nodes (limit {MAX_NODES})")
        if isinstance(node, sp.Function):
            depth += 1
            if depth > MAX_FUNCTION_DEPTH:
                raise DerivationError(
                    f"omega(p) = {describe(omega)} nests functions {depth} deep (limit {MAX_FUNCTION_DEPTH})"
                )
        if isinstance(node, sp.Pow) and node.exp.is_Number and node.base.has(p):
            limit = MAX_EXPONENT if node.base.is_Symbol else MAX_POWER_OF_SUM
            if abs(node.exp) > limit:
                raise DerivationError(
                    f"omega(p) = {describe(omega)} raises {describe(node.base, 40)} to the power {node.exp} "
                    f"(limit {limit} for {'p' if node.base.is_Symbol else 'a compound base'})"
                )
        stack.extend((arg, depth) for arg in node.args)


def _check_real(omega: sp.Expr) -> None:
    """Refuse ``I`` and constants that are complex, infinite or outside ``[1e-100, 1e100]`` in magnitude."""
    if omega.has(sp.I):
        raise DerivationError(
            f"omega(p) = {describe(omega)} is complex (it holds I = sqrt(-1)); a regularizer is a real function of p"
        )
    for node in sp.preorder_traversal(omega):
        if node.has(sp.zoo, sp.nan, sp.oo, -sp.oo):
            raise DerivationError(f"omega(p) = {describe(omega)} holds {describe(node, 40)}, which is not finite")
    stack = [omega]
    while stack:
        node = stack.pop()
        if not isinstance(node, sp.Expr):
            continue
        if node.free_symbols:
            stack.extend(node.args)
            continue
        if node.is_Rational or node in (sp.pi, sp.E):
            value = node
        else:
            value = node.evalf(30)
            real, imag = value.as_real_imag()
            if imag != 0 and abs(imag) > abs(real) * sp.Float(10) ** -25:
                raise DerivationError(
                    f"omega(p) = {describe(omega)} is complex: its constant {describe(node, 40)} = "
                    f"{sp.sstr(value.evalf(6))} is not real; a regularizer is a real function of p"
                )
            value = real
        if not value.is_finite:
            raise DerivationError(f"omega(p) = {describe(omega)} holds {describe(node, 40)}, which is not finite")
        if value != 0 and not sp.Float(10) ** -_MAX_DECADE <= abs(value) <= sp.Float(10) ** _MAX_DECADE:
            raise DerivationError(
                f"omega(p) = {describe(omega)} holds the constant {describe(node, 40)} ~ {sp.sstr(value.evalf(4))}, "
                f"outside [1e-{_MAX_DECADE}, 1e{_MAX_DECADE}] in magnitude: regattn's numeric side cannot represent it"
            )


def refuse_functions(expr: sp.Expr, functions, what: str, why: str) -> None:
    """Raise :class:`DerivationError` ``"{what} contains F, {why}"`` for the first of ``functions`` in ``expr``."""
    bad = next((f for f in functions if expr.has(f)), None)
    if bad is not None:
        raise DerivationError(f"{what} contains {bad.__name__}, {why}")


def _check_functions(expr: sp.Expr, what: str) -> None:
    refuse_functions(expr, _NON_DIFFERENTIABLE, what,
                     "which is not differentiable; a regularizer must be twice differentiable on (0, 1]")
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


@functools.lru_cache(maxsize=256)
def singular_points(omega: sp.Expr, sym: sp.Symbol) -> tuple[sp.Expr, ...]:
    """The real zeros of the factors of ``omega``'s denominator in ``sym`` alone: values of the parameter where the
    formula is ``0/0`` or infinite (Tsallis' ``alpha = 0`` and ``alpha = 1``)."""
    _, den = sp.fraction(sp.together(omega))
    out = []
    for factor, _ in sp.factor_list(den)[1]:
        if factor.free_symbols == {sym}:
            try:
                roots = sp.solve(sp.Eq(factor, 0), sym)
            except (NotImplementedError, ValueError, TypeError):
                continue
            out += [r for r in roots if r.is_real and r.is_number]
    return tuple(out)


def _off_points(q: "Parameter", points) -> tuple:
    """``q``'s samples, each one at a singular point moved an eighth of the way to the next sample (or the end)."""
    samples = list(q.samples())
    for i, v in enumerate(samples):
        if v in points:
            other = samples[i + 1] if i + 1 < len(samples) else (q.upper if q.upper.is_finite else v + 1)
            samples[i] = v + (other - v) / 8
    return tuple(samples)


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
        Real parameters that stay symbolic, in any form
        :meth:`Parameter.from_spec` reads (a :class:`Parameter`, a SymPy
        symbol or a name, each then on the whole real line; ``"c in (0, 1)"``;
        ``("c", 0, 1)``), or a mapping from name to ``(lower, upper)``.  A name
        refers to the symbol of that name in ``omega``.
    timeout:
        Keyword only: seconds allowed for the checks (default
        ``$REGATTN_TIMEOUT`` or 60).

    Raises
    ------
    DerivationError
        If ``omega`` has a free symbol other than ``p`` and the parameters, a
        function that is not differentiable or not supported, exceeds a
        structural limit, is complex or not finite on ``(0, 1]``, or has
        ``omega''(p) <= 0`` somewhere on ``(0, 1]``.  The message is one line.
    DerivationTimeout
        If the checks take longer than the time limit.

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
    timeout: InitVar[float | None] = field(default=None, kw_only=True)

    def __post_init__(self, timeout: float | None) -> None:
        if isinstance(self.omega, str):
            raise DerivationError(
                "Regularizer() takes a SymPy expression; use Regularizer.from_string() for text"
            )
        try:
            omega = sp.sympify(self.omega, strict=True)
        except (sp.SympifyError, TypeError, ValueError) as exc:
            raise DerivationError(f"omega must be a SymPy expression, got {self.omega!r}") from exc
        if not isinstance(omega, sp.Expr) or isinstance(omega, (sp.MatrixBase, sp.MatrixExpr)):
            raise DerivationError(f"omega must be a SymPy expression, got {type(omega).__name__} {describe(omega)}")
        plain = sp.Symbol("p")
        if plain in omega.free_symbols:
            omega = omega.subs(plain, p)
        object.__setattr__(self, "omega", omega)
        params = coerce_parameters(self.parameters, omega)
        object.__setattr__(self, "parameters", params)
        if not isinstance(self.name, str) or not self.name:
            raise DerivationError(f"name must be a non-empty str, got {self.name!r}")

        allowed = {p} | {q.symbol for q in params}
        extra = omega.free_symbols - allowed
        if extra:
            names = ", ".join(sorted(str(s) for s in extra))
            raise DerivationError(
                f"omega(p) = {describe(omega)} has free symbol(s) {names} other than p"
                + (" and its parameters" if params else "")
                + "; declare parameters with Regularizer(..., parameters=[...])"
            )
        if p not in omega.free_symbols:
            raise DerivationError(f"omega = {describe(omega)} does not depend on p")
        _check_structure(omega)
        # in a child process killed at the deadline (a single SymPy call into C can outlast it by minutes)
        limit = TimeLimit(timeout, f"checking the regularizer omega(p) = {describe(omega)}")
        convexity, derivatives = limit.run_isolated(self._check_keeping_derivatives)
        vars(self).update(derivatives)  # (computed by the checks, in a child process perhaps)
        object.__setattr__(self, "convexity", convexity)

    def _check_keeping_derivatives(self) -> tuple[str, dict]:
        """:meth:`_check`'s result and the derivatives it computed (cached properties)."""
        convexity = self._check()
        return convexity, {name: vars(self)[name] for name in ("first_derivative", "second_derivative", "ends_at_one")
                           if name in vars(self)}

    def _check(self) -> str:
        """The checks that need SymPy's algebra (run under the time limit); returns how convexity was shown."""
        omega = self.omega
        try:
            _check_functions(omega, f"omega(p) = {describe(omega)}")
            _check_real(omega)
            _check_functions(self.second_derivative, f"omega''(p) = {describe(self.second_derivative)}")
            if self.ends_at_one:
                self._check_value_at_one()
            return self._check_convexity()
        except DerivationError:
            raise
        except Exception as exc:
            # SymPy and mpmath raise TypeError, ValueError, RecursionError, ... on expressions they cannot handle
            raise DerivationError(f"cannot check omega(p) = {describe(omega)}: {sympy_failure(exc)}") from exc

    # ------------------------------------------------------------------ text
    @classmethod
    def from_string(
        cls, text: str, name: str = "custom", parameters: object = (), *, timeout: float | None = None
    ) -> "Regularizer":
        """Build a regularizer from text such as ``"p*log(p) + p**2/2"``.

        The text is parsed into a syntax tree and converted node by node
        (see :mod:`derive._parse`); it is never evaluated as Python.  Accepted:
        numbers (read exactly: ``0.1`` is ``1/10``), ``p``, parameter names,
        ``pi``, ``E``, ``+ - * / ** ^`` and the functions in
        :data:`derive.FUNCTIONS`.  The text must be plain ASCII.

        Parameters
        ----------
        text:
            ``omega(p)``.
        name:
            A label used in printed derivations and generated modules.
        parameters:
            Real parameters the text may use, in any form
            :meth:`Parameter.from_spec` reads: names (``("c",)``, each on the
            whole real line), text (``("c in (0, 1)",)``), tuples
            (``(("c", 0, 1),)``), :class:`Parameter` objects or SymPy symbols;
            or a mapping from name to ``(lower, upper)`` or ``None``
            (``{"c": (0, 1)}``).
        timeout:
            Seconds allowed for the checks (default ``$REGATTN_TIMEOUT`` or
            60); past it :class:`~derive.errors.DerivationTimeout` is raised.

        >>> Regularizer.from_string("c*p**2 + p*log(p)", parameters={"c": (0, 1)}).parameters
        (Parameter(symbol=c, lower=0, upper=1),)
        """
        params = coerce_parameters(parameters)
        symbols = {"p": p} | {q.symbol.name: q.symbol for q in params}
        return cls(parse_expression(text, symbols), name=name, parameters=params, timeout=timeout)

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

    @cached_property
    def ends_at_one(self) -> bool:
        """Whether omega's domain ends at ``p = 1`` where the simplex does: ``omega'(p) -> +oo`` as ``p -> 1-``.

        The binary entropy ``p log p + (1 - p) log(1 - p)`` is one (its map without a sum is the sigmoid).  Its
        ``omega''`` is undefined at 1, and ``omega(1)`` is the limit there.  On the simplex a lone score then gets
        ``p = 1`` at the threshold ``-oo``, and the threshold's bracket is taken from the smallest score
        (``[min(s) - omega'(1/d), max(s) - omega'(1/d)]``) instead of ``omega'(1)``.
        """
        at_one = self.first_derivative.subs(p, 1)
        if not at_one.has(sp.zoo, sp.nan, sp.oo, -sp.oo):
            return False
        assumed, _ = self.assumed(self.first_derivative)
        try:
            return sp.limit(assumed, p, 1, "-") == sp.oo
        except (NotImplementedError, ValueError, TypeError):
            return False

    def _check_value_at_one(self) -> None:
        """``omega(1-)`` finite: a one-hot target's Fenchel-Young loss takes it."""
        assumed, back = self.assumed(self.omega)
        try:
            value = sp.limit(assumed, p, 1, "-").subs(back)
        except (NotImplementedError, ValueError, TypeError):
            value = sp.nan
        if value.has(sp.zoo, sp.nan, sp.oo, -sp.oo, sp.Limit, sp.AccumBounds) or not value.is_finite:
            raise DerivationError(
                f"omega(p) = {describe(self.omega)} ends at p = 1 (omega'(1-) = +oo) but omega(1-) = {describe(value)} "
                "is not finite: a one-hot target's loss needs it"
            )

    def parameter_samples(self) -> list[dict[sp.Symbol, sp.Rational]]:
        """Parameter assignments used for numeric checks (one empty dict if none)."""
        grids = [_off_points(q, singular_points(self.omega, q.symbol)) for q in self.parameters]
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
                if q.lower.is_finite and q.upper.is_finite:
                    back[dummy] = (q.upper - q.lower) / (q.symbol - q.lower) - 1
                else:
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
                for x in _CONVEXITY_POINTS[:-1] if self.ends_at_one else _CONVEXITY_POINTS:
                    try:
                        v0, v2 = fn0(x, *args), fn2(x, *args)
                    except (ZeroDivisionError, ValueError, OverflowError) as exc:
                        raise DerivationError(
                            f"omega(p) = {describe(self.omega)} cannot be evaluated at p = {mpmath.nstr(x, 6)}{where}: {exc}"
                        ) from None
                    if not _real_finite(v0):
                        raise DerivationError(
                            f"omega(p) = {describe(self.omega)} is not real and finite at p = {mpmath.nstr(x, 6)}{where} "
                            f"(value {mpmath.nstr(v0, 6)}); it must be on (0, 1]"
                        )
                    if not _real_finite(v2) or mpmath.re(v2) <= 0:
                        raise DerivationError(
                            f"omega is not strictly convex on (0, 1]: omega''(p) = {describe(d2)} = "
                            f"{mpmath.nstr(v2, 6)} at p = {mpmath.nstr(x, 6)}{where}"
                        )
        n = (len(_CONVEXITY_POINTS) - self.ends_at_one) * len(self.parameter_samples())
        return f"omega''(p) > 0 checked numerically at {n} points of {self.domain}"

    @property
    def domain(self) -> str:
        """Where ``omega`` is strictly convex: ``(0, 1]``, or ``(0, 1)`` where its domain ends at 1."""
        return "(0, 1)" if self.ends_at_one else "(0, 1]"

    def _prove_convexity(self, d2: sp.Expr) -> str:
        assumed, _ = self.assumed(d2)
        # p in (0, 1]: write p = 1/(1 + u) with u >= 0 (u > 0 on (0, 1)) so that SymPy's assumptions see the domain
        u = sp.Dummy("u", positive=True) if self.ends_at_one else sp.Dummy("u", nonnegative=True)
        on_domain = sp.simplify(assumed.subs(p, 1 / (1 + u)))
        if on_domain.is_positive:
            return f"omega''(p) > 0 on {self.domain}, proved by SymPy's assumptions"
        if not self.parameters and d2.is_rational_function(p):
            num, den = sp.fraction(sp.together(d2))
            cuts = sorted(
                {sp.Rational(0), sp.Rational(1)}
                | {r for poly in (num, den) for r in sp.Poly(poly, p).real_roots() if 0 < r < 1}
            , key=float)
            for r in cuts[1:]:
                if r == 1 and self.ends_at_one:
                    continue
                if num.subs(p, r) == 0 or den.subs(p, r) == 0:
                    raise DerivationError(
                        f"omega is not strictly convex on (0, 1]: omega''(p) = {describe(d2)} vanishes or is "
                        f"undefined at p = {r}"
                    )
            for a, b in zip(cuts, cuts[1:]):
                mid = (a + b) / 2
                if not d2.subs(p, mid) > 0:
                    raise DerivationError(
                        f"omega is not strictly convex on (0, 1]: omega''(p) = {describe(d2)} = "
                        f"{describe(d2.subs(p, mid))} at p = {mid}"
                    )
            return f"omega''(p) > 0 on {self.domain}, proved from the real roots of the rational omega''"
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
        the sparse entmax family.  ``(0, 1)`` is the dense family with heavy
        tails; a domain holding 1 is three maps (dense, softmax at 1, sparse),
        which :func:`derive.family.derive_family` derives case by case.
    """
    if alpha_value is None or isinstance(alpha_value, sp.Symbol):
        sym = alpha if alpha_value is None else alpha_value
        a = Parameter(sym, lower, upper)
        if a.lower < 0:
            raise DerivationError(f"tsallis: the domain of {sym} must lie inside (0, oo), got ({a.lower}, {a.upper})")
        omega = (p**sym - p) / (sym * (sym - 1))
        return Regularizer(omega, name="tsallis", parameters=(a,))
    if isinstance(alpha_value, bool):
        raise DerivationError(f"tsallis: alpha must be a number, got {alpha_value!r}")
    if isinstance(alpha_value, float):
        if alpha_value != alpha_value or abs(alpha_value) == float("inf"):
            raise DerivationError(f"tsallis: alpha must be a finite number, got {alpha_value!r}")
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


def binary_entropy() -> Regularizer:
    """The binary entropy ``omega(p) = p log p + (1 - p) log(1 - p)``, whose domain ends at ``p = 1``
    (:attr:`Regularizer.ends_at_one`); its map without a sum is the logistic sigmoid ``p = 1/(1 + exp(-s))``, and
    its Fenchel-Young loss there the binary logistic loss."""
    return Regularizer(p * sp.log(p) + (1 - p) * sp.log(1 - p), name="binary_entropy")


#: The built-in families by name (the regattn command's ``REG``; :mod:`derive.codegen.builtins`
#: names a family for each built-in map).  A new family is a factory here.
FAMILIES = {"shannon": shannon, "gini": gini, "tsallis": tsallis, "binary_entropy": binary_entropy}
