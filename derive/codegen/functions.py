"""The functions generated code may call, and how each target spells them: one table for every printer.

A derived map's printed expressions (the link, ``omega'``, ``omega''``, ``omega'''``, the weight ``w`` and
``w' w``, ``d omega'/d q``, after :func:`~derive.codegen.rewrite.stable_form`) hold the functions a regularizer
may use (:data:`derive.regularizers.FUNCTIONS` and the few more a SymPy expression may hold), their derivatives
and the functions the stable forms add (``expm1``, ``log1p``, ``asinh``, ``Abs``).  :data:`FUNCTIONS` lists every
one that prints, with its spelling for each target:

* ``numpy``: the name in NumPy's namespace, called as ``numpy.NAME`` (torch and JAX run the same text with
  ``numpy`` bound to their own namespace, :func:`numeric.contract.routines_on`, where every one of these names
  exists); ``erf`` is called bare (NumPy has none: :mod:`numeric.special`, ``torch.special.erf``,
  ``jax.scipy.special.erf`` are bound to it);
* ``cuda``: the float and double overloads of ``numeric/kernels/prelude.cuh`` (C's ``expf``/``exp``, ...);
* ``triton``: ``triton.language``'s own (``tl.exp``, ``tl.log``, ``tl.sin``, ``tl.cos``, ``tl.erf``, ``tl.abs``)
  or a helper of :mod:`numeric.kernels.triton_math` (Triton has no ``tan``, hyperbolic or inverse trigonometric
  function its interpreter can run: they are written there in ``exp``, ``log`` and ``sqrt``).

Reciprocal functions that SymPy's simplification may produce (``sec``, ``csc``, ``cot``, ``sech``, ``csch``,
``coth``) are rewritten as ``1/cos`` and so on (:func:`reciprocals`).  Any other function is refused when the
code is generated (:func:`check_functions`), naming it, rather than printed as code that fails when it runs:
``LambertW``, ``erfc``, ``gamma``, ``Max``, ...
"""

from __future__ import annotations

from typing import NamedTuple

import sympy as sp

from ..errors import DerivationError

__all__ = ["Spelling", "FUNCTIONS", "RECIPROCALS", "TRITON_HELPERS", "reciprocals", "check_functions"]


class Spelling(NamedTuple):
    """One function's name in each target's generated code."""

    numpy: str
    cuda: str
    triton: str


#: SymPy function name (``type(f).__name__``) -> its spelling in each target.  Powers, square and cube roots
#: print through ``Pow`` (``numpy.power``/``rg_pow``, ``sqrt``, ``cbrt``), ``Select`` as a conditional.
FUNCTIONS: dict[str, Spelling] = {
    "exp": Spelling("exp", "rg_exp", "tl.exp"),
    "log": Spelling("log", "rg_log", "tl.log"),
    "expm1": Spelling("expm1", "rg_expm1", "rg_expm1"),
    "log1p": Spelling("log1p", "rg_log1p", "rg_log1p"),
    "sin": Spelling("sin", "rg_sin", "tl.sin"),
    "cos": Spelling("cos", "rg_cos", "tl.cos"),
    "tan": Spelling("tan", "rg_tan", "rg_tan"),
    "sinh": Spelling("sinh", "rg_sinh", "rg_sinh"),
    "cosh": Spelling("cosh", "rg_cosh", "rg_cosh"),
    "tanh": Spelling("tanh", "rg_tanh", "rg_tanh"),
    "asinh": Spelling("arcsinh", "rg_asinh", "rg_asinh"),
    "acosh": Spelling("arccosh", "rg_acosh", "rg_acosh"),
    "atanh": Spelling("arctanh", "rg_atanh", "rg_atanh"),
    "asin": Spelling("arcsin", "rg_asin", "rg_asin"),
    "acos": Spelling("arccos", "rg_acos", "rg_acos"),
    "atan": Spelling("arctan", "rg_atan", "rg_atan"),
    "erf": Spelling("erf", "rg_erf", "tl.erf"),
    "Abs": Spelling("abs", "rg_fabs", "tl.abs"),
}

#: The helpers of :mod:`numeric.kernels.triton_math` a map's Triton source may call (powers and cube roots
#: through ``rg_pow`` and ``rg_cbrt``, the rest by :data:`FUNCTIONS`), in the order its import line names them.
TRITON_HELPERS: tuple[str, ...] = ("rg_pow", "rg_cbrt") + tuple(dict.fromkeys(
    s.triton for s in FUNCTIONS.values() if not s.triton.startswith("tl.")))

#: Reciprocal functions as the reciprocals of printable ones.
RECIPROCALS = {sp.sec: sp.cos, sp.csc: sp.sin, sp.cot: sp.tan, sp.sech: sp.cosh, sp.csch: sp.sinh, sp.coth: sp.tanh}


def reciprocals(expr: sp.Expr) -> sp.Expr:
    """``expr`` with ``sec(u)`` as ``1/cos(u)``, ``coth(u)`` as ``1/tanh(u)`` and so on (:data:`RECIPROCALS`)."""
    if not expr.has(*RECIPROCALS):
        return expr
    return expr.replace(lambda e: type(e) in RECIPROCALS, lambda e: 1 / RECIPROCALS[type(e)](*e.args))


def check_functions(expr: sp.Expr, where: str, structural=()) -> None:
    """Raise :class:`DerivationError` naming the first function in ``expr`` outside :data:`FUNCTIONS` (and the
    classes ``structural`` that the printers print themselves): the generated code could not call it."""
    for node in sp.preorder_traversal(expr):
        if isinstance(node, (sp.Function, sp.Min, sp.Max)) and type(node).__name__ not in FUNCTIONS \
                and not isinstance(node, tuple(structural)):
            name = type(node).__name__
            raise DerivationError(
                f"{where} contains the function {name} ({sp.sstr(node)}), which generated code cannot compute: "
                f"NumPy, CUDA C and Triton all compute only {', '.join(sorted(FUNCTIONS))}, powers and roots"
            )
