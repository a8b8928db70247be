"""Attention with any regattn map for JAX, in the shapes and conventions of :func:`jax.nn.dot_product_attention`.

``attention(query, key, value, mask, is_causal, scale, mapping)`` computes
``mapping(scale * query key^T)`` along the keys and averages ``value`` with
those weights:

* ``query`` is ``(B, T, N, H)``, ``key`` ``(B, S, K, H)``, ``value``
  ``(B, S, K, Hv)``, or the same without ``B`` (one example); ``K`` must divide
  ``N`` (grouped-query attention: query head ``n`` reads key/value head
  ``n // (N // K)``, as ``jax.nn``); the output is ``(B, T, N, Hv)``;
* ``mask`` is boolean, broadcastable to the scores' shape ``(B, N, T, S)``,
  True where a query may attend; ``bias`` (keyword) is added to the scores;
* ``is_causal=True`` lets query ``t`` see the keys ``s <= t`` (top-left
  aligned, also for ``T != S``, as ``jax.nn``); it combines with ``mask``;
* ``scale`` defaults to ``1 / sqrt(H)``;
* ``upper`` (keyword) bounds each weight: a number, or an array broadcastable to
  the scores' shape ``(B, N, T, S)`` (a bound per query and key, per head, per
  example), ``>= 0``.

``mapping`` is a map name (``"softmax"``, ``"sparsemax"``, ``"entmax15"``,
``"entmax"``, a generated module's name), a generated module, or a
:class:`~numeric.jax.maps.JaxMap` with its parameters bound, e.g. one
``alpha`` per head as an array of shape ``(N, 1, 1)`` (broadcasting to the
scores ``(B, N, T, S)``; any shape that broadcasts with size 1 along ``S``
works), traced or not: its gradient flows.

**Bounded weights.**  With ``upper`` each query's weights are the map over the
box ``0 <= p <= upper``, ``sum p = 1`` instead of the simplex
(:meth:`~numeric.jax.maps.JaxMap.__call__`, :func:`numeric.constraints.box.box_solve`):
``p_j = min(u_j, g_+(s_j - tau))``, constrained (fertility-style) attention in
which no key takes more than its bound of a query's attention (constrained
softmax and sparsemax, Martins and Kreutzer 2017; Malaviya et al. 2018, where the
bounds are what a source word has left of its fertility).  Gradients flow into
``upper`` (an array, traced or not): non-zero where a weight sits at its bound.
A query's bounds on the keys it may attend to (those of ``mask``, of
``is_causal``, with finite scores) must sum to at least 1 (within rounding): where
the map can read the values (an eager call whose scores fit one block) such bounds
are refused (``ValueError: infeasible bounds``), a fully masked query's too (its
bounds sum to 0), as :func:`numeric.attention` and :func:`numeric.torch.attention`
refuse them; traced (under ``jit``, ``grad``, or in blocks) the row's weights, and
so its output, are NaN, and a fully masked query's are 0.

**Fully masked rows.**  A query that may attend to no key gets weights 0 and
output 0 (and zero gradients), for every mapping.  ``jax.nn.dot_product_attention``
(its XLA implementation) fills masked scores with a large negative number
instead of ``-inf``, so such a row gets uniform softmax weights there: the
mean of the values.  Every other row agrees with it.

**Memory.**  The queries are taken in blocks of rows so that no more than
about :data:`BLOCK_ENTRIES` scores (``B x N x rows x S``) exist at once:
:func:`jax.lax.map` runs the blocks one after the other, each under
:func:`jax.checkpoint`, so the backward pass recomputes a block's scores and
weights instead of storing ``T x S`` of them.  A call whose scores fit in one
block runs without the loop.  ``block_size`` (keyword) sets the rows a block.

    >>> import jax.numpy as jnp
    >>> q = k = jnp.array([[[1.0], [0.0]], [[0.0], [1.0]]]).reshape(2, 1, 2)  # (T, N, H)
    >>> v = jnp.array([[[1.0]], [[2.0]]])
    >>> attention(q, k, v, scale=10.0, mapping="sparsemax")[:, 0]
    Array([[1.],
           [2.]], dtype=float32)
    >>> attention(q, k, v, is_causal=True, mapping="sparsemax")[:, 0]
    Array([[1.       ],
           [1.8535535]], dtype=float32)
"""

from __future__ import annotations

import math
from types import ModuleType

import jax
import jax.numpy as jnp
from jax import lax

from .. import front, modifiers
from ..constraints import SIMPLEX, choose
from ..plan import Plan, keyword_shape, rows_within
from ..maps import take_keywords
from .maps import JaxMap, compute_dtype, get_map

__all__ = ["attention", "BLOCK_ENTRIES"]

#: Query blocks hold at most about this many score entries (B x N x rows x S; at least one row a block).
BLOCK_ENTRIES = 1 << 20


def _array(x, name: str):
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"{name} must be an array, got {type(x).__name__}")
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {x.dtype}")
    return x


def check_inputs(query, key, value):
    query, key, value = _array(query, "query"), _array(key, "key"), _array(value, "value")
    if not query.ndim == key.ndim == value.ndim or query.ndim not in (3, 4):
        raise ValueError(f"query, key and value must all be (B, T|S, heads, features) or all (T|S, heads, features); "
                         f"got shapes {tuple(query.shape)}, {tuple(key.shape)} and {tuple(value.shape)}")
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"query, key and value must have the same dtype, got {query.dtype}, {key.dtype} and {value.dtype}")
    unbatched = query.ndim == 3
    if unbatched:
        query, key, value = query[None], key[None], value[None]
    B, T, N, H = query.shape
    if key.shape[0] != B or value.shape[0] != B:
        raise ValueError(f"query, key and value must have the same batch size B: {tuple(query.shape)}, "
                         f"{tuple(key.shape)}, {tuple(value.shape)}")
    if key.shape[-1] != H:
        raise ValueError(f"query and key must have the same feature size H: query {tuple(query.shape)}, "
                         f"key {tuple(key.shape)}")
    if key.shape[1:3] != value.shape[1:3]:
        raise ValueError(f"key and value must have the same length S and heads K: key {tuple(key.shape)}, "
                         f"value {tuple(value.shape)}")
    K = key.shape[2]
    if N % K:
        raise ValueError(f"the key/value heads K = {K} must divide the query heads N = {N}")
    return query, key, value, unbatched


def _scores_shaped(a, name: str, shape: tuple, boolean: bool):
    """``mask``, ``bias`` or a constraint keyword's array checked and given 4 dimensions (broadcasting to ``shape``
    = (B, N, T, S))."""
    if not hasattr(a, "dtype") or not hasattr(a, "shape"):
        raise TypeError(f"{name} must be an array, got {type(a).__name__}")
    a = jnp.asarray(a)
    if boolean and a.dtype != jnp.bool_:
        raise TypeError(f"mask must be boolean (True = may attend), got dtype {a.dtype}; pass additive scores as bias")
    if not boolean and not jnp.issubdtype(a.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {a.dtype}")
    if a.ndim > 4:
        raise ValueError(f"{name} of shape {tuple(a.shape)} has more dimensions than the scores (B, N, T, S) = {shape}")
    a = a.reshape((1,) * (4 - a.ndim) + tuple(a.shape))
    try:
        ok = tuple(jnp.broadcast_shapes(a.shape, shape)) == shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{name} of shape {tuple(a.shape)} does not broadcast to the scores' shape (B, N, T, S) = {shape}")
    return a


def resolve_mapping(mapping) -> JaxMap:
    if isinstance(mapping, (str, ModuleType, JaxMap)):
        m = get_map(mapping)
    else:
        raise TypeError(f"mapping must be a map name, a generated map module or a JaxMap, got {mapping!r}")
    missing = [n for n in m.declared.PARAMETERS if n not in m.params]
    if missing:
        raise ValueError(f"map {m.name!r} needs a value for {', '.join(missing)}: bind it, e.g. "
                         f"get_map({m.name!r}, {missing[0]}=jnp.full((N, 1, 1), ...))")
    return m


def attention(query, key, value, mask=None, is_causal: bool = False, scale=None, mapping="softmax", *,
              bias=None, block_size: int | None = None, window: int | None = None, softcap=None, length_scale=None,
              **constraints):
    """``mapping(scale * query key^T + bias, masked) value`` with :func:`jax.nn.dot_product_attention`'s shapes.

    See the module's description.  Returns ``(B, T, N, Hv)`` (``(T, N, Hv)`` for
    unbatched inputs) in the query's dtype; float16 and bfloat16 compute in float32.
    ``constraints``: the keywords of a constraint set other than the simplex (:mod:`numeric.constraints`), each
    a number or an array broadcastable to ``(B, N, T, S)`` (size 1 along the keys for one value per query).
    The box's ``upper``: bounds on the weights (the module's **Bounded weights**), each weight at most its
    bound, each query's unmasked bounds summing to at least 1.  ``window``: a sliding window (a positive integer,
    implying ``is_causal``), query ``i`` sees the keys ``i - window < j <= i``, tested by positions block by block
    (no ``T x S`` mask is made).  ``softcap``: a cap ``c > 0`` on the scores, each ``c tanh(s / c)`` before the
    bias and the mask (:class:`numeric.modifiers.Softcap`).  ``length_scale``: each query's scores times a factor
    of its position or of the number of keys it sees, before the cap (:func:`numeric.modifiers.ssmax`,
    :func:`numeric.modifiers.llama4`; its coefficient a number or an array, one per head ``(N,)`` or broadcastable
    to ``(B, N, T, 1)``, differentiable), applied to the queries.

    >>> import jax.numpy as jnp
    >>> q, k = jnp.zeros((1, 1, 1)), jnp.zeros((3, 1, 1))  # (T, N, H), (S, K, H): equal scores, 1/3 each
    >>> v = jnp.array([[[1.0]], [[2.0]], [[3.0]]])
    >>> attention(q, k, v, mapping="sparsemax", upper=jnp.array([0.2, 0.4, 0.4]))[0, 0]  # weights 0.2, 0.4, 0.4
    Array([2.2], dtype=float32)
    """
    query, key, value, unbatched = check_inputs(query, key, value)
    B, T, N, H = query.shape
    S = key.shape[1]
    shape = (B, N, T, S)
    if not isinstance(is_causal, (bool, type(None))):
        raise TypeError(f"is_causal must be True or False, got {is_causal!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(H)
    m = resolve_mapping(mapping)
    mask = None if mask is None else _scores_shaped(mask, "mask", shape, boolean=True)
    bias = None if bias is None else _scores_shaped(bias, "bias", shape, boolean=False)
    m, constraints = take_keywords(m, constraints)
    given = check_constraints(constraints, shape)
    check_block_size(block_size)
    out_dtype = query.dtype
    dtype = compute_dtype(out_dtype)
    query, key, value = query.astype(dtype), key.astype(dtype), value.astype(dtype)
    params = param_values(m, shape, dtype)
    if window is not None:
        Plan(T, S, 1, window=window)  # (checks it)
    length = modifiers.length_scale(length_scale)
    if length is not None:  # a factor per query row, on the queries: (B, N, T, 1) -> (B, T, N, 1)
        logs = jnp.asarray(length.logs(Plan(T, S, causal=bool(is_causal), window=window)), dtype)[None, None]
        coef = length.coef
        if not isinstance(coef, float):
            coef = jnp.asarray(coef)
            coef = _scores_shaped(coef.reshape(length.coef_shape(coef.shape, shape, "(B, N, T, S)")),
                                  "the length scale's coefficient", shape, boolean=False).astype(dtype)
        query = query * jnp.swapaxes(length.factor(logs, coef), 1, 2)
    out = attend(query, key, value, m, params, is_causal=bool(is_causal) or window is not None, scale=scale, mask=mask,
                 bias=bias, constraints=given, block_size=block_size, window=window, softcap=modifiers.softcap(softcap))
    out = out.astype(out_dtype)
    return out[0] if unbatched else out


def check_constraints(constraints: dict, shape: tuple) -> dict:
    """A constraint set's keywords (:func:`numeric.constraints.choose`) as :func:`attend` takes them: ``{}`` for
    the simplex, else every keyword of the set, numbers as they are and arrays made 4-dimensional and checked
    against the scores' ``shape`` (B, N, T, S) (a 1-D array of a keyword of one value per row holds one per head,
    :func:`numeric.plan.keyword_shape`)."""
    cset, values = choose(constraints)

    def shaped(n, v):
        if not hasattr(v, "shape"):
            return _scores_shaped(v, n, shape, boolean=False)  # (its error)
        v = jnp.asarray(v)
        return _scores_shaped(v.reshape(keyword_shape(n, v.shape, shape, n in cset.per_score, "(B, N, T, S)")), n,
                              shape, boolean=False)

    return {} if cset is SIMPLEX else {n: v if v is None or front.is_number(v) else shaped(n, v) for n, v in values.items()}


def check_block_size(block_size) -> None:
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1):
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")


def param_values(m: JaxMap, shape: tuple, dtype) -> dict:
    """The map's parameter values for the scores ``shape`` = (B, N, T, S): Python floats as they are, arrays given 4
    dimensions and checked against ``shape``."""
    params = {}
    for name in m.declared.PARAMETERS:
        v = m.params[name]
        if not isinstance(v, float):
            v = jnp.asarray(v)
            if v.ndim > 4:
                raise ValueError(f"parameter {name} of shape {tuple(v.shape)} has more dimensions than the scores {shape}")
            v = v.reshape((1,) * (4 - v.ndim) + tuple(v.shape))
            m.param_rows(name, v, shape, 3, dtype)  # (checks the shape against the scores)
        params[name] = v
    return params


def attend(query, key, value, m: JaxMap, params: dict, *, is_causal: bool, scale, mask=None, bias=None,
           constraints: dict | None = None, block_size: int | None = None, positions=None, window: int | None = None,
           softcap=None):
    """The blocked computation of :func:`attention` on checked inputs: ``query`` (B, T, N, H), ``key`` (B, S, K, H),
    ``value`` (B, S, K, Hv), all in the compute dtype; ``params`` from :func:`param_values`; ``mask``, ``bias``
    4-dimensional; ``constraints`` a constraint set's keywords (every one of the set's; ``{}`` or ``None``: the
    simplex), numbers or 4-dimensional arrays.  Returns ``(B, T, N, Hv)`` in the compute dtype.

    ``positions``: ``(query positions (T,), key positions (S,))``, integers: with ``is_causal`` the query at
    position ``i`` sees the key at position ``j`` iff ``j <= i``, tested block by block (no ``T x S`` mask is made);
    ``None`` is ``(arange(T), arange(S))``.  The query positions are row-wise: sliced with the query blocks.  ``window``
    (with ``is_causal``): also ``i - j < window``; ``softcap``: a :class:`numeric.modifiers.Softcap` or ``None``.
    """
    B, T, N, H = query.shape
    S, K = key.shape[1], key.shape[2]
    G = N // K
    dtype = query.dtype
    if is_causal:
        qpos, kpos = (jnp.arange(T), jnp.arange(S)) if positions is None else positions
    else:
        qpos = kpos = None
    # per query row (T > 1 along the rows' axis): sliced with the blocks; the rest is shared by every block
    constraints = dict(constraints or {})
    arrays = {n: v for n, v in constraints.items() if not (v is None or front.is_number(v))}
    rowwise = {"mask": mask, "bias": bias, **arrays, **{n: v for n, v in params.items() if not isinstance(v, float)}}
    rowwise = {n: a for n, a in rowwise.items() if a is not None and a.shape[2] > 1}

    def block(q, qp, rows):
        """Output rows for the query block ``q`` (B, tb, N, H) at the positions ``qp`` (tb,) (None: not causal);
        ``rows`` the row-wise arrays' blocks."""
        tb = q.shape[1]
        s = jnp.einsum("btkgh,bskh->bkgts", q.reshape(B, tb, K, G, H), key).reshape(B, N, tb, S)
        s = s * jnp.asarray(scale, dtype)
        if softcap is not None:  # (a numeric.modifiers.Softcap, differentiated through)
            s = softcap(jnp.tanh, s)
        b = rows.get("bias", bias)
        if b is not None:
            s = s + b.astype(dtype)
        keep = rows.get("mask", mask)
        if is_causal:
            causal = qp[:, None] >= kpos[None, :]
            if window is not None:  # (the keys i - window < j <= i)
                causal = causal & (qp[:, None] - kpos[None, :] < window)
            keep = causal if keep is None else keep & causal
        if keep is not None:
            s = jnp.where(keep, s, -jnp.inf)
        values = {n: rows.get(n, v) for n, v in params.items()}
        for n, v in constraints.items():
            v = rows.get(n, v)
            values[n] = v.astype(dtype) if n in arrays else v
        p = m(s, axis=-1, **values) if values else m(s, axis=-1)
        out = jnp.einsum("bkgts,bskh->btkgh", p.reshape(B, K, G, tb, S), value)
        return out.reshape(B, tb, N, value.shape[-1])

    plan = Plan(T, S, block_size or rows_within(BLOCK_ENTRIES, B * N * S), causal=is_causal)
    if len(plan) <= 1:
        return block(query, qpos, rowwise)
    # lax.map takes blocks of one size: every block sees every key, and causality is the comparison of positions
    nb, pad = plan.padded()
    tb = plan.block

    def blocks(a, axis, fill):
        """``a`` padded to ``nb * tb`` along ``axis`` and split into ``(nb, ..., tb, ...)``."""
        if pad:
            widths = [(0, 0)] * a.ndim
            widths[axis] = (0, pad)
            a = jnp.pad(a, widths, constant_values=fill)
        a = a.reshape(a.shape[:axis] + (nb, tb) + a.shape[axis + 1:])
        return jnp.moveaxis(a, axis, 0)

    # (a parameter's padding rows take a value inside its domain, a padding query any position: their output rows
    # are dropped)
    # a constraint array's: a value that leaves a key free, or the keyword's own default)
    cset = choose(constraints)[0] if constraints else None
    fills = {"mask": True, "bias": 0, **{n: _padding_value(m, n) for n in params},
             **{n: cset.free.get(n, cset.keywords[n] if front.is_number(cset.keywords[n]) else 1.0) for n in arrays}}
    xs = (blocks(query, 1, 0), None if qpos is None else blocks(qpos, 0, 0),
          {n: blocks(a, 2, fills[n]) for n, a in rowwise.items()})
    out = lax.map(jax.checkpoint(lambda x: block(*x)), xs)
    return jnp.moveaxis(out, 0, 1).reshape(B, nb * tb, N, value.shape[-1])[:, :T]


def _padding_value(m: JaxMap, name: str) -> float:
    """A value inside the parameter's domain, for the padding rows of a last query block."""
    lo, hi = m.declared.PARAMETER_DOMAINS[name]
    if math.isinf(lo) and math.isinf(hi):
        return 0.0
    if math.isinf(hi):
        return lo + 1.0
    if math.isinf(lo):
        return hi - 1.0
    return 0.5 * (lo + hi)

