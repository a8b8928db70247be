"""normmax's rules on the row operations (:mod:`numeric.core.ops`): ``p`` from an entmax's (:func:`normmax_from`),
its Jacobian's product (:func:`normmax_vjp`) and its Fenchel-Young loss (:func:`normmax_loss`), :mod:`derive.normmax`.
"""

from __future__ import annotations

import math

from ..core.ops import TensorOps

__all__ = ["normmax_from", "normmax_vjp", "normmax_loss"]


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
