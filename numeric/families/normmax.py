"""normmax, ``p = argmax_{p in simplex} <p, s> - ||p||_alpha`` (``alpha > 1``): the family :data:`NORMMAX` and its
rules on the row operations (:mod:`numeric.core.ops`), the same text on every backend.

``||p||_alpha`` is not separable, but its homogeneity reduces the map to a separable threshold equation
(:mod:`derive.normmax`): with ``a = (2 alpha - 1) / alpha``, ``r = entmax_a(s / (a - 1))`` has ``r_i = [s_i -
tau]_+^q`` (``q = alpha / (alpha - 1)``) and ``p = r^(1/alpha) / sum r^(1/alpha)`` (:func:`normmax_from`).  The
threshold is solved by the entmax family's rules (at ``alpha = 2``, ``a = 3/2``: 1.5-entmax's exact sort rule);
the Jacobian ``(I - p 1^T) diag(m) (I - 1 p^T)`` is :func:`normmax_vjp` and the Fenchel-Young loss
:func:`normmax_loss`.  No gradient in ``alpha``, no constraint set but the simplex, no fused kernels.

    >>> import numpy as np, numeric as nm
    >>> nm.normmax(np.array([1.0, 0.5, -1.0, 0.2])).round(4)
    array([0.6382, 0.2864, 0.    , 0.0753])
    >>> import torch, numeric.torch as rt
    >>> rt.normmax(torch.tensor([[1.0, 0.5, -1.0, 0.2]]), alpha=3.0)
    tensor([[0.5313, 0.3407, 0.0000, 0.1280]])
    >>> import jax.numpy as jnp, numeric.jax as rj
    >>> [round(v, 4) for v in rj.normmax(jnp.array([1.0, 0.5, -1.0, 0.2]), alpha=3.0).tolist()]
    [0.5313, 0.3407, 0.0, 0.128]
"""

from __future__ import annotations

import math

from ..core.ops import TensorOps
from .base import Family
from .table import register

__all__ = ["Normmax", "NORMMAX", "normmax_from", "normmax_vjp", "normmax_loss"]


def normmax_from(ops: TensorOps, r, alpha):
    """normmax's ``p`` from ``r = entmax_a(s / (a - 1))``, ``a = (2 alpha - 1) / alpha`` (:mod:`derive.normmax`):
    ``p = r^(1/alpha) / sum r^(1/alpha)`` per row, 0 where ``r`` is (a fully masked row: zeros), NaN where ``r``
    is.  ``alpha``: a number or ``(rows, 1)``."""
    pos = r > 0
    w = ops.where(pos, ops.exp(ops.log(ops.where(pos, r, 1)) / alpha), 0)
    w = ops.where(ops.isnan(r), math.nan, w)
    total = ops.row_sum(w)
    return w / ops.where(total > 0, total, 1)


def _normmax_m(ops, p, alpha):
    """``m_i = p_i^(2 - alpha) N^(alpha - 1) / (alpha - 1)`` on the support, ``N = ||p||_alpha``; 0 elsewhere."""
    pos = p > 0
    logp = ops.log(ops.where(pos, p, 1))
    log_n = ops.log(ops.row_sum(ops.where(pos, ops.exp(alpha * logp), 0))) / alpha
    return ops.where(pos, ops.exp((2 - alpha) * logp + (alpha - 1) * log_n) / (alpha - 1), 0)


def normmax_vjp(ops: TensorOps, p, v, alpha):
    """``J v`` of normmax at ``p`` (``J`` is symmetric: also the VJP), ``J = (I - p 1^T) diag(m) (I - 1 p^T)``:
    ``c = m (v - <p, v>)``, then ``c - p sum c`` (:mod:`derive.normmax`)."""
    c = _normmax_m(ops, p, alpha) * (v - ops.row_sum(p * v))
    return c - p * ops.row_sum(c)


def normmax_loss(ops: TensorOps, x, p, y, alpha):
    """normmax's Fenchel-Young loss per row, ``(rows, 1)``: ``||y||_alpha - ||p||_alpha - <y - p, s>`` with ``s`` the
    scores less their row maximum (masked scores left out; mass of the target on one: ``+inf``; a NaN row NaN)."""
    finite = ops.isfinite(x)
    m = ops.row_max(ops.where(finite, x, -math.inf))
    s = ops.where(finite, x - ops.where(ops.isfinite(m), m, 0), 0)

    def norm(q):
        pos = q > 0
        total = ops.row_sum(ops.where(pos, ops.exp(alpha * ops.log(ops.where(pos, q, 1))), 0))
        return ops.where(total > 0, ops.exp(ops.log(ops.where(total > 0, total, 1)) / alpha), 0)

    value = norm(y) - norm(p) - ops.row_sum(ops.where(finite, (y - p) * s, 0))
    value = ops.where(ops.row_max(ops.where(finite, 0, y)) > 0, math.inf, value)
    return ops.where(ops.isnan(ops.row_max(x)), math.nan, value)


class Normmax(Family):
    """normmax as a :class:`~numeric.families.base.Family`: the entmax family at ``a = (2 alpha - 1) / alpha`` on
    the scores ``s / (a - 1) = s alpha / (alpha - 1)``, then :func:`normmax_from`."""

    name = "normmax"
    inner = "entmax"
    parameters = {"alpha": 2.0}
    domains = {"alpha": (1.0, math.inf)}
    summary = ("normmax ``argmax_{p in simplex} <p, s> - ||p||_alpha`` (``alpha > 1``: a number or an array "
               "broadcasting to the scores with size 1 along the map's axis, one per row or head; no gradient in it); "
               "sparse, and at ``alpha = 2`` proportional to the scores shifted by a threshold")
    sparse = True

    def inner_params(self, alpha):
        return {"alpha": (2 * alpha - 1) / alpha}

    def scale(self, alpha):
        return alpha / (alpha - 1)

    def output(self, ops, r, alpha):
        return normmax_from(ops, r, alpha)

    def vjp(self, ops, p, v, alpha):
        return normmax_vjp(ops, p, v, alpha)

    def loss(self, ops, x, p, y, alpha):
        return normmax_loss(ops, x, p, y, alpha)


#: normmax, registered in :data:`numeric.families.table.FAMILIES`
NORMMAX = register(Normmax())
