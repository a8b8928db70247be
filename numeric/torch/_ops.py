"""The operations of :mod:`numeric.tensor_rules` and :func:`numeric.newton.invert_link` on torch tensors.

:class:`TorchOps` implements :class:`numeric.tensor_rules.TensorOps` for one
floating dtype: elementwise functions are torch's, reductions run along the
last axis keeping it, ``repeat`` is a Python loop that stops when no row is
still going (one synchronisation a round) and ``branch`` evaluates its
computation only where some row asks for it.
"""

from __future__ import annotations

import math

import torch

from ..newton import NEWTON_STEPS
from ..tensor_rules import TensorOps

__all__ = ["TorchOps", "ops_for"]


class TorchOps(TensorOps):
    """:class:`~numeric.tensor_rules.TensorOps` on torch tensors of ``dtype``."""

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

    @staticmethod
    def row_sum(x):
        return x.sum(dim=-1, keepdim=True)

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
    def repeat(n, body, state, going):
        for _ in range(n):
            if not bool(going.any()):
                break
            state, going = body(state)
        return state

    @staticmethod
    def branch(pred, fn, otherwise):
        return fn() if bool(pred.any()) else otherwise()


_OPS: dict = {}


def ops_for(dtype: torch.dtype) -> TorchOps:
    """The (cached) :class:`TorchOps` of a floating dtype."""
    ops = _OPS.get(dtype)
    if ops is None:
        ops = _OPS[dtype] = TorchOps(dtype)
    return ops
