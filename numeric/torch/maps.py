"""Attention maps ``p*(s) = argmax_{p in simplex} <p, s> - Omega(p)`` on torch tensors.

A :class:`TorchMap` wraps a generated map module (a built-in name, the name
of an importable module ``regattn generate`` wrote, or the module itself,
checked as :func:`numeric.get_map` checks it) and solves it with the rules of
:mod:`numeric.core` on the module's NumPy routines run on torch tensors
(:func:`numeric.contract.routines_on` with :data:`TORCH_AS_NUMPY`).  Each call
is a :class:`torch.autograd.Function` whose backward is the derived JVP
``J v = w*v - w (w.v) / sum(w)``, ``w = weight(p)`` on the support, computed
from the output ``p`` with torch operations (so it is differentiable again:
double backward), and whose parameter gradients are ``-(J v) . c`` with
``c = omega_prime_d_q(p)`` (``q`` = ``alpha``), summed to the parameter's shape.

Conventions are :class:`numeric.Map`'s: scores of ``-inf`` are masked
(probability exactly 0), a fully masked row gives zeros and zero gradients,
a NaN score makes its row NaN.  float16 and bfloat16 compute in float32 and
return their dtype.  Parameters are Python numbers or tensors broadcasting to
the scores with size 1 along ``dim`` (one value per row, e.g. per head), on
the scores' device.

Where the module's ``TERM_IS_EXP`` says the closed threshold's term is ``exp``
itself (softmax), a call is :func:`torch.softmax` with torch's own backward
``p * (v - p.v)`` (the derived JVP with ``w = p``, ``sum(w) = 1``); only a call
with a NaN or fully masked row takes the rules and the derived backward.  Under
:func:`torch.compile` such a call is traced without a branch on values (no graph
break): softmax written out, fully masked rows divided by 1 instead of 0.
"""

from __future__ import annotations

import math
from functools import lru_cache
from importlib import import_module
from types import ModuleType

import torch

from .. import contract, family, front
from ..constraints import SIMPLEX, split
from ..core import derivatives, rules
from ..core.ops import Routines
from ..families import functions
from ..maps import FrameworkMap, choose_for
from ._ops import OUTSIDE_MODULES, ops_for

__all__ = ["TorchMap", "get_map", "softmax", "sparsemax", "entmax15", "entmax", "FAMILY_FUNCTIONS"]

_HALF = (torch.float16, torch.bfloat16)


def _cbrt(x):
    return torch.sign(x) * torch.abs(x) ** (1 / 3)


#: Above this ``|x|``, :func:`_arcsinh` takes ``sqrt(1 + x**2)`` as ``|x|`` (their ratio is 1 to float32 and
#: float64 rounding from ``2**27`` on) and scales ``x`` down by :data:`_ASINH_SCALE` (``x**2`` overflows float32
#: from ``2**64``).
_ASINH_BIG = 2.0**60
_ASINH_SCALE = 1 / _ASINH_BIG


def _arcsinh(x):
    if not torch.compiler.is_compiling():
        return torch.asinh(x)
    # asinh|x| = log1p(a + a r), r = a / (1 + sqrt(1 + a**2)) (a = |x|: no cancellation, one log1p where inductor's
    # asinh takes two), and past _ASINH_BIG log1p(a s (1 + r) - 1) - log(s) with r = 1 and s = _ASINH_SCALE: the
    # identity of the Triton kernels' rg_asinh (numeric.kernels.triton_math), whose large arguments take
    # log(a) + log(2) instead; here both sides of a select run in one CPU kernel, and that would be a second log
    a = torch.abs(x)
    big = a > _ASINH_BIG
    r = torch.where(big, 1.0, a / (1 + torch.sqrt(1 + a * a)))
    u = torch.where(big, a * _ASINH_SCALE * (1 + r) - 1, a * (1 + r))
    return torch.copysign(torch.log1p(u) - big.to(x.dtype) * math.log(_ASINH_SCALE), x)


#: torch under the names of the NumPy functions generated routines call (:func:`numeric.contract.namespace_as_numpy`):
#: ``numpy.power`` is ``torch.pow``, the cube root (torch has none) is real for negative arguments as NumPy's is;
#: under ``torch.compile`` ``arcsinh`` is :func:`_arcsinh`; every other name is torch's
TORCH_AS_NUMPY = contract.namespace_as_numpy("numeric.torch.as_numpy", torch, power=torch.pow, cbrt=_cbrt,
                                             arcsinh=_arcsinh)


@lru_cache(maxsize=None)
def routine_table(module: ModuleType) -> dict:
    """The module's routines on torch tensors (bound once per module)."""
    return contract.routines_on(module, TORCH_AS_NUMPY, erf=torch.special.erf)


@lru_cache(maxsize=None)
def _function_named(fn: str):
    """The module-level function ``"package.module:function"`` (found once, not on every compiled call)."""
    where, _, name = fn.partition(":")
    found = import_module(where)
    for part in name.split("."):
        found = getattr(found, part)
    return found


@torch.library.custom_op("regattn::rows_outside_graph", mutates_args=())
def _rows_outside_graph(fn: str, module: str, mask: torch.Tensor, rows: list[torch.Tensor],
                        otherwise: torch.Tensor) -> torch.Tensor:
    """:meth:`numeric.torch._ops.TorchOps.rare_rows` under ``torch.compile``: ``fn``
    (``"package.module:function"``) of the generated ``module``'s torch routines (the module kept by
    :func:`numeric.torch._ops._outside_names`) on the rows where ``mask`` is true, ``otherwise`` elsewhere, run
    eagerly on those rows alone (an operator opaque to the compiler: its graph holds a call, not the solve)."""
    solve = _function_named(fn)
    mod = OUTSIDE_MODULES[module]
    ops = ops_for(otherwise.dtype)
    r = Routines(mod, routine_table(mod))
    out = ops.on_rows(mask, lambda *rows: solve(ops, r, *rows), tuple(rows), otherwise)
    return out.clone() if out is otherwise else out  # (an operator's output may not alias its input)


@_rows_outside_graph.register_fake
def _(fn, module, mask, rows, otherwise):
    return torch.empty_like(otherwise)


class _TorchArrays(front.Arrays):
    """:class:`numeric.front.Arrays` of torch tensors: a parameter tensor is kept as it is (graph and all); under
    :func:`torch.compile` no value reaches Python, and the domain check runs with the graph."""

    def __init__(self):
        super().__init__(torch)

    def is_array(self, a) -> bool:
        return isinstance(a, torch.Tensor)

    def kind(self, a) -> str:
        if a.is_floating_point():
            return "f"
        if a.is_complex():
            return "c"
        return "b" if a.dtype == torch.bool else "u" if a.dtype == torch.uint8 else "i"

    def readable(self, a):
        return None if torch.compiler.is_compiling() else a.detach()

    def check_traced(self, a, lo, hi, message: str) -> None:
        v = a.detach()
        torch._assert_async(((lo < v) & (v < hi)).all(), message)

    def keep(self, a):
        return a if a.is_floating_point() else a.to(torch.get_default_dtype())

    def eps(self, dtype) -> float:
        return torch.finfo(dtype).eps

    def astype(self, a, dtype):
        return a.to(dtype)

    def full(self, shape: tuple, value: float, like):
        return torch.full(shape, value, dtype=like.dtype, device=like.device)

    def one_hot(self, labels, n: int, like):
        return torch.nn.functional.one_hot(labels.long(), n).to(like.dtype)


#: torch's :class:`numeric.front.Arrays`
ARRAYS = _TorchArrays()


def check_dim(x, dim) -> int:
    """The map's ``dim`` of the scores ``x``, checked (:func:`numeric.front.check_axis`)."""
    return front.check_axis(x.shape, dim, "dim")


class _Solver(front.Solver):
    """A module's constants and torch routines; ``routines(params)`` binds them to parameter tensors (outside a
    graph: the passes here make none)."""

    def __init__(self, module: ModuleType, threshold: str):
        super().__init__(module, threshold, routine_table(module), ops_for)
        self.softmax = bool(module.TERM_IS_EXP) and not self.names and threshold in ("auto", "closed")
        # weight(0) of a map without parameters (the module's NumPy weight: a torch tensor read back would break a
        # torch.compile graph that builds the first map of a module)
        self.at_zero = derivatives.weight_at_zero(module)

    def forward(self, x, params):
        """``p`` for the rows of the 2-D ``x`` (no graph)."""
        if self.softmax and not torch.compiler.is_compiling():  # B = exp: torch's normalisation; fully masked (or
            # NaN) rows by the rules (traced: the rules alone, no branch on values)
            p = torch.softmax(x, dim=-1)
            if not bool(torch.isnan(p.sum())):  # (p is finite: NaN only from a NaN or fully masked row)
                return p
        p, _ = rules.solve(ops_for(x.dtype), self.routines(params), x, method=self.method)
        return p

    def solve(self, x, params):
        """``(p, t)`` for the rows of the 2-D ``x`` (no graph): ``t = tau - max(x)``, or ``None`` where :meth:`at`
        cannot use it."""
        r = self.routines(params)
        if self.softmax or not rules.recomputable(r):
            return self.forward(x, params), None
        return rules.solve(ops_for(x.dtype), r, x, method=self.method, relative=True)

    def at(self, x, tau, params):
        """``p`` for the rows of the 2-D ``x`` from the ``t`` of :meth:`solve` (no graph)."""
        return rules.at_threshold(ops_for(x.dtype), self.routines(params), x, tau)

    def constrained_vjp(self, cset, p, grad, arrays, params, graph: bool, x=None):
        """``(J^T g, (the set's arrays' VJPs), {name: dp/dq^T g})`` of the map over ``cset`` at ``p``, the
        parameters' in float64 (as :class:`_MapFunction`'s); ``graph``: differentiable again (the weight masked at
        0); ``x``: the scores (one-sided derivatives, :attr:`numeric.constraints.ConstraintSet.needs_scores`)."""
        ops = ops_for(p.dtype)
        js, own = cset.vjp(ops, self.routines(params), p, grad, *arrays, at_zero=None if graph else self.at_zero, x=x)
        out = {}
        for name in self.names:
            if p.dtype == torch.float64:
                ops64, r64, p64, js64, own64, a64, x64 = ops, self.routines(params), p, js, own, arrays, x
            else:
                ops64, p64 = ops_for(torch.float64), p.double()
                r64 = self.routines(tuple(v.double() for v in params))
                a64, x64 = tuple(a.double() for a in arrays), None if x is None else x.double()
                js64, own64 = cset.vjp(ops64, r64, p64, grad.double(), *a64, x=x64)
            g = derivatives.param_vjp(ops64, r64, p64, None, name, ju=js64)
            for c, o in zip(cset.param_directions(ops64, r64, p64, name, *a64, x=x64), own64):
                g = g - ops64.row_sum(o * c)
            out[name] = g.to(p.dtype)
        return js, own, out


class _MapFunction(torch.autograd.Function):
    """``p = m(x)`` on rows ``x`` (2-D) with parameter tensors of shape ``(rows, 1)`` or ``()``."""

    @staticmethod
    def forward(ctx, x, solver, tau, *params):
        p = solver.forward(x, params) if tau is None else solver.at(x, tau, params)
        ctx.solver = solver
        ctx.save_for_backward(p, *params)
        return p

    @staticmethod
    def backward(ctx, grad):
        p, *params = ctx.saved_tensors
        solver = ctx.solver
        ops = ops_for(p.dtype)
        r = solver.routines(params)
        # first order: weight(p) unmasked where weight(0) allows; a graph for double backward masks it
        # (weight' may be infinite at 0)
        jg = derivatives.jvp(ops, r, p, grad, None if torch.is_grad_enabled() else solver.at_zero)
        out = [jg if ctx.needs_input_grad[0] else None, None, None]
        for i, (name, q) in enumerate(zip(solver.names, params)):
            if not ctx.needs_input_grad[3 + i]:
                out.append(None)
                continue
            if p.dtype == torch.float64:
                g = derivatives.param_vjp(ops, r, p, grad, name, ju=jg)
            else:  # d omega'/d alpha cancels near alpha = 1 in float32: in float64, as numeric.Map.vjp_params
                ops64 = ops_for(torch.float64)
                r64 = solver.routines(tuple(v.double() for v in params))
                g = derivatives.param_vjp(ops64, r64, p.double(), grad.double(), name).to(q.dtype)
            out.append(g if q.ndim else g.sum())
        return tuple(out)


#: per dtype, the smallest softmax value with full relative precision (the normal range's bottom over eps)
_NORMAL = {t: torch.finfo(t).tiny / torch.finfo(t).eps for t in (torch.float32, torch.float64)}


class _SoftmaxAppended(torch.autograd.Function):
    """Softmax over the rows ``[x, c]`` without ``c``'s column (``c``: one more score per row, ``(rows, 1)``, a
    set's :attr:`~numeric.constraints.ConstraintSet.appends`), with no copy of the rows: :func:`torch.softmax` of
    ``x`` times ``1 / (1 + e^{c - lse(x)})``, ``lse(x) = x_0 - log p_0`` read at the first column of that softmax
    (rows where ``p_0`` is not a normal number far from underflow, or where ``e^{c - lse}`` overflows, ``c = +inf``
    among them, by the rules: NaN, fully masked).  The backward is softmax's, ``p * (v - p.v)`` (the derived JVP: ``w = p`` and the column's weight make
    ``sum w = 1``), and ``-sum`` of it in ``c`` (a shift of every score and ``c`` leaves ``p`` unchanged)."""

    @staticmethod
    def forward(ctx, x, c, solver):
        p = torch.softmax(x, -1)
        first = p[:, :1]
        e = (c - x[:, :1]).add_(first.log()).exp_()  # e^{c - lse}: the sink's weight over the row's
        # (two reductions check every row at once; NaN fails both comparisons)
        if not (bool(first.min() > _NORMAL[p.dtype]) and bool(e.max() < math.inf)):
            bad = ~((first > _NORMAL[p.dtype]) & (e < math.inf))
        else:
            bad = None
        p.mul_(e.add_(1).reciprocal_())  # (a product: half a division's time on a pass over p)
        if bad is not None:
            rows = bad[:, 0].nonzero()[:, 0]
            p[rows] = rules.closed_with(ops_for(x.dtype), solver.routines(()), x[rows], c[rows])[0]
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # (double backward: torch ops on the saved output)
            dx = p * (grad - (p * grad).sum(-1, keepdim=True))
        else:
            dx = torch._softmax_backward_data(grad, p, -1, p.dtype)
        return dx, -dx.sum(-1, keepdim=True) if ctx.needs_input_grad[1] else None, None


class _AppendedFunction(torch.autograd.Function):
    """A map without parameters over the rows ``[x, c]`` (``c``: one more score per row, ``(rows, 1)``, a set's
    :attr:`~numeric.constraints.ConstraintSet.appends`), solved on the longer rows: ``(p, p_c)``, the first ``n``
    columns and the last.  The backward is the derived JVP on the longer rows against ``[g, g_c]``
    (:func:`~numeric.core.derivatives.centred` with the column as its extra coordinate: no concatenation, and
    gradients laid out as ``x`` and ``c``).  Both columns are outputs, so where the backward is differentiated
    again it reads them."""

    @staticmethod
    def forward(ctx, x, c, solver):
        pe = solver.forward(torch.cat([x, c], dim=-1), ())
        n = x.shape[-1]
        ctx.solver = solver
        ctx.set_materialize_grads(False)  # (the column's p_c is not used: its gradient None)
        p, pc = pe[:, :n], pe[:, n:]
        ctx.save_for_backward(p, pc)
        return p, pc

    @staticmethod
    def backward(ctx, grad, grad_c):
        p, pc = ctx.saved_tensors
        ops, r = ops_for(p.dtype), ctx.solver.routines(())
        # (first order: weight(p) unmasked where weight(0) allows, as _MapFunction's)
        at_zero = None if torch.is_grad_enabled() else ctx.solver.at_zero
        w, wc = derivatives.weights(ops, r, p, at_zero), derivatives.weights(ops, r, pc, at_zero)
        grad = torch.zeros_like(p) if grad is None else grad
        grad_c = torch.zeros_like(pc) if grad_c is None else grad_c
        dx, mean = derivatives.centred(ops, w, grad, (wc, grad_c))
        return dx, wc * (grad_c - mean), None


class _ConstrainedFunction(torch.autograd.Function):
    """``p = m(x)`` over a constraint set on rows ``x`` (2-D), the set's ``count`` arrays laid out as rows, then
    parameter tensors of shape ``(rows, 1)`` or ``()``: ``(p, tau)``, ``tau`` the threshold per row; the backward
    :meth:`numeric.constraints.ConstraintSet.vjp` in the scores and the set's arrays, and the threshold's as the
    derivative of ``sum_i a_i (s_i - omega'(p_i))`` (:func:`numeric.core.derivatives.threshold_weights`; the
    loss's gradients in the set's arrays are functions of ``tau``, so its second derivatives need it)."""

    @staticmethod
    def forward(ctx, x, solver, cset, count, *tensors):
        arrays, params = tensors[:count], tensors[count:]
        p, tau = solver.constrained(cset, x, arrays, params)
        ctx.solver, ctx.cset, ctx.count = solver, cset, count
        # (the scores only where the derivatives need them: a sink's weight, the box's one-sided derivatives)
        ctx.scores = cset.jacobian_scores or cset.needs_scores and any(ctx.needs_input_grad[4:4 + count])
        ctx.save_for_backward(p, *arrays, *((x,) if ctx.scores else ()), *params)
        ctx.set_materialize_grads(False)  # (an output not used gets None: tau's, mostly)
        return p, tau

    @staticmethod
    def backward(ctx, grad, grad_tau):
        p, *rest = ctx.saved_tensors
        arrays, rest = rest[:ctx.count], rest[ctx.count:]
        x = rest.pop(0) if ctx.scores else None
        grad = torch.zeros_like(p) if grad is None else grad
        direct, by_tau = None, [None] * len(rest)
        if grad_tau is not None:
            # tau = sum_i a_i (s_i - omega'(p_i)), a constant: a g in the scores, -a omega''(p) g in p (added to
            # the cotangent before p's backward), -a d omega'(p)/dq g in each parameter
            with torch.enable_grad():
                leaves = [p.detach().requires_grad_(), *(q.detach().requires_grad_() for q in rest)]
                ops, r = ops_for(p.dtype), ctx.solver.routines(tuple(leaves[1:]))
                free, a = derivatives.threshold_weights(ops, r, ctx.cset, p.detach(), *arrays)
                a = a.detach()
                omega = (a * torch.where(free, r.omega_prime(torch.where(free, leaves[0], 1)), 0)).sum(-1, keepdim=True)
                got = torch.autograd.grad(-omega, leaves, grad_tau, allow_unused=True)
            grad = grad + got[0]
            direct = a * grad_tau
            by_tau = list(got[1:])
        js, own, by_name = ctx.solver.constrained_vjp(ctx.cset, p, grad, arrays, rest, torch.is_grad_enabled(), x)
        need = ctx.needs_input_grad
        out = [(js if direct is None else js + direct) if need[0] else None, None, None, None]
        out += [g if need[4 + i] else None for i, g in enumerate(own)]
        for i, (name, q) in enumerate(zip(ctx.solver.names, rest)):
            g = by_name[name] if q.ndim else by_name[name].sum()
            if by_tau[i] is not None:
                g = g + by_tau[i].to(g.dtype)
            out.append(g if need[4 + ctx.count + i] else None)
        return tuple(out)


class _FamilyFunction(torch.autograd.Function):
    """A map family's ``p`` from its inner map's ``r`` on rows (:meth:`numeric.families.base.Family.output`), the
    family's parameters of shape ``(rows, 1)`` or ``()``; the backward in the scores ``x`` is the family's product
    from ``p`` (:meth:`~numeric.families.base.Family.vjp`, differentiable again)."""

    @staticmethod
    def forward(ctx, x, fam, r, *values):
        p = fam.output(ops_for(r.dtype), r, *values)
        p = p.clone() if p is r else p  # (an input returned as the output would not carry this graph to backward)
        ctx.family = fam
        ctx.save_for_backward(p, *values)
        return p

    @staticmethod
    def backward(ctx, grad):
        p, *values = ctx.saved_tensors
        if any(ctx.needs_input_grad[3:]):
            raise RuntimeError(ctx.family.no_gradient)
        jg = ctx.family.vjp(ops_for(p.dtype), p, grad, *(v.detach() for v in values))
        return (jg, None, None, *(None for _ in values))


class TorchMap(FrameworkMap):
    """A regularized-argmax map on torch tensors, from a generated module, with bound parameter values.

    ``mapping``: a built-in name (``"softmax"``, ``"sparsemax"``, ``"entmax15"``,
    ``"entmax"``), the name of an importable generated module, the module itself, a
    map family (:mod:`numeric.families`: ``"normmax"``) or a :class:`TorchMap`.
    ``threshold``: ``"auto"`` (the module's rule), ``"sort"``
    (a sort map's rule on fully sorted rows) or ``"root"`` (the root rule, for any
    map).  ``params``: values of the module's parameters, Python numbers or tensors
    (a tensor that requires grad gets a gradient); those not bound here are given at
    the call (a family's have defaults).

    >>> import torch
    >>> m = TorchMap("entmax", alpha=1.5)
    >>> m(torch.tensor([[-2.0, 0.0, 0.5]]))
    tensor([[0.0000, 0.3260, 0.6740]])
    >>> m(torch.tensor([-2.0, 0.0, 0.5]), alpha=2.0)
    tensor([0.0000, 0.2500, 0.7500])
    """

    arrays = ARRAYS

    def __init__(self, mapping, *, threshold: str = "auto", **params):
        self._bind(mapping, threshold, params)
        # (a rebound TorchMap shares its solver: building one evaluates NumPy, which torch.compile cannot trace)
        same = isinstance(mapping, TorchMap) and mapping.threshold == threshold
        if self.family is not None:  # the inner map, which solves (a built-in's shared, for the same reason)
            self._inner = mapping._inner if same else get_map(self.family.inner, threshold=threshold)
            self._solver, self._cases = self._inner._solver, self._inner._cases
            return
        self._solver = mapping._solver if same else _Solver(self.module, threshold)
        # a family's cases: the solver of the case all values lie in (numeric.family.resolve), built here too
        self._cases = (mapping._cases if same else
                       {m.NAME: _Solver(m, threshold) for m in family.case_modules(self.module)
                        if tuple(m.PARAMETERS) == tuple(self.module.PARAMETERS)}) if family.is_family(self.module) else None

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" if not isinstance(v, torch.Tensor) else f", {k}=<tensor {tuple(v.shape)}>"
                        for k, v in self.params.items())
        return f"TorchMap({self.name!r}, threshold={self.threshold!r}{extra})"

    def _param_rows(self, name, value, x, dim, dtype):
        """A parameter as a tensor of ``dtype``: shape ``()`` for a single value, else ``(rows, 1)`` in the rows' order."""
        if not isinstance(value, torch.Tensor):
            return torch.tensor(value, dtype=dtype, device=x.device)
        if value.device != x.device:
            raise ValueError(f"parameter {name} is on {value.device}, the scores on {x.device}")
        return front.param_rows(torch, name, value.to(dtype), tuple(x.shape), dim, "dim")

    def solver_for(self, values: dict) -> _Solver:
        """The solver for these parameter values: a family's case's where they all lie in one open case."""
        if self._cases is None:
            return self._solver
        # (keyed by name: dynamo compares no modules)
        return self._cases.get(family.resolve(self.module, values, ARRAYS.readable).NAME, self._solver)

    def __call__(self, x, dim: int = -1, **kwargs):
        """``p*(x)`` along ``dim``: same shape, dtype and device as ``x``.

        ``kwargs``: values of the map's parameters, and the keywords of a constraint set other than the simplex
        (:mod:`numeric.constraints`): the box's ``upper`` (a number or a tensor broadcasting to ``x``, ``>= 0``;
        ``None``: no bound) and ``total`` (a number or a tensor with size 1 along ``dim``, ``>= 0``), the map over
        ``0 <= p <= upper``, ``sum p = total`` (:meth:`numeric.Map.__call__`); gradients flow to the set's tensors
        that require them.
        """
        constraints, params = split(kwargs)
        if self.family is not None:
            self.family.check_set(constraints)
            return self._run_family(x, dim, params)
        cset, values = choose_for(self, constraints)
        if cset is not SIMPLEX:
            return self.run_constrained(x, dim, params, cset, values)
        return self.run(x, dim, params)

    def _checked_scores(self, x, dim) -> int:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"scores must be a torch tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"scores must be a floating tensor, got dtype {x.dtype}")
        return check_dim(x, dim)

    def _layout(self, x, dim, params):
        """``(values, dtype, moved, flat, tensors, solver)`` for a call: the parameter values checked, the compute
        dtype, the scores with ``dim`` last and as rows, the parameters as rows, the solver (``None`` for a map
        family, whose inner map solves)."""
        for name, value in params.items():  # (before the domain check, which reads the values)
            if isinstance(value, torch.Tensor) and value.device != x.device:
                raise ValueError(f"parameter {name} is on {value.device}, the scores on {x.device}")
        values = self.values(params)
        dtype = torch.float32 if x.dtype in _HALF else x.dtype
        xc = x.to(dtype)
        moved = xc if dim == x.ndim - 1 else xc.movedim(dim, -1)
        flat = moved.reshape(-1, x.shape[dim])
        tensors = tuple(self._param_rows(n, values[n], x, dim, dtype) for n in self.declared.PARAMETERS)
        return values, dtype, moved, flat, tensors, None if self.family is not None else self.solver_for(values)

    def run_constrained(self, x, dim, params, cset, values: dict, keep_tau=False):
        """``p`` over the constraint set ``cset`` with its keywords' ``values`` (:meth:`__call__`); ``keep_tau``:
        ``(p, tau)``, the threshold of each row with size 1 along ``dim`` (with its gradient)."""
        if self.family is not None:
            self.family.check_set(values)
        dim = self._checked_scores(x, dim)
        for name, b in values.items():
            if isinstance(b, torch.Tensor) and b.device != x.device:
                raise ValueError(f"{name} is on {b.device}, the scores on {x.device}")
        _, dtype, moved, flat, tensors, solver = self._layout(x, dim, params)
        arrays = cset.rows(torch, ARRAYS, x.to(dtype), values, dim, "dim")
        if cset.appends is not None and not keep_tau:  # (a family runs on the simplex alone: there is a solver)
            column = cset.appended(arrays)
            if solver.softmax and not torch.compiler.is_compiling():
                p = _SoftmaxAppended.apply(flat, column, solver)
            elif not tensors:
                p = _AppendedFunction.apply(flat, column, solver)[0]
            else:  # (parameters: autograd through the concatenation, _MapFunction's parameter gradients, the slice)
                ext = torch.cat([flat, column], dim=-1)
                if torch.is_grad_enabled() and any(t.requires_grad for t in (ext, *tensors)):
                    p = _MapFunction.apply(ext, solver, None, *tensors)
                else:
                    p = solver.forward(ext, tensors)
                p = p[..., :flat.shape[-1]]
            p = p.reshape(moved.shape)
            p = p if dim == x.ndim - 1 else p.movedim(-1, dim)
            return p if p.dtype == x.dtype else p.to(x.dtype)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (x, *arrays, *tensors)):
            p, tau = _ConstrainedFunction.apply(flat, solver, cset, len(arrays), *arrays, *tensors)
        else:
            p, tau = solver.constrained(cset, flat, arrays, tensors)
        last = dim == x.ndim - 1
        p = p.reshape(moved.shape)
        p = p if last else p.movedim(-1, dim)
        p = p if p.dtype == x.dtype else p.to(x.dtype)
        if not keep_tau:
            return p
        tau = tau.reshape(moved.shape[:-1] + (1,))
        return p, (tau if last else tau.movedim(-1, dim))

    def run(self, x, dim, params, tau=None, keep_tau=False):
        """``p``, or ``(p, tau)`` with ``keep_tau`` (``tau`` of size 1 along ``dim``, the threshold less the row's
        maximum, or ``None`` where the map cannot use it), or ``p`` from a ``tau`` kept before: one pass instead
        of a solve, the same gradient.  A map family keeps no thresholds: ``(p, None)``, ``tau`` not used."""
        if self.family is not None:
            p = self._run_family(x, dim, params)
            return (p, None) if keep_tau else p
        dim = self._checked_scores(x, dim)
        if self._solver.softmax and not params and tau is None:
            # torch.softmax along dim, its own autograd (its backward p * (v - p.v) is the derived JVP with
            # w = p, sum(w) = 1); a row with a NaN (or +inf) score or fully masked comes out NaN in every
            # entry, so one column tells whether there is one: then the rules below solve the call
            xc = x.to(torch.float32) if x.dtype in _HALF else x
            p = None
            if torch.compiler.is_compiling():
                # traced, so no branch on values: softmax written out as the compiler decomposes it, with
                # fully masked rows (maximum -inf), the only ones where torch.softmax (NaN) and the rules
                # (0) differ, shifted by 0 (exp gives 0) and divided by 1; the maximum is a constant shift
                # (p does not depend on it: no gradient through it)
                m = xc.detach().amax(dim, keepdim=True)
                e = torch.exp(xc - torch.where(m == -math.inf, 0.0, m))
                total = e.sum(dim, keepdim=True)
                p = e / torch.where(total == 0, 1.0, total)
            else:
                p = torch.softmax(xc, dim)
                # one column, or every entry when rows are short and contiguous: the column then reads a cache
                # line per row, most written by the other threads of the softmax (slower than a parallel sum)
                short = p.stride(dim) == 1 and p.shape[dim] < 512
                p = None if math.isnan((p.sum() if short else p.select(dim, 0).sum()).item()) else p
            if p is not None:
                p = p if p.dtype == x.dtype else p.to(x.dtype)
                return (p, None) if keep_tau else p
        values, dtype, moved, flat, tensors, solver = self._layout(x, dim, params)
        last = dim == x.ndim - 1
        if tau is not None:
            tau = (tau if last else tau.movedim(dim, -1)).to(dtype).reshape(-1, 1)
        kept = None
        if torch.is_grad_enabled() and (x.requires_grad or any(t.requires_grad for t in tensors)):
            p = _MapFunction.apply(flat, solver, tau, *tensors)
        elif tau is not None:
            p = solver.at(flat, tau, tensors)
        elif keep_tau:
            p, kept = solver.solve(flat, tensors)
        else:
            p = solver.forward(flat, tensors)
        p = p.reshape(moved.shape)
        p = p if last else p.movedim(-1, dim)
        p = p if p.dtype == x.dtype else p.to(x.dtype)
        if not keep_tau:
            return p
        if kept is not None:
            kept = kept.reshape(moved.shape[:-1] + (1,))
            kept = kept if last else kept.movedim(-1, dim)
        return p, kept

    def _run_family(self, x, dim, params):
        """``p`` of a map family: its inner map at the scaled scores (no graph), then the family's ``p``, with its
        backward in the scores (:class:`_FamilyFunction`)."""
        fam = self.family
        dim = self._checked_scores(x, dim)
        _, _, moved, flat, tensors, _ = self._layout(x, dim, params)
        values = tuple(t.detach() for t in tensors)
        with torch.no_grad():
            r = self._inner.run(flat.detach() * fam.scale(*values), -1, fam.inner_params(*values))
        if torch.is_grad_enabled() and (flat.requires_grad or any(t.requires_grad for t in tensors)):
            p = _FamilyFunction.apply(flat, fam, r, *tensors)
        else:
            p = fam.output(ops_for(r.dtype), r, *values)
        p = p.reshape(moved.shape)
        p = p if dim == x.ndim - 1 else p.movedim(-1, dim)
        return p if p.dtype == x.dtype else p.to(x.dtype)


def get_map(mapping, *, threshold: str = "auto", **params) -> TorchMap:
    """The :class:`TorchMap` for a name, a generated module or a :class:`TorchMap` (rebound with ``params``).

    >>> import torch
    >>> get_map("sparsemax")(torch.tensor([-2.0, 0.0, 0.5]))
    tensor([0.0000, 0.2500, 0.7500])
    """
    if isinstance(mapping, TorchMap) and not params and threshold == "auto":
        return mapping
    if isinstance(mapping, str) and mapping in _BUILTIN and threshold == "auto":
        # the built-in maps are built on import (a map built inside a function torch.compile traces breaks its graph)
        return _BUILTIN[mapping] if not params else TorchMap(_BUILTIN[mapping], **params)
    return TorchMap(mapping, threshold=threshold, **params)


def softmax(x, dim: int = -1, **constraints):
    """Softmax ``p_i = exp(s_i) / sum_j exp(s_j)``: the map of ``p log p``.

    >>> import torch
    >>> softmax(torch.tensor([0.0, math.log(3.0)]))
    tensor([0.2500, 0.7500])
    """
    return _builtin("softmax")(x, dim=dim, **constraints)


def sparsemax(x, dim: int = -1, **constraints):
    """Sparsemax ``p = [s - tau]_+``: the map of ``p**2 / 2``; ``upper``, ``total``: over the box ``0 <= p <=
    upper``, ``sum p = total`` (:meth:`TorchMap.__call__`): ``sparsemax(x, upper=1, total=k)`` is budget sparsemax.

    >>> import torch
    >>> sparsemax(torch.tensor([[1.0, 0.5, -1.0]]), dim=1)
    tensor([[0.7500, 0.2500, 0.0000]])
    """
    return _builtin("sparsemax")(x, dim=dim, **constraints)


def entmax15(x, dim: int = -1, **constraints):
    """1.5-entmax ``p = [s/2 - tau]_+**2``: Tsallis alpha = 3/2.

    >>> import torch
    >>> entmax15(torch.tensor([-2.0, 0.0, 0.5]))
    tensor([0.0000, 0.3260, 0.6740])
    """
    return _builtin("entmax15")(x, dim=dim, **constraints)


def entmax(x, alpha, dim: int = -1, **constraints):
    """alpha-entmax ``p = [(alpha - 1) s - tau]_+**(1/(alpha - 1))`` for any alpha > 0 (sparse above 1, softmax
    at 1, dense below): a number or a tensor broadcasting to ``x`` with size 1 along ``dim`` (learnable; the map
    and its gradient in alpha are continuous through 1).

    >>> import torch
    >>> alpha = torch.tensor([[1.5], [2.0]], requires_grad=True)
    >>> p = entmax(torch.tensor([[-2.0, 0.0, 0.5], [-2.0, 0.0, 0.5]]), alpha)
    >>> p.detach()
    tensor([[0.0000, 0.3260, 0.6740],
            [0.0000, 0.2500, 0.7500]])
    >>> p[:, 2].sum().backward()
    >>> alpha.grad.shape
    torch.Size([2, 1])
    """
    return _builtin("entmax")(x, dim=dim, alpha=alpha, **constraints)


#: the built-in maps, built on import (4 ms): building a map loads and checks its module, which torch.compile
#: cannot trace, so a compiled function calling softmax(...) first would break its graph there
_BUILTIN = {name: TorchMap(name) for name in ("softmax", "sparsemax", "entmax15", "entmax_sparse", "entmax_dense", "entmax")}


def _builtin(name: str) -> TorchMap:
    return _BUILTIN[name]



#: The map families' functions, ``NAME(x, *values, dim=-1)`` (:func:`numeric.families.table.functions`), which
#: ``numeric.torch`` exports beside the named maps above.
FAMILY_FUNCTIONS = functions(get_map, "dim", "numeric.torch")
