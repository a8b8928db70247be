"""The closed and sort thresholds: ``tau`` with ``sum_i g_+(s_i - tau) = 1``, row by row, in NumPy.

The functions take a generated module ``mod`` (see :mod:`numeric._generated`),
a 2-D float array of scores (rows along axis 0) in which every row has at
least one finite score and no NaN (masked scores are ``-inf``), and the
module's parameter values.  ``mod.THRESHOLD`` names the rule; the third,
``"root"``, is in :mod:`numeric.root`.

* ``"closed"``: ``g(s - tau) = A(tau) B(s)``, so ``p_i = B(s_i - m) / sum_j B(s_j - m)``
  with ``m = max(s)`` (no overflow) and ``tau = m + tau_from_sum(S)``; rows whose
  unshifted sum is finite and at least 1 skip the shift (:func:`closed_unshifted`),
  and where the module says ``B`` is ``exp`` itself (``TERM_IS_EXP``, softmax)
  ``exp`` writes straight into the output;
* ``"sort"``: scores sorted in decreasing order, ``tau_k`` from the cumulative
  sums of the shifted scores and their squares, the largest ``k`` with
  ``s_(k) - tau_k > omega'(0+)`` (vectorised over rows); for links of degree 1
  (sparsemax) on rows shorter than 2048, the sort-free fixed point
  ``tau <- tau_k(support at tau)`` instead (:func:`fixed_point_threshold`).
  :func:`sort_probabilities` gives ``p = g_+(s - tau)`` with the clipped link
  of :mod:`numeric.links`.

Row sums and maxima go through :mod:`numeric.rows`.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from .links import clipped_link, power_link
from .rows import row_max, row_sum, scalar

__all__ = [
    "closed_threshold", "closed_unshifted", "sort_threshold", "sort_probabilities", "fixed_point_threshold",
    "PARTIAL_K", "PARTIAL_FROM", "FIXED_POINT_BELOW",
]

#: First number of largest scores the partial-sort threshold tries.
PARTIAL_K = 64
#: Row length from which the sort threshold selects before sorting (see sort_threshold).
PARTIAL_FROM = 32
#: Rows of fewer scores than this use the fixed-point threshold for links of degree 1 (see sort_threshold).
FIXED_POINT_BELOW = 2048


def closed_unshifted(mod: ModuleType, x: np.ndarray, params: tuple, out: np.ndarray, tau: np.ndarray):
    """``p_i = B(s_i) / sum_j B(s_j)`` into ``out`` and ``tau`` into ``tau``, with no shift, where that is exact.

    For a closed threshold ``B`` is an exponential, ``b e^{c s}``.  Unshifted, a row
    is as accurate as shifted by its maximum (more: ``s - m`` rounds, ``s`` does not)
    when ``S = sum_j B(s_j)`` is finite and ``S >= 1``: then ``p_i <= B(s_i)``, so where
    ``B(s_i)`` leaves the normal range ``p_i`` is below it too.  That saves the row
    maximum and the shift (two passes of three).  Returns ``None`` when every row
    qualifies, else ``(rows, their scores)``, copied before ``out`` (which may be ``x``)
    is written: those rows (NaN, fully masked, overflowing, or all scores far below
    0) are for the shifted solver.  Where the module's ``TERM_IS_EXP`` says ``B`` is
    ``exp`` itself (softmax) and ``out`` is not ``x``, ``exp`` writes into ``out``
    directly.
    """
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        if mod.TERM_IS_EXP and not np.may_share_memory(out, x):  # softmax: exp into out, no temporary
            b = np.exp(x, out=out)
        else:
            b = np.asarray(mod.term(x, *params), dtype=x.dtype)
    total = row_sum(b)
    ok = (total >= 1) & (total < np.inf)  # False for NaN
    redo = None
    if not ok.all():
        rows = np.flatnonzero(~ok)
        redo = rows, x[rows]
        total = np.where(ok, total, 1)
    np.multiply(b, (1 / total)[:, None], out=out)
    tau[...] = mod.tau_from_sum(total, *params)
    return redo


def closed_threshold(mod: ModuleType, x: np.ndarray, params: tuple, *, shifted: bool = False,
                     out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(p, tau)`` for a closed threshold: ``p_i = B(s_i - m) / sum_j B(s_j - m)``.

    ``shifted=True`` says every row's maximum is already 0 (skips a reduction);
    ``p`` goes into ``out`` if given (which may be ``x``).
    """
    m = np.zeros(x.shape[0], dtype=x.dtype) if shifted else x.max(axis=-1)
    y = x - m[:, None] if not shifted else x
    # g(s - tau) = A(tau) B(s) makes B exponential, B(-inf) = 0: masked scores need no care
    with np.errstate(under="ignore"):
        b = np.asarray(mod.term(y, *params), dtype=x.dtype)
    total = row_sum(b)
    b = np.multiply(b, (1 / total)[:, None], out=b if out is None else out)
    return b, m + mod.tau_from_sum(total, *params)


def _sort_rule(mod, y: np.ndarray, params: tuple) -> tuple[np.ndarray, np.ndarray]:
    """``(tau - m, support size)`` from scores ``y = s - m`` sorted in decreasing order."""
    n = y.shape[-1]
    # tau >= m - omega'(1), so a score with s - m <= omega'(0+) - omega'(1) is never in the
    # support: leave it out of the sums (this also keeps far-away scores from overflowing y*y)
    reach = mod.clip(*params) - mod.omega_prime(np.ones((), y.dtype), *params)
    finite = y > reach
    y0 = np.maximum(y, reach) * finite  # y where it can count, 0 elsewhere (-inf included)
    # np.cumsum is sequential, so prefix sums do not depend on the row length: the partial
    # and the full rule agree bit for bit
    s1 = np.cumsum(y0, axis=-1)
    s2 = np.cumsum(y0 * y0, axis=-1)
    k = np.broadcast_to(np.arange(1, n + 1, dtype=y.dtype), y.shape)
    ok = finite
    if mod.discriminant is not None:
        ok = ok & (mod.discriminant(k, s1, s2, *params) >= 0)
    # (1, 0, 0) is the always-feasible support of the largest score alone
    cand = mod.tau_candidate(k * ok + ~ok, s1 * ok, s2 * ok, *params)
    good = ok & (y - cand > mod.clip(*params))
    good[:, 0] = True
    last = n - 1 - np.argmax(good[:, ::-1], axis=-1)
    return np.take_along_axis(cand, last[:, None], axis=-1)[:, 0], last + 1


def sort_threshold(mod: ModuleType, x: np.ndarray, params: tuple, *, method: str = "auto", shifted: bool = False) -> np.ndarray:
    """``tau`` by the support rule on sorted scores (links of degree 1 or 2 in ``tau``).

    ``method="fixed"`` (links of degree 1 only) iterates :func:`fixed_point_threshold`
    without sorting.  ``method="full"`` sorts whole rows (O(n log n)).  ``method="partial"`` selects
    the ``K`` largest scores with :func:`numpy.partition` (O(n)), sorts only those
    and applies the rule; the support being a prefix of the sorted scores, the
    answer is exact whenever the support ends before ``K``; rows where it does
    not are retried with ``4 K``, then fully.  ``"auto"`` picks ``"partial"`` for
    rows of at least :data:`PARTIAL_FROM` scores, first trying ``K = min(PARTIAL_K, n // 4)``,
    and ``"fixed"`` for links of degree 1 on rows shorter than :data:`FIXED_POINT_BELOW`
    (measured in benchmarks/bench_thresholds.py).
    """
    n = x.shape[-1]
    pw = power_link(mod, params)
    linear = pw is not None and pw.k == 1
    if method == "auto":
        method = "fixed" if linear and n < FIXED_POINT_BELOW else "partial" if n >= PARTIAL_FROM else "full"
    m = np.zeros(x.shape[0], dtype=x.dtype) if shifted else row_max(x)
    if method == "fixed":
        if not linear:
            raise ValueError(f"method 'fixed' needs a link of degree 1 in tau (LINK_FORM 'power' with exponent 1); "
                             f"map {mod.NAME!r} has {'exponent ' + format(pw.k, 'g') if pw else 'LINK_FORM ' + repr(mod.LINK_FORM)}")
        return m + fixed_point_threshold(mod, x if shifted else x - m[:, None], params)
    first = min(PARTIAL_K, max(8, n // 4))
    if method == "full" or n <= first:
        tau, _ = _sort_rule(mod, -np.sort(-x, axis=-1) - m[:, None], params)
        return m + tau
    if method != "partial":
        raise ValueError(f"method must be 'auto', 'fixed', 'full' or 'partial', got {method!r}")
    tau = np.empty(x.shape[0], dtype=x.dtype)
    rows = np.arange(x.shape[0])
    size = first
    while rows.size:
        if size >= n:
            t, _ = _sort_rule(mod, -np.sort(-x[rows], axis=-1) - m[rows, None], params)
            tau[rows] = t
            break
        top = -np.partition(-x[rows], size - 1, axis=-1)[:, :size]
        t, support = _sort_rule(mod, -np.sort(-top, axis=-1) - m[rows, None], params)
        exact = support < size
        tau[rows[exact]] = t[exact]
        rows = rows[~exact]
        size *= 4
    return m + tau


def sort_probabilities(mod: ModuleType, y: np.ndarray, params: tuple, out: np.ndarray) -> np.ndarray:
    """``p = g_+(y - t)`` into ``out`` (which may be ``y``) for rows ``y = s - max(s)``; returns ``t = tau - max(s)``.

    ``t`` is :func:`sort_threshold`'s; the link is :func:`numeric.links.clipped_link`.
    """
    t = sort_threshold(mod, y, params, shifted=True)
    z = np.subtract(y, t[:, None], out=out)
    p = clipped_link(mod, z, params, overwrite=True)
    if p is not out:
        np.copyto(out, p)
    return t


def fixed_point_threshold(mod: ModuleType, y: np.ndarray, params: tuple, *, return_iterations: bool = False):
    """``tau - m`` for a link of degree 1 (sparsemax) by the fixed point ``tau <- tau_k(support at tau)``.

    ``y = s - m`` are scores shifted by their row maximum (``-inf`` masked).  For a
    link affine in ``tau``, ``F(tau) = sum_i g_+(y_i - tau)`` is piecewise linear and
    convex; the candidate ``tau_S`` of a support ``S`` (``sum_{i in S} g(y_i - tau) = 1``,
    the generated ``tau_candidate``) is a lower bound of ``tau*`` whenever ``S``
    contains the true support.  From a lower bound, the iteration
    ``S = {i: y_i - tau > omega'(0+)}``, ``tau <- tau_S`` is Newton's method on the
    convex ``F`` (Michelot, 1986): ``tau`` increases, ``S`` shrinks, and ``tau`` is
    exact once ``S`` stops changing (at most ``n + 1`` steps; 3 to 6 on random rows).
    It needs no sort: two row sums per step (see :func:`row_sum`), and rows
    drop out as they converge.  With ``return_iterations=True`` also returns the
    number of steps each row took.
    """
    dtype = y.dtype
    rows, n = y.shape
    clip = scalar(mod.clip(*params), dtype)
    reach = scalar(mod.omega_prime(np.ones((), dtype), *params), dtype)  # omega'(1)
    with np.errstate(invalid="ignore", over="ignore"):
        full = mod.tau_candidate(np.asarray(n, dtype), row_sum(y), np.zeros((), dtype), *params)
    # start: the full-row candidate (a lower bound; NaN/-inf sums drop out) or the middle of
    # [-omega'(1), -omega'(0+)], whichever is larger.  From any start below -omega'(0+) (the
    # support holds the maximum) the first step is a Newton step on the convex F, whose
    # tangent lies below F: it lands on a lower bound, and the steps after it only go up.
    tau = np.fmax(np.asarray(full, dtype=dtype), -(reach + clip) / 2)
    # z = y - tau - clip lies in [0, omega'(1) - omega'(0+)] on the support: where that span
    # is at most 1, ceil(z) is the support's indicator (one pass, no boolean temporary)
    count_by_ceil = reach - clip <= 1
    size = np.full(rows, n + 1, dtype=dtype)  # support size at the previous step
    iterations = np.zeros(rows, dtype=np.int64)
    held = np.arange(rows)  # rows of y held in ya, in order
    moving = np.ones(rows, dtype=bool)  # which of them have not converged
    ya = y
    zbuf = np.empty(y.size, dtype=dtype)
    zeros = np.zeros(n, dtype=dtype)  # np.maximum with an array runs 2x to 4x faster than with a scalar 0
    for it in range(1, n + 3):
        r = held.size
        t = tau[held]
        z = zbuf[: r * n].reshape(r, n)
        np.subtract(ya, (t + clip)[:, None], out=z)
        np.maximum(z, zeros, out=z)
        total = row_sum(z)
        if count_by_ceil:
            np.ceil(z, out=z)
        else:
            np.greater(z, 0, out=z)
        k = row_sum(z)
        s1 = total + k * (t + clip)  # sum of y over the support
        new = np.asarray(mod.tau_candidate(k, s1, 0 * s1, *params), dtype=dtype)
        # tau never decreases after the first step (rounding): S only shrinks, so this ends;
        # -omega'(1) is a lower bound too, and keeps z <= omega'(1) - omega'(0+) for the ceil count
        new = np.maximum(new, t if it > 1 else -reach)
        upd = held[moving]
        tau[upd] = new[moving]
        iterations[upd] = it
        done = k == size[held]  # same support as the step before: tau is its candidate
        size[upd] = k[moving]
        moving &= ~done
        count = int(moving.sum())
        if count == 0:
            break
        if 2 * count < r:  # carry on with the rows still moving, copied together
            keep = np.flatnonzero(moving)  # np.take along axis 0: 3x faster than a boolean index
            ya = np.take(ya, keep, axis=0)
            held = held[keep]
            moving = np.ones(count, dtype=bool)
    return (tau, iterations) if return_iterations else tau
