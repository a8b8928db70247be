"""The bracketed threshold solves: safeguarded Halley on ``h(t) = omega'(F(t)) - omega'(1)`` and its rounds.

* :func:`halley_threshold`: the threshold of rows in a bracket (the root rule's, the KKT solve's fallback, and
  the fused Triton attention's kept scores, traced: ``kept_threshold``);
* :func:`root_halley`: :func:`halley_threshold` and ``p``, with the combination of a bracket's ends at a kink;
* :func:`narrow_bracket` and :func:`threshold_round`: a round of a bracketed solve of ``F(t) = 1`` for a
  decreasing ``F``, written once for every threshold solve (the bounded one's too, and the fused attention's
  passes over the keys);
* :func:`michelot`: the root of a piecewise linear ``sum (c_i - s)_+ = d``, Michelot's fixed point (the linear
  link's start; its round, with a linear term, the first Halley round's step across the kinks of scores entering
  the support);
* :func:`clipped_link` and :func:`power_link`: ``g_+(y - t)``, the printed (or inverted) link and the power form.
"""

from __future__ import annotations

import math

from ..newton import safeguarded_point
from .ops import Routines, uncat

__all__ = ["ROOT_STEPS", "LOG_STEPS", "PIECE_STEPS", "reach_one", "lower_end", "power_link", "root_halley", "narrow_bracket",
           "threshold_round", "halley_threshold", "michelot", "clipped_link"]

#: Iteration budget of the root rule's safeguarded Halley solve.
ROOT_STEPS = 100
#: Iteration budget of a bisection to a few ulps: the root rule's in ``log(a / c)`` (a bracket of ``log(n) / k``,
#: :func:`numeric.core.rules.root_rule`) and the bounded threshold's (:func:`numeric.constraints.box.box_between`).
LOG_STEPS = 200
#: Rounds of Michelot's fixed point on the piecewise linear model of ``F`` where the first Halley round's Newton point
#: crosses the kinks of scores entering the support (:func:`halley_threshold`): on 512 N(0, 1) rows of 64 (the 16
#: candidates of each), 1, 2 and 3 rounds leave ``p**2/2 + p**4/4`` 5, 4 and 4 Halley rounds (7 without the model),
#: ``p**2/2 + p**3/3`` 5, 4 and 4 (6).
PIECE_STEPS = 2


def reach_one(ops, r, like):
    """``omega'(1)`` per row (``like`` has shape ``(rows, 1)``)."""
    return r.omega_prime(ops.full(like, 1.0))


def lower_end(ops, r, y):
    """The lower end of the threshold's bracket per row of shifted scores ``y`` (masked scores ``-inf``), shape
    ``(rows, 1)``: ``-omega'(1)``, where ``g(y_max - t) = 1``.

    Where omega's domain ends at 1 (``omega'(1) = +oo``, the binary entropy) that is ``-oo``: then the larger of
    ``min(y) - omega'(1/n)`` over the ``n`` live scores, where each ``g(y_i - t) >= 1/n``, and ``y_(2) -
    omega'(1/2)``, where the two largest have ``g >= 1/2`` (an outlier far below leaves this one near the root);
    on a row with one live score,
    whose ``p`` is 1 at ``t = -oo``, ``-omega'(1 - eps/2)``, a finite ``t`` whose link rounds to 1.
    """
    one = reach_one(ops, r, y[..., :1])

    def ends():
        live = ops.isfinite(y)
        count = ops.row_sum(ops.float_(live))
        low = -ops.row_max(ops.where(live, -y, -math.inf))
        spread = low - r.omega_prime(1 / ops.where(count > 1, count, 2))
        # the two largest, each g >= 1/2 at y_(2) - omega'(1/2) (y_(1) = 0: the rows are shifted to their maximum)
        second = ops.where(ops.row_sum(ops.float_(y == 0)) > 1, 0, ops.row_max(ops.where(y < 0, y, -math.inf)))
        pair = second - r.omega_prime(ops.full(one, 0.5))
        lower = ops.where(pair > spread, pair, spread)
        return ops.where(ops.isfinite(one), -one,
                         ops.where(count > 1, lower, -r.omega_prime(ops.full(one, 1 - ops.eps / 2))))

    return ops.branch(ops.not_(ops.isfinite(one)), ends, lambda: -one)


def power_link(ops, k, raw):
    """``(p, base, mask)``: ``p = raw_+**k`` for a link of the power form (``raw = a (z - clip)``).

    ``p = base**k = exp(k log base)`` with ``base >= tiny`` and ``k log base >= 0.9 log(tiny)``: no
    zero, infinity, underflow or subnormal number reaches log and exp (their slow paths; ``p`` below
    ``tiny**0.9`` is off by less than that); off the support (``mask``) ``p`` is then exactly 0.
    """
    base = ops.clamp_min(raw, ops.tiny)
    mask = ops.support(ops.pos_part(raw))
    return ops.exp(ops.clamp_min(k * ops.log(base), 0.9 * ops.log_tiny)) * mask, base, mask


def root_halley(ops, r, y, steps, power, lo, hi, start=None):
    """:func:`~numeric.core.rules.root_rule`'s safeguarded Halley in the bracket ``[lo, hi]`` from ``start`` (as
    :func:`halley_threshold`'s; and the KKT solve's fallback, :func:`~numeric.core.kkt.kkt_rule`); ``power``:
    ``(a, k, b)`` of the link's power form, or ``None``."""
    t, lo, hi, active, settled, weights = halley_threshold(ops, r, y, lo, hi, steps=steps, power=power, start=start)
    n = y.shape[-1]
    if power is None and not r.has("link") and isinstance(n, int):
        # the link inverted (the KKT solve's fallback): p at t and at the bracket's ends from one inversion, one
        # loop where a traced graph would hold three (on rows of 64 under torch.compile, gini_log1p's graph
        # held 70 kernel calls, 17 of them in the inversions at t, lo and hi); a traced row (n not a number)
        # has one row of scores, which cannot be laid side by side
        each = ops.full(y, 0.0)
        p, ends = uncat(weights(ops.cat(ops.cat(each + t, each + lo), each + hi), ops.cat(ops.cat(y, y), y)), n)
        at_ends = lambda: uncat(ends, n)  # noqa: E731
    else:
        p = weights(t)
        at_ends = lambda: (weights(lo), weights(hi))  # noqa: E731
    total = ops.row_sum(p)
    p = p / total
    # a row whose F jumps across 1 between the ends of its bracket: p(lo) + lam (p(hi) - p(lo)), sum 1
    kink = (active | ops.not_(settled)) & (abs(total - 1) > 4 * ops.eps)

    def combine():
        p_lo, p_hi = at_ends()
        f_lo, f_hi = ops.row_sum(p_lo), ops.row_sum(p_hi)
        ok = (f_lo >= 1) & (f_hi <= 1) & (f_lo > f_hi)
        lam = ops.where(ok, (f_lo - 1) / ops.where(ok, f_lo - f_hi, 1), 0)
        mixed = ops.where(ok, p_lo + lam * (p_hi - p_lo), p_lo / ops.where(f_lo > 0, f_lo, 1))
        return ops.where(kink, mixed, p)

    p = ops.branch(kink, combine, lambda: p)
    return p, t + (-r.clip() if power is not None else 0)  # (power: tau - m = t - clip)


def narrow_bracket(ops, t, lo, hi, active, f):
    """The bracket ``[lo, hi]`` of a decreasing ``F``'s root of ``F = 1`` moved to ``t``, where ``F`` is ``f``, on
    the rows ``active``."""
    return ops.where(active & (f > 1), t, lo), ops.where(active & (f < 1), t, hi)


def threshold_round(ops, t, lo, hi, step, step_old, active, f, slope, point, usable, scale, free=False):
    """One round of a bracketed solve of ``F(t) = 1`` for a decreasing ``F``, at ``t``, where ``F`` is ``f`` and
    ``F'`` is ``slope``, towards ``point``: ``(t, step, step_old, active, exact, took)``.

    The bracket ``[lo, hi]`` is already moved to ``t`` (:func:`narrow_bracket`).  The point is taken
    (``took``) where ``usable`` and as :func:`numeric.newton.safeguarded_point` allows, which needs it to
    halve the step before last unless ``free`` or the step is small; otherwise the bracket is bisected.  A
    row is done (no longer ``active``) where ``F`` is 1 to ``4 eps`` (``exact``: it keeps ``t``), where it
    takes a small step (one that moves ``F`` by less than that, or ``t`` by less than the resolution of
    ``s - t``, ``eps (scale + |t|)``: ``t`` is the root to rounding, and the step is still worth up to
    ``|F'|`` times the resolution), or where the bracket is 4 resolutions wide.  Rows not ``active`` keep
    ``t`` and their steps.

    Written once for the threshold solves: :func:`halley_threshold`'s rounds (the host's, and the fused
    Triton attention's kept scores), and the rounds of that attention's passes over the keys, whose point
    comes from its kept scores (traced, ``threshold_round``).
    """
    tol = 4 * ops.eps
    resolution = ops.eps * (scale + abs(t))
    exact = abs(f - 1) <= tol
    step_small = (abs((point - t) * slope) <= tol) | (abs(point - t) <= resolution)
    new, took = safeguarded_point(ops, t, lo, hi, step_old, point, usable, step_small if free is False else free | step_small)
    done = exact | (took & step_small) | (hi - lo <= 4 * resolution)
    return (ops.where(active & ops.not_(exact), new, t), ops.where(active, new - t, step),
            ops.where(active, step, step_old), active & ops.not_(done), exact, took)


def halley_threshold(ops, r, y, lo, hi, *, steps: int = ROOT_STEPS, power=None, start=None, going=None, rest=None,
                     peak=None):
    """The threshold of the rows ``y`` in the bracket ``[lo, hi]`` by safeguarded Halley on
    ``h(t) = omega'(F(t)) - omega'(1)`` (``F(t) - 1`` where ``omega'(1) = +oo``) (:func:`~numeric.core.rules.root_rule`): ``(t, lo, hi, active, settled, weights)``.

    ``t``, ``lo`` and ``hi`` have shape ``(rows, 1)``: ``F(lo) >= 1 >= F(hi)`` and ``t = tau - m`` for rows
    shifted to their maximum ``m`` (``peak``, the rows' largest score, is 0 where ``None``; a device kernel
    passes the scores as they are and their maximum).  ``power``: ``(a, k, b)`` of the link's power form (then ``t`` is
    ``tau - m - clip`` and ``y`` is read through ``b``), or ``None``: the link ``r.link`` or, without one,
    the link inverted (:meth:`~numeric.core.ops.TensorOps.invert_link`).  ``active``: the rows still going after ``steps``
    rounds; ``settled``: where ``F`` was 1 to ``4 eps`` or a step would have moved it less;
    ``weights(t)``: ``g_+(y - t)``.

    The fused Triton attention solves each query block's kept scores with this text, traced
    (:mod:`derive.codegen.trace`): from ``start`` (else ``lo``), on the rows ``going`` (else all; the
    others keep ``start``), with ``F`` the kept scores' sum plus ``rest(t)``, ``(value, first, second
    derivative)`` of the row's other scores at ``t`` (a model of them; ``None``: the row is whole).
    """
    clip = r.clip()
    if power is not None:
        a, k, b = power
        scale = 0  # t has no offset: the bracket's width is judged relative to t
        scores = b

        def probabilities(r, b, t, clip, a, k, peak):
            return power_link(ops, k, b - a * t)

        def sums(r, b, t, clip, a, k, peak):
            p, base, _ = probabilities(r, b, t, clip, a, k, peak)
            q = p / base  # w / (a k), 0 off the support
            total = ops.row_sum(p)
            d1 = -a * k * ops.row_sum(q)
            d2 = a * a * k * (k - 1) * ops.row_sum(q / base)
            return total, d1, d2
    else:
        a = k = None
        scale = 1 if peak is None else 1 + abs(peak)
        scores = y
        dense = _dense(clip)

        def probabilities(r, y, t, clip, a, k, peak):
            return clipped_link(ops, r, y, t, clip, peak)

        def sums(r, y, t, clip, a, k, peak):
            p, pos = probabilities(r, y, t, clip, a, k, peak)

            def masked():
                safe = ops.where(pos, p, 1)
                return ops.where(pos, r.weight(safe), 0), ops.where(pos, r.weight_d2(safe), 0)

            # (every score on the support, a dense map's rows without masked scores: no selects)
            w, w2 = ops.rare(ops.not_(pos), masked, lambda: (r.weight(p), r.weight_d2(p))) if dense else masked()
            return ops.row_sum(p), -ops.row_sum(w), ops.row_sum(w2)

    def weights(t, scores=scores):  # (t of the shape of scores, or (rows, 1))
        return probabilities(r, scores, t, clip, a, k, peak)[0]

    one = reach_one(ops, r, lo)
    tol = 4 * ops.eps
    # a sparse map's F has a kink at each score's entry point y - clip, where its slope jumps by the link's slope
    # there: a printed link's first round models the kinks it crosses (not the KKT solve's fallback, whose link is
    # inverted: its rows are few and its graph under torch.compile large; nor a traced kernel's kept scores beside a
    # model of the rest)
    pieces = power is None and not _dense(clip) and r.has("link") and steps > 0
    width = hi - lo
    # where omega's domain ends at 1 the lower end comes from the smallest score, far from the root when the scores
    # spread (F is 1 to rounding from near the root down to it, and Newton's first steps from it are short): from hi
    ends = ops.not_(ops.isfinite(one))  # (omega's domain ends at 1: omega'(1) = +oo, Halley on F - 1 itself)
    start = (ops.where(ends, hi, lo) if power is None else lo) if start is None else start
    going = ops.full(lo, True) if going is None else going
    state = (start, lo, hi, width, width, going, ops.full(lo, False))
    # what a row's rounds read (each row from its own: a target may run the rounds on the rows still going alone)
    rows = (scores, one, ends, scale, clip, peak, a, k, *r.params)

    def inside(v, lo, hi):
        return (v > lo) & (v < hi) & ops.isfinite(v)

    def body(state, rows, kinks=False):
        t, lo, hi, step, step_old, active, settled = state
        scores, one, ends, scale, clip, peak, a, k, *params = rows
        rr = r.bound(params)
        total, d1, d2 = sums(rr, scores, t, clip, a, k, peak)
        if rest is not None:
            more, more_d1, more_d2 = rest(t)
            total, d1, d2 = total + more, d1 + more_d1, d2 + more_d2
        lo, hi = narrow_bracket(ops, t, lo, hi, active, total)
        # (F = 0 and F' = 0 only on a row without scores: its derivatives are taken at 1 and it bisects, so that
        # no lane of a device block divides by 0)
        some = total > 0
        at = ops.where(some, total, 1)
        o2 = rr.omega_second(at)
        o3 = rr.omega_third(at)
        h = ops.where(ends, total - 1, rr.omega_prime(at) - one)
        h1 = ops.where(ends, d1, o2 * d1)
        h2 = ops.where(ends, d2, o3 * d1 * d1 + o2 * d2)
        denom = 2 * h1 * h1 - h * h2
        sloped = h1 != 0
        halley = t - 2 * h * h1 / ops.where(denom > 0, denom, 1)
        newton = t - h / ops.where(sloped, h1, 1)
        new = ops.where((denom > 0) & inside(halley, lo, hi), halley, newton)
        if kinks:
            new = _across_kinks(ops, rr, scores, clip, t, total, d1, new)
        usable = ops.isfinite(new) & sloped & some
        t_new, step, step_old, going, exact, _ = threshold_round(ops, t, lo, hi, step, step_old, active, total, d1,
                                                                 new, usable, scale)
        settled_now = exact | ((newton != t) & (abs((newton - t) * d1) <= tol))
        settled = ops.where(active, settled_now, settled)
        return (t_new, lo, hi, step, step_old, going, settled), going

    if rest is None:
        if pieces:
            # the first round, from the start (above the root on a top-heavy row, where the linear link's threshold
            # leaves few scores on the support), takes the kinks it crosses (_across_kinks); the rounds after it lie
            # in the bracket it narrowed, where Halley's points were as good (on 512 N(0, 1) rows of 64,
            # p**2/2 + p**4/4 and p**2/2 + p**3/3 took the same rounds with the model in every round)
            state, going = body(state, rows, kinks=True)
            steps -= 1
        t, lo, hi, _, _, active, settled = ops.repeat_rows(steps, body, state, going, rows, tail=True)
    else:  # (rest reads every row as it is: a traced kernel's rounds run on every row)
        t, lo, hi, _, _, active, settled = ops.repeat(steps, lambda state: body(state, rows), state, going)
    return t, lo, hi, active, settled, weights


def _across_kinks(ops, r, y, clip, t, total, d1, new):
    """A Halley round's point ``new`` from ``t``, or where ``F < 1`` and Newton's point on ``F`` crosses scores'
    kinks (they enter the support on the way), the root of a model of ``F`` with those kinks.

    Halley's model holds the support at ``t``: from the right of the root it misses the slope of the scores that
    enter and lands past the root, often at the bracket's lower end (``p**2/2 + p**4/4`` on N(0, 1) rows of 64:
    up to 7 rounds).  The model is ``F``'s tangent at ``t`` plus each entering score on the link's tangent at its
    kink, ``w0 (e_i - s)_+`` with ``e_i = y_i - clip < t`` its entry point and ``w0 = w(0+)``: convex, piecewise
    linear and decreasing, ``w0`` times ``sum_i (e_i - s)_+ - b s`` with ``b = -F'(t) / w0``, whose root
    Michelot's rounds (:func:`michelot`'s) reach from Newton's point, a lower bound of it.  It reads the scores alone: no link is
    evaluated again.  (Scores that leave the support, from the left of the root, are not modelled: there the
    tangents of the scores on the support cross 0 past their entry points, at ``t + p_i / w_i``, with their own
    slopes, which only the link gives.)  Where ``w0`` is 0 or infinite (a link of zero slope at its kink, where ``F``
    is smooth, or of an infinite one), ``new`` stands.
    """
    w0 = r.weight(ops.full(t, 0.0))
    edge = y - clip  # (-inf at masked scores, +inf where a per-row clip is -inf: never entering)
    entering = ops.where(edge < t, edge, -math.inf)
    newton = t - (total - 1) / ops.where(d1 != 0, d1, -1)
    crossed = (w0 > 0) & ops.isfinite(w0) & (ops.row_max(entering) > newton)

    def model():
        w = ops.where(crossed, w0, 1)
        # w sum (e_i - s)_+ + total + d1 (s - t) = 1, from Newton's point (a few rounds, traced out: no loop's fixed
        # costs in every Halley round)
        d, b, s = (1 - total + d1 * t) / w, -d1 / w, newton
        for _ in range(PIECE_STEPS):
            s, _ = _michelot_round(ops, entering, d, s, b)
        return ops.where(crossed & ops.isfinite(s), s, new)

    return ops.rare(crossed, model, lambda: new)


def michelot(ops, c, d, t, size, steps: int):
    """The root ``s`` of ``sum_i (c_i - s)_+ = d`` by Michelot's fixed point from ``t``, a lower bound of it (rows
    ``(rows, 1)``).

    Each round takes the terms positive at ``t``, ``S``, and moves to ``t = (sum_S c_i - d) / |S|``, the root of
    their sum: ``t`` rises to the root (the sum over ``S`` is at most the whole one) and stops there, at a count of
    ``S`` that no longer changes from ``size``, the count before the first round; at most ``steps`` rounds, a lower
    bound of the root after those.  Sparsemax's threshold where ``c`` are its scores and ``d = 1``.
    """

    def body(state, rows):
        t, now = _michelot_round(ops, *rows, state[0])
        return (t, now), now != state[1]

    return ops.repeat_rows(steps, body, (t, size), ops.full(t, True), (c, d))[0]


def _michelot_round(ops, c, d, t, b=0):
    """A round of :func:`michelot` from ``t``, with a term ``-b s`` beside the sum (``b >= 0`` per row: the root
    of ``sum_i (c_i - s)_+ - b s = d``, which rises to it as well): ``(t, |S|)``."""
    on = c > t
    now = ops.row_sum(ops.float_(on))
    return (ops.row_sum(ops.where(on, c, 0)) - d) / (now + b), now


def _dense(clip) -> bool:
    """Whether ``clip = omega'(0+)`` is known to be ``-inf`` (a number, not a traced or per-row value): every live
    score is on the support."""
    return isinstance(clip, (int, float)) and clip == -math.inf


def clipped_link(ops, r: Routines, y, t, clip, peak=None, ceiling=None):
    """``(g_+(y - t), support)`` for rows ``y`` and thresholds ``t`` (``(rows, 1)``): the link where ``y - t`` is
    above the clip ``omega'(0+)``, 0 elsewhere; a link with no closed form inverted
    (:meth:`~numeric.core.ops.TensorOps.invert_link`).  Off the support the link is evaluated at the row's maximum, ``peak - t``
    (``peak`` 0 where ``None``: rows shifted to their maximum), inside the support where ``t <= -omega'(c/n)``.

    ``ceiling``: ``omega'(inf)``, where ``omega'`` is bounded above (Tsallis with ``alpha < 1``: ``1 / (alpha
    (1 - alpha))``); ``z`` at or beyond it gives ``g = inf`` (no ``p`` has ``omega'(p) = z``), or 1 where omega's
    domain ends at 1 (there the ceiling is ``inf``, reached by a score of ``+inf`` alone).  ``None``: every
    ``z`` the caller passes has a link value.
    """
    z = y - t
    pos = z > clip
    inside = pos if ceiling is None else pos & (z < ceiling)

    def link(z):
        return r.link(z) if r.has("link") else ops.invert_link(z, r.omega_prime, r.omega_second)

    def masked():
        g = link(ops.where(inside, z, -t if peak is None else peak - t))
        if ceiling is not None:  # (g at the ceiling: inf, or 1 where omega's domain ends at 1 and z is +inf)
            top = ops.where(ops.isfinite(r.omega_prime(ops.full(ceiling, 1.0))), float("inf"), 1.0)
            g = ops.where(pos & ops.not_(inside), top, g)
        support = pos & (g > 0)
        return ops.where(support, g, 0), support

    if not _dense(clip):
        return masked()

    def whole():  # (every score inside: the link at z itself, 0 only where it underflowed)
        g = link(z)
        support = g > 0
        return ops.rare(ops.not_(support), lambda: (ops.where(support, g, 0), support), lambda: (g, support))

    # a dense map's rows without masked scores skip the selects (four passes each on NumPy)
    return ops.rare(ops.not_(inside), masked, whole)
