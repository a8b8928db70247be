"""numeric.core.kkt.kkt_rule: Newton on the KKT system in (p, tau) for links with no closed form.

Checked against the 50-digit reference and the KKT conditions, against the built-in maps' own rules
(closed and sort) with their links hidden, on NumPy, torch and JAX alike; the fast path is taken
(no row falls back to the safeguarded Halley solve with the link inverted inside it) and its
rounds stay few on rows of every spread.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import numeric as nm
from derive import Regularizer, derive_map, generate_module
from numeric import contract
from numeric.core import halley, kkt, rules
from numeric.core.ops import Routines
from numeric.core.screen import CANDIDATES
from numeric.numpy.ops import ops_for

from .conftest import USER, record_shapes, reference

#: typed maps (no closed-form link): conftest's dense shannon_gini and sparse gini_log1p, and these (entmax_cube:
#: entmax15's Tsallis term plus p**3, whose link has the power form's infinite slope at 0 and no closed form)
EXTRA = {"plogp_cube": "p*log(p) + p**3", "quartic_gini": "p**4 + p**2/2", "entmax_cube": "(p**(3/2) - p)/(3/4) + p**3"}
TYPED = ["shannon_gini", "gini_log1p", *EXTRA]


@lru_cache(maxsize=None)
def derivation(name):
    return derive_map(Regularizer.from_string({**USER, **EXTRA}[name], name=name))


def reference_of(name, x):
    if name in USER:
        return reference(name, x)
    return [float(v) for v in derivation(name).evaluate(list(map(float, x)), digits=30)]


@pytest.fixture(scope="module", autouse=True)
def extra_maps(user_modules):
    for name, expr in EXTRA.items():
        (user_modules / f"{name}.py").write_text(generate_module(derivation(name), name))
    importlib.invalidate_caches()


def routines(module, hide_link=False):
    table = {name: getattr(module, name, None) for name in contract.routine_names(module.PARAMETERS)}
    if hide_link:
        table.update(link=None)
    return Routines(module, table, ())


class Spy:
    """Counts the rounds of kkt_rule and the rows it hands to the Halley fallback."""

    def __init__(self, monkeypatch):
        self.rounds = 0
        self.fallback_rows = 0
        root_halley = halley.root_halley

        def fallback(ops, r, y, *args, **kwargs):
            self.fallback_rows += y.shape[0]
            return root_halley(ops, r, y, *args, **kwargs)

        for caller in (rules, kkt):  # (the root rule's and the KKT solve's fallback)
            monkeypatch.setattr(caller, "root_halley", fallback)


def solve(module, x, *, steps=kkt.KKT_STEPS, hide_link=False, rounds=None):
    ops = ops_for(x.dtype)
    if rounds is not None:
        class Counting(type(ops)):
            def repeat_rows(self, n, body, state, going, rows=(), tail=False):
                if body.__qualname__.startswith("michelot"):  # (the start's rounds, Michelot's: a few passes, not Newton's)
                    return super().repeat_rows(n, body, state, going, rows, tail)

                def counted(state, rows):
                    rounds.append(int(np.count_nonzero(going_now[0])))
                    new, going = body(state, rows)
                    going_now[0] = going
                    return new, going

                going_now = [going]
                return super().repeat_rows(n, counted, state, going, rows, tail)

        ops = Counting(x.dtype)
    y = x - x.max(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        p, t = kkt.kkt_rule(ops, routines(module, hide_link), y, steps)
    return p, t[:, 0] + x.max(axis=-1)


@pytest.mark.parametrize("name", TYPED)
@given(x=st.lists(st.floats(-30, 30), min_size=1, max_size=24).map(np.array))
def test_matches_reference(name, x):
    p, _ = solve(importlib.import_module(name), x[None])
    np.testing.assert_allclose(p[0], reference_of(name, x), rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", TYPED)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kkt_conditions_fast_path_and_rounds(name, dtype, monkeypatch):
    """On rows of 8 to 1024 scores with spreads 0.1 to 30: sum p = 1, omega'(p_i) = s_i - tau on the support,
    s_i - tau <= omega'(0+) off it; no row falls back; at most 12 rounds in float64 (the slowest typed maps here,
    quartic_gini and entmax_cube, need 12: 23 and 45 before the sparse maps' steps in p**beta and their entering
    scores' first Newton step; Newton converges quadratically once near, so more would mean a broken start or
    step)."""
    module = importlib.import_module(name)
    spy = Spy(monkeypatch)
    eps = np.finfo(dtype).eps
    for n in (8, 64, 1024):
        for scale in (0.1, 1.0, 5.0, 30.0):
            x = (scale * np.random.default_rng(n).standard_normal((64, n))).astype(dtype)
            rounds = []
            p, tau = solve(module, x, rounds=rounds)
            assert p.dtype == dtype
            np.testing.assert_allclose(p.sum(-1), 1, rtol=0, atol=8 * eps)
            z = (x - tau[:, None]).astype(np.float64)
            on = p >= np.finfo(dtype).tiny  # (below it p is 0 to the dtype's normal range, and checked as off)
            pd = p.astype(np.float64)
            residual = np.abs(module.omega_prime(np.where(on, pd, 1)) - z)[on]
            # the residual of a p rounded to dtype: omega''(p) ulp(p) plus the rounding of z
            ulp = np.spacing(p).astype(np.float64)
            allowed = (64 * (eps * (np.abs(z) + 1) + ulp / module.weight(np.where(on, pd, 1))))[on]
            assert np.all(residual <= allowed), (n, scale, (residual / allowed).max())
            # off the support, or where g(z) is below the dtype's smallest normal number (subnormal p carry few
            # digits, and XLA on CPU flushes them to 0): the rule stops on a step below tiny there
            edge = max(module.clip(), module.omega_prime(np.float64(np.finfo(dtype).tiny)))
            assert np.all(z[~on] <= edge + 64 * eps * (1 + np.abs(z[~on])))
            if dtype == np.float64:
                assert len(rounds) <= 12, (n, scale, len(rounds))
    assert spy.fallback_rows == 0


@pytest.mark.parametrize("name", TYPED)
def test_fallback_rows_are_solved_by_halley(name, monkeypatch):
    """With no rounds at all every row takes the Halley fallback, and gets the same p."""
    module = importlib.import_module(name)
    spy = Spy(monkeypatch)
    x = 3 * np.random.default_rng(0).standard_normal((16, 40))
    x[3, ::4] = -np.inf
    fast, tau = solve(module, x)
    assert spy.fallback_rows == 0
    slow, tau_slow = solve(module, x, steps=0)
    assert spy.fallback_rows == 16
    np.testing.assert_allclose(slow, fast, rtol=0, atol=1e-14)
    np.testing.assert_allclose(tau_slow, tau, rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", ["shannon_gini", "gini_log1p"])
def test_fallback_rows_cut_short_combine_their_brackets_ends(name):
    """The fallback's Halley cut short after 2 rounds: each row that has not settled is p(lo) + lam (p(hi) - p(lo))
    with sum 1, its bracket's ends' weights from the link inverted at each end alone (root_halley inverts at t, lo
    and hi in one pass)."""
    module = importlib.import_module(name)
    r = routines(module)
    ops = ops_for(np.float64)
    x = 3 * np.random.default_rng(2).standard_normal((24, 40))
    x[5, ::3] = -np.inf
    y = x - x.max(axis=-1, keepdims=True)
    lo, hi = halley.lower_end(ops, r, y), -module.omega_prime(1 / np.full((24, 1), 40.0))
    with np.errstate(all="ignore"):
        p, _ = halley.root_halley(ops, r, y, 2, None, lo, hi)
        t, a, b, _, _, _ = halley.halley_threshold(ops, r, y, lo, hi, steps=2)
        p_t = ops.invert_link(y - t, module.omega_prime, module.omega_second)

        def weights(end):
            z = y - end
            return np.where(z > module.clip(), ops.invert_link(np.where(np.isfinite(z), z, 0), module.omega_prime,
                                                               module.omega_second), 0)

        p_lo, p_hi = weights(a), weights(b)
    short = np.abs(np.where(np.isfinite(y), p_t, 0).sum(-1) - 1) > 4 * np.finfo(float).eps
    assert short.sum() >= 12
    f_lo, f_hi = p_lo.sum(-1, keepdims=True), p_hi.sum(-1, keepdims=True)
    assert np.all((f_lo >= 1) & (f_hi <= 1))
    want = p_lo + (f_lo - 1) / (f_lo - f_hi) * (p_hi - p_lo)
    np.testing.assert_allclose(p[short], want[short], rtol=0, atol=1e-15)
    np.testing.assert_allclose(p.sum(-1), 1, rtol=0, atol=8 * np.finfo(float).eps)


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15"])
def test_builtins_with_their_link_hidden(name):
    """The built-ins' closed and sort rules are an independent truth for the same KKT system."""
    module = importlib.import_module(f"numeric._generated.{name}")
    x = np.random.default_rng(1).standard_normal((128, 50)) * np.array([0.1, 1, 5, 30]).repeat(32)[:, None]
    p, _ = solve(module, x, hide_link=True)
    np.testing.assert_allclose(p, nm.get_map(name)(x), rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", ["gini_log1p", "quartic_gini"])
def test_candidates_give_the_whole_row_solution(name, monkeypatch):
    """A sparse map solves its rows' largest scores first: the same p and tau as the whole rows, on supports
    of 1 to n scores."""
    module = importlib.import_module(name)
    r = routines(module)
    ops = ops_for(np.float64)
    rng = np.random.default_rng(3)
    n = 1100
    whole, sizes = record_shapes(monkeypatch, kkt, "_kkt_newton")
    first = CANDIDATES + 1
    for flat in (False, True):
        # (spreads relative to omega'(1) - omega'(0+), which sets how many scores share the support)
        span = module.omega_prime(1.0) - module.clip()
        x = rng.standard_normal((48, n)) * span * np.geomspace(1e-4 if flat else 0.5, 14, 48)[:, None]
        x[4, 100:] = -np.inf  # fewer live scores than candidates in one round
        for row, size in zip(range(40, 44), (1, 5, 40, 100)):  # supports of these sizes: tied scores, the rest far below
            x[row] = np.where(np.arange(n) < size, 0.0, -2 * span)
        if flat:
            x[5, :] = 0.0  # every score in the support
        y = x - x.max(axis=-1, keepdims=True)
        sizes.clear()
        with np.errstate(all="ignore"):
            p, t = kkt.kkt_rule(ops, r, y)
            want_p, want_t = whole(ops, r, y, kkt.KKT_STEPS)
        support = (want_p > 0).sum(-1)
        assert support.min() == 1 and support.max() == (n if flat else 100), support
        # the first round on CANDIDATES + 1 scores of every row, then the rows that need more on their scores
        # above the candidates' threshold (below the row's) and one more, a few more than the support where it
        # is moderate (the whole row where one is flat): two rounds at most
        assert sizes[0] == (48, first) and len(sizes) == 2 and sizes[1][0] < 48, sizes
        assert support.max() < sizes[1][1] < n or flat and sizes[1][1] == n, (sizes, support.max())
        np.testing.assert_allclose(p, want_p, rtol=0, atol=1e-15)
        np.testing.assert_allclose(t, want_t, rtol=0, atol=1e-14)


@pytest.mark.parametrize("name", ["gini_log1p", "quartic_gini"])
def test_only_whole_rows_fall_back(name, monkeypatch):
    """Rows whose candidates' rounds do not settle (a budget of 2 rounds) go on to more of their scores, and only
    the whole rows' solve takes the fallback, Halley with the link inverted (a traced target's graph holds one
    fallback, not one for each size of candidates); p and tau are the full budget's."""
    module = importlib.import_module(name)
    r = routines(module)
    ops = ops_for(np.float64)
    n = 300
    x = np.random.default_rng(4).standard_normal((32, n)) * np.geomspace(0.05, 20, 32)[:, None]
    y = x - x.max(axis=-1, keepdims=True)
    widths = []
    halley = kkt.root_halley

    def recording(ops, r, y, *args, **kwargs):
        widths.append(y.shape[-1])
        return halley(ops, r, y, *args, **kwargs)

    monkeypatch.setattr(kkt, "root_halley", recording)
    with np.errstate(all="ignore"):
        p, t = kkt.kkt_rule(ops, r, y, steps=2)
        want_p, want_t = kkt.kkt_rule(ops, r, y)
    assert widths and set(widths) == {n}, widths
    np.testing.assert_allclose(p, want_p, rtol=0, atol=1e-13)
    np.testing.assert_allclose(t, want_t, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", TYPED)
@pytest.mark.parametrize("n", [48, 200])
def test_numpy_torch_jax_agree(name, n):
    """The same p from the one text on three backends (at n = 200 a sparse map's candidate rounds too)."""
    torch = pytest.importorskip("torch")
    rt = pytest.importorskip("numeric.torch")
    rj = pytest.importorskip("numeric.jax")
    import jax

    module = importlib.import_module(name)
    x = np.random.default_rng(2).standard_normal((32, n)) * np.geomspace(1e-3, 10, 32)[:, None]
    x[5, 7:] = -np.inf
    want = nm.get_map(module)(x)
    got_torch = rt.get_map(module)(torch.from_numpy(x), dim=-1).numpy()
    with jax.enable_x64(True):
        got_jax = np.asarray(rj.get_map(module)(jax.numpy.asarray(x), axis=-1))
    np.testing.assert_allclose(got_torch, want, rtol=0, atol=1e-13)
    np.testing.assert_allclose(got_jax, want, rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", ["shannon_gini", "plogp_cube"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_blocks_of_rows_give_the_whole_solution(name, dtype, monkeypatch):
    """A dense map is solved in blocks of KKT_BLOCK scores: each row's rounds read that row alone, so blocks of 3
    rows (the last one short) give the bits of one block, and NumPy's p equals torch's in blocks and whole."""
    module = importlib.import_module(name)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((20, 50)) * np.geomspace(0.1, 30, 20)[:, None]).astype(dtype)
    x[2, ::3] = -np.inf
    y = x - x.max(axis=-1, keepdims=True)
    r = routines(module)
    blocks = []
    whole = kkt._kkt_newton

    def newton(ops, r, y, steps):
        blocks.append(y.shape[0])
        return whole(ops, r, y, steps)

    monkeypatch.setattr(kkt, "_kkt_newton", newton)
    with np.errstate(all="ignore"):
        one_p, one_t = kkt.kkt_rule(ops_for(dtype), r, y)
        monkeypatch.setattr(kkt, "KKT_BLOCK", 3 * 50 + 7)
        p, t = kkt.kkt_rule(ops_for(dtype), r, y)
    assert blocks == [20, 3, 3, 3, 3, 3, 3, 2]
    np.testing.assert_array_equal(p, one_p)
    np.testing.assert_array_equal(t, one_t)
    torch = pytest.importorskip("torch")
    from numeric.torch import TorchMap
    from numeric.torch._ops import ops_for as torch_ops

    tdtype = getattr(torch, np.dtype(dtype).name)
    blocks.clear()
    with torch.no_grad():
        tp, tt = kkt.kkt_rule(torch_ops(tdtype), TorchMap(module)._solver.routines(()), torch.from_numpy(y))
    assert blocks == [3, 3, 3, 3, 3, 3, 2]
    np.testing.assert_allclose(tp.numpy(), p, rtol=0, atol=4 * np.finfo(dtype).eps)
    assert np.all(np.abs(tt.numpy() - t) <= 4 * np.finfo(dtype).eps * (1 + np.abs(t)))


@pytest.mark.parametrize("name", ["gini_log1p", "quartic_gini"])
@given(rows=st.integers(1, 6), n=st.integers(1, 40), scale=st.sampled_from([0.01, 1.0, 30.0]), seed=st.integers(0, 2**16))
def test_linear_start_is_the_linear_links_threshold(name, rows, n, scale, seed):
    """The sparse start's threshold is that of the linear link ``a (z - omega'(0+))`` through ``(omega'(1/2), 1/2)``:
    sparsemax's threshold of ``a (y - clip)`` over ``a``, from the sorted scores; with fewer rounds, a lower bound."""
    module = importlib.import_module(name)
    r = routines(module)
    ops = ops_for(np.float64)
    x = scale * np.random.default_rng(seed).standard_normal((rows, n))
    x[0, ::3] = -np.inf
    x[0, 0] = 0.0
    y = x - x.max(axis=-1, keepdims=True)
    live = np.isfinite(y)
    count = live.sum(-1, keepdims=True).astype(float)
    clip = module.clip()
    a = 0.5 / (module.omega_prime(0.5) - clip)
    # sparsemax's threshold of v = a (y - clip): the largest k with 1 + k v_(k) > sum of the k largest
    v = np.sort(np.where(live, a * (y - clip), -np.inf), axis=-1)[:, ::-1]
    k = np.arange(1, n + 1)
    cums = np.cumsum(np.where(np.isfinite(v), v, 0), axis=-1)
    size = ((1 + k * v > cums) & np.isfinite(v)).sum(-1)
    want = (cums[np.arange(rows), size - 1] - 1) / size / a
    p, t = kkt._linear_start(ops, r, y, live, count, clip, steps=n + 1)  # (the support shrinks in every round)
    np.testing.assert_allclose(t[:, 0], want, rtol=1e-12, atol=1e-12 * scale)
    np.testing.assert_allclose(p, a * np.maximum(np.where(live, y - clip, -np.inf) - t, 0), rtol=0, atol=0)
    np.testing.assert_allclose(p.sum(-1), 1, rtol=1e-12)
    _, below = kkt._linear_start(ops, r, y, live, count, clip, steps=1)
    assert np.all(below[:, 0] <= want + 1e-12 * scale)


@pytest.mark.parametrize("name, most", [("gini_log1p", 5), ("quartic_gini", 6)])
def test_whole_rows_rounds(name, most):
    """On whole rows of N(0, 1) scores (as JAX solves them on the CPU: no candidates) the sparse maps' linear start
    leaves 5 and 6 Newton rounds in float64 (7 to 8 and 16 to 20 from the exponential start it replaced)."""
    module = importlib.import_module(name)
    for n in (64, 1024):
        x = np.random.default_rng(n).standard_normal((64, n))
        rounds = []

        class Whole(type(ops_for(np.float64))):
            candidates_from = n + 1

            def repeat_rows(self, steps, body, state, going, rows=(), tail=False):
                if not body.__qualname__.startswith("michelot"):  # (not the start's rounds)
                    rounds.append(0)
                    return super().repeat_rows(steps, lambda s, r: (rounds.__setitem__(-1, rounds[-1] + 1), body(s, r))[1],
                                               state, going, rows, tail)
                return super().repeat_rows(steps, body, state, going, rows, tail)

        with np.errstate(all="ignore"):
            p, _ = kkt.kkt_rule(Whole(np.float64), routines(module), x - x.max(-1, keepdims=True))
        assert max(rounds) <= most, (n, rounds)
        np.testing.assert_allclose(p.sum(-1), 1, rtol=1e-13)


@pytest.mark.parametrize("name, most32, most64", [("shannon_gini", 1.5, 2.5), ("plogp_cube", 1.5, 2.5), ("gini_log1p", 1.5, 2.5),
                                                  ("quartic_gini", 2.5, 3.5), ("entmax_cube", 3.0, 4.0)])
def test_the_final_step_ends_the_rounds(name, most32, most64):
    """A row whose next Newton step leaves only a remainder below rounding takes it and stops (_final_step): on
    512 rows of 64 N(0, 1) scores the rounds per row, averaged, are at most ``most`` (before it, each row ran one
    round more to find its step within rounding: about 3.0 and 4.1 for the dense maps, 3.1 and 4.2 for gini_log1p,
    3.8 and 5.1 for quartic_gini, 4.4 and 5.8 for entmax_cube); the KKT conditions hold as before."""
    module = importlib.import_module(name)
    for dtype, most in ((np.float32, most32), (np.float64, most64)):
        x = np.random.default_rng(7).standard_normal((512, 64)).astype(dtype)
        rounds = []
        p, tau = solve(module, x, rounds=rounds)
        assert sum(rounds) / x.shape[0] <= most, (dtype, rounds)
        eps = np.finfo(dtype).eps
        np.testing.assert_allclose(p.sum(-1), 1, rtol=0, atol=8 * eps)
        on = p > 0
        z = (x - tau[:, None]).astype(np.float64)
        residual = np.abs(module.omega_prime(np.where(on, p, 1).astype(np.float64)) - z)
        allowed = 64 * (eps * (np.abs(z) + 1) + np.spacing(p).astype(np.float64) / module.weight(np.where(on, p, 1).astype(np.float64)))
        assert np.all(residual[on] <= allowed[on])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_scores_at_the_support_edge(dtype, monkeypatch):
    """A score a few ulps above the threshold of an entmax-like map (p of order ulp**2) is solved by the Newton
    rounds, not the Halley fallback, with the KKT conditions (before: 6 of 8 rows fell back in float64)."""
    module = importlib.import_module("entmax_cube")
    x = np.random.default_rng(0).standard_normal((8, 40)).astype(dtype)
    p, tau = solve(module, x)
    edge = (tau + module.clip()).astype(dtype)
    for k in range(8):  # the score nearest the threshold off the support, moved to k + 1 ulps above it
        j = np.argmin(np.where(p[k] > 0, np.inf, np.abs(x[k] - tau[k])))
        x[k, j] = edge[k] + np.spacing(edge[k]) * (k + 1)
    spy = Spy(monkeypatch)
    p, tau = solve(module, x)
    assert spy.fallback_rows == 0
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(p.sum(-1), 1, rtol=0, atol=8 * eps)
    z = (x - tau[:, None]).astype(np.float64)
    on = p > 0
    residual = np.abs(module.omega_prime(np.where(on, p.astype(np.float64), 1)) - z)[on]
    assert np.all(residual <= 64 * eps * (np.abs(z[on]) + 1) + np.spacing(p[on]) / module.weight(p[on].astype(np.float64)) * 64)
    assert np.all(z[~on] <= module.clip() + 64 * eps * (1 + np.abs(z[~on])))
