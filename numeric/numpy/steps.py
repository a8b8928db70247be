"""NumPy's own forms of whole steps of :mod:`numeric.core.rules`: the same thresholds in fewer passes over memory.

NumPy runs each operation as it comes, so what a step costs there is its passes over the scores, the
temporaries it makes and its Python calls.  The steps here replace whole steps of the shared rules on
NumPy (never a single operation of :class:`~numeric.core.ops.TensorOps`), and are tested against them:

* :func:`solve`: :func:`numeric.core.rules.solve` for the NumPy backend.  A closed map's rows are solved
  unshifted where that is exact (:func:`closed_unshifted`); other rows are shifted into the output (no
  temporary of the scores' size), a sort map's take NumPy's threshold (:func:`sort_threshold`) and their
  link in place, the others the shared rules; rows whose maximum is not finite take the shared text.
* :func:`sort_threshold`: a link of degree 1 on rows shorter than :data:`SUPPORT_BELOW` takes
  :func:`support_rounds` (the shared :func:`~numeric.core.rules.support_rule`'s rounds over one scratch
  buffer); rows shorter than :data:`PARTIAL_FROM` the shared :func:`~numeric.core.rules.sort_rule`; longer
  ones the sort rule on their largest scores (:func:`largest_threshold`, :func:`numpy.partition`).

The thresholds agree with the shared text's bit for bit (``tests/numeric/test_numpy_steps.py``).
"""

from __future__ import annotations

import numpy as np

from ..core import rules
from ..core.halley import reach_one
from ..core.ops import Routines

__all__ = ["solve", "closed_unshifted", "link_into", "sort_threshold", "support_rounds", "largest_threshold",
           "PARTIAL_FROM", "SUPPORT_BELOW"]

#: Rows from which a sort map's threshold comes from each row's largest scores, selected and sorted
#: (:func:`largest_threshold`; measured in ``benchmarks/bench_thresholds.py``).
PARTIAL_FROM = 32
#: Rows shorter than this of a link of degree 1 take :func:`support_rounds` (no sort, no selection).
SUPPORT_BELOW = 2048


def solve(ops, r: Routines, x, *, method: str = "auto", relative: bool = False, out=None):
    """:func:`numeric.core.rules.solve` on NumPy: ``(p, tau)`` for the rows of ``x``, ``p`` written into ``out``
    where given (``out`` may be ``x``) and returned either way."""
    kind = r.module.THRESHOLD if method == "auto" else method
    if kind == "closed" and not relative:
        return closed_unshifted(ops, r, x, out)
    return _shifted_solve(ops, r, x, method, kind, relative, out)


def _shared_rows(ops, r, x, index, **options):
    """The shared :func:`~numeric.core.rules.solve` of the rows ``index`` of ``x``."""
    return rules.solve(ops, r.bound(ops.take_all(r.params, index, x.shape[0])), x[index], **options)


def closed_unshifted(ops, r: Routines, x, out=None, extra=None):
    """``(p, tau)`` of a closed map with no shift where none is needed: ``p_i = B(s_i) / S``, ``S = sum_j B(s_j)``;
    ``extra``: one more score per row (``(rows, 1)``, a sink's) whose term joins ``S``
    (:func:`numeric.core.rules.closed_with`).

    For a closed threshold ``B`` is an exponential, ``b e^{c s}``.  Unshifted, a row is as accurate
    as shifted by its maximum (more: ``s - m`` rounds, ``s`` does not) when ``S`` is finite and
    ``S >= 1``: then ``p_i <= B(s_i)``, so where ``B(s_i)`` leaves the normal range ``p_i`` is below
    it too.  That saves the row maximum and the shift (two passes of three); a map whose term is
    ``exp`` writes it straight into ``out``, and ``p`` is ``b`` times the reciprocal of the sum (a
    division per row).  The other rows (NaN, fully masked, overflowing, or all scores far below 0)
    take the shared text, shifted.
    """
    if getattr(r.module, "TERM_IS_EXP", False):
        b = np.exp(x) if out is None or np.may_share_memory(out, x) else np.exp(x, out=out)
    else:
        b = r.term(x)
    total = ops.row_sum(b) if extra is None else ops.row_sum(b) + r.term(extra)
    ok = (total >= 1) & (total < np.inf)  # False for NaN
    if ok.all():
        return np.multiply(b, 1 / total, out=b if out is None else out), r.tau_from_sum(total)
    redo = np.flatnonzero(~ok[:, 0])
    if extra is None:
        p_redo, t_redo = _shared_rows(ops, r, x, redo, method="closed")  # (reads x before out is written)
    else:
        p_redo, t_redo = rules.closed_with(ops, r.bound(ops.take_all(r.params, redo, x.shape[0])), x[redo], extra[redo])
    safe = np.where(ok, total, 1)
    p = np.multiply(b, 1 / safe, out=b if out is None else out)
    tau = r.tau_from_sum(safe)
    tau = np.array(np.broadcast_to(tau, total.shape), dtype=total.dtype)
    p[redo] = p_redo
    tau[redo] = t_redo
    return p, tau


def _shifted_solve(ops, r, x, method, kind, relative, out):
    """:func:`solve` with rows shifted by their maximum into ``out`` (no temporary of the scores' size): a sort map's
    threshold by NumPy's rule and its link in place, the shared closed and root rules' ``p`` copied into ``out``;
    rows whose maximum is not finite take the shared text."""
    m = ops.row_max(x)  # NaN with a NaN in the row, -inf when fully masked, +inf with a +inf score
    bad = ~np.isfinite(m[:, 0])
    redo = np.flatnonzero(bad) if bad.any() else None
    if redo is not None:
        p_redo, t_redo = _shared_rows(ops, r, x, redo, method=method, relative=relative)
        m = np.where(bad[:, None], 0, m)
    y = np.subtract(x, m, out=out)
    if redo is not None:
        y[redo] = 0
    if kind == "sort":
        t = rules.sort_rule(ops, r, y) if method == "sort" else sort_threshold(ops, r, y)
        p = link_into(ops, r, y, t)
    else:
        g, t = rules.closed_rule(ops, r, y) if kind == "closed" else rules.root_rule(ops, r, y)
        np.copyto(y, g)
        p = y
    tau = t if relative else m + t
    if redo is not None:
        p[redo] = p_redo
        tau[redo] = t_redo
    return p, tau


def link_into(ops, r, y, t):
    """``g_+(y - t)`` written over ``y`` (:func:`~numeric.core.rules.sort_link`)."""
    z = np.subtract(y, t, out=y)
    power = rules.small_power(r)
    if power is None:
        np.copyto(z, rules.sort_link(ops, r, z))
        return z
    a, k = power
    clip = r.clip()
    if not (isinstance(clip, (int, float)) and clip == 0):
        np.subtract(z, clip, out=z)
    if not (isinstance(a, (int, float)) and a == 1):
        np.multiply(z, a, out=z)
    np.maximum(z, ops.zeros_row(z), out=z)
    return z if k == 1 else np.multiply(z, z, out=z)


def sort_threshold(ops, r: Routines, y):
    """``tau - m`` for shifted rows ``y`` of a sort map: :func:`support_rounds` for a link of degree 1 on rows
    shorter than :data:`SUPPORT_BELOW`, else :func:`~numeric.core.rules.sort_rule` on rows shorter than
    :data:`PARTIAL_FROM`, else :func:`largest_threshold` from ``K = min(64, max(8, n // 4))`` scores."""
    n = y.shape[-1]
    power = rules.small_power(r)
    if power is not None and power[1] == 1 and n < SUPPORT_BELOW:
        return support_rounds(ops, r, y)
    if n < PARTIAL_FROM:
        return rules.sort_rule(ops, r, y)
    return largest_threshold(ops, r, y, min(64, max(8, n // 4)))


def largest_threshold(ops, r: Routines, y, k: int):
    """The sort rule on each row's ``k`` largest scores (:func:`numpy.partition`, O(n), then a sort of ``k``); the
    support being a prefix of the sorted scores, exact where it ends before ``k``; the rows where it does not are
    solved again from ``4 k``, and so on up to whole rows."""
    n = y.shape[-1]
    if k >= n:
        return rules.sort_rule(ops, r, y)
    ys = -np.sort(np.partition(-y, k - 1, axis=-1)[:, :k], axis=-1)
    t = rules.sort_rule(ops, r, ys, ordered=True)
    full = ys[:, k - 1:] - t > r.clip()  # the smallest of the k is on the support: a score left out may be too
    if not full.any():
        return t
    again = np.flatnonzero(full[:, 0])
    t[again] = largest_threshold(ops, r.bound(ops.take_all(r.params, again, y.shape[0])), y[again], 4 * k)
    return t


def support_rounds(ops, r: Routines, y, steps: int = rules.SUPPORT_STEPS):
    """:func:`~numeric.core.rules.support_rule` for a link of degree 1 (Michelot's rounds), bit for bit, in one
    loop over a scratch buffer: each round's :meth:`~numeric.numpy.ops.NumpyRowOps.support_sums` writes
    ``(y - t - clip)_+`` and its support's indicator over the buffer; the rows still going are gathered once they are at most half of the round before (the scores
    and the parameters; the thresholds of the rows that stopped are written as they stop).  Rows still
    open after ``steps + 1`` rounds take the sort rule."""
    rows, n = y.shape
    lo = -reach_one(ops, r, y[:, :1])
    jensen = ops.row_sum(y) / n - r.omega_prime(lo * 0 + 1 / n)
    t = np.where(jensen > lo, jensen, lo)
    mid = (lo - r.clip()) / 2
    # the rounds' state is one value per row, 1-D (and so are the parameters of one value per row)
    t = np.broadcast_to(np.where(t > mid, t, mid), (rows, 1))[:, 0].astype(y.dtype)
    below = np.broadcast_to(lo, (rows, 1))[:, 0]
    rr = r.bound(tuple(v[:, 0] if np.ndim(v) == 2 else v for v in r.params))
    per_row = any(np.ndim(v) for v in rr.params)
    clip = rr.clip()
    result = np.full(rows, np.nan, dtype=t.dtype)
    going = np.isfinite(below)
    size = np.full(rows, n + 1, dtype=t.dtype)
    where = None  # the rows of y in the rounds (None: all, in order)
    ya = y
    scratch = np.empty(y.size, dtype=y.dtype)
    for _ in range(steps + 1):
        count = going.shape[0]
        live = int(np.count_nonzero(going))
        if live == 0:
            break
        if 2 * live <= count:
            keep = np.flatnonzero(going)
            ya, t, below, size, going = ya.take(keep, axis=0), t[keep], below[keep], size[keep], going[keep]
            if per_row:
                rr = r.bound(ops.take_all(rr.params, keep, count))
                clip = rr.clip()
            where = keep if where is None else where[keep]
            count = live
        c = t + clip  # the support at t: y > c
        kk, su, _ = ops.support_sums(ya, c[:, None], False, 0, out=scratch[: count * n].reshape(count, n))
        kk, su = kk[:, 0], su[:, 0]
        cand = rr.tau_candidate(kk, su + kk * c, 0 * kk)
        exact = kk == size
        stop = going & exact
        if stop.any():
            stop = np.flatnonzero(stop)
            result[stop if where is None else where[stop]] = cand[stop]
        # t rises from the lower bound (-omega'(1) before the first round, t itself after it)
        t = np.maximum(cand, below)
        below, size = t, kk
        going &= ~exact
    result = result[:, None]
    if going.any():
        open_ = np.flatnonzero(going)
        index = open_ if where is None else where[open_]
        result[index] = rules.sort_rule(ops, r.bound(ops.take_all(r.params, index, rows)), y[index])
    return result
