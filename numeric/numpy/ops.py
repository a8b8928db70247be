"""The operations of :mod:`numeric.core` on NumPy arrays.

:class:`NumpyRowOps` extends :class:`numeric.newton.NumpyOps` (the elementwise
operations of :func:`numeric.newton.invert_link`) with the row operations of
:class:`numeric.core.ops.TensorOps`: reductions along the last axis keeping
it, ``repeat`` a Python loop that stops when no row is still going, ``branch``
a computation made only where some row asks for it, and the row indexing with
which :class:`numeric.core.ops.CompactRows` computes only the rows concerned.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..core.array_ops import at_place, gather_above, put_along
from ..core.ops import CompactRows, TensorOps
from ..newton import NumpyOps
from .rows import row_max as _row_max
from .rows import row_sum as _row_sum

__all__ = ["NumpyRowOps", "ops_for"]


class NumpyRowOps(CompactRows, NumpyOps, TensorOps):
    """:class:`~numeric.core.ops.TensorOps` on 2-D NumPy arrays of one floating dtype."""

    def __init__(self, dtype):
        super().__init__(dtype)
        self.tiny = np.finfo(self.dtype).tiny
        self._rows = {}  # rows of zeros and ones by (length, dtype, value): a scalar operand takes a slower loop

    def float_(self, b):
        return np.asarray(b, dtype=self.dtype)

    def support(self, u):
        # (on u >= 0) ceil(min(u, 1)): 0 or 1, NaN stays NaN; np.sign takes 15x as long
        return np.ceil(np.minimum(u, self._ones(u)))

    clamp_min = staticmethod(np.maximum)
    at_most = staticmethod(np.fmin)  # (fmin(NaN, v) = v, as where(x < v, x, v))
    below = staticmethod(np.minimum)  # (minimum(a, NaN) = NaN)
    log = staticmethod(np.log)
    isfinite = staticmethod(np.isfinite)
    isnan = staticmethod(np.isnan)

    @staticmethod
    def row_sum(x):
        return _row_sum(x)[:, None]

    def pos_part(self, x):
        return np.maximum(x, self.zeros_row(x))  # (an array of zeros: a scalar 0 takes a loop 3x slower)

    def support_sums(self, y, c, squares, y_max=None, out=None):
        # one temporary (or out, NumPy's own steps' scratch of y's shape), written over: u, then its support's indicator
        u = np.subtract(y, c, out=out)
        np.maximum(u, self.zeros_row(u), out=u)
        total = _row_sum(u)[:, None]
        sq = np.einsum("ij,ij->i", u, u)[:, None] if squares else None
        # the support's indicator in one pass (the rules' rows hold no NaN): ceil(u) where every u is at most
        # y_max - c <= 1, else u > 0 written as 0 and 1 (a comparison cast to floats takes twice as long)
        if y_max is not None and np.minimum.reduce(c, axis=None) >= y_max - 1:
            np.ceil(u, out=u)
        else:
            np.greater(u, 0, out=u, casting="unsafe")
        return _row_sum(u)[:, None], total, sq

    def zeros_row(self, x):
        """Zeros of ``x``'s row length (broadcast against ``x``: ``np.maximum`` with an array of zeros runs 2x to 4x
        faster than with a scalar 0)."""
        return self._row_of(x, 0)

    def _ones(self, x):
        """Ones of ``x``'s row length (broadcast against ``x``)."""
        return self._row_of(x, 1)

    def _row_of(self, x, value):
        n = x.shape[-1] if np.ndim(x) else 1
        key = (n, np.result_type(x), value)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = np.full(n, value, dtype=key[1])
        return row

    @staticmethod
    def cat(a, b):
        return np.concatenate((a, b), axis=-1)

    @staticmethod
    def row_max(x):
        return _row_max(x)[:, None]

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
    def above(x, cut, k):
        return gather_above(np, x, cut, k)

    @staticmethod
    def at_place(x, k):
        return at_place(np, x, k)

    @staticmethod
    def put(values, index, like):
        return put_along(np, values, index, like)

    @staticmethod
    def int_max(x):
        return int(np.max(x))

    @staticmethod
    def branch(pred, fn, otherwise):
        return fn() if pred.any() else otherwise()

    @staticmethod
    def count_rows(mask):
        return int(np.count_nonzero(mask))

    @staticmethod
    def row_index(mask):
        return np.flatnonzero(mask)

    @staticmethod
    def take_rows(a, index):
        return a[index]

    @staticmethod
    def cat_rows(arrays):
        return np.concatenate(arrays, axis=0)

    @staticmethod
    def put_rows(a, index, b):
        out = np.array(a, copy=True)
        out[index] = b
        return out


def ops_for(dtype) -> NumpyRowOps:
    """The (cached) :class:`NumpyRowOps` of a floating dtype."""
    return _ops(np.dtype(dtype))


_ops = lru_cache(maxsize=None)(NumpyRowOps)
