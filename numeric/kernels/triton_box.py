"""The box constraint set's hooks in the fused Triton forward and backward (:mod:`numeric.kernels.triton_attention`
with ``SET = "box"``): ``p = min(u, g_+(s - tau))`` with ``0 <= p <= u`` and ``sum p = 1``.

The kernels' passes over the keys call them on each key block (its scores ``s`` and bounds ``u``) and between the
passes on each query block's rows, as ``[BLOCK_M, 1]`` columns (the traced pieces reduce keeping the axis).  The
pieces are those of :func:`numeric.constraints.box.box_solve`, traced by ``regattn generate``
(``numeric._generated.newton_link_triton``): ``box_high`` and ``box_lowest`` (the bracket), ``box_sums`` (a
block's ``F``, ``-F'`` and its entries' classification, free or at their bound) and ``box_round`` (a Newton or
bisection round of the rows); the rows' sums add up over the key blocks.
"""

from __future__ import annotations

import triton
import triton.language as tl

from numeric import contract, trust

_traced = contract.check_format(trust.import_generated("numeric._generated.newton_link_triton"))
#: the bounded threshold's solve in pieces, traced from numeric.constraints.box.box_solve's (generated)
box_high = _traced.box_high
box_lowest = _traced.box_lowest
box_sums = _traced.box_sums
box_round = _traced.box_round

__all__ = ["box_round", "bounds", "box_at", "box_first", "box_bracket", "box_block_sums", "box_jump", "box_divisor"]


@triton.jit
def bounds(Upper, u_base, offs_m, start, L, S, su_l, su_s, BLOCK_N: tl.constexpr):
    # the bounds of the query block on the keys start:start+BLOCK_N, as float32 (0 out of range)
    offs_n = start + tl.arange(0, BLOCK_N)
    return tl.load(Upper + u_base + offs_m[:, None] * su_l + offs_n[None, :] * su_s,
                   mask=(offs_m[:, None] < L) & (offs_n[None, :] < S), other=0.0).to(tl.float32)


@triton.jit
def box_at(s, u, tau, ceiling, z_one, MAP: tl.constexpr, params):
    # (min(u, g_+(s - tau)), free, saturated) for the scores s of a block of rows at their thresholds tau
    # ([BLOCK_M, 1]; inf in a fully masked row, whose scores are all -inf; NaN in a NaN row, whose p is NaN):
    # box_sums on the scores as they are.  The forward's output pass and the backward classify the entries with
    # this one computation, so that the backward's weights are those the forward's sums U and Wsum ran over
    live = (s > float("-inf")) & (u > 0)
    t = tl.where(tau == float("inf"), 0.0, tau)
    p, _, _, free, saturated = box_sums(s, t, u, live, MAP.clip(params), ceiling, t + z_one, MAP, params)
    return tl.where(tau != tau, float("nan"), p), free, saturated


@triton.jit
def box_first(s, u, m, n, low, wrong, MAP: tl.constexpr, params):
    # the first pass on a key block: each row's largest score m, number of keys n and least s - omega'(min(u, 1))
    # low, and whether it gives NaN (wrong, as box_solve's rows: a NaN or +inf score, a NaN or negative bound,
    # which the host refuses where it can read the bounds)
    live = (s > float("-inf")) & (u > 0)
    m = tl.maximum(m, tl.max(s, 1, keep_dims=True))
    n += tl.sum((s > float("-inf")).to(tl.float32), 1, keep_dims=True)
    low = tl.minimum(low, box_lowest(s, u, 1.0, live, MAP, params))
    odd = (s != s) | (s == float("inf")) | (u != u) | (u < 0)
    wrong = tl.maximum(wrong, tl.max(odd.to(tl.int32), 1, keep_dims=True))
    return m, n, low, wrong


@triton.jit
def box_bracket(m, n, low, wrong, MAP: tl.constexpr, params):
    # from the first pass: (bad, dead, m0, lo, hi), the rows that give NaN, the fully masked rows, the shift of
    # the scores (each row's largest, 0 in those rows) and the bracket [lo, hi] of t = tau - m0
    bad = wrong > 0
    dead = (m == float("-inf")) & (bad == 0)
    m0 = tl.where(dead | bad, 0.0, m)
    hi = box_high(1.0, n, MAP, params)
    lo = low - m0
    # (moved out by 4 resolutions of s - t, as box_solve's: where omega'(u_i) rounds to omega'(0+), F at the
    # computed end may still be below 1)
    lo = lo - 4 * 1.1920929e-07 * (1 + tl.abs(tl.where(tl.abs(lo) < float("inf"), lo, 0.0)))
    return bad, dead, m0, tl.where(lo < hi, lo, hi), hi


@triton.jit
def box_block_sums(s, u, m0, t, clip, ceiling, MAP: tl.constexpr, params):
    # (F, -F') of a key block at the thresholds m0 + t: g_+ summed over the free entries and u over the saturated
    # ones, and w over the free entries
    live = (s > float("-inf")) & (u > 0)
    _, f, slope, _, _ = box_sums(s - m0, t, u, live, clip, ceiling, tl.zeros_like(t), MAP, params)
    return f, slope


@triton.jit
def box_jump(jump, tau, far, share, fixed, share2, fixed2):
    # rows where no entry is free at the threshold tau but the saturated ones do not hold the total (box_solve's
    # jump rows `jump`): F jumps across 1 between thresholds that s - t cannot tell apart, a link steeper than
    # float32's resolution near its clip (entmax at alpha near 3).  They are read at the bracket's other end
    # `far`, where the pass over the keys summed the free entries' g (share2) and the saturated entries' bounds
    # (fixed2): the entries that move between its ends are free there, and the free entries' scale shares the
    # rest among them, as box_between shares it.  Where they reach their bounds there too (none free at either
    # end) the output is blended between the ends by theta so that sum p = 1 (box_between's last blend); such
    # a row's threshold stays tau.  Returns (tau, share, fixed, blend, theta)
    moved = jump & (share2 > 0)
    blend = jump & (share2 <= 0)
    gap = fixed2 - fixed
    theta = tl.where(blend & (gap != 0), (1.0 - fixed) / tl.where(gap != 0, gap, 1.0), 0.0)
    return (tl.where(moved, far, tau), tl.where(moved, share2, share), tl.where(moved, fixed2, fixed), blend,
            theta)


@triton.jit
def box_divisor(share, fixed, dead, bad):
    # the free entries' divisor: p = g / F with F = share / rest, rest = 1 - fixed (inf where the bounds hold all
    # the mass), the free entries scaled to sum to 1 less the saturated ones, as box_solve scales them; the
    # output pass caps them at their bounds (as box_solve caps them: an entry just below its bound passes it by
    # the rounding of F)
    rest = 1.0 - fixed
    divides = (dead == 0) & (share > 0) & (rest > 0)
    f = tl.where(divides, share / tl.where(divides, rest, 1.0), tl.where(dead | (share == 0), 1.0, float("inf")))
    return tl.where(bad, float("nan"), f)
