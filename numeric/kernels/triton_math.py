"""Math functions Triton lacks, for the maps' generated ``@triton.jit`` functions (``TRITON_SOURCE``).

:class:`derive.codegen.printers.TritonPrinter` prints powers, cube roots, ``expm1``
and ``log1p`` as calls of these; a map's Triton source imports those it calls.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["rg_pow", "rg_cbrt", "rg_expm1", "rg_log1p"]


@triton.jit
def rg_pow(x, y):
    # x**y for x >= 0 (the links' bases are clipped to their domain before this is called)
    return tl.exp(y * tl.log(x))


@triton.jit
def rg_cbrt(x):
    return tl.where(x < 0, -tl.exp(tl.log(-x) / 3.0), tl.exp(tl.log(x) / 3.0))


@triton.jit
def rg_expm1(x):
    # Kahan: exact where exp(x) rounds to 1, otherwise (u - 1) x / log(u) cancels exp's rounding
    u = tl.exp(x)
    return tl.where(u == 1.0, x, tl.where(u - 1.0 == -1.0, -1.0, (u - 1.0) * x / tl.log(u)))


@triton.jit
def rg_log1p(x):
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.log(u) * x / (u - 1.0))
