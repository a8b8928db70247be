"""The box constraint ``0 <= p <= upper``, ``sum p = total`` (:mod:`derive.box`) on the row operations
(:mod:`numeric.core.ops`), every map: its row solve (:func:`box_solve`, in the pieces the fused Triton attention
traces: :func:`box_high`, :func:`box_lowest`, :func:`box_sums`, :func:`box_round`), its feasibility rule
(:func:`box_short`), its derivatives in the scores, the bounds and the total (:func:`box_vjp`, :func:`box_jvp`,
:func:`box_exits`) and the gradient of its Fenchel-Young loss in the bounds (:func:`box_multipliers`).
"""

from __future__ import annotations

import math

import numpy as np

from ..core.derivatives import centred, weights
from ..core.halley import LOG_STEPS, ROOT_STEPS, clipped_link, narrow_bracket, threshold_round
from ..core.ops import Routines, TensorOps
from ..front import is_number
from .base import ConstraintSet, lay_out, left_out
from .table import register

__all__ = ["Box", "BOX", "box_rows", "box_solve", "box_between", "box_short", "box_high", "box_lowest", "box_ceiling", "box_sums", "box_round",
           "box_free", "box_exits", "box_vjp", "box_jvp", "box_multipliers"]


def box_solve(ops: TensorOps, r: Routines, x, upper, total, steps: int = ROOT_STEPS):
    """``(p, tau)`` for the rows of ``x`` (2-D) with ``0 <= p <= upper`` and ``sum p = total``:
    ``p_i = min(u_i, g_+(s_i - tau))`` (:mod:`derive.box`), every map (its link, or the link inverted).

    ``upper``: ``x``'s shape, ``>= 0`` (``inf``: no bound); ``total``: ``(rows, 1)``, finite and ``> 0``; a row
    with a NaN or negative bound or a total outside ``(0, inf)`` gives NaN (``p`` and ``tau``), as does one with a
    NaN or ``+inf`` score, and a fully masked row zeros (``tau = inf``); the bounds of each
    row's unmasked entries must sum to at least its total, within ``sqrt(eps)`` of it (the front end checks it,
    :func:`numeric.constraints.box.box_rows`, by :func:`box_short`; a row where they do not gives NaN; one short within it is
    solved with its total taken as the room: every entry saturates, ``p = u``).  ``F(tau) = sum_i min(u_i, g_+(s_i -
    tau))`` decreases; its root of ``F = total`` is bracketed by
    ``hi = max(s) - omega'(total / n)`` (every entry at most ``total / n``) and ``lo = min_i s_i -
    omega'(min(u_i, total))`` over the entries that can hold mass (each at least ``min(u_i, total)``; an entry
    whose ``s_i - tau`` passes ``omega'(inf)`` where ``omega'`` is bounded counts as ``g = inf``), and found
    by Newton steps in that bracket (the rounds of :func:`~numeric.core.halley.threshold_round`; ``F' = -sum w`` over the free
    entries ``0 < p_i < u_i``).  The free entries are then scaled to sum to ``total`` less the saturated ones.
    """
    m = ops.row_max(x)
    bad = ops.not_(ops.isfinite(m))
    # rows that give NaN: a NaN or +inf score (as the plain map), a total not finite and > 0, a NaN or negative
    # bound (eager calls refuse the last two by name, box_rows; a traced call cannot raise)
    invalid = (ops.isnan(m) | (m > 0) & bad | ops.not_((total > 0) & (total < float("inf")))
               | (ops.row_sum(ops.float_(ops.not_(upper >= 0))) > 0))
    m0 = ops.where(bad, 0, m)
    y = ops.where(bad, 0, x - m0)
    live = ops.isfinite(x) & (upper > 0) & ops.not_(bad)
    room = ops.row_sum(ops.where(live, upper, 0))
    # bounds short of the total by at most sqrt(eps) of it are feasible, with the total taken as the room (their
    # rounding: box_short); every entry saturates there
    feasible = ops.not_(box_short(total, room, ops.eps))
    total = ops.where(feasible & (room < total), room, total)
    count = ops.row_sum(ops.float_(ops.isfinite(x)))
    clip = r.clip()
    hi = box_high(ops, r, total, count)
    lo = box_lowest(ops, r, y, upper, total, live)
    # (moved out by 4 resolutions of s - t: where omega'(u_i) rounds to omega'(0+), a link steeper than the
    # resolution, F at the computed end may still be below the total)
    lo = lo - 4 * ops.eps * (1 + abs(ops.where(ops.isfinite(lo), lo, 0)))
    lo = ops.where(lo < hi, lo, hi)
    ceiling = box_ceiling(ops, r, m)

    def sums(t):
        return box_sums(ops, r, y, t, upper, live, clip, ceiling)

    def body(state):
        t, lo, hi, step, step_old, active = state
        _, f, slope, _, _ = sums(t)
        return box_round(ops, t, lo, hi, step, step_old, active, f, slope, total, 1)

    width = hi - lo
    going = ops.not_(bad | invalid) & feasible
    state = (ops.where(going, (lo + hi) / 2, 0), lo, hi, width, width, going)
    t, lo, hi = ops.repeat(steps, body, state, going)[:3]
    p, _, _, free, saturated = sums(t)
    rest = total - ops.row_sum(ops.where(saturated, upper, 0))
    share = ops.row_sum(ops.where(free, p, 0))
    scaled = p * (rest / ops.where(share > 0, share, 1))
    p = ops.where(free & (share > 0), ops.where(scaled < upper, scaled, upper), p)
    # rows whose free entries cannot hold the rest to sqrt(eps) (or there is none): F jumps across the total
    # between thresholds that s - t cannot tell apart, a link steeper than the resolution (alpha-entmax at large
    # alpha)
    jump = going & ((abs(rest - share) > total * math.sqrt(ops.eps)) | ((share <= 0) & (rest != 0)))
    p, t = ops.rare(jump, lambda: box_between(ops, r, y, t, lo, hi, p, upper, total, live, clip, ceiling, jump, steps),
                    lambda: (p, t))
    nan = ops.full(m, float("nan"))
    nan_rows = invalid | ops.not_(bad) & ops.not_(feasible)  # (a fully masked row: zeros, tau = inf)
    p = ops.where(nan_rows, nan, ops.where(bad, 0, p))
    tau = ops.where(nan_rows, nan, ops.where(bad, float("inf"), m0 + t))
    return p, tau


def box_between(ops, r: Routines, y, t, lo, hi, p, upper, total, live, clip, ceiling, rows, steps: int = ROOT_STEPS):
    """``(p, t)`` of :func:`box_solve` on the ``rows`` whose ``F`` jumps across the total between two thresholds
    that ``y - t`` cannot tell apart (its other rows keep ``p`` and ``t``).

    The bracket ``[lo, hi]`` is first bisected to the resolution of ``y - t`` (or to ``F = total`` within ``4
    eps``).  Between its ends each entry's link goes from ``a_i = g_+(y_i - hi)`` to ``b_i = g_+(y_i - lo)``
    (both capped at the total, which no entry exceeds); the entries that move there are those whose ``y_i - tau``
    is the same to that resolution, sharing one level ``q`` of the link: ``p_i = min(u_i, a_i + theta (b_i -
    a_i))``, ``theta`` in ``[0, 1]`` the root of ``S(theta) = sum p_i = total``.  ``S`` is piecewise linear,
    increasing and concave, so Newton's steps from ``theta = 0`` (``S(0) = F(hi) <= total``) stay below the
    root and reach it in at most one step per bound they pass; a last blend towards ``p`` at ``theta = 1`` (or 0)
    makes the sum the total to rounding.  ``t`` becomes ``hi - theta (hi - lo)``.
    """
    def sums(t):
        return box_sums(ops, r, y, t, upper, live, clip, ceiling)

    def bisect(state):
        t, lo, hi, step, step_old, active = state
        _, f, _, _, _ = sums(t)
        return box_round(ops, t, lo, hi, step, step_old, active, f, 0 * f, total, 1)

    width = hi - lo
    state = (ops.where(rows, lo + 0.5 * width, t), lo, hi, width, width, rows)
    t_mid, lo, hi = ops.repeat(LOG_STEPS, bisect, state, rows)[:3]
    p_mid, f_mid, _, _, _ = sums(t_mid)
    exact = abs(f_mid - total) <= 4 * ops.eps * total
    lo, hi = ops.where(exact, t_mid, lo), ops.where(exact, t_mid, hi)

    def link(t):
        g, _ = clipped_link(ops, r, y, t, clip, ceiling=ceiling)
        return ops.where(live, ops.where(g < total, g, total), 0)

    a, b = link(hi), link(lo)
    rise = b - a

    def level(theta):
        q = a + theta * rise
        below = q < upper
        return ops.where(below, q, upper), ops.where(below, rise, 0)

    def newton(state):
        theta, active = state
        q, slope = level(theta)
        s, ds = ops.row_sum(q), ops.row_sum(slope)
        new = theta + (total - s) / ops.where(ds > 0, ds, 1)
        new = ops.where(new < 1, new, 1)
        going = active & (s < total) & (ds > 0) & (new > theta)
        return (ops.where(going, new, theta), going), going

    theta = ops.repeat(steps, newton, (ops.full(t, 0.0), rows), rows)[0]
    q, _ = level(theta)
    s = ops.row_sum(q)
    other, _ = level(ops.where(s < total, 1.0, 0.0))
    s_other = ops.row_sum(other)
    gap = s_other - s
    blend = ops.where(gap != 0, (total - s) / ops.where(gap != 0, gap, 1), 0)
    q = q + blend * (other - q)
    return ops.where(rows, q, p), ops.where(rows, hi - theta * (hi - lo), t)


def box_short(total, room, eps):
    """Where bounds summing to ``room`` cannot hold ``total``: ``total - room > sqrt(eps) * total`` (a shortfall
    within ``sqrt(eps)`` of the total is rounding: the total is clipped to the room).  The one rule of
    :func:`box_solve` and of the front end's check (:func:`numeric.constraints.box.box_rows`)."""
    return total - room > total * math.sqrt(eps)


def box_high(ops, r: Routines, total, count):
    """The right end of the bounded threshold's bracket, ``-omega'(total / n)`` for ``n`` keys (every entry at
    most ``total / n`` there), relative to the row's largest score."""
    return -r.omega_prime(total / ops.where(count > 0, count, 1))


def box_lowest(ops, r: Routines, y, upper, total, live):
    """The left end of the bounded threshold's bracket before it is capped at :func:`box_high`: the least
    ``y_i - omega'(min(u_i, total))`` over the entries ``live`` (those that can hold mass: each holds at least
    ``min(u_i, total)`` left of it), ``inf`` in a row with none.  A minimum, so that a kernel takes it key
    block by key block."""
    cap = ops.where(upper < total, upper, total)
    reach = y - r.omega_prime(ops.where(live, cap, total))
    return -ops.row_max(ops.where(live, -reach, float("-inf")))


def box_ceiling(ops, r: Routines, like):
    """``omega'(inf)`` where ``omega'`` is bounded above (:func:`~numeric.core.halley.clipped_link`'s ``ceiling``),
    else ``inf``."""
    ceiling = r.omega_prime(ops.full(like, float("inf")))  # (NaN where omega' has no value at inf: no ceiling)
    return ops.where(ops.isnan(ceiling), float("inf"), ceiling)


def box_sums(ops, r: Routines, y, t, upper, live, clip, ceiling, peak=None):
    """``(p, F, -F', free, saturated)`` at the threshold ``t`` of the scores ``y`` (shifted by their row's
    largest, or ``peak`` as in :func:`~numeric.core.halley.clipped_link`) bounded by ``upper``: ``p_i = min(u_i,
    g_+(y_i - t))`` on the entries ``live``, 0 elsewhere, its row sums, the row sums of ``w`` over the free entries ``0 < p_i <
    u_i``, and where entries are free and where saturated.  Sums over a block of a row's keys add up to the
    row's (the fused attention's passes)."""
    g, pos = clipped_link(ops, r, y, t, clip, peak=peak, ceiling=ceiling)
    saturated = live & (g >= upper)
    p = ops.where(saturated, upper, ops.where(live, g, 0))
    free = pos & live & ops.not_(saturated)
    w = ops.where(free, r.weight(ops.where(free, g, 1)), 0)
    return p, ops.row_sum(p), ops.row_sum(w), free, saturated


def box_round(ops, t, lo, hi, step, step_old, active, f, slope, total, scale):
    """One Newton round of the bounded threshold's solve of ``F(t) = total`` at ``t``, ``F`` being ``f`` and
    ``-F'`` ``slope`` there (:func:`box_sums`): the bracket narrowed and :func:`~numeric.core.halley.threshold_round`
    on ``F / total``;
    returns ``(t, lo, hi, step, step_old, active)``.  ``scale``: as :func:`~numeric.core.halley.threshold_round`'s."""
    lo, hi = narrow_bracket(ops, t, lo, hi, active, f / total)
    point = t + (f - total) / ops.where(slope > 0, slope, 1)
    usable = ops.isfinite(point) & (slope > 0)
    t, step, step_old, going, _, _ = threshold_round(ops, t, lo, hi, step, step_old, active, f / total,
                                                     -slope / total, point, usable, scale)
    return (t, lo, hi, step, step_old, going), going


def box_free(ops: TensorOps, p, upper):
    """Where ``p`` is free of its bounds, ``0 < p < upper`` (the entries the Jacobian moves)."""
    return (p > 0) & (p < upper)


def box_exits(ops: TensorOps, r: Routines, p, upper, w, x):
    """``(w, saturated)`` for the bounds' and the total's derivatives at the bounded map's ``p`` (:mod:`derive.box`):
    the weights ``w`` of the free entries ``0 < p_i < u_i`` and the saturated entries ``p_j = u_j > 0``, except in
    a row where no entry is free (``W = 0``).

    There ``p`` is piecewise constant in the bounds and the total with a kink at the point itself (``sum p =
    total`` always: a bound raised must take its mass from another entry), and the derivatives are one-sided: the
    side on which ``tau`` rises, the right-derivative in each bound and the left-derivative in the total (the side
    that stays feasible where the bounds sum to the total).  As ``tau`` rises the saturated entries that leave
    their bound first, ``K``, those with the least ``s_k - omega'(u_k)``, become free: they stand in for the free
    entries with their weights at the bound, ``w_k = 1 / omega''(u_k)``, and are not counted saturated.  So
    ``dp/du_j = e_j - w_K / W_K`` for a saturated ``j`` outside ``K`` (0 for one in it) and ``dp/dc = w_K / W_K``:
    ``d sum(p)/du = 0``, ``d sum(p)/dc = 1``.  ``x``: the scores (``None``: the free entries as they are, 0 in a
    row with none).  ``w``: the free entries' weights, 0 elsewhere."""
    saturated = (p >= upper) & (p > 0)
    if x is None:
        return w, saturated
    none = (ops.row_sum(w) <= 0) & (ops.row_sum(ops.float_(saturated)) > 0)

    def exits():
        gap = ops.where(saturated, x - r.omega_prime(ops.where(saturated, upper, 1)), math.inf)
        first = saturated & (gap <= -ops.row_max(-gap)) & none
        w_k = ops.where(first, r.weight(ops.where(first, upper, 1)), 0)
        return ops.where(none, w_k, w), saturated & ops.not_(first)

    return ops.rare(none, exits, lambda: (w, saturated))


def box_vjp(ops: TensorOps, r: Routines, p, v, upper, at_zero=None, x=None):
    """``(J v, dp/du^T v, dp/dc^T v)`` of the bounded map at ``p`` (:mod:`derive.box`): ``J v`` the simplex's on the
    free entries (:func:`~numeric.core.derivatives.jvp`; ``J`` is symmetric), ``v_j - (w.v)/sum w`` on the saturated
    entries ``j`` (0 elsewhere) and ``(w.v)/sum w`` per row (``(rows, 1)``).  In a row where no entry is free ``J = 0`` and the
    bounds' and the total's are one-sided, :func:`box_exits` (``x``: the scores it needs; ``None``: 0 there)."""
    w_free = ops.where(box_free(ops, p, upper), weights(ops, r, p, at_zero), 0)
    jv, _ = centred(ops, w_free, v)
    w, saturated = box_exits(ops, r, p, upper, w_free, x)
    _, mean = centred(ops, w, v)
    nan = ops.isnan(ops.row_sum(p))  # (a NaN row's derivatives are NaN, as the plain map's)
    return (ops.where(nan, math.nan, jv), ops.where(nan, math.nan, ops.where(saturated, v - mean, 0)),
            ops.where(nan, math.nan, mean))


def box_jvp(ops: TensorOps, r: Routines, p, dx, du, dc, upper, at_zero=None, x=None):
    """``J_s dx + J_u du + J_c dc``: the bounded map's tangent at ``p`` (:mod:`derive.box`), the transpose of
    :func:`box_vjp` for forward mode.  On the free entries ``dp_i = w_i (dx_i - dtau)``, on the saturated ones
    ``dp_j = du_j``, elsewhere 0, with ``dtau = (sum_free w dx + sum_sat du - dc) / sum_free w`` keeping ``sum p =
    total``.  ``du`` (``upper``'s shape) and ``dc`` (``(rows, 1)``) may be ``0``; a map parameter's tangent ``dq``
    enters as ``dx = -dq omega'_q(p)`` on the free entries.  In a row where no entry is free ``dx`` moves nothing
    and ``du``, ``dc`` move ``p`` one-sidedly (:func:`box_exits`, given the scores ``x``)."""
    w_free = ops.where(box_free(ops, p, upper), weights(ops, r, p, at_zero), 0)
    w, saturated = box_exits(ops, r, p, upper, w_free, x)
    moved = ops.where(saturated, du, 0)
    total = ops.row_sum(w)
    shift = ops.row_sum(w_free * dx) + ops.row_sum(moved) - dc
    dtau = ops.where(total > 0, shift / ops.where(total > 0, total, 1), 0)
    dp = w_free * dx - w * dtau + moved
    # a NaN row's tangent is NaN: added as NaN times the tangents, linear in them, so that the transpose (reverse
    # mode, which JAX derives from this) is NaN there too (a where with a NaN constant transposes to 0)
    nan = ops.where(ops.isnan(ops.row_sum(p)), math.nan, 0)
    return dp + nan * (dx + du - dc)


def box_multipliers(ops: TensorOps, r: Routines, x, tau, upper):
    """The multipliers ``mu_i = [s_i - tau - omega'(u_i)]_+`` of the bounds ``p_i <= u_i`` at the bounded map's
    threshold ``tau`` (``(rows, 1)``, unshifted): the gradient of ``Omega*`` over the box, and so of the
    Fenchel-Young loss, in the bounds (:func:`derive.box.box_loss_gradients`).  0 where ``u_i = inf`` or the score
    is masked; ``+inf`` where ``u_i = 0`` and ``omega'(0+) = -inf`` (softmax: the first mass has an infinite
    marginal value); NaN in a NaN row.  The gradient in the total is ``tau`` itself."""
    bounded = ops.isfinite(upper) & ops.isfinite(x)
    z = ops.where(bounded, x - tau, 0) - r.omega_prime(ops.where(bounded, upper, 1))
    mu = ops.where(bounded & (z > 0), z, 0)
    return ops.where(ops.isnan(tau), math.nan, mu)


def box_rows(xp, arrays, x, upper, total, axis: int, word: str = "axis"):
    """``(upper, total)`` of a bounded call as rows of the scores ``x`` flattened with ``axis`` last: ``(rows, n)``
    bounds (``inf``: none) and ``(rows, 1)`` totals, in ``x``'s dtype, checked (``arrays``: the front end's
    :class:`numeric.front.Arrays`).

    ``upper``: ``None``, a number or an array broadcasting to the scores, ``>= 0``; ``total``: a number or an array
    broadcasting to the scores with size 1 along the map's axis, finite and ``> 0`` (a NaN or negative bound, or a
    total outside ``(0, inf)``, is refused by name; traced values, which cannot be read, give NaN rows instead,
    :func:`box_solve`).  Where the values can be read (:meth:`numeric.front.Arrays.readable`) the bounds of each
    row's unmasked scores must sum to at least its total, within ``sqrt(eps)`` of it (``sqrt(eps) * total``:
    float64 1.5e-8, float32 3.5e-4) ("infeasible bounds", with the row and the two sums); a fully masked row is
    exempt (it gives zeros).  Bounds computed from other sums (what is left of a budget, ``fertility - attention
    so far``) carry the rounding of those sums, which is relative to their magnitudes, not to the total's, and
    which the bounds do not show: ``sqrt(eps)`` (the target's slack in :func:`numeric.front.check_target`) covers
    it for any reasonable accumulation.  A row short of its total within it is solved with the total taken as its
    room (:func:`box_solve`: every entry saturates, ``p = u``); :func:`box_short` is the rule.
    """
    shape, n = tuple(x.shape), x.shape[axis]
    rows = math.prod(shape) // n
    u = lay_out(xp, arrays, x, math.inf if upper is None else upper, "upper", True, axis, word)
    c = lay_out(xp, arrays, x, total, "total", False, axis, word)
    # (a number is read even inside a trace, whose arrays full() makes cannot be)
    ru = np.float64(upper) if is_number(upper) else arrays.readable(u)
    rc = np.full((1, 1), float(total)) if is_number(total) else arrays.readable(c)
    rx = arrays.readable(x)
    if ru is not None and bool((ru != ru).any() | (ru < 0).any()):
        raise ValueError(f"upper must be >= 0 everywhere (inf: no bound), got {float(ru[~(ru >= 0)].reshape(-1)[0])!r}")
    if rc is not None and not bool(((rc > 0) & (rc < math.inf)).all()):
        raise ValueError(f"total must be finite and > 0, got {float(rc[~((rc > 0) & (rc < math.inf))].reshape(-1)[0])!r}")
    ru = arrays.readable(u) if is_number(upper) else ru
    rc = arrays.readable(c) if is_number(total) else rc
    if ru is not None and rc is not None and rx is not None:
        live = xp.moveaxis(rx, axis, -1).reshape(rows, n) != -math.inf  # (a NaN counts: its row comes out NaN)
        room = xp.where(live, ru, 0).sum(axis=-1)
        # (within sqrt(eps) of the total: feasible, the total clipped to the room; a fully masked row gives zeros)
        short = box_short(rc[:, 0], room, arrays.eps(x.dtype)) & live.any(axis=-1)
        if bool(short.any()):
            i = int((room - rc[:, 0]).argmin())
            raise ValueError(f"infeasible bounds: in row {i} the upper bounds of the unmasked scores sum to "
                             f"{float(room[i]):.6g} < total = {float(rc[i, 0]):.6g}")
    return u, c


class Box(ConstraintSet):
    """The box ``0 <= p <= upper``, ``sum p = total`` (``upper=``: a number or an array broadcasting to the
    scores, ``None`` for none; ``total=``: a number or an array with size 1 along the map's axis); a call that
    gives a bound or a total other than the number 1 selects it."""

    name = "box"
    keywords = {"upper": None, "total": 1.0}
    per_score = frozenset({"upper"})
    free = {"upper": math.inf}
    needs_scores = True
    fused = "box"

    def fused_arguments(self, values: dict) -> dict:
        return {"upper": values["upper"]}

    def asks(self, values: dict) -> bool:
        return values["total"] is not None and not (left_out(values["upper"], None) and left_out(values["total"], 1.0))

    def rows(self, xp, arrays, x, values: dict, axis: int, word: str = "axis") -> tuple:
        return box_rows(xp, arrays, x, values["upper"], values["total"], axis, word)

    def solve(self, ops, r, x, upper, total):
        return box_solve(ops, r, x, upper, total)

    def vjp(self, ops, r, p, v, upper, total, at_zero=None, x=None):
        js, ju, jc = box_vjp(ops, r, p, v, upper, at_zero, x)
        return js, (ju, jc)

    def jvp(self, ops, r, p, dx, tangents: tuple, upper, total, at_zero=None, x=None):
        du, dc = tangents
        return box_jvp(ops, r, p, dx, du, dc, upper, at_zero, x)

    def moving(self, ops, p, upper, total):
        return box_free(ops, p, upper)

    def loss_gradients(self, ops, r, x, tau, upper, total, p=None, y=None) -> tuple:
        return box_multipliers(ops, r, x, tau, upper), tau

    def check_target(self, xp, target, rows: tuple, slack: float, word: str, axis: int):
        u, c = rows
        if c is None:
            return None
        total = target.sum(axis=-1)
        off = abs(total - c[:, 0])
        if bool((target < 0).any()) or not float(off.max()) <= slack * max(1.0, float(c.max())):  # (NaN fails)
            what = ("a negative entry" if bool((target < 0).any()) else
                    f"a row summing to {float(total.reshape(-1)[int(off.reshape(-1).argmax())])!r}")
            return (f"target must be a distribution along {word} {axis} (non-negative, summing to its total within "
                    f"{slack:.1e}); it has {what}")
        if u is not None and bool((target - u > slack).any()):
            return (f"target must lie within the upper bounds; an entry exceeds its bound by "
                    f"{float((target - u).max()):.6g}")
        return None


#: the box (``upper=``, ``total=``), in :data:`numeric.constraints.SETS`
BOX = register(Box())
