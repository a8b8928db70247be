"""Attention with any derived map: ``out = map(scale * q k^T + mask) v``, forward and backward.

Shapes are batch-first: ``q`` is ``(..., L, E)``, ``k`` is ``(..., S, E)``, ``v``
is ``(..., S, Ev)``; leading dimensions broadcast.  A boolean ``mask`` is True
where a query may attend (as in ``torch.nn.functional.scaled_dot_product_attention``
and ``jax.nn``); a float mask is added to the scores; either broadcasts to
``(..., L, S)``.  ``causal=True`` allows key ``j`` for query ``i`` when ``j <= i``
(the upper-left lower triangle).  A query with nothing to attend to gets
weights 0 and output 0 (so do all queries when there are no keys, ``S = 0``).

A key that a query may not attend to (masked, in the future under ``causal``,
or with a score of ``-inf``) is absent for that query: a NaN or infinity in its
row of ``k`` or ``v`` changes neither that query's output nor the gradients.
A NaN score among the keys a query does attend to makes that query's output
NaN, on every path (dense, query blocks, key blocks).

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

Large batches run as tasks of whole batch elements on the threads of
:mod:`numeric.parallel`, with BLAS on one thread per task; the tasks depend only
on the shapes, so the numbers are the same for every thread count.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .backend import array_module
from .constraints import SIMPLEX, choose
from . import modifiers
from .maps import Map, get_map, take_keywords
from .parallel import run_tasks
from .plan import Plan, dense_rows, keyword_shape, rows_within
from .summaries import Dot, ScaledDot, score_function

__all__ = ["attention", "attention_backward", "DENSE_LIMIT"]

#: Above this many score entries per batch element (L * S) the blocked path is used.
DENSE_LIMIT = 1 << 22


def _check_block(value, name: str):
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    return value


def _score_choice(scores, scale):
    """``(fast_scale, score_function)``: the scale of the dot-product fast path and None, or None and the function."""
    if scores is None:
        return scale, None
    sf = score_function(scores)
    if type(sf) is ScaledDot:
        if scale is not None and sf.scale is not None and float(scale) != float(sf.scale):
            raise ValueError(f"scale = {scale} contradicts the score function's scale {sf.scale}")
        return (sf.scale if scale is None else scale), None
    if scale is not None:
        raise ValueError(f"scale applies to the scaled dot product; the score function {sf!r} carries its own")
    if type(sf) is Dot:
        return 1.0, None
    return None, sf


def _check_constraints(xp, constraints: dict, scores: tuple) -> tuple:
    """``(set, numbers, arrays)`` for :func:`attention`'s constraint keywords (:func:`numeric.constraints.choose`):
    the set, its keywords given as numbers (or left out), and those given as arrays, each broadcasting to the
    scores (no batch dimensions added; a keyword of one value per row given as a 1-D array holds one value per head,
    :func:`numeric.plan.keyword_shape`) and made at least 2-D; their values are checked by the map (the set's
    :meth:`~numeric.constraints.ConstraintSet.rows`)."""
    cset, values = choose(constraints)
    numbers_, arrays = {}, {}
    for name, value in values.items():
        if value is None or isinstance(value, numbers.Real) and not isinstance(value, bool):
            numbers_[name] = value if value is None else float(value)
            continue
        a = xp.asarray(value)
        if a.dtype.kind not in "fiu":
            raise TypeError(f"{name} must be a real number or a real array, got dtype {a.dtype}")
        a = a.reshape(keyword_shape(name, a.shape, scores, name in cset.per_score))
        arrays[name] = a.reshape((1,) * max(0, 2 - a.ndim) + a.shape)
    return cset, numbers_, arrays


def _part(a, rows: slice, keys: slice):
    """A constraint array's part for the query rows ``rows`` and the keys ``keys``."""
    return a[..., rows if a.shape[-2] != 1 else slice(None), keys if a.shape[-1] != 1 else slice(0, 1)]


def _prepare(q, k, v, mapping, mask, causal, scale, scores=None):
    xp = array_module(q, k, v, mask)  # None and Python scalars do not decide
    q, k, v = (xp.asarray(a) for a in (q, k, v))
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have shape (..., length, features), got {a.shape}")
    scale, sf = _score_choice(scores, scale)
    if sf is None:
        if q.shape[-1] != k.shape[-1]:
            raise ValueError(f"q and k must share their feature size: q {q.shape}, k {k.shape}")
        if q.shape[-1] == 0:
            raise ValueError(f"q and k have no features (q {q.shape}, k {k.shape}): the scores q k^T would be empty sums")
    else:
        sf.check(q, k)
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length: k {k.shape}, v {v.shape}")
    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(f"batch shapes do not broadcast: q {q.shape}, k {k.shape}, v {v.shape}") from None
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)
    if dtype == np.float16:
        dtype = np.dtype(np.float32)
    q, k, v = (a.astype(dtype, copy=False) for a in (q, k, v))
    m = mapping if isinstance(mapping, Map) else get_map(mapping)
    if sf is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    L, S = q.shape[-2], k.shape[-2]
    if mask is not None:
        mask = xp.asarray(mask)
        if mask.dtype != np.bool_ and mask.dtype.kind != "f":
            raise TypeError(f"mask must be boolean (True = may attend) or float (added to the scores), got dtype {mask.dtype}")
        scores = batch + (L, S)
        if mask.ndim == 0:
            raise ValueError(f"mask must have at least one dimension (the keys), got a 0-d mask; the scores' shape is {scores}")
        try:
            shape = np.broadcast_shapes(mask.shape, scores)
        except ValueError:
            raise ValueError(f"mask of shape {mask.shape} does not broadcast to the scores' shape {scores}") from None
        if shape != scores:
            raise ValueError(f"mask of shape {mask.shape} has batch dimensions that q {q.shape}, k {k.shape} and "
                             f"v {v.shape} lack: it must broadcast to the scores' shape {scores}")
        if mask.ndim == 1:  # (S,): the same keys for every query
            mask = mask[None, :]
    return xp, q, k, v, m, scale, mask, sf


def _param_table(m: Map, batch: tuple, L: int, S: int):
    """A map with values per row: its parameters as one ``batch + (L, n_params)`` view (float64), else None."""
    if not m.per_row:
        return None
    table = m._param_rows(batch + (L, S), -1)  # checks that each parameter broadcasts to the scores
    return table.reshape(batch + (L, table.shape[-1]))


def _block_map(m: Map, table, rows: slice) -> Map:
    """The map for the query rows ``rows`` (a view of the table's rows when the map has values per row)."""
    if table is None:
        return m
    part = table[..., rows, :]
    return m.bound({name: part[..., i:i + 1] for i, name in enumerate(m.params)})


def _nonfinite_keys(xp, k, v):
    """Indices (NumPy) of the keys whose row of ``k`` or ``v`` holds a NaN or an infinity in some batch element, or None."""
    with np.errstate(over="ignore", invalid="ignore"):  # a sum that overflows only sends us to the exact check
        if bool(xp.isfinite(k.sum())) and bool(xp.isfinite(v.sum())):
            return None
    rows = ~xp.isfinite(k).all(axis=-1) | ~xp.isfinite(v).all(axis=-1)
    rows = rows.reshape(-1, rows.shape[-1]).any(axis=0)
    index = np.flatnonzero(rows.get() if hasattr(rows, "get") else rows)
    return index if index.size else None


def _finite(xp, a):
    """``a`` with its NaNs and infinities replaced by 0 (the rows of keys that are absent for some query)."""
    return xp.where(xp.isfinite(a), a, xp.zeros((), dtype=a.dtype))


def _local(xp, bad, cols: slice):
    """The entries of ``bad`` (key indices) inside ``cols``, relative to ``cols.start``, as an index array; or None."""
    if bad is None:
        return None
    inside = bad[(bad >= cols.start) & (bad < cols.stop)] - cols.start
    return xp.asarray(inside) if inside.size else None


def _present_matmul(xp, w, x0, xj, keep, cols):
    """``w @ x`` where the rows ``cols`` of ``x`` (non-finite somewhere) count only for the queries they are present to.

    ``x0`` is ``x`` with its non-finite entries set to 0 and ``xj = x[..., cols, :]``;
    ``keep`` (``w[..., cols]``'s shape) is True where the key is present.  The
    non-finite entries are added as IEEE arithmetic would (``w * inf`` is
    ``+-inf`` or NaN for ``w = 0``, a NaN stays NaN, ``inf - inf`` is NaN), but
    only where ``keep`` holds, so an absent key's NaN is not ``0 * NaN``.
    """
    out = xp.matmul(w, x0)
    wj = w[..., cols]
    f = w.dtype

    def hits(sel, cond):  # any j with sel[i, j] and cond[j, e]: a product of 0/1 matrices
        return xp.matmul(sel.astype(f), cond.astype(f)) > 0

    nan = hits(keep, xp.isnan(xj)) | hits(keep & (wj == 0), xp.isinf(xj))
    up = hits(keep & (wj > 0), xj == xp.inf) | hits(keep & (wj < 0), xj == -xp.inf)
    down = hits(keep & (wj > 0), xj == -xp.inf) | hits(keep & (wj < 0), xj == xp.inf)
    zero = xp.zeros((), dtype=f)
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, as in the plain product
        out = out + xp.where(up, xp.asarray(xp.inf, dtype=f), zero) + xp.where(down, xp.asarray(-xp.inf, dtype=f), zero)
    return xp.where(nan, xp.asarray(xp.nan, dtype=f), out)


def _scores(xp, q, k, mask, plan: Plan, block, cols: slice, bad=None, sf=None, cap=None, slopes=None):
    """Masked scores for the queries of the plan's ``block`` against the keys ``cols``.

    ``q k^T`` (``q`` is scaled once by the caller: L x E work, not L x S), or the
    score function ``sf`` on the block, capped by ``cap`` (:class:`numeric.modifiers.Softcap`, or ``None``) before
    the mask; the keys the plan hides from a row (causal, window) are ``-inf``.
    ``bad``: indices (relative to the keys taken) of keys with non-finite rows, or None.  ``slopes``: a list that
    receives the cap's derivative at these scores (for the backward's chain rule).
    """
    rows = block.rows
    if sf is None:
        a = xp.matmul(q[..., rows, :], xp.swapaxes(k[..., cols, :], -1, -2))
    else:
        a = xp.asarray(sf(q[..., rows, :], k[..., cols, :])).astype(q.dtype, copy=False)
    if cap is not None:
        a = cap(xp.tanh, a)
        if slopes is not None:
            slopes.append(cap.slope(a))
    if mask is not None:
        part = mask[..., rows, cols] if mask.ndim >= 2 and mask.shape[-2] != 1 else mask[..., cols]
        if mask.dtype == np.bool_:
            a = xp.where(part, a, -xp.inf)
        else:
            part = part.astype(a.dtype, copy=False)
            if bad is None:
                a = a + part
            else:  # masked by -inf stays -inf, also where k's row gives a NaN or inf score
                with np.errstate(invalid="ignore"):
                    a = a + part
                a[..., bad] = xp.where(part[..., bad] == -xp.inf, -xp.inf, a[..., bad])
    return plan.hide(xp, a, block, cols)


def _online_closed(xp, m, q, k, v, v0, mask, plan, block, key_block, bad, sf, cap=None):
    """One query block by an online, rescaled accumulation over key blocks (closed-threshold maps).

    For a closed threshold ``p_j = B(s_j - c) / sum_i B(s_i - c)`` for any shift
    ``c``, and ``B(s + d) = B(s) B(d) / B(0)`` (``g(s - tau) = A(tau) B(s)`` forces
    ``B`` to be exponential), so partial sums taken under a running maximum can
    be rescaled when the maximum grows: memory ``block x key_block``.  The
    running maximum turns NaN (or ``+inf``) with the first such score and stays
    so, and those rows come out NaN, as from the dense map.
    """
    mod = m.module
    params = m.cast_params(q.dtype)
    b0 = mod.term(xp.zeros((), dtype=q.dtype), *params)
    shape = q[..., block.rows, :].shape[:-1]
    top = xp.full(shape, -xp.inf, dtype=q.dtype)
    total = xp.zeros(shape, dtype=q.dtype)
    acc = xp.zeros(shape + (v.shape[-1],), dtype=q.dtype)
    for cols in plan.key_blocks(block, key_block):
        here = _local(xp, bad, cols)
        a = _scores(xp, q, k, mask, plan, block, cols, here, sf, cap)
        keep = None if here is None else a[..., here] != -xp.inf
        new_top = xp.maximum(top, a.max(axis=-1))  # NaN and +inf propagate
        live = xp.isfinite(new_top)
        safe_top = xp.where(live, new_top, 0)
        grows = live & xp.isfinite(top)
        rescale = xp.where(grows, mod.term(xp.where(grows, top - safe_top, 0), *params) / b0, 0)
        use = xp.isfinite(a) & live[..., None]
        b = xp.where(use, mod.term(xp.where(use, a - safe_top[..., None], 0), *params), 0)
        total = total * rescale + b.sum(axis=-1)
        if keep is None:
            acc = acc * rescale[..., None] + xp.matmul(b, v[..., cols, :])
        else:
            acc = acc * rescale[..., None] + _present_matmul(xp, b, v0[..., cols, :], v[..., cols, :][..., here, :], keep, here)
        top = new_top
    out = xp.where(total[..., None] > 0, acc / xp.where(total > 0, total, 1)[..., None], 0)
    broken = xp.isnan(top) | (top == xp.inf)
    return xp.where(broken[..., None], xp.asarray(xp.nan, dtype=out.dtype), out)


def _plan(L: int, S: int, block: int | None, causal: bool, window: int | None = None) -> Plan:
    """The call's :class:`~numeric.plan.Plan`: ``block`` rows at a time, or (``None``) every row in calls of at most
    :data:`DENSE_LIMIT` scores (:func:`~numeric.plan.dense_rows`), and blocks of ``DENSE_LIMIT / 4`` scores above;
    ``window``: each query sees the ``window`` keys up to and including itself."""
    causal = causal or window is not None
    if block is None:
        block = dense_rows(L, causal) if L * S <= DENSE_LIMIT else min(L, rows_within(DENSE_LIMIT // 4, S))
    return Plan(L, S, block, causal=causal, window=window)


def _length_factor(xp, length, plan: Plan, sf, q, scores: tuple):
    """``(factor, logs, coef)`` of the length scale ``length`` (:class:`numeric.modifiers.LengthScale`) for the
    plan's query rows: the factor per row ``(..., L, 1)`` that the queries are multiplied by, ``log x`` and the
    coefficient as arrays of ``q``'s dtype (the coefficient a float where given as a number); ``None`` for none."""
    if length is None:
        return None
    if sf is not None:
        raise ValueError(f"length_scale scales the queries of the dot product; the score function {sf!r} is not one")
    logs = xp.asarray(length.logs(plan), dtype=q.dtype)
    coef = length.coef
    if not isinstance(coef, float):
        coef = xp.asarray(coef)
        if coef.dtype.kind not in "fiu":
            raise TypeError(f"the length scale's coefficient must be real, got dtype {coef.dtype}")
        coef = coef.reshape(length.coef_shape(coef.shape, scores)).astype(q.dtype, copy=False)
    return length.factor(logs, coef), logs, coef


def attention(q, k, v, *, mapping="softmax", mask=None, causal=False, scale=None, return_weights=False, block=None,
              key_block=None, scores=None, window=None, softcap=None, length_scale=None, **constraints):
    """``map(scale q k^T + mask) v`` along the keys (or ``map(f(q, k) + mask) v`` for a score function ``f``).

    Parameters
    ----------
    q, k, v:
        ``(..., L, E)``, ``(..., S, E)``, ``(..., S, Ev)``, NumPy or CuPy; ``E > 0``,
        ``L`` and ``S`` may be 0 (no keys: every output is 0).  With a score
        function, ``q`` and ``k`` have the feature sizes it takes.
    mapping:
        A map name (``"softmax"``, ``"sparsemax"``, ``"entmax15"``, a generated
        module's name), a module, or a :class:`~numeric.maps.Map`.  A Map's
        parameters may hold one value per query row: arrays broadcasting to
        ``(..., L, S)`` with size 1 along the keys, e.g. ``alpha`` of shape
        ``(H, 1, 1)`` for one alpha per head of ``(N, H, L, S)`` scores.
    mask:
        Boolean (True = may attend) or float (added), broadcastable to ``(..., L, S)``
        where ``...`` is the batch shape of ``q``, ``k`` and ``v`` (a mask adds no
        batch dimensions).
    causal:
        Query ``i`` sees keys ``j <= i``.
    scale:
        Score scale of the scaled dot product, ``1/sqrt(E)`` by default.
    scores:
        The score (summary) function: ``None`` or ``"scaled_dot"`` (``scale q k^T``,
        the fast path), ``"dot"`` (``q k^T``), or a
        :class:`~numeric.summaries.ScoreFunction` such as
        :class:`~numeric.summaries.Additive` or :class:`~numeric.summaries.Bilinear`.
    return_weights:
        Also return the weights ``(..., L, S)`` (forces the dense path's memory).
    block:
        Query block size (a positive integer); ``None`` chooses dense up to
        :data:`DENSE_LIMIT` score entries and blocks of about ``DENSE_LIMIT / 4``
        entries beyond.
    key_block:
        Key block size (a positive integer) for maps with a closed-form threshold
        (softmax): keys are then taken ``key_block`` at a time with an online,
        rescaled accumulation, so no block of scores is wider than ``key_block``.
        ``None`` does this only when a query block would see more than
        :data:`DENSE_LIMIT` / 4 keys.
    softcap:
        A cap ``c > 0`` on the scores (Gemma 2): each becomes ``c tanh(s / c)`` before the mask is added and the
        map is applied (:class:`numeric.modifiers.Softcap`); ``None``: none.
    length_scale:
        Each query's scores times a factor of its position or of the number of keys it sees, before the cap and
        the mask: :func:`numeric.modifiers.ssmax` (Scalable-Softmax, ``s log n``) or
        :func:`numeric.modifiers.llama4` (``1 + a log(1 + floor((i + 1) / floor))``), applied to the queries
        (:class:`~numeric.modifiers.LengthScale`); the scaled dot product only.  ``None``: none.
    window:
        A sliding window (a positive integer, implying ``causal``): query ``i`` sees the ``window`` keys
        ``i - window < j <= i``; the key blocks before a query block's window are skipped (:class:`~numeric.plan.Plan`),
        no ``L x S`` mask is made.
    constraints:
        The keywords of a constraint set other than the simplex (:mod:`numeric.constraints`), each a number or
        an array broadcastable to ``(..., L, S)`` (no batch dimensions added; size 1 along the keys for a
        keyword of one value per row; a 1-D array of such a keyword holds one value per head).  ``sink=``: a sink
        per row or per head (:mod:`numeric.constraints.sink`); ``total=None``: no sum
        (:mod:`numeric.constraints.nosum`).  The box: ``upper``, a bound on each weight, ``>= 0``, the map over ``0
        <= p <= upper`` (:meth:`~numeric.maps.Map.__call__`), as in constrained (fertility-bounded) attention;
        the bounds of the keys a query may attend to (unmasked and, with ``causal``, ``j <= i``) must sum to at
        least its ``total`` (1 unless given; "infeasible bounds" otherwise).

    Returns
    -------
    ``out`` of shape ``(..., L, Ev)``, and the weights if asked.
    """
    block, key_block = _check_block(block, "block"), _check_block(key_block, "key_block")
    cap = modifiers.softcap(softcap)
    xp, q, k, v, m, scale, mask, sf = _prepare(q, k, v, mapping, mask, causal, scale, scores)
    L, S = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    out = xp.zeros(batch + (L, v.shape[-1]), dtype=q.dtype)
    weights = xp.zeros(batch + (L, S), dtype=q.dtype) if return_weights else None
    if L == 0 or S == 0:
        return (out, weights) if return_weights else out
    table = _param_table(m, batch, L, S)
    m, constraints = take_keywords(m, constraints)
    cset, given, arrays = _check_constraints(xp, constraints, batch + (L, S))
    online = (m.threshold == "closed" and table is None and not return_weights and cset is SIMPLEX
              and (key_block is not None or S > DENSE_LIMIT // 4))
    key_block = key_block or DENSE_LIMIT // 4
    plan = _plan(L, S, block, causal, window)
    length = _length_factor(xp, modifiers.length_scale(length_scale), plan, sf, q, batch + (L, S))
    if sf is None:
        q = q * q.dtype.type(scale) if length is None else q * (length[0] * q.dtype.type(scale))
    bad = _nonfinite_keys(xp, k, v)
    v0 = None if bad is None else _finite(xp, v)

    names = tuple(arrays)  # (an array goes with the tasks; a number is shared)

    def core(q, k, v, v0, mask, table, *rest):
        *parts, out, weights = rest
        for b in plan:
            rows, cols = b.rows, b.keys
            if online:
                out[..., rows, :] = _online_closed(xp, m, q, k, v, v0, mask, plan, b, key_block, bad, sf, cap)
                continue
            here = _local(xp, bad, cols)
            a = _scores(xp, q, k, mask, plan, b, cols, here, sf, cap)
            keep = None if here is None else a[..., here] != -xp.inf
            here_set = {**given, **{n: _part(c, rows, cols) for n, c in zip(names, parts)}}
            p = _block_map(m, table, rows).forward(a, axis=-1, overwrite=True, **here_set)[0]
            if keep is None:
                out[..., rows, :] = xp.matmul(p, v[..., cols, :])
            else:
                out[..., rows, :] = _present_matmul(xp, p, v0[..., cols, :], v[..., cols, :][..., here, :], keep, here)
            if weights is not None:
                weights[..., rows, cols] = p

    _run(xp, core, batch, (q, k, v, v0, mask, table, *arrays.values()), (out, weights), L * S)
    return (out, weights) if return_weights else out


def attention_backward(q, k, v, dout, *, mapping="softmax", mask=None, causal=False, scale=None, block=None,
                       scores=None, param_grads=False, window=None, softcap=None, length_scale=None, **constraints):
    """Gradients ``(dq, dk, dv)`` of ``sum(dout * attention(q, k, v, ...))``.

    Same keywords as :func:`attention`; the weights are recomputed block by
    block.  Gradients are reduced over broadcast batch dimensions so that each
    has its input's shape.  A key absent for a query adds nothing to that
    query's gradients, even where its row of ``k`` or ``v`` is not finite.

    ``param_grads=True`` returns ``(dq, dk, dv, grads)`` with ``grads["map"]``
    the gradients of the map's parameters (a float for a parameter given as a
    number, an array of its shape for one given per row:
    ``dalpha = sum_rows dP . dp/dalpha``, from the KKT system) and
    ``grads["scores"]`` those of the score function's parameters; for each constraint keyword given as an
    array (the box's ``upper``), ``grads[keyword]``, the gradient in it (of its shape); for a length scale whose
    coefficient is an array, ``grads["length_scale"]``, the gradient in it (of its shape).
    """
    block = _check_block(block, "block")
    cap = modifiers.softcap(softcap)
    xp, q, k, v, m, scale, mask, sf = _prepare(q, k, v, mapping, mask, causal, scale, scores)
    L, S = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    dout = xp.asarray(dout).astype(q.dtype, copy=False)
    if dout.shape != batch + (L, v.shape[-1]):
        raise ValueError(f"dout must have the output's shape {batch + (L, v.shape[-1])}, got {dout.shape}")
    dq = xp.zeros(batch + q.shape[-2:], dtype=q.dtype)
    dk = xp.zeros(batch + k.shape[-2:], dtype=q.dtype)
    dv = xp.zeros(batch + v.shape[-2:], dtype=q.dtype)
    names = tuple(m.params)
    drows = xp.zeros(batch + (L, len(names)), dtype=np.float64) if param_grads and names else None
    m, constraints = take_keywords(m, constraints)
    cset, given, arrays = _check_constraints(xp, constraints, batch + (L, S))
    names_set = tuple(arrays)
    # the gradients in the set's arrays: (..., L, S) for a keyword of one value per score, (..., L, 1) per row
    dset = [xp.zeros(batch + (L, S if n in cset.per_score else 1), dtype=q.dtype) for n in names_set] \
        if param_grads else []
    score_grads = [{}]
    plan = _plan(L, S, block, causal, window)
    length = _length_factor(xp, modifiers.length_scale(length_scale), plan, sf, q, batch + (L, S))
    q0 = q
    if length is not None:  # (the queries times the factor; the chain rule through it below)
        q = q * length[0]
    if L and S:
        table = _param_table(m, batch, L, S)
        qs = q * q.dtype.type(scale) if sf is None else q
        bad = _nonfinite_keys(xp, k, v)
        k0 = None if bad is None else _finite(xp, k)

        def core(q, qs, k, k0, v, dout, mask, table, *rest):
            parts, (dq, dk, dv, drows), dparts = rest[:len(names_set)], rest[len(names_set):][:4], \
                rest[len(names_set) + 4:]
            sums = {}
            for b in plan:
                rows, cols = b.rows, b.keys
                here = _local(xp, bad, cols)
                slopes = [] if cap is not None else None
                a = _scores(xp, qs, k, mask, plan, b, cols, here, sf, cap, slopes)
                keep = None if here is None else a[..., here] != -xp.inf
                mb = _block_map(m, table, rows)
                here_set = {**given, **{n: _part(c, rows, cols) for n, c in zip(names_set, parts)}}
                # (the derivatives may need the scores: a sink's weight, the box's one-sided derivatives)
                kept = a.copy() if cset.jacobian_scores or dparts and cset.needs_scores else None
                p = mb.forward(a, axis=-1, overwrite=True, **here_set)[0]
                g = dout[..., rows, :]
                dv[..., cols, :] += xp.matmul(xp.swapaxes(p, -1, -2), g)
                with np.errstate(invalid="ignore"):  # inf - inf only in columns of non-finite keys, set below
                    dp = xp.matmul(g, xp.swapaxes(v[..., cols, :], -1, -2))
                if keep is not None:  # column j of dp is dout . v_j: absent keys' columns are 0
                    dp[..., here] = xp.where(keep, dp[..., here], 0)
                da = mb.vjp(p, dp, axis=-1, x=kept if cset.jacobian_scores else None, **here_set)
                if slopes:  # the cap's chain rule (a key absent for the row, with da = 0, may have a NaN slope)
                    da = da * xp.where(xp.isnan(slopes[0]), 0, slopes[0])
                if dparts:
                    own = mb.vjp_bounds(p, dp, axis=-1, x=kept, **here_set)
                    for name, d in zip(names_set, dparts):
                        g = own[name]
                        d[..., rows, cols if name in cset.per_score else slice(0, 1)] = \
                            g if name in cset.per_score else g[..., None]
                if drows is not None:
                    per_row = mb.vjp_params(p, dp, axis=-1, x=kept if cset.jacobian_scores else None, **here_set)
                    for i, name in enumerate(names):
                        drows[..., rows, i] = per_row[name]
                if sf is not None:  # absent keys have da = 0; their non-finite rows of k are read as 0
                    dq_b, dk_b, dparams = sf.backward(q[..., rows, :], (k if k0 is None else k0)[..., cols, :], da)
                    dq[..., rows, :] = dq_b
                    dk[..., cols, :] += dk_b
                    for name, value in dparams.items():
                        sums[name] = value if name not in sums else sums[name] + value
                    continue
                da *= da.dtype.type(scale)
                if keep is None:
                    dq[..., rows, :] = xp.matmul(da, k[..., cols, :])
                else:
                    dq[..., rows, :] = _present_matmul(xp, da, k0[..., cols, :], k[..., cols, :][..., here, :], keep, here)
                dk[..., cols, :] += xp.matmul(xp.swapaxes(da, -1, -2), q[..., rows, :])
            return sums

        score_grads = _run(xp, core, batch, (q, qs, k, k0, v, dout, mask, table, *arrays.values()),
                           (dq, dk, dv, drows, *dset), L * S)
    dlength = None
    if length is not None:  # dq of the scaled queries q0 f: dq0 = dq f, df = sum_e dq q0, dcoef = df log x
        factor, logs, coef = length
        if param_grads and not isinstance(coef, float):
            dlength = _unbroadcast((dq * q0).sum(axis=-1, keepdims=True) * logs, coef.shape, xp)
            dlength = dlength.reshape(xp.asarray(length_scale.coef).shape)  # (as given)
        dq = dq * factor
    grads = _unbroadcast(dq, q0.shape, xp), _unbroadcast(dk, k.shape, xp), _unbroadcast(dv, v.shape, xp)
    if not param_grads:
        return grads
    per_row = {} if drows is None else {name: drows[..., i] for i, name in enumerate(names)}
    map_grads = m.reduce_to_params(per_row, batch + (L, S), -1) if per_row else {}
    score_params = {} if sf is None else sf.params
    totals = {}
    for name in score_params:  # summed in task order: the same numbers for every thread count
        parts = [part[name] for part in score_grads if name in part]
        totals[name] = sum(parts[1:], parts[0]) if parts else xp.zeros_like(xp.asarray(score_params[name]))
    out = {"map": map_grads, "scores": totals}
    for name, d in zip(names_set, dset):
        out[name] = _unbroadcast(d, arrays[name].shape, xp).reshape(xp.asarray(constraints[name]).shape)  # (as given)
    if dlength is not None:
        out["length_scale"] = dlength
    return (*grads, out)


#: Work (batch elements x L x S) from which the batch is cut into tasks for several threads.
PARALLEL_FROM = 1 << 22
#: Scores per task: batch elements are grouped into tasks of about this many (or one element each, when larger).
TASK_WORK = 1 << 20


def _tasks(batch: tuple, per_item: int) -> list:
    """Indices into the batch, each one task: trailing dimensions whole, one dimension in slices, the rest single.

    Slices and integers keep every task a view.  Depends only on the shapes.
    """
    per = max(1, TASK_WORK // max(per_item, 1))
    d, inner = len(batch), 1
    while d > 0 and inner * batch[d - 1] <= per:
        d -= 1
        inner *= batch[d]
    if d == 0:
        return [()]
    step, n = max(1, per // inner), batch[d - 1]
    return [index + (slice(start, min(n, start + step)),) for index in np.ndindex(*batch[:d - 1])
            for start in range(0, n, step)]


def _run(xp, core, batch, inputs, outputs, per_item):
    """``core(*inputs, *outputs)`` over the whole batch, or over tasks of batch elements (:func:`_tasks`).

    Returns the list of ``core``'s results, in task order.

    NumPy only, and only when there are several batch elements and at least
    :data:`PARALLEL_FROM` scores in all: the tasks then run on the threads of
    :func:`numeric.parallel.run_tasks` with BLAS on one thread, so the cores work
    on different heads instead of contending inside one matrix product.  Whether
    the batch is cut, and how, depends only on the shapes, and BLAS runs on one
    thread also when one thread takes every task, so the numbers do not depend
    on the thread count.  Arrays are broadcast to the batch shape as views
    (nothing is copied); each task writes its own part of the outputs.
    """
    count = int(np.prod(batch, dtype=np.int64))
    if xp is not np or count < 2 or count * per_item < PARALLEL_FROM:
        return [core(*inputs, *outputs)]
    views = [None if a is None else np.broadcast_to(a, batch + a.shape[-2:]) for a in inputs]
    tasks = _tasks(batch, per_item)

    results = [None] * len(tasks)

    def task(i):
        index = tasks[i]
        results[i] = core(*[None if a is None else a[index] for a in views],
                          *[None if o is None else o[index] for o in outputs])

    run_tasks(task, len(tasks), blas_single=True)
    return results


def _unbroadcast(g, shape, xp):
    extra = g.ndim - len(shape)
    if extra:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape)) if b == 1 and a != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g
