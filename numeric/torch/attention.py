"""Attention with any regattn map for PyTorch, with the semantics of ``F.scaled_dot_product_attention``.

``attention(query, key, value, attn_mask, is_causal, scale, mapping)`` computes
``mapping(scale * query @ key^T + mask) @ value`` along the keys, with the
argument names, shapes, mask conventions and broadcasting of
:func:`torch.nn.functional.scaled_dot_product_attention` (SDPA):

* ``query`` is ``(..., L, E)``, ``key`` ``(..., S, E)``, ``value`` ``(..., S, Ev)``;
  the batch dimensions ``...`` broadcast against each other;
* a boolean ``attn_mask`` is True where a query may attend, a float one (of
  the query's dtype) is added to the scores; it broadcasts to the scores'
  shape ``(..., L, S)`` (and adds no batch dimensions);
* ``is_causal=True`` lets query ``i`` see the keys ``j <= i`` (SDPA's top-left
  aligned lower triangle, also for ``L != S``); unlike SDPA it may be combined
  with an ``attn_mask`` (both apply);
* ``scale`` defaults to ``1 / sqrt(E)``.

``mapping`` is a map name (``"softmax"``, ``"sparsemax"``, ``"entmax15"``,
``"entmax"``, a generated module's name), a generated module, a
:class:`~numeric.torch.maps.TorchMap` (with its parameters bound, e.g. one
``alpha`` per head as a tensor of shape ``(H, 1, 1)`` for ``(N, H, L, S)``
scores, which receives gradients), or any callable ``(scores, dim) -> weights``
(called as ``mapping(scores, dim=-1)``).

**Fully masked rows.**  A query that may attend to no key (its scores all
``-inf``) gets weights 0, output 0 and zero gradients, for every mapping: the
maps of :mod:`numeric.torch.maps` do this themselves, and a plain callable's
rows are guarded here (it sees scores 0 on such a row and its weights there
are replaced by 0).  SDPA of recent PyTorch (checked with 2.13) also returns 0
there (measured: ``tests/torch/test_fully_masked_rows.py``); ``torch.softmax`` of such a row and
``nn.MultiheadAttention`` with ``need_weights=True`` give NaN instead (older SDPA releases are said to have
given NaN too; not measured here).

**Memory.**  The queries are taken in blocks of rows, so no scores wider than
``block x S`` (times the batch) exist at once; with ``is_causal`` a block only
computes scores for the keys up to its last query (blocks above the diagonal
are skipped).  When gradients are needed, one ``torch.autograd.Function`` runs
all the blocks: it keeps only its inputs for the backward pass, which
recomputes each block's scores and weights and writes ``dq`` and adds to ``dk``,
``dv`` block by block (the flash-attention recipe, with the map's own
backward for the weights): neither pass materialises the ``L x S`` weights,
and nothing block-sized outlives its block.  A call whose scores have at most
:data:`BLOCK_ENTRIES` entries in all runs as one block with plain autograd
(its weights are kept for the backward pass).  That Function is differentiable
once (no double backward through the blocked path).  A plain callable whose
weights depend on tensors of its own that require gradients (a learned
parameter in a closure) cannot be a Function input; such a call checkpoints
each block instead (:func:`torch.utils.checkpoint.checkpoint`), with the
same bound on the scores but more per-block bookkeeping; a
:class:`~numeric.torch.maps.TorchMap` passes its parameters explicitly.

    >>> import torch
    >>> q = k = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    >>> v = torch.tensor([[1.0], [2.0]])
    >>> attention(q, k, v, scale=10.0, mapping=lambda s, dim: torch.softmax(s, dim))
    tensor([[1.0000],
            [2.0000]])
    >>> attention(q, k, v, is_causal=True, mapping=lambda s, dim: torch.softmax(s, dim))
    tensor([[1.0000],
            [1.6698]])
"""

from __future__ import annotations

import math
import numbers
from types import ModuleType

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from ..constraints import SIMPLEX, choose
from . import fused
from .. import modifiers
from ..plan import Block, Plan, keyword_shape, rows_within
from ..maps import take_keywords
from .maps import TorchMap, get_map

__all__ = ["attention", "BLOCK_ENTRIES"]

#: Query blocks hold at most about this many score entries (batch x rows x S; at least one row a block).
BLOCK_ENTRIES = 1 << 20


def _tensor(x, name: str):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_inputs(query, key, value):
    for name, a in (("query", query), ("key", key), ("value", value)):
        _tensor(a, name)
        if a.dim() < 2:
            raise ValueError(f"{name} must have shape (..., length, features), got a {a.dim()}-d tensor of shape "
                             f"{tuple(a.shape)}")
        if not a.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {a.dtype}")
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"query, key and value must have the same dtype, got {query.dtype}, {key.dtype} and {value.dtype}")
    if not query.device == key.device == value.device:
        raise ValueError(f"query, key and value must be on the same device, got {query.device}, {key.device} and "
                         f"{value.device}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query and key must have the same feature size E: query {tuple(query.shape)}, "
                         f"key {tuple(key.shape)}")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key and value must have the same length S: key {tuple(key.shape)}, value {tuple(value.shape)}")
    try:
        return tuple(torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2]))
    except RuntimeError:
        raise ValueError(f"the batch dimensions of query {tuple(query.shape)}, key {tuple(key.shape)} and "
                         f"value {tuple(value.shape)} do not broadcast") from None


def _check_mask(attn_mask, query, scores: tuple):
    _tensor(attn_mask, "attn_mask")
    if attn_mask.dtype != torch.bool and attn_mask.dtype != query.dtype:
        raise TypeError(f"attn_mask must be boolean (True = may attend) or of the query's dtype {query.dtype} "
                        f"(added to the scores), got dtype {attn_mask.dtype}")
    if attn_mask.device != query.device:
        raise ValueError(f"attn_mask must be on the query's device {query.device}, got {attn_mask.device}")
    if attn_mask.dim() == 0:
        raise ValueError(f"attn_mask must have at least one dimension (the keys); the scores' shape is {scores}")
    try:
        shape = tuple(torch.broadcast_shapes(attn_mask.shape, scores))
    except RuntimeError:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the scores' shape "
                         f"{scores} (batch, L, S)") from None
    if shape != scores:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} adds batch dimensions to the scores' shape "
                         f"{scores} (batch, L, S): it must broadcast to it")
    return attn_mask


def resolve_mapping(mapping):
    """``(fn, is_map)``: the mapping as a callable ``fn(scores, dim=...)``, and whether it is a TorchMap."""
    if isinstance(mapping, (str, ModuleType, TorchMap)):
        return get_map(mapping), True
    if callable(mapping):
        return mapping, False
    raise TypeError("mapping must be a map name, a generated map module, a TorchMap or a callable (scores, dim) -> "
                    f"weights, got {mapping!r}")


def query_rows(x, start: int, stop: int):
    """Rows ``start:stop`` along dim -2 of ``x`` (broadcasting to the scores), unless ``x`` has size 1 there."""
    if x.dim() < 2 or x.shape[-2] == 1:
        return x
    return x[..., start:stop, :]


def _mask_block(mask, block):
    """The part of ``mask`` (or of its gradient) for the :class:`~numeric.plan.Block` ``block``'s rows and keys."""
    if mask is None:
        return None
    part = query_rows(mask, block.start, block.stop)
    return part if part.shape[-1] == 1 else part[..., block.keys]


def _folds(a, b) -> bool:
    """Whether ``b`` is shared by ``a``'s groups: size 1 in the last batch dimension where ``a`` has more (the
    keys and values of grouped-query attention, ``(..., H_kv, 1, S, E)`` against ``(..., H_kv, g, L, E)``)."""
    return a.dim() >= 3 and b.dim() >= 3 and b.shape[-3] == 1 and a.shape[-3] > 1


def _fold(a, lead: tuple):
    """``a`` ``(..., g, m, k)`` as ``lead + (g m, k)``: the groups stacked as rows."""
    return a.expand(lead + tuple(a.shape[-3:])).reshape(lead + (a.shape[-3] * a.shape[-2], a.shape[-1]))


def matmul(a, b):
    """``a @ b``; where ``b`` is shared by ``a``'s groups (:func:`_folds`) the groups are taken as rows of one
    product, so that ``b`` is not copied per group (``torch.matmul``'s broadcasting would expand it)."""
    if not _folds(a, b):
        return torch.matmul(a, b)
    lead = tuple(torch.broadcast_shapes(a.shape[:-3], b.shape[:-3]))
    out = torch.matmul(_fold(a, lead), b.squeeze(-3))
    return out.reshape(lead + tuple(a.shape[-3:-1]) + (out.shape[-1],))


def matmul_t(a, b, groups: int):
    """``a^T @ b`` summed over the groups (dim -3) where ``groups`` is 1 and ``a`` has several, without a product
    per group: the gradient of keys or values shared by the groups (:func:`_folds`)."""
    if groups != 1 or a.dim() < 3 or a.shape[-3] == 1:
        return torch.matmul(a.transpose(-2, -1), b)
    lead = tuple(torch.broadcast_shapes(a.shape[:-3], b.shape[:-3]))
    g = tuple(torch.broadcast_shapes(a.shape[-3:-2], b.shape[-3:-2]))
    a, b = a.expand(lead + g + tuple(a.shape[-2:])), b.expand(lead + g + tuple(b.shape[-2:]))
    return torch.matmul(_fold(a, lead).transpose(-2, -1), _fold(b, lead)).unsqueeze(-3)


def _grad_shape(batch: tuple, x) -> tuple:
    """The shape a gradient of ``x`` is accumulated in: the broadcast ``batch``, kept at 1 in the groups' dimension
    where ``x`` is shared by them."""
    if len(batch) and x.dim() >= 3 and x.shape[-3] == 1:
        batch = batch[:-1] + (1,)
    return batch + tuple(x.shape[-2:])


def block_scores(qs, key, mask, cuts=(None, None), cap=None, slopes=None):
    """Masked scores ``qs key^T`` (+ mask) of one block of query rows; ``cuts``: the block's ``(above, below)`` of
    :meth:`numeric.plan.Plan.cuts`, the diagonals past which its scores are hidden (causal, window); ``cap``: a
    :class:`numeric.modifiers.Softcap` applied before the mask (``None``: none), whose derivative at these scores
    is appended to the list ``slopes`` where one is given (the backward's chain rule)."""
    a = matmul(qs, key.transpose(-2, -1))
    if cap is not None:
        a = cap(torch.tanh, a)
        if slopes is not None:
            slopes.append(cap.slope(a))
    if mask is not None:
        wide = tuple(torch.broadcast_shapes(a.shape, mask.shape))
        if wide != tuple(a.shape):  # value's batch dimensions widen the scores
            a = a.expand(wide).clone()
        if mask.dtype == torch.bool:
            a = a.masked_fill_(mask.logical_not(), -math.inf)
        else:
            a = a.add_(mask)
    above, below = cuts
    if above is not None or below is not None:
        rows, keys = a.shape[-2:]
        hidden = None
        if above is not None:
            hidden = torch.ones(rows, keys, dtype=torch.bool, device=a.device).triu_(above + 1)
        if below is not None:
            before = torch.ones(rows, keys, dtype=torch.bool, device=a.device).tril_(below)
            hidden = before if hidden is None else hidden.logical_or_(before)
        a = a.masked_fill_(hidden, -math.inf)
    return a


def plan_scores(qs, key, mask, plan, block, cap=None, slopes=None):
    """:func:`block_scores` of the :class:`~numeric.plan.Block` ``block`` of ``plan``: the rows ``qs`` and the keys
    ``key`` are the whole ones, sliced here."""
    return block_scores(qs[..., block.rows, :], key[..., block.keys, :], _mask_block(mask, block), plan.cuts(block),
                        cap, slopes)


class MapSpec:
    """What a call's blocks share: the map, its tensor parameters' names, and the options."""

    def __init__(self, fn, is_map, names, causal, guard, dropout_p, block, L, S, constraints=None, offset=0,
                 window=None, softcap=None):
        self.fn, self.is_map, self.names = fn, is_map, names
        # a constraint set's keywords (numeric.constraints): {name: a number (or None), or "tensor"}, the tensors
        # following the map's parameter tensors, in this order
        self.constraints = dict(constraints or {})
        self.causal, self.guard, self.dropout_p = causal, guard, dropout_p
        self.softcap = softcap  # (a numeric.modifiers.Softcap, or None)
        self.L, self.S = L, S
        # causal: query row i sees the keys j <= i + offset (0: SDPA's top-left alignment)
        self.plan = Plan(L, S, max(1, block), causal=causal, offset=offset, window=window)  # (block: L, may be 0)

    def weights(self, a, params, rows: slice, keys: slice, tau=None, keep_tau=False):
        """The (dropped-out) weights of the scores ``a`` of the query rows ``rows`` against the keys ``keys``;
        ``params`` full-size tensors.

        A map's weights can come from the thresholds ``tau`` it gave these scores before (one
        pass instead of a solve); ``keep_tau``: return ``(weights, tau)`` (``tau`` ``None`` where
        there is none to keep).
        """
        kw = {n: query_rows(t, rows.start, rows.stop) for n, t in zip(self.names, params)}
        tensors = iter(params[len(self.names):])
        for name, value in self.constraints.items():  # (no thresholds kept: a constrained map solves each time)
            u = query_rows(next(tensors), rows.start, rows.stop) if isinstance(value, str) else value
            kw[name] = u[..., keys] if isinstance(u, torch.Tensor) and u.shape[-1] > 1 else u
        kept = None
        if self.guard:  # a plain callable: rows with no key get weights 0 (and it sees finite scores there)
            dead = torch.isneginf(a).all(dim=-1, keepdim=True)
            p = self.fn(a.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
        elif self.is_map and not self.constraints and (keep_tau or tau is not None):
            p = self.fn.run(a, -1, kw, tau=tau, keep_tau=keep_tau)
            if keep_tau:
                p, kept = p
        else:
            p = self.fn(a, dim=-1, **kw)
        if self.dropout_p > 0:
            p = F.dropout(p, self.dropout_p, training=True)
        return (p, kept) if keep_tau else p


def _rng_state(device):
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(state, device):
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def blocked_forward(qs, key, value, mask, spec, params):
    """``(out, taus)``: the output of every query block, and the map's thresholds ``(batch, L, 1)`` (``None`` where
    the map keeps none), with which :func:`blocked_backward` finds the weights again without a solve."""
    batch = tuple(torch.broadcast_shapes(qs.shape[:-2], key.shape[:-2], value.shape[:-2]))
    out = qs.new_empty(batch + (spec.L, value.shape[-1]))
    taus = None
    for b in spec.plan:
        a = plan_scores(qs, key, mask, spec.plan, b, spec.softcap)
        p, tau = spec.weights(a, params, b.rows, b.keys, keep_tau=True)
        if tau is not None:
            if taus is None:
                taus = tau.new_empty(tau.shape[:-2] + (spec.L, 1))
            taus[..., b.rows, :] = tau
        del a
        out[..., b.rows, :] = matmul(p, value[..., b.keys, :])
    return out, taus


def blocked_backward(dout, qs, key, value, mask, taus, params, spec, needs, rng=None, into=(None, None, None)):
    """The gradients ``(dq, dk, dv, dmask, *dparams)`` of :func:`blocked_forward`'s output for the cotangent ``dout``,
    block by block (each block's scores and weights recomputed); ``needs``: which of ``qs``, ``key``, ``value``,
    ``mask`` and then ``params`` want one (the others are ``None``); ``rng``: the random state the forward pass's
    dropout started from; ``into``: tensors (or views) of zeros, or of gradients to add to, that ``dq``, ``dk``,
    ``dv`` are accumulated in where their shapes are those the accumulation needs (else new ones are made)."""
    need_q, need_k, need_v, need_m = needs[:4]
    need_p = needs[4:]
    batch = tuple(dout.shape[:-2])

    def accumulator(need, shape, given):
        if not need:
            return None
        if given is not None and tuple(given.shape) == tuple(shape):
            return given
        return torch.zeros(shape, dtype=qs.dtype, device=qs.device)

    dq = accumulator(need_q, batch + tuple(qs.shape[-2:]), into[0])
    dk = accumulator(need_k, _grad_shape(batch, key), into[1])
    dv = accumulator(need_v, _grad_shape(batch, value), into[2])
    dm = torch.zeros_like(mask) if need_m else None
    leaves = [t.detach().requires_grad_(need) for t, need in zip(params, need_p)]
    dparams = [torch.zeros_like(t) if need else None for t, need in zip(params, need_p)]
    wanted = [t for t, need in zip(leaves, need_p) if need]
    with torch.random.fork_rng(devices=[qs.device] if qs.device.type == "cuda" else [],
                               enabled=rng is not None, device_type=qs.device.type):
        if rng is not None:
            _set_rng_state(rng, qs.device)
        for b in spec.plan:
            q_b, k_b, v_b = qs[..., b.rows, :], key[..., b.keys, :], value[..., b.keys, :]
            g = dout[..., b.rows, :]
            slopes = [] if spec.softcap is not None else None
            a = plan_scores(qs, key, mask, spec.plan, b, spec.softcap, slopes)
            with torch.enable_grad():
                a.requires_grad_()
                w = spec.weights(a, leaves, b.rows, b.keys, tau=None if taus is None else taus[..., b.rows, :])
            if need_v:
                dv[..., b.keys, :] += matmul_t(w.detach(), g, dv.shape[-3] if dv.dim() >= 3 else 0)
            if not (need_q or need_k or need_m or wanted):
                continue
            dw = matmul(g, v_b.transpose(-2, -1))
            da, *grads = torch.autograd.grad(w, [a, *wanted], dw)
            del w, dw
            for d, grad in zip([d for d in dparams if d is not None], grads):
                d += grad
            if need_m:  # (the mask is added after the cap)
                view = _mask_block(dm, b)
                view += da.sum_to_size(view.shape)
            if slopes:  # the cap's chain rule (a key absent for the row, with da = 0, may have a NaN slope)
                da = da * torch.nan_to_num(slopes[0], nan=0.0)
            if need_q:
                dq[..., b.rows, :] = matmul(da, k_b)
            if need_k:
                dk[..., b.keys, :] += matmul_t(da, q_b, dk.shape[-3] if dk.dim() >= 3 else 0)
    return (None if dq is None else dq.sum_to_size(qs.shape), None if dk is None else dk.sum_to_size(key.shape),
            None if dv is None else dv.sum_to_size(value.shape), dm, *dparams)


class _BlockedAttention(torch.autograd.Function):
    """Attention over query blocks; the backward pass recomputes each block's weights (flash-attention style).

    Inputs: ``qs = scale * query``, ``key``, ``value``, ``mask`` (or None), the
    spec, and the map's tensor parameters.  Only these inputs (and the map's
    thresholds, one per query) are saved; the output and the gradients are
    written block by block into tensors allocated once.
    """

    @staticmethod
    def forward(ctx, qs, key, value, mask, spec, *params):
        ctx.rng = _rng_state(qs.device) if spec.dropout_p > 0 else None
        out, taus = blocked_forward(qs, key, value, mask, spec, params)
        ctx.spec = spec
        ctx.save_for_backward(qs, key, value, mask, taus, *params)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        qs, key, value, mask, taus, *params = ctx.saved_tensors
        needs = ctx.needs_input_grad[:4] + ctx.needs_input_grad[5:]
        dq, dk, dv, dm, *dparams = blocked_backward(dout, qs, key, value, mask, taus, params, ctx.spec, needs, ctx.rng)
        return dq, dk, dv, dm, None, *dparams


def _block(qs, key, value, mask, spec, params, b):
    """``weights(qs key^T + mask) value`` for the plan's :class:`~numeric.plan.Block` ``b`` with plain autograd (one
    block, or a checkpoint); ``qs``, ``key``, ``value`` and ``mask`` whole."""
    return matmul(spec.weights(plan_scores(qs, key, mask, spec.plan, b, spec.softcap), params, b.rows, b.keys),
                  value[..., b.keys, :])


def _closure_grads(spec, qs, key, mask) -> bool:
    """Whether a plain callable's weights depend on tensors of its own that require grad (probed on one query row)."""
    b = Block(0, 1, *spec.plan.keys(0))
    a = block_scores(qs[..., :1, :], key[..., b.keys, :], _mask_block(mask, b), spec.plan.cuts(b), spec.softcap)
    with torch.enable_grad():
        return spec.weights(a.detach(), (), b.rows, b.keys).requires_grad
def length_factor(length, plan, query, scores: tuple):
    """The factor per query row ``(..., L, 1)`` of the length scale ``length`` (a
    :class:`numeric.modifiers.LengthScale`) for the plan's rows, in the query's dtype and on its device; a tensor
    coefficient (checked: real, on the query's device, one value per head ``(H,)`` or broadcastable to the
    ``scores`` with size 1 along the keys) keeps its graph."""
    logs = torch.as_tensor(length.logs(plan), dtype=query.dtype, device=query.device)
    coef = length.coef
    if isinstance(coef, torch.Tensor):
        if not coef.is_floating_point():
            raise TypeError(f"the length scale's coefficient must be a floating tensor, got dtype {coef.dtype}")
        if coef.device != query.device:
            raise ValueError(f"the length scale's coefficient must be on the query's device {query.device}, got "
                             f"{coef.device}")
        coef = coef.reshape(length.coef_shape(coef.shape, scores)).to(query.dtype)
    elif not isinstance(coef, float):
        raise TypeError(f"the length scale's coefficient must be a number or a tensor, got {type(coef).__name__}")
    return length.factor(logs, coef)


def check_constraints(constraints: dict, query, scores: tuple) -> tuple:
    """``(set, values)`` of :func:`attention`'s constraint keywords (:func:`numeric.constraints.choose`), each a
    number or a real tensor on the query's device broadcasting to the scores (adding no batch dimensions; a 1-D
    tensor of a keyword of one value per row holds one per head, :func:`numeric.plan.keyword_shape`); their
    values are checked by the map (the set's :meth:`~numeric.constraints.ConstraintSet.rows`)."""
    cset, values = choose(constraints)
    out = {}
    for name, value in values.items():
        if value is None or isinstance(value, numbers.Real) and not isinstance(value, bool):
            out[name] = value if value is None else float(value)
            continue
        _tensor(value, name)
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a real number or a floating tensor, got dtype {value.dtype}")
        if value.device != query.device:
            raise ValueError(f"{name} must be on the query's device {query.device}, got {value.device}")
        out[name] = value.reshape(keyword_shape(name, value.shape, scores, name in cset.per_score))
    return cset, out


def spec_constraints(cset, values: dict) -> tuple:
    """``(for MapSpec, tensors)``: a constrained call's keywords as :class:`MapSpec` takes them (tensors as
    ``"tensor"``) and its tensors in order; the simplex's: ``({}, ())``."""
    if cset is SIMPLEX:
        return {}, ()
    tensors = tuple(v for v in values.values() if isinstance(v, torch.Tensor))
    return {n: "tensor" if isinstance(v, torch.Tensor) else v for n, v in values.items()}, tensors


def attention(query, key, value, attn_mask=None, is_causal=False, scale=None, mapping="softmax", *, dropout_p=0.0,
              block=None, backend="auto", window=None, softcap=None, length_scale=None, **constraints):
    """``mapping(scale * query @ key^T + attn_mask) @ value``, SDPA's semantics (module docstring).

    Parameters
    ----------
    query, key, value:
        ``(..., L, E)``, ``(..., S, E)``, ``(..., S, Ev)`` floating tensors of one
        dtype and device; batch dimensions broadcast.
    attn_mask:
        Boolean (True = may attend) or float of the query's dtype (added to the
        scores), broadcastable to ``(..., L, S)``.
    is_causal:
        Query ``i`` sees keys ``j <= i`` (top-left aligned, as SDPA).
    scale:
        Score scale, ``1 / sqrt(E)`` by default.
    mapping:
        Map name, generated module, TorchMap, or callable ``(scores, dim) -> weights``.
    dropout_p:
        Dropout probability on the weights (applied whenever ``> 0``, as SDPA;
        pass 0 in evaluation).
    block:
        Query rows per block (a positive integer); ``None``: as many rows as
        keep a block's scores within :data:`BLOCK_ENTRIES` entries (at least one).
    backend:
        ``"torch"``: the blocked torch path; ``"triton"``: the map's fused Triton
        kernels (:mod:`numeric.torch.fused`; CPU tensors through Triton's
        interpreter), or the torch path after a warning that says why not;
        ``"auto"`` (default): ``"triton"`` on CUDA tensors when Triton is
        installed and the call is one the kernels cover, the torch path otherwise.
    softcap:
        A cap ``c > 0`` on the scores (Gemma 2): each becomes ``c tanh(s / c)`` before the mask is added
        (:class:`numeric.modifiers.Softcap`; the fused kernels' ``SOFTCAP``).
    window:
        A sliding window (a positive integer, implying ``is_causal``): query ``i`` sees the ``window`` keys
        ``i - window < j <= i``; the blocks of keys before a query block's window are skipped
        (:class:`~numeric.plan.Plan`, and the fused kernels' ``WINDOW``), no ``L x S`` mask is made.
    length_scale:
        Each query's scores times a factor of its position or of the number of keys it sees, before the cap and
        the mask: :func:`numeric.modifiers.ssmax` (Scalable-Softmax, ``s log n``) or
        :func:`numeric.modifiers.llama4` (``1 + a log(1 + floor((i + 1) / floor))``), its coefficient a number or
        a tensor (one per head, ``(H,)``; a gradient flows to it), applied to the queries
        (:class:`~numeric.modifiers.LengthScale`), so the fused kernels take it too.
    constraints:
        The keywords of a constraint set other than the simplex (:mod:`numeric.constraints`; a regattn map only),
        each a number or a tensor broadcastable to the scores ``(..., L, S)`` (size 1 along the keys for one value
        per query); a tensor that requires grad gets one.  The box: ``upper``, a bound on each weight, ``>= 0``,
        the map over ``0 <= p <= upper`` (:meth:`~numeric.torch.maps.TorchMap.__call__`), as in constrained
        (fertility-bounded) attention; a query's bounds on the keys it may attend to (those of the mask and, with
        ``is_causal``, ``j <= i``) must sum to at least 1.  The fused kernels run the sets that have a hook
        (:attr:`~numeric.constraints.ConstraintSet.fused`: the box's bounds,
        :func:`numeric.kernels.triton_attention.attention_forward` with ``SET='box'``).

    Returns
    -------
    ``(..., L, Ev)``, the broadcast batch shape, the query's dtype.
    """
    batch = check_inputs(query, key, value)
    L, S, E = query.shape[-2], key.shape[-2], query.shape[-1]
    scores = batch + (L, S)
    if attn_mask is not None:
        _check_mask(attn_mask, query, scores)
    if scale is None:
        scale = 1.0 / math.sqrt(E) if E else 1.0
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {scale!r}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0 <= dropout_p < 1:
        raise ValueError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if block is not None and (isinstance(block, bool) or not isinstance(block, numbers.Integral) or block < 1):
        raise ValueError(f"block must be a positive integer or None, got {block!r}")
    fused.check_backend(backend)
    fn, is_map = resolve_mapping(mapping)
    if is_map:
        fn.values()  # (every parameter bound, else the map's own error, before either path reads them)
    fn, constraints = take_keywords(fn, constraints)
    cset, values = check_constraints(constraints, query, scores)
    if cset is not SIMPLEX and not is_map:
        raise TypeError(f"{'='.join(constraints)}= needs a regattn map (a name, a generated module or a TorchMap), "
                        f"not a callable")
    if window is not None:
        Plan(L, S, 1, window=window)  # (checks it)
    cap = modifiers.softcap(softcap)
    length = modifiers.length_scale(length_scale)
    if length is not None:  # a factor per query row, on the queries
        query = query * length_factor(length, Plan(L, S, causal=bool(is_causal), window=window), query, scores)
    if backend == "triton" or backend == "auto" and query.is_cuda and block is None:
        # a family with one value per head in several cases: each case's heads through its own kernels
        groups = fused.case_groups(fn, batch) if is_map else None
        whys = [fused.unsupported(query, attn_mask, m, True, float(dropout_p), cset) for _, m in groups or ()]
        why = next((w for w in whys if w is not None), None) if groups else \
            fused.unsupported(query, attn_mask, fn, is_map, float(dropout_p), cset)
        why = why or fused.unsupported_set(cset, values)
        if why is None and L and S:
            hook = fused.set_arguments(cset, values, attn_mask, bool(is_causal), scores, query.dtype, window)
            if groups:
                return fused.grouped_attention(query, key, value, attn_mask, bool(is_causal), float(scale), groups,
                                               batch, window=window, softcap=cap, **hook)
            return fused.fused_attention(query, key, value, attn_mask, bool(is_causal), float(scale), fn, batch,
                                         window=window, softcap=cap, **hook)
        if why is not None and backend == "triton":
            fused.warn_fallback(why)
    names = tuple(n for n in fn.params if isinstance(fn.params[n], torch.Tensor)) if is_map else ()
    given, tensors = spec_constraints(cset, values)
    params = tuple(fn.params[n] for n in names) + tensors
    qs = query * scale
    if L == 0 or S == 0:  # no queries, or no keys: the output is 0 (empty sums), still attached to the inputs
        return torch.matmul(torch.matmul(qs, key.transpose(-2, -1)), value)
    n = math.prod(batch)
    block = min(L, rows_within(BLOCK_ENTRIES, n * S) if block is None else block)
    spec = MapSpec(fn, is_map, names, is_causal, not is_map and attn_mask is not None, float(dropout_p), block, L, S,
                   given, window=window, softcap=cap)
    if block == L:  # one block: plain autograd, the weights are kept for the backward pass
        return _block(qs, key, value, attn_mask, spec, params, next(iter(spec.plan)))
    if torch.compiler.is_compiling() and torch.is_grad_enabled():
        # traced by torch.compile, which can trace neither the Function's backward (it calls autograd.grad)
        # nor a checkpoint of a map's solve (torch.cond): the blocks with plain autograd, whose weights are
        # kept for the backward pass
        return torch.cat([_block(qs, key, value, attn_mask, spec, params, b) for b in spec.plan], dim=-2)
    own = torch.is_grad_enabled() and not is_map and _closure_grads(spec, qs, key, attn_mask)
    if not (own or torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (qs, key, value, attn_mask, *params))):
        with torch.no_grad():
            return blocked_forward(qs, key, value, attn_mask, spec, params)[0]
    if own:
        # the callable's own tensors need gradients that only autograd can route: checkpoint each block
        outs = [checkpoint(_block, qs, key, value, attn_mask, spec, params, b, use_reentrant=False,
                           preserve_rng_state=dropout_p > 0) for b in spec.plan]
        return torch.cat(outs, dim=-2)
    return _BlockedAttention.apply(qs, key, value, attn_mask, spec, *params)
