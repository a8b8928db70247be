"""The threshold rules of a map on the simplex, written once for every array framework (:mod:`numeric.core.ops`).

* :func:`solve`: ``(p, tau)`` for rows of scores: masked scores ``-inf`` get
  ``p = 0``, a fully masked row zeros (``tau = +inf``), a row with a NaN (or
  ``+inf``) NaN; the other rows are shifted by their maximum and solved by the
  module's rule:
* :func:`closed_rule`: ``p = B(y) / sum B(y)``, ``tau - m = tau_from_sum(S)``;
* :func:`sort_rule`: sorted scores, cumulative sums of the shifted scores and
  their squares, ``tau_candidate`` (and ``discriminant`` for degree 2), the
  largest valid support size;
* :func:`support_rule`: the same ``tau`` without sorting, for a sort map:
  Newton steps on ``F(t) = sum g_+(y - t)`` from a lower bound until the
  support ``S`` at ``t`` gives a candidate ``tau_S`` whose own support is
  ``S`` (then ``tau_S`` is exact); rows that do not get there within the
  budget take :func:`sort_rule`;
* :func:`root_rule`: safeguarded Halley on ``omega'(F(t)) = omega'(1)`` inside
  the bracket ``[-omega'(1), -omega'(1/n)]`` (:mod:`numeric.core.halley`), with the
  link of the power form ``(a (z - clip))**k`` evaluated as ``exp(k log base)``
  in the variable ``t = -c / a`` (``c = p_max**(1/k)``; rows where ``c`` may leave the
  normal range, large alpha on long rows, in ``log(a / c)``), else the printed link,
  else the KKT solve (:func:`numeric.core.kkt.kkt_rule`).
"""

from __future__ import annotations

import math
import numbers

from .halley import LOG_STEPS, ROOT_STEPS, lower_end, power_link, reach_one, root_halley
from .kkt import kkt_rule, threshold_start
from .ops import Routines, TensorOps, log_of, row_length, uncat
from .screen import screened, short

__all__ = ["SUPPORT_STEPS", "solve", "recomputable", "at_threshold", "closed_rule", "small_power", "sort_link",
           "sort_rule", "support_rule", "root_rule"]

#: Newton steps of :func:`support_rule` before its remaining rows take the sort rule.
SUPPORT_STEPS = 12
#: The loss, in units of rounding, of the prefix sums' ``s2 - s1**2/k`` (their ratio ``s2 / (s2 - s1**2/k)``, at
#: most ``k + 1`` on a support of ``k``) above which :func:`sort_rule` computes its candidate again about the
#: support's mean.
CANCELLATION = 32


def solve(ops: TensorOps, r: Routines, x, *, method: str = "auto", relative: bool = False):
    """``(p, tau)`` for the rows of ``x`` (2-D), ``tau`` of shape ``(rows, 1)``.

    ``method``: ``"auto"`` (the module's rule; a sort map takes :func:`support_rule`),
    or ``"sort"`` / ``"root"`` to force one (``"root"`` applies to every map).
    ``relative``: ``tau`` less each row's maximum score, as the rules find it (the
    absolute ``tau`` rounds at the scale of the scores, which may be far larger than
    their spread); ``inf`` for a fully masked row and NaN for a NaN one either way.
    """
    kind = r.module.THRESHOLD if method == "auto" else method
    return _solve_shifted(ops, r, x, method, kind, relative)


def closed_with(ops: TensorOps, r: Routines, x, extra):
    """``(p, tau)`` of a map with a closed threshold over the rows ``[x, extra]`` (``extra`` one more score per row,
    ``(rows, 1)``), ``p`` without ``extra``'s column: :func:`solve` of the concatenated rows, with no copy of them
    (the extra column's term joins the row sums).  A sink (:mod:`numeric.constraints.sink`) is such a column."""
    return _solve_shifted(ops, r, x, "auto", "closed", False, extra)


def _solve_shifted(ops, r, x, method, kind, relative, extra=None):
    """:func:`solve` with every row shifted by its maximum; ``extra``: one more score per row (:func:`closed_with`)."""
    m = ops.row_max(x)  # NaN with a NaN in the row, -inf when fully masked, +inf with a +inf score
    if extra is not None:  # (NaN stays NaN: a NaN extra score makes its row NaN)
        m = ops.where(ops.isnan(extra) | (extra > m), extra, m)
    bad = ops.not_(ops.isfinite(m))
    m0 = ops.where(bad, 0, m)
    # bad rows are solved as zeros and overwritten below (full-size masks only where there are some; a traced
    # target masks every row: a branch there costs a read back and two subgraphs, each copying the rows)
    y = ops.rare(bad, lambda: ops.where(bad, 0, x - m0), lambda: x - m0)
    if extra is not None:
        p, t = closed_rule(ops, r, y, extra - m0)
    elif kind == "closed":
        p, t = closed_rule(ops, r, y)
    elif kind == "root":
        p, t = root_rule(ops, r, y)
    else:
        t = sort_rule(ops, r, y) if method == "sort" else support_rule(ops, r, y)
        p = sort_link(ops, r, y - t)
    tau = t if relative else m0 + t

    def overwrite():
        invalid = ops.isnan(m) | (m > 0) & bad
        nan = ops.full(m, float("nan"))
        return (ops.where(bad, ops.where(invalid, nan, 0), p),
                ops.where(bad, ops.where(invalid, nan, float("inf")), tau))

    return ops.rare(bad, overwrite, lambda: (p, tau))


def recomputable(r: Routines) -> bool:
    """Whether a map's ``p`` is :func:`at_threshold` of its ``tau``: a sort or closed map, or a link of the power form
    (whose rows where ``tau`` does not carry ``p`` :func:`at_threshold` solves again).
    """
    module = r.module
    return (module.THRESHOLD == "sort" or module.THRESHOLD == "closed" and r.has("link")
            or module.LINK_FORM == "power" and r.has("link_scale"))


def at_threshold(ops: TensorOps, r: Routines, x, t):
    """``p = g_+(x - tau) / sum g_+(x - tau)`` for rows ``x`` and the relative threshold ``t = tau - max(x)``
    that :func:`solve` gave them with ``relative=True`` (a :func:`recomputable` map): a maximum and one
    pass instead of a solve, e.g. for the weights of attention's backward pass.

    ``x - tau`` is computed as ``(x - max(x)) - t``, as the solve did.  The sum is 1 to
    rounding; dividing by it gives the solved ``p`` to rounding.  A fully masked row
    (``t = inf``) gives 0, a NaN row (``t`` NaN) NaN.  A root map's rows whose sum is
    not 1 to rounding (at a kink of ``F`` the root rule combines the ends of a bracket;
    no single ``tau`` gives that ``p``), or whose ``c = p_max**(1/k)`` leaves the normal
    range (:func:`_power_log_rule`), are solved again.
    """
    m = ops.row_max(x)
    z = x - ops.where(ops.isfinite(m), m, 0) - t
    power = r.module.LINK_FORM == "power" and r.has("link_scale")
    if power and small_power(r) is None:
        g, _, _ = power_link(ops, r.link_exponent(), r.link_scale() * (z - r.clip()))
    else:  # the clipped link, as the sort rule evaluates it
        g = sort_link(ops, r, z)
    total = ops.row_sum(g)
    p = ops.where(total == 0, 0, g / total)
    if r.module.THRESHOLD != "root" or not power:
        return p
    # rows whose tau does not carry p: c = p_max**(1/k) out of range (solved in log(a / c)), or, where F
    # jumps at a kink (k < 1), F(tau) not 1 to the root rule's tolerance (its p combines a bracket's ends)
    def again(x, *params):
        return solve(ops, r.bound(params), x)[0]

    k = r.link_exponent()
    far = _far_rows(ops, k, x)  # (a Python bool where k is a number)
    if far is True:
        return again(x, *r.params)
    if isinstance(k, (int, float)) and k >= 1:
        return p
    redo = ops.isfinite(t) & (abs(total - 1) > 4 * ops.eps)
    if not isinstance(k, (int, float)):
        redo = redo & (k < 1) | far
    return ops.on_rows(redo, again, (x, *r.params), p)


def closed_rule(ops: TensorOps, r: Routines, y, extra=None):
    """``(p, tau - m)`` for shifted rows ``y`` (maximum 0) of a map with a closed threshold; ``extra``: one more
    shifted score per row, whose term joins the sums and whose ``p`` is left out (:func:`closed_with`)."""
    b = r.term(y)
    total = ops.row_sum(b) if extra is None else ops.row_sum(b) + r.term(extra)
    return b / total, r.tau_from_sum(total)


def small_power(r):
    """``(a, k)`` where a map's link is derived to be ``(a (z - clip))**k`` with a number ``k`` of 1 or 2, else ``None``."""
    if r.module.LINK_FORM != "power" or not r.has("link_scale"):
        return None
    k = r.link_exponent()
    return (r.link_scale(), k) if isinstance(k, (int, float)) and k in (1, 2) else None


def sort_link(ops: TensorOps, r: Routines, z):
    """``g_+(z)`` of a sort map (degree 1 or 2), or of any map with a printed link: the link where ``z > clip``,
    else 0.

    A link of the power form ``(a (z - clip))**k``, ``k`` 1 or 2, is evaluated as
    ``u = max(a (z - clip), 0)`` (``max(z, 0)`` where ``a = 1`` and ``clip = 0``), ``u`` or ``u * u``;
    other links are the printed ones.
    """
    clip = r.clip()
    power = small_power(r)
    if power is not None:
        a, k = power
        u = z if isinstance(clip, (int, float)) and clip == 0 else z - clip
        u = ops.pos_part(u if isinstance(a, (int, float)) and a == 1 else a * u)
        return u if k == 1 else u * u
    live = z > clip
    g = r.link(ops.where(live, z, clip))
    return ops.where(live & (g > 0), g, 0)


def sort_rule(ops: TensorOps, r: Routines, y, ordered: bool = False):
    """``tau - m`` for shifted rows ``y`` by the support rule on sorted scores (``ordered``: ``y`` is sorted
    in decreasing order already)."""
    ys = y if ordered else ops.sort_desc(y)
    clip = r.clip()
    # tau >= m - omega'(1): scores at most omega'(0+) - omega'(1) below the maximum never count
    reach = clip - reach_one(ops, r, ys[..., :1])
    live = ys > reach
    y0 = ops.where(live, ys, 0)
    s1 = ops.cumsum(y0)
    s2 = ops.cumsum(y0 * y0)
    k = ops.cumsum(ops.full(ys, 1.0))
    ok = live
    if r.has("discriminant"):
        ok = ok & (r.discriminant(k, s1, s2) >= 0)
    # (1, 0, 0): the always-feasible support of the largest score alone
    cand = r.tau_candidate(ops.where(ok, k, 1), ops.where(ok, s1, 0), ops.where(ok, s2, 0))
    good = ok & (ys - cand > clip) | (k == 1)
    last = ops.row_max(ops.where(good, k, 0))
    place = ops.where(last >= 1, last, 1)  # (a row with NaN: its own candidate at 1)
    t = ops.at_place(cand, place)
    # The prefix sums pick the support.  Their candidate cancels in s2 - s1**2 / k: the maximum being on the
    # support, the sum of squares is at most k + 1 times the one about the support's mean, and that many ulps are
    # lost where many scores tie far below the maximum.  Where more than CANCELLATION are, the threshold is
    # computed again from sums about the mean (tau is shift-equivariant).
    s1, s2 = ops.at_place(s1, place), ops.at_place(s2, place)
    lost = s2 > CANCELLATION * (s2 - s1 * s1 / last)
    centred = ops.on_rows(lost, _centred_candidate(ops, r), (y0, k, last, *r.params), t)
    # a discriminant at 0 to rounding may come out below it about the mean: there the prefix sums' value stays
    return ops.where(ops.isfinite(centred), centred, t)


def _centred_candidate(ops: TensorOps, r: Routines):
    """``fn(y0, k, last, *params)``: the candidate of each row's ``last`` first scores of ``y0`` (sorted in
    decreasing order; ``k`` their places, from 1) from their sums about their mean."""
    def fn(y0, k, last, *params):
        on = k <= last
        mean = ops.row_sum(ops.where(on, y0, 0)) / last
        d = ops.where(on, y0 - mean, 0)
        return mean + r.bound(params).tau_candidate(last, ops.row_sum(d), ops.row_sum(d * d))
    return fn


def support_rule(ops: TensorOps, r: Routines, y, steps: int = SUPPORT_STEPS):
    """``tau - m`` for shifted rows ``y`` of a sort map, without sorting.

    ``F(t) = sum_i g_+(y_i - t)`` is convex and decreasing for the sort maps' links
    (degree 1 or 2, ``g = (a (z - clip))**k`` with ``k >= 1``), so Newton's method
    from a lower bound of ``t*`` stays below it and converges.  At every step the
    support ``S = {y > t + clip}`` gives the candidate ``tau_S = tau_candidate(|S|,
    sum_S y, sum_S y**2)``; where the support at ``tau_S`` is ``S`` again (same
    count: both are sets of largest scores), ``F(tau_S) = 1`` on the link's rising
    branch, so ``tau_S`` is ``t*``.  The start is the larger of ``-omega'(1)`` and the
    Jensen bound ``mean(y) - omega'(1/n)`` (on rows without masked scores).  For degree 1 the Newton step is
    ``tau_S`` itself (Michelot's algorithm).  Rows still open after ``steps`` steps
    take :func:`sort_rule` (on a target that cannot sort, :func:`_support_at_root`).
    """
    power = small_power(r)
    n = y.shape[-1]
    lo = -reach_one(ops, r, y[..., :1])
    # Jensen: F(t) >= n g(mean(y) - t); -inf where a score is masked (then -omega'(1) alone)
    jensen = ops.row_sum(y) / n - r.omega_prime(lo * 0 + 1 / n)
    t = ops.where(jensen > lo, jensen, lo)
    result = lo * float("nan")
    active = ops.isfinite(lo)
    rows = (y, *r.params)  # what a row's rounds read: its scores and parameters

    def bound(rows):
        return rows[0], r.bound(rows[1:])

    if power is None:
        t, result, active = _support_generic(ops, bound, rows, t, result, active, steps)
    elif power[1] == 1:  # F is piecewise linear: the Newton step is the candidate (Michelot), exact once S repeats
        # Start from the middle of [-omega'(1), -omega'(0+)] where Jensen's bound is below it: the start need not be
        # a lower bound, since from any t with a non-empty support the first step lands on one (F is convex: its
        # tangent lies below it), and most rows start closer to t* (a round fewer on N(0, 1) rows)
        mid = (lo - r.clip()) / 2
        t = ops.where(t > mid, t, mid)

        def body(state, rows):
            y, r = bound(rows)
            t, below, result, size, active = state
            c = t + r.clip()  # the support at t: y > c
            kk, su, _ = ops.support_sums(y, c, False, 0)
            cand = r.tau_candidate(kk, su + kk * c, 0 * kk)
            exact = kk == size
            result = ops.where(active & exact, cand, result)
            # t rises from the lower bound ``below`` (-omega'(1) before the first round, t itself after it); a row
            # that has stopped keeps its result, and its t and size are read no more
            t = ops.clamp_min(cand, below)
            size = kk
            active = active & ops.not_(exact)
            return (t, t, result, size, active), active

        t, _, result, _, active = ops.repeat_rows(steps + 1, body, (t, lo, result, lo * 0 + (n + 1), active), active,
                                                  rows)
    else:
        def body(state, rows):
            y, r = bound(rows)
            t, result, active = state
            a, clip = r.link_scale(), r.clip()
            c = t + clip
            kk, su, su2 = ops.support_sums(y, c, True, 0)
            s1 = su + kk * c
            s2 = su2 + 2 * c * su + kk * c * c  # sum_S y**2 with y = u + c
            cand = r.tau_candidate(kk, s1, s2)
            exact = (r.discriminant(kk, s1, s2) >= 0) & (ops.support_sums(y, cand + clip, False, 0)[0] == kk)
            # Newton on F = a**2 sum u**2, F' = -2 a**2 sum u, from below (F is convex)
            nxt = t + (a * a * su2 - 1) / (2 * a * a * su)
            result = ops.where(active & exact, cand, result)
            t = ops.where(active & (nxt > t), nxt, t)
            active = active & ops.not_(exact)
            return (t, result, active), active

        t, result, active = ops.repeat_rows(steps, body, (t, result, active), active, rows)
    if ops.sorts:
        return ops.on_rows(active, lambda *rows: sort_rule(ops, bound(rows)[1], rows[0]), rows, result)
    return ops.on_rows(active, lambda *rows: _support_at_root(ops, *bound(rows)), rows, result)


def _support_at_root(ops, y, r):
    """``tau - m`` of a sort map for a target that cannot sort: the candidate ``tau_S`` of the support ``S`` at
    :func:`root_rule`'s threshold (exact where the root rule finds the support; its threshold where ``S`` is empty
    or gives no real candidate)."""
    _, t = root_rule(ops, r, y)
    clip = r.clip()
    pos = y - t > clip
    k = ops.row_sum(ops.float_(pos))
    s1 = ops.row_sum(ops.where(pos, y, 0))
    s2 = ops.row_sum(ops.where(pos, y * y, 0))
    ok = k > 0
    if r.has("discriminant"):
        ok = ok & (r.discriminant(k, s1, s2) >= 0)
    return ops.where(ok, r.tau_candidate(ops.where(ok, k, 1), s1, s2), t)


def _support_generic(ops, bound, rows, t, result, active, steps):
    """:func:`support_rule`'s rounds with the printed link (a sort map whose link is not of the power form): ``(t, result, active)``."""
    def body(state, rows):
        y, r = bound(rows)
        t, result, active = state
        clip = r.clip()
        z = y - t
        pos = z > clip
        k = ops.row_sum(ops.float_(pos))
        s1 = ops.row_sum(ops.where(pos, y, 0))
        if r.has("discriminant"):
            live = y > -float("inf")
            s2 = ops.row_sum(ops.where(pos & live, y * y, 0))
            valid = r.discriminant(k, s1, s2) >= 0
        else:
            s2, valid = 0 * s1, k > 0
        cand = r.tau_candidate(k, s1, s2)
        exact = valid & (ops.row_sum(ops.float_(y - cand > clip)) == k)
        safe = ops.where(pos, z, -t)
        f = ops.row_sum(ops.where(pos, r.link(safe), 0))
        df = ops.row_sum(ops.where(pos, r.link_dtau(safe), 0))
        nxt = t - (f - 1) / df  # Newton on F from below (F is convex)
        result = ops.where(active & exact, cand, result)
        t = ops.where(active & (nxt > t), nxt, t)
        active = active & ops.not_(exact)
        return (t, result, active), active

    return ops.repeat_rows(steps, body, (t, result, active), active, rows)


def _power_parts(ops, r, y):
    """For a link of the power form: ``(a, k, b = a y, reach)`` with ``reach(q) = q**(1/k) / a``."""
    a = r.link_scale()
    k = ops.number(r.link_exponent())
    return a, k, a * y, (lambda q: ops.exp(ops.log(q) / k) / a)


def root_rule(ops: TensorOps, r: Routines, y, steps: int = ROOT_STEPS):
    """``(p, tau - m)`` for shifted rows ``y`` by safeguarded Halley on ``h(t) = omega'(F(t)) - omega'(1)``.

    A Halley (else Newton) step is taken only where it lands in the bracket and
    moves less than half as far as the step before last, otherwise the bracket is
    bisected (the safeguard of Numerical Recipes' ``rtsafe``,
    :func:`numeric.newton.safeguarded_point`: no cycles across the kinks where a
    score enters or leaves the support); a row stops where
    ``|F - 1| <= 4 eps``, where the step would change ``F`` by less than that, or
    where its bracket is a few ulps wide.  ``p = g_+(y - t) / F(t)``; a row whose
    ``F`` jumps across 1 at a kink (a link with an infinite slope at ``omega'(0+)``)
    takes the combination of ``p`` at the two ends of its final bracket with sum 1:
    every score away from the kink moves by a few ulps between the two ends, so the
    scores at the kink receive the mass the others leave.

    A link of the power form with ``k >= 1`` on every row takes :func:`_power_newton`
    instead (plain Newton from a lower bound: no bracket, fewer operations a step), and
    a link with no closed form :func:`~numeric.core.kkt.kkt_rule` (no inversion of the link inside the
    threshold's iteration).  A sparse map solved by Halley (a printed link, or the power form with ``k < 1``)
    solves its long rows on their largest scores first (:func:`~numeric.core.screen.screened`).
    """
    power = r.module.LINK_FORM == "power" and r.has("link_scale")
    if not power and not r.has("link"):
        return kkt_rule(ops, r, y)
    k = ops.number(r.link_exponent()) if power else None
    if power and not (isinstance(k, numbers.Real) and k < 1):
        return _root_whole(ops, r, y, steps)

    def whole(r, y):
        return _root_whole(ops, r, y, steps)

    return screened(ops, r, y, whole, whole, whole_next=True)


def _root_whole(ops, r: Routines, y, steps: int):
    """:func:`root_rule` on whole rows of a map with a link (printed, or of the power form)."""
    clip = r.clip()
    n = y.shape[-1]
    count = ops.full(y[..., :1], row_length(y))  # (masked scores make -reach(1/n) a looser upper end, still one)
    power = r.module.LINK_FORM == "power" and r.has("link_scale")
    if not power:
        lo, hi = lower_end(ops, r, y), -r.omega_prime(1 / count)
        start = _halley_start(ops, r, y, count, lo, hi)
        return root_halley(ops, r, y, steps, None, lo, hi, start)
    # the variable t = tau - m + clip = -c / a, c = p_max**(1/k): base = max(a y - a t, 0), p = base**k
    a, k, b, reach = _power_parts(ops, r, y)
    far = _far_rows(ops, k, y)
    if far is True:
        return _power_log_rule(ops, r, y)
    lo = -reach(ops.full(count, 1.0))
    hi = -reach(1 / count)
    # g_+ convex (k >= 1): F(t) >= n g(mean(y) - t) (Jensen), so t >= mean(y) - reach(1/n)
    jensen = ops.row_sum(y) / n - reach(1 / count)  # -inf where a score is masked
    jensen = ops.where(jensen < hi, jensen, hi)
    start = ops.where(jensen > lo, jensen, lo)  # a lower bound of t* where k >= 1

    def newton():
        p, t = _power_newton(ops, a, k, b, start, steps)
        return p, t - clip  # tau - m = t - clip

    if isinstance(k, numbers.Real) and far is False:  # a number: the rule is chosen here
        if k >= 1:
            return newton()
        if short(n):  # (a sparse map's candidates: sorted at little cost; JAX's sort of 512 rows of 64 takes 2.8 ms)
            p, t = _power_piece_newton(ops, a, k, y, lo, steps)
            return p, t - clip
        # from the KKT rule's start (in this variable, shifted by the clip): on 512 N(0, 1) rows of 64, most of
        # p**3's rows take 4 or 5 Halley rounds from it where they took 8 to 10 from lo (a row whose root lies just
        # past a score's kink, where the link's slope is infinite, still takes up to 17, against 23 from lo)
        return root_halley(ops, r, y, steps, (a, k, b), lo, hi, threshold_start(ops, r, y, count, lo - clip, hi - clip) + clip)
    # (a k per row: alpha-entmax's Halley from lo, which on whole rows of 1024 costs less than the start's rounds)
    p, t = ops.branch(k < 1, lambda: root_halley(ops, r, y, steps, (a, k, b), ops.where(k >= 1, start, lo), hi), newton)

    def log_rule(y, *params):
        return ops.cat(*_power_log_rule(ops, r.bound(params), y))

    return uncat(ops.on_rows(far, log_rule, (y, *r.params), ops.cat(p, t)), n)


def _halley_start(ops, r: Routines, y, count, lo, hi):
    """Where :func:`_root_whole`'s Halley starts, ``t = tau - m`` in ``[lo, hi]``: the KKT rule's start
    (:func:`~numeric.core.kkt.threshold_start`; on 256 N(0, 1) rows of 64 scores, 4 rounds for
    ``cosh(p) - 1`` where it took 10 from ``lo``), and ``lo`` itself on the rows with one score above ``lo + omega'(0+)``, where
    ``lo = -omega'(1)`` is the root (``F(lo) = g(omega'(1)) = 1``).  There ``F`` may be flat to rounding across
    many ulps of ``t`` (``p**100``: ``g' = 1e-4`` at ``omega'(1)``), and a solve from elsewhere would stop anywhere
    among them."""
    start = threshold_start(ops, r, y, count, lo, hi)
    lone = ops.row_sum(ops.float_(y > lo + r.clip())) <= 1
    exact = lone & ops.isfinite(reach_one(ops, r, lo))  # (not where omega's domain ends at 1: lo is a bound there)
    return ops.where(exact, lo, start)


def _far_rows(ops, k, y):
    """Where a power-form link's ``c = p_max**(1/k)`` may leave the normal range on the rows ``y`` of ``n``
    scores: ``(1/n)**(1/k) < tiny / eps`` (large alpha on long rows).  A Python bool for a number ``k``,
    else ``(R, 1)`` booleans; those rows take :func:`_power_log_rule`."""
    limit = ops.log_tiny - log_of(ops, ops.eps)
    n = row_length(y)
    if isinstance(k, numbers.Real) and isinstance(n, float):
        return bool(-math.log(n) / k < limit)
    return -log_of(ops, n) / (k + ops.full(y[..., :1], 0.0)) < limit


def _power_log_rule(ops, r: Routines, y, steps: int = LOG_STEPS):
    """``(p, tau - m)`` for shifted rows ``y`` of a power-form map whose ``c = p_max**(1/k)`` may underflow.

    The link is ``g_+(z) = max(a (z - clip), 0)**k``.  With ``r = a / c`` the ratios
    ``q_i = p_i / p_max = max(1 + r y_i, 0)**k`` lie in ``[0, 1]`` and ``p_max = c**k``, so
    ``F = sum p = exp(k (log(a) - rho)) Q(rho)``, ``Q = sum q``, in ``rho = log r``, which is
    representable where ``c`` and ``r`` are not: ``r y_i = -exp(rho + log(-y_i))``.  ``F``
    decreases in ``rho`` from at least 1 at ``log(a)`` (``p_max = 1``) to at most 1 at
    ``log(a) + log(count) / k`` (``p_max = 1/count``); bisection keeps ``F(lo) >= 1 >= F(hi)``
    until the bracket is a few ulps wide.  ``p`` is the combination of ``p(lo)`` and ``p(hi)``
    with sum 1 (as :func:`~numeric.core.halley.root_halley` at a kink, where ``F`` jumps across 1 between
    neighbouring floats), divided by its sum.  ``tau - m = -exp(-rho) - clip`` (``-c / a``
    underflows to 0 in the far rows; :func:`at_threshold` solves them again).
    """
    k = r.link_exponent()
    a = r.link_scale()
    log_a = math.log(a) if isinstance(a, (int, float)) else ops.log(a)
    count = ops.row_sum(ops.float_(ops.isfinite(y)))
    log_y = ops.log(-y)  # -inf at the maximum, +inf where masked (p = 0: 1 - inf < 0)

    def values(rho, log_y, log_a, k):
        """``p_i = exp(k (log(u_i) + log(a) - rho))``, ``u_i = max(1 - exp(rho + log(-y_i)), 0)``."""
        return ops.exp(k * (ops.log(ops.pos_part(1 - ops.exp(log_y + rho))) + log_a - rho))

    def body(state, rows):
        lo, hi = state
        mid = 0.5 * (lo + hi)
        above = ops.row_sum(values(mid, *rows)) >= 1  # F(mid) >= 1: the root is at larger rho
        lo, hi = ops.where(above, mid, lo), ops.where(above, hi, mid)
        return (lo, hi), hi - lo > 4 * ops.eps * abs(hi)

    lo = log_a + ops.full(count, 0.0)
    hi = log_a + ops.log(count) / k
    lo, hi = ops.repeat_rows(steps, body, (lo, hi), ops.full(count, True), (log_y, log_a, k))
    p_lo, p_hi = values(lo, log_y, log_a, k), values(hi, log_y, log_a, k)
    f_lo, f_hi = ops.row_sum(p_lo), ops.row_sum(p_hi)
    ok = f_lo > f_hi
    lam = ops.where(ok, (f_lo - 1) / ops.where(ok, f_lo - f_hi, 1), 0)
    p = p_lo + lam * (p_hi - p_lo)
    return p / ops.row_sum(p), -ops.exp(-lo) - r.clip()


def _power_piece_newton(ops, a, k, y, lo, steps):
    """``(p, t*)`` for a link of the power form with ``0 < k < 1`` (a number) on short rows ``y`` (a sparse map's
    candidates, :func:`~numeric.core.screen.short`): the kinks of ``F`` that bracket the root, then Newton in the
    weight of the smallest score on the support.

    ``F(t) = sum (a (y_i - t))_+**k`` has a kink at each score, where its slope is infinite (``k < 1``): Halley
    on ``F`` near one moves by tiny steps and leans on its bisections (``p**3`` on the 16 candidates of 512
    N(0, 1) rows of 64: up to 18 rounds).  So the scores are sorted, ``s_1 >= s_2 >= ...``, and a binary search
    over them finds the largest ``L`` with ``F(s_L) <= 1`` (``F(s_j)`` grows with ``j``; ``F(s_1) = 0``): the
    root lies in ``[s_(L+1), s_L)`` (``[lo, s_L)`` where no score follows), where the support is the first ``L``
    scores.  On that piece ``t = s_L - e / a`` and ``base_i = d_i + e``, ``d_i = a (s_i - s_L) >= 0``; in
    ``q = e**k``, the weight of ``s_L``, ``G(q) = sum (d_i + q**(1/k))**k`` is smooth, increasing and convex (each
    term's derivative is ``(e / base_i)**(1 - k)``, which grows with ``q``, and the sum of those is
    ``e**(1 - k) sum p_i / base_i``), so Newton from the piece's left end (its largest ``q``, ``G >= 1``)
    falls to the root without overshooting and with no bracket (on those rows, at most 7 rounds).  ``p`` is
    evaluated from ``d_i + e`` on the first ``L`` scores alone (``s_L``'s own weight and its ties' are ``q``, not
    a difference of two near thresholds, and ``e`` may underflow where ``k`` is small: alpha-entmax at large
    alpha), the slope as ``sum (e / base_i)**(1 - k)`` in logs (``s_L``'s term 1).  A row stops where
    ``G - 1 <= 4 eps`` (as Halley's ``|F - 1|``: at ``(4 + log2(n)) eps``, the rounding of ``F``'s sum, float32 on
    rows of 4096 at alpha = 4 and 6 was 24 and 29 ulps from float64 in L1, 3 and 2 at ``4 eps``) or its step is
    below ``4 eps q``.
    """
    n = y.shape[-1]
    s = ops.sort_desc(y)
    place = ops.cumsum(ops.full(s, 1.0)) - 1  # 0, 1, ... along each row

    def at(j):  # s_j per row (-inf past the live scores)
        return ops.row_max(ops.where(place == j, s, -math.inf))

    last = ops.full(y[..., :1], 0.0)
    reach = 1 << (n - 1).bit_length() - 1 if n > 1 else 0
    while reach:
        j = last + reach
        sj = at(j)
        live = ops.isfinite(sj)
        f = ops.row_sum(power_link(ops, k, a * (y - ops.where(live, sj, 0)))[0])
        last = ops.where(live & (f <= 1), j, last)
        reach //= 2
    top, below = at(last), at(last + 1)
    end = ops.where(below > lo, below, lo)  # the piece's left end, F >= 1
    q = ops.exp(k * ops.log(ops.clamp_min(a * (top - end), ops.tiny)))
    tol = 4 * ops.eps

    def body(state, rows):
        q = state[0]
        d, top, a = rows  # d = a (y - top) on the first L scores, -inf elsewhere
        # (found again from d each round: a traced target stores a boolean operand of the loop one byte at a time)
        on, inside = d >= 0, d > 0
        d = ops.where(inside, d, 1)
        log_e = ops.log(q) / k
        # log(base): s_L's (and its ties') is log(e), which e = q**(1/k) may underflow
        log_base = ops.where(inside, ops.log(d + ops.exp(log_e)), log_e)
        p = ops.where(on, ops.exp(k * log_base), 0)
        g = ops.row_sum(p)
        step = (g - 1) / ops.row_sum(ops.where(on, ops.exp((1 - k) * (log_e - log_base)), 0))
        going = (g - 1 > tol) & (step > 4 * ops.eps * q)
        return (ops.where(going, ops.clamp_min(q - step, ops.tiny), q), p, g, top - ops.exp(log_e) / a), going

    state = (q, ops.full(y, 0.0), ops.full(q, 1.0), ops.full(q, 0.0))
    rows = (ops.where(y >= top, a * (y - top), -math.inf), top, a)
    _, p, g, t = ops.repeat_rows(steps, body, state, ops.full(q, True), rows, tail=True)
    return p / g, t


def _power_newton(ops, a, k, b, t, steps):
    """``(p, t*)`` for a link of the power form with ``k >= 1`` on every row: Newton on ``phi(t) = F(t)**(1/k)``.

    ``b = a y``; ``t`` is a lower bound of ``t*`` (``F(t) >= 1``).  ``phi(t) = ||(b - a t)_+||_k``
    is convex and decreasing for ``k >= 1`` (a norm, increasing on the nonnegative orthant,
    of convex functions of ``t``), so Newton's steps from the left stay left of ``t*`` and
    increase: no bracket or safeguard.  (``omega'`` is affine in ``p**(1/k)``, so this is
    Newton on :func:`root_rule`'s ``h``; a support of one score is solved in one step.)  The
    step is ``(phi - 1) / -phi' = (F - F**(1 - 1/k)) / (a S)``, ``S = sum base**(k - 1)``.
    ``base**(k - 1)`` is ``exp((k - 1) log base)``, one log and one exp per score and step
    (``p = base**(k - 1) * base``, ``S = sum p / base``), with ``base`` at least
    ``floor = tiny**(0.9 / max(k - 1, 0.9))`` under log, so that the exponent is at least
    ``0.9 log(tiny)``: no zero, infinity or subnormal number reaches log and exp (their
    slow paths; a ``base`` below ``floor`` has ``p`` below ``tiny**0.9 floor`` either way);
    ``p`` is exactly 0 off the support (``base = 0`` there).  A row stops where
    ``F - 1 <= (4 + log2(n)) eps`` (about the rounding of ``F``'s sum; ``F < 1``: past ``t*``
    by rounding) or its step is below ``4 eps |t|``, and keeps its ``t`` (evaluated again
    it stops again): the loop's last evaluation is at every row's final ``t`` and gives ``p / F``.
    """
    tol = (4 + log_of(ops, row_length(b)) / math.log(2)) * ops.eps
    tol_t = -4 * ops.eps  # t < 0
    km1 = k - 1
    # at least tiny: the exponent rounds below log(tiny) for k - 1 <= 0.9, and a subnormal floor
    # is 0 where subnormals are flushed (XLA on CPU): log(0) would give 0 * inf
    if isinstance(km1, (int, float)) and isinstance(ops.log_tiny, numbers.Real):  # (not a traced value)
        floor = max(math.exp(0.9 * ops.log_tiny / max(km1, 0.9)), ops.tiny)
    else:
        floor = ops.clamp_min(ops.exp(0.9 * ops.log_tiny / ops.clamp_min(km1, 0.9)), ops.tiny)

    def body(state, rows):
        t, _, _ = state
        a, k, b, floor = rows
        p, f, total = ops.power_sums(b, a * t, k - 1, floor)
        step = (f - ops.exp(ops.log(f) * (1 - 1 / k))) / (a * total)
        going = (f - 1 > tol) & (step > tol_t * t)
        return (ops.where(going, t + step, t), p, f), going

    t, p, f = ops.repeat_rows(steps, body, (t, ops.full(b, 0.0), ops.full(t, 1.0)), ops.full(t, True), (a, k, b, floor))
    return p / f, t
