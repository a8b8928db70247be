"""Fused attention kernels of every map and constraint set, in Triton, taking the map's functions and the set as
compile-time arguments.

:func:`numeric.torch.attention` launches them (:mod:`numeric.torch.fused`) with ``MAP``, a :class:`MapFunctions` of
the map's ``@triton.jit`` functions: those of its module's ``TRITON_SOURCE`` (printed by :mod:`derive.codegen.triton`),

* ``params(Params, offset)``: the tuple of the map's parameters, loaded from ``Params + offset`` (``()`` for a map
  without parameters); every function below takes it last;
* ``link(z, params)``: ``g = (omega')^{-1}`` (closed form), ``weight(p, params)``: ``w = 1/omega''``,
  ``omega_prime(p, params)`` and ``clip(params)``: ``omega'(0+)``.

A ``tl.constexpr`` argument is part of a kernel's specialisation, and Triton keys it by the source of the functions
it holds: each map gets its own compiled kernels, and a fix here is one edit for every map.  The constraint set is
one too, every kernel's ``SET`` (:data:`SETS`, :attr:`numeric.constraints.ConstraintSet.fused`): ``"simplex"``,
``"box"`` (``0 <= p <= u``, ``sum p = 1``, the bounds ``u`` in ``Upper``), whose bounds, sums and rounds enter
through its hooks, :mod:`numeric.kernels.triton_box`, or ``"column"`` (a sink, :mod:`numeric.constraints.sink`: the
simplex over ``[s, b]``, the column's score ``b`` per row in ``Column``): the column is one more score, without a
value, in the running maximum, the count, the kept scores (from the start), the tail and ``F`` and ``sum w`` of the output pass
(softmax's online pass starts from it, ``exp(b - b) = 1``); the backward's ``c`` takes its weight through ``sum
w``, and the rows' kernel writes its gradient, ``w_b (0 - c)`` per row, in ``DColumn``.  Without a column the same code
runs with ``b = -inf``.  ``"nosum"`` (:mod:`numeric.constraints.nosum`, no bound): ``p = g_+(s)``, no threshold
(``tau = 0``, ``F = 1``), one pass of softmax's 2 products per pair; its Jacobian is ``diag(w)``, so the backward's
``c`` is 0 (``U = 0``).  The scores' modifiers are two more (:mod:`numeric.modifiers`):
``SOFTCAP`` (``> 0``: each score ``SOFTCAP tanh(s / SOFTCAP)`` before the mask, and the backward's score gradient
times the cap's slope ``1 - tanh^2``, ``capped_scores``) and ``WINDOW`` (``> 0``: query ``i`` sees the keys
``i - WINDOW < j <= i``; every pass of a query block starts at the key block of its first row's window, and the
keys' backward visits only the query blocks whose windows reach its keys).

* :func:`attention_forward`: one program per (batch x head, block of ``BLOCK_M`` queries).  On the simplex with an
  exponential link (``EXP_LINK``, softmax) it is FlashAttention's one pass with online rescaling.  Otherwise a pass
  over the key blocks finds each row's maximum ``m``, its number of keys ``n`` and its ``KEEP`` largest scores
  (merged block by block by a bitonic sort, :mod:`numeric.kernels.triton_sort`).  The threshold lies in
  ``[m - omega'(1), m - omega'(1/n)]`` (``F(tau) = sum g_+(s - tau)`` is at least 1 at the left end, where the
  largest score alone has ``p = 1``, and at most 1 at the right end, where it has ``p = 1/n``).  The host's
  threshold solve, :func:`numeric.core.halley.halley_threshold` traced (``kept_threshold``: safeguarded Halley on
  ``omega'(F) - omega'(1)`` in the bracket), finds first ``tau_k``, the threshold of the kept scores alone, without
  a pass over the keys: it is the row's threshold where the smallest kept score has weight 0 (every score left out
  is at most it) or the row has at most ``KEEP`` keys, and otherwise a start left of it (``F(tau_k) >= 1``).  Each
  other row steps from ``tau_k``, one pass over the keys per step, which sums ``F`` and ``F'`` over the scores left
  out (the tail): the step goes to the root of the kept scores' ``F`` (exact, no pass) plus the tail modelled with
  its value and first two derivatives at ``tau`` (``_tail_model``: exact for one power law, entmax's, and for an
  exponential link), which the same traced solve finds with the model as the rest of the row; the passes' bracket
  and stopping rule are the host's rounds traced (``narrow_bracket``, ``threshold_round``).  A dense map starts
  from its tail's estimate from the first pass, which sums ``exp(s - m)`` as softmax's does.  Where the model's
  curvature term at the new point is at most ``TRUST``, the step is taken without a pass to measure ``F`` there.
  A last pass accumulates ``g_+(s - tau) v`` and ``F``, writes ``out / F``, ``tau`` and ``F`` per row, and records
  which key blocks hold a weight above 0 (``Support``, per query block); a row whose trusted step left ``F`` off 1
  by more than the rounds' tolerance steps again, and the pass is repeated.  Where a backward will run
  (``WEIGHTED``) that pass also accumulates ``U = sum_j w_j v_j`` and ``sum_j w_j`` with ``w = weight(g_+(s -
  tau))`` (one product more per pair; softmax's ``U`` is its output and ``sum w`` is 1): the backward's ``p`` is
  ``g_+ / F`` with ``F`` 1 to the rounds' tolerance, a factor that cancels from ``c`` below where the weight is a
  power of ``p`` (every map with a power or exponential link) and otherwise changes it at the level of that
  tolerance.  On the box, ``p = min(u, g_+(s - tau))`` (:func:`numeric.constraints.box.box_solve`, its pieces
  traced): a first pass finds each row's largest score, its number of keys and the bracket's left end; each Newton
  round is one pass summing ``F`` and ``-F'`` (``w`` over the free entries); one more pass sums the free entries'
  ``g`` and the saturated entries' bounds at the threshold, which gives the free entries' divisor (``Fsum``: ``p =
  min(u, g_+(s - tau) / F)`` on them, ``p = u`` on the saturated ones), and the output pass writes the weights so
  scaled and capped, as ``box_solve`` caps them, with ``U`` and ``Wsum`` over the entries left free (one more sums
  pass in a query block with a jump row).  ``Ceiling``: ``omega'(inf)`` per batch and head
  (:func:`numeric.constraints.box.box_ceiling`, from the host);
* :func:`~numeric.kernels.triton_backward.attention_backward_rows`: per query block, ``c = sum w dP / sum w`` with
  ``dP = dO v^T`` and ``w = weight(p)`` on the support (the map's JVP is ``w * dP - w c``), read off the forward's ``U`` as ``dO . U / sum
  w`` (no pass over the keys), then ``dQ = scale * dS k`` with ``dS = w (dP - c)``; on the box, ``w`` on the free
  entries, and with ``UPPER_GRAD`` the bounds' gradient;
* :func:`~numeric.kernels.triton_backward.attention_backward_keys`: per key block, ``dV = p^T dO`` and ``dK = scale *
  dS^T q`` over the query blocks.

Both backward kernels recompute the scores and take ``p`` from the forward's ``tau`` and ``F``; they skip the (query
block, key block) pairs the forward found without support.  Fully masked rows get ``tau = inf``: weights, output
and gradients 0.  Inputs of float32, float16 and bfloat16: the matrix products take the inputs' dtype (float32 with
IEEE precision, not TF32) and accumulate in float32, with the weights and score gradients rounded to a half type's
inputs before their products (as FlashAttention does); everything else is float32; outputs are written in the
input's dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from numeric import contract, trust
from numeric.kernels.triton_box import (bounds, box_at, box_block_sums, box_bracket, box_divisor, box_first, box_jump,
                                        box_round)
from numeric.kernels.triton_math import rg_log1p, rg_tanh
from numeric.kernels.triton_sort import keep_largest

_traced = contract.check_format(trust.import_generated("numeric._generated.newton_link_triton"))
#: the rounds of the passes' threshold solve, traced from numeric.core.halley.narrow_bracket and threshold_round
#: (generated)
narrow_bracket = _traced.narrow_bracket
threshold_round = _traced.threshold_round
#: the threshold of a block of rows, traced from numeric.core.halley.halley_threshold (generated)
kept_threshold = _traced.kept_threshold

__all__ = ["MapFunctions", "KERNELS", "PRODUCT_MODULES", "SETS", "FREE_STEPS", "TRUST", "F_TOLERANCE", "RESOLUTION",
           "link_plus", "attention_forward"]

#: The kernels, by name.
KERNELS = ("attention_forward", "attention_backward_rows", "attention_backward_keys")
#: the modules of the kernels (the forward here, the backward in numeric.kernels.triton_backward), each calling the
#: block product ``block_product`` through its own name for it: a count of the products patches it in each
PRODUCT_MODULES = ("numeric.kernels.triton_attention", "numeric.kernels.triton_backward")
#: The constraint sets the kernels take as ``SET`` (:attr:`numeric.constraints.ConstraintSet.fused`).
SETS = ("simplex", "box", "column", "nosum")
#: Steps of the passes over the keys whose point needs only lie in the bracket (``threshold_round``'s ``free``).
FREE_STEPS = tl.constexpr(2)
#: A step of the tail model is taken without a pass to measure F where the model's curvature term there (its
#: difference from the exponential with the same value and slope) is at most this: the model matches the tail
#: to second order.  The output pass measures F, and a row off 1 steps again.  On the rows measured in
#: docs/benchmarks.md (alpha = 1.3, L = 1024) every step with a term up to 7e-4 landed where the output pass
#: accepts F; the few rows it sent back had terms below 5e-5.
TRUST = tl.constexpr(1e-3)
#: A threshold is the root where F is within this of 1 (4 float32 eps) ...
F_TOLERANCE = tl.constexpr(4 * 1.1920928955078125e-07)
#: ... or where a step would move it by less than this times 1 + |m| + |tau| (the resolution of s - tau): the
#: rule of numeric.core.halley.threshold_round, which the passes' rounds are traced from.
RESOLUTION = tl.constexpr(1.1920928955078125e-07)


class MapFunctions(NamedTuple):
    """A map's ``@triton.jit`` functions, the kernels' ``MAP`` argument (see the module's docstring)."""

    params: object
    link: object
    weight: object
    omega_prime: object
    clip: object
    omega_second: object
    omega_third: object
    weight_d2: object


@triton.jit
def link_plus(z, z_one, MAP: tl.constexpr, params):
    # g_+(z): g(z) where z > clip, else 0; g is evaluated at omega'(1) (in its domain) off the support
    live = z > MAP.clip(params)
    g = MAP.link(tl.where(live, z, z_one), params)
    return tl.where(live & (g > 0), g, 0.0)


@triton.jit
def block_product(a, b, UPCAST: tl.constexpr):
    # a @ b accumulated in float32 (float32 operands with IEEE precision, not TF32); UPCAST: float32 operands
    # (half-type products are exact in float32, so the values are those of the half-type product; Triton's
    # interpreter multiplies bfloat16 operands wrongly)
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def block_scores(q, scale, K, Mask, k_base, m_base, offs_m, start, L, S, E, stride_ks, stride_ke, stride_ml, stride_ms,
            HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
            SOFTCAP: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr, UPCAST: tl.constexpr):
    # the scaled scores of the query block (q already scaled) against the keys start:start+BLOCK_N, -inf where
    # masked (key out of range, masked, above the diagonal, before the window); float masks are added
    s, _ = capped_scores(q, scale, K, Mask, k_base, m_base, offs_m, start, L, S, E, stride_ks, stride_ke, stride_ml,
                          stride_ms, HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_N, BLOCK_E, UPCAST)
    return s


@triton.jit
def capped_scores(q, scale, K, Mask, k_base, m_base, offs_m, start, L, S, E, stride_ks, stride_ke, stride_ml,
                   stride_ms, HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, CAUSAL: tl.constexpr,
                   WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                   UPCAST: tl.constexpr):
    # (block_scores, d capped / d s): with SOFTCAP > 0 the scores are SOFTCAP tanh(s / SOFTCAP) before the mask
    # (numeric.modifiers.Softcap), whose slope 1 - (capped / SOFTCAP)**2 the backward's chain rule takes (1 without)
    offs_n = start + tl.arange(0, BLOCK_N)
    offs_e = tl.arange(0, BLOCK_E)
    k = tl.load(K + k_base + offs_n[:, None] * stride_ks + offs_e[None, :] * stride_ke,
                mask=(offs_n[:, None] < S) & (offs_e[None, :] < E), other=0.0)
    s = block_product(q, tl.trans(k), UPCAST) * scale
    slope = 1.0
    if SOFTCAP > 0:
        t = rg_tanh(s / SOFTCAP)
        s = SOFTCAP * t
        slope = 1.0 - t * t
    keep = (offs_m[:, None] < L) & (offs_n[None, :] < S)
    if CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None])
    if WINDOW > 0:  # (the keys i - WINDOW < j <= i; CAUSAL holds too)
        keep = keep & (offs_n[None, :] > offs_m[:, None] - WINDOW)
    if HAS_MASK:
        mvals = tl.load(Mask + m_base + offs_m[:, None] * stride_ml + offs_n[None, :] * stride_ms,
                        mask=(offs_m[:, None] < L) & (offs_n[None, :] < S), other=0)
        if MASK_BOOL:
            keep = keep & (mvals != 0)
        else:
            s = s + mvals.to(tl.float32)
    return tl.where(keep, s, float("-inf")), slope


@triton.jit
def weight_plus(p, MAP: tl.constexpr, params):
    # weight(p) on the support (p > 0), 0 off it (weight is evaluated at 1 there)
    live = p > 0
    return tl.where(live, MAP.weight(tl.where(live, p, 1.0), params), 0.0)


@triton.jit
def _sums(s, tau, z_one, MAP: tl.constexpr, params):
    # per row, F = sum g_+(s - tau) and sum w(p) over the support, for scores s of a block
    p = link_plus(s - tau[:, None], z_one, MAP, params)
    return tl.sum(p, 1), tl.sum(weight_plus(p, MAP, params), 1)


@triton.jit
def _bend(p, w, z, clip):
    # w (beta - 1) / x = w**2 / p - w / x, beta = w x / p the elasticity of g at x = z - clip (a power
    # p = c x**beta has g'' = w (beta - 1) / x; x = inf for a dense map), 0 off the support
    live = p > 0
    x = tl.where(live, z, 0.0) - clip
    return tl.where(live, w * w / tl.where(live, p, 1.0) - w / tl.where(live, x, 1.0), 0.0)


@triton.jit
def _tail_sums(s, tau, kth, z_one, MAP: tl.constexpr, params):
    # per row, over the scores s of a block below the smallest kept score kth: F, sum w (as _sums) and sum of
    # _bend, and the number of scores equal to kth (of which the kept hold some)
    z = s - tau[:, None]
    p = link_plus(z, z_one, MAP, params)
    w = weight_plus(p, MAP, params)
    below = s < kth[:, None]
    return (tl.sum(tl.where(below, p, 0.0), 1), tl.sum(tl.where(below, w, 0.0), 1),
            tl.sum(tl.where(below, _bend(p, w, z, MAP.clip(params)), 0.0), 1),
            tl.sum((s == kth[:, None]).to(tl.float32), 1))


@triton.jit
def _tail_model(tail, rate, eta, d):
    # the tail's F at tau + d, modelled as tail (1 - eta rate d)**(1/eta) (tail exp(-rate d) at eta = 0), minus
    # its slope, and its second derivative.  With rate = W / T and eta = 1 - C T / W**2 from the tail's sums T,
    # W = sum w and C = sum of _bend at tau, the model has the tail's value and first two derivatives there; it
    # is exact for scores of one power law (eta = 1 / beta) and for an exponential link (eta = 0)
    y = -eta * rate * d
    live = 1.0 + y > 0
    ys = tl.where(live, y, 0.0)
    e = tl.where(eta == 0, -rate * d, rg_log1p(ys) / tl.where(eta == 0, 1.0, eta))
    # past 1 - eta rate d = 0 the power tail (eta > 0) has run out, and the other one (eta < 0, left of tau)
    # has grown without bound: tail e**30, as the exponent is capped at 30 everywhere
    rest = tl.where(live, tail * tl.exp(tl.minimum(e, 30.0)), tl.where(eta > 0, 0.0, tail * 1.0686474581524463e13))
    drop = rest * rate / tl.where(live, 1.0 + ys, 1.0)
    return rest, drop, drop * rate * (1.0 - eta) / tl.where(live, 1.0 + ys, 1.0)


@triton.jit
def _tail_terms(t, args):
    # the tail's model at the threshold t (kept_threshold's `rest`): value, first and second derivative in t;
    # args = (tail, rate, eta, tau), the model's terms measured at tau
    tail, rate, eta, tau = args
    rest, drop, bend = _tail_model(tail, rate, eta, t - tau)
    return rest, -drop, bend


@triton.jit
def _solve_kept(top, tau, lo, hi, tail, rate, eta, m0, fixed, MAP: tl.constexpr, params):
    # the root in [lo, hi] of sum_kept g_+(top - t) + _tail_model(tail, rate, eta, t - tau) = 1 (the scores
    # left out of the kept, modelled from their sums at tau) from tau, with no pass over the keys: the host's
    # safeguarded Halley (numeric.core.halley.halley_threshold), traced (kept_threshold); `fixed` rows keep tau
    t = kept_threshold(top, tau[:, None], lo[:, None], hi[:, None], (fixed == 0)[:, None], m0[:, None], MAP, params,
                       _tail_terms, (tail[:, None], rate[:, None], eta[:, None], tau[:, None]))
    return tl.sum(t, 1)


@triton.jit
def program_head(H):
    # (batch x head, batch, head) of a program, the second axis of its grid
    bh = tl.program_id(1)
    return bh, bh // H, bh % H


@triton.jit
def query_block(Q, H, L, S, E, sq_b, sq_h, sq_l, sq_e, sk_b, sk_h, sv_b, sv_h, sm_b, sm_h, Params, n_params,
                 CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SET: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr, MAP: tl.constexpr):
    # a program's query block (the forward's and the backward's rows): (block, batch x head, batch, head, its rows,
    # its queries, the bases of the keys, values and mask of its batch and head, the keys it sees, the first key
    # block some row of it sees (0, or with a window the block of key qb BLOCK_M - WINDOW + 1), the map's
    # parameters of its head, omega'(1): the link's stand-in argument off the support, stand_in)
    qb = tl.program_id(0)
    bh, b, h = program_head(H)
    offs_m = qb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_e = tl.arange(0, BLOCK_E)
    q = tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_l + offs_e[None, :] * sq_e,
                mask=(offs_m[:, None] < L) & (offs_e[None, :] < E), other=0.0)
    if CAUSAL:
        n_keys = tl.minimum(S, (qb + 1) * BLOCK_M)
    else:
        n_keys = S
    if WINDOW > 0:
        k_lo = (tl.maximum(qb * BLOCK_M - WINDOW + 1, 0) // BLOCK_N) * BLOCK_N
    else:
        k_lo = 0
    params = MAP.params(Params, bh * n_params)
    return (qb, bh, b, h, offs_m, q, b * sk_b + h * sk_h, b * sv_b + h * sv_h, b * sm_b + h * sm_h, n_keys, k_lo,
            params, stand_in(MAP, params, SET))


@triton.jit
def stand_in(MAP: tl.constexpr, params, SET: tl.constexpr):
    # z_one, the link's argument off the support: omega'(1), the bracket's left end on the sets with a sum; without a
    # sum omega'(1/2), which is finite also where omega's domain ends at 1 (omega'(1) = +oo, the sigmoid's)
    if SET == "nosum":
        return MAP.omega_prime(0.5, params)
    return MAP.omega_prime(1.0, params)


@triton.jit
def _box_totals(tau, q, scale, K, Mask, Upper, k_base, m_base, u_base, offs_m, n_keys, k_lo, L, S, E, sk_s, sk_e, sm_l,
                sm_s, su_l, su_s, ceiling, z_one, MAP: tl.constexpr, params, HAS_MASK: tl.constexpr,
                MASK_BOOL: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_E: tl.constexpr, UPCAST: tl.constexpr):
    # (sum_free g_+(s - tau), sum_saturated u) at the thresholds tau ([BLOCK_M, 1]), the entries classified as the
    # output pass and the backward classify them (box_at): one pass over the keys, which gives the free entries'
    # scale before the output pass, so that it can cap them at their bounds
    share = tl.zeros([BLOCK_M, 1], tl.float32)
    fixed = tl.zeros([BLOCK_M, 1], tl.float32)
    for start in range(k_lo, n_keys, BLOCK_N):
        s = block_scores(q, scale, K, Mask, k_base, m_base, offs_m, start, L, S, E, sk_s, sk_e, sm_l, sm_s,
                    HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_N, BLOCK_E, UPCAST)
        u = bounds(Upper, u_base, offs_m, start, L, S, su_l, su_s, BLOCK_N)
        p, free, saturated = box_at(s, u, tau, ceiling, z_one, MAP, params)
        share += tl.sum(tl.where(free, p, 0.0), 1, keep_dims=True)
        fixed += tl.sum(tl.where(saturated, p, 0.0), 1, keep_dims=True)
    return share, fixed


@triton.jit
def _box_output(tau, f, far, theta, blend, wrong, q, scale, K, V, Mask, Upper, Support, k_base, v_base, m_base,
                u_base, offs_m, qb, bh, n_kblocks, n_keys, k_lo, L, S, E, EV, sk_s, sk_e, sv_s, sv_e, sm_l, sm_s, su_l,
                su_s, ceiling, z_one, MAP: tl.constexpr, params, HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr,
                CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, WEIGHTED: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr, UPCAST: tl.constexpr):
    # the bounded forward's output pass at the thresholds tau and the free entries' divisors f ([BLOCK_M]):
    # (sum p v, sum_free w v, sum_free w) with the weights the backward reads (box_weights_at: u on the saturated
    # entries, min(u, g_+(s - tau) / f) on the free ones); on the rows `blend` ([BLOCK_M, 1]) p is blended by theta
    # towards its weights at the thresholds `far`.  It marks the key blocks holding weight in Support
    offs_v = tl.arange(0, BLOCK_EV)
    acc = tl.zeros([BLOCK_M, BLOCK_EV], tl.float32)
    wv = tl.zeros([BLOCK_M, BLOCK_EV], tl.float32)
    wsum = tl.zeros([BLOCK_M, 1], tl.float32)
    blending = tl.max(blend.to(tl.int32)) > 0
    for start in range(k_lo, n_keys, BLOCK_N):
        s = block_scores(q, scale, K, Mask, k_base, m_base, offs_m, start, L, S, E, sk_s, sk_e, sm_l, sm_s,
                    HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_N, BLOCK_E, UPCAST)
        u = bounds(Upper, u_base, offs_m, start, L, S, su_l, su_s, BLOCK_N)
        p, w, _ = box_weights_at(s, u, tau, f, ceiling, z_one, MAP, params)
        if blending:
            p_far, _, _ = box_weights_at(s, u, far, f, ceiling, z_one, MAP, params)
            p = tl.where(blend, p + theta * (p_far - p), p)
        offs_n = start + tl.arange(0, BLOCK_N)
        v = tl.load(V + v_base + offs_n[:, None] * sv_s + offs_v[None, :] * sv_e,
                    mask=(offs_n[:, None] < S) & (offs_v[None, :] < EV), other=0.0)
        acc += block_product(p.to(v.dtype), v, UPCAST)
        if WEIGHTED:
            wv += block_product(w.to(v.dtype), v, UPCAST)
            wsum += tl.sum(w, 1, keep_dims=True)
        # (a NaN row's blocks count: the backward passes its NaN on)
        tl.store(Support + (bh * tl.num_programs(0) + qb) * n_kblocks + start // BLOCK_N,
                 ((tl.max(tl.max(p, 1), 0) > 0) | (tl.max(tl.max(wrong, 1), 0) > 0)).to(tl.int8))
    return acc, wv, wsum


@triton.jit
def attention_forward(Q, K, V, Out, Tau, Fsum, Support, Bmax, Mask, Params, U, Wsum, Upper, Ceiling, Column,
                      H, L, S, E, EV, scale, n_kblocks, n_params,
                      sq_b, sq_h, sq_l, sq_e, sk_b, sk_h, sk_s, sk_e, sv_b, sv_h, sv_s, sv_e,
                      so_b, so_h, so_l, so_e, sm_b, sm_h, sm_l, sm_s, su_b, su_h, su_l, su_s,
                      HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                      SOFTCAP: tl.constexpr, SET: tl.constexpr,
                      EXP_LINK: tl.constexpr, MAX_STEPS: tl.constexpr, WEIGHTED: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
                      KEEP: tl.constexpr, UPCAST: tl.constexpr, MAP: tl.constexpr):
    qb, bh, b, h, offs_m, q, k_base, v_base, m_base, n_keys, k_lo, params, z_one = query_block(
        Q, H, L, S, E, sq_b, sq_h, sq_l, sq_e, sk_b, sk_h, sv_b, sv_h, sm_b, sm_h, Params, n_params, CAUSAL, WINDOW,
        SET, BLOCK_M, BLOCK_N, BLOCK_E, MAP)
    offs_v = tl.arange(0, BLOCK_EV)
    row_live = offs_m < L
    # the sink's score per row (SET "sink": one more entry, without a value; -inf: none, which changes nothing)
    if SET == "column":
        column = tl.load(Column + bh * L + offs_m, mask=row_live, other=float("-inf"))
    else:
        column = tl.full([BLOCK_M], float("-inf"), tl.float32)
    if SET == "box":
        # p = min(u, g_+(s - tau)) with sum p = 1 (numeric.constraints.box.box_solve, whose pieces run traced on each
        # key block through the box's hooks, numeric.kernels.triton_box); the rows are [BLOCK_M, 1].  Passes over
        # the keys: the first, one per Newton round, the sums and the output pass (one more sums pass in a query
        # block with a jump row, box_jump)
        u_base = b * su_b + h * su_h
        clip = MAP.clip(params)
        ceiling = tl.load(Ceiling + bh)
        m = tl.full([BLOCK_M, 1], float("-inf"), tl.float32)
        n = tl.zeros([BLOCK_M, 1], tl.float32)
        low = tl.full([BLOCK_M, 1], float("inf"), tl.float32)
        wrong = tl.zeros([BLOCK_M, 1], tl.int32)
        for start in range(k_lo, n_keys, BLOCK_N):
            s = block_scores(q, scale, K, Mask, k_base, m_base, offs_m, start, L, S, E, sk_s, sk_e, sm_l, sm_s,
                        HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_N, BLOCK_E, UPCAST)
            m, n, low, wrong = box_first(s, bounds(Upper, u_base, offs_m, start, L, S, su_l, su_s, BLOCK_N), m, n, low,
                                         wrong, MAP, params)
        bad, dead, m0, lo, hi = box_bracket(m, n, low, wrong, MAP, params)
        going = (dead == 0) & (bad == 0) & row_live[:, None]
        solved = going
        t = tl.where(going, (lo + hi) / 2, 0.0)
        step = hi - lo
        step_old = step
        rounds = tl.zeros([], tl.int32)
        while (tl.max(going.to(tl.int32)) > 0) & (rounds < MAX_STEPS):
            f = tl.zeros([BLOCK_M, 1], tl.float32)
            slope = tl.zeros([BLOCK_M, 1], tl.float32)
            for start in range(k_lo, n_keys, BLOCK_N):
                s = block_scores(q, scale, K, Mask, k_base, m_base, offs_m, start, L, S, E, sk_s, sk_e, sm_l, sm_s,
                            HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_N, BLOCK_E, UPCAST)
                f_block, w_block = box_block_sums(s, bounds(Upper, u_base, offs_m, start, L, S, su_l, su_s, BLOCK_N),
                                                  m0, t, clip, ceiling, MAP, params)
                f += f_block
                slope += w_block
            t, lo, hi, step, step_old, going = box_round(t, lo, hi, step, step_old, going, f, slope, 1.0, 1.0)
            rounds += 1
        # the free entries' scale at the threshold as the backward reads it (box_at): the sums of the free entries'
        # g and of the saturated entries' bounds, one pass over the keys before the output pass
        tau = tl.where(bad, float("nan"), tl.where(dead, float("inf"), m0 + t))
        share, fixed = _box_totals(tau, q, scale, K, Mask, Upper, k_base, m_base, u_base, offs_m, n_keys, k_lo, L, S, E,
                                   sk_s, sk_e, sm_l, sm_s, su_l, su_s, ceiling, z_one, MAP, params, HAS_MASK,
                                   MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_M, BLOCK_N, BLOCK_E, UPCAST)
        rest = 1.0 - fixed
        # the jump rows (box_jump; a row whose F(t) is 1 to 4 eps is done, as box_between's bisection stops there:
        # the bracket's other end may be far)
        jump = solved & (share <= 0) & (tl.abs(rest) > 4 * 1.1920929e-07)
        blend = jump & (jump == 0)
        theta = tl.zeros([BLOCK_M, 1], tl.float32)
        far = tau
        if tl.max(jump.to(tl.int32)) > 0:
            far = tl.where(jump, m0 + tl.where(rest < 0, hi, lo), tau)  # (the bracket's other end)
            share2, fixed2 = _box_totals(far, q, scale, K, Mask, Upper, k_base, m_base, u_base, offs_m, n_keys, k_lo,
                                         L, S, E, sk_s, sk_e, sm_l, sm_s, su_l, su_s, ceiling, z_one, MAP, params,
                                         HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_M, BLOCK_N, BLOCK_E,
                                         UPCAST)
            tau, share, fixed, blend, theta = box_jump(jump, tau, far, share, fixed, share2, fixed2)
        f = tl.reshape(box_divisor(share, fixed, dead, bad), [BLOCK_M])
        tau = tl.reshape(tau, [BLOCK_M])
        out, u, wsum = _box_output(
            tau, f, tl.reshape(far, [BLOCK_M]), theta, blend, wrong, q, scale, K, V, Mask, Upper, Support, k_base,
            v_base, m_base, u_base, offs_m, qb, bh, n_kblocks, n_keys, k_lo, L, S, E, EV, sk_s, sk_e, sv_s, sv_e, sm_l,
            sm_s, su_l, su_s, ceiling, z_one, MAP, params, HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, WEIGHTED,
            BLOCK_M, BLOCK_N, BLOCK_E, BLOCK_EV, UPCAST)
        out = tl.where(bad, float("nan"), tl.where(dead, 0.0, out))
        u = tl.where(bad, float("nan"), u)
        wsum = tl.reshape(tl.where(bad, float("nan"), wsum), [BLOCK_M])
    elif SET == "nosum":
        # p = g_+(s) at tau = 0, each score on its own: one pass, 2 products per pair; c = 0 in the backward (U = 0)
        acc = tl.zeros([BLOCK_M, BLOCK_EV], tl.float32)
        broken = tl.zeros([BLOCK_M], tl.int32)  # (a NaN score makes its row NaN)
        for start in range(k_lo, n_keys, BLOCK_N):
            s = block_scores(q, scale, K, Mask, k_base, m_base, offs_m, start, L, S, E, sk_s, sk_e, sm_l, sm_s,
                        HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_N, BLOCK_E, UPCAST)
            p = link_plus(s, z_one, MAP, params)
            broken = tl.maximum(broken, tl.max((s != s).to(tl.int32), 1))
            offs_n = start + tl.arange(0, BLOCK_N)
            v = tl.load(V + v_base + offs_n[:, None] * sv_s + offs_v[None, :] * sv_e,
                        mask=(offs_n[:, None] < S) & (offs_v[None, :] < EV), other=0.0)
            acc += block_product(p.to(v.dtype), v, UPCAST)
            tl.store(Support + (bh * tl.num_programs(0) + qb) * n_kblocks + start // BLOCK_N,
                     (tl.max(tl.max(p, 1), 0) > 0).to(tl.int8))
        out = tl.where(broken[:, None] > 0, float("nan"), acc)
        tau = tl.zeros([BLOCK_M], tl.float32)
        f = tl.full([BLOCK_M], 1.0, tl.float32)
        u = tl.zeros([BLOCK_M, BLOCK_EV], tl.float32)
        wsum = tl.zeros([BLOCK_M], tl.float32)
    elif EXP_LINK:
        # one pass: running maximum m, running sum l of exp(s - m), output rescaled as m grows (from the sink's
        # exp(b - b) = 1)
        m = column
        f = (column > float("-inf")).to(tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_EV], tl.float32)
        for start in range(k_lo, n_keys, BLOCK_N):
            s = block_scores(q, scale, K, Mask, k_base, m_base, offs_m, start, L, S, E, sk_s, sk_e, sm_l, sm_s,
                        HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_N, BLOCK_E, UPCAST)
            m_new = tl.maximum(m, tl.max(s, 1))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - shift[:, None])
            rescale = tl.exp(tl.where(m == float("-inf"), float("-inf"), m - shift))
            offs_n = start + tl.arange(0, BLOCK_N)
            v = tl.load(V + v_base + offs_n[:, None] * sv_s + offs_v[None, :] * sv_e,
                        mask=(offs_n[:, None] < S) & (offs_v[None, :] < EV), other=0.0)
            acc = acc * rescale[:, None] + block_product(p.to(v.dtype), v, UPCAST)
            f = f * rescale + tl.sum(p, 1)
            m = m_new
            tl.store(Support + (bh * tl.num_programs(0) + qb) * n_kblocks + start // BLOCK_N,
                     (tl.max(tl.max(p, 1), 0) > 0).to(tl.int8))
        dead = f == 0
        # p = exp(s - m) / f = g(s - tau) for the link g(z) = exp(z - omega'(1)) of a map whose term is exp
        tau = tl.where(dead, float("inf"), m + tl.log(tl.where(dead, 1.0, f)) - z_one)
        out = tl.where(dead[:, None], 0.0, acc / tl.where(dead, 1.0, f)[:, None])
        f = tl.full([BLOCK_M], 1.0, tl.float32)  # p = exp(s - tau) sums to 1
        u = out  # the weights are p itself
        wsum = tl.where(dead, 0.0, 1.0)  # (the sink's weight included: sum p = 1 over [s, b])
    else:
        # pass 1: each row's maximum m, number of keys n and KEEP largest scores, and per key block an upper
        # bound of max_i (max_j s_ij - m_i) (the running maximum is at most the final one), from the diagonal block
        # (the sink counts as one more score, kept from the start)
        gap = Bmax + (bh * tl.num_programs(0) + qb) * n_kblocks
        m = column
        n = (column > float("-inf")).to(tl.float32)
        top = tl.where(tl.arange(0, KEEP)[None, :] == 0, column[:, None], float("-inf"))
        n_blocks = tl.cdiv(n_keys, BLOCK_N)
        b_lo = k_lo // BLOCK_N  # (the key blocks before a window are not visited, here or in any pass)
        first = tl.minimum((qb * BLOCK_M) // BLOCK_N, n_blocks - 1)
        dense = MAP.clip(params) == float("-inf")
        z_all = n  # a dense map's sum of exp(s - m), rescaled as m grows (the sink's exp(b - b))
        for j in range(b_lo, n_blocks):
            kb = b_lo + (j - b_lo + first - b_lo) % (n_blocks - b_lo)
            s = block_scores(q, scale, K, Mask, k_base, m_base, offs_m, kb * BLOCK_N, L, S, E, sk_s, sk_e, sm_l, sm_s,
                        HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_N, BLOCK_E, UPCAST)
            top_s = tl.max(s, 1)
            if dense:
                grown = tl.maximum(m, top_s)
                shift = tl.where(grown == float("-inf"), 0.0, grown)
                z_all = (z_all * tl.exp(tl.where(m == float("-inf"), float("-inf"), m - shift))
                         + tl.sum(tl.exp(s - shift[:, None]), 1))
            m = tl.maximum(m, top_s)
            n += tl.sum((s > float("-inf")).to(tl.float32), 1)
            tl.store(gap + kb, tl.max(tl.where(top_s > float("-inf"), top_s - tl.where(top_s > float("-inf"), m, 0.0),
                                               float("-inf")), 0))
            if tl.max((top_s > tl.min(top, 1)).to(tl.int32), 0) > 0:  # (some row's largest kept scores change)
                top = keep_largest(top, s, BLOCK_M, BLOCK_N, KEEP)
        dead = m == float("-inf")
        m0 = tl.where(dead, 0.0, m)
        out_rows = dead | (offs_m >= L)
        lo = m0 - z_one
        hi = m0 - MAP.omega_prime(1.0 / tl.maximum(n, 1.0), params)
        nothing = tl.zeros([BLOCK_M], tl.float32)
        # the threshold of the kept scores alone, tau_k, with no pass over the keys: F(tau_k) >= 1 for the whole
        # row, and tau_k is its threshold where the smallest kept score kth has weight 0 (every score left out is
        # at most it) or the row has no more than KEEP keys (`exact`)
        hi_k = m0 - MAP.omega_prime(1.0 / tl.maximum(tl.minimum(n, KEEP), 1.0), params)
        tau = _solve_kept(top, lo, lo, hi_k, nothing, nothing, nothing, m0, out_rows, MAP, params)
        kth = tl.min(top, 1)
        kept_at_kth = tl.sum((top == kth[:, None]).to(tl.float32), 1)
        p_kth = link_plus(kth - tau, z_one, MAP, params)
        exact = out_rows | (n <= KEEP) | (p_kth == 0)
        if dense:
            # a dense map's tail starts as the scores left out weighted like exponentials, scaled to the
            # smallest kept score's weight: sum_tail exp(s - kth) g(kth - t), from the first pass's exp sums
            z_tail = tl.maximum(z_all - tl.sum(tl.exp(top - m0[:, None]), 1), 0.0)
            scaled = p_kth > 0  # (kth = -inf where a row has fewer keys than KEEP: exact)
            z_tail = tl.where(scaled, z_tail * tl.exp(tl.where(scaled, m0 - kth, 0.0)) * p_kth, 0.0)
            rate = tl.where(scaled, weight_plus(p_kth, MAP, params) / tl.where(scaled, p_kth, 1.0), 0.0)
            tau = _solve_kept(top, tau, lo, hi, tl.where(exact, 0.0, z_tail), rate, nothing, m0, exact, MAP, params)
        # the other rows: steps from tau_k (a dense map: from its estimate above), one pass over the keys
        # each, which sums F, F' = -sum w and the curvature term over the scores left out (the tail); the step
        # goes to the root of the kept scores' F plus the tail's model (_solve_kept, _tail_model).  Where the
        # model's curvature term at the new point is at most TRUST, the point is taken
        # without a pass to measure F there (`trusted`): the output pass measures it, and rows whose F is not 1
        # there take steps again.  tau never falls below lo = m - omega'(1): a key block with
        # s_ij - m_i <= clip - omega'(1) for every row has weights 0 at every step, and the passes skip it
        floor = MAP.clip(params) - z_one
        dt = hi - tau
        dt_old = dt
        settled = exact
        may_trust = out_rows == out_rows  # (a row whose trusted step the output pass found off takes measured steps)
        wsum_at = tl.full([BLOCK_M], 1.0, tl.float32)  # sum w at tau, from the last pass that measured it
        f = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_EV], tl.float32)
        u = tl.zeros([BLOCK_M, BLOCK_EV], tl.float32)
        wsum = tl.zeros([BLOCK_M], tl.float32)
        step = tl.zeros([], tl.int32)
        pending = step == 0
        while pending:
            going = tl.min(settled.to(tl.int32), 0) == 0
            while going & (step < MAX_STEPS):
                t_f = tl.zeros([BLOCK_M], tl.float32)
                t_w = tl.zeros([BLOCK_M], tl.float32)
                t_c = tl.zeros([BLOCK_M], tl.float32)
                at_kth = tl.zeros([BLOCK_M], tl.float32)
                for start in range(k_lo, n_keys, BLOCK_N):
                    if tl.load(gap + start // BLOCK_N) > floor:
                        s = block_scores(q, scale, K, Mask, k_base, m_base, offs_m, start, L, S, E, sk_s, sk_e, sm_l, sm_s,
                                    HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_N, BLOCK_E, UPCAST)
                        f_block, w_block, c_block, n_block = _tail_sums(s, tau, kth, z_one, MAP, params)
                        t_f += f_block
                        t_w += w_block
                        t_c += c_block
                        at_kth += n_block
                f_block, w_block, c_block, n_block = _tail_sums(column[:, None], tau, kth, z_one, MAP, params)
                t_f += f_block  # (the sink, where it is not kept)
                t_w += w_block
                t_c += c_block
                at_kth += n_block
                # the scores equal to kth that the kept do not hold belong to the tail
                extra = tl.maximum(at_kth - kept_at_kth, 0.0)
                p_at = link_plus(kth - tau, z_one, MAP, params)
                w_at = weight_plus(p_at, MAP, params)
                t_f += extra * p_at
                t_w += extra * w_at
                t_c += extra * _bend(p_at, w_at, kth - tau, MAP.clip(params))
                f_kept, w_kept = _sums(top, tau, z_one, MAP, params)
                f_tau = f_kept + t_f
                w_tau = w_kept + t_w
                lo, hi = narrow_bracket(tau, lo, hi, settled == 0, f_tau)
                rate = tl.where(t_f > 0, t_w / tl.where(t_f > 0, t_f, 1.0), 0.0)
                eta = tl.where(t_w > 0, 1.0 - t_c * t_f / tl.where(t_w > 0, t_w * t_w, 1.0), 0.0)
                point = _solve_kept(top, tau, lo, hi, t_f, rate, eta, m0, settled, MAP, params)
                # (the first FREE_STEPS points need only lie in the bracket)
                new_tau, dt, dt_old, going_on, _, took = threshold_round(tau, lo, hi, dt, dt_old, settled == 0, f_tau,
                                                                         -w_tau, point, w_tau > 0, 1.0 + tl.abs(m0),
                                                                         step < FREE_STEPS)
                done = going_on == 0
                moved = new_tau - tau
                curved, _, _ = _tail_model(t_f, rate, eta, moved)
                flat, _, _ = _tail_model(t_f, rate, nothing, moved)
                trusted = took & may_trust & (tl.abs(curved - flat) <= TRUST)
                wsum_at = tl.where(settled, wsum_at, w_tau)
                exact = exact | (done & ~settled)
                settled = settled | done | trusted
                tau = new_tau
                going = tl.min(settled.to(tl.int32), 0) == 0
                step += 1
            f = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, BLOCK_EV], tl.float32)
            u = tl.zeros([BLOCK_M, BLOCK_EV], tl.float32)
            wsum = tl.zeros([BLOCK_M], tl.float32)
            for start in range(k_lo, n_keys, BLOCK_N):
                has = False
                if tl.load(gap + start // BLOCK_N) > floor:
                    s = block_scores(q, scale, K, Mask, k_base, m_base, offs_m, start, L, S, E, sk_s, sk_e, sm_l, sm_s,
                                HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_N, BLOCK_E, UPCAST)
                    p = link_plus(s - tau[:, None], z_one, MAP, params)
                    p = tl.where(dead[:, None], 0.0, p)
                    offs_n = start + tl.arange(0, BLOCK_N)
                    v = tl.load(V + v_base + offs_n[:, None] * sv_s + offs_v[None, :] * sv_e,
                                mask=(offs_n[:, None] < S) & (offs_v[None, :] < EV), other=0.0)
                    acc += block_product(p.to(v.dtype), v, UPCAST)
                    f += tl.sum(p, 1)
                    has = tl.max(tl.max(p, 1), 0) > 0
                    if WEIGHTED:  # w(p) with p = g (F is 1 to the rounds' tolerance; see the module's docstring)
                        w = weight_plus(p, MAP, params)
                        u += block_product(w.to(v.dtype), v, UPCAST)
                        wsum += tl.sum(w, 1)
                tl.store(Support + (bh * tl.num_programs(0) + qb) * n_kblocks + start // BLOCK_N, has.to(tl.int8))
            p_column = tl.where(dead, 0.0, link_plus(column - tau, z_one, MAP, params))  # (in F, without a value)
            f += p_column
            if WEIGHTED:
                wsum += weight_plus(p_column, MAP, params)
            # a trusted tau is kept where the output pass finds F within F_TOLERANCE of 1, or within what the step
            # to its root would move tau by less than the resolution of s - tau (threshold_round's rule)
            resolution = RESOLUTION * (1.0 + tl.abs(m0) + tl.abs(tau))
            exact = exact | (tl.abs(f - 1.0) <= F_TOLERANCE) | (tl.abs(f - 1.0) <= resolution * wsum_at)
            may_trust = may_trust & exact
            settled = exact
            pending = (tl.min(exact.to(tl.int32), 0) == 0) & (step < MAX_STEPS)
        tau = tl.where(dead, float("inf"), tau)
        f = tl.where(dead, 1.0, f)
        out = tl.where(dead[:, None], 0.0, acc / f[:, None])
    tl.store(Out + b * so_b + h * so_h + offs_m[:, None] * so_l + offs_v[None, :] * so_e,
             out.to(Out.dtype.element_ty), mask=row_live[:, None] & (offs_v[None, :] < EV))
    if WEIGHTED:
        tl.store(U + (bh * L + offs_m[:, None]) * EV + offs_v[None, :], u,
                 mask=row_live[:, None] & (offs_v[None, :] < EV))
        tl.store(Wsum + bh * L + offs_m, wsum, mask=row_live)
    tl.store(Tau + bh * L + offs_m, tau, mask=row_live)
    tl.store(Fsum + bh * L + offs_m, f, mask=row_live)


@triton.jit
def weights_at(s, tau, f, z_one, MAP: tl.constexpr, params):
    # (p, w): the weights of scores s at the forward's tau and F, and weight(p) on the support (0 off it)
    p = link_plus(s - tau[:, None], z_one, MAP, params) / f[:, None]
    w = weight_plus(p, MAP, params)
    return p, w


@triton.jit
def box_weights_at(s, u, tau, f, ceiling, z_one, MAP: tl.constexpr, params):
    # (p, w, saturated) with bounds u at the thresholds tau and the free entries' divisors F ([BLOCK_M]): p = u
    # where saturated, min(u, g_+(s - tau) / F) on the free entries (scaled, and capped at their bounds as
    # numeric.constraints.box.box_solve caps them; an entry the cap holds is saturated, as box_vjp reads p = u),
    # weight(p) on the entries left free (0 elsewhere).  The forward's output pass writes these weights, and the
    # backward reads them
    p, free, saturated = box_at(s, u, tau[:, None], ceiling, z_one, MAP, params)
    scaled = p / f[:, None]
    capped = free & (scaled >= u)
    p = tl.where(free, tl.where(capped, u, scaled), p)
    return p, weight_plus(tl.where(free & (capped == 0), p, 0.0), MAP, params), saturated | capped
