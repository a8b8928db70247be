"""The NumPy backend: maps on NumPy arrays, row by row.

Rows are shifted by their maximum (:func:`numeric.rows.row_max`) and solved by
the map's threshold rule: closed (``p`` from one sum, no shift where none is
needed) or sort (the support rule on sorted scores), both in
:mod:`numeric.threshold`, or root (safeguarded Halley, dispatching on the
link's derived form) in :mod:`numeric.root`.  Large inputs are cut into
chunks of rows solved side by side (:func:`_on_two_threads`).  The JVP is
``w*v - w (w.v)/sum(w)`` with ``w = w(p)`` on the support.
"""

from __future__ import annotations

import numpy as np

from .backend import Backend
from .parallel import run_tasks
from .root import root_probabilities
from .rows import row_max
from .threshold import closed_threshold, closed_unshifted, sort_probabilities

__all__ = ["NumpyBackend", "THREADS_FROM", "CHUNKS"]


#: NumPy inputs of at least this many scores are solved in chunks of rows, on several threads where allowed.
THREADS_FROM = 1 << 17
#: Number of chunks of rows (so at most this many threads work on one input).
CHUNKS = 2


def _on_two_threads(solve, rows: int, size: int, chunks: int | None = None) -> None:
    """``solve(lo, hi)`` over the rows ``[0, rows)``: in ``CHUNKS`` chunks from :data:`THREADS_FROM` scores.

    NumPy's ufuncs and einsum release the GIL, so chunks run side by side on the
    threads of :func:`numeric.parallel.run_tasks`: the caller's and pool threads,
    at most one per chunk and :func:`numeric.get_num_threads` in all, and only the
    caller's inside a task that already runs on the pool (attention's heads).
    The chunks depend only on the sizes, not on the thread count, so the rows
    come out the same however many threads take them.  The caller's NumPy error
    state travels with the chunks.
    """
    if size < THREADS_FROM or rows < 2:
        solve(0, rows)
        return
    chunks = min(rows, chunks or CHUNKS)
    bounds = [rows * i // chunks for i in range(chunks + 1)]
    run_tasks(lambda i: solve(bounds[i], bounds[i + 1]), chunks)


class NumpyBackend(Backend):
    """Maps on NumPy arrays (the reference backend: every other one is tested against it)."""

    name = "numpy"

    def owns(self, array) -> bool:
        return isinstance(array, np.ndarray)

    def namespace(self):
        return np

    def shares_memory(self, a, b) -> bool:
        return np.may_share_memory(a, b)

    def forward(self, mapping, x: np.ndarray, *, overwrite: bool = False):
        """``(p, tau)`` for the rows of ``x`` (2-D, C-contiguous); ``overwrite`` lets ``p`` take ``x``'s memory."""
        params = mapping._cast(x.dtype)
        out = x if overwrite else np.empty_like(x)
        tau = np.empty(x.shape[0], dtype=x.dtype)

        def solve(lo, hi):
            self._forward_block(mapping.module, mapping.threshold, x[lo:hi], out[lo:hi], tau[lo:hi], params)

        _on_two_threads(solve, x.shape[0], x.size)
        return out, tau

    def _forward_block(self, module, kind: str, x: np.ndarray, out: np.ndarray, tau: np.ndarray, params: tuple):
        """``p`` of the rows ``x`` into ``out`` (which may be ``x`` itself) and their thresholds into ``tau``."""
        if kind == "closed":
            # no shift where none is needed (see closed_unshifted); the other rows below
            redo = closed_unshifted(module, x, params, out, tau)
            if redo is not None:
                rows, scores = redo
                sub_tau = np.empty(rows.size, dtype=x.dtype)
                self._shifted_rows(module, kind, scores, scores, sub_tau, params)
                out[rows] = scores
                tau[rows] = sub_tau
            return
        self._shifted_rows(module, kind, x, out, tau, params)

    def _shifted_rows(self, module, kind: str, x: np.ndarray, out: np.ndarray, tau: np.ndarray, params: tuple):
        """:meth:`_forward_block` by shifting every row by its maximum; NaN and fully masked rows here."""
        m = row_max(x)  # NaN in a row makes m NaN; a fully masked row has m = -inf
        bad = ~np.isfinite(m)
        if not bad.any():  # the common case: no copies of rows
            tau[...] = self._solve_rows(module, kind, x, m, params, out)
            return
        live = ~bad
        if live.any():
            sub = x[live]  # a copy, used as scratch; written out before out (maybe x) changes
            tau[live] = self._solve_rows(module, kind, sub, m[live], params, sub)
            out[live] = sub
        invalid = np.isnan(m) | (m == np.inf)  # NaN (or +inf) scores: the row is NaN
        out[bad] = 0
        tau[bad] = np.inf
        out[invalid] = np.nan
        tau[invalid] = np.nan

    def _solve_rows(self, module, kind: str, x: np.ndarray, m: np.ndarray, params: tuple, out: np.ndarray) -> np.ndarray:
        """``p`` into ``out`` (which may be ``x``) for rows with a finite maximum ``m``; returns ``tau``.

        The scores are shifted by ``m`` first: ``s - tau = (s - m) - (tau - m)``
        loses nothing to the magnitude of ``m``.
        """
        with np.errstate(over="ignore"):  # a spread beyond the dtype's range is -inf: probability 0
            y = np.subtract(x, m[:, None], out=out)
        if kind == "closed":
            _, t = closed_threshold(module, y, params, shifted=True, out=out)
            return m + t
        if kind == "root":  # p with sum 1 (also where F jumps across 1 at a kink)
            return m + root_probabilities(module, y, params, out)
        return m + sort_probabilities(module, y, params, out)

    def jvp(self, mapping, y: np.ndarray, dx: np.ndarray) -> np.ndarray:
        """``J dx`` along the last axis at ``y = m(x)``: ``w*dx - w (w.dx) / sum(w)``, ``w = w(y)`` on the support."""
        w = mapping._on_support(mapping.module.weight, y, np)
        total = w.sum(axis=-1, keepdims=True)
        dot = (w * dx).sum(axis=-1, keepdims=True)
        mean = np.where(total > 0, dot / np.where(total > 0, total, 1), 0)
        return w * (dx - mean)
