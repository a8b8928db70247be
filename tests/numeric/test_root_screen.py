"""The root rule screens a sparse map's long rows (numeric.core.screen): a printed link solved by Halley (cosh(p) - 1,
whose link is asinh, p**2/2 + p**3/3, a quadratic's root, and p**2/2 + p**4/4, a cubic's) and the power form with k < 1 (p**3, k = 1/2) give
the whole rows' p and tau, and the mpmath reference's p."""

from __future__ import annotations

import importlib
from functools import lru_cache

import numpy as np
import pytest

from derive import Regularizer, derive_map, generate_module
from numeric import contract
from numeric.core import kkt, rules, screen
from numeric.core.ops import Routines, TensorOps
from numeric.core.screen import CANDIDATES
from numeric.numpy.ops import NumpyRowOps, ops_for

from .conftest import record_shapes

#: sparse maps with a link the root rule runs Halley on
SPARSE = {"cosh_one": "cosh(p) - 1", "gini_cubic": "p**2/2 + p**3/3", "gini_quartic": "p**2/2 + p**4/4",
          "cube_power": "p**3"}
#: a dense map with a printed link (-1/z) the root rule runs Halley on, beside the sparse ones
DENSE = {"burg": "-log(p)"}


@lru_cache(maxsize=None)
def derivation(name):
    return derive_map(Regularizer.from_string({**SPARSE, **DENSE}[name], name=name))


@pytest.fixture(scope="module", autouse=True)
def printed_link_maps(user_modules):
    for name in {**SPARSE, **DENSE}:
        (user_modules / f"{name}.py").write_text(generate_module(derivation(name), name))
    importlib.invalidate_caches()


def routines(module):
    table = {name: getattr(module, name, None) for name in contract.routine_names(module.PARAMETERS)}
    return Routines(module, table, ())


@pytest.mark.parametrize("cut", [False, True], ids=["largest", "above-cut"])
@pytest.mark.parametrize("name", list(SPARSE))
def test_screened_rows_equal_the_whole_rows(name, cut, monkeypatch):
    """The first round on CANDIDATES + 1 scores of every row (the largest, or at most that many above a cut), the
    rows whose support is larger again on more of their scores, the same p and tau as Halley on the whole rows
    (supports of 1 to n scores)."""
    module = importlib.import_module(name)
    assert module.THRESHOLD == "root" and module.SPARSE
    r = routines(module)
    ops = ops_for(np.float64)
    if cut:
        monkeypatch.setattr(ops, "cut_up_to", 10**9)
    whole, sizes = record_shapes(monkeypatch, rules, "_root_whole")
    n = 1100
    rng = np.random.default_rng(5)
    span = module.omega_prime(1.0) - module.clip()
    x = rng.standard_normal((44, n)) * span * np.geomspace(1e-3, 14, 44)[:, None]
    x[4, 100:] = -np.inf  # fewer live scores than candidates in one round
    for row, size in zip(range(40, 44), (1, 5, 40, 100)):  # supports of these sizes: tied scores, the rest far below
        x[row] = np.where(np.arange(n) < size, 0.0, -2 * span)
    y = x - x.max(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        p, t = rules.root_rule(ops, r, y)
        sizes_screened = list(sizes)
        want_p, want_t = whole(ops, r, y, rules.ROOT_STEPS)
    support = (want_p > 0).sum(-1)
    assert support.min() == 1 and support.max() > CANDIDATES + 1, support
    assert sizes_screened[0] == (44, CANDIDATES + 1) and len(sizes_screened) >= 2, sizes_screened
    np.testing.assert_allclose(p, want_p, rtol=0, atol=1e-14)
    np.testing.assert_allclose(t, want_t, rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", list(SPARSE))
def test_the_cut_keeps_the_support(name):
    """numeric.core.screen's bound (from the counts of scores above levels below the maximum) is below the
    threshold; the scores above the cut (clip above the bound, or a level higher up with at most CANDIDATES + 1
    scores above it) hold the support, or the largest score left out is on it; rows of nearly equal scores, with
    too many scores above every level, are marked."""
    module = importlib.import_module(name)
    r = routines(module)
    ops = ops_for(np.float64)
    k = CANDIDATES + 1
    clip = float(module.clip())
    span = module.omega_prime(1.0) - clip
    x = np.random.default_rng(11).standard_normal((60, 300)) * np.geomspace(1e-4, 30, 60)[:, None] * span
    x[7, 3:] = -np.inf  # three live scores
    x[20, :40] = x[20].max()  # 40 tied largest scores
    y = x - x.max(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        bound, low = screen.threshold_below(ops, r, y, clip, k)
        values, index, rest, fits = screen._above_cut(ops, r, y, clip, k)
        want_p, want_t = rules._root_whole(ops, r, y, rules.ROOT_STEPS)
    assert (bound <= want_t).all(), np.flatnonzero(bound > want_t)
    at_bound = (bound + clip >= low)[:, 0]
    assert at_bound[-10:].all() and fits[-10:].all()  # far apart scores: the bound's cut holds at most k
    assert not fits[0] and not fits[20]  # nearly equal scores: no level holds at most k
    assert values.shape == index.shape == (60, k)
    for row in np.flatnonzero(fits[:, 0]):
        kept = index[row][np.isfinite(values[row])]
        np.testing.assert_array_equal(values[row][np.isfinite(values[row])], y[row, kept])
        assert kept.size == (y[row] > max(bound[row, 0] + clip, low[row, 0])).sum()
        support = np.flatnonzero(want_p[row] > 0)
        if at_bound[row]:
            assert set(support) <= set(kept), (row, support, kept)
        else:
            assert set(support) <= set(kept) or rest[row, 0] - want_t[row, 0] > clip


@pytest.mark.parametrize("name", list(SPARSE))
def test_screened_rows_equal_the_reference(name):
    """numeric's map on rows of 200 scores (screened) against the 30-digit reference."""
    import numeric as nm

    module = importlib.import_module(name)
    x = np.random.default_rng(7).standard_normal((6, 200)) * np.array([0.1, 0.5, 1, 3, 10, 30])[:, None]
    p = nm.get_map(module)(x)
    want = np.array([derivation(name).evaluate(list(map(float, row)), digits=30) for row in x], dtype=float)
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("alpha", [3.0, 40.0, 1e6])
def test_a_flat_edge_does_not_pass_the_screen(alpha):
    """alpha-entmax with k = 1/(alpha - 1) < 1 is screened; on a constant row every candidate is in the support,
    though at alpha = 40 the score of a weight of 1/16 rounds to the clip from the candidates' threshold: the
    row is uniform over all its live scores, not over the candidates."""
    import numeric as nm

    for n in (100, 5000):
        x = np.zeros(n)
        x[-2:] = -np.inf
        p = nm.entmax(x, alpha)
        np.testing.assert_allclose(p[:-2], 1 / (n - 2), rtol=1e-12)
        assert (p[-2:] == 0).all()


class _CountingRounds(NumpyRowOps):
    """NumPy's row operations recording the rounds of each ``repeat`` or ``repeat_rows`` loop that some row is still
    going in."""

    def __init__(self, dtype):
        super().__init__(dtype)
        self.rounds = []

    def repeat(self, n, body, state, going):
        count = [0]

        def counted(state):
            count[0] += 1
            return body(state)

        out = super().repeat(n, counted, state, going)
        self.rounds.append(count[0])
        return out

    def repeat_rows(self, n, body, state, going, rows=(), tail=False):
        count = [0]

        def counted(state, rows):
            count[0] += 1
            return body(state, rows)

        out = super().repeat_rows(n, counted, state, going, rows, tail)
        self.rounds.append(count[0])
        return out


@pytest.mark.parametrize("name", ["cosh_one", "gini_cubic", "cube_power", *DENSE])
def test_halley_starts_from_the_kkt_start(name):
    """The root rule's Halley starts from the KKT rule's start (numeric.core.kkt.threshold_start: the linear link's
    threshold for a sparse map, the exponential's for a dense one; p**3's power form in its own variable, shifted
    by the clip): fewer rounds than from the end of the bracket Halley starts from without one, and the same p and
    tau to rounding."""
    from numeric.core import halley

    module = importlib.import_module(name)
    assert module.THRESHOLD == "root" and module.SPARSE == (name in SPARSE)
    r = routines(module)
    x = np.random.default_rng(11).standard_normal((256, 64))
    y = x - x.max(axis=-1, keepdims=True)
    ops = _CountingRounds(np.float64)
    with np.errstate(all="ignore"):
        p, t = rules._root_whole(ops, r, y, rules.ROOT_STEPS)
        started = ops.rounds[-1]  # (Halley's rounds come last, after the start's)
        ops.rounds.clear()
        count = np.full((256, 1), 64.0)
        if module.LINK_FORM == "power":
            a, k, b, reach = rules._power_parts(ops, r, y)
            want_p, want_t = halley.root_halley(ops, r, y, rules.ROOT_STEPS, (a, k, b), -reach(count / count), -reach(1 / count))
        else:
            lo, hi = rules.lower_end(ops, r, y), -r.omega_prime(1 / count)
            want_p, want_t = halley.root_halley(ops, r, y, rules.ROOT_STEPS, None, lo, hi)
        from_end = ops.rounds[-1]
    assert started < from_end, (started, from_end)
    np.testing.assert_allclose(p, want_p, rtol=0, atol=1e-14)
    np.testing.assert_allclose(t, want_t, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_power_form_below_one_takes_newton_on_the_piece_of_its_root(dtype):
    """p**3 (the power form with k = 1/2, whose link's slope is infinite at each score's kink): on rows of a known
    length the root rule sorts them, finds the two neighbouring scores whose kinks bracket the root and runs
    Newton in the weight of the smaller one (rules._power_piece_newton): at most 10 rounds on 16 scores of 512
    rows of spreads 0.1 to 30, where Halley from the KKT rule's start took up to 18, with the p and tau of the
    safeguarded Halley from the bracket's ends to rounding (ties, masked scores and rows of one live score too),
    and the 30-digit reference's p."""
    from numeric.core import halley

    module = importlib.import_module("cube_power")
    r = routines(module)
    rng = np.random.default_rng(13)
    x = rng.standard_normal((512, 16)) * np.geomspace(0.1, 30, 512)[:, None]
    x[:8, 8:] = -np.inf
    x[8:16, :4] = x[8:16, :1]  # four tied largest scores
    x[16, 1:] = -np.inf  # one live score
    x = x.astype(dtype)
    y = x - x.max(axis=-1, keepdims=True)
    ops = _CountingRounds(dtype)
    eps = np.finfo(dtype).eps
    with np.errstate(all="ignore"):
        p, t = rules._root_whole(ops, r, y, rules.ROOT_STEPS)
        rounds = ops.rounds[-1]
        count = np.isfinite(y).sum(-1, keepdims=True).astype(dtype)
        a, k, b, reach = rules._power_parts(ops, r, y)
        ops.rounds.clear()
        want_p, want_t = halley.root_halley(ops, r, y, rules.ROOT_STEPS, (a, k, b), -reach(count / count),
                                            -reach(1 / count))
    assert rounds <= 10 < ops.rounds[-1], (rounds, ops.rounds)
    assert p.dtype == dtype and t.dtype == dtype
    np.testing.assert_allclose(p.sum(-1), 1, rtol=0, atol=4 * eps)
    np.testing.assert_allclose(p, want_p, rtol=0, atol=16 * eps)
    assert (abs(t - want_t) <= 16 * eps * (1 + abs(want_t))).all(), abs(t - want_t).max()
    assert (p[16, 1:] == 0).all() and p[16, 0] == 1
    np.testing.assert_array_equal(p[8:16, 1:4], p[8:16, :1].repeat(3, -1))
    for row in (0, 9, 100, 300, 511):
        want = derivation("cube_power").evaluate(list(map(float, x[row])), digits=30)
        np.testing.assert_allclose(p[row], np.array(want, dtype=float), rtol=0, atol=64 * eps)


def test_halley_rounds_run_on_the_rows_still_going():
    """Halley's rounds go through repeat_rows: NumPy runs a round on the rows still going once they are at most
    half of the round before's, and gives bit for bit what rounds over every row give (TensorOps.repeat_rows, as
    JAX's and the traced kernels' loops)."""
    from numeric.core.ops import TensorOps

    module = importlib.import_module("cosh_one")
    r = routines(module)
    x = np.random.default_rng(12).standard_normal((256, 64))
    y = x - x.max(axis=-1, keepdims=True)

    class Rows(NumpyRowOps):  # the rows each of Halley's rounds sees
        def __init__(self, dtype):
            super().__init__(dtype)
            self.seen = []

        def repeat_rows(self, n, body, state, going, rows=(), tail=False):
            if "halley_threshold" not in body.__qualname__:  # (Michelot's rounds: the start's, a round's model)
                return super().repeat_rows(n, body, state, going, rows, tail)
            self.seen = []

            def seeing(state, rows):
                self.seen.append(rows[0].shape[0])
                return body(state, rows)

            return super().repeat_rows(n, seeing, state, going, rows, tail)

    class Every(NumpyRowOps):
        repeat_rows = TensorOps.repeat_rows

    ops = Rows(np.float64)
    with np.errstate(all="ignore"):
        p, t = rules._root_whole(ops, r, y, rules.ROOT_STEPS)
        want_p, want_t = rules._root_whole(Every(np.float64), r, y, rules.ROOT_STEPS)
    assert ops.seen[0] == 256 and ops.seen[-1] <= 32, ops.seen
    np.testing.assert_array_equal(p, want_p)
    np.testing.assert_array_equal(t, want_t)


@pytest.mark.parametrize("masked", [False, True])
def test_dense_rows_without_masks_skip_the_selects(masked):
    """A dense map's Halley (a printed link, -log(p): g(z) = -1/z) on rows without masked scores evaluates its link
    and weights on the scores as they are, with no select over the rows (halley.clipped_link and the sums), and
    gives bit for bit what the selects give (ops.rare taking the masked path always, as JAX does); rows with
    masked scores take the selects."""
    module = importlib.import_module("burg")
    r = routines(module)
    x = np.random.default_rng(3).standard_normal((64, 300)) * np.geomspace(0.01, 30, 64)[:, None]
    if masked:
        x[5, 7] = -np.inf
    y = x - x.max(axis=-1, keepdims=True)

    class Counting(NumpyRowOps):  # the selects over whole rows, counted
        def __init__(self, dtype):
            super().__init__(dtype)
            self.whole = 0

        def where(self, cond, a, b):
            self.whole += np.size(cond) == y.size
            return super().where(cond, a, b)

    class Always(Counting):  # every rare branch taken: the selects' path
        def rare(self, pred, fn, otherwise):
            return fn()

    ops, always = Counting(np.float64), Always(np.float64)
    with np.errstate(all="ignore"):
        p, t = rules._root_whole(ops, r, y, rules.ROOT_STEPS)
        want_p, want_t = rules._root_whole(always, r, y, rules.ROOT_STEPS)
    assert always.whole >= 10 and (ops.whole > 0) == masked, (ops.whole, always.whole)
    np.testing.assert_array_equal(p, want_p)
    np.testing.assert_array_equal(t, want_t)
    assert p.min() > 0 or masked


@pytest.mark.parametrize("name", [*SPARSE, "gini_log1p"])
def test_the_cut_sends_no_more_rows_on_than_the_largest(name, monkeypatch):
    """On N(0, 1) rows of 64 at three spreads, the candidates above the cut pass the screen on the rows the 16
    largest pass it on (a row that does not goes on to more scores: under torch.compile every row does)."""
    import numeric as nm

    failed = []
    screened = screen.screened

    def recording(ops, r, y, solve, whole, candidates=CANDIDATES, **kwargs):
        on_rows = ops.on_rows
        monkeypatch.setattr(ops, "on_rows", lambda mask, *a: failed.append(int(mask.sum())) or on_rows(mask, *a))
        try:
            return screened(ops, r, y, solve, whole, candidates, **kwargs)
        finally:
            monkeypatch.setattr(ops, "on_rows", on_rows)

    monkeypatch.setattr(screen, "screened", recording)
    for module in (rules, kkt):
        monkeypatch.setattr(module, "screened", recording)
    f = nm.get_map(importlib.import_module(name))
    for scale in (0.3, 1.0, 3.0):
        x = np.random.default_rng(2).standard_normal((512, 64)) * scale
        counts = {}
        for cut in (0, 64):
            monkeypatch.setattr(NumpyRowOps, "cut_up_to", cut)
            failed.clear()
            f(x)
            counts[cut] = failed[0] if failed else 0
        assert counts[64] <= counts[0], (scale, counts)


@pytest.mark.parametrize("name, most32, most64", [("gini_quartic", 4, 5), ("gini_cubic", 4, 5), ("cosh_one", 3, 4)])
def test_halley_rounds_take_the_entering_scores(name, most32, most64, monkeypatch):
    """Halley on whole rows from the KKT start, where a round from the right of the root crosses the kinks of
    scores entering the support, steps to the root of F's model with them (halley._across_kinks): on 512 rows of
    64 N(0, 1) scores at most ``most32`` rounds in float32 and ``most64`` in float64 (7 and 8, 5 and 6, 4 and 5
    before, where the first round often landed at the bracket's lower end), p the mpmath reference's."""
    from numeric.core import halley

    module = importlib.import_module(name)
    r = routines(module)
    x = np.random.default_rng(7).standard_normal((512, 64))
    rounds = [0]
    round_ = halley.threshold_round

    def counted(*args):
        rounds[0] += 1
        return round_(*args)

    monkeypatch.setattr(halley, "threshold_round", counted)

    class Every(NumpyRowOps):  # (every row in every round: the rounds are the slowest row's)
        repeat_rows = TensorOps.repeat_rows

    for dtype, most in ((np.float32, most32), (np.float64, most64)):
        y = (x - x.max(axis=-1, keepdims=True)).astype(dtype)
        rounds[0] = 0
        with np.errstate(all="ignore"):
            p, _ = rules._root_whole(Every(dtype), r, y, rules.ROOT_STEPS)
        assert rounds[0] <= most, (dtype, rounds[0])
        eps = np.finfo(dtype).eps
        np.testing.assert_allclose(p.sum(-1), 1, rtol=0, atol=4 * eps)
        for row in (0, 17, 300):
            want = derivation(name).evaluate(list(map(float, y[row])), digits=30)
            np.testing.assert_allclose(p[row], np.array(want, dtype=float), rtol=0, atol=16 * eps)


@pytest.mark.parametrize("name, owner, solve", [("cosh_one", rules, "_root_whole"), ("gini_log1p", kkt, "_kkt_newton")])
def test_a_traced_ladder_takes_one_more_stage_of_candidates_at_most(name, owner, solve, monkeypatch):
    """Where a target traces (no count reaches Python: ``int_max`` gives None), rows whose first candidates do not
    hold their support are screened once more, on four times as many, and then solved whole: a traced graph holds
    every stage's solve, so a third stage of candidates (256 of rows of 1100) costs its compile time whether a row
    needs it or not.  Flat rows need every stage, and still get the whole rows' p."""
    import numeric as nm

    monkeypatch.setattr(NumpyRowOps, "int_max", staticmethod(lambda x: None))
    _, shapes = record_shapes(monkeypatch, owner, solve)
    n = 1100
    x = np.random.default_rng(3).standard_normal((8, n)) * np.geomspace(1e-3, 1, 8)[:, None]
    p = nm.get_map(importlib.import_module(name))(x)
    assert [shape[-1] for shape in shapes] == [CANDIDATES + 1, 4 * CANDIDATES + 4, n], shapes
    monkeypatch.undo()
    np.testing.assert_allclose(p, nm.get_map(importlib.import_module(name))(x), rtol=0, atol=1e-14)
