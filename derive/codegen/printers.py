"""Code printers for generated kernels, built on SymPy's own printers.

* :class:`PyPrinter` extends :class:`sympy.printing.numpy.NumPyPrinter`:
  ``numpy.`` ufuncs (which CuPy arrays also dispatch), Python float literals
  (weak scalars: float32 arrays stay float32); :class:`TritonPrinter` is its
  subclass for ``triton.language``.
* :class:`CudaPrinter` extends :class:`sympy.printing.c.C99CodePrinter`:
  type-generic code for ``template <typename T>`` device functions, literals
  typed as ``T(...)``, math through the ``rg_*`` overloads of the prelude (so
  float code calls ``expf``, double code ``exp``).

Each prints one node per ``_print_X`` method, as SymPy's printers do; what is
printed has been rewritten first by :mod:`derive.codegen.rewrite` (stable forms,
constants folded, common subexpressions in blocks), which :func:`print_block`
runs.  Small integer powers print as products of a name with itself and
half-integer powers through ``sqrt``; integers and rationals too large for an
exact literal print as floating literals; a constant outside the float64 range
raises :class:`DerivationError` naming it.

Every function prints as :data:`derive.codegen.functions.FUNCTIONS` spells it
for the printer's target (NumPy, CUDA C, Triton): one table for all three.
Neither prints ``Heaviside``, ``DiracDelta`` or ``Piecewise``: the support is
applied by the templates, and the derivation is differentiated on its smooth
branch.  A function with no counterpart in every target (``LambertW``,
``erfc``, ``gamma``, ...) raises :class:`DerivationError` naming it when the
code is generated (:func:`derive.codegen.functions.check_functions`), not when
it runs.
"""

from __future__ import annotations

import sys

import sympy as sp
from sympy.printing.c import C99CodePrinter
from sympy.printing.numpy import NumPyPrinter

from ..errors import DerivationError
from ..regularizers import refuse_functions
from .functions import FUNCTIONS, check_functions, reciprocals
from .rewrite import MAX_PRODUCT, POINTS, Select, blocks, fold_constants, stable_form

__all__ = ["PyPrinter", "TritonPrinter", "CudaPrinter", "print_block"]

#: Largest integer magnitude printed as an integer literal: NumPy (exact in
#: float64) and C (an ``int``); larger integers print as floating literals.
PY_INT_MAX = 2**53
C_INT_MAX = 2**31 - 1

_FORBIDDEN = (sp.Heaviside, sp.DiracDelta, sp.Piecewise, sp.LambertW, sp.Abs, sp.sign)



def _check_printable(expr: sp.Expr, where: str) -> None:
    refuse_functions(expr, _FORBIDDEN, where, "which has no C99/NumPy counterpart in generated code; "
                     "the derivation must use its numeric inversion instead")
    if expr.has(sp.I, sp.zoo, sp.nan):
        raise DerivationError(f"{where} is not real-valued code: {expr}")
    _check_constants(expr, where)


def _check_constants(expr: sp.Expr, where: str) -> None:
    """Every constant printed from ``expr`` must be 0 or a normal float64: no literal may round to 0 or inf.

    The constants are its numbers and the functions and powers of numbers,
    which print as their values.
    """
    numbers = expr.atoms(sp.Number)
    numbers |= {f for f in expr.atoms(sp.Function, sp.Pow) if f.is_number}
    for node in sorted(numbers, key=sp.default_sort_key):
        if node.is_Integer and abs(node.p) <= sys.float_info.max:
            continue
        value = sp.Abs(node).evalf(30)
        if not value.is_Number or value == 0 or not value.is_finite:  # infinities print as such
            continue
        if not sys.float_info.min <= value <= sys.float_info.max:
            raise DerivationError(
                f"{where} holds the constant {node} = {sp.sstr(value.evalf(6))}, outside the float64 range "
                f"[{sys.float_info.min:.3g}, {sys.float_info.max:.3g}]: generated code cannot represent it"
            )


class _FunctionTable:
    """Every function of :data:`~derive.codegen.functions.FUNCTIONS` printed as the table spells it for the
    printer's target (:meth:`_spell`), whatever SymPy's own printer would write."""

    def _spell(self, name: str) -> str:
        raise NotImplementedError

    def doprint(self, expr, *args, **kwargs):
        check_functions(sp.sympify(expr), f"the expression {expr}", structural=(Select,))
        return super().doprint(expr, *args, **kwargs)

    def _print_tabled(self, expr):
        return f"{self._spell(type(expr).__name__)}({', '.join(self._print(a) for a in expr.args)})"


for _name in FUNCTIONS:  # SymPy's printers dispatch on _print_<class name>, along the class hierarchy
    setattr(_FunctionTable, f"_print_{_name}", _FunctionTable._print_tabled)


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


class PyPrinter(_FunctionTable, _PowerMixin, NumPyPrinter):
    """Array code for a NumPy-like module: ``numpy.`` ufuncs, Python float literals, powers as products.

    The module is a setting, as in SymPy's ``NumPyPrinter``/``JaxPrinter``: every
    call prints as ``{_module}.name``, so a printer for another array library is a
    subclass that sets ``_module`` (and overrides what that library spells
    differently).
    """

    _module = "numpy"

    def __init__(self, settings=None):
        super().__init__({"fully_qualified_modules": True, **(settings or {})})
        # SymPy spells its tables of known functions and constants "numpy.exp", "numpy.pi" once, at
        # its class definition: respell them for this printer's module
        def respell(table):
            return {k: (self._call(v[len('numpy.'):]) if isinstance(v, str) and v.startswith("numpy.") else v)
                    for k, v in table.items()}

        self._kf = respell(self._kf)
        self.known_functions = respell(self.known_functions)
        self._kc = respell(self._kc)
        self.known_constants = respell(self.known_constants)

    def _one(self) -> str:
        return "1"

    def _spell(self, name: str) -> str:
        spelled = FUNCTIONS[name].numpy
        # numeric.special.erf: NumPy has no erf ufunc (modules using it import it, frameworks bind their own)
        return spelled if spelled == "erf" else self._call(spelled)

    def _call(self, name: str) -> str:
        """``module.name`` for this printer's array module (NumPy's ``name``)."""
        return f"{self._module}.{name}"

    def _sqrt(self) -> str:
        return self._call("sqrt")

    def _cbrt(self) -> str:
        return self._call("cbrt")

    def _print_Pow(self, expr, rational=False):
        out = self._pow_parts(expr)
        if out is not None:
            return out
        b = self._print(expr.base)
        e = self._print(expr.exp)
        return f"{self._call('power')}({b}, {e})"

    def _print_Integer(self, expr):
        return str(expr.p) if abs(expr.p) <= PY_INT_MAX else repr(float(expr))

    def _print_Rational(self, expr):
        if max(abs(expr.p), expr.q) > PY_INT_MAX:
            return repr(float(expr))
        return f"{expr.p}/{expr.q}"

    def _print_Float(self, expr):
        return repr(float(expr))

    def _print_Select(self, expr):
        x, a, b = (self._print(e) for e in expr.args)
        return f"{self._call('where')}({x} >= 0, {a}, {b})"

    def _print_Infinity(self, expr):
        return "math.inf"

    def _print_NegativeInfinity(self, expr):
        return "-math.inf"


class TritonPrinter(PyPrinter):
    """:class:`PyPrinter` for ``triton.language`` (as ``tl``) inside ``@triton.jit`` functions.

    Triton has no power or cube root of its own, nor (that its interpreter runs) ``expm1``,
    ``log1p``, ``tan``, hyperbolic or inverse trigonometric functions: they print as the
    helpers ``rg_pow``, ``rg_cbrt`` and those :data:`~derive.codegen.functions.FUNCTIONS`
    names for Triton, of :mod:`numeric.kernels.triton_math`, which a Triton source imports
    where it calls them.
    """

    _module = "tl"
    _helpers = {"power": "rg_pow", "cbrt": "rg_cbrt"}

    def _spell(self, name: str) -> str:
        return FUNCTIONS[name].triton

    def _call(self, name: str) -> str:
        return self._helpers.get(name) or super()._call(name)

    def _cbrt(self) -> str:
        return "rg_cbrt"

    def _print_Infinity(self, expr):
        return 'float("inf")'

    def _print_Pi(self, expr):  # triton.language has no pi or e
        return repr(float(sp.pi))

    def _print_Exp1(self, expr):
        return repr(float(sp.E))

    def _print_NegativeInfinity(self, expr):
        return 'float("-inf")'


class CudaPrinter(_FunctionTable, _PowerMixin, C99CodePrinter):
    """Type-generic CUDA C++: ``T(...)`` literals and ``rg_*`` math overloads."""

    def _spell(self, name: str) -> str:
        return FUNCTIONS[name].cuda

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
        return str(expr.p) if abs(expr.p) <= C_INT_MAX else f"T({float(expr)!r})"

    def _print_Rational(self, expr):
        if max(abs(expr.p), expr.q) > PY_INT_MAX:
            return f"T({float(expr)!r})"
        return f"T({expr.p}.0/{expr.q}.0)"

    def _print_Select(self, expr):
        x, a, b = (self._print(e) for e in expr.args)
        return f"({x} >= T(0) ? {a} : {b})"

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


def print_block(printer, exprs: list[sp.Expr], where: str, prefix: str = "t", given=(), points=POINTS):
    """Assignments and results of ``exprs`` as strings, checked for printability.

    ``given``: ``(symbol, expr)`` pairs assigned first, in order, each as a
    block of its own; ``exprs`` may use the symbols.  Every expression goes
    through :func:`~derive.codegen.rewrite.stable_form` (with the evaluation ``points``) and numeric
    subexpressions print as values.
    """
    counter = sp.numbered_symbols(prefix, real=True)
    out: list[tuple[str, str]] = []
    for sym, value in given:
        (text,) = _print_block_part(printer, [value], where, counter, out, points)
        out.append((printer._print(sym), text))
    results = _print_block_part(printer, exprs, where, counter, out, points)
    return out, results


def _print_block_part(printer, exprs, where, counter, out, points):
    for e in exprs:
        _check_printable(e, where)
    exprs = [fold_constants(stable_form(reciprocals(e), points)) for e in exprs]
    for e in exprs:
        check_functions(e, where, structural=(Select,))
    assignments, results = blocks(exprs, counter=counter)
    out += [(printer._print(s), printer._print(v)) for s, v in assignments]
    return [printer._print(r) for r in results]
