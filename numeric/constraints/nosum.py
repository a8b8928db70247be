"""No sum constraint: ``0 <= p <= upper`` alone (``total=None``), every map (:mod:`derive.nosum`, the reference).

Each score is its own one-dimensional problem, ``p_i = argmax_{0 <= q <= u_i} q s_i - omega(q)``, so

* ``p_i = min(u_i, g_+(s_i))``: the link at the score itself, clipped to 0 below ``omega'(0+)`` and to the bound
  above; there is no threshold (``tau = 0``) and no shift invariance;
* its Jacobian is diagonal, ``dp_i/ds_i = w_i = 1 / omega''(p_i)`` on the free entries ``0 < p_i < u_i`` (0
  elsewhere), and ``dp_j/du_j = 1`` on the saturated ones ``p_j = u_j > 0``;
* its Fenchel-Young loss is ``sum_i omega(y_i) - omega(p_i) - (y_i - p_i) s_i`` with the scores as they are, its
  gradient ``p - y`` in the scores and ``[s_i - omega'(u_i)]_+`` in the bounds; the target lies in the box.

The binary entropy ``p log p + (1 - p) log(1 - p)`` gives the logistic sigmoid (its loss the logistic loss), Gini
``p^2 / 2`` ReLU, Shannon's ``p log p`` ``exp(s - 1)``.  A score ``+inf`` gives the bound (``inf`` without one), a
masked score (``-inf``) 0, a NaN score or bound NaN, entry by entry.
"""

from __future__ import annotations

import math

from ..core.derivatives import weights
from ..core.halley import clipped_link
from ..front import is_number
from .base import ConstraintSet, lay_out
from .box import box_ceiling, box_free, box_multipliers
from .table import register

__all__ = ["NoSum", "NO_SUM", "nosum_solve", "nosum_vjp", "nosum_jvp"]


def nosum_solve(ops, r, x, upper):
    """``(p, tau)``: ``p_i = min(u_i, g_+(s_i))`` for the rows of ``x`` (2-D) and bounds ``upper`` (``x``'s shape,
    ``inf``: none), ``tau = 0`` (``(rows, 1)``).

    A printed link with a clip ``omega'(0+)`` that is a number needs no masks where every score lies below the
    ceiling ``omega'(inf)``: ``p = min(g(max(s, clip)), u)``, the link being 0 at the clip (checked: one value a
    row), or ``min(g(s), u)`` where the clip is ``-inf`` (the sigmoid's, Shannon's ``exp(s - 1)``) and every
    score is finite.  A target that runs each operation as it comes skips the masks then
    (:meth:`~numeric.core.ops.TensorOps.rare`).
    """
    zero = ops.full(x[..., :1], 0.0)
    clip, ceiling = r.clip(), box_ceiling(ops, r, zero)

    def clipped():
        # (the clipped link is 0 at a score of -inf and at a NaN one, which the last line makes NaN)
        g, _ = clipped_link(ops, r, x, zero, clip, ceiling=ceiling)
        p = ops.where(g < upper, g, upper)
        return ops.where(ops.isnan(x) | ops.isnan(upper), math.nan, p)

    if r.has("link") and is_number(clip):
        if clip == -math.inf:
            y, odd = x, ops.not_((x > -math.inf) & (x < ceiling))  # (a score of +-inf or NaN, or beyond the ceiling)
        else:  # (scores at or below the clip to the clip, where the link is 0, a test of one value a row)
            y = ops.clamp_min(x, clip)
            odd = ops.not_(x < ceiling) | (r.link(ops.full(zero, clip)) != 0)
        return ops.rare(odd, clipped, lambda: ops.below(r.link(y), upper)), zero
    return clipped(), zero


def nosum_vjp(ops, r, p, v, upper, at_zero=None):
    """``(J v, dp/du^T v)`` at ``p``: ``w v`` on the free entries ``0 < p < u`` and ``v`` on the saturated ones
    ``p = u > 0`` (``J`` is diagonal: also the JVP in the scores)."""
    free = box_free(ops, p, upper)
    w = ops.where(free, weights(ops, r, p, at_zero), 0)
    nan = ops.isnan(p)
    return ops.where(nan, math.nan, w * v), ops.where(nan, math.nan, ops.where((p >= upper) & (p > 0), v, 0))


def nosum_jvp(ops, r, p, dx, du, upper, at_zero=None):
    """``J_s dx + J_u du`` at ``p``: ``w dx`` on the free entries, ``du`` on the saturated ones (``du`` may be 0)."""
    w = ops.where(box_free(ops, p, upper), weights(ops, r, p, at_zero), 0)
    # a NaN entry's tangent is NaN, linear in the tangents so that its transpose (JAX's reverse mode) is NaN too
    nan = ops.where(ops.isnan(p), math.nan, 0)
    return w * dx + ops.where((p >= upper) & (p > 0), du, 0) + nan * (dx + du)


class NoSum(ConstraintSet):
    """The box ``0 <= p <= upper`` with no sum constraint (see the module's docstring): selected by ``total=None``;
    ``upper=``: a number or an array broadcasting to the scores, ``None`` for none."""

    name = "no-sum"
    keywords = {"upper": None}
    marks = {"total": None}
    per_score = frozenset({"upper"})
    free = {"upper": math.inf}
    summed = False
    fused = "nosum"

    def fused_arguments(self, values: dict) -> dict:
        return {"nosum": True}

    def asks(self, values: dict) -> bool:
        return values["total"] is None

    def rows(self, xp, arrays, x, values: dict, axis: int, word: str = "axis") -> tuple:
        upper = values["upper"]
        u = lay_out(xp, arrays, x, math.inf if upper is None else upper, "upper", True, axis, word)
        ru = arrays.readable(u)
        if ru is not None and bool((ru < 0).any()):
            raise ValueError(f"upper must be >= 0 everywhere (inf: no bound), got {float(ru[ru < 0].reshape(-1)[0])!r}")
        return (u,)

    def solve(self, ops, r, x, upper):
        return nosum_solve(ops, r, x, upper)

    def vjp(self, ops, r, p, v, upper, at_zero=None, x=None):
        js, ju = nosum_vjp(ops, r, p, v, upper, at_zero)
        return js, (ju,)

    def jvp(self, ops, r, p, dx, tangents: tuple, upper, at_zero=None, x=None):
        (du,) = tangents
        return nosum_jvp(ops, r, p, dx, du, upper, at_zero)

    def moving(self, ops, p, upper):
        return box_free(ops, p, upper)

    def loss_gradients(self, ops, r, x, tau, upper, p=None, y=None) -> tuple:
        return (box_multipliers(ops, r, x, 0 * tau, upper),)

    def check_target(self, xp, target, rows: tuple, slack: float, word: str, axis: int):
        (u,) = rows
        if bool((target < -slack).any()) or bool((target != target).any()):
            return f"target must be non-negative along {word} {axis}; it has {float(target[~(target >= 0)].reshape(-1)[0])!r}"
        if u is not None and bool((target - u > slack).any()):
            return (f"target must lie within the upper bounds; an entry exceeds its bound by "
                    f"{float((target - u).max()):.6g}")
        return None


#: no sum constraint (``total=None``, ``upper=``), in :data:`numeric.constraints.SETS`
NO_SUM = register(NoSum())
