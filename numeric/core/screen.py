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


def screened(ops: TensorOps, r: Routines, y, solve: Callable, whole: Callable, candidates: int = CANDIDATES,
             whole_next: bool = False, wide_start: bool = False):
    """``(p, tau - m)`` for shifted rows ``y``: ``solve(r, rows)`` on each row's ``candidates + 1`` largest scores,
    where that gives the row's solution, and ``whole(r, rows)`` on rows where screening does not apply.

    A sparse map (``omega'(0+)`` a finite number) whose rows hold more than twice ``candidates + 1`` scores
    (and at least :attr:`~numeric.core.ops.TensorOps.candidates_from`) solves each row's ``candidates + 1``
    largest scores first: where the smallest of them is off that solution's support (its weight 0, and its
    score at most ``omega'(0+)`` above the threshold), every other score is too (it is no larger), and the
    solution is the row's.  Where it is not, the candidates' threshold is below the
    row's (fewer scores need larger weights), so the row's support lies among the scores above it: those rows
    are screened again on that many largest scores and one more (``TensorOps.int_max``), or, where a target
    cannot read the count (it traces: JAX under ``jit``, ``torch.compile``), on four times as many as before,
    once: after a stage of more than ``CANDIDATES + 1`` (the second, or ``wide_start``'s first) they take
    ``whole``.  A traced graph holds every stage's solve whether a row needs it or not (``cosh(p) - 1`` on rows
    of 1024 under ``torch.compile``, forward and backward: 16, 64 and 256 candidates and whole rows compiled in
    72 s, without the 256 in 52 s, its calls as fast; ``p**2/2 + p*log(1 + p)``'s 90 s -> 71 s, 9.0 -> 6.9 ms).
    Other maps, and short rows, take ``whole``.

    Rows of at most :attr:`~numeric.core.ops.TensorOps.cut_up_to` scores take as candidates at most
    ``candidates + 1`` scores above a cut (:func:`_above_cut`) instead of the largest: where the largest score
    left out is off the solution's support, the solution is the row's.  Where the target traces, and with
    ``whole_next`` (a solve whose rounds cost the same per score on candidates as on whole rows, the root rule's
    Halley), those rows go from the first candidates to the whole rows: one solve fewer in the graph (causal
    attention on rows of 256 under ``torch.compile``, forward and backward: ``cosh(p) - 1`` compiled in 39 s
    instead of 56, its calls as fast; the KKT solve's whole rows took twice its calls' time there).  With
    ``wide_start`` (the KKT solve), rows above a cut longer than ``8 (candidates + 1)`` start from
    ``4 candidates + 3`` candidates: every row takes a traced stage that any row needs, and on causal attention's
    rows of 256 some row always needed more than 16 (``p**2/2 + p*log(1 + p)``'s compiled in 60 s instead of 82-87,
    its calls 27.6-28.6 ms instead of 43.8; the root rule's calls were slower so, cosh_one's 13.2 -> 15.8 ms), and
    so do longer rows where the target's largest 64 cost as much as its largest 16
    (:attr:`~numeric.core.ops.TensorOps.wide_top`).  Where the target cuts at all (``cut_up_to`` above 0), that wide
    first stage takes its candidates above a cut on rows of any length, and later stages on rows longer than
    ``cut_up_to`` the largest: under ``torch.compile`` the 64 largest of 512 rows of 1024 took as long as a whole
    compiled entmax15 (``p**2/2 + p*log(1 + p)`` forward+backward 3.0x -> 1.8x compiled entmax15; its cold compile on
    those rows 64 -> 74 s).
    """
    n = y.shape[-1]
    clip = ops.number(r.clip())
    # (not a traced row's length; the KKT solve's wide first stage on rows of any length where the target cuts)
    cut = isinstance(n, int) and (n <= ops.cut_up_to or (wide_start and ops.cut_up_to > 0))
    if not isinstance(clip, numbers.Real) or not math.isfinite(clip) or short(n, candidates) or (n < ops.candidates_from and not cut):
        return whole(r, y)
    if wide_start and n > 8 * (candidates + 1) and (cut or ops.wide_top):
        candidates = 4 * candidates + 3
    if cut:
        values, index, rest, fits = _above_cut(ops, r, y, clip, candidates + 1)
        p, t = solve(r, values)
        # the largest score left out is off the support: so is every other one
        ok = fits & (rest - t <= clip)
    else:
        values, index = ops.top(y, candidates + 1)
        p, t = solve(r, values)
        # the smallest candidate off the support (masked scores are), its weight 0 as well as its score at most the
        # clip from the threshold (where omega' is flat near 0, the score of a weight as small as (1/n)**39 rounds
        # to the clip: alpha-entmax at alpha = 40): the excluded scores are off it too
        ok = (-ops.row_max(-values) - t <= clip) & (-ops.row_max(-p) <= 0)
    both = ops.cat(ops.put(p, index, y), t)

    def more(y, t, *params):
        rr = r.bound(params)
        above = ops.int_max(ops.row_sum(ops.float_(y - t > clip)))
        if above is None and (cut and whole_next or candidates > CANDIDATES):
            return ops.cat(*whole(rr, y))  # (traced: a second stage of candidates at most, see above)
        q, s = screened(ops, rr, y, solve, whole, 4 * candidates + 3 if above is None else max(above, 2 * candidates + 1))
        return ops.cat(q, s)

    return uncat(ops.on_rows(ops.not_(ok), more, (y, t, *r.params), both), n)


#: The levels below each row's maximum, in units of ``omega'(1) - omega'(0+)``, at which :func:`_above_cut` counts
#: the scores above (nearest first).
LEVELS = tuple(2.0 ** (-j / 2) for j in range(12, -1, -1))
#: The levels :func:`threshold_below` counts at between two of the :data:`LEVELS`.
SUBLEVELS = 4


def _above_cut(ops, r, y, clip, k):
    """``(values, index, rest, fits)``: at most ``k`` of each shifted row's largest scores, those above a cut, as
    :meth:`~numeric.core.ops.TensorOps.above` gathers them; ``rest`` the largest score left out, and ``fits``
    whether the cut left at most ``k`` scores above it.

    The cut is ``clip`` above :func:`threshold_below`'s bound of the threshold, where no score at or below it is
    on the support, or the lowest of its levels with at most ``k`` scores above it where that is higher (then
    ``rest`` tells whether the support was cut).  Counting at fixed levels takes passes over the scores, where
    the ``k`` largest take a partial sort (torch's ``topk`` under ``torch.compile``: two thirds of a compiled
    entmax15's time on rows of 64).
    """
    bound, low = threshold_below(ops, r, y, clip, k)
    fits = ops.isfinite(low)
    cut = ops.where(fits, ops.where(bound + clip > low, bound + clip, low), -ops.tiny)
    values, index = ops.above(y, cut, k)
    rest = ops.row_max(ops.where(y > cut, -math.inf, y))
    return values, index, rest, fits


def threshold_below(ops, r, y, clip, k):
    """``(bound, low)`` per shifted row ``y``: a lower bound of its threshold, and the lowest level with at most
    ``k`` scores above it (``inf`` where none) among the :data:`LEVELS` and :data:`SUBLEVELS` levels between that
    one and the next.

    With ``c`` scores above a level ``v``, each has weight at least ``1/c`` at ``t = v - omega'(1/c)``, where the
    weights sum to at least 1: that ``t`` is below the threshold, as ``-omega'(1)`` is (the largest score's
    weight 1), and the bound is the largest of them.
    """
    one = r.omega_prime(ops.full(y[..., :1], 1.0))
    span = one - clip
    bound = -one
    low, below = ops.full(one, math.inf), ops.full(one, -math.inf)

    def count_at(v, bound, low, where):
        count = ops.row_sum(ops.float_(y > v))
        b = v - r.omega_prime(1 / ops.clamp_min(count, 1.0))
        return count, ops.where(where & (b > bound), b, bound), ops.where(where & (count <= k), v, low)

    everywhere = ops.full(one, True)
    for level in LEVELS:
        v = -span * level
        count, bound, low = count_at(v, bound, low, everywhere)
        below = ops.where((count > k) & ops.not_(ops.isfinite(below)), v, below)
    # between the lowest level with at most k above it and the next, where both are
    both = ops.isfinite(low) & ops.isfinite(below)
    top, step = ops.where(both, low, 0.0), ops.where(both, (below - low) / (SUBLEVELS + 1), 0.0)
    for j in range(1, SUBLEVELS + 1):
        _, bound, low = count_at(top + j * step, bound, low, both)
    return bound, low
