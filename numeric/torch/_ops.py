"""The operations of :mod:`numeric.core` and :func:`numeric.newton.invert_link` on torch tensors.

:class:`TorchOps` implements :class:`numeric.core.ops.TensorOps` for one
floating dtype: elementwise functions are torch's, reductions run along the
last axis keeping it, ``repeat`` is a Python loop that stops when no row is
still going (one synchronisation a round) and ``branch`` evaluates its
computation only where some row asks for it.

Under :func:`torch.compile` (``torch.compiler.is_compiling()``) no value may
reach Python (a branch on one is a graph break, or an error with
``fullgraph=True``), so the operations that decide on values take traced
forms, as JAX's do: ``repeat`` is torch's ``while_loop`` higher-order
operator (the same rounds, stopping when no row is still going or after its
budget), ``branch`` is :func:`torch.cond` on whether any row asks for the
computation, and ``repeat_rows`` and ``on_rows`` run every row (the defaults
of :class:`~numeric.core.ops.TensorOps`, whose rounds leave a row that
stopped as it is) instead of gathering the rows concerned, whose number is a
value.  The rounds and the branches taken are the eager ones, so the results
are the same.  ``rare_rows`` (a solve's fallback, which rows seldom need) is
the exception: its rows run eagerly, outside the graph, in an operator opaque
to the compiler (``regattn::rows_outside_graph``), so that the graph and its
compile hold none of the fallback's operations (``p**2/2 + p*log(1 + p)`` on
512 x 1024 float32 scores, forward and backward, cold: 80.8 -> 50.9 s, its
calls 8.5 -> 7.3 ms).
"""

from __future__ import annotations

import math
import sys

import torch
from torch._higher_order_ops import while_loop

from ..newton import NEWTON_STEPS
from ..core.ops import CompactRows, TensorOps

__all__ = ["TorchOps", "ops_for"]


class TorchOps(CompactRows, TensorOps):
    """:class:`~numeric.core.ops.TensorOps` on torch tensors of ``dtype``."""

    def __init__(self, dtype: torch.dtype):
        info = torch.finfo(dtype)
        self.dtype = dtype
        self.eps = info.eps
        self.tiny = info.tiny
        self.log_tiny = math.log(info.tiny)
        self.newton_steps = NEWTON_STEPS

    @staticmethod
    def full(like, value):
        if isinstance(value, bool):
            return torch.full(like.shape, value, dtype=torch.bool, device=like.device)
        return torch.full_like(like, value)

    def float_(self, b):
        return b.to(self.dtype)

    pos_part = staticmethod(torch.relu)
    support = staticmethod(torch.sign)  # (on u >= 0; torch.sign runs several times faster than a comparison and a cast)
    clamp_min = staticmethod(torch.clamp_min)
    exp = staticmethod(torch.exp)
    log = staticmethod(torch.log)
    isfinite = staticmethod(torch.isfinite)
    isnan = staticmethod(torch.isnan)
    not_ = staticmethod(torch.logical_not)

    @staticmethod
    def where(cond, a, b):
        return torch.where(cond, a, b)

    below = staticmethod(torch.minimum)  # (minimum(a, NaN) = NaN)

    def at_most(self, x, v):
        if torch.compiler.is_compiling():
            # (traced: TensorOps' comparison and where fuse into the kernel around them; inductor's CPU kernels
            # test nan_to_num's NaN one score at a time)
            return super().at_most(x, v)
        # (clamp keeps NaN, which where(x < v, x, v) sends to v; on the CPU a comparison and where take 5 times as long)
        return torch.clamp(x, max=v).nan_to_num_(nan=v, posinf=v, neginf=-math.inf)

    @staticmethod
    def row_sum(x):
        return x.sum(dim=-1, keepdim=True)

    @staticmethod
    def cat(a, b):
        return torch.cat((a, b), dim=-1)

    @staticmethod
    def row_max(x):
        return x.amax(dim=-1, keepdim=True)

    @staticmethod
    def sort_desc(x):
        return torch.sort(x, dim=-1, descending=True).values

    @staticmethod
    def cumsum(x):
        return torch.cumsum(x, dim=-1)

    @staticmethod
    def top(x, k):
        return torch.topk(x, k, dim=-1, sorted=False)

    @property
    def cut_up_to(self):
        # under torch.compile, where the counts and the gather fuse into passes over the scores: torch.topk takes
        # 0.35 ms on 512 x 64 float32 scores, two thirds of a compiled entmax15 (on rows of 1024, where the cut
        # leaves more than 16 scores on some rows, the k largest)
        return 256 if torch.compiler.is_compiling() else 0

    @staticmethod
    def above(x, cut, k):
        # (the mask in float32, its counts exact to 2**24: inductor's CPU kernels store and load a boolean tensor
        # one entry at a time)
        mark = (x > cut).to(torch.float32)
        # (the slot by arithmetic on the float mask: a where on it kept x > cut as a boolean tensor too)
        slot = ((torch.cumsum(mark, dim=-1) - 1 - k) * mark + k).clamp_(max=k).long()
        rows, n = x.shape[:-1], x.shape[-1]
        values = torch.full((*rows, k + 1), -math.inf, dtype=x.dtype, device=x.device).scatter_(-1, slot, x)
        columns = torch.arange(n, device=x.device).expand_as(slot)
        index = torch.full((*rows, k + 1), n, dtype=torch.int64, device=x.device).scatter_(-1, slot, columns)
        return values[..., :k], index[..., :k]

    @staticmethod
    def at_place(x, k):
        return torch.gather(x, -1, k.long() - 1)

    @staticmethod
    def put(values, index, like):
        n = like.shape[-1]
        out = torch.zeros((*like.shape[:-1], n + 1), dtype=values.dtype, device=values.device)
        return out.scatter_(-1, index, values)[..., :n]

    @staticmethod
    def int_max(x):
        return None if torch.compiler.is_compiling() else int(x.max())  # (traced: no value reaches Python)

    @property
    def wide_top(self):
        # (traced, the rows of 1024 needing more than 16 candidates took a second topk: gini_log1p's compiled forward
        # on 512 x 1024 float32 scores 14.7 ms, 9.3 ms from 64 candidates)
        return torch.compiler.is_compiling()

    @staticmethod
    def number(x):
        # a map's single value (alpha=3.0: a 0-d tensor) read in eager torch on the CPU, so that the rule chooses by
        # it as NumPy's does (alpha-entmax above 2: the screen and the root's piece, where a per-row k took Halley
        # on whole rows, 512 x 1024 float32 forward+backward 4.5x -> 0.95x torch's entmax15)
        if isinstance(x, torch.Tensor) and x.ndim == 0 and x.device.type == "cpu" and not torch.compiler.is_compiling():
            return float(x)
        return x

    @staticmethod
    def repeat(n, body, state, going):
        if torch.compiler.is_compiling():
            if n <= UNROLLED:  # (exact: a traced body already leaves the rows that stopped as they are)
                for _ in range(n):
                    state, _ = body(state)
                return state
            return _traced_repeat(n, body, state, going)
        for _ in range(n):
            if not _any(going):
                break
            state, going = body(state)
        return state

    def rare(self, pred, fn, otherwise):
        if torch.compiler.is_compiling():
            return fn()  # (the compiled kernels fuse the masking; a torch.cond would split them)
        return self.branch(pred, fn, otherwise)

    @staticmethod
    def branch(pred, fn, otherwise):
        if torch.compiler.is_compiling():
            # (copies: a branch's outputs may not alias tensors from outside it, as otherwise's often are)
            return torch.cond(pred.any(), lambda: _copies(fn()), lambda: _copies(otherwise()))
        return fn() if _any(pred) else otherwise()

    @staticmethod
    def pos_diff(y, c):
        return torch.sub(y, c).relu_()  # (one new tensor instead of two)

    @staticmethod
    def support_sums(y, c, squares, y_max=None):
        u = torch.sub(y, c).relu_()  # in place after the one new tensor (allocating costs as much as a pass)
        total = u.sum(dim=-1, keepdim=True)
        total2 = torch.linalg.vecdot(u, u).unsqueeze(-1) if squares else None
        return u.sign_().sum(dim=-1, keepdim=True), total, total2

    @staticmethod
    def power_sums(b, c, km1, floor):
        # three new tensors instead of seven: u, safe (then p / safe in place) and p
        u = torch.sub(b, c).relu_()
        safe = torch.clamp_min(u, floor)
        p = safe.log().mul_(km1).exp_().mul_(u)
        return p, p.sum(dim=-1, keepdim=True), torch.div(p, safe, out=safe).sum(dim=-1, keepdim=True)

    def repeat_rows(self, n, body, state, going, rows=(), tail=False):
        # Compiled: every row, every round (no value reaches Python).  Gathering the last rows going (JAX's tail)
        # made compiled rows of 64 slower: a round of while_loop costs its launches and its test more than its
        # rows (cosh_one 1.09 -> 1.13 ms, gini_cubic 0.82 -> 0.94 ms forward+backward on 512 x 64).
        if torch.compiler.is_compiling():
            return TensorOps.repeat_rows(self, n, body, state, going, rows)
        return CompactRows.repeat_rows(self, n, body, state, going, rows)

    def on_rows(self, mask, fn, rows, otherwise):
        if torch.compiler.is_compiling():
            return TensorOps.on_rows(self, mask, fn, rows, otherwise)
        return CompactRows.on_rows(self, mask, fn, rows, otherwise)

    def rare_rows(self, mask, fn, r, rows, otherwise):
        # (compiled: the rows run eagerly, outside the graph, in regattn::rows_outside_graph (numeric.torch.maps);
        # a module that cannot be found again by its name, one made in memory, stays in the graph)
        names = _outside_names(fn, r.module) if torch.compiler.is_compiling() else None
        if names is None:
            return TensorOps.rare_rows(self, mask, fn, r, rows, otherwise)
        tensors = [a if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=torch.float64) for a in rows]
        return torch.ops.regattn.rows_outside_graph(*names, mask, tensors, otherwise)

    def in_blocks(self, size, fn, rows):
        if torch.compiler.is_compiling():
            return TensorOps.in_blocks(self, size, fn, rows)
        return CompactRows.in_blocks(self, size, fn, rows)

    @staticmethod
    def count_rows(mask):
        return int(mask.sum())

    @staticmethod
    def row_index(mask):
        return mask.reshape(-1).nonzero().squeeze(1)

    @staticmethod
    def take_rows(a, index):
        return a[index] if isinstance(index, slice) else a.index_select(0, index)

    @staticmethod
    def cat_rows(tensors):
        return torch.cat(tensors, dim=0)

    @staticmethod
    def put_rows(a, index, b):
        return a.index_copy(0, index, b.to(a.dtype))


#: Under ``torch.compile``, a loop of at most this many rounds is traced round after round, not as a ``while_loop``
#: (a threshold's start, Michelot's fixed point: 2, 4 or 6 rounds): its rounds fuse into the kernels around them,
#: where each round of a ``while_loop`` costs its launches and a test read back (compiled forward on 512 x 64 float32
#: scores: ``p**2/2 + p*log(1 + p)`` 1.02-1.13 -> 0.88-0.92 ms, ``p**2/2 + p**4/4`` 1.16-1.20 -> 1.08-1.14 ms).
UNROLLED = 6


def _any(mask) -> bool:
    """``bool(mask.any())`` for a boolean tensor, read as bytes: on the CPU torch's ``any`` takes ten times as
    long as the bytes' maximum (32 us against 2.6 us on 64 Ki entries)."""
    return mask.numel() > 0 and bool(mask.view(torch.uint8).max())


def _copies(values):
    """A copy of each tensor in a tuple (or of the tensor)."""
    if isinstance(values, tuple):
        return tuple(v.clone() for v in values)
    return values.clone()


def _traced_repeat(n, body, state, going):
    """:meth:`TorchOps.repeat` as torch's ``while_loop``: at most ``n`` rounds, while some entry of ``going`` is true.

    The loop carries the round's count, ``going`` and ``state``, each with the type and shape
    it came in with (a round's value broadcast and cast to it; an output the body passes
    through unchanged, or gives twice, is copied: the loop's outputs may not alias its inputs or each other).
    """
    state = tuple(state)
    count = len(state)

    def fit(new, old, inputs):
        new = torch.as_tensor(new, dtype=old.dtype, device=old.device)
        if new.shape != old.shape:
            return new.expand(old.shape).clone()
        return new.clone() if any(new is a for a in inputs) else new

    def cond(i, going, *state):
        return (i < n) & going.any()

    def step(i, going, *state):
        new, now = body(state)
        out = [i + 1]
        for a, b in zip((now, *new), (going, *state)):
            out.append(fit(a, b, (going, *state, *out)))
        return tuple(out)

    start = torch.zeros((), dtype=torch.int64, device=going.device)
    out = while_loop(cond, step, (start, going.clone(), *(s.clone() for s in state)))
    return tuple(out[2:2 + count])


#: the modules ``regattn::rows_outside_graph`` runs rows of, by name (kept from the trace that named them: a compiled
#: graph may outlive the module's entry in ``sys.modules``)
OUTSIDE_MODULES = {}


@torch._dynamo.assume_constant_result
def _outside_names(fn, module):
    """``("package.module:function", module name)`` for ``regattn::rows_outside_graph``, or ``None`` where ``module``
    cannot be found again by its name (one made in memory: its rows stay in the graph).  Run as Python while
    ``torch.compile`` traces (its result a constant of the graph), which keeps ``module`` for the compiled calls.
    (The operator is :func:`numeric.torch.maps._rows_outside_graph`, beside the routine table it binds.)"""
    name = module.__name__
    if sys.modules.get(name) is not module or OUTSIDE_MODULES.setdefault(name, module) is not module:
        return None
    return f"{fn.__module__}:{fn.__qualname__}", name


_OPS = {dtype: TorchOps(dtype) for dtype in (torch.float32, torch.float64)}


def ops_for(dtype: torch.dtype) -> TorchOps:
    """The :class:`TorchOps` of a floating dtype."""
    ops = _OPS.get(dtype)
    return TorchOps(dtype) if ops is None else ops
