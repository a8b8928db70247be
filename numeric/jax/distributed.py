"""Context-parallel attention: one long sequence sharded along its length ``T`` over the devices of a mesh axis.

:func:`context_parallel_attention` computes what :func:`numeric.jax.attention` computes for self-attention
(``query``, ``key`` and ``value`` of one length ``T``),

    out_i = sum_j p_ij value_j,   p_i = mapping(scale * query_i key^T, masked),

with query ``i`` seeing key ``j`` iff ``j <= i`` under ``is_causal`` (``i``, ``j`` positions in the whole
sequence), but each of the ``P`` devices of the mesh axis holds ``T / P`` of the positions: its queries, keys,
values and output rows.  A device gathers every key and value of the axis (:func:`jax.lax.all_gather`) and
computes its queries' rows against all ``T`` keys with the blocked code of :func:`numeric.jax.attention` (a
row needs every key: the map's normalization is over the whole row, whatever the map).  Per call, over the
axis:

* forward: one all-gather of ``key`` and one of ``value`` (each device receives the ``(P - 1) T / P``
  positions it does not hold);
* backward: the same all-gathers again, and one reduce-scatter (:func:`jax.lax.psum_scatter`, the
  all-gather's transpose) of the keys' and one of the values' cotangents: each device's ``dK``, ``dV`` for all
  ``T`` positions, summed over the devices and scattered to their holders; the gradient of a map parameter
  bound as an array (``alpha`` per head) is summed over the devices (an all-reduce).

**Memory.**  The gathered keys and values, ``O(T)`` on each device, are not kept for the backward pass: the
per-device function runs under :func:`jax.checkpoint` with a policy that saves none of its intermediates
(:func:`jax.checkpoint_policies.save_any_names_but_these` of the gathered arrays' names), so its residuals
are its inputs, ``O(T / P)`` along the sequence, and the backward pass re-gathers.  With several query blocks
that costs no other recomputation (each block's scores are recomputed in the backward pass anyway, as in
:func:`numeric.jax.attention`); with one block the backward pass recomputes its scores and weights.  (The
policy that saves every intermediate but the named ones, ``save_anything_except_these_names``, does not do
it: it keeps the gathered arrays as the operands of the blocks' loop, and every block's scores with them.)

**Layouts.**  ``"contiguous"``: device ``r`` holds the positions ``[r T/P, (r + 1) T/P)``.  Under
``is_causal`` the last device's queries see all the keys and the first's ``1 / P`` of them: the unmasked
work is unbalanced.  ``"zigzag"``: the sequence is cut into ``2P`` chunks and device ``r`` holds chunks ``r``
and ``2P - 1 - r``, in that order, so every device has the same unmasked causal work (``2P + 1`` chunk pairs).
(This implementation scores each query against all ``T`` keys, the masked ones set to ``-inf``, so its cost is
the same in both layouts; the layout matters to computations that skip masked blocks.)  The arrays passed are
laid out that way already (their ``T`` axis in layout order, the output too): :func:`shard_layout` reorders an
array in natural order into a layout's order, :func:`unshard_layout` back.

    >>> import numpy as np
    >>> shard_layout(np.arange(8), 2, "zigzag", axis=0)  # chunks 0, 3 on device 0; 1, 2 on device 1
    Array([0, 1, 6, 7, 2, 3, 4, 5], dtype=int32)
    >>> unshard_layout(shard_layout(np.arange(8), 2, "zigzag", axis=0), 2, "zigzag", axis=0)
    Array([0, 1, 2, 3, 4, 5, 6, 7], dtype=int32)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from ..layouts import LAYOUTS, check_layout, chunks, layout_positions
from .. import front
from ..maps import take_keywords
from .attention import attend, check_block_size, check_constraints, check_inputs, param_values, resolve_mapping
from .maps import compute_dtype

__all__ = ["context_parallel_attention", "shard_layout", "unshard_layout", "LAYOUTS"]


# the names of the gathered keys and values: not saved for the backward pass (re-gathered there)
_GATHERED = ("regattn_cp_gathered_key", "regattn_cp_gathered_value")

# shard_map without its check of which values vary over the axis (``check_vma``, before JAX 0.7 ``check_rep``): a
# map's loops (``lax.while_loop`` in numeric.jax._ops) start from constants, invariant over the axis, and carry
# values that vary, which the check refuses.  Unchecked, shard_map's transpose sums the cotangents of an input
# replicated over the axis (``P()``: a map parameter) over the devices, as the checked one does.
if hasattr(jax, "shard_map"):
    def _shard_map(f, **kwargs):
        return jax.shard_map(f, check_vma=False, **kwargs)
else:  # pragma: no cover - JAX before 0.7
    def _shard_map(f, **kwargs):
        from jax.experimental.shard_map import shard_map

        return shard_map(f, check_rep=False, **kwargs)


def _check_parts(parts) -> int:
    if isinstance(parts, bool) or not isinstance(parts, (int, np.integer)) or parts < 1:
        raise ValueError(f"parts must be a positive integer (the number of devices), got {parts!r}")
    return int(parts)


def _check_length(length: int, parts: int, layout: str, what: str = "the sequence") -> None:
    count = parts if layout == "contiguous" else 2 * parts
    if length % count:
        devices = f"{parts} device" + ("s" if parts != 1 else "")
        raise ValueError(f"the {layout} layout over {devices} cuts {what} into {count} equal chunks: its "
                         f"length T = {length} is not divisible by {count}")


def _layout_positions(length: int, parts: int, layout: str, what: str = "the sequence") -> np.ndarray:
    """The natural positions of the ``length`` entries of a sequence laid out over ``parts`` devices, in layout
    order."""
    _check_length(length, parts, layout, what)
    return layout_positions(length, parts, layout)


def _axis(x, axis) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis must be an integer in [-{x.ndim}, {x.ndim}) for an array of shape {tuple(x.shape)}, "
                         f"got {axis!r}")
    return int(axis) % x.ndim


def shard_layout(x, parts: int, layout: str, axis: int = 1):
    """``x`` with its ``axis`` (the sequence, length ``T``) reordered from natural order into ``layout``'s order
    over ``parts`` devices (the module's **Layouts**): the order :func:`context_parallel_attention` reads.

    Parameters
    ----------
    x : array
        Any array; ``x.shape[axis]`` must be divisible by ``parts`` (``"contiguous"``) or ``2 * parts``
        (``"zigzag"``).
    parts : int
        The number of devices of the mesh axis.
    layout : {"contiguous", "zigzag"}
        ``"contiguous"`` leaves the order as it is.
    axis : int
        The sequence axis (1 for ``(B, T, heads, features)``).

    Returns
    -------
    jax.Array
        ``x`` reordered along ``axis``; :func:`unshard_layout` is the inverse.

    >>> import jax.numpy as jnp
    >>> shard_layout(jnp.arange(12).reshape(1, 12), 3, "zigzag")
    Array([[ 0,  1, 10, 11,  2,  3,  8,  9,  4,  5,  6,  7]], dtype=int32)
    """
    x = jnp.asarray(x)
    axis = _axis(x, axis)
    positions = _layout_positions(x.shape[axis], _check_parts(parts), check_layout(layout), f"axis {axis}")
    return x if layout == "contiguous" else jnp.take(x, positions, axis=axis)


def unshard_layout(x, parts: int, layout: str, axis: int = 1):
    """The inverse of :func:`shard_layout`: ``x``'s ``axis`` from ``layout``'s order over ``parts`` devices back
    into natural order (e.g. the output of :func:`context_parallel_attention`).

    Parameters
    ----------
    x : array
        An array in layout order along ``axis``.
    parts : int
        The number of devices of the mesh axis.
    layout : {"contiguous", "zigzag"}
        The layout ``x`` is in.
    axis : int
        The sequence axis.

    Returns
    -------
    jax.Array
        ``x`` in natural order along ``axis``.

    >>> import jax.numpy as jnp
    >>> unshard_layout(jnp.array([[0, 1, 10, 11, 2, 3, 8, 9, 4, 5, 6, 7]]), 3, "zigzag")
    Array([[ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11]], dtype=int32)
    """
    x = jnp.asarray(x)
    axis = _axis(x, axis)
    positions = _layout_positions(x.shape[axis], _check_parts(parts), check_layout(layout), f"axis {axis}")
    return x if layout == "contiguous" else jnp.take(x, np.argsort(positions), axis=axis)


def context_parallel_attention(query, key, value, *, mesh, axis_name, is_causal: bool = False, scale=None,
                               mapping="softmax", layout: str = "contiguous", block_size: int | None = None,
                               **constraints):
    """Self-attention of one sequence sharded along its length over the devices of ``mesh``'s axis ``axis_name``.

    The module's description gives the maths, the layouts and the communication.  The result equals
    :func:`numeric.jax.attention` ``(query, key, value, is_causal=is_causal, scale=scale, mapping=mapping)`` on
    the arrays in natural order (:func:`unshard_layout`), up to rounding; gradients flow to ``query``, ``key``,
    ``value`` and to a map's parameters bound as arrays.  Call it under :func:`jax.jit` (it is not jitted itself,
    as :func:`numeric.jax.attention` is not).

    Parameters
    ----------
    query : array
        ``(B, T, N, H)``, or ``(T, N, H)`` (one example); the ``T`` axis in ``layout``'s order.
    key : array
        ``(B, T, K, H)``, ``K`` dividing ``N`` (query head ``n`` reads key/value head ``n // (N // K)``).
    value : array
        ``(B, T, K, Hv)``.
    mesh : jax.sharding.Mesh
        The devices.
    axis_name : str
        The mesh axis the sequence is sharded over, ``P = mesh.shape[axis_name]`` devices; ``T`` must be
        divisible by ``P`` (``"contiguous"``) or ``2P`` (``"zigzag"``).  Along the mesh's other axes the
        computation is replicated.
    is_causal : bool
        Query ``i`` sees key ``j`` iff ``j <= i``, ``i``, ``j`` the positions in the whole sequence in natural
        order, whatever the layout (tested block by block: no ``T/P x T`` mask is made).
    scale : float, optional
        Multiplies the scores; ``1 / sqrt(H)`` by default.
    mapping : str, module or JaxMap
        Any map :func:`numeric.jax.attention` takes: a name, a generated module, a
        :class:`~numeric.jax.maps.JaxMap` with its parameters bound, e.g. ``alpha`` per head of shape
        ``(N, 1, 1)`` (replicated over the devices; one per query row, size ``T`` along the scores' third axis,
        is sharded with the queries).
    layout : {"contiguous", "zigzag"}
        How the positions lie over the devices (the module's **Layouts**).
    block_size : int, optional
        Query rows a block on each device, as :func:`numeric.jax.attention`'s.
    **constraints
        A constraint set's keywords (:mod:`numeric.constraints`; the box's ``upper=`` and ``total=``), as
        :func:`numeric.jax.attention` takes them: numbers, or arrays broadcastable to the scores ``(B, N, T, T)``
        whose query and key axes are in ``layout``'s order, as ``query`` and ``key`` are (an array with ``T``
        rows is sharded with the queries; its key axis, size ``T`` or 1, is whole on every device).  Gradients
        flow to the arrays.

    Returns
    -------
    jax.Array
        ``(B, T, N, Hv)`` (``(T, N, Hv)`` for unbatched inputs) in the query's dtype and ``layout``'s order,
        sharded along ``T`` over ``axis_name`` (``NamedSharding(mesh, P(None, axis_name))``, ``P(axis_name)``
        unbatched).

    Raises
    ------
    ValueError
        An axis not in the mesh, ``T`` not divisible by the layout's chunks, an unknown layout, keys of another
        length than the queries, or what :func:`numeric.jax.attention` refuses.
    TypeError
        ``mesh`` not a :class:`jax.sharding.Mesh`, a non-boolean ``is_causal``, inputs that are not
        floating-point arrays of one dtype.

    >>> import jax, jax.numpy as jnp, numpy as np
    >>> from jax.sharding import Mesh
    >>> mesh = Mesh(np.array(jax.devices()[:1]), ("seq",))
    >>> q = k = v = jnp.array([[[1.0]], [[0.0]], [[2.0]], [[1.0]]])  # (T, N, H) = (4, 1, 1)
    >>> out = context_parallel_attention(q, k, v, mesh=mesh, axis_name="seq", is_causal=True, mapping="sparsemax")
    >>> out[:, 0, 0]
    Array([1. , 0.5, 2. , 2. ], dtype=float32)
    >>> from numeric.jax import attention
    >>> bool(jnp.allclose(out, attention(q, k, v, is_causal=True, mapping="sparsemax")))
    True
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if axis_name not in mesh.axis_names:
        raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh, whose axes are {tuple(mesh.axis_names)}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be True or False, got {is_causal!r}")
    check_layout(layout)
    check_block_size(block_size)
    query, key, value, unbatched = check_inputs(query, key, value)
    B, T, N, H = query.shape
    if key.shape[1] != T:
        raise ValueError(f"context-parallel attention is self-attention over one sequence: the keys' and values' "
                         f"length S = {key.shape[1]} must equal the queries' T = {T}")
    parts = mesh.shape[axis_name]
    _check_length(T, parts, layout)
    if scale is None:
        scale = 1.0 / math.sqrt(H)
    m, constraints = take_keywords(resolve_mapping(mapping), constraints)
    dtype = compute_dtype(query.dtype)
    params = param_values(m, (B, N, T, T), dtype)  # (checked against the global scores' shape)
    given = check_constraints(constraints, (B, N, T, T))
    numbers = {n: v for n, v in given.items() if v is None or front.is_number(v)}
    bounds = {n: v.astype(dtype) for n, v in given.items() if n not in numbers}
    floats = {n: v for n, v in params.items() if isinstance(v, float)}
    arrays = {n: v for n, v in params.items() if not isinstance(v, float)}
    # a parameter per query row is sharded with the queries, any other replicated (its gradient summed over the axis)
    param_specs = {n: P(None, None, axis_name) if v.shape[2] > 1 else P() for n, v in arrays.items()}
    bound_specs = {n: P(None, None, axis_name) if v.shape[2] > 1 else P() for n, v in bounds.items()}
    seq = P(axis_name) if unbatched else P(None, axis_name)

    def local(q, k, v, local_arrays, local_bounds):
        """One device's output rows: its queries (B, T/P, N, H) against the gathered keys and values (B, T, K, .)."""
        if unbatched:
            q, k, v = q[None], k[None], v[None]
        k = checkpoint_name(lax.all_gather(k, axis_name, axis=1, tiled=True).astype(dtype), _GATHERED[0])
        v = checkpoint_name(lax.all_gather(v, axis_name, axis=1, tiled=True).astype(dtype), _GATHERED[1])
        positions = None
        if is_causal:  # (computed here, not saved for the backward pass: no O(T) residual)
            def runs(rank):  # the positions of a device's rows, made by iota: no O(T) constant kept as a residual
                return [p + lax.iota(jnp.int32, stop - start) for start, stop, p in chunks(T // parts, rank, parts,
                                                                                          layout)]

            positions = (jnp.concatenate(runs(lax.axis_index(axis_name))),
                         jnp.concatenate([x for r in range(parts) for x in runs(r)]))  # (the gathered keys')
        out = attend(q.astype(dtype), k, v, m, {**floats, **local_arrays}, is_causal=is_causal, scale=scale,
                     block_size=block_size, positions=positions, constraints={**numbers, **local_bounds})
        out = out.astype(query.dtype)
        return out[0] if unbatched else out

    # the gathered keys and values (O(T) on each device) are recomputed by the backward pass, not kept (the
    # module's **Memory**)
    local = jax.checkpoint(local, policy=jax.checkpoint_policies.save_any_names_but_these(*_GATHERED))
    sharded = _shard_map(local, mesh=mesh, in_specs=(seq, seq, seq, param_specs, bound_specs), out_specs=seq)
    if unbatched:
        query, key, value = query[0], key[0], value[0]
    return sharded(query, key, value, arrays, bounds)
