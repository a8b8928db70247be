"""Code printers for generated kernels, built on SymPy's own printers.

Both printers share one pre-pass, :func:`blocks`: common subexpressions are
eliminated (``sympy.cse`` with numbered temporaries ``t0, t1, ...``), and the
base of every small integer or half-integer power is lifted into a temporary
of its own, so that a power prints as a product of a name with itself
(``t2*t2*t2``) or as ``t2*sqrt(t2)``, never re-evaluating the base.

* :class:`PyPrinter` extends :class:`sympy.printing.numpy.NumPyPrinter`:
  ``numpy.`` ufuncs (which CuPy arrays also dispatch), Python float literals
  (weak scalars: float32 arrays stay float32).
* :class:`CudaPrinter` extends :class:`sympy.printing.c.C99CodePrinter`:
  type-generic code for ``template <typename T>`` device functions, literals
  typed as ``T(...)``, math through the ``rg_*`` overloads of the prelude (so
  float code calls ``expf``, double code ``exp``).

Neither prints ``Heaviside``, ``DiracDelta`` or ``Piecewise``: the support is
applied by the templates, and the derivation is differentiated on its smooth
branch.  A function with no counterpart raises :class:`DerivationError`
naming it.
"""

from __future__ import annotations

import sympy as sp
from sympy.printing.c import C99CodePrinter
from sympy.printing.numpy import NumPyPrinter

from ..errors import DerivationError

__all__ = ["PyPrinter", "CudaPrinter", "blocks", "MAX_PRODUCT"]

#: Largest integer power printed as a product.
MAX_PRODUCT = 8

_FORBIDDEN = (sp.Heaviside, sp.DiracDelta, sp.Piecewise, sp.LambertW, sp.Abs, sp.sign)

_C_FUNCTIONS = {
    "exp": "rg_exp",
    "log": "rg_log",
    "sqrt": "rg_sqrt",
    "cbrt": "rg_cbrt",
    "sin": "rg_sin",
    "cos": "rg_cos",
    "tan": "rg_tan",
    "sinh": "rg_sinh",
    "cosh": "rg_cosh",
    "tanh": "rg_tanh",
    "asinh": "rg_asinh",
    "acosh": "rg_acosh",
    "atanh": "rg_atanh",
    "asin": "rg_asin",
    "acos": "rg_acos",
    "atan": "rg_atan",
    "erf": "rg_erf",
}


def _check_printable(expr: sp.Expr, where: str) -> None:
    for bad in _FORBIDDEN:
        if expr.has(bad):
            raise DerivationError(
                f"{where} contains {bad.__name__}, which has no C99/NumPy counterpart in generated code; "
                "the derivation must use its numeric inversion instead"
            )
    if expr.has(sp.I, sp.zoo, sp.nan):
        raise DerivationError(f"{where} is not real-valued code: {expr}")


def _liftable(expr: sp.Expr) -> bool:
    if not isinstance(expr, sp.Pow) or expr.base.is_Symbol or expr.base.is_Number:
        return False
    e = expr.exp
    return (e.is_Integer and 1 < abs(e) <= MAX_PRODUCT) or (e.is_Rational and e.q == 2 and abs(e.p) <= 2 * MAX_PRODUCT + 1)


def blocks(exprs: list[sp.Expr], prefix: str = "t") -> tuple[list[tuple[sp.Symbol, sp.Expr]], list[sp.Expr]]:
    """CSE ``exprs`` and lift bases of small powers into temporaries.

    Returns ``(assignments, results)``: ``assignments`` in evaluation order.
    """
    counter = sp.numbered_symbols(prefix, real=True)
    repl, reduced = sp.cse(list(exprs), symbols=counter, order="canonical")
    lifted: dict[sp.Expr, sp.Symbol] = {}
    out: list[tuple[sp.Symbol, sp.Expr]] = []

    def lift(node: sp.Expr) -> sp.Expr:
        if node.is_Atom:
            return node
        args = tuple(lift(a) for a in node.args)
        new = node.func(*args) if args != node.args else node
        if _liftable(new):
            if new.base not in lifted:
                lifted[new.base] = next(counter)
                out.append((lifted[new.base], new.base))
            return sp.Pow(lifted[new.base], new.exp)
        return new

    for sym, value in repl:
        value = lift(value)
        out.append((sym, value))
    results = [lift(r) for r in reduced]
    return out, results


class _PowerMixin:
    """Small integer powers as products, half-integer powers through sqrt."""

    def _pow_parts(self, expr):
        """Small powers as products/roots, parenthesized so that ``a/k**2`` prints ``a/(k*k)``."""
        base, e = expr.base, expr.exp
        if expr.is_number and not e.is_Integer and expr.is_extended_real and expr.is_finite:
            return self._print(sp.Float(expr.evalf(20), 17))  # an irrational constant such as 2**(2/3): its value
        b = self._print(base)
        if not (base.is_Symbol or base.is_Number):
            b = f"({b})"
        if e.is_Integer and 1 <= abs(e) <= MAX_PRODUCT and base.is_Symbol:
            prod = "*".join([b] * int(abs(e)))
            prod = prod if abs(e) == 1 else f"({prod})"
            return prod if e > 0 else f"({self._one()}/{prod})"
        if e.is_Rational and e.q == 2 and base.is_Symbol and abs(e.p) <= 2 * MAX_PRODUCT + 1:
            whole = (abs(e.p) - 1) // 2
            root = f"{self._sqrt()}({b})"
            value = root if whole == 0 else "(" + "*".join([b] * whole + [root]) + ")"
            return value if e > 0 else f"({self._one()}/{value})"
        if e == sp.Rational(1, 3):
            return f"{self._cbrt()}({b})"
        if e == sp.Rational(-1, 3):
            return f"({self._one()}/{self._cbrt()}({b}))"
        if e == -1:
            return f"({self._one()}/{b})"
        return None


class PyPrinter(_PowerMixin, NumPyPrinter):
    """NumPy code: ``numpy.`` ufuncs, Python float literals, powers as products."""

    def __init__(self, settings=None):
        super().__init__({"fully_qualified_modules": True, **(settings or {})})

    def _one(self) -> str:
        return "1"

    def _sqrt(self) -> str:
        return "numpy.sqrt"

    def _cbrt(self) -> str:
        return "numpy.cbrt"

    def _print_Pow(self, expr, rational=False):
        out = self._pow_parts(expr)
        if out is not None:
            return out
        b = self._print(expr.base)
        e = self._print(expr.exp)
        return f"numpy.power({b}, {e})"

    def _print_Rational(self, expr):
        return f"{expr.p}/{expr.q}"

    def _print_Float(self, expr):
        return repr(float(expr))

    def _print_erf(self, expr):
        # numeric.special.erf: NumPy has no erf ufunc (modules using it import it)
        return f"erf({self._print(expr.args[0])})"

    def _print_Infinity(self, expr):
        return "math.inf"

    def _print_NegativeInfinity(self, expr):
        return "-math.inf"


class CudaPrinter(_PowerMixin, C99CodePrinter):
    """Type-generic CUDA C++: ``T(...)`` literals and ``rg_*`` math overloads."""

    def __init__(self, settings=None):
        super().__init__({"user_functions": dict(_C_FUNCTIONS), **(settings or {})})

    def _one(self) -> str:
        return "T(1)"

    def _sqrt(self) -> str:
        return "rg_sqrt"

    def _cbrt(self) -> str:
        return "rg_cbrt"

    def _print_Pow(self, expr, rational=False):
        out = self._pow_parts(expr)
        if out is not None:
            return out
        return f"rg_pow({self._print(expr.base)}, {self._print_as_T(expr.exp)})"

    def _print_as_T(self, expr):
        text = self._print(expr)
        return text if not expr.is_Integer else f"T({text})"

    def _print_Integer(self, expr):
        return str(expr.p)

    def _print_Rational(self, expr):
        return f"T({expr.p}.0/{expr.q}.0)"

    def _print_Float(self, expr):
        return f"T({repr(float(expr))})"

    def _print_Infinity(self, expr):
        return "rg_inf<T>()"

    def _print_NegativeInfinity(self, expr):
        return "(-rg_inf<T>())"

    def _print_Exp1(self, expr):
        return "T(2.718281828459045)"

    def _print_Pi(self, expr):
        return "T(3.141592653589793)"


def print_block(printer, exprs: list[sp.Expr], where: str, prefix: str = "t"):
    """Assignments and results of ``exprs`` as strings, checked for printability."""
    for e in exprs:
        _check_printable(e, where)
    assignments, results = blocks(exprs, prefix)
    return [(printer._print(s), printer._print(v)) for s, v in assignments], [printer._print(r) for r in results]
