"""The threshold of a map whose link has no closed form: Newton on the KKT system in ``(p, tau)`` (:func:`kkt_rule`),
with the safeguarded Halley solve (:func:`numeric.core.halley.root_halley`) for the rows it leaves.
"""

from __future__ import annotations

import math

from ..newton import safeguarded_point
from .derivatives import weights
from .halley import ROOT_STEPS, lower_end, michelot, root_halley
from .ops import Routines, TensorOps, row_length, uncat
from .screen import CANDIDATES, screened, short

__all__ = ["KKT_STEPS", "KKT_FREE_STEPS", "KKT_LOG_STEP", "KKT_ELASTIC_CEIL", "LINEAR_START_STEPS", "HALLEY_START_STEPS",
           "HALLEY_START_STEPS_LONG",
           "KKT_BLOCK", "kkt_rule", "threshold_start"]

#: Iteration budget of :func:`kkt_rule` before its remaining rows take the safeguarded Halley solve.
KKT_STEPS = 40
#: Steps of :func:`kkt_rule` that need only land in the bracket; later ones must also halve the step before last.
KKT_FREE_STEPS = 8
#: The largest step of :func:`kkt_rule` in ``log p`` (``p`` grows at most by ``e`` a step there).
KKT_LOG_STEP = 1.0
#: The largest factor by which :func:`_kkt_newton`'s step in ``p**beta`` multiplies ``p**beta`` (a sparse map's;
#: :func:`_elastic_step`).
KKT_ELASTIC_CEIL = 2.0**20
#: Rounds of Michelot's fixed point for a sparse map's start in :func:`kkt_rule` (``_linear_start``).
LINEAR_START_STEPS = 6
#: ... for the start of a threshold's Halley solve (:func:`threshold_start`) on short rows
#: (:func:`~numeric.core.screen.short`: a sparse map's candidates), where they cost more than the Halley rounds they
#: save (then a lower bound of the linear link's threshold): on the 16 candidates of 512 N(0, 1) rows of 64, NumPy,
#: ``p**2/2 + p**4/4`` 3.3x -> 2.9x entmax15, ``p**2/2 + p**3/3`` 2.8x -> 2.4x.  The KKT solve keeps
#: :data:`LINEAR_START_STEPS`: from a rougher start its rounds on wide rows exceed their bound.
HALLEY_START_STEPS = 2
#: ... on longer rows (whole rows, as JAX solves rows of fewer than 1024 on the CPU, and a traced row of any
#: length): on 512 rows of 64 the most Halley rounds of a row after 2, 4 and 6 are 7, 4 and 4 for ``cosh(p) - 1``, 8,
#: 7 and 8 for ``p**2/2 + p**4/4``.
HALLEY_START_STEPS_LONG = 4
#: The most scores in one block of rows of :func:`kkt_rule` on whole rows (1 MiB of float32), where a target
#: solves in blocks (:meth:`~numeric.core.ops.TensorOps.in_blocks`): each block pays a round's fixed costs, and a larger one
#: leaves the cache (512 x 1024 float32, one thread: torch forward 15.5 ms in blocks of 2**18 scores, 20 ms
#: of 2**16, 25 ms of 2**15, 20 ms of 2**19).
KKT_BLOCK = 1 << 18


def kkt_rule(ops: TensorOps, r: Routines, y, steps: int = KKT_STEPS, candidates: int = CANDIDATES):
    """``(p, tau - m)`` for shifted rows ``y`` of a map whose link has no closed form: Newton on the KKT system.

    Every score takes part in every round of a dense map (``omega'(0+) = -inf``): its rows are solved in
    blocks of at most :data:`KKT_BLOCK` scores (:meth:`~numeric.core.ops.TensorOps.in_blocks`), whose temporaries stay in
    the cache.  A sparse map's long rows are solved on their ``candidates + 1`` largest scores first
    (:func:`~numeric.core.screen.screened`); a row whose candidates' rounds do not settle goes on to more of its
    scores, so that only the whole rows' solve holds the fallback, safeguarded Halley with the link inverted
    inside (a traced target's graph held one for each size of candidates: ``torch.compile`` of
    ``p**2/2 + p*log(1 + p)``, forward and backward, on rows of 1024 took 188 s with an empty inductor cache, 106 s
    with the one fallback).
    """
    def solve(r, y):  # (a row that does not settle goes on to more of its scores: its threshold NaN)
        return _kkt_newton(ops, r, y, steps, fallback=False)

    def whole(r, y):
        def block(y, *params):
            return ops.cat(*_kkt_newton(ops, r.bound(params), y, steps))

        return uncat(ops.in_blocks(KKT_BLOCK, block, (y, *r.params)), y.shape[-1])

    return screened(ops, r, y, solve, whole, candidates, wide_start=True)


def _kkt_newton(ops: TensorOps, r: Routines, y, steps: int, fallback: bool = True):
    """:func:`kkt_rule` on whole rows: Newton in ``(p, tau)`` together (``fallback``: the rows that do not settle
    solved by Halley, else their threshold NaN).

    The unknowns are the threshold ``t = tau - m`` and every ``p_i`` together:
    ``omega'(p_i) = y_i - t`` on the support ``y_i - t > omega'(0+)`` (``p_i = 0`` off it)
    and ``omega'(sum p) = omega'(1)`` (the constraint ``sum p = 1`` in the form whose
    Newton step is exact for Shannon's ``log``, as :func:`~numeric.core.rules.root_rule`'s ``h``).  With
    ``r_i = omega'(p_i) - y_i + t``, ``w_i = 1/omega''(p_i)`` and ``P = sum p`` the step is

        ``dt = -(D + sum w r) / sum w``, ``D = (omega'(1) - omega'(P)) / omega''(P)``,
        ``dp_i = -w_i (r_i + dt)``:

    one evaluation of ``omega'``, ``omega'''`` and of the weight per score and step, and
    no inversion of the link (an iteration inside the iteration).

    * Start: a dense map's link is replaced by the exponential through ``(omega'(1/n), 1/n)``
      with the link's slope there, whose threshold has a closed form (a log-sum-exp); ``t``
      starts there (clamped into the bracket) and ``p`` at that link's values.  For Shannon
      the start is exact, for maps near it (``p log p + p**3``) a few steps off.  A sparse
      map's is replaced by a linear link, sparsemax's form (:func:`_linear_start`).
    * ``p`` stays in the domain.  A dense map's score steps in ``p`` or in ``log p``, whichever
      linearisation of ``omega'`` curves less there (``|omega'''| <= |omega''/p + omega'''|``,
      that is ``omega''' p w >= -1/2``: ``log p`` for Shannon), in ``log p`` wherever
      ``p + dp <= 0``, and there up by a factor of at most ``e`` (:data:`KKT_LOG_STEP`).
      A sparse map's steps by Newton's in ``v = p**beta``, ``beta = p omega''(p) / (omega'(p) -
      omega'(0+))`` the elasticity of ``omega' - omega'(0+)`` at ``p``, in which ``omega'`` is
      linear wherever it is a power of ``p`` (:func:`_elastic_step`; Gini: ``beta = 1``, a step
      in ``p``; alpha-entmax: ``alpha - 1``, exact near ``p = 0``, where a step in ``p`` or
      ``log p`` converges only linearly), towards ``omega'(p) = z - dt``.  With the linear
      start, on rows of 8 to 1024 scores of spreads 0.1 to 30, ``p**4 + p**2/2`` and
      ``(p**1.5 - p)/0.75 + p**3`` take at most 12 rounds (23 and 45 with the exponential start
      and steps in ``p`` or ``log p``).  A score entering the support (``p = 0``) starts from
      ``w(0) (z - omega'(0+))`` where ``w(0)`` is finite and positive, else from the
      start's exponential (a sparse map's then takes one step in ``p**beta``); a score whose ``p`` underflowed to 0 stays there where ``g(z)``
      is below the smallest normal number (``z <= omega'(tiny)``).
    * ``t`` stays in the bracket ``[-omega'(1), -omega'(1/n)]``, which shrinks where the
      first-order value ``F(t) ~ P - sum w r`` is farther from 1 than twice its own
      correction; a step leaving the bracket, or after :data:`KKT_FREE_STEPS` steps one
      not halving the step before last, bisects it (``rtsafe``'s safeguard, :func:`numeric.newton.safeguarded_point`).
    * A row stops where its step is within rounding: ``t`` moves by at most
      ``4 eps (1 + |t| + sum w e / sum w)`` and every ``p_i`` by at most ``16 eps (p_i + w_i e_i) + tiny``,
      with ``e_i = |z_i| + |t| + |omega'(p_i)|`` the scale of the rounding of ``r_i``, or where the
      round's next step, taken at its end, leaves only a remainder below that rounding
      (:func:`_final_step`: one round fewer per row); ``p`` is then
      taken to sum 1 by a first-order step in ``t`` (:func:`_to_sum_one`).  Rows that do
      not (the budget of ``steps`` runs out, or the bracket closes on a kink of ``F``)
      are solved by :func:`~numeric.core.halley.root_halley` with the link inverted by
      :func:`numeric.newton.invert_link`.
    """
    n = y.shape[-1]
    live = ops.isfinite(y)
    count = ops.row_sum(ops.float_(live))
    one = r.omega_prime(ops.full(count, 1.0))
    lo = -one
    hi = -r.omega_prime(1 / count)
    clip = r.clip()
    # the support is z > clip; where omega'(0+) = -inf that is every live score, whose p stays positive
    sparse = not isinstance(clip, (int, float)) or math.isfinite(clip)
    if sparse:  # the exponential through (omega'(1), 1) and (omega'(1/n), 1/n), for scores entering the support
        anchor, at = one, ops.full(count, 0.0)
        span = one + hi
        c = ops.where(span > 0, ops.log(count) / ops.where(span > 0, span, 1), 0)
        p, t = _linear_start(ops, r, y, live, count, clip)
    else:
        c, anchor, at, e, t = _exponential_start(ops, r, y, live, count, lo, hi)
        # p = exp(c (y - t - anchor) + at), at most 1: the exponentials above times a factor per row
        p = e * ops.exp(at - c * (t + anchor))
        p = ops.where(p > 1, 1, p)
    t = ops.where(t < lo, lo, ops.where(t > hi, hi, t))
    # a score at 0 enters where g(z) is a normal number, z > omega'(tiny) (a dense map's p underflows below it)
    edge = r.omega_prime(ops.full(count, ops.tiny))
    rows = (y, c, anchor, at, one, edge, *r.params)  # what a row's steps read
    tol_p = 16 * ops.eps
    tol_t = 4 * ops.eps
    width = hi - lo

    def body(state, rows):
        y, c, anchor, at, one, edge, *params = rows
        rr = r.bound(params)
        t, p, lo, hi, step, step_old, k, settled, active = state
        z = y - t
        if sparse:
            p = ops.where(z > rr.clip(), p, 0)
        need = (p == 0) & (z > edge)

        def enter():  # (need found again from p and z: a traced branch's boolean operands cost more than that)
            need = (p == 0) & (z > edge)
            w0 = rr.weight(ops.full(t, 0.0))
            e = c * (z - anchor) + at
            start = ops.where(ops.isfinite(w0) & (w0 > 0), w0 * (z - rr.clip()), ops.exp(ops.where(e < 0, e, 0)))
            if sparse:  # one step of Newton's on omega'(p) = z from the start (see _elastic_step)
                on = need & (start > 0)
                q = ops.where(on, start, 1)
                start = ops.where(on, _elastic_step(ops, rr, q, q, rr.omega_prime(q), rr.weight(q), z), start)
            return ops.where(need, start, p)

        p = ops.branch(need, enter, lambda: p)
        zero = p == 0

        # (a dense map's p is 0 only where it underflowed)
        ps, zs, w = _on_support(ops, rr, p, z) if sparse else ops.rare(zero, lambda: _on_support(ops, rr, p, z),
                                                                        lambda: (p, z, rr.weight(p)))
        o1 = rr.omega_prime(ps)
        res = o1 - zs
        wr = w * res
        corr = ops.row_sum(wr)
        total = ops.row_sum(p)
        f = total - corr  # F(t) to first order
        sure = abs(f - 1) > 2 * ops.row_sum(abs(wr))
        lo = ops.where(sure & (f > 1), t, lo)
        hi = ops.where(sure & (f < 1), t, hi)
        safe = ops.where(total > 0, total, 1)
        sum_w = ops.row_sum(w)
        # Newton on omega'(F) = omega'(1) or on F = 1: the longer step where F > 1, the shorter
        # where F < 1 (the larger dt either way; see the docstring)
        dt = -((one - rr.omega_prime(safe)) / rr.omega_second(safe) + corr) / sum_w
        plain = (f - 1) / sum_w
        dt = ops.where(dt > plain, dt, plain)
        new, _ = safeguarded_point(ops, t, lo, hi, step_old, t + dt, ops.isfinite(t + dt), k < KKT_FREE_STEPS)
        dt = new - t
        dp = (-dt - res) * w  # 0 off the support
        if sparse:
            p_new = _elastic_step(ops, rr, p, ps, o1, w, zs - dt)
        else:
            du = dp / ps

            def log_step():
                return p * ops.exp(ops.at_most(du, KKT_LOG_STEP))

            ahead = p + dp
            in_p = (rr.omega_third(ps) * ps * w >= -0.5) & (ahead > 0)

            def mixed():
                return ops.rare(in_p, lambda: ops.where(in_p, ahead, log_step()), log_step)

            p_new = ops.rare(ops.not_(in_p), mixed, lambda: ahead)
        # steps within the rounding of the residuals: eps (|z| + |omega'(p)|) in each r_i
        scale = abs(zs) + abs(o1) + abs(t)  # the scale of res's rounding
        noise = w * scale
        small_t = abs(dt) <= tol_t * (1 + abs(t) + ops.row_sum(noise) / sum_w)
        # (tiny: subnormal p carry few digits)
        now = ops.rare(small_t, lambda: small_t & (ops.row_max(abs(dp) - tol_p * (ps + noise)) <= ops.tiny), lambda: small_t)
        # a row whose next step is Newton's in p to within rounding takes it and stops (_final_step)
        more = active & ops.not_(now)

        def final():
            last, q, s = _final_step(ops, rr, y, p_new, new, scale, edge, sparse)
            last = more & last
            return last, ops.where(last, q, p_new), ops.where(last, s, new)

        last, p_new, new = ops.rare(more, final, lambda: (more, p_new, new))
        now = now | last
        # a row that stopped keeps its state (the rounds may go on over every row)
        going = active & ops.not_(now) & (hi - lo > tol_t * (1 + abs(new)))
        keep = lambda a, b: ops.where(active, a, b)  # noqa: E731
        p_new = ops.rare(ops.not_(active), lambda: keep(p_new, state[1]), lambda: p_new)
        return (keep(new, t), p_new, keep(lo, state[2]), keep(hi, state[3]), keep(dt, step),
                keep(step, step_old), k + 1, keep(now, settled), going), going

    true = ops.full(count, True)
    state = (t, p, lo, hi, width, width, ops.full(count, 0.0), ops.not_(true), true)
    t, p, _, _, _, _, _, settled, _ = ops.repeat_rows(steps, body, state, true, rows, tail=True)
    p = ops.where(live & (y - t > clip) if sparse else live, p, 0)
    total = ops.row_sum(p)
    # (rows off 1 by more than rounding: the others take the division alone)
    p = ops.on_rows(abs(total - 1) > 16 * ops.eps, lambda p, *params: _to_sum_one(ops, r.bound(params), p),
                    (p, *r.params), p / total)

    if not fallback:
        return p, ops.where(settled, t, math.nan)
    return uncat(ops.rare_rows(ops.not_(settled), _halley_rows, r, rows, ops.cat(p, t)), n)


def _halley_rows(ops, r: Routines, y, c, anchor, at, one, edge, *params):
    """:func:`_kkt_newton`'s fallback on the rows that did not settle: ``p`` and ``t`` side by side, by
    :func:`~numeric.core.halley.root_halley` with the link inverted."""
    rr = r.bound(params)
    size = ops.full(y[..., :1], row_length(y))
    q, s = root_halley(ops, rr, y, ROOT_STEPS, None, lower_end(ops, rr, y), -rr.omega_prime(1 / size))
    return ops.cat(q, s)


def _on_support(ops, r: Routines, p, z):
    """``(ps, zs, w)``: ``p``, ``z`` and ``weight(p)`` on the support (``p > 0``); off it ``p`` reads as 1, ``z`` as 0
    and the weight is 0."""
    sup = p > 0
    ps = ops.where(sup, p, 1)
    return ps, ops.where(sup, z, 0), ops.where(sup, r.weight(ps), 0)


def _final_step(ops, r: Routines, y, p, t, scale, edge, sparse: bool):
    """``(last, p', t')``: :func:`_kkt_newton`'s next step from ``(p, t)`` taken in ``p`` without safeguards, and
    per row whether it is the last one, its result within rounding of the solution.

    The step is Newton's, ``dt = (sum p - sum w r - 1) / sum w`` and ``dp_i = -w_i (r_i + dt)``, with
    ``r_i = omega'(p_i) - y_i + t`` and ``w_i = 1/omega''(p_i)`` (``sum p' = 1`` to rounding).  After it each
    equation is left with the linearisation's remainder, ``omega'''(xi) dp_i**2 / 2``: a row's step is its last
    where that, with ``omega'''`` at ``p_i``, is at most half a rounding of its residual, ``eps scale_i``
    (``scale = |y - t| + |t| + |omega'(p)|``, the round's: the scale of the rounding, which its step changes
    by ``|dt|`` and ``|d omega'(p)|``), where no ``p_i`` moves by more than an eighth of itself (so that ``xi``
    is near ``p_i``) and no score enters the support: a sparse map's scores that left it at ``t`` are dropped
    (``p_i = 0``), and every score off it must stay there at ``t + dt``.  Its next step would then be within the
    rounding that :func:`_kkt_newton`'s stopping test allows.
    """
    z = y - t
    if sparse:  # a score that left the support (z <= omega'(0+)) is dropped: the step solves the rest
        p = ops.where(z > r.clip(), p, 0)
    off = ops.not_(p > 0)
    ps, zs, w = _on_support(ops, r, p, z) if sparse else ops.rare(off, lambda: _on_support(ops, r, p, z),
                                                                   lambda: (p, z, r.weight(p)))
    res = r.omega_prime(ps) - zs  # (weight 0 off the support)
    sum_w = ops.row_sum(w)
    some = sum_w > 0
    dt = (ops.row_sum(p) - ops.row_sum(w * res) - 1) / ops.where(some, sum_w, 1)
    dp = -w * (res + dt)
    fine = (abs(r.omega_third(ps)) * (dp * dp) <= ops.eps * scale) & (abs(dp) <= 0.125 * ps)
    if sparse:  # every score off the support stays off it at t + dt
        crossing = off & (z - dt > r.clip())
    else:
        crossing = ops.rare(off, lambda: off & (z > edge), lambda: off)
    bad = ops.float_(ops.not_(fine) | crossing)
    return some & (ops.row_max(bad) <= 0), p + dp, t + dt


def _to_sum_one(ops, r: Routines, p):
    """``p`` moved to sum 1 by the threshold's first-order step, ``p + w (1 - P) / sum w`` (``w = weight(p)`` on the
    support, ``P = sum p``), then divided by its sum (the rounding left).

    The step puts the sum's error where ``p`` is least determined by its own equation ``omega'(p_i) = z_i - t``:
    at a kink, a score just inside the support with a flat ``omega'`` (``p**12 + p**13``: ``w`` of ``p = 0.07``
    is 1e8 times that of ``p = 0.5``) stops within its wide rounding, and dividing by the sum would spread its
    error over every score.  A row the step would take off the support (a ``p`` at most 0) is only divided.
    (:func:`_kkt_newton` takes the step on the rows whose sum is off 1 by more than rounding, and divides the others.)
    """
    w = weights(ops, r, p)
    total = ops.row_sum(p)
    sum_w = ops.row_sum(w)
    q = p + w * ops.where(sum_w > 0, (1 - total) / ops.where(sum_w > 0, sum_w, 1), 0)
    off = ops.row_sum(ops.float_((p > 0) & ops.not_(q > 0))) > 0
    q = ops.where(off, p, q)
    return q / ops.row_sum(q)


def _elastic_step(ops, r: Routines, p, ps, o1, w, z):
    """``p`` after one Newton step on ``omega'(p) = z`` in ``v = p**beta``, ``beta = p omega''(p) / (omega'(p) - omega'(0+))``
    the elasticity of ``omega' - omega'(0+)`` at ``p`` (see :func:`_kkt_newton`).

    In ``v`` the derivative of ``omega'`` is ``(omega'(p) - omega'(0+)) / v``, so the step multiplies ``v`` by
    ``ratio = (z - omega'(0+)) / (omega'(p) - omega'(0+))`` and ``p`` by ``ratio**(1/beta)``, with
    ``1/beta = w (omega'(p) - omega'(0+)) / p``.  ``ratio`` is kept in ``[tiny, KKT_ELASTIC_CEIL]``: a score
    whose ``z`` falls to ``omega'(0+)`` goes to 0 (it leaves the support, and enters again where the next
    ``t`` puts it above), one just above it falls as far as Newton's step says (a floor of a fixed
    factor made such rows converge linearly), and where ``omega'(p) - omega'(0+)`` rounds to 0 (``p`` within
    rounding of the support's edge: ``p**(alpha-1)`` below ``eps``) ``1/beta`` is 0 and ``p`` stays.  ``ps`` is ``p`` where ``p > 0`` and 1 elsewhere,
    ``o1 = omega'(ps)`` and ``w = 1 / omega''(ps)``, 0 off the support, where ``p`` stays 0.
    """
    above = o1 - r.clip()
    ratio = ops.at_most(ops.clamp_min((z - r.clip()) / above, ops.tiny), KKT_ELASTIC_CEIL)  # (NaN: the ceiling)
    return p * ops.exp(w * above / ps * ops.log(ratio))


def threshold_start(ops, r: Routines, y, count, lo, hi):
    """``t = tau - m`` to start a threshold's solve from, in ``[lo, hi]``, for shifted rows ``y`` of ``count`` live
    scores (``(rows, 1)``): :func:`kkt_rule`'s, the threshold of a link with a closed-form threshold near the map's
    (both, and the one the row's ``clip`` asks for, where that is a value: a traced kernel that serves sparse and
    dense maps, whose module says ``SPARSE = None``).

    A sparse map's is the linear link's (:func:`_linear_start`, after :data:`HALLEY_START_STEPS` rounds of
    Michelot's fixed point on short rows, :data:`HALLEY_START_STEPS_LONG` on others: that threshold or a lower
    bound of it), a dense map's the exponential's (:func:`_exponential_start`).  The root rule's Halley on a
    printed link starts there too (on 256 N(0, 1) rows of 64 scores, 4 rounds for ``cosh(p) - 1`` where it took 10 from ``lo``; ``-log(p)``, 3 where it took 5).
    """
    steps = HALLEY_START_STEPS if short(y.shape[-1]) else HALLEY_START_STEPS_LONG
    live = ops.isfinite(y)
    clip = r.clip()
    sparse = math.isfinite(clip) if isinstance(clip, (int, float)) else r.module.SPARSE
    if sparse is None:  # (clip a value: a traced kernel serving sparse and dense maps, or a family's per row)
        finite = ops.isfinite(clip)
        t = ops.where(finite, _linear_start(ops, r, y, live, count, ops.where(finite, clip, 0), steps)[1],
                      _exponential_start(ops, r, y, live, count, lo, hi)[-1])
    elif sparse:
        t = _linear_start(ops, r, y, live, count, clip, steps)[1]
    else:
        t = _exponential_start(ops, r, y, live, count, lo, hi)[-1]
    return ops.where(t < lo, lo, ops.where(t > hi, hi, t))


def _exponential_start(ops, r: Routines, y, live, count, lo, hi):
    """A dense map's start for :func:`_kkt_newton`: ``(c, anchor, at, e, t)``, the exponential link
    ``exp(c (z - anchor) + at)`` through ``(omega'(1/n), 1/n)`` with the link's slope there, ``1 / (p omega''(p))``,
    ``e = exp(c y)`` on the live scores, and its threshold ``t``, a log-sum-exp (``lo`` where ``c`` is not a
    positive number; ``hi = -omega'(1/n)``)."""
    anchor, at = -hi, -ops.log(count)
    c = count * r.weight(1 / count)
    c = ops.where(ops.isfinite(c) & (c > 0), c, 0)
    e = ops.exp(ops.rare(ops.not_(live), lambda: ops.where(live, c * y, float("-inf")), lambda: c * y))
    t = ops.where(c > 0, (ops.log(ops.row_sum(e)) + at) / ops.where(c > 0, c, 1) - anchor, lo)
    return c, anchor, at, e, t


def _linear_start(ops, r: Routines, y, live, count, clip, steps: int = LINEAR_START_STEPS):
    """A sparse map's start for :func:`_kkt_newton`: ``(p, t)`` of the linear link through ``(omega'(0+), 0)`` and
    ``(omega'(1/2), 1/2)``, ``p_i = a (y_i - clip - t)_+``, whose threshold is Michelot's fixed point.

    From every live score in the support, ``t <- (sum_S (y_i - clip) - 1/a) / |S|`` over the scores
    ``S`` above the last ``t`` rises to the linear link's threshold, and stops there (a support that
    no longer shrinks); at most ``steps`` rounds, a start from below it after those.
    Scores above ``t`` hold the support (the row's maximum always does), so ``|S| >= 1``.
    """
    half = ops.full(count, 0.5)
    a = half / (r.omega_prime(half) - clip)
    ys = ops.where(live, y - clip, float("-inf"))
    t = michelot(ops, ys, 1 / a, (ops.row_sum(ops.where(live, ys, 0)) - 1 / a) / count, count, steps)
    return a * ops.pos_part(ys - t), t
