"""normmax, ``p = argmax_{p in simplex} <p, s> - ||p||_alpha`` (``alpha > 1``), on NumPy and CuPy arrays.

``||p||_alpha`` is not separable, but its homogeneity reduces the map to a separable threshold equation
(:mod:`derive.normmax`): with ``a = (2 alpha - 1) / alpha``, ``r = entmax_a(s / (a - 1))`` has ``r_i = [s_i -
tau]_+^q`` (``q = alpha / (alpha - 1)``) and ``p = r^(1/alpha) / sum r^(1/alpha)``.  The threshold is solved by
the entmax family's rules (at ``alpha = 2``, ``a = 3/2``: 1.5-entmax's exact sort rule), the rest is
:func:`numeric.families.normmax.normmax_from`; the Jacobian ``(I - p 1^T) diag(m) (I - 1 p^T)`` and the
Fenchel-Young loss are :func:`~numeric.families.normmax.normmax_vjp` and :func:`~numeric.families.normmax.normmax_loss`,
the same text on every backend.
"""

from __future__ import annotations

import numpy as np

from . import front
from .constraints import simplex_only
from .core.array_ops import ArrayOps
from .families.normmax import normmax_from, normmax_loss, normmax_vjp
from .backend import array_module, to_compute_dtype
from .front import check_axis
from .maps import CLASSES, Map, to_rows, tangent_rows, import_map_module

__all__ = ["NormmaxMap", "normmax", "check_normmax_alpha"]


def check_normmax_alpha(values) -> None:
    """normmax's ``alpha`` must be ``> 1`` and finite (readable values: a number or an array)."""
    a = np.asarray(values, dtype=np.float64)
    if not bool(((a > 1) & np.isfinite(a)).all()):
        bad = a[~((a > 1) & np.isfinite(a))].reshape(-1)[0]
        raise ValueError(f"normmax needs alpha > 1 (finite), got {float(bad)!r}")


def check_normmax_alpha_first(alpha, readable=np.asarray) -> None:
    """:func:`check_normmax_alpha` before the entmax family's check of its own domain ``(0, inf)`` (normmax
    solves through that map, whose message would name entmax for ``alpha = inf``, ``nan`` or ``-2``): for
    ``alpha`` a real number or an array of a real dtype (NumPy, JAX or torch), its values ``readable(alpha)``
    (``None`` inside a trace: not checked here).  Anything else is left to that check's :class:`TypeError`."""
    if front.is_number(alpha):
        check_normmax_alpha(alpha)
        return
    kind = getattr(getattr(alpha, "dtype", None), "kind", None)  # (NumPy and JAX dtypes)
    floating = getattr(alpha, "is_floating_point", None)  # (a torch tensor)
    if kind in ("i", "u", "f") or (callable(floating) and floating()):
        values = readable(alpha)
        if values is not None:
            check_normmax_alpha(values)


class NormmaxMap(Map):
    """normmax as a :class:`~numeric.maps.Map`: the same calls (``m(x, axis)``, ``forward``, ``jvp``/``vjp``,
    ``loss``/``loss_and_grad``), ``alpha`` a number or an array with size 1 along the axis (per row, per head);
    it solves through the entmax family's map at ``a = (2 alpha - 1) / alpha``.  No box constraints, and no
    gradient in ``alpha`` (``vjp_params`` raises).

    >>> import numpy as np
    >>> NormmaxMap(alpha=2.0)(np.array([1.0, 0.5, -1.0, 0.2])).round(4)
    array([0.6382, 0.2864, 0.    , 0.0753])
    """

    def __init__(self, alpha=2.0, threshold: str = "auto"):
        check_normmax_alpha_first(alpha)
        super().__init__(import_map_module("entmax"), threshold, alpha=alpha)

    @property
    def name(self) -> str:
        return "normmax"

    @property
    def sparse(self) -> bool:
        return True

    def __repr__(self) -> str:
        a = self.params["alpha"]
        return f"NormmaxMap(alpha={a!r})" if not isinstance(a, np.ndarray) else f"NormmaxMap(alpha=<array {a.shape}>)"

    def _inner(self, x, axis, xp):
        """``(the entmax map at a, alpha broadcasting against x, a - 1 likewise)``."""
        alpha = self.params["alpha"]
        a = (2 * alpha - 1) / alpha
        inner = Map(self.module, "auto" if self._auto else self.threshold, alpha=a)
        (values,) = self._values_like(x, axis, xp)
        return inner, values, (values - 1) / values

    def forward(self, x, axis: int = -1, *, overwrite: bool = False, **constraints):
        """``(p, tau)``: normmax along ``axis`` and the threshold of each row (``sum_i [s_i - tau]_+^q = 1``)."""
        simplex_only(constraints, "normmax")
        xp = array_module(x)
        x, out_dtype = to_compute_dtype(x, xp)
        axis = check_axis(x.shape, axis)
        inner, alpha, scale = self._inner(x, axis, xp)
        with np.errstate(invalid="ignore"):  # (-inf / positive stays -inf; NaN rows stay NaN)
            r, tau = inner.forward(x / scale, axis, overwrite=True)
        rows, restore = to_rows(r, axis)
        alpha_rows = to_rows(xp.broadcast_to(alpha, x.shape), axis)[0][:, :1] if hasattr(alpha, "shape") else alpha
        with np.errstate(divide="ignore", invalid="ignore"):
            p = normmax_from(ArrayOps(xp, x.dtype), rows, alpha_rows)
        return restore(p).astype(out_dtype, copy=False), tau

    def _alpha_rows(self, y, axis, xp):
        (alpha,) = self._values_like(y, axis, xp)
        return to_rows(xp.broadcast_to(alpha, y.shape), axis)[0][:, :1] if hasattr(alpha, "shape") else alpha

    def jvp(self, y, dx, axis: int = -1, **constraints):
        """``J dx`` at ``y = normmax(x)``: ``J = (I - p 1^T) diag(m) (I - 1 p^T)`` (:mod:`derive.normmax`)."""
        simplex_only(constraints, "normmax")
        backend, xp, y, out_dtype, axis, fy, fd, restore = tangent_rows(y, dx, axis, "tangent")
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = normmax_vjp(ArrayOps(xp, y.dtype), fy, fd, self._alpha_rows(y, axis, xp))
        return restore(out).astype(out_dtype, copy=False)

    def vjp(self, y, dy, axis: int = -1, **constraints):
        """``J^T dy``; ``J`` is symmetric, so this equals :meth:`jvp`."""
        return self.jvp(y, dy, axis=axis, **constraints)

    def vjp_params(self, y, dy, axis: int = -1, *, reduce: bool = False, **constraints) -> dict:
        raise NotImplementedError("normmax has no gradient in alpha (only in the scores)")

    def loss_and_grad(self, x, target, axis: int = -1, reduction: str = "mean", *, bounds: bool = False,
                      **constraints):
        """``(loss, dloss/dx)``: the Fenchel-Young loss ``Omega*(s) + ||y||_alpha - <s, y>`` and ``p - y``, with the
        conventions of :meth:`numeric.Map.loss_and_grad` (no box constraints)."""
        simplex_only(constraints, "normmax")
        if bounds:
            raise ValueError("normmax takes no box constraints (bounds=True): its regularizer is not separable")
        front.check_reduction(reduction)
        xp = array_module(x, target)
        x, out_dtype = to_compute_dtype(x, xp)
        axis = check_axis(x.shape, axis)
        y = front.check_target(x, xp.asarray(target), axis, front.Arrays(xp))
        p = self(x, axis=axis).astype(x.dtype, copy=False)
        rows = [to_rows(a, axis)[0] for a in (x, p, y)]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            value = normmax_loss(ArrayOps(xp, x.dtype), *rows, self._alpha_rows(x, axis, xp))
        value = value.reshape(x.shape[:axis] + x.shape[axis + 1:])
        grad = p - y
        if reduction == "mean":
            grad = grad / max(1, value.size)
        return front.reduce(value, reduction).astype(out_dtype), grad.astype(out_dtype)


CLASSES["normmax"] = NormmaxMap


def normmax(x, alpha=2.0, axis: int = -1):
    """normmax ``argmax_{p in simplex} <p, s> - ||p||_alpha`` along ``axis`` (``alpha > 1``: a number or an array
    broadcasting to ``x`` with size 1 along ``axis``); sparse, and at ``alpha = 2`` proportional to the scores
    shifted by a threshold (:class:`NormmaxMap`)."""
    return NormmaxMap(alpha=alpha)(x, axis=axis)
