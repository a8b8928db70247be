"""The root threshold: ``tau`` with ``sum_i g_+(s_i - tau) = 1`` by safeguarded Halley, row by row, in NumPy.

For maps with ``mod.THRESHOLD == "root"`` (the closed and sort rules are in
:mod:`numeric.threshold`).  The functions take a generated module ``mod``, a
2-D float array of scores (rows along axis 0) in which every row has at least
one finite score and no NaN (masked scores are ``-inf``), and the module's
parameter values.

Halley's method runs on ``h(tau) = omega'(F(tau)) - omega'(1)`` with
``F(tau) = sum_i g_+(s_i - tau)``.  ``h`` is exactly linear while one score
is in the support and nearly linear otherwise (for Shannon it is linear
always), where ``F - 1`` itself is strongly curved.  Steps are kept inside
the bracket ``[m - omega'(1), m - omega'(1/n)]`` (else Newton, else
bisection), the iteration starts from the same solve on the 32 largest
scores (a lower bound of ``tau``, found by partial selection in O(n); not for
power links with ``k >= 2``, alpha-entmax with alpha <= 3/2, on rows of at most
256 scores), and stops at a tolerance: ``|F - 1|`` or the step below a few
ulps.  For a sparse map only scores above that lower bound plus ``omega'(0+)``
can be in the support; when they are few, the iteration runs on them alone.
Links derived to be of the power form ``(a (z - omega'(0+)))**k`` (alpha-entmax,
``omega = p**n``; :func:`numeric.links.power_link`) evaluate ``F, F', F''`` from
one log, one exp and two divisions per score (:func:`_power_sums`) and, for
``k >= 1``, also start from the Jensen bound ``mean(s) - omega'(1/n)``.  The maps take ``p`` from
:func:`root_probabilities`, which for the power form iterates on
``c = p_max**(1/k)`` (no cancellation on wide supports), gives rows whose
``F`` jumps across 1 at a kink ``sum(p) = 1`` from the two ends of the final
bracket, and solves rows where ``c`` may underflow in float64
(:func:`_power_log_rows`).

Row sums go through :func:`numeric.rows.row_sum`; the link is
:func:`numeric.links.clipped_link` or, for the power form, its base and
:func:`numeric.links.power`.
"""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np

from .links import Power, clipped_link, power, power_link
from .rows import row_sum, scalar

__all__ = ["root_threshold", "root_probabilities", "WARM_START", "COLD_UPTO"]

#: Number of largest scores used for the warm start of the root solver.
WARM_START = 32
#: Power links with k >= 2 (alpha-entmax, alpha <= 3/2) skip the warm start on rows of at most this many scores.
COLD_UPTO = 256


def _generic_sums(mod, params):
    """``(x, t) -> (F, F', F'')`` at ``tau = t`` for rows ``x``, from the generated link and weights."""

    def sums(x, t):
        p = clipped_link(mod, x - t[:, None], params, overwrite=True)
        pos = p > 0
        safe = p + ~pos  # 1 off the support, where the weights are finite
        total = row_sum(p)
        d1 = -row_sum(mod.weight(safe, *params) * pos)  # F'
        d2 = row_sum(mod.weight_d2(safe, *params) * pos)  # F''
        return total, d1, d2

    return sums


def _power_sums(pw: Power, dtype, size: int, n: int, work: np.ndarray | None = None):
    """``(b, t) -> (F, F', F'')`` for a link of the power form, on ``b = a y`` (see :func:`numeric.links.power_link`).

    ``base = max(b - a t, 0)``, ``p = base**k``, ``F' = -a k sum(p / base)``,
    ``F'' = a**2 k (k - 1) sum(p / base**2)``: one log, one exp and two divisions per
    score (``base`` is nudged by the smallest normal number in the divisions, where
    ``p = 0`` makes ``0 / tiny = 0``).  Two scratch buffers of ``size`` scores (from
    ``work`` if given) serve every call.
    """
    a = dtype.type(pw.a)
    k = dtype.type(pw.k)
    c1 = dtype.type(pw.a * pw.k)
    c2 = dtype.type(pw.a * pw.a * pw.k * (pw.k - 1))
    tiny = dtype.type(np.finfo(dtype).tiny)
    work = np.empty(2 * size, dtype=dtype) if work is None else work
    buf, buf2 = work[:size], work[size: 2 * size]

    # for k >= 3, clipping base at the smallest normal instead of 0 leaves p = tiny**k, w ~
    # tiny**(k - 1) and g'' ~ tiny**(k - 2), all <= tiny, off the support (n tiny is far below
    # any tolerance) and spares a pass before the divisions
    nudge = k < 3
    floor = np.full(n, 0 if nudge else tiny, dtype=dtype)

    def sums(b, t):
        r, m = b.shape
        base = np.subtract(b, (a * t)[:, None], out=buf[: r * m].reshape(r, m))
        np.maximum(base, floor[:m], out=base)
        with np.errstate(under="ignore", over="ignore", divide="ignore", invalid="ignore"):
            p = buf2[: r * m].reshape(r, m)
            if k == 1:
                np.copyto(p, base)
            else:
                power(base, k, out=p)
            total = row_sum(p)
            if nudge:
                base += tiny
            p /= base  # w / (a k)
            d1 = -c1 * row_sum(p)
            p /= base
            d2 = c2 * row_sum(p)
        return total, d1, d2

    return sums


def _halley(mod, x, tau, lo, hi, params, maxiter, tol, sums=None, spare=None, *, scale=1, bracket=False):
    """Safeguarded Halley on h(tau) = omega'(F(tau)) - omega'(1) for every row; returns (tau, iterations).

    A Halley (else Newton) step is taken only if it lands strictly inside the
    bracket and is at most half the step before last (as in rtsafe); otherwise
    the bracket is bisected.  This rules out cycles across the kinks where a
    score enters or leaves the support.  ``sums(x_rows, t)`` gives ``(F, F', F'')``
    (default: from the generated link and weights); rows that converge are
    dropped from ``x`` (copied together, into the two flat buffers ``spare`` of
    ``x.size`` scores if given) before the next step.

    A row also stops when its bracket ``[lo, hi]`` is a few ulps of ``scale + |t|``
    wide (``scale=0``: relative to ``t`` alone, for a variable whose size carries
    no offset).  Where ``F`` has an infinite slope at a kink (a link with
    ``g'(omega'(0+)) = inf``, e.g. alpha-entmax for alpha > 2), ``F`` may jump
    across 1 between two neighbouring floats: such a row stops on its bracket
    with ``F`` far from 1.  ``bracket=True`` also returns, per row, the final
    bracket ``lo``, ``hi`` (``F(lo) >= 1 >= F(hi)``) and whether the row
    stopped without ``F`` settling at 1 (on its bracket or at ``maxiter``).
    """
    dtype = x.dtype
    sums = sums or _generic_sums(mod, params)
    one = scalar(mod.omega_prime(np.ones((), dtype), *params), dtype)
    small = 4 * np.finfo(dtype).eps
    out = tau.copy()
    out_lo, out_hi = lo.copy(), hi.copy()
    unsettled = np.zeros(x.shape[0], dtype=bool)
    iterations = np.zeros(x.shape[0], dtype=np.int64)
    # state of the rows still iterating, compacted together with their scores xa
    rows = np.arange(x.shape[0])
    xa, t, lo, hi = x, tau.copy(), lo.copy(), hi.copy()
    step = hi - lo  # last step taken
    step_old = step.copy()  # the one before
    moving = np.ones(rows.size, dtype=bool)
    for it in range(1, maxiter + 1):
        if rows.size == 0:
            break
        total, d1, d2 = sums(xa, t)
        lo = np.where(total > 1, t, lo)
        hi = np.where(total < 1, t, hi)
        # omega'' and omega''' at F grow like F**(alpha - 2) for alpha-entmax: at large alpha and F far
        # from 1 the products below overflow; a step that is not finite is replaced by bisection
        with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
            o2 = mod.omega_second(total, *params)
            o3 = mod.omega_third(total, *params)
            h = mod.omega_prime(total, *params) - one
            h1 = o2 * d1
            h2 = o3 * d1 * d1 + o2 * d2
            denom = 2 * h1 * h1 - h * h2
            halley = t - 2 * h * h1 / denom
            newton = t - h / h1
        inside = lambda v: (v > lo) & (v < hi) & np.isfinite(v)  # noqa: E731
        new = np.where((denom > 0) & inside(halley), halley, newton)
        # converged: F within tol of 1, or the step would change F by less than tol (possibly
        # below the resolution of t), or no room is left in the bracket.  The row has settled
        # at F = 1 where F is within tol or Newton's step (not Halley's, which is tiny near a
        # kink where F' is unbounded and h'' huge) is representable and changes F by <= tol;
        # a step below the resolution of t leaves F - 1 = F' (new - t), which may exceed tol
        exact = np.abs(total - 1) <= tol
        with np.errstate(invalid="ignore", over="ignore"):
            settled = exact | ((newton != t) & (np.abs((newton - t) * d1) <= tol))
        done = exact | (np.abs((new - t) * d1) <= tol) | (hi - lo <= small * (scale + np.abs(t)))
        fast = done | (inside(new) & (np.abs(new - t) <= 0.5 * np.abs(step_old)))
        new = np.where(fast & np.isfinite(new), new, 0.5 * (lo + hi))
        # a row that stops on the width of its bracket keeps a point of it (Newton's step from a
        # kink may land far outside)
        new = np.where(done & ~exact, np.clip(new, lo, hi), new)
        step_old = step
        step = new - t
        t = np.where(exact | ~moving, t, new)
        iterations[rows[moving]] = it
        finished = done & moving
        if finished.any():
            out[rows[finished]] = t[finished]
            out_lo[rows[finished]] = lo[finished]
            out_hi[rows[finished]] = hi[finished]
            unsettled[rows[finished]] = ~settled[finished]
            moving &= ~done
            count = int(moving.sum())
            # converged rows are carried along (not updated) until a third of the rows
            # held have converged: copying the rest costs less than iterating on them
            if 3 * count <= 2 * rows.size:
                keep = np.flatnonzero(moving)  # np.take along axis 0: 3x faster than a boolean index
                rows, t, lo, hi, step, step_old = (np.take(a, keep, axis=0) for a in (rows, t, lo, hi, step, step_old))
                # the scores go to one of two buffers allocated once: fresh arrays of a few MB cost
                # a page fault per 4 KiB page on every call
                if spare is None:
                    spare = [np.empty(x.size, dtype=dtype), np.empty(x.size, dtype=dtype)]
                target = spare[1] if np.may_share_memory(xa, spare[0]) else spare[0]
                xa = np.take(xa, keep, axis=0, out=target[: count * x.shape[1]].reshape(count, x.shape[1]))
                moving = np.ones(count, dtype=bool)
            if count == 0:
                break
    left = rows[moving]  # rows that ran out of iterations
    out[left], out_lo[left], out_hi[left], unsettled[left] = t[moving], lo[moving], hi[moving], True
    if bracket:
        return out, iterations, out_lo, out_hi, unsettled
    return out, iterations


def _root_solve(mod: ModuleType, x: np.ndarray, params: tuple, maxiter: int, shifted: bool, base_variable: bool = True):
    """The root solve behind :func:`root_threshold` and :func:`root_probabilities`.

    Returns ``(t, iterations, lo, hi, unsettled, m, offset)``.  ``t`` is the solver's
    variable, ``tau - m + offset``: ``offset = 0`` in general; with ``base_variable``,
    ``offset = omega'(0+)`` for a link of the power form (:func:`numeric.links.power_link`),
    whose link in that variable is ``g_+ = max(a (y - t), 0)**k`` with ``y = s - m``:
    the largest score's base ``c = p_max**(1/k) = -a t`` is the variable itself,
    with no ``-a omega'(0+)`` (``1/alpha`` for alpha-entmax) beside it to cancel
    against when ``c`` is small (wide supports, steep links, where ``tau - m`` is
    within ``c/a`` of ``-omega'(0+)``).  That variable resolves ``c`` to ``eps c``;
    ``tau - m`` itself resolves ``c`` to ``eps a |tau - m|``, finer where ``c`` is near 1
    (``root_threshold``, which returns ``tau``, iterates on ``tau - m``).  ``lo``, ``hi``, ``unsettled``: see
    :func:`_halley` (``bracket=True``).
    """
    dtype = x.dtype
    n = x.shape[-1]
    tol = 4 * np.finfo(dtype).eps
    m = np.zeros(x.shape[0], dtype=dtype) if shifted else x.max(axis=-1)
    if not shifted:
        x = x - m[:, None]  # work relative to the row maximum, so tau needs no digits for m
    # scores are shifted (no NaN, no +inf): count the finite ones only where some are masked
    count = row_sum(np.isfinite(x).astype(dtype)) if x.size and np.isneginf(x.min()) else np.full(x.shape[0], n, dtype)
    pw = power_link(mod, params)
    clip = mod.clip(*params)
    if pw is None:
        scores, sums, spare, scale, offset = (lambda a: a), None, None, 1, dtype.type(0)

        def reach(q):  # omega'(q) - offset: -reach(1) and -reach(1/count) bracket t
            return mod.omega_prime(q, *params)

        edge_of = lambda t: t + clip  # noqa: E731  (scores with y > edge_of(t) are in the support at t)
    else:  # iterate on b = a y (- a omega'(0+) in the variable tau - m; see _power_sums)
        a = dtype.type(pw.a)
        inv_k = dtype.type(1 / pw.k)
        inv = dtype.type(0 if base_variable else -pw.a * clip)
        offset = dtype.type(clip if base_variable else 0)
        scale = 0 if base_variable else 1  # t = -c / a has no offset: resolve it relative to t

        def reach(q):  # omega'(q) - offset; omega'(q) - omega'(0+) = q**(1/k) / a, no cancellation
            if not base_variable:
                return mod.omega_prime(q, *params)
            return np.asarray(np.asarray(q, dtype=dtype) ** inv_k / a, dtype=dtype)

        edge_of = (lambda t: t) if base_variable else (lambda t: t + clip)  # noqa: E731

        # one allocation for b, the two buffers of the sums and the two of the compaction: fresh
        # arrays of a few MB fault in 4 KiB pages (thousands a call); one large one is mostly
        # huge pages (NumPy advises them from 4 MiB)
        size = x.size
        work = np.empty(5 * size, dtype=dtype)

        def scores(y):
            b = np.multiply(y, a, out=work[: y.size].reshape(y.shape)) if y.size == size else y * a
            if inv:
                b += inv
            return b

        sums = _power_sums(pw, np.dtype(dtype), size, n, work[size: 3 * size])
        spare = [work[3 * size: 4 * size], work[4 * size:]]
    lo = np.full(x.shape[0], -reach(np.ones((), dtype)), dtype=dtype)
    hi = (-reach(1 / count)).astype(dtype)
    # power links with k >= 2 (alpha-entmax with alpha <= 3/2) on rows of at most 256: supports
    # are wide, so the 32 largest scores give a loose bound, and h is smooth (linear at alpha -> 1):
    # starting cold takes at most 5 steps (measured) and saves the selection and the warm start's
    # own 3 to 5 steps.  Nearer k = 1, F is piecewise linear with narrow supports: the warm start
    # is near exact.
    cold = pw is not None and pw.k >= 2 and n <= COLD_UPTO
    if pw is not None and pw.k >= 1:
        # g_+ is convex for k >= 1 (alpha <= 2), so F(tau) >= n g(mean(s) - tau) (Jensen): tau >= mean(s) -
        # omega'(1/n), a lower bound close to tau on rows of near-equal scores (-inf where masked)
        with np.errstate(invalid="ignore", over="ignore"):
            jensen = row_sum(x) / dtype.type(n) - reach(1 / np.asarray(n, dtype))
        lo = np.fmax(lo, np.fmin(jensen, hi)).astype(dtype, copy=False)
    if n > WARM_START and not cold:
        # for a sparse map on long rows, select the quarter of largest scores once and take the
        # 32 for the warm start from them (one selection over whole rows instead of two)
        quarter = n // 4 if np.isfinite(clip) and n >= 8 * WARM_START else 0
        pool = -np.partition(-x, quarter - 1, axis=-1)[:, :quarter] if quarter else x
        top = -np.partition(-pool, WARM_START - 1, axis=-1)[:, :WARM_START]
        top_count = row_sum(np.isfinite(top).astype(dtype))
        top_hi = (-reach(1 / top_count)).astype(dtype)
        # F(start) >= F_top(start) = 1 where the warm start settled: a lower bound of tau.  A row of
        # the top scores whose F jumps across 1 at a kink stops with F_top(t) possibly below 1:
        # there the lower end of its final bracket (F_top >= 1) is the bound
        start, _, start_lo, _, jumped = _halley(mod, scores(top), lo, lo, top_hi, params, maxiter, tol, sums,
                                                scale=scale, bracket=True)
        lo = np.maximum(lo, np.minimum(np.where(jumped, start_lo, start), hi))
        # tau >= lo, so only scores with s - lo > omega'(0+) can enter the support; they are
        # the largest ones of their row: iterate on the K largest of every row
        if np.isfinite(clip):
            edge = edge_of(lo)
            if quarter and (pool[:, quarter - 1] <= edge).all():  # (the quarter-th largest of each row)
                x, n = pool, quarter  # every candidate is among the quarter selected
            size = int(row_sum((x > edge[:, None]).astype(dtype)).max())
            if 4 * size < n:
                size = max(size, WARM_START)
                x = -np.partition(-x, size - 1, axis=-1)[:, :size]
    t, iterations, lo, hi, unsettled = _halley(mod, scores(x), lo, lo, hi, params, maxiter, tol, sums, spare,
                                               scale=scale, bracket=True)
    return t, iterations, lo, hi, unsettled, m, offset


def root_threshold(mod: ModuleType, x: np.ndarray, params: tuple, *, maxiter: int = 100, return_iterations: bool = False,
                   shifted: bool = False):
    """``tau`` by safeguarded Halley on ``omega'(F(tau)) = omega'(1)`` (see the module docstring).

    With ``return_iterations=True`` also returns the number of full-row
    iterations each row took (the warm start on 32 scores is not counted).
    For the probabilities use :func:`root_probabilities`: ``tau`` alone does not
    carry the digits a wide alpha-entmax support needs (``g(s - tau)`` cancels in
    its base), nor the bracket of a row whose ``F`` jumps across 1.
    """
    t, iterations, _, _, _, m, _ = _root_solve(mod, x, params, maxiter, shifted, base_variable=False)
    tau = m + t
    return (tau, iterations) if return_iterations else tau


def _root_link(mod, y, t, params, pw, out):
    """``g_+(y - t)`` into ``out`` (which may be ``y``) in the variable of :func:`_root_solve`."""
    if pw is None:
        z = np.subtract(y, t[:, None], out=out)
        p = clipped_link(mod, z, params, overwrite=True)
        if p is not out:
            np.copyto(out, p)
        return out
    dtype = y.dtype
    a = dtype.type(pw.a)
    base = np.multiply(y, a, out=out)  # the same rounding as the solver's b - a t
    base -= (a * t)[:, None]
    np.fmax(base, np.zeros(base.shape[-1:], dtype=dtype), out=base)
    return base if pw.k == 1 else power(base, dtype.type(pw.k))


def root_probabilities(mod: ModuleType, y: np.ndarray, params: tuple, out: np.ndarray, *, maxiter: int = 100) -> np.ndarray:
    """``p = g_+(y - t)`` into ``out`` (which may be ``y``) for rows ``y = s - max(s)``; returns ``tau - max(s)``.

    ``t`` comes from the root solver; ``p`` is then divided by its row sum,
    which is 1 to the solver's tolerance.  A row whose ``F`` jumps across 1
    between neighbouring floats of ``t`` (a score entering the support where
    the link has an infinite slope, ``g = base**k`` with ``k < 1``, alpha-entmax
    for alpha > 2: the jump is up to ``ulp**k``, 0.02 at alpha = 10 in float64)
    cannot meet ``sum(p) = 1`` at any ``t``.  There ``p`` is the combination of
    ``p(lo)`` and ``p(hi)`` at the two ends of the final bracket with sum 1,
    ``p = p(lo) + lambda (p(hi) - p(lo))``, ``lambda = (F(lo) - 1) / (F(lo) - F(hi))``:
    every score away from the kink moves by a few ulps between ``lo`` and ``hi``,
    so the scores at the kink receive the mass the others leave, as the exact
    solution gives them.

    For a link of the power form (alpha-entmax, ``omega = p**n``), the probabilities
    are computed from ``c = p_max**(1/k)`` (see :func:`_root_solve`).  Rows where
    ``c`` may leave the dtype's normal range (a lower bound ``(1/n)**(1/k)`` below
    ``tiny / eps``: large alpha on long rows, e.g. constant rows) are solved in
    float64 if they are float32, and by :func:`_power_log_rows` if they are float64.
    """
    dtype = y.dtype
    pw = power_link(mod, params)
    if pw is not None and y.size:
        count = row_sum(np.isfinite(y).astype(np.float64)) if np.isneginf(y.min()) else np.full(y.shape[0], y.shape[1], np.float64)
        with np.errstate(under="ignore"):
            floor = np.exp(-np.log(count) / pw.k)  # (1/n)**(1/k), in float64
        info = np.finfo(dtype)
        far = floor < info.tiny / info.eps
        if far.any():
            rows = np.flatnonzero(far)
            near = np.flatnonzero(~far)
            t = np.empty(y.shape[0], dtype=dtype)
            if near.size:
                sub = y[near]
                t[near] = root_probabilities(mod, sub, params, sub, maxiter=maxiter)
            far_y = y[rows].astype(np.float64)
            if dtype == np.float64:
                far_t = _power_log_rows(far_y, pw, float(mod.clip(*params)), far_y)
            else:
                far_t = root_probabilities(mod, far_y, tuple(np.float64(v) for v in params), far_y, maxiter=maxiter)
            if near.size:
                out[near] = sub
            out[rows] = far_y
            t[rows] = far_t
            return t
    t, _, lo, hi, unsettled, _, offset = _root_solve(mod, y, params, maxiter, True)
    rows = np.flatnonzero(unsettled)
    kept = y[rows]  # copied before out (maybe y) is written
    p = _root_link(mod, y, t, params, pw, out)
    total = row_sum(p)
    np.divide(p, total[:, None], out=out)
    if rows.size:
        f_t = total[rows]
        # beyond the solver's tolerance, the division would spread the missing mass over every
        # score in proportion, where it belongs to the scores whose p moves fastest with t
        off = np.abs(f_t - 1) > 4 * np.finfo(dtype).eps
        rows, kept, f_t = rows[off], kept[off], f_t[off]
    if rows.size:
        _combine_ends(mod, kept, t[rows], f_t, lo[rows], hi[rows], params, pw)
        out[rows] = kept
    return t - offset


def _combine_ends(mod, y, t, f_t, lo, hi, params, pw):
    """``p`` with sum 1 into ``y`` for rows where ``F(t) = f_t`` is not 1 (see :func:`root_probabilities`).

    The bracket is ``t`` and its neighbouring float towards the root where ``F``
    crosses 1 between them, else the solver's ``[lo, hi]``.  Only the scores that
    can be positive somewhere in the bracket (above ``lo + omega'(0+)``) are
    evaluated, as a flat list: on some inputs these rows are many (13% of float32
    rows of alpha-entmax at alpha = 4) while their supports are small.
    """
    rows = y.shape[0]
    # F decreases in t: below 1 the root lies at smaller t
    nxt = np.nextafter(t, np.where(f_t < 1, -np.inf, np.inf).astype(t.dtype))
    clip = 0 if pw is not None else mod.clip(*params)  # p > 0 where y - t > clip (power form: y > t)
    r_idx, c_idx = np.nonzero(y > (np.minimum(lo, nxt) + clip)[:, None])
    flat = y[r_idx, c_idx][:, None]

    def at(ends):
        """p at t = ends (per row) on the flat scores, and F per row."""
        p = _root_link(mod, flat, ends[r_idx], params, pw, np.empty_like(flat))[:, 0]
        return p, np.bincount(r_idx, weights=p, minlength=rows)

    _, f_nxt = at(nxt)
    cross = (f_t - 1) * (f_nxt - 1) <= 0
    p_a, f_a = at(np.where(cross, np.minimum(t, nxt), lo))
    p_b, f_b = at(np.where(cross, np.maximum(t, nxt), hi))
    ok = (f_a >= 1) & (f_b <= 1) & (f_a > f_b)
    # p_a + lam (p_b - p_a): between the two ends score by score, with sum f_a - lam (f_a - f_b) = 1;
    # rows without a valid bracket (not met in practice): p_a divided by its sum
    lam = np.where(ok, (f_a - 1) / np.where(ok, f_a - f_b, 1), 0)
    p = np.where(ok[r_idx], p_a + lam[r_idx] * (p_b - p_a), p_a / np.where(f_a > 0, f_a, 1)[r_idx])
    y[...] = 0
    y[r_idx, c_idx] = p


def _power_log_rows(y: np.ndarray, pw: Power, clip: float, out: np.ndarray, maxiter: int = 200) -> np.ndarray:
    """A power-form map on float64 rows ``y = s - max(s)`` whose ``c = p_max**(1/k)`` may underflow.

    ``p`` goes into ``out`` (which may be ``y``); returns ``tau - max(s)``.  The link
    is ``g_+ = max(a (y - t), 0)**k`` (:func:`numeric.links.power_link`; alpha-entmax: ``a = alpha - 1``,
    ``k = 1/(alpha - 1)``).  With ``r = a / c`` the ratios ``q_i = p_i / p_max =
    max(1 + r y_i, 0)**k`` lie in ``[0, 1]`` and ``p_max = c**k = 1 / Q``, ``Q = sum_i q_i``,
    so ``rho = log r`` solves ``phi(rho) = rho - log(a) - log(Q(rho)) / k = 0`` (``phi``
    increases; ``Q`` runs from ``count`` down to 1 over ``[log(a), log(a) + log(count) / k]``).
    ``r y_i = -exp(rho + log(-y_i))`` never forms ``r``, which overflows where ``c``
    underflows.  Bisection on ``rho``; where ``F = sum_i p_i = exp(-k phi)`` jumps across 1
    the two ends are combined as in :func:`root_probabilities`.
    """
    k = pw.k
    rows = y.shape[0]
    with np.errstate(divide="ignore"):
        logy = np.log(-y)  # -inf at the maximum, +inf where masked
    count = row_sum(np.isfinite(y).astype(np.float64))
    log_a = math.log(pw.a)
    lo = np.full(rows, log_a)
    hi = log_a + np.log(count) / k

    def unnormalised(rho, into):
        # p_i = p_max q_i = exp(k (log(a) - rho)) q_i, with no underflow of c on the way
        u = np.add(logy, rho[:, None], out=into)
        with np.errstate(over="ignore", under="ignore"):
            np.exp(u, out=u)
            np.subtract(1, u, out=u)
        np.fmax(u, 0, out=u)
        if k != 1:
            power(u, k)
        u *= np.exp(k * (log_a - rho))[:, None]
        return u

    buf = np.empty_like(y)
    eps = np.finfo(np.float64).eps
    for _ in range(maxiter):
        mid = 0.5 * (lo + hi)
        f = row_sum(unnormalised(mid, buf))
        lo = np.where(f >= 1, mid, lo)  # F >= 1 where phi <= 0
        hi = np.where(f >= 1, hi, mid)
        if (hi - lo <= 4 * eps * np.abs(hi)).all():
            break
    p_lo = unnormalised(lo, buf)
    p_hi = unnormalised(hi, out)
    f_lo, f_hi = row_sum(p_lo), row_sum(p_hi)
    ok = f_lo > f_hi
    lam = np.where(ok, (f_lo - 1) / np.where(ok, f_lo - f_hi, 1), 0)
    p_hi -= p_lo
    p_hi *= lam[:, None]
    p_hi += p_lo
    np.divide(p_hi, row_sum(p_hi)[:, None], out=out)
    # t = -c / a = -exp(-rho) in the variable of _root_solve, and tau - m = t - omega'(0+)
    return -np.exp(-lo) - clip
