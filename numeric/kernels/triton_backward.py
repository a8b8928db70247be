"""The fused attention's backward kernels (:mod:`numeric.kernels.triton_attention` describes the three kernels and
their arguments): :func:`attention_backward_rows` (per query block: ``c``, ``dQ``, the bounds' and a sink's
gradients) and :func:`attention_backward_keys` (per key block: ``dK``, ``dV``), recomputing the scores with the
forward's ``capped_scores`` and the weights from its ``tau`` and ``F``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from numeric.kernels.triton_attention import (block_product, block_scores, box_weights_at, capped_scores, link_plus,
                                              program_head, query_block, stand_in, weight_plus, weights_at)
from numeric.kernels.triton_box import bounds

__all__ = ["attention_backward_rows", "attention_backward_keys"]


@triton.jit
def _weights_of_block(s, Upper, u_base, offs_m, start, L, S, su_l, su_s, ceiling, tau, f, z_one, MAP: tl.constexpr,
                      params, SET: tl.constexpr, BLOCK_N: tl.constexpr):
    # (p, w, saturated) of the scores s of the query block against the keys start:start+BLOCK_N (weights_at,
    # or box_weights_at with the bounds; saturated: where p = u, nowhere without bounds)
    if SET == "box":
        u = bounds(Upper, u_base, offs_m, start, L, S, su_l, su_s, BLOCK_N)
        p, w, saturated = box_weights_at(s, u, tau, f, ceiling, z_one, MAP, params)
    else:
        p, w = weights_at(s, tau, f, z_one, MAP, params)
        saturated = p != p
    return p, w, saturated


@triton.jit
def _weights_and_dp(q, scale, do, K, V, Mask, Upper, k_base, v_base, m_base, u_base, offs_m, start, L, S, E, EV,
                    sk_s, sk_e, sv_s, sv_e, sm_l, sm_s, su_l, su_s, ceiling, tau, f, z_one, MAP: tl.constexpr, params,
                    HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                    SOFTCAP: tl.constexpr, SET: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr, UPCAST: tl.constexpr):
    # (w, saturated, dP, slope) of the query block against the keys start:start+BLOCK_N: weight(p) on the support
    # (the free entries with bounds), where p is at its bound, dO v^T, and the cap's slope (capped_scores)
    s, slope = capped_scores(q, scale, K, Mask, k_base, m_base, offs_m, start, L, S, E, sk_s, sk_e, sm_l, sm_s,
                              HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_N, BLOCK_E, UPCAST)
    _, w, saturated = _weights_of_block(s, Upper, u_base, offs_m, start, L, S, su_l, su_s, ceiling, tau, f, z_one,
                                        MAP, params, SET, BLOCK_N)
    offs_n = start + tl.arange(0, BLOCK_N)
    offs_v = tl.arange(0, BLOCK_EV)
    v = tl.load(V + v_base + offs_n[:, None] * sv_s + offs_v[None, :] * sv_e,
                mask=(offs_n[:, None] < S) & (offs_v[None, :] < EV), other=0.0)
    return w, saturated, block_product(do, tl.trans(v), UPCAST), slope


@triton.jit
def _exit_gaps(q, scale, K, Mask, Upper, k_base, m_base, u_base, offs_m, start, L, S, E, sk_s, sk_e, sm_l, sm_s,
               su_l, su_s, ceiling, tau, f, z_one, MAP: tl.constexpr, params, HAS_MASK: tl.constexpr,
               MASK_BOOL: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
               UPCAST: tl.constexpr):
    # (u, saturated, s - omega'(u) on the saturated entries, inf elsewhere) of the query block against the keys
    # start:start+BLOCK_N, saturated as the forward's weights are (box_weights_at: with the entries its cap holds):
    # the gaps whose least marks the entries that leave their bound first as tau rises
    # (numeric.constraints.box.box_exits)
    s = block_scores(q, scale, K, Mask, k_base, m_base, offs_m, start, L, S, E, sk_s, sk_e, sm_l, sm_s,
                HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_N, BLOCK_E, UPCAST)
    u = bounds(Upper, u_base, offs_m, start, L, S, su_l, su_s, BLOCK_N)
    _, _, saturated = box_weights_at(s, u, tau, f, ceiling, z_one, MAP, params)
    gap = tl.where(saturated, s - MAP.omega_prime(tl.where(saturated, u, 1.0), params), float("inf"))
    return u, saturated, gap


@triton.jit
def attention_backward_rows(Q, K, V, DO, DQ, Tau, Fsum, C, Support, Mask, Params, U, Wsum, Upper, Ceiling, DU, Column,
                            DColumn,
                            H, L, S, E, EV, scale, n_kblocks, n_params,
                            sq_b, sq_h, sq_l, sq_e, sk_b, sk_h, sk_s, sk_e, sv_b, sv_h, sv_s, sv_e,
                            sd_b, sd_h, sd_l, sd_e, sm_b, sm_h, sm_l, sm_s, su_b, su_h, su_l, su_s,
                            HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                            SOFTCAP: tl.constexpr,
                            SET: tl.constexpr, UPPER_GRAD: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                            BLOCK_EV: tl.constexpr, UPCAST: tl.constexpr, MAP: tl.constexpr):
    qb, bh, b, h, offs_m, q, k_base, v_base, m_base, n_keys, k_lo, params, z_one = query_block(
        Q, H, L, S, E, sq_b, sq_h, sq_l, sq_e, sk_b, sk_h, sv_b, sv_h, sm_b, sm_h, Params, n_params, CAUSAL, WINDOW,
        SET, BLOCK_M, BLOCK_N, BLOCK_E, MAP)
    offs_e = tl.arange(0, BLOCK_E)
    offs_v = tl.arange(0, BLOCK_EV)
    row_live = offs_m < L
    do = tl.load(DO + b * sd_b + h * sd_h + offs_m[:, None] * sd_l + offs_v[None, :] * sd_e,
                 mask=row_live[:, None] & (offs_v[None, :] < EV), other=0.0)
    tau = tl.load(Tau + bh * L + offs_m, mask=row_live, other=float("inf"))
    f = tl.load(Fsum + bh * L + offs_m, mask=row_live, other=1.0)
    support = Support + (bh * tl.num_programs(0) + qb) * n_kblocks
    # c = sum_j w_j dP_j / sum_j w_j = dO . U / sum_j w_j, with U = sum_j w_j v_j from the forward
    u = tl.load(U + (bh * L + offs_m[:, None]) * EV + offs_v[None, :], mask=row_live[:, None] & (offs_v[None, :] < EV),
                other=0.0)
    wsum = tl.load(Wsum + bh * L + offs_m, mask=row_live, other=0.0)
    c = tl.sum(do.to(tl.float32) * u, 1) / tl.where(wsum > 0, wsum, 1.0)
    tl.store(C + bh * L + offs_m, c, mask=row_live)
    u_base = b * su_b + h * su_h
    ceiling = tl.load(Ceiling + bh) if SET == "box" else 0.0
    # the bounds' gradient in a row with no free entry (numeric.constraints.box.box_exits): the one-sided derivative
    # on the side where tau rises, the saturated entries K with the least s_k - omega'(u_k) standing in for the
    # free ones with weights w_k = 1 / omega''(u_k): c_u = sum_K w_k dP_k / sum_K w_k, dU = dP - c_u on the
    # saturated entries outside K, 0 in K (so that d sum(p)/du = 0).  Elsewhere c_u = c and K is empty.
    c_u = c
    none = row_live & (wsum <= 0) & (tau == tau) & (tau != float("inf"))
    least = tl.full([BLOCK_M], float("-inf"), tl.float32)
    if UPPER_GRAD:
        if tl.max(none.to(tl.int32)) > 0:
            least = tl.full([BLOCK_M], float("inf"), tl.float32)
            for start in range(k_lo, n_keys, BLOCK_N):
                if tl.load(support + start // BLOCK_N) != 0:
                    _, saturated, gap = _exit_gaps(q, scale, K, Mask, Upper, k_base, m_base, u_base, offs_m, start,
                                                   L, S, E, sk_s, sk_e, sm_l, sm_s, su_l, su_s, ceiling, tau, f,
                                                   z_one, MAP, params, HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP,
                                                   BLOCK_N,
                                                   BLOCK_E, UPCAST)
                    least = tl.minimum(least, tl.min(gap, 1))
            w_k = tl.zeros([BLOCK_M], tl.float32)
            w_dp = tl.zeros([BLOCK_M], tl.float32)
            for start in range(k_lo, n_keys, BLOCK_N):
                if tl.load(support + start // BLOCK_N) != 0:
                    u_k, saturated, gap = _exit_gaps(q, scale, K, Mask, Upper, k_base, m_base, u_base, offs_m,
                                                     start, L, S, E, sk_s, sk_e, sm_l, sm_s, su_l, su_s, ceiling,
                                                     tau, f, z_one, MAP, params, HAS_MASK, MASK_BOOL, CAUSAL, WINDOW,
                                                     SOFTCAP, BLOCK_N,
                                                     BLOCK_E, UPCAST)
                    first = saturated & (gap <= least[:, None]) & none[:, None]
                    w_first = tl.where(first, MAP.weight(tl.where(first, u_k, 1.0), params), 0.0)
                    offs_n = start + tl.arange(0, BLOCK_N)
                    v = tl.load(V + v_base + offs_n[:, None] * sv_s + offs_v[None, :] * sv_e,
                                mask=(offs_n[:, None] < S) & (offs_v[None, :] < EV), other=0.0)
                    dp = block_product(do, tl.trans(v), UPCAST)
                    w_k += tl.sum(w_first, 1)
                    w_dp += tl.sum(w_first * dp, 1)
            c_u = tl.where(none & (w_k > 0), w_dp / tl.where(w_k > 0, w_k, 1.0), c)
            least = tl.where(none, least, float("-inf"))
    dq = tl.zeros([BLOCK_M, BLOCK_E], tl.float32)
    for start in range(k_lo, n_keys, BLOCK_N):
        if tl.load(support + start // BLOCK_N) != 0:
            w, saturated, dp, slope = _weights_and_dp(
                q, scale, do, K, V, Mask, Upper, k_base, v_base, m_base, u_base, offs_m, start, L, S, E, EV, sk_s, sk_e,
                sv_s, sv_e, sm_l, sm_s, su_l, su_s, ceiling, tau, f, z_one, MAP, params, HAS_MASK, MASK_BOOL, CAUSAL,
                WINDOW, SOFTCAP, SET, BLOCK_N, BLOCK_E, BLOCK_EV, UPCAST)
            offs_n = start + tl.arange(0, BLOCK_N)
            k = tl.load(K + k_base + offs_n[:, None] * sk_s + offs_e[None, :] * sk_e,
                        mask=(offs_n[:, None] < S) & (offs_e[None, :] < E), other=0.0)
            dq += block_product((w * (dp - c[:, None]) * slope).to(k.dtype), k, UPCAST)
            if UPPER_GRAD:  # the bounds' gradient: dP - c_u where p is at its bound (numeric.constraints.box.box_vjp)
                _, _, gap = _exit_gaps(q, scale, K, Mask, Upper, k_base, m_base, u_base, offs_m, start, L, S, E,
                                       sk_s, sk_e, sm_l, sm_s, su_l, su_s, ceiling, tau, f, z_one, MAP, params,
                                       HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_N, BLOCK_E, UPCAST)
                counted = saturated & (gap > least[:, None])  # (K, in a row with no free entry, is not)
                tl.store(DU + (bh * L + offs_m[:, None]) * S + offs_n[None, :],
                         tl.where(counted, dp - c_u[:, None], 0.0), mask=row_live[:, None] & (offs_n[None, :] < S))
    tl.store(DQ + bh * L * E + offs_m[:, None] * E + offs_e[None, :], dq * scale,
             mask=row_live[:, None] & (offs_e[None, :] < E))
    if SET == "column":  # the sink's column: dS_b = w_b (dP_b - c) with dP_b = 0 (it has no value)
        column = tl.load(Column + bh * L + offs_m, mask=row_live, other=float("-inf"))
        w_b = weight_plus(link_plus(column - tau, z_one, MAP, params) / f, MAP, params)
        tl.store(DColumn + bh * L + offs_m, -w_b * c, mask=row_live)


@triton.jit
def attention_backward_keys(Q, K, V, DO, DK, DV, Tau, Fsum, C, Support, Mask, Params, Upper, Ceiling,
                            H, L, S, E, EV, scale, n_kblocks, n_qblocks, n_params,
                            sq_b, sq_h, sq_l, sq_e, sk_b, sk_h, sk_s, sk_e, sv_b, sv_h, sv_s, sv_e,
                            sd_b, sd_h, sd_l, sd_e, sm_b, sm_h, sm_l, sm_s, su_b, su_h, su_l, su_s,
                            HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                            SOFTCAP: tl.constexpr,
                            SET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                            BLOCK_EV: tl.constexpr, UPCAST: tl.constexpr, MAP: tl.constexpr):
    kb = tl.program_id(0)
    bh, b, h = program_head(H)
    params = MAP.params(Params, bh * n_params)
    z_one = stand_in(MAP, params, SET)
    start = kb * BLOCK_N
    offs_n = start + tl.arange(0, BLOCK_N)
    offs_e = tl.arange(0, BLOCK_E)
    offs_v = tl.arange(0, BLOCK_EV)
    k_base = b * sk_b + h * sk_h
    v_base = b * sv_b + h * sv_h
    m_base = b * sm_b + h * sm_h
    u_base = b * su_b + h * su_h
    ceiling = tl.load(Ceiling + bh) if SET == "box" else 0.0
    v = tl.load(V + v_base + offs_n[:, None] * sv_s + offs_v[None, :] * sv_e,
                mask=(offs_n[:, None] < S) & (offs_v[None, :] < EV), other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_E], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_EV], tl.float32)
    if CAUSAL:
        first = start // BLOCK_M
    else:
        first = 0
    if WINDOW > 0:  # (the last query that sees a key of this block: start + BLOCK_N - 1 + WINDOW - 1)
        last = tl.minimum(n_qblocks, (start + BLOCK_N + WINDOW - 2) // BLOCK_M + 1)
    else:
        last = n_qblocks
    for qb in range(first, last):
        if tl.load(Support + (bh * n_qblocks + qb) * n_kblocks + kb) != 0:
            offs_m = qb * BLOCK_M + tl.arange(0, BLOCK_M)
            row_live = offs_m < L
            q = tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_l + offs_e[None, :] * sq_e,
                        mask=row_live[:, None] & (offs_e[None, :] < E), other=0.0)
            do = tl.load(DO + b * sd_b + h * sd_h + offs_m[:, None] * sd_l + offs_v[None, :] * sd_e,
                         mask=row_live[:, None] & (offs_v[None, :] < EV), other=0.0)
            tau = tl.load(Tau + bh * L + offs_m, mask=row_live, other=float("inf"))
            f = tl.load(Fsum + bh * L + offs_m, mask=row_live, other=1.0)
            c = tl.load(C + bh * L + offs_m, mask=row_live, other=0.0)
            s, slope = capped_scores(q, scale, K, Mask, k_base, m_base, offs_m, start, L, S, E, sk_s, sk_e, sm_l,
                                      sm_s, HAS_MASK, MASK_BOOL, CAUSAL, WINDOW, SOFTCAP, BLOCK_N, BLOCK_E, UPCAST)
            p, w, _ = _weights_of_block(s, Upper, u_base, offs_m, start, L, S, su_l, su_s, ceiling, tau, f, z_one,
                                        MAP, params, SET, BLOCK_N)
            dv += block_product(tl.trans(p).to(do.dtype), do, UPCAST)
            ds = w * (block_product(do, tl.trans(v), UPCAST) - c[:, None]) * slope
            dk += block_product(tl.trans(ds).to(q.dtype), q, UPCAST)
    tl.store(DK + bh * S * E + offs_n[:, None] * E + offs_e[None, :], dk * scale,
             mask=(offs_n[:, None] < S) & (offs_e[None, :] < E))
    tl.store(DV + bh * S * EV + offs_n[:, None] * EV + offs_v[None, :], dv,
             mask=(offs_n[:, None] < S) & (offs_v[None, :] < EV))
