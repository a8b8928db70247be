"""``halley.halley_threshold`` as the fused Triton attention runs it (traced: ``kept_threshold``): a row's
largest scores solved with the rest of the row given as a term ``rest(t)``, from a start inside the bracket,
on the scores as they are (``peak``: the row's maximum), some rows held where they start."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numeric.core import halley
from numeric.newton import invert_link
from numeric.numpy.ops import ops_for

from .conftest import PARAMS, numpy_routines, reference

#: a dense and a sparse built-in, a power link, entmax with a parameter, and the two user maps with no
#: closed-form link (one dense, one sparse)
NAMES = ["softmax", "sparsemax", "entmax15", "entmax", "shannon_gini", "gini_log1p"]


def routines(name):
    try:
        module = importlib.import_module(f"numeric._generated.{name}")
    except ImportError:
        module = importlib.import_module(name)
    return numpy_routines(module, tuple(PARAMS.get(name, {}).values()))


def weights(r, y, t):
    """``(g_+(y - t), support)`` for thresholds ``t`` of shape (rows, 1), ``g`` evaluated at each row's largest
    ``z`` off the support."""
    z = y - t
    live = z > r.clip()
    safe = np.where(live, z, z.max(-1, keepdims=True))
    g = r.link(safe) if r.has("link") else invert_link(ops_for(y.dtype), safe, r.omega_prime,
                                                                     r.omega_second)
    live &= g > 0
    return np.where(live, g, 0.0), live


def sums(r, y, t):
    """F, F' and F'' at ``t`` of the scores ``y``, term by term: the rest's truth."""
    p, live = weights(r, y, t)
    safe = np.where(live, p, 1.0)
    return (p.sum(-1, keepdims=True), -np.where(live, r.weight(safe), 0).sum(-1, keepdims=True),
            np.where(live, r.weight_d2(safe), 0).sum(-1, keepdims=True))


@pytest.mark.parametrize("name", NAMES)
@given(x=st.lists(st.floats(-20, 20), min_size=2, max_size=16), keep=st.integers(1, 16), start=st.floats(0, 1),
       offset=st.sampled_from([0.0, 1e3]))
def test_kept_scores_and_the_rest_give_the_rows_threshold(name, x, keep, start, offset):
    """The threshold of the kept scores, with the others' exact sums as the rest, is the row's: its ``p`` is
    the mpmath reference's, from any start in the bracket, on scores not shifted to their maximum.  A row
    that is not going keeps its start."""
    r = routines(name)
    x = np.array(x)[None] + offset
    order = np.argsort(-x[0], kind="stable")
    kept, others = x[:, order[:keep]], x[:, order[keep:]]
    m = x.max(-1, keepdims=True)
    lo, hi = m - r.omega_prime(np.ones_like(m)), m - r.omega_prime(np.full_like(m, 1 / x.shape[-1]))
    t0 = lo + start * (hi - lo)
    two = [np.concatenate([v, v]) for v in (kept, others, lo, hi, t0, m)]
    kept, others, lo, hi, t0, m = two
    rest = (lambda t: sums(r, others, t)) if others.size else None
    with np.errstate(all="ignore"):
        t, *_ = halley.halley_threshold(ops_for(x.dtype), r, kept, lo, hi, start=t0, peak=m, rest=rest,
                                              going=np.array([[True], [False]]))
        p, _ = weights(r, x, t[:1])
    np.testing.assert_allclose(p[0] / p.sum(), reference(name, x[0]), rtol=0, atol=1e-12)
    assert t[1, 0] == t0[1, 0]


def test_a_round_takes_a_step_below_the_resolution():
    """A row whose step to its point is below the resolution of s - tau is done and takes that step; a longer
    step is taken and the row goes on; rows not going keep tau.  (The fused attention's passes once stopped one
    step of a few ulps short, which left F up to sum w times the resolution off 1: docs/benchmarks.md.)"""
    ops = ops_for(np.float32)
    n = 16
    tau = np.full((n, 1), 3.9409907, np.float32)
    m0 = np.full((n, 1), 3.11371, np.float32)
    w = np.full((n, 1), 2.8, np.float32)
    scale = 1 + np.abs(m0)
    resolution = float(np.finfo(np.float32).eps * (scale[0, 0] + tau[0, 0]))
    # rows 0-7: a step of a few ulps (below the resolution); 8-11: 100 resolutions; 12-15 not going
    step = np.array([2.4e-7, -2.4e-7, 4.8e-7, -4.8e-7, 6e-7, 2.4e-7, 4.8e-7, -2.4e-7] + [100 * resolution] * 4
                    + [4.8e-7] * 4, np.float32)[:, None]
    point = tau + step
    f = 1 + w * step  # F(tau) with slope -w: the point is Newton's
    going = np.arange(n)[:, None] < 12
    lo, hi = halley.narrow_bracket(ops, tau, tau - 1, tau + 1, going, f)
    new, _, _, still, exact, took = halley.threshold_round(ops, tau, lo, hi, hi - lo, hi - lo, going, f, -w,
                                                                 point, w > 0, scale, True)
    assert not exact.any() and took[:12].all()
    assert not still[:8].any() and still[8:12].all() and not still[12:].any()
    np.testing.assert_array_equal(new[:12], point[:12])
    np.testing.assert_array_equal(new[12:], tau[12:])
    assert np.abs(new[:8] - tau[:8]).max() <= resolution


@given(c=st.lists(st.floats(-50, 50), min_size=1, max_size=12), d=st.floats(0.01, 20), slope=st.floats(0, 5),
       below=st.floats(0, 30))
def test_michelot_rises_to_the_root_of_its_sum(c, d, slope, below):
    """Michelot's rounds (``halley._michelot_round``) from a lower bound of the root of ``sum (c_i - s)_+ - b s =
    d``: every round's point is a lower bound, and they reach the root (within one round more than the terms),
    which bisection finds; ``halley.michelot`` (``b = 0``) stops there."""
    c = np.array(c)[None]
    b = np.array([[slope]])

    def lhs(s):
        return np.maximum(c - s, 0).sum(-1, keepdims=True) - b * s

    # the root by bisection of the decreasing left side: at least d at lo (below every c, where it is linear),
    # at most 0 < d at hi (above every c and 0)
    lo, hi = min(c.min(), (c.sum() - d) / (c.shape[1] + slope)) - 1, max(c.max(), 0) + 1
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if lhs(np.array([[mid]]))[0, 0] >= d else (lo, mid)
    root = lo
    assert abs(lhs(np.array([[root]]))[0, 0] - d) <= 1e-9 * (1 + abs(d) + abs(c).sum())
    ops = ops_for(np.float64)
    s = np.array([[root - below]])
    for _ in range(c.shape[1] + 1):
        s, _ = halley._michelot_round(ops, c, np.array([[d]]), s, b)
        assert s[0, 0] <= root + 1e-9 * (1 + abs(root))
    np.testing.assert_allclose(s[0, 0], root, rtol=1e-10, atol=1e-10)
    if slope == 0:
        s = halley.michelot(ops, c, np.array([[d]]), np.array([[root - below]]), np.array([[np.inf]]),
                            c.shape[1] + 1)
        np.testing.assert_allclose(s[0, 0], root, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("steps", [None, 33])
def test_a_round_from_the_right_takes_the_entering_scores(steps, monkeypatch):
    """Where ``F < 1`` and Newton's point crosses scores' entry points, the round's point is the root of ``F``'s
    model with those scores on the link's tangent at their kinks (halley._across_kinks).  Sparsemax's link is
    linear (``w = 1``): the model is ``F`` itself, so from ``hi`` on rows of 32 N(0, 1) scores the first round's
    point is a lower bound of the threshold sorting finds, and at it where Michelot's rounds may run until the
    support stops changing (``steps`` 33; Halley alone landed on it on 7 of the 64 rows)."""
    r = routines("sparsemax")
    assert float(r.weight(np.zeros(1))[0]) == 1.0
    x = np.random.default_rng(4).standard_normal((64, 32))
    y = x - x.max(-1, keepdims=True)
    z = np.sort(y, -1)[:, ::-1]
    cums = (np.cumsum(z, -1) - 1) / np.arange(1, 33)
    want = cums[np.arange(64), (z > cums).sum(-1) - 1][:, None]
    ops = ops_for(np.float64)
    lo, hi = -np.ones((64, 1)), np.full((64, 1), -1 / 32)
    first = []
    round_ = halley.threshold_round

    def spy(ops, t, lo, hi, step, step_old, active, f, slope, point, *rest):
        if not first:
            first.extend([point, t - (f - 1) / slope])
        return round_(ops, t, lo, hi, step, step_old, active, f, slope, point, *rest)

    monkeypatch.setattr(halley, "threshold_round", spy)
    if steps is not None:
        monkeypatch.setattr(halley, "PIECE_STEPS", steps)
    with np.errstate(all="ignore"):
        t, *_ = halley.halley_threshold(ops, r, y, lo, hi, start=hi)
    point, newton = first
    tol = 1e-14
    assert (newton <= point + tol).all() and (point <= want + tol).all()
    if steps is not None:
        np.testing.assert_allclose(point, want, rtol=0, atol=tol)
    np.testing.assert_allclose(t, want, rtol=0, atol=tol)
