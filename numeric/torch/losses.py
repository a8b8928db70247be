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
map's Jacobian (double backward).  Under double backward the gradient in a
parameter is taken through ``p`` too, and a constraint set's gradients (the
box's multipliers) through the map's threshold, which carries its gradient: the
loss is twice differentiable in the scores, the parameters and the set's arrays.
"""

from __future__ import annotations


import torch

from .. import front
from ..constraints import SIMPLEX
from ..maps import choose_for
from ..core.ops import Routines
from ._ops import ops_for
from .maps import ARRAYS, TorchMap, check_dim, get_map, routine_table

__all__ = ["fenchel_young_loss", "FenchelYoungLoss"]

_HALF = (torch.float16, torch.bfloat16)


def _omega_terms(module, x, p, y, params, cset=SIMPLEX, arrays: tuple = ()):
    """Per row ``sum_i [omega(y_i) - omega(p_i)] - (y_i - p_i) s_i`` along the last axis over the constraint set
    ``cset`` (:meth:`numeric.constraints.ConstraintSet.loss_terms`, its ``arrays`` laid out as rows); differentiable
    in the parameters (tensors) only."""
    r = Routines(module, routine_table(module), params)
    return cset.loss_terms(ops_for(x.dtype), r, x, p, y, *arrays)[..., 0]


class _LossFunction(torch.autograd.Function):
    """Per-row loss of rows ``x`` (2-D) from ``p = m(x)`` (the map's output, in the graph), ``y``, the map's
    threshold ``tau`` (``(rows, 1)``, or ``None`` on the simplex), its constraint set ``cset`` with its ``count``
    arrays laid out as rows, then the parameter tensors."""

    @staticmethod
    def forward(ctx, x, p, y, tau, module, cset, count, *tensors):
        ctx.module, ctx.cset, ctx.count = module, cset, count
        params = tensors[count:]
        ctx.save_for_backward(x, p, y, tau, *tensors)
        with torch.no_grad():
            return _omega_terms(module, x, p, y, params, cset, tensors[:count])

    @staticmethod
    def backward(ctx, grad):
        x, p, y, tau, *tensors = ctx.saved_tensors
        arrays, params = tensors[:ctx.count], tensors[ctx.count:]
        g = grad.unsqueeze(-1)
        need = ctx.needs_input_grad
        out = [g * (p - y) if need[0] else None, None, None, None, None, None, None]
        if any(need[7:7 + ctx.count]):  # the gradients in the set's arrays (the box: its multipliers, tau)
            r = Routines(ctx.module, routine_table(ctx.module), tuple(params))
            own = ctx.cset.loss_gradients(ops_for(x.dtype), r, x, tau, *arrays, p=p, y=y)
            out += [g * a if need[7 + i] else None for i, a in enumerate(own)]
        else:
            out += [None] * ctx.count
        need = [i for i in range(len(params)) if ctx.needs_input_grad[7 + ctx.count + i]]
        grads = [None] * len(params)
        if need and torch.is_grad_enabled():  # (double backward: through p, which moves with the parameters too)
            got = torch.autograd.grad(_omega_terms(ctx.module, x, p, y, params, ctx.cset, arrays), [params[i] for i in need],
                                      grad_outputs=grad, allow_unused=True, create_graph=True)
        elif need:
            with torch.enable_grad():
                free = [q.detach().requires_grad_(i in need) for i, q in enumerate(params)]
                value = _omega_terms(ctx.module, x.detach(), p.detach(), y.detach(), free, ctx.cset,
                                     tuple(a.detach() for a in arrays))
                got = torch.autograd.grad(value, [free[i] for i in need], grad_outputs=grad.detach(), allow_unused=True)
        for i, gi in zip(need, got if need else ()):
            grads[i] = torch.zeros_like(params[i]) if gi is None else gi
        return (*out, *grads)


class _FamilyLossFunction(torch.autograd.Function):
    """A map family's loss per row of rows ``x`` from ``p`` (the family's map of ``x``, in the graph), ``y`` and the
    family's parameters (:meth:`numeric.families.base.Family.loss`); the gradient ``p - y`` in the scores."""

    @staticmethod
    def forward(ctx, x, p, y, fam, *values):
        ctx.family = fam
        ctx.save_for_backward(p, y)
        with torch.no_grad():
            return fam.loss(ops_for(x.dtype), x, p, y, *values)[..., 0]

    @staticmethod
    def backward(ctx, grad):
        p, y = ctx.saved_tensors
        if any(ctx.needs_input_grad[4:]):
            raise RuntimeError(ctx.family.no_gradient)
        return (grad.unsqueeze(-1) * (p - y) if ctx.needs_input_grad[0] else None, None, None, None,
                *(None for _ in ctx.needs_input_grad[4:]))


def fenchel_young_loss(scores, target, mapping="softmax", reduction: str = "mean", dim: int = -1, **constraints):
    """The Fenchel-Young loss of ``mapping`` (a name, a generated module or a :class:`TorchMap` with its parameters).

    ``target``: integer labels (the batch shape: ``scores`` without ``dim``) or
    distributions like ``scores``.  ``reduction``: ``"none"`` (one value per row,
    batch shape), ``"sum"`` or ``"mean"`` (over rows).  Gradients: ``p*(s) - y`` for
    the scores, the envelope theorem's for the map's parameters.

    ``constraints``: the loss of the map over a constraint set (:mod:`numeric.constraints`,
    :meth:`numeric.Map.loss_and_grad`), the target inside the set; gradients flow to the set's tensors that
    require them (the box, ``upper=``, ``total=``: the multipliers ``[s_i - tau - omega'(u_i)]_+`` of the bounds,
    and ``tau`` for the total).

    >>> import torch
    >>> s = torch.tensor([[1.0, 0.5, -1.0]], requires_grad=True)
    >>> loss = fenchel_young_loss(s, torch.tensor([0]), "sparsemax")
    >>> loss.item()
    0.0625
    >>> loss.backward(); s.grad
    tensor([[-0.2500,  0.2500,  0.0000]])
    """
    front.check_reduction(reduction)
    m = get_map(mapping)
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores must be a torch tensor, got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise TypeError(f"scores must be a floating tensor, got dtype {scores.dtype}")
    dim = check_dim(scores, dim)
    m.values()
    dtype = torch.float32 if scores.dtype in _HALF else scores.dtype
    x = scores.to(dtype)
    if isinstance(target, torch.Tensor) and target.device != x.device:
        raise ValueError(f"target is on {target.device}, the scores on {x.device}")
    n = x.shape[dim]
    rows = lambda a: a.movedim(dim, -1).reshape(-1, n)  # noqa: E731
    if m.family is not None:  # (a map family's own loss)
        m.family.check_set(constraints)
        y = front.check_target(x, target, dim, ARRAYS, "dim").detach()
        values = tuple(m._param_rows(name, m.params[name], x, dim, dtype) for name in m.family.parameters)
        value = _FamilyLossFunction.apply(rows(x), rows(m(x, dim=dim)), rows(y), m.family, *values)
        value = front.reduce(value.reshape(x.shape[:dim] + x.shape[dim + 1:]), reduction)
        return value if value.dtype == scores.dtype else value.to(scores.dtype)
    cset, values = choose_for(m, constraints)
    arrays = cset.rows(torch, ARRAYS, x, values, dim, "dim")
    y = front.check_target(x, target, dim, ARRAYS, "dim", constraint=(cset, arrays)).detach()
    tau = None
    if cset is SIMPLEX:
        p = m.run(x, dim, {})
    else:
        p, tau = m.run_constrained(x, dim, {}, cset, values, keep_tau=True)
        tau = tau.movedim(dim, -1).reshape(-1, 1)
    tensors = tuple(m._param_rows(name, m.params[name], x, dim, dtype) for name in m.module.PARAMETERS)
    value = _LossFunction.apply(rows(x), rows(p), rows(y), tau, m.module, cset, len(arrays), *arrays, *tensors)
    value = front.reduce(value.reshape(x.shape[:dim] + x.shape[dim + 1:]), reduction)
    return value if value.dtype == scores.dtype else value.to(scores.dtype)


class FenchelYoungLoss(torch.nn.Module):
    """:func:`fenchel_young_loss` as a module: ``FenchelYoungLoss(mapping, reduction, dim)(scores, target)``.

    >>> import torch
    >>> FenchelYoungLoss("softmax")(torch.zeros(2, 4), torch.tensor([1, 3]))
    tensor(1.3863)
    """

    def __init__(self, mapping="softmax", reduction: str = "mean", dim: int = -1):
        super().__init__()
        front.check_reduction(reduction)
        self.mapping = get_map(mapping)
        self.reduction = reduction
        self.dim = dim

    def forward(self, scores, target, **constraints):
        return fenchel_young_loss(scores, target, self.mapping, self.reduction, self.dim, **constraints)

    def extra_repr(self) -> str:
        return f"mapping={self.mapping!r}, reduction={self.reduction!r}, dim={self.dim}"


_ = TorchMap  # (re-exported by numeric.torch)
