"""normmax, ``argmax_{p in simplex} <p, s> - ||p||_alpha`` (``alpha > 1``), on JAX arrays.

As on NumPy and torch (:mod:`numeric.normmax`): the entmax family's threshold at ``a = (2 alpha - 1) / alpha`` on
the scores ``s / (a - 1)`` gives ``r``, and ``p = r^(1/alpha)`` normalised
(:func:`numeric.families.normmax.normmax_from`); a :func:`jax.custom_jvp` whose JVP is the derived symmetric
Jacobian from ``p`` (:func:`~numeric.families.normmax.normmax_vjp`), so reverse mode transposes it and it
differentiates again.  ``alpha`` has no derivative: a call differentiated in it raises.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from .. import front
from ..constraints import simplex_only, split
from ..families.normmax import normmax_from, normmax_loss, normmax_vjp
from ._ops import ops_for
from .maps import ARRAYS, CLASSES, JaxMap, map_rows, as_scores, compute_dtype

__all__ = ["JaxNormmax", "normmax"]

_NO_ALPHA = "normmax has no gradient in alpha (only in the scores)"


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _normmax_rows(solver, x, alpha):
    """normmax of the rows ``x`` (2-D), ``alpha`` of shape ``()`` or ``(rows, 1)``; ``solver``: the entmax
    family's at ``a``."""
    a = (2 * alpha - 1) / alpha
    r = map_rows(solver, x * (alpha / (alpha - 1)), (a,))
    return normmax_from(ops_for(x.dtype), r, alpha)


def _normmax_rows_jvp(solver, primals, tangents):
    x, alpha = primals
    dx, dalpha = tangents
    if not isinstance(dalpha, SymbolicZero):
        raise ValueError(_NO_ALPHA)
    p = _normmax_rows(solver, x, alpha)
    if isinstance(dx, SymbolicZero):
        return p, jnp.zeros_like(p)
    return p, normmax_vjp(ops_for(p.dtype), p, dx, alpha)


_normmax_rows.defjvp(_normmax_rows_jvp, symbolic_zeros=True)
_normmax_rows_jit = jax.jit(_normmax_rows, static_argnums=0)


def _check_alpha_first(alpha):
    from ..normmax import check_normmax_alpha_first

    check_normmax_alpha_first(alpha, ARRAYS.readable)


def _check_alpha(alpha):
    from ..normmax import check_normmax_alpha

    value = alpha if isinstance(alpha, float) else ARRAYS.readable(alpha)
    if value is not None:
        check_normmax_alpha(value)


@partial(jax.tree_util.register_pytree_node_class)
class JaxNormmax(JaxMap):
    """normmax on JAX arrays (module docstring); ``alpha`` a number or an array with size 1 along the axis.

    >>> import jax.numpy as jnp
    >>> JaxNormmax(alpha=2.0)(jnp.array([1.0, 0.5, -1.0, 0.2])).round(4)
    Array([0.6382, 0.2864, 0.    , 0.0753], dtype=float32)
    """

    def __init__(self, alpha=2.0):
        _check_alpha_first(alpha)
        super().__init__("entmax", alpha=alpha)

    @property
    def name(self) -> str:
        return "normmax"

    def __repr__(self) -> str:
        a = self.params["alpha"]
        return f"JaxNormmax(alpha={a!r})" if isinstance(a, float) else f"JaxNormmax(alpha=<array {tuple(jnp.shape(a))}>)"

    def __call__(self, x, axis: int = -1, **kwargs):
        """normmax of ``x`` along ``axis``: same shape and dtype."""
        constraints, params = split(kwargs)
        simplex_only(constraints, "normmax")
        x = as_scores(x)
        axis = front.check_axis(x.shape, axis)
        if "alpha" in params:
            _check_alpha_first(params["alpha"])
        values = self.values(params)
        _check_alpha(values["alpha"])
        dtype = compute_dtype(x.dtype)
        moved = jnp.moveaxis(x.astype(dtype), axis, -1)
        flat = moved.reshape(-1, x.shape[axis])
        alpha = self.param_rows("alpha", values["alpha"], tuple(x.shape), axis, dtype)
        v = values["alpha"] if isinstance(values["alpha"], float) else jnp.asarray(values["alpha"])
        p = _normmax_rows_jit(self.solver_for({"alpha": (2 * v - 1) / v}), flat, alpha)
        return jnp.moveaxis(p.reshape(moved.shape), -1, axis).astype(x.dtype)

    def loss_rows(self, xc, y, axis: int):
        """The loss per row for :func:`numeric.jax.fenchel_young_loss` (:func:`_loss_of`)."""
        return _loss_of(self, xc, y, axis)


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _loss_rows(solver, x, y, alpha):
    """normmax's Fenchel-Young loss per row of the 2-D ``x`` against ``y`` (:func:`numeric.families.normmax.normmax_loss`)."""
    return normmax_loss(ops_for(x.dtype), x, _normmax_rows(solver, x, alpha), y, alpha)[..., 0]


def _loss_rows_jvp(solver, primals, tangents):
    x, y, alpha = primals
    dx, _, dalpha = tangents  # (the target is a constant)
    if not isinstance(dalpha, SymbolicZero):
        raise ValueError(_NO_ALPHA)
    p = _normmax_rows(solver, x, alpha)
    value = normmax_loss(ops_for(x.dtype), x, p, y, alpha)[..., 0]
    return value, (jnp.zeros_like(value) if isinstance(dx, SymbolicZero) else jnp.sum((p - y) * dx, axis=-1))


_loss_rows.defjvp(_loss_rows_jvp, symbolic_zeros=True)
_loss_rows_jit = jax.jit(_loss_rows, static_argnums=0)


def _loss_of(m, xc, y, axis: int):
    """The loss per row (batch shape) of the scores ``xc`` (compute dtype) against the checked target ``y``:
    :func:`numeric.jax.fenchel_young_loss` for normmax, with the gradient ``p - y`` in the scores."""
    n = xc.shape[axis]
    rows = lambda a: jnp.moveaxis(a, axis, -1).reshape(-1, n)  # noqa: E731
    alpha = m.params["alpha"]
    v = alpha if isinstance(alpha, float) else jnp.asarray(alpha)
    a_rows = m.param_rows("alpha", alpha, tuple(xc.shape), axis, xc.dtype)
    value = _loss_rows_jit(m.solver_for({"alpha": (2 * v - 1) / v}), rows(xc), rows(y), a_rows)
    return value.reshape(xc.shape[:axis] + xc.shape[axis + 1:])


CLASSES["normmax"] = JaxNormmax


def normmax(x, alpha=2.0, axis: int = -1):
    """normmax ``argmax_{p in simplex} <p, s> - ||p||_alpha`` along ``axis`` (:class:`JaxNormmax`).

    >>> import jax.numpy as jnp
    >>> [round(v, 4) for v in normmax(jnp.array([1.0, 0.5, -1.0, 0.2]), alpha=3.0).tolist()]
    [0.5313, 0.3407, 0.0, 0.128]
    """
    return JaxNormmax(alpha=alpha)(x, axis=axis)
