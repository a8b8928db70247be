"""Math functions Triton lacks, for the maps' generated ``@triton.jit`` functions (``TRITON_SOURCE``).

:class:`derive.codegen.printers.TritonPrinter` prints powers, cube roots, ``expm1``, ``log1p``, ``tan``, the
hyperbolic functions and the inverse trigonometric and hyperbolic functions as calls of these (the table is
:data:`derive.codegen.functions.FUNCTIONS`); a map's Triton source imports those it calls.  ``triton.language``
has ``exp``, ``log``, ``sqrt``, ``sin``, ``cos`` and ``erf``; libdevice has the rest on a GPU, but Triton's
interpreter (which runs the kernels on CPU tensors) cannot call libdevice, so each is written here in those
functions, in a form without cancellation:

* ``sinh a = (u + u/(u + 1))/2`` with ``u = expm1(a)``, ``cosh a = (e + 1/e)/2`` with ``e = exp(a)``, both
  ``(h/2) h`` with ``h = exp(a/2)`` past ``a = 20`` (where ``exp(-a)`` is below float64's resolution: finite up
  to their own overflow); ``tanh a = -u/(u + 2)`` with ``u = expm1(-2a)`` (``a`` cut at 20, where it rounds to 1);
* ``asinh a = log1p(a + a^2/(1 + sqrt(1 + a^2)))``, ``acosh x = log1p(t + sqrt(t (t + 2)))`` with
  ``t = x - 1``, both ``log(a) + log(2)`` past ``2**28``; ``atanh a = log1p(2a/(1 - a))/2``;
* ``atan``: ``pi/2 - atan(1/a)`` past 1, then the argument halved twice by
  ``atan y = 2 atan(y/(1 + sqrt(1 + y^2)))`` to at most ``tan(pi/16) < 0.2``, where 12 terms of its series
  reach float64's resolution; ``asin x = 2 atan(x/(1 + sqrt((1 - x)(1 + x))))`` and
  ``acos x = 2 atan(sqrt((1 - x)/(1 + x)))`` (``pi`` minus that of ``-x`` for ``x < 0``);
* ``tan = sin/cos``.

Odd functions are computed at ``a = |x|`` and given ``x``'s sign.  ``tl.where`` evaluates both of its branches:
the branch not taken is computed on a stand-in argument where it could divide 0 by 0, overflow or take the log of
0 (the interpreter runs on NumPy, which warns), and every branch condition sends NaN to a branch that keeps it.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["rg_pow", "rg_cbrt", "rg_expm1", "rg_log1p", "rg_tan", "rg_sinh", "rg_cosh", "rg_tanh", "rg_asinh",
           "rg_acosh", "rg_atanh", "rg_asin", "rg_acos", "rg_atan"]

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


@triton.jit
def rg_tan(x):
    return tl.sin(x) / tl.cos(x)


@triton.jit
def rg_sinh(x):
    a = tl.abs(x)
    large = a > 20.0
    u = rg_expm1(tl.where(large, 20.0, a))
    h = tl.exp(0.5 * tl.where(large, a, 0.0))
    r = tl.where(large, (0.5 * h) * h, 0.5 * (u + u / (u + 1.0)))
    return tl.where(x < 0, -r, r)


@triton.jit
def rg_cosh(x):
    a = tl.abs(x)
    large = a > 20.0
    e = tl.exp(tl.where(large, 20.0, a))
    h = tl.exp(0.5 * tl.where(large, a, 0.0))
    return tl.where(large, (0.5 * h) * h, 0.5 * (e + 1.0 / e))


@triton.jit
def rg_tanh(x):
    # past 20, tanh rounds to 1 in float64 (1 - tanh(20) < 2**-55): the argument is cut there (no overflow of 2a)
    a = tl.abs(x)
    u = rg_expm1(-2.0 * tl.where(a > 20.0, 20.0, a))  # in [-1, 0]: u + 2 >= 1 does not cancel
    r = -u / (u + 2.0)
    return tl.where(x < 0, -r, r)


@triton.jit
def rg_asinh(x):
    a = tl.abs(x)
    large = a > 268435456.0  # 2**28
    m = tl.where(large, 1.0, a)
    r = tl.where(large, tl.log(tl.where(large, a, 1.0)) + 0.6931471805599453,
                 rg_log1p(m + m * m / (1.0 + tl.sqrt(1.0 + m * m))))
    return tl.where(x < 0, -r, r)


@triton.jit
def rg_acosh(x):
    # for x >= 1 (NaN below); t = x - 1 is exact for x in [1, 2], where acosh cancels as written with log
    large = x > 268435456.0  # 2**28
    t = tl.where(large, 1.0, x) - 1.0
    return tl.where(large, tl.log(tl.where(large, x, 1.0)) + 0.6931471805599453,
                    rg_log1p(t + tl.sqrt(t * (t + 2.0))))


@triton.jit
def rg_atanh(x):
    # for |x| <= 1; 1 - a is exact for a in [1/2, 1]
    a = tl.abs(x)
    r = 0.5 * rg_log1p(2.0 * a / (1.0 - a))
    return tl.where(x < 0, -r, r)


@triton.jit
def _atan_unit(y):
    # atan(y) for 0 <= y <= 1: two halvings to y <= tan(pi/16), then 12 terms of y - y^3/3 + y^5/5 - ...
    y = y / (1.0 + tl.sqrt(1.0 + y * y))
    y = y / (1.0 + tl.sqrt(1.0 + y * y))
    t = y * y
    s = 1.0 / 21.0 - t / 23.0
    s = 1.0 / 19.0 - t * s
    s = 1.0 / 17.0 - t * s
    s = 1.0 / 15.0 - t * s
    s = 1.0 / 13.0 - t * s
    s = 1.0 / 11.0 - t * s
    s = 1.0 / 9.0 - t * s
    s = 1.0 / 7.0 - t * s
    s = 1.0 / 5.0 - t * s
    s = 1.0 / 3.0 - t * s
    s = 1.0 - t * s
    return 4.0 * (y * s)


@triton.jit
def rg_atan(x):
    a = tl.abs(x)
    large = a > 1.0
    r = _atan_unit(tl.where(large, 1.0 / tl.where(large, a, 1.0), a))
    r = tl.where(large, 1.5707963267948966 - r, r)
    return tl.where(x < 0, -r, r)


@triton.jit
def rg_asin(x):
    # for |x| <= 1: tan(asin(x)/2) = x/(1 + cos(asin x)), at most 1 in magnitude
    a = tl.abs(x)
    r = 2.0 * _atan_unit(a / (1.0 + tl.sqrt((1.0 - a) * (1.0 + a))))
    return tl.where(x < 0, -r, r)


@triton.jit
def rg_acos(x):
    # for |x| <= 1: tan(acos(a)/2) = sqrt((1 - a)/(1 + a)) in [0, 1]; acos(-a) = pi - acos(a)
    a = tl.abs(x)
    r = 2.0 * _atan_unit(tl.sqrt((1.0 - a) / (1.0 + a)))
    return tl.where(x < 0, 3.141592653589793 - r, r)
