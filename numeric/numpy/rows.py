"""Row operations on 2-D NumPy arrays: the row sums and maxima of :class:`numeric.numpy.ops.NumpyRowOps`.

:func:`row_sum` sums along the last axis with einsum, in the calling thread;
:func:`row_max` takes the maxima of short rows through transposed blocks;
:func:`scalar` casts a value to a NumPy scalar of a given dtype and :func:`select` is ``np.where`` for
large floating arrays (:class:`numeric.newton.NumpyOps`; :func:`where`, the generated routines' ``numpy.where``,
:func:`numeric.contract.module_routines`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["row_sum", "row_max", "scalar", "select", "where", "TRANSPOSED_MAX_UPTO", "TRANSPOSED_MAX_ROWS", "SELECT_FROM"]

#: Rows of at most this many scores take their maximum through a transposed block (see row_max).
TRANSPOSED_MAX_UPTO = 64
#: ... where there are at least this many rows (below it the copy costs more than it saves).
TRANSPOSED_MAX_ROWS = 64

#: :func:`select` picks bits from this many elements on (fewer: ``np.where``).
SELECT_FROM = 4096
#: the unsigned integers of each floating dtype's width
_BITS = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}


def select(cond, a, b):
    """``np.where(cond, a, b)``, bit for bit, for a boolean ``cond`` and floating ``a`` and ``b``.

    ``np.where`` branches on every element: where ``cond`` mixes True and False at
    random it runs at a fifth to a seventh of the speed of an addition (a mispredicted
    branch per element: 0.5 ms on 2**17 float32).  From :data:`SELECT_FROM` elements the
    choice is made on the bits instead, ``b ^ ((a ^ b) & mask)`` with ``mask`` all ones
    where ``cond``, in four branch-free passes whatever the pattern; other inputs go to
    ``np.where``.  The dtype is ``np.where``'s (``np.result_type(a, b)``).
    """
    cond = np.asarray(cond)
    if cond.dtype != np.bool_ or cond.size < SELECT_FROM:
        return np.where(cond, a, b)
    dtype = np.result_type(a, b)
    bits = _BITS.get(dtype)
    if bits is None:
        return np.where(cond, a, b)
    a_bits = np.asarray(a, dtype=dtype).view(bits)
    b_bits = np.asarray(b, dtype=dtype).view(bits)
    mask = cond.astype(bits)
    np.negative(mask, out=mask)  # 1 -> all ones
    out = np.bitwise_and(np.bitwise_xor(a_bits, b_bits), mask)
    out ^= b_bits
    return out.view(dtype)


def where(cond, a, b):
    """``np.where(cond, a, b)``, by :func:`select` where ``cond``, ``a`` and ``b`` are NumPy arrays or numbers
    (``np.where`` for other arrays: CuPy's, through NumPy's dispatch)."""
    if isinstance(cond, np.ndarray) and all(isinstance(v, (np.ndarray, np.generic, float, int)) for v in (a, b)):
        return select(cond, a, b)
    return np.where(cond, a, b)


def scalar(value, dtype):
    """``value`` as a NumPy scalar of ``dtype``."""
    return np.asarray(value, dtype=dtype)[()]


def row_sum(a: np.ndarray) -> np.ndarray:
    """Sums along the last axis of a 2-D array, by ``np.einsum("ij->i", a)``.

    On short rows ``a.sum(axis=-1)`` pays a fixed cost per row, several times
    einsum's contiguous sum-of-products loop, whose cost does not depend on the
    row length.  BLAS's gemv (``a @ ones``) is as fast on an idle machine but
    multi-threaded: when another process holds a core, each call waits for a time
    slice of the busy core.  einsum runs in the calling thread (figures in
    docs/benchmarks.md).  Accuracy: SIMD partial sums, a relative error of about
    ``2 eps`` of the sum of magnitudes on rows of 16384.
    """
    return np.einsum("ij->i", a)


def row_max(a: np.ndarray) -> np.ndarray:
    """Maxima along the last axis of a 2-D array (NaN wherever a row holds a NaN).

    On short rows ``a.max(axis=-1)`` pays a fixed cost per row; transposing
    blocks of 1024 rows into a buffer and reducing over its first axis
    (elementwise maxima of long contiguous vectors) avoids it, at a fraction of
    the time on rows of 64 (512 rows of 16 float32 scores: 6 us against 27).  Longer rows, and fewer than
    :data:`TRANSPOSED_MAX_ROWS` of them, reduce directly.
    """
    rows, n = a.shape
    if n > TRANSPOSED_MAX_UPTO or rows < TRANSPOSED_MAX_ROWS:
        return a.max(axis=-1)
    block = min(rows, 1024)
    out = np.empty(rows, dtype=a.dtype)
    buf = np.empty((n, block), dtype=a.dtype)
    for start in range(0, rows, block):
        stop = min(start + block, rows)
        t = buf[:, : stop - start]
        np.copyto(t, a[start:stop].T)
        np.maximum.reduce(t, axis=0, out=out[start:stop])
    return out
