"""Attention planned once: the blocks of query rows, the keys each block may see, and where a block's scores are cut.

A :class:`Plan` is made of the sizes of one attention call and its options, and nothing else (no arrays):

* ``L`` query rows and ``S`` keys, taken ``block`` rows at a time;
* ``causal``: query ``i`` sees the keys ``j <= i + offset`` (``offset`` 0 is SDPA's top-left alignment; context
  parallelism gives each run of rows the position of its first row in the gathered keys);
* ``window``: query ``i`` sees only the ``window`` keys ``i + offset - window < j <= i + offset``, itself and the
  ``window - 1`` before it (a sliding window, which implies ``causal``).

Iterating a plan gives :class:`Block`\\ s: each block's rows ``start:stop`` and the keys ``lo:hi`` that some row
of it may see.  Keys outside ``lo:hi`` are hidden from every row of the block, so an executor computes no
score for them (with ``causal``, blocks above the diagonal are skipped; with ``window``, blocks far below it
too).  Inside ``lo:hi`` the keys a row may not see are cut along two diagonals, which :meth:`Plan.cuts` gives
in the block's own coordinates, so that each executor hides them with its own operation (NumPy's
:meth:`Plan.hide`, torch's ``triu``/``tril``, JAX's comparison of positions).

The executors are :func:`numeric.attention.attention` and :func:`~numeric.attention.attention_backward` (NumPy and
CuPy), :func:`numeric.torch.attention` (its blocked path) and :func:`numeric.torch.distributed.context_parallel_attention`,
and :func:`numeric.jax.attention` (uniform blocks for ``lax.map``: :meth:`Plan.padded`).  How many rows a block
holds is a memory budget of scores, :func:`rows_within`; NumPy's dense calls take :func:`dense_rows`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

__all__ = ["Plan", "Block", "rows_within", "dense_rows", "keyword_shape", "CAUSAL_MIN_BLOCK"]

#: Smallest query block of a causal dense call (smaller blocks cost more in overhead than they skip).
CAUSAL_MIN_BLOCK = 128


def keyword_shape(name: str, shape: tuple, scores: tuple, per_score: bool, layout: str = "(batch, H, L, S)") -> tuple:
    """The shape a constraint keyword's array of ``shape`` takes against attention's ``scores`` (``(..., H, L, S)``
    in the executor's order, which a message calls ``layout``): a keyword of one value per row (not ``per_score``)
    given as a 1-D array holds one value per head, ``(H,)`` read as ``(H, 1, 1)``; the shape must then broadcast to
    the scores without adding dimensions (:class:`ValueError`)."""
    shape, scores = tuple(shape), tuple(scores)
    if not per_score and len(shape) == 1 and len(scores) >= 3:
        shape = (shape[0], 1, 1)
    padded = (1,) * (len(scores) - len(shape)) + shape
    if len(shape) > len(scores) or any(a not in (1, b) for a, b in zip(padded, scores)):
        raise ValueError(f"{name} of shape {shape} must broadcast to the scores' shape {scores} {layout} without adding "
                         f"dimensions" + ("" if per_score else "; a 1-D array holds one value per head"))
    return shape


def rows_within(budget: int, width: int) -> int:
    """Query rows whose scores fit in ``budget`` entries at ``width`` entries per row (the keys times the batch
    elements computed together), at least one."""
    return max(1, budget // max(1, width))


def dense_rows(L: int, causal: bool) -> int:
    """The block of a call small enough for its scores to be computed at once: every row, or, with ``causal``,
    an eighth of them (at least :data:`CAUSAL_MIN_BLOCK`): 8 blocks skip 7/16 of the upper triangle."""
    return max(CAUSAL_MIN_BLOCK, -(-L // 8)) if causal else max(L, 1)


def _count(value, name: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Block:
    """Query rows ``start:stop`` and the keys ``lo:hi`` some row of them may see."""

    start: int
    stop: int
    lo: int
    hi: int

    @property
    def rows(self) -> slice:
        return slice(self.start, self.stop)

    @property
    def keys(self) -> slice:
        return slice(self.lo, self.hi)


class Plan:
    """The blocks of an attention call of ``L`` query rows and ``S`` keys (module docstring).

    >>> [(b.start, b.stop, b.lo, b.hi) for b in Plan(6, 6, 2, causal=True)]
    [(0, 2, 0, 2), (2, 4, 0, 4), (4, 6, 0, 6)]
    >>> [(b.start, b.stop, b.lo, b.hi) for b in Plan(6, 6, 2, window=2)]
    [(0, 2, 0, 2), (2, 4, 1, 4), (4, 6, 3, 6)]
    """

    def __init__(self, L: int, S: int, block: int | None = None, *, causal: bool = False, offset: int = 0,
                 window: int | None = None):
        self.L, self.S = _count(L, "L", 0), _count(S, "S", 0)
        self.block = max(1, self.L) if block is None else _count(block, "block", 1)
        if isinstance(offset, bool) or not isinstance(offset, numbers.Integral):
            raise ValueError(f"offset must be an integer, got {offset!r}")
        self.offset = int(offset)
        self.window = None if window is None else _count(window, "window", 1)
        self.causal = bool(causal) or self.window is not None

    def __repr__(self) -> str:
        extra = "".join(f", {n}={getattr(self, n)!r}" for n in ("causal", "offset", "window") if getattr(self, n))
        return f"Plan({self.L}, {self.S}, {self.block}{extra})"

    def keys(self, i: int) -> tuple:
        """``(lo, hi)``: the keys query row ``i`` may see are ``lo <= j < hi`` (``lo == hi``: none)."""
        hi = min(self.S, max(0, i + self.offset + 1)) if self.causal else self.S
        lo = 0 if self.window is None else min(hi, max(0, i + self.offset - self.window + 1))
        return lo, hi

    def seen(self) -> np.ndarray:
        """The number of keys each query row sees, ``(L,)`` (:meth:`keys` of every row at once).

        >>> Plan(5, 4, window=2).seen().tolist()  # (row 4 sees key 3 alone: there is no key 4)
        [1, 2, 2, 2, 1]
        """
        i = np.arange(self.L, dtype=np.int64) + self.offset
        hi = np.clip(i + 1, 0, self.S) if self.causal else np.full(self.L, self.S, dtype=np.int64)
        lo = np.zeros_like(hi) if self.window is None else np.minimum(hi, np.maximum(0, i - self.window + 1))
        return hi - lo

    def __iter__(self):
        for start in range(0, self.L, self.block):
            stop = min(self.L, start + self.block)
            lo, hi = self.keys(start)[0], self.keys(stop - 1)[1]
            yield Block(start, stop, min(lo, hi), hi)

    def __len__(self) -> int:
        return -(-self.L // self.block)

    def key_blocks(self, block: Block, size: int):
        """The keys of ``block`` in slices of at most ``size`` (an executor's online pass over the keys: blocks of
        keys the block's rows cannot see are never visited)."""
        size = _count(size, "size", 1)
        for lo in range(block.lo, block.hi, size):
            yield slice(lo, min(block.hi, lo + size))

    def cuts(self, block: Block, keys: slice | None = None) -> tuple:
        """``(above, below)`` for the scores of ``block``'s rows against the keys ``keys`` (its own by default),
        in their coordinates (row ``r``, key column ``c``): hidden are the entries with ``c - r > above`` (the
        future: ``causal``) and those with ``c - r <= below`` (before the window); ``None`` where no entry is
        on that side."""
        keys = block.keys if keys is None else keys
        rows, cols = block.stop - block.start, keys.stop - keys.start
        if not self.causal or rows == 0 or cols == 0:
            return None, None
        shift = block.start + self.offset - keys.start  # row r sees the columns c <= r + shift
        above = shift if cols - 1 > shift else None  # (the last column against the first row)
        below = None
        if self.window is not None:
            below = shift - self.window
            if -(rows - 1) > below:  # (the first column against the last row)
                below = None
        return above, below

    def hide(self, xp, a, block: Block, keys: slice | None = None, fill=None):
        """Write ``fill`` (``-inf`` by default) into the entries of the scores ``a`` (``(..., rows, cols)`` of
        ``block`` against ``keys``, an array of the namespace ``xp``: NumPy or CuPy) that :meth:`cuts` hides;
        ``a`` is changed in place and returned."""
        above, below = self.cuts(block, keys)
        if above is None and below is None:
            return a
        rows, cols = a.shape[-2:]
        fill = -xp.inf if fill is None else fill
        r = xp.arange(rows)[:, None]
        if above is not None:  # (only the columns past above can hold the future: c - r > above)
            first = max(0, above + 1)
            xp.copyto(a[..., first:], fill, where=xp.arange(first, cols)[None, :] - r > above)
        if below is not None:  # (only the columns up to below + rows - 1 can be before the window)
            last = max(0, min(cols, below + rows))
            xp.copyto(a[..., :last], fill, where=xp.arange(last)[None, :] - r <= below)
        return a

    def padded(self) -> tuple:
        """``(blocks, pad)``: the number of blocks and the rows to add to ``L`` for blocks of one size."""
        n = len(self)
        return n, n * self.block - self.L
