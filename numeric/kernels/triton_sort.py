"""Batcher's bitonic sorting network in Triton, on the rows of a block: the fused forward keeps each row's
largest scores with it (:func:`keep_largest`, :mod:`numeric.kernels.triton_attention`).

A row of ``N = 2**n`` values is viewed as the hypercube ``[2] * n``; a compare-exchange pairs each element with
its partner across one dimension, so that every stage of the network is one whole-block operation (no gather).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["sort_descending", "keep_largest"]


@triton.constexpr_function
def _log2(n):
    return n.bit_length() - 1


@triton.jit
def _side(N_DIMS: tl.constexpr, d: tl.constexpr):
    # 0 or 1: an element's position along the hypercube's innermost dimension d (shaped to broadcast)
    return tl.reshape(tl.arange(0, 2), [1] * (N_DIMS - 1 - d) + [2] + [1] * d)


@triton.jit
def _exchange(h, descending, N_DIMS: tl.constexpr, d: tl.constexpr):
    # one compare-exchange of a bitonic network: each element and its partner across the innermost dimension d
    # of the hypercube h keep the smaller first where `descending` is 0 (a 0/1 indicator), else the larger.
    # The partner is read off the pair's sum of bits (integer addition wraps, so the sum minus an element is
    # the other one exactly): a sum is a reduction Triton's interpreter runs as one NumPy call
    bits = h.to(tl.int32, bitcast=True)
    other = (tl.sum(bits, N_DIMS - 1 - d, keep_dims=True) - bits).to(tl.float32, bitcast=True)
    right = _side(N_DIMS, d)
    return tl.where((h > other) != ((descending ^ right) != 0), other, h)


@triton.jit
def sort_descending(x, ROWS: tl.constexpr, N: tl.constexpr):
    # each row of x (ROWS x N, N a power of 2) in descending order, by Batcher's bitonic sort on the hypercube
    # [ROWS, 2, ..., 2]: stage k makes runs of 2**k alternately ascending and descending (the last: descending)
    LOG_N: tl.constexpr = _log2(N)
    N_DIMS: tl.constexpr = LOG_N + 1
    h = tl.reshape(x, [ROWS] + [2] * LOG_N)
    for k in tl.static_range(1, LOG_N + 1):
        if k < LOG_N:
            descending = _side(N_DIMS, k)
        else:
            descending = tl.full([1] * N_DIMS, 1, tl.int32)
        for i in tl.static_range(k):
            h = _exchange(h, descending, N_DIMS, k - 1 - i)
    return tl.reshape(h, [ROWS, N])


@triton.jit
def keep_largest(top, s, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KEEP: tl.constexpr):
    # each row's KEEP largest of its running largest `top` and the block's scores `s` (in descending order);
    # KEEP is a multiple of BLOCK_N: the block is widened to KEEP columns with -inf
    if KEEP > BLOCK_N:
        copies = tl.broadcast_to(s[:, None, :], [BLOCK_M, KEEP // BLOCK_N, BLOCK_N])
        first_copy = tl.arange(0, KEEP // BLOCK_N)[None, :, None] == 0
        s = tl.reshape(tl.where(first_copy, copies, float("-inf")), [BLOCK_M, KEEP])
    both = sort_descending(tl.reshape(tl.join(top, s), [BLOCK_M, 2 * KEEP]), BLOCK_M, 2 * KEEP)
    first, _ = tl.split(tl.permute(tl.reshape(both, [BLOCK_M, 2, KEEP]), [0, 2, 1]))
    return first
