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
    r = tl.exp(tl.log(tl.abs(x)) / 3.0)
    return tl.where(x < 0, -r, r)


@triton.jit
def rg_expm1(x):
    # Kahan: exact where exp(x) rounds to 1, otherwise (u - 1) x / log(u) cancels exp's rounding; the quotient
    # is formed on harmless stand-ins where it is not taken (tl.where evaluates both branches: no 0/0, inf/inf)
    u = tl.exp(x)
    taken = (u != 1.0) & (u - 1.0 != -1.0) & (u < float("inf"))
    us = tl.where(taken, u, 2.0)
    r = (us - 1.0) * tl.where(taken, x, 1.0) / tl.log(us)
    return tl.where(u == 1.0, x, tl.where(u - 1.0 == -1.0, -1.0, tl.where(taken, r, u)))


@triton.jit
def rg_log1p(x):
    # log(u) x / (u - 1) with u = 1 + x cancels the rounding of u; stand-ins where it is not taken, as above
    u = 1.0 + x
    taken = (u != 1.0) & (u < float("inf"))
    us = tl.where(taken, u, 2.0)
    r = tl.log(us) * tl.where(taken, x, 1.0) / (us - 1.0)
    return tl.where(u == 1.0, x, tl.where(taken, r, u))
