"""The operations of :mod:`numeric.tensor_rules` on NumPy arrays.

:class:`NumpyRowOps` extends :class:`numeric.newton.NumpyOps` (the elementwise
operations of :func:`numeric.newton.invert_link`) with the row operations of
:class:`numeric.tensor_rules.TensorOps`: reductions along the last axis keeping
it, ``repeat`` a Python loop that stops when no row is still going, ``branch``
a computation made only where some row asks for it, and :meth:`repeat_rows` /
:meth:`on_rows` that compute only the rows concerned (gathered together once
they are at most half of those of the round before).
"""

from __future__ import annotations

import numpy as np

from .newton import NumpyOps
from .tensor_rules import TensorOps

__all__ = ["NumpyRowOps", "ops_for"]


class NumpyRowOps(NumpyOps, TensorOps):
    """:class:`~numeric.tensor_rules.TensorOps` on 2-D NumPy arrays of one floating dtype."""

    def __init__(self, dtype):
        super().__init__(dtype)
        self.tiny = np.finfo(self.dtype).tiny

    def float_(self, b):
        return np.asarray(b, dtype=self.dtype)

    @staticmethod
    def pos_part(x):
        return np.maximum(x, 0)  # -inf to 0, NaN stays NaN

    support = staticmethod(np.sign)  # (on u >= 0)
    clamp_min = staticmethod(np.maximum)
    log = staticmethod(np.log)
    isfinite = staticmethod(np.isfinite)
    isnan = staticmethod(np.isnan)

    @staticmethod
    def row_sum(x):
        return np.sum(x, axis=-1, keepdims=True)

    @staticmethod
    def cat(a, b):
        return np.concatenate((a, b), axis=-1)

    @staticmethod
    def row_max(x):
        return np.max(x, axis=-1, keepdims=True)

    @staticmethod
    def sort_desc(x):
        return -np.sort(-x, axis=-1)

    @staticmethod
    def cumsum(x):
        return np.cumsum(x, axis=-1)

    @staticmethod
    def top(x, k):
        index = np.argpartition(x, x.shape[-1] - k, axis=-1)[..., x.shape[-1] - k:]
        return np.take_along_axis(x, index, axis=-1), index

    @staticmethod
    def put(values, index, like):
        out = np.zeros(like.shape, dtype=values.dtype)
        np.put_along_axis(out, index, values, axis=-1)
        return out

    @staticmethod
    def largest(x):
        return int(np.max(x))

    @staticmethod
    def branch(pred, fn, otherwise):
        return fn() if np.any(pred) else otherwise()

    @staticmethod
    def repeat_rows(n, body, state, going, rows=()):
        # a round runs on the rows still going once they are at most half of those of the round
        # before (gathered together); the others' state is written back then
        state = [np.asarray(s) for s in state]
        done = list(state)
        where = None  # the original index of each row in the rounds, None: all of them in order
        for _ in range(n):
            live = int(np.count_nonzero(going))
            if live == 0:
                break
            count = going.shape[0]
            if 2 * live <= count:
                keep = np.flatnonzero(going)
                done = _put(done, where, state)
                where = keep if where is None else where[keep]
                state, rows, going = _take(state, keep, count), _take(rows, keep, count), going[keep]
            state, going = body(tuple(state), rows)
            state = list(state)
        return tuple(_put(done, where, state))

    @staticmethod
    def on_rows(mask, fn, rows, otherwise):
        keep = np.flatnonzero(mask)
        if keep.size == 0:
            return otherwise
        if keep.size == mask.shape[0]:
            return fn(*rows)
        out = np.array(otherwise, copy=True)
        out[keep] = fn(*_take(rows, keep, mask.shape[0]))
        return out


def _take(values, keep, count):
    """The rows ``keep`` of each array with ``count`` rows; other values (numbers, 0-d arrays) as they are."""
    return [v[keep] if isinstance(v, np.ndarray) and v.ndim and v.shape[0] == count else v for v in values]


def _put(done, where, state):
    """``done`` with the rows ``where`` (all where ``None``) set to ``state``."""
    if where is None:
        return list(state)
    out = []
    for d, s in zip(done, state):
        d = np.array(d, copy=True)
        d[where] = s
        out.append(d)
    return out


_OPS: dict = {}


def ops_for(dtype) -> NumpyRowOps:
    """The (cached) :class:`NumpyRowOps` of a floating dtype."""
    key = np.dtype(dtype)
    ops = _OPS.get(key)
    if ops is None:
        ops = _OPS[key] = NumpyRowOps(key)
    return ops
