"""A sparse map's threshold from each row's largest scores (:func:`screened`), for every rule that solves rows of
any length: Newton on the KKT system (:func:`numeric.core.kkt.kkt_rule`) and safeguarded Halley on a printed link
(:func:`numeric.core.rules.root_rule`).
"""

from __future__ import annotations

import math
import numbers
from typing import Callable

from .ops import Routines, TensorOps, uncat

__all__ = ["CANDIDATES", "short", "screened"]

#: A sparse map's rows are solved on their CANDIDATES + 1 largest scores first (:func:`screened`).
CANDIDATES = 15


def short(n, candidates: int = CANDIDATES) -> bool:
    """Whether rows of ``n`` scores are too short to screen (:func:`screened`): at most twice ``candidates + 1``,
    and so rows as short as a sparse map's candidates.  ``False`` where ``n`` is not a number (a traced row)."""
    return isinstance(n, int) and n <= 2 * (candidates + 1)


def screened(ops: TensorOps, r: Routines, y, solve: Callable, whole: Callable, candidates: int = CANDIDATES):
    """``(p, tau - m)`` for shifted rows ``y``: ``solve(r, rows)`` on each row's ``candidates + 1`` largest scores,
    where that gives the row's solution, and ``whole(r, rows)`` on rows where screening does not apply.

    A sparse map (``omega'(0+)`` a finite number) whose rows hold more than twice ``candidates + 1`` scores
    (and at least :attr:`~numeric.core.ops.TensorOps.candidates_from`) solves each row's ``candidates + 1``
    largest scores first: where the smallest of them is off that solution's support (its weight 0, and its
    score at most ``omega'(0+)`` above the threshold), every other score is too (it is no larger), and the
    solution is the row's.  Where it is not, the candidates' threshold is below the
    row's (fewer scores need larger weights), so the row's support lies among the scores above it: those rows
    are screened again on that many largest scores and one more (``TensorOps.int_max``), or, where a target
    cannot read the count (JAX under ``jit``), on four times as many as before.  Other maps, and short rows,
    take ``whole``.
    """
    n = y.shape[-1]
    clip = ops.number(r.clip())
    if not isinstance(clip, numbers.Real) or not math.isfinite(clip) or short(n, candidates) or n < ops.candidates_from:
        return whole(r, y)
    values, index = ops.top(y, candidates + 1)
    p, t = solve(r, values)
    # the smallest candidate off the support (masked scores are), its weight 0 as well as its score at most the
    # clip from the threshold (where omega' is flat near 0, the score of a weight as small as (1/n)**39 rounds to
    # the clip: alpha-entmax at alpha = 40): the excluded scores are off it too
    ok = (-ops.row_max(-values) - t <= clip) & (-ops.row_max(-p) <= 0)
    both = ops.cat(ops.put(p, index, y), t)

    def more(y, t, *params):
        rr = r.bound(params)
        above = ops.int_max(ops.row_sum(ops.float_(y - t > clip)))
        q, s = screened(ops, rr, y, solve, whole, 4 * candidates + 3 if above is None else max(above, 2 * candidates + 1))
        return ops.cat(q, s)

    return uncat(ops.on_rows(ops.not_(ok), more, (y, t, *r.params), both), n)
