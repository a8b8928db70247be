"""The Fenchel-Young loss ``Omega*(s) + Omega(y) - <s, y>`` of a map, on torch tensors.

The conventions are :meth:`numeric.Map.loss_and_grad`'s: the loss is summed
score by score, ``omega(y_i) - omega(p_i) - (y_i - p_i) s_i`` with ``p = p*(s)``
and the scores shifted by their row maximum; masked scores (``-inf``) are left
out, a target with mass on one has infinite loss, a NaN score makes its row
NaN.  The gradient with respect to the scores is ``p - y``; with respect to a
map parameter ``q`` it is, by the envelope theorem (``p`` maximises
``<p, s> - Omega(p)``), ``sum_i d omega(y_i)/dq - d omega(p_i)/dq`` at fixed
``p``, taken by autograd through the printed ``omega``.  The gradient ``p - y``
is computed from the map's output, so the loss's Hessian in the scores is the
map's Jacobian (double backward).
"""

from __future__ import annotations

import math

import torch

from .. import tensor_rules
from ._ops import ops_for
from .maps import TorchMap, check_dim, routine_table, get_map

__all__ = ["fenchel_young_loss", "FenchelYoungLoss"]

_HALF = (torch.float16, torch.bfloat16)
_REDUCTIONS = ("none", "sum", "mean")


def _target(x, target, dim):
    """``target`` as distributions like ``x`` (integer labels become one-hot), checked."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch tensor, got {type(target).__name__}")
    if target.device != x.device:
        raise ValueError(f"target is on {target.device}, the scores on {x.device}")
    n = x.shape[dim]
    if not (target.is_floating_point() or target.dtype == torch.bool):
        batch = x.shape[:dim] + x.shape[dim + 1:]
        if target.shape != batch:
            raise ValueError(f"integer labels must have shape {tuple(batch)} for scores {tuple(x.shape)} along dim {dim}, "
                             f"got {tuple(target.shape)}")
        if target.numel() and (int(target.min()) < 0 or int(target.max()) >= n):
            raise ValueError(f"target labels must lie in [0, {n}) for dim {dim} of length {n}")
        onehot = torch.nn.functional.one_hot(target.long(), n).to(x.dtype)
        return onehot.movedim(-1, dim)
    if target.shape != x.shape:
        raise ValueError(f"target of shape {tuple(target.shape)} does not match scores of shape {tuple(x.shape)}")
    target = target.detach().to(x.dtype)
    if target.numel():
        total = target.sum(dim=dim)
        slack = math.sqrt(torch.finfo(x.dtype).eps)
        negative = bool((target < 0).any())
        worst = float((total - 1).abs().max())
        if negative or not worst <= slack:  # (NaN fails too)
            what = "a negative entry" if negative else f"a row summing to {float(total.reshape(-1)[(total - 1).abs().reshape(-1).argmax()])!r}"
            raise ValueError(f"target must be a distribution along dim {dim} (non-negative, summing to 1 within {slack:.1e}); "
                             f"it has {what}")
    return target


def _omega_terms(module, x, p, y, params):
    """Per row ``sum_i [omega(y_i) - omega(p_i)] - (y_i - p_i) s_i`` along the last axis
    (:func:`numeric.tensor_rules.omega_terms`); differentiable in the parameters (tensors) only."""
    r = tensor_rules.Routines(module, routine_table(module), params)
    return tensor_rules.omega_terms(ops_for(x.dtype), r, x, p, y)[..., 0]


class _LossFunction(torch.autograd.Function):
    """Per-row loss of rows ``x`` (2-D) from ``p = m(x)`` (the map's output, in the graph), ``y`` and the parameter tensors."""

    @staticmethod
    def forward(ctx, x, p, y, module, *params):
        ctx.module = module
        ctx.save_for_backward(x, p, y, *params)
        with torch.no_grad():
            return _omega_terms(module, x, p, y, params)

    @staticmethod
    def backward(ctx, grad):
        x, p, y, *params = ctx.saved_tensors
        g = grad.unsqueeze(-1)
        out = [g * (p - y) if ctx.needs_input_grad[0] else None, None, None, None]
        need = [i for i in range(len(params)) if ctx.needs_input_grad[4 + i]]
        grads = [None] * len(params)
        if need:
            with torch.enable_grad():
                free = [q.detach().requires_grad_(i in need) for i, q in enumerate(params)]
                value = _omega_terms(ctx.module, x.detach(), p.detach(), y.detach(), free)
                got = torch.autograd.grad(value, [free[i] for i in need], grad_outputs=grad.detach(), allow_unused=True)
            for i, gi in zip(need, got):
                grads[i] = torch.zeros_like(params[i]) if gi is None else gi
        return (*out, *grads)


def fenchel_young_loss(scores, target, mapping="softmax", reduction: str = "mean", dim: int = -1):
    """The Fenchel-Young loss of ``mapping`` (a name, a generated module or a :class:`TorchMap` with its parameters).

    ``target``: integer labels (the batch shape: ``scores`` without ``dim``) or
    distributions like ``scores``.  ``reduction``: ``"none"`` (one value per row,
    batch shape), ``"sum"`` or ``"mean"`` (over rows).  Gradients: ``p*(s) - y`` for
    the scores, the envelope theorem's for the map's parameters.

    >>> import torch
    >>> s = torch.tensor([[1.0, 0.5, -1.0]], requires_grad=True)
    >>> loss = fenchel_young_loss(s, torch.tensor([0]), "sparsemax")
    >>> loss.item()
    0.0625
    >>> loss.backward(); s.grad
    tensor([[-0.2500,  0.2500,  0.0000]])
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    m = get_map(mapping)
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores must be a torch tensor, got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise TypeError(f"scores must be a floating tensor, got dtype {scores.dtype}")
    dim = check_dim(scores, dim)
    missing = [n for n in m.module.PARAMETERS if n not in m.params]
    if missing:
        raise ValueError(f"map {m.name!r} needs a value for {', '.join(missing)}: bind it, e.g. TorchMap({m.name!r}, "
                         f"{missing[0]}=...)")
    dtype = torch.float32 if scores.dtype in _HALF else scores.dtype
    x = scores.to(dtype)
    y = _target(x, target, dim)
    p = m(x, dim=dim)
    n = x.shape[dim]
    rows = lambda a: a.movedim(dim, -1).reshape(-1, n)  # noqa: E731
    tensors = tuple(m._param_rows(name, m.params[name], x, dim, dtype) for name in m.module.PARAMETERS)
    value = _LossFunction.apply(rows(x), rows(p), rows(y), m.module, *tensors)
    value = value.reshape(x.shape[:dim] + x.shape[dim + 1:])
    if reduction == "sum":
        value = value.sum()
    elif reduction == "mean":
        value = value.sum() / max(1, value.numel())
    return value if value.dtype == scores.dtype else value.to(scores.dtype)


class FenchelYoungLoss(torch.nn.Module):
    """:func:`fenchel_young_loss` as a module: ``FenchelYoungLoss(mapping, reduction, dim)(scores, target)``.

    >>> import torch
    >>> FenchelYoungLoss("softmax")(torch.zeros(2, 4), torch.tensor([1, 3]))
    tensor(1.3863)
    """

    def __init__(self, mapping="softmax", reduction: str = "mean", dim: int = -1):
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
        self.mapping = get_map(mapping)
        self.reduction = reduction
        self.dim = dim

    def forward(self, scores, target):
        return fenchel_young_loss(scores, target, self.mapping, self.reduction, self.dim)

    def extra_repr(self) -> str:
        return f"mapping={self.mapping!r}, reduction={self.reduction!r}, dim={self.dim}"


_ = TorchMap  # (re-exported by numeric.torch)
