"""A regularizer's real parameters (Tsallis' ``alpha``, a user's ``c``): their names, domains and sample values.

:class:`Parameter` is a symbol on an open interval, read from any of the forms a user writes
(:meth:`Parameter.from_spec`); :func:`check_parameter_name` refuses the names that would collide with a
derivation's symbols or with the arguments of generated code and of numeric's maps (:data:`RESERVED_NAMES`).
"""

from __future__ import annotations

import keyword
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import sympy as sp

from ._parse import FUNCTIONS, parse_expression
from .errors import DerivationError

__all__ = ["Parameter", "RESERVED_NAMES", "check_parameter_name", "coerce_parameters"]

#: Names a parameter may not take, by what takes them.  A parameter's name becomes a SymPy symbol beside the
#: derivation's, an argument of every generated NumPy, CUDA and Triton function, a member of the CUDA map struct
#: and a keyword of numeric's maps (``get_map(..., c=0.5)``, ``Map(module, threshold, **params)``,
#: ``TorchMap(...)(x, dim, **params)``, ``numeric.torch.hf.register``, ``sparsify``); any of these names would
#: collide there (``self=0.7`` as "multiple values for argument 'self'", ``threshold`` read as the threshold rule).
RESERVED_NAMES: Mapping[str, frozenset] = MappingProxyType({
    "a symbol of the derivation": frozenset({"p", "z", "s", "y", "tau", "i", "d", "k", "S", "S_1", "S_2", "s_max", "s_min"}),
    "a constant": frozenset({"pi", "E", "I", "oo", "inf", "nan"}),
    "a function": frozenset(FUNCTIONS),
    "an argument of numeric's maps": frozenset({
        "self", "cls", "module", "mapping", "name", "threshold", "x", "axis", "dim", "upper", "total", "sink", "backend",
        "model", "learn", "ranges", "params"}),
    "a name in generated modules": frozenset({
        "numpy", "math", "kernels", "erf", "triton", "tl", "T", "Params", "offset", "q", "solver", "v", "out",
        "rows", "cols", "newton_link", "omega", "omega_prime", "omega_second", "omega_third", "weight", "weight_d2",
        "clip", "omega_zero", "link", "link_dtau", "link_dtau2", "link_scale", "link_exponent", "term",
        "tau_from_sum", "tau_candidate", "discriminant", "NAME", "REGULARIZER", "PARAMETERS", "PARAMETER_DOMAINS"}),
    "a C++ keyword (CUDA)": frozenset({
        "auto", "bool", "break", "case", "catch", "char", "const", "constexpr", "continue", "default", "delete",
        "do", "double", "else", "enum", "explicit", "extern", "float", "for", "friend", "goto", "if", "inline", "int",
        "long", "mutable", "namespace", "new", "operator", "private", "protected", "public", "register", "return",
        "short", "signed", "sizeof", "static", "struct", "switch", "template", "this", "throw", "true", "false",
        "try", "typedef", "typename", "union", "unsigned", "using", "virtual", "void", "volatile", "while"}),
})
# names of a generated function's temporaries (t0, t1, ...) and of the package's device helpers (rg_...)
_RESERVED_PATTERN = re.compile(r"t[0-9]+|rg_\w*|omega_prime_d_\w*")


def check_parameter_name(name: str) -> str:
    """``name`` if a parameter may take it: a plain ASCII identifier, neither a Python keyword nor in
    :data:`RESERVED_NAMES` nor a generated temporary (``t0``, ``t1``, ...) or helper (``rg_...``).

    Every way of declaring a parameter (:class:`Parameter`, :meth:`Parameter.from_spec`, ``regattn ... --param``)
    checks its name here, so a reserved one is refused before any derivation with this one message.
    """
    if not isinstance(name, str) or not name.isascii() or not name.isidentifier():
        raise DerivationError(f"parameter name {name!r} is not a plain ASCII identifier such as 'c' or 'beta'")
    why = "a Python keyword" if keyword.iskeyword(name) else None
    why = why or next((what for what, names in RESERVED_NAMES.items() if name in names), None)
    if why is None and _RESERVED_PATTERN.fullmatch(name):
        why = "a name in generated modules"
    if why is not None:
        raise DerivationError(f"parameter name {name!r} is reserved ({why}); choose another, such as 'c' or 'beta'")
    return name

_BOUNDS = {"oo": sp.oo, "+oo": sp.oo, "inf": sp.oo, "+inf": sp.oo, "-oo": -sp.oo, "-inf": -sp.oo}
_SPEC = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:in\s*\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\))?\s*")


@dataclass(frozen=True)
class Parameter:
    """A real parameter of a regularizer, on the open interval ``(lower, upper)``.

    The derivation keeps it symbolic; checks that need numbers (convexity,
    sparsity, branch selection) use :meth:`samples`, a few points inside the
    interval.  :meth:`from_spec` builds one from a name, a tuple or text.
    """

    symbol: sp.Symbol
    lower: sp.Expr = sp.S.NegativeInfinity
    upper: sp.Expr = sp.S.Infinity
    _shift: sp.Dummy = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.symbol, sp.Symbol):
            raise DerivationError(f"a parameter must be a SymPy Symbol, got {self.symbol!r}")
        check_parameter_name(self.symbol.name)
        lower, upper = _bound(self.lower, self.symbol), _bound(self.upper, self.symbol)
        if not (lower < upper):
            raise DerivationError(
                f"parameter {self.symbol} has an empty domain ({lower}, {upper})"
            )
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "_shift", sp.Dummy(f"{self.symbol.name}_shift", positive=True))

    @classmethod
    def from_spec(cls, spec: object, symbols: Mapping[str, sp.Symbol] | None = None) -> "Parameter":
        """A parameter from any of the forms :class:`Regularizer` accepts.

        ``spec`` is one of

        * a :class:`Parameter` (returned as is);
        * a SymPy ``Symbol``: the whole real line;
        * a name ``"c"``: ``Symbol("c", real=True)`` on the whole real line;
        * text ``"c in (0, 1)"``: the open interval, ends as in a tuple;
        * a tuple ``(name_or_symbol, lower, upper)``: ends are numbers, SymPy
          numbers or text such as ``"1/2"``, ``"pi"``, ``"oo"``, ``"-inf"``
          (floats are read as the decimal they print as).

        ``symbols`` maps names to symbols to reuse (those of an expression),
        so that a name matches the symbol the expression already holds.

        >>> Parameter.from_spec("c in (0, 1)")
        Parameter(symbol=c, lower=0, upper=1)
        >>> Parameter.from_spec(("beta", "1/2", "oo")).lower
        1/2
        """
        if isinstance(spec, Parameter):
            return spec
        if isinstance(spec, sp.Symbol):
            return cls(spec)
        if isinstance(spec, str):
            if not spec.isascii():
                ch = next(c for c in spec if not c.isascii())
                raise DerivationError(
                    f"parameter {spec!r} holds {ch!r} (U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')}): "
                    "names are plain ASCII identifiers such as 'c' or 'beta'"
                )
            match = _SPEC.fullmatch(spec)
            if match is None:
                raise DerivationError(f"cannot read the parameter {spec!r}: write a name such as 'c' or 'c in (0, 1)'")
            name, lower, upper = match.groups()
            lower, upper = ("-oo", "oo") if lower is None else (lower, upper)
            return cls.from_spec((name, lower, upper), symbols)
        if isinstance(spec, tuple) and len(spec) == 3:
            name, lower, upper = spec
            if isinstance(name, str):
                name = _parameter_symbol(name, symbols)
            elif not isinstance(name, sp.Symbol):
                raise DerivationError(f"a parameter's name must be a str or a SymPy Symbol, got {name!r}")
            return cls(name, _bound(lower, name), _bound(upper, name))
        raise DerivationError(
            f"cannot read the parameter {spec!r}: give a name ('c'), text ('c in (0, 1)'), "
            "a tuple (name, lower, upper), a SymPy Symbol or a Parameter"
        )

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

        Returns ``(expr, dummy)`` with ``expr = lower + (upper - lower) / (1 + dummy)``
        (``dummy`` positive) when both ends are finite, ``lower + dummy`` when only
        the lower end is, ``upper - dummy`` when only the upper end is, and
        ``(symbol, None)`` otherwise; limits taken in ``dummy`` then respect the
        domain (on ``(0, 1)`` SymPy knows the sign of ``a - 1`` as well as of ``a``).
        """
        if self.lower.is_finite and self.upper.is_finite:
            return self.lower + (self.upper - self.lower) / (1 + self._shift), self._shift
        if self.lower.is_finite:
            return self.lower + self._shift, self._shift
        if self.upper.is_finite:
            return self.upper - self._shift, self._shift
        return self.symbol, None


def _parameter_symbol(name: str, symbols: Mapping[str, sp.Symbol] | None) -> sp.Symbol:
    check_parameter_name(name)
    if symbols and name in symbols:
        return symbols[name]
    return sp.Symbol(name, real=True)


def _bound(value: object, symbol: sp.Symbol) -> sp.Expr:
    """One end of a parameter's interval: a number, a SymPy number or text such as ``"1/2"`` or ``"-oo"``."""
    if isinstance(value, str):
        key = value.strip().lower().replace(" ", "")
        if key in _BOUNDS:
            return _BOUNDS[key]
        try:
            bound = parse_expression(value, {})
        except DerivationError as exc:
            raise DerivationError(f"cannot read the bound {value!r} of parameter {symbol}: {exc}") from None
    elif isinstance(value, bool):
        bound = None
    elif isinstance(value, float):
        bound = sp.Rational(repr(value)) if value == value and abs(value) != float("inf") else sp.sympify(value)
        bound = {float("inf"): sp.oo, float("-inf"): -sp.oo}.get(value, bound)
    else:
        try:
            bound = sp.sympify(value, strict=True)
        except (sp.SympifyError, TypeError, ValueError):
            bound = None
    if bound is None or not isinstance(bound, sp.Expr) or not bound.is_number or bound.is_extended_real is not True:
        raise DerivationError(f"the bounds of parameter {symbol} must be real numbers or +-oo, got {value!r}")
    return bound


def coerce_parameters(parameters: object, omega: sp.Expr | None = None) -> tuple[Parameter, ...]:
    """``parameters`` as :class:`Parameter` objects: a sequence of specs or a mapping name -> (lower, upper)."""
    if parameters is None:
        return ()
    if isinstance(parameters, (str, Parameter, sp.Symbol)) or (
        isinstance(parameters, tuple) and len(parameters) == 3 and not isinstance(parameters[1], (str, Parameter, sp.Symbol, tuple))
    ):
        parameters = (parameters,)  # a single spec given bare
    symbols = {s.name: s for s in omega.free_symbols} if omega is not None else None
    if isinstance(parameters, Mapping):
        specs = []
        for name, domain in parameters.items():
            if domain is None:
                specs.append(name)
            elif isinstance(domain, (tuple, list)) and len(domain) == 2:
                specs.append((name, *domain))
            else:
                raise DerivationError(f"parameter {name}: give its domain as (lower, upper) or None, got {domain!r}")
        parameters = specs
    try:
        items = list(parameters)
    except TypeError:
        raise DerivationError(f"parameters must be a sequence or a mapping, got {parameters!r}") from None
    params = tuple(Parameter.from_spec(tuple(q) if isinstance(q, list) else q, symbols) for q in items)
    names = [q.symbol.name for q in params]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DerivationError(f"parameter(s) {', '.join(repeated)} declared more than once")
    return params
