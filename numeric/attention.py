"""Attention with any derived map: ``out = map(scale * q k^T + mask) v``, forward and backward.

Shapes are batch-first: ``q`` is ``(..., L, E)``, ``k`` is ``(..., S, E)``, ``v``
is ``(..., S, Ev)``; leading dimensions broadcast.  A boolean ``mask`` is True
where a query may attend (as in ``torch.nn.functional.scaled_dot_product_attention``
and ``jax.nn``); a float mask is added to the scores; either broadcasts to
``(..., L, S)``.  ``causal=True`` allows key ``j`` for query ``i`` when ``j <= i``
(the upper-left lower triangle).  A query with nothing to attend to gets
weights 0 and output 0.

Backward, with ``P = map(A)``, ``A = scale q k^T``:
``dv = P^T dout``, ``dP = dout v^T``, ``dA = J_map^T dP`` (the map's VJP,
``w*dP - w (w.dP)/sum(w)``), ``dq = scale dA k``, ``dk = scale dA^T q``.

Long sequences go through a blocked path automatically: queries are taken
``block`` at a time, so the scores never exceed ``block x S`` (times the batch);
with ``causal=True`` each block only looks at the keys up to its last query, so
blocks above the diagonal are skipped.  For maps with a closed-form threshold
(softmax) the keys can be blocked too, with an online rescaled accumulation.
The backward pass recomputes each query block's weights instead of storing
``L x S`` of them.
"""

from __future__ import annotations

import math
import os

import numpy as np

from .backend import array_module
from .maps import Map, get_map

__all__ = ["attention", "attention_backward", "DENSE_LIMIT"]

#: Above this many score entries per batch element (L * S) the blocked path is used.
DENSE_LIMIT = 1 << 22
#: Smallest query block of a causal call (smaller blocks cost more in overhead than they skip).
CAUSAL_MIN_BLOCK = 128


def _prepare(q, k, v, mapping, mask, causal, scale):
    xp = array_module(q, k, v, mask)  # None and Python scalars do not decide
    q, k, v = (xp.asarray(a) for a in (q, k, v))
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have shape (..., length, features), got {a.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share their feature size: q {q.shape}, k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length: k {k.shape}, v {v.shape}")
    try:
        np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(f"batch shapes do not broadcast: q {q.shape}, k {k.shape}, v {v.shape}") from None
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)
    if dtype == np.float16:
        dtype = np.dtype(np.float32)
    q, k, v = (a.astype(dtype, copy=False) for a in (q, k, v))
    m = mapping if isinstance(mapping, Map) else get_map(mapping)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    L, S = q.shape[-2], k.shape[-2]
    if mask is not None:
        mask = xp.asarray(mask)
        if mask.dtype != np.bool_ and mask.dtype.kind != "f":
            raise TypeError(f"mask must be boolean (True = may attend) or float (added to the scores), got dtype {mask.dtype}")
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        try:
            np.broadcast_shapes(mask.shape, batch + (L, S))
        except ValueError:
            raise ValueError(f"mask of shape {mask.shape} does not broadcast to the scores' shape {batch + (L, S)}") from None
    return xp, q, k, v, m, scale, mask


def _scores(xp, q, k, mask, causal, rows: slice, keys):
    """Masked scores ``q k^T`` for queries ``rows`` against keys ``keys`` (a slice, or a count from 0)."""
    cols = keys if isinstance(keys, slice) else slice(0, keys)
    # q is scaled once by the caller (L x E work, not L x S)
    a = xp.matmul(q[..., rows, :], xp.swapaxes(k[..., cols, :], -1, -2))
    if mask is not None:
        part = mask[..., rows, cols] if mask.ndim >= 2 and mask.shape[-2] != 1 else mask[..., cols]
        if mask.dtype == np.bool_:
            a = xp.where(part, a, -xp.inf)
        else:
            a = a + part.astype(a.dtype, copy=False)
    if causal:  # only keys after the block's first query can be in the future: mask that corner in place
        first = max(cols.start, rows.start + 1)
        if first < cols.stop:
            i = xp.arange(rows.start, rows.stop)[:, None]
            j = xp.arange(first, cols.stop)[None, :]
            xp.copyto(a[..., first - cols.start:], -xp.inf, where=j > i)
    return a


def _online_closed(xp, m, q, k, v, mask, causal, rows, keys, key_block):
    """One query block by an online, rescaled accumulation over key blocks (closed-threshold maps).

    For a closed threshold ``p_j = B(s_j - c) / sum_i B(s_i - c)`` for any shift
    ``c``, and ``B(s + d) = B(s) B(d) / B(0)`` (``g(s - tau) = A(tau) B(s)`` forces
    ``B`` to be exponential), so partial sums taken under a running maximum can
    be rescaled when the maximum grows: memory ``block x key_block``.
    """
    mod = m.module
    params = m._cast(q.dtype)
    b0 = mod.term(xp.zeros((), dtype=q.dtype), *params)
    shape = q[..., rows, :].shape[:-1]
    top = xp.full(shape, -xp.inf, dtype=q.dtype)
    total = xp.zeros(shape, dtype=q.dtype)
    acc = xp.zeros(shape + (v.shape[-1],), dtype=q.dtype)
    for start in range(0, keys, key_block):
        cols = slice(start, min(keys, start + key_block))
        a = _scores(xp, q, k, mask, causal, rows, cols)
        new_top = xp.maximum(top, a.max(axis=-1))
        live = xp.isfinite(new_top)
        safe_top = xp.where(live, new_top, 0)
        rescale = xp.where(xp.isfinite(top), mod.term(xp.where(xp.isfinite(top), top, 0) - safe_top, *params) / b0, 0)
        finite = xp.isfinite(a)
        b = xp.where(finite, mod.term(xp.where(finite, a - safe_top[..., None], 0), *params), 0)
        total = total * rescale + b.sum(axis=-1)
        acc = acc * rescale[..., None] + xp.matmul(b, v[..., cols, :])
        top = new_top
    return xp.where(total[..., None] > 0, acc / xp.where(total > 0, total, 1)[..., None], 0)


def _blocks(L: int, S: int, block: int | None, causal: bool):
    if block is None:
        if L * S <= DENSE_LIMIT:
            # causal: a few blocks skip most of the upper triangle (8 blocks skip 7/16 of it)
            block = max(CAUSAL_MIN_BLOCK, -(-L // 8)) if causal else L
        else:
            block = max(1, min(L, DENSE_LIMIT // (4 * max(S, 1))))
    for start in range(0, L, block):
        stop = min(L, start + block)
        keys = min(S, stop) if causal else S
        yield slice(start, stop), keys


def attention(q, k, v, *, mapping="softmax", mask=None, causal=False, scale=None, return_weights=False, block=None,
              key_block=None):
    """``map(scale q k^T + mask) v`` along the keys.

    Parameters
    ----------
    q, k, v:
        ``(..., L, E)``, ``(..., S, E)``, ``(..., S, Ev)``, NumPy or CuPy.
    mapping:
        A map name (``"softmax"``, ``"sparsemax"``, ``"entmax15"``, a generated
        module's name), a module, or a :class:`~numeric.maps.Map`.
    mask:
        Boolean (True = may attend) or float (added), broadcastable to ``(..., L, S)``.
    causal:
        Query ``i`` sees keys ``j <= i``.
    scale:
        Score scale, ``1/sqrt(E)`` by default.
    return_weights:
        Also return the weights ``(..., L, S)`` (forces the dense path's memory).
    block:
        Query block size; ``None`` chooses dense up to :data:`DENSE_LIMIT` score
        entries and blocks of about ``DENSE_LIMIT / 4`` entries beyond.
    key_block:
        Key block size for maps with a closed-form threshold (softmax): keys are
        then taken ``key_block`` at a time with an online, rescaled accumulation,
        so no block of scores is wider than ``key_block``.  ``None`` does this
        only when a query block would see more than :data:`DENSE_LIMIT` / 4 keys.

    Returns
    -------
    ``out`` of shape ``(..., L, Ev)``, and the weights if asked.
    """
    xp, q, k, v, m, scale, mask = _prepare(q, k, v, mapping, mask, causal, scale)
    L, S = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    out = xp.zeros(batch + (L, v.shape[-1]), dtype=q.dtype)
    weights = xp.zeros(batch + (L, S), dtype=q.dtype) if return_weights else None
    online = m.threshold == "closed" and not return_weights and (key_block is not None or S > DENSE_LIMIT // 4)
    key_block = key_block or DENSE_LIMIT // 4
    q = q * q.dtype.type(scale)

    def core(q, k, v, mask, out, weights):
        for rows, keys in _blocks(L, S, block, causal):
            if online:
                out[..., rows, :] = _online_closed(xp, m, q, k, v, mask, causal, rows, keys, key_block)
                continue
            p = m.forward(_scores(xp, q, k, mask, causal, rows, keys), axis=-1, overwrite=True)[0]
            out[..., rows, :] = xp.matmul(p, v[..., :keys, :])
            if weights is not None:
                weights[..., rows, :keys] = p

    _run(xp, core, batch, (q, k, v, mask), (out, weights), L * S)
    return (out, weights) if return_weights else out


def attention_backward(q, k, v, dout, *, mapping="softmax", mask=None, causal=False, scale=None, block=None):
    """Gradients ``(dq, dk, dv)`` of ``sum(dout * attention(q, k, v, ...))``.

    Same keywords as :func:`attention`; the weights are recomputed block by
    block.  Gradients are reduced over broadcast batch dimensions so that each
    has its input's shape.
    """
    xp, q, k, v, m, scale, mask = _prepare(q, k, v, mapping, mask, causal, scale)
    L, S = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    dout = xp.asarray(dout).astype(q.dtype, copy=False)
    if dout.shape != batch + (L, v.shape[-1]):
        raise ValueError(f"dout must have the output's shape {batch + (L, v.shape[-1])}, got {dout.shape}")
    dq = xp.zeros(batch + q.shape[-2:], dtype=q.dtype)
    dk = xp.zeros(batch + k.shape[-2:], dtype=q.dtype)
    dv = xp.zeros(batch + v.shape[-2:], dtype=q.dtype)
    qs = q * q.dtype.type(scale)

    def core(q, qs, k, v, dout, mask, dq, dk, dv):
        for rows, keys in _blocks(L, S, block, causal):
            p = m.forward(_scores(xp, qs, k, mask, causal, rows, keys), axis=-1, overwrite=True)[0]
            g = dout[..., rows, :]
            dv[..., :keys, :] += xp.matmul(xp.swapaxes(p, -1, -2), g)
            dp = xp.matmul(g, xp.swapaxes(v[..., :keys, :], -1, -2))
            da = m.vjp(p, dp, axis=-1)
            da *= da.dtype.type(scale)
            dq[..., rows, :] = xp.matmul(da, k[..., :keys, :])
            dk[..., :keys, :] += xp.matmul(xp.swapaxes(da, -1, -2), q[..., rows, :])

    _run(xp, core, batch, (q, qs, k, v, dout, mask), (dq, dk, dv), L * S)
    return _unbroadcast(dq, q.shape, xp), _unbroadcast(dk, k.shape, xp), _unbroadcast(dv, v.shape, xp)


#: Work (batch elements x L x S) from which batch elements are spread over the cores.
PARALLEL_FROM = 1 << 22
_POOL = None


def _run(xp, core, batch, inputs, outputs, per_item):
    """``core(*inputs, *outputs)`` over the whole batch, or one batch element per task on all cores.

    NumPy only, and only when there are several batch elements and enough work:
    each task runs with BLAS limited to one thread (threadpoolctl), so the cores
    work on different heads instead of contending inside one matrix product.
    Arrays are broadcast to the batch shape as views (nothing is copied).
    """
    global _POOL
    count = int(np.prod(batch, dtype=np.int64))
    workers = min(os.cpu_count() or 1, 8)
    if xp is not np or count < 2 or workers < 2 or count * per_item < PARALLEL_FROM:
        return core(*inputs, *outputs)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # optional: without it, one BLAS call at a time on all cores
        return core(*inputs, *outputs)
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="regattn-attention")
    views = [None if a is None else np.broadcast_to(a, batch + a.shape[-2:]) for a in inputs]

    def task(index):
        core(*[None if a is None else a[index] for a in views], *[None if o is None else o[index] for o in outputs])

    with threadpool_limits(1, user_api="blas"):
        for future in [_POOL.submit(task, index) for index in np.ndindex(*batch)]:
            future.result()


def _unbroadcast(g, shape, xp):
    extra = g.ndim - len(shape)
    if extra:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape)) if b == 1 and a != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g
