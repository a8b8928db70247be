"""Context-parallel attention: one long sequence spread over the ranks of a ``torch.distributed`` process group.

Each rank holds a shard of the sequence (queries, keys and values of some of its
positions, along dim -2) and gets the output of its own queries:

.. math::

    o_i = \\sum_j p_{ij} v_j, \\qquad p_{i\\cdot} = \\mathrm{map}(\\text{scale}\\; q_i K^\\top),

where ``K`` and ``V`` are the keys and values of the *whole* sequence and, with
``is_causal``, query ``i`` sees the keys at global positions ``j <= i``.

**Why the keys are gathered.**  Softmax's context parallelism (ring attention,
torch's ``context_parallel``) passes key blocks around a ring and merges the
partial outputs by their log-sum-exp.  A sparse map has no such merge: its
threshold ``tau_i`` solves ``sum_j g(s_ij - tau_i) = 1`` over every key of the
row, so each step of the solver would need a full pass of the ring (one pass
per Newton or bisection step).  Here each rank all-gathers the keys and values
once and runs the blocked attention of :mod:`numeric.torch.attention` for its
own queries against all of them (the pattern Llama 3 trained its long contexts
with): the map, its solver and its backward are exactly those of one process.

**Communicated per call**, with ``P`` ranks, a sequence of ``L`` positions and
``n = L / P`` local rows (sizes per batch entry and head):

* forward: one all-gather of ``K`` and ``V`` (each rank receives
  ``(P - 1) n (E + Ev)`` numbers; the two collectives are issued together);
* backward: the same all-gather again (the gathered keys are not kept between
  the passes) and one reduce-scatter of ``dK`` and ``dV``, which sums every
  rank's contribution to a key's gradient on the key's owner.

Gradients of a map's tensor parameters (an ``alpha`` per head) are this rank's
contribution, from its own queries; the data-parallel engine that replicates
the parameters (DistributedDataParallel or FSDP over the same ranks) sums them,
as it sums the other parameters' gradients.

**Memory per rank.**  Kept for the backward pass: the local ``query``, ``key``
and ``value`` and the map's threshold per local query, ``O(L / P)``.  During one
call: the gathered ``K`` and ``V`` (and in the backward pass their gradients),
``O(L (E + Ev))``, and the blocked kernel's scores, a block of rows by ``L``.

**Layouts** (the caller shards the sequence; :func:`shard` does it for a
tensor held whole):

* ``"contiguous"``: rank ``r`` holds positions ``[r n, (r + 1) n)``.  Causal
  attention then gives the last rank ``2P - 1`` times the first rank's work.
* ``"zigzag"``: the sequence is cut into ``2P`` chunks; rank ``r`` holds chunks
  ``r`` and ``2P - 1 - r``, in that order, which gives every rank the same
  causal work.  ``n`` must be even.

Every rank holds the same number of positions, calls with the same arguments
(shapes, map, ``requires_grad``) and runs the backward pass, since each pass
runs collectives.  Each call checks the arguments first, with one all-gather of
a small int64 descriptor per rank: where they differ, every rank raises the same
ValueError naming what differs (ranks whose buffers differ in size would
otherwise meet in one collective, which gloo and NCCL answer by aborting the
processes).  On GPUs with NCCL the same code runs unchanged (one process
per GPU, ``torch.distributed.init_process_group("nccl")``, tensors on the
rank's device).
"""

from __future__ import annotations

import hashlib
import math
import numbers
import struct

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from ..constraints import SIMPLEX, choose
from ..maps import take_keywords
from ..layouts import LAYOUTS, check_layout, chunks
from ..plan import rows_within
from .attention import (BLOCK_ENTRIES, MapSpec, blocked_backward, blocked_forward, check_constraints, check_inputs,
                        query_rows, resolve_mapping, spec_constraints)

__all__ = ["context_parallel_attention", "shard", "unshard", "positions", "LAYOUTS"]

_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _check_layout(layout, local: int, name: str):
    check_layout(layout)
    if layout == "zigzag" and local % 2:
        raise ValueError(f"the zigzag layout holds two equal chunks a rank: {name}'s local length must be even, "
                         f"got {local}")


def positions(length: int, rank: int, world_size: int, layout: str = "contiguous") -> torch.Tensor:
    """The global positions of rank ``rank``'s ``length`` rows (an int64 tensor) in ``layout``.

    >>> positions(4, 1, 2, "zigzag").tolist()   # a sequence of 8: chunks 1 and 2 of 4
    [2, 3, 4, 5]
    >>> positions(4, 0, 2, "zigzag").tolist()   # chunks 0 and 3
    [0, 1, 6, 7]
    """
    _check_layout(layout, length, "the shard")
    return torch.cat([torch.arange(p, p + stop - start) for start, stop, p in chunks(length, rank, world_size, layout)])


def shard(x: torch.Tensor, rank: int, world_size: int, layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s shard of the whole sequence ``x`` (positions along ``dim``) in ``layout`` (a view or a copy).

    >>> shard(torch.arange(8), 1, 2, "zigzag", dim=0).tolist()
    [2, 3, 4, 5]
    """
    L = x.shape[dim]
    parts = world_size * (2 if check_layout(layout) == "zigzag" else 1)
    if L % parts:
        raise ValueError(f"a sequence of length {L} does not split into {parts} equal chunks ({world_size} ranks, "
                         f"layout {layout!r})")
    n = L // world_size
    runs = chunks(n, rank, world_size, layout)
    return torch.cat([x.narrow(dim, p, stop - start) for start, stop, p in runs], dim=dim) if len(runs) > 1 \
        else x.narrow(dim, runs[0][2], n)


def unshard(shards, layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """The whole sequence from every rank's shard (a sequence ordered by rank): :func:`shard`'s inverse."""
    shards = list(shards)
    P = len(shards)
    n = shards[0].shape[dim]
    _check_layout(layout, n, "a shard")
    pieces = {}
    for r, s in enumerate(shards):
        for start, stop, p in chunks(n, r, P, layout):
            pieces[p] = s.narrow(dim, start, stop - start)
    return torch.cat([pieces[p] for p in sorted(pieces)], dim=dim)


def _all_gather(xs, group, world: int, runs: list) -> list:
    """Each of ``xs`` (``(..., n, E)``) gathered from every rank into ``(..., world n, E)`` in global order; the
    collectives run together.  ``runs``: ``(rank, start, stop, position)`` of every rank's runs of rows."""
    xs = [x.contiguous() for x in xs]
    bufs, works = [], []
    for x in xs:
        buf = x.new_empty((world * x.shape[0],) + tuple(x.shape[1:]))  # rank by rank, along the first dimension
        works.append(_gather_single(buf, x, group=group, async_op=True))
        bufs.append(buf.view((world,) + tuple(x.shape)))
    outs = []
    for i, (x, w) in enumerate(zip(xs, works)):
        w.wait()
        out = x.new_empty(tuple(x.shape[:-2]) + (world * x.shape[-2], x.shape[-1]))
        for r, start, stop, p in runs:
            out[..., p:p + stop - start, :] = bufs[i][r, ..., start:stop, :]
        bufs[i] = None
        outs.append(out)
    return outs


def _reduce_scatter(xs, group, world: int, runs: list) -> list:
    """Each of ``xs`` (``(..., world n, E)`` in global order) summed over the ranks, this rank's rows kept
    (``(..., n, E)``, in its layout); the collectives run together."""
    outs, works = [], []
    for x in xs:
        n = x.shape[-2] // world
        buf = x.new_empty((world,) + tuple(x.shape[:-2]) + (n, x.shape[-1]))  # rank by rank
        for r, start, stop, p in runs:
            buf[r, ..., start:stop, :] = x[..., p:p + stop - start, :]
        out = x.new_empty(tuple(buf.shape[1:]))
        works.append(_scatter_single(out, buf.view((-1,) + tuple(buf.shape[2:])), group=group, async_op=True))
        outs.append(out)
    for w in works:
        w.wait()
    return outs


class _Runs:
    """What the passes of one call share: the group, the ranks' runs of rows, and the blocked kernel's specs."""

    def __init__(self, group, rank, world, layout, causal, fn, is_map, names, guard, L, S, block, given):
        self.group, self.world, self.layout, self.causal = group, world, layout, causal
        # (rank, start, stop, position) of every rank's runs of keys: the gathered keys are in global order
        self.key_runs = [(r, *run) for r in range(world) for run in chunks(S, r, world, layout)]
        self.runs = []
        for start, stop, p in chunks(L, rank, world, layout):
            # a run of rows is the plan of its own rows against every gathered key, the first at the position p
            # (causal: the plan takes each block's keys up to its last row's position)
            self.runs.append((start, stop, MapSpec(fn, is_map, names, causal, guard, 0.0, block, stop - start,
                                                   S * world, given, offset=p if causal else 0)))

    def gather(self, key, value):
        return _all_gather((key, value), self.group, self.world, self.key_runs)

    def scatter(self, grads):
        """Each of the gradients ``grads`` of the gathered keys or values summed onto the keys' owners."""
        return _reduce_scatter(grads, self.group, self.world, self.key_runs)


def _forward(qs, K, V, plan, params):
    outs, taus = [], []
    for start, stop, spec in plan.runs:
        ps = tuple(query_rows(t, start, stop) for t in params)
        out, tau = blocked_forward(qs[..., start:stop, :], K, V, None, spec, ps)
        outs.append(out)
        taus.append(tau)
    out = torch.cat(outs, dim=-2) if len(outs) > 1 else outs[0]
    tau = None if taus[0] is None else torch.cat(taus, dim=-2) if len(taus) > 1 else taus[0]
    return out, tau


class _ContextParallelAttention(torch.autograd.Function):
    """The local output; saved are the local ``qs``, ``key``, ``value``, thresholds and the map's parameters."""

    @staticmethod
    def forward(ctx, qs, key, value, plan, *params):
        K, V = plan.gather(key, value)
        out, taus = _forward(qs, K, V, plan, params)
        ctx.plan = plan
        ctx.save_for_backward(qs, key, value, taus, *params)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        qs, key, value, taus, *params = ctx.saved_tensors
        plan = ctx.plan
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        need_p = ctx.needs_input_grad[4:]
        K, V = plan.gather(key, value)
        dq = torch.zeros_like(qs) if need_q else None
        dK = torch.zeros(K.shape, dtype=K.dtype, device=K.device) if need_k else None
        dV = torch.zeros(V.shape, dtype=V.dtype, device=V.device) if need_v else None
        dparams = [torch.zeros_like(t) if need else None for t, need in zip(params, need_p)]
        for start, stop, spec in plan.runs:
            ps = tuple(query_rows(t, start, stop) for t in params)
            tau = None if taus is None else taus[..., start:stop, :]
            views = (None if dq is None else dq[..., start:stop, :], dK, dV)
            grads = blocked_backward(
                dout[..., start:stop, :], qs[..., start:stop, :], K, V, None, tau,
                ps, spec, (need_q, need_k, need_v, False, *need_p), into=views)
            for d, g in zip(views, grads[:3]):
                if d is not None and g.data_ptr() != d.data_ptr():  # (not accumulated in place: broadcast batch)
                    d += g
            dps = grads[4:]
            for d, t, dp in zip(dparams, params, dps):
                if d is not None:
                    query_rows(d, start, stop).add_(dp)
        del K, V
        # every rank wants the same gradients (it called with the same arguments), so all join these collectives
        owned = iter(plan.scatter([d for d in (dK, dV) if d is not None]))
        dk, dv = (None if d is None else next(owned) for d in (dK, dV))
        return (dq, dk, dv, None, *dparams)


#: the dtypes the agreement between the ranks names (any other is told by a digest of its name)
_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
#: the trailing dimensions of a shape the agreement carries as numbers (a longer shape adds a digest of the rest)
_DIMS = 8
#: bytes of the map's description the agreement carries (a longer one is cut; a digest of the whole map is kept)
_TEXT = 64


def _digest(text: str) -> int:
    """A signed 64-bit digest of ``text``, the same in every process (Python's ``hash`` of a str is not)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def _map_text(mapping) -> str:
    """What names ``mapping`` to a user: ``entmax(alpha=1.5)``, a callable's qualified name, or its repr."""
    from .maps import TorchMap

    if isinstance(mapping, TorchMap):
        params = [f"{k}={v:g}" if isinstance(v, numbers.Real) else
                  f"{k}=<tensor {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}>" if isinstance(v, torch.Tensor)
                  else f"{k}={v!r}" for k, v in sorted(mapping.params.items())]
        if mapping.threshold != "auto":
            params.append(f"threshold={mapping.threshold!r}")
        name = mapping.name if mapping.family is not None else mapping.module.__name__.removeprefix("numeric._generated.")
        return name + (f"({', '.join(params)})" if params else "")
    if isinstance(mapping, str):
        return mapping
    if callable(mapping):  # (never its repr, which may hold an address that differs between processes)
        module = getattr(mapping, "__module__", None) or type(mapping).__module__ or ""
        qualname = getattr(mapping, "__qualname__", None) or type(mapping).__qualname__
        return f"{module}.{qualname}".lstrip(".")
    return _plain(mapping)


def _plain(value) -> str:
    """``value``'s repr where it is a plain value (the same in every process), else its type's name."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return repr(float(value))
    return repr(value) if isinstance(value, (bool, str, type(None))) else f"a {type(value).__name__}"


def _encode(text: str, size: int = _TEXT) -> list:
    """``text`` as ``size / 8`` int64s (its UTF-8 bytes, cut or padded with zeros) and a digest of all of it."""
    return list(struct.unpack(f"<{size // 8}q", text.encode()[:size].ljust(size, b"\0"))) + [_digest(text)]


def _decode(ints) -> str:
    return struct.pack(f"<{len(ints) - 1}q", *ints[:-1]).rstrip(b"\0").decode("utf-8", "replace")


def _shape(ints) -> str:
    ndim, _, *tail = ints
    return str(tuple(tail[_DIMS - ndim:])) if ndim <= _DIMS else f"(..., {', '.join(map(str, tail))})"


def _constraints_text(constraints: dict) -> str:
    """The constraint keywords of a call as the ranks must agree on them: each name with its number, or the shape
    and dtype of its tensor (each rank's own values)."""
    return "none" if not constraints else ", ".join(f"{k}=<tensor {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}>"
                     if isinstance(v, torch.Tensor) else f"{k}={_plain(v)}" for k, v in sorted(constraints.items()))


def _fields(query, key, value, is_causal, layout, scale, fn, error, constraints=None):
    """``[(what, int64s, show)]``: every argument of a call the ranks must agree on, as numbers, and how to show
    them (``show(int64s)``) in the error."""
    fields = []
    for name, x in (("query", query), ("key", key), ("value", value)):
        if isinstance(x, torch.Tensor):
            dims = tuple(x.shape)
            tail = list(dims[-_DIMS:]) if dims else []
            code = [len(dims), _digest(repr(dims)) if len(dims) > _DIMS else 0] + [-1] * (_DIMS - len(tail)) + tail
            fields.append((f"the local shape of {name}", code, _shape))
            fields.append((f"the dtype of {name}", _encode(str(x.dtype), 16), _decode))
        else:
            fields.append((f"the local shape of {name}", _encode(f"a {type(x).__name__}", 16), _decode))
    device = query.device.type if isinstance(query, torch.Tensor) else "?"
    fields.append(("the device type", _encode(device, 16), _decode))
    for what, v in (("is_causal", is_causal), ("layout", layout), ("scale", scale)):
        fields.append((what, _encode("the default" if what == "scale" and v is None else _plain(v), 16), _decode))
    fields.append(("mapping", _encode(_map_text(fn)), _decode))
    fields.append(("the constraint keywords", _encode(_constraints_text(constraints or {})), _decode))
    grad = torch.is_grad_enabled()
    needs = tuple(bool(grad and isinstance(x, torch.Tensor) and x.requires_grad) for x in (query, key, value))
    fields.append(("which of query, key, value need gradients", [int(n) for n in needs],
                   lambda ints: str(tuple(bool(i) for i in ints))))
    fields.append(("valid arguments", [0 if error is None else 1], lambda ints: "no" if ints[0] else "yes"))
    return fields


def _ranks(ranks: list) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _agree(group, query, key, value, is_causal, layout, scale, fn, error, constraints=None):
    """Raise the same ValueError on every rank of ``group`` unless all called with the same arguments.

    One all-gather of a small int64 descriptor per rank (:func:`_fields`: the local shapes and dtypes, the device
    type, causality, layout, scale, the map, the constraint keywords, which inputs need gradients, and whether the
    arguments passed the local checks), before any collective that moves the keys: a rank with other shapes or dtypes would otherwise send
    buffers of another size into the same collective, which gloo and NCCL answer by aborting the processes.
    """
    fields = _fields(query, key, value, is_causal, layout, scale, fn, error, constraints)
    row = [i for _, code, _ in fields for i in code]
    device = query.device if isinstance(query, torch.Tensor) else torch.device("cpu")
    mine = torch.tensor(row, dtype=torch.int64, device=device)
    world = dist.get_world_size(group)
    table = mine.new_empty(world * len(row))  # rank by rank
    _gather_single(table, mine, group=group)
    table = table.view(world, len(row)).tolist()
    differ, at = [], 0
    for what, code, show in fields:
        values = [tuple(r[at:at + len(code)]) for r in table]
        at += len(code)
        if len(set(values)) > 1:
            seen = {}
            for rank, v in enumerate(values):
                seen.setdefault(v, []).append(rank)
            differ.append(f"{what}: " + ", ".join(f"{show(list(v))} on {_ranks(r)}" for v, r in seen.items()))
    if differ:
        # (a rank whose own arguments are invalid says why in the cause)
        raise ValueError("context_parallel_attention: every rank of the group must call with the same arguments "
                         "(each call runs collectives that all ranks join), but they differ in "
                         + "; ".join(differ)) from error


def _check_call(query, key, value, is_causal, scale, mapping, layout, block, constraints, world):
    """One rank's checks of a call's arguments (as one process's); ``(batch, fn, is_map, scale, set, values)``.
    ``world``: the number of ranks (``None``: not known, and the constraint arrays' shapes not checked)."""
    batch = check_inputs(query, key, value)
    n, m = query.shape[-2], key.shape[-2]
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be True or False, got {is_causal!r}")
    check_layout(layout)
    if is_causal and n != m:
        raise ValueError(f"with is_causal the local queries and keys are the same positions: query {tuple(query.shape)} "
                         f"and key {tuple(key.shape)} differ in length")
    _check_layout(layout, n, "query")
    _check_layout(layout, m, "key")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise TypeError(f"scale must be a real number or None, got {scale!r}")
    if block is not None and (isinstance(block, bool) or not isinstance(block, numbers.Integral) or block < 1):
        raise ValueError(f"block must be a positive integer or None, got {block!r}")
    fn, is_map = resolve_mapping(mapping)
    if not is_map:
        with torch.enable_grad():
            if fn(torch.zeros(1, 2, dtype=query.dtype, device=query.device), dim=-1).requires_grad:
                raise TypeError("a callable mapping whose weights depend on tensors of its own that need gradients "
                                "cannot run context-parallel: pass its parameters through a TorchMap")
    else:
        fn.values()  # (every parameter bound, else the map's own error)
    # this rank's rows against every key of the sequence, in position order (the gathered keys' order)
    fn, constraints = take_keywords(fn, constraints)
    if world is None:  # (not initialised: that is the error, once the ranks' arguments are known to agree)
        cset, values = choose(constraints)
    else:
        cset, values = check_constraints(constraints, query, batch + (n, m * world))
    if cset is not SIMPLEX and not is_map:
        raise TypeError(f"{'='.join(constraints)}= needs a regattn map (a name, a generated module or a TorchMap), "
                        f"not a callable")
    return batch, fn, is_map, scale, cset, values


def context_parallel_attention(query, key, value, *, group=None, is_causal=False, scale=None, mapping="softmax",
                               layout="contiguous", block=None, **constraints):
    """This rank's output of attention over a sequence sharded across the ranks of ``group`` (module docstring).

    Parameters
    ----------
    query, key, value:
        This rank's shards ``(..., n, E)``, ``(..., m, E)``, ``(..., m, Ev)`` (positions along dim -2, as
        :func:`numeric.torch.attention.attention`; batch dimensions broadcast, grouped keys and values too).  Every
        rank holds as many positions; with ``is_causal`` the queries and keys are the same positions (``n == m``).
    group:
        The process group (default: the whole world); ``torch.distributed`` must be initialised.
    is_causal:
        Query at global position ``i`` sees the keys at global positions ``j <= i``.
    scale:
        Score scale, ``1 / sqrt(E)`` by default.
    mapping:
        Map name, generated module, :class:`~numeric.torch.maps.TorchMap` (its tensor parameters, e.g. an ``alpha``
        per head ``(H, 1, 1)``, broadcast to the local scores ``(..., n, L)`` and get gradients), or a callable
        ``(scores, dim) -> weights`` without tensors of its own that need gradients.
    layout:
        ``"contiguous"`` or ``"zigzag"``: which positions each rank holds (:func:`shard`).
    block:
        Query rows per block of the blocked kernel (``None``: as many as keep a block within
        :data:`~numeric.torch.attention.BLOCK_ENTRIES` scores).
    constraints:
        A constraint set's keywords (:mod:`numeric.constraints`; the box's ``upper=`` and ``total=``), as
        :func:`numeric.torch.attention.attention` takes them, for this rank's scores ``(..., n, L)``: a number, or a
        tensor broadcasting to them whose rows are this rank's queries (in its layout's order) and whose columns
        are every key of the sequence in position order (size 1 there: one value per row).  Tensors get
        gradients, this rank's part.

    Returns
    -------
    torch.Tensor
        ``(..., n, Ev)``: the output of this rank's queries, in the query's dtype; differentiable once
        (gradients reach the local query, key and value, and the map's tensor parameters).

    Raises
    ------
    ValueError
        On every rank, if the ranks called with different local shapes, dtypes, causality, layout, scale, map or
        inputs that need gradients, or if the arguments are invalid on some ranks only (one all-gather of a small
        descriptor, before the keys move, checks this); otherwise as one process's checks.
    RuntimeError
        If ``torch.distributed`` is not initialised.
    """
    initialised = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size(group) if initialised else None
    try:
        batch, fn, is_map, scale, cset, values = _check_call(query, key, value, is_causal, scale, mapping, layout,
                                                             block, constraints, world)
        error = None
    except (TypeError, ValueError) as exc:
        fn, error = mapping, exc
        try:
            fn = resolve_mapping(mapping)[0]
        except (TypeError, ValueError, ImportError):
            pass
    if initialised:
        _agree(group, query, key, value, is_causal, layout, scale, fn, error, constraints)
    if error is not None:
        raise error
    if not initialised:
        raise RuntimeError("context_parallel_attention needs torch.distributed initialised "
                           "(torch.distributed.init_process_group); for one process use numeric.torch.attention")
    n, m = query.shape[-2], key.shape[-2]
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    names = tuple(k for k in fn.params if isinstance(fn.params[k], torch.Tensor)) if is_map else ()
    given, tensors = spec_constraints(cset, values)
    params = tuple(fn.params[k] for k in names) + tensors
    S = m * world
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1]) if query.shape[-1] else 1.0
    if block is None:
        block = rows_within(BLOCK_ENTRIES, math.prod(batch) * S)
    plan = _Runs(group, rank, world, layout, is_causal, fn, is_map, names, not is_map, n, m, block, given)
    qs = query * scale
    if torch.is_grad_enabled() and any(t.requires_grad for t in (qs, key, value, *params)):
        return _ContextParallelAttention.apply(qs, key, value, plan, *params)
    with torch.no_grad():
        return _forward(qs, *plan.gather(key, value), plan, params)[0]
