"""The link ``g = (omega')^-1`` of a generated module, clipped: ``g_+(z)``, in NumPy.

:func:`clipped_link` evaluates ``g_+(z)``: the link where ``z > omega'(0+)``,
exactly 0 elsewhere (masked scores, ``-inf``, included).  It takes the power
form for a root-threshold map whose link is derived to have it, else the
module's printed ``link``; links with no printable closed form (``mod.link is
None``) are inverted by :func:`newton_link`, the safeguarded Newton solve of
:mod:`numeric.newton`.

Links derived to be of the power form ``(a (z - omega'(0+)))**k``
(alpha-entmax, sparsemax, ``omega = p**n``; ``LINK_FORM == "power"``, see
:mod:`derive._linkform`) have their ``(a, k)`` from :func:`power_link`;
:func:`power` evaluates ``base**k`` as ``exp(k log(base))``.
"""

from __future__ import annotations

from types import ModuleType
from typing import NamedTuple

import numpy as np

from .newton import numpy_invert_link

__all__ = ["clipped_link", "newton_link", "power_link", "Power", "power"]


def newton_link(mod: ModuleType, z: np.ndarray, params: tuple) -> np.ndarray:
    """``p = g(z)`` solving ``omega'(p) = z`` for ``z > omega'(0+)``, elementwise (:mod:`numeric.newton`)."""
    return numpy_invert_link(z, lambda q: mod.omega_prime(q, *params), lambda q: mod.omega_second(q, *params))


class Power(NamedTuple):
    """The link ``g(z) = (a (z - clip))**k`` of a module with ``LINK_FORM == "power"`` at given parameters."""

    a: float  # scale
    k: float  # exponent


def power_link(mod: ModuleType, params: tuple) -> Power | None:
    """``(a, k)`` where ``mod``'s link is derived to be ``(a (z - omega'(0+)))**k``, else ``None``.

    alpha-entmax (``a = alpha - 1``, ``k = 1/(alpha - 1)``), sparsemax, entmax15 and
    maps such as ``omega = p**n`` have this form (:mod:`derive._linkform`).  The
    root solver then works on the link's base: the Jacobian weight
    ``w = a k p / base`` and ``g'' = a**2 k (k - 1) p / base**2`` cost a division
    each instead of a power each (``numeric.root._power_sums``), and nothing cancels
    where the base is small (``numeric.root._root_solve``).
    """
    if getattr(mod, "LINK_FORM", "general") != "power":
        return None
    return Power(float(mod.link_scale(*params)), float(mod.link_exponent(*params)))


def _power_form_link(z: np.ndarray, pw: Power, clip, overwrite: bool) -> np.ndarray:
    """``max(a (z - clip), 0)**k``: the clipped link of the power form in four passes."""
    dtype = z.dtype
    base = np.multiply(z, dtype.type(pw.a), out=z if overwrite else None)
    base -= dtype.type(pw.a * clip)
    np.fmax(base, np.zeros(base.shape[-1:], dtype=dtype), out=base)  # 0 where z <= omega'(0+), -inf too
    return base if pw.k == 1 else power(base, dtype.type(pw.k))


def power(base: np.ndarray, k, out: np.ndarray | None = None) -> np.ndarray:
    """``base**k`` into ``out`` (default: in place) for ``base >= 0``, ``k > 0``, as ``exp(k log(base))``.

    NumPy's power takes ~11 ns per zero base here (a slow path of libm's pow), 4x its
    average, and ~20 ns on bases whose power underflows; log and exp are vectorised
    and map 0 to -inf to 0.  The rounding of ``k log(base)`` adds a relative error of
    about ``|log p| eps`` to ``p``: for ``p <= 1`` (all the solvers meet: the base is
    at most 1 once ``tau >= max(s) - omega'(1)``) an absolute error of at most
    ``eps / e``, beyond the two functions' own ulps.
    """
    out = base if out is None else out
    with np.errstate(divide="ignore", under="ignore"):
        np.log(base, out=out)
        out *= k
        return np.exp(out, out=out)


def clipped_link(mod: ModuleType, z: np.ndarray, params: tuple, *, overwrite: bool = False) -> np.ndarray:
    """``g_+(z)``: the link where ``z > omega'(0+)``, exactly 0 elsewhere (``-inf`` included).

    ``overwrite=True`` lets a link of degree 1 or of the power form write into ``z``.
    """
    dtype = z.dtype
    clip = mod.clip(*params)
    pw = power_link(mod, params)
    if pw is not None and mod.THRESHOLD == "root":  # (sort maps keep their printed links, degree 1 or 2)
        return _power_form_link(z, pw, clip, overwrite)
    if (pw is not None and pw.k == 1 and mod.link is not None
            and mod.link(np.asarray(clip, dtype=dtype), *params) == 0):
        # an increasing affine link that rounds to 0 at omega'(0+) (sparsemax: g(z) = z) is
        # <= 0 exactly where z <= omega'(0+), so one fmax clips it (-inf and all)
        with np.errstate(invalid="ignore", over="ignore"):
            g = np.asarray(mod.link(z, *params), dtype=dtype)
            # np.fmax with an array of zeros: a scalar 0 takes a loop 3x slower
            return np.fmax(g, np.zeros(g.shape[-1:], dtype=dtype), out=g if (overwrite or g is not z) else None)
    live = z > clip
    if mod.link is None:
        out = np.zeros(z.shape, dtype=dtype)
        out[live] = newton_link(mod, z[live], params)
        return out

    def link(values):
        # Just above omega'(0+) the link's base, e.g. (alpha - 1) z + 1/alpha, can round
        # below 0 and give NaN where the exact value is ~0: fmax makes that 0.
        with np.errstate(under="ignore", invalid="ignore", over="ignore"):
            return np.fmax(mod.link(values, *params), 0).astype(dtype, copy=False)

    if np.isfinite(clip):
        idx = np.flatnonzero(live)
        if 2 * idx.size < live.size:  # a sparse map with small supports: evaluate the link there only
            out = np.zeros(z.shape, dtype=dtype)
            out.ravel()[idx] = link(z.ravel()[idx])
            return out
        # on max(z, omega'(0+)) the link is 0 up to rounding; the mask makes clipped entries
        # exactly 0 (mask arithmetic: np.where is ~20x slower on random masks)
        return link(np.maximum(z, clip)) * live
    return link(z)
