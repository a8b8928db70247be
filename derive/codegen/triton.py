"""The map's part of the Triton attention kernels: its scalar functions as ``@triton.jit`` functions.

:func:`triton_source` returns the text of a Python module (``TRITON_SOURCE`` of a
generated map module); :mod:`numeric.torch.fused` writes it to a file, imports
it and launches the package's kernels (:mod:`numeric.kernels.triton_attention`)
with its functions as their ``MAP`` argument.  The module holds the map's pieces
printed for Triton (:class:`~derive.codegen.printers.TritonPrinter`), each
taking the tuple of the map's parameters last:

* ``params(Params, offset)``: that tuple, loaded from ``Params + offset``;
* ``link(z, params)`` (``g = (omega')^{-1}``), ``weight(p, params)``
  (``w = 1/omega''``), ``omega_prime(p, params)``, ``clip(params)``
  (``omega'(0+)``), and for the threshold's Halley steps ``omega_second``,
  ``omega_third`` and ``weight_d2`` (``w' w``).

A link with no closed form is ``newton_link`` of ``numeric/_generated/newton_link_triton.py``
(:func:`numeric.newton.invert_link` traced into Triton once, as it is traced into
CUDA: Newton's method on ``omega'(p) = z`` for every entry of a block at once)
called with the module's ``omega_prime`` and ``omega_second``.
"""

from __future__ import annotations

import re

import sympy as sp

from .functions import TRITON_HELPERS
from .printers import TritonPrinter, print_block
from .rewrite import POINTS

__all__ = ["triton_source", "PIECES"]

#: The map's pieces the kernels call, by the names they have in the source (``omega_second`` is also what the
#: inversion of a link with no closed form calls).
PIECES = ("link", "weight", "omega_prime", "clip", "omega_second", "omega_third", "weight_d2")


def _function(name: str, args: list[str], expr: sp.Expr, arg: sp.Symbol | None, printer: TritonPrinter,
              params: list[str], points=POINTS) -> str:
    """``@triton.jit def name(*args, params): return expr``; an expression without its first argument ``arg`` is
    broadcast to that argument's shape (the kernels call the functions on blocks); ``points``: where it is
    evaluated."""
    assigns, (result,) = print_block(printer, [expr], f"triton {name}(...) = {expr}", points=points)
    lines = ["@triton.jit", f"def {name}({', '.join(args + ['params'])}):"]
    code = "\n".join([rhs for _, rhs in assigns] + [result])
    lines += [f"    {q} = params[{i}]" for i, q in enumerate(params) if re.search(rf"\b{q}\b", code)]
    lines += [f"    {lhs} = {rhs}" for lhs, rhs in assigns]
    if expr.is_number:
        result = repr(float(expr)) if expr.is_finite else ("float('inf')" if expr > 0 else "float('-inf')")
    if arg is not None and not expr.has(arg):
        result = f"tl.zeros_like({args[0]}) + {result}"
    lines.append(f"    return {result}")
    return "\n".join(lines)


_NEWTON_LINK = """@triton.jit
def link(z, params):
    # omega'(p) = z for p: no closed form; numeric.newton.invert_link, traced
    return newton_link(z, params, omega_prime, omega_second)"""


def triton_source(pieces: dict, params: list[str], points=POINTS) -> str:
    """The Triton module's text for a map with the pieces :data:`PIECES` (``{name: (args, expr, first argument's
    symbol or None)}``; ``link`` is missing for a link with no closed form);
    ``points``: where the pieces are evaluated (:func:`~derive.codegen.rewrite.stable_form`)."""
    printer = TritonPrinter()
    names = [n for n in PIECES if n in pieces]
    fns = [_function(name, list(pieces[name][0]), pieces[name][1], pieces[name][2], printer, params, points)
           for name in names]
    if "link" not in pieces:
        fns.insert(0, _NEWTON_LINK)
    loads = ", ".join(f"tl.load(Params + offset + {i})" for i in range(len(params)))
    load = ["@triton.jit", "def params(Params, offset):", f"    return ({loads}{',' if len(params) == 1 else ''})"]
    code = "\n".join(fns)
    helpers = [h for h in TRITON_HELPERS if re.search(rf"\b{h}\(", code)]
    return "\n".join([
        "# Triton functions of one regattn map (derive.codegen.triton) for numeric.kernels.triton_attention",
        "",
        "import triton",
        "import triton.language as tl",
        *([f"from numeric.kernels.triton_math import {', '.join(helpers)}"] if helpers else []),
        *(["from numeric._generated.newton_link_triton import newton_link"] if "link" not in pieces else []),
        "",
        "",
        "\n\n\n".join(["\n".join(load)] + fns),
        "",
    ])
