"""Fast paths of the one solver (numeric.core on NumPy's operations, numeric.numpy.ops) against its
plain forms and the 50-digit reference.

The sort-free support rule (Michelot's algorithm for links of degree 1) against the
sort rule on whole rows, row maxima through transposed blocks against
``max(axis=-1)``, row sums by einsum against float64 sums, the clipped link of the
power form against the printed link and the 50-digit one, alpha-entmax's root rule
in the power form against its generic path, and the root rule against the sort rule
on long rows; masks, ties, NaN rows, huge scores, float32 and float64, rows of
length 1, and batches long enough to take every fast path.
"""

from __future__ import annotations

import importlib
import math
import os

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import numeric as nm
from derive import Regularizer, derive_map, generate_module
from derive import reference as R
from derive.codegen.files import load_module
from numeric.core import halley, rules
from numeric.numpy import steps
from numeric.numpy.ops import ops_for
from numeric.numpy.rows import SELECT_FROM, row_max, row_sum, select

from .conftest import counting_ops, derivation, numpy_routines, reference




#: degree-1 user maps: omega'(1) - omega'(0+) = 2 (support counted by comparison), and
#: omega'(0+) = 1 (the link z - 1 clips away from 0)
LINEAR_USER = {"twice_gini": "p**2", "shifted_gini": "p**2/2 + p"}


@pytest.fixture(scope="module")
def linear_maps(tmp_path_factory):
    folder = tmp_path_factory.mktemp("linear")
    mods = {"sparsemax": importlib.import_module("numeric._generated.sparsemax")}
    for name, expr in LINEAR_USER.items():
        path = folder / f"{name}.py"
        path.write_text(generate_module(derive_map(Regularizer.from_string(expr, name=name)), name))
        mods[name] = load_module(path)
        assert mods[name].THRESHOLD == "sort" and mods[name].THRESHOLD_DEGREE == 1
    return mods


values = st.one_of(
    st.floats(-50, 50),
    st.floats(-1e12, 1e12),
    st.floats(-1e-9, 1e-9),
    st.integers(-3, 3).map(float),  # ties
    st.sampled_from([0.0, 0.5, 1.0, -1.0]).map(lambda v: v / 4),  # ties at the threshold
)


@st.composite
def batches(draw, max_len=80, max_rows=6):
    """A (rows, n) float64 batch; masked scores (-inf) anywhere but column 0."""
    n = draw(st.integers(1, max_len))
    r = draw(st.integers(1, max_rows))
    x = np.array(draw(st.lists(st.lists(values, min_size=n, max_size=n), min_size=r, max_size=r)))
    mask = np.array(draw(st.lists(st.lists(st.booleans(), min_size=n, max_size=n), min_size=r, max_size=r)))
    mask[:, 0] = False
    x[mask] = -np.inf
    return x


def _shifted(x):
    return x - x.max(axis=-1, keepdims=True)


@pytest.mark.parametrize("name", ["sparsemax", *LINEAR_USER])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@given(x=batches())
def test_support_rule_equals_sort_rule(linear_maps, name, dtype, x):
    """support_rule (no sort; for degree 1 Michelot's fixed point, exact once the support repeats, within
    n + 1 rounds) against sort_rule on the whole sorted rows."""
    mod = linear_maps[name]
    y = _shifted(x.astype(dtype))
    eps = float(np.finfo(dtype).eps)
    reach = float(mod.omega_prime(1.0))
    ops = counting_ops(dtype)
    r = numpy_routines(mod)
    with np.errstate(all="ignore"):
        support = rules.support_rule(ops, r, y)
        full = rules.sort_rule(ops_for(dtype), r, y)
        p_support = rules.sort_link(ops, r, y - support)
        p_full = rules.sort_link(ops, r, y - full)
    n = y.shape[-1]
    assert len(ops.rounds) == 1 and ops.rounds[0] <= n + 1
    # both are exact on the support's shifted scores (|y| <= omega'(1) there): sums of n terms
    tol = 4 * n * eps * max(1.0, reach)
    np.testing.assert_allclose(support, full, rtol=0, atol=tol)
    np.testing.assert_allclose(p_support, p_full, rtol=0, atol=tol)
    np.testing.assert_allclose(p_support.astype(np.float64).sum(-1), 1, rtol=0, atol=tol)


@pytest.mark.parametrize("name", ["sparsemax", *LINEAR_USER])
@given(x=batches(max_len=40, max_rows=3))
def test_solve_takes_the_support_rule_and_agrees_with_the_sort_rule(linear_maps, name, x):
    """solve on unshifted rows: its own choice for short rows of a link of degree 1 (support_rule, shifted by
    the row maximum inside) agrees with method="sort" (sort_rule on whole rows)."""
    mod = linear_maps[name]
    ops = counting_ops(np.float64)
    r = numpy_routines(mod)
    with np.errstate(all="ignore"):
        p_auto, t_auto = rules.solve(ops, r, x, relative=True)
        assert ops.rounds and not ops.sorted_rows  # the support rule ran, and sorted nothing
        p_sort, t_sort = rules.solve(ops, r, x, method="sort", relative=True)
    np.testing.assert_allclose(t_auto, t_sort, rtol=0, atol=1e-12 * x.shape[-1])
    np.testing.assert_allclose(p_auto, p_sort, rtol=0, atol=1e-12 * x.shape[-1])


@pytest.mark.parametrize("scale", [0.01, 0.1, 1.0, 10.0])
@pytest.mark.parametrize("n", [1, 2, 64, 255, 1024])
def test_support_rule_rounds_on_random_rows(scale, n):
    """Few rounds on random rows (a regression guard for speed; the bound proved is n + 1), no row left to the
    sort rule, and NumPy's sort_threshold gives the support rule's tau bit for bit below ``SUPPORT_BELOW`` (2048: rows of
    1024 scores are not sorted).  The degree-1 rule starts from the middle of ``[-omega'(1), -omega'(0+)]`` where
    Jensen's bound is below it (not a lower bound: the first step lands on one), so rows of N(0, 1) scores take
    at most 3.1 rounds a row on average (3.3 at n = 64 and 4.2 at n = 1024 from ``-omega'(1)``)."""
    mod = importlib.import_module("numeric._generated.sparsemax")
    x = (np.random.default_rng(n).standard_normal((2048, n)) * scale).astype(np.float32)
    y = _shifted(x)
    ops = counting_ops(np.float32)
    r = numpy_routines(mod)
    with np.errstate(all="ignore"):
        tau = rules.support_rule(ops, r, y)
        full = rules.sort_rule(ops_for(np.float32), r, y)
        if n < steps.SUPPORT_BELOW:
            chosen = counting_ops(np.float32)
            np.testing.assert_array_equal(tau, steps.sort_threshold(chosen, r, y))
            assert chosen.sorted_rows == []
    assert ops.rounds[0] <= min(n + 1, 12), ops.rounds
    if scale == 1.0 and n >= 64:
        assert sum(ops.live[0][:-1]) / x.shape[0] <= 3.1, ops.live
    assert ops.sorted_rows == []
    np.testing.assert_allclose(tau, full, rtol=0, atol=4 * n * np.finfo(np.float32).eps)


# ------------------------------------------------------------ row maxima and sums
@given(
    rows=st.sampled_from([1, 63, 64, 142, 512, 1023, 1024, 1500, 2049]),
    n=st.integers(1, 70),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([np.float64, np.float32]),
)
def test_row_max_equals_max(rows, n, seed, dtype):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, n)) * 10.0 ** rng.integers(-3, 30, (rows, 1))).astype(dtype)
    x[rng.random((rows, n)) < 0.1] = -np.inf
    x[rng.random(rows) < 0.05, 0] = np.nan
    x[rng.random(rows) < 0.02, -1] = np.inf
    x[rng.random(rows) < 0.02] = -np.inf
    np.testing.assert_array_equal(row_max(x), x.max(axis=-1))
    assert row_max(x).dtype == dtype


@given(
    shape=st.sampled_from([(3, 5), (SELECT_FROM // 64, 64), (40, 300)]),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([np.float64, np.float32]),
    form=st.sampled_from(["arrays", "scalar a", "scalar b", "rows", "row condition"]),
    true=st.floats(0, 1),
)
def test_select_is_where_bit_for_bit(shape, seed, dtype, form, true):
    """``select`` picks bits where ``np.where`` branches: the same dtype, shape and bits (NaN payloads, -0, inf)
    for every pattern of the condition, with scalars and rows broadcast."""
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) * 10.0 ** rng.integers(-30, 30, shape)).astype(dtype)
    b = rng.standard_normal(shape).astype(dtype)
    for special in (np.nan, -np.nan, -0.0, np.inf, -np.inf):
        a.flat[rng.integers(a.size)] = special
        b.flat[rng.integers(b.size)] = special
    cond = rng.random(shape) < true
    args = {"arrays": (cond, a, b), "scalar a": (cond, 1.5, b), "scalar b": (cond, a, 0),
            "rows": (cond, a[:, :1], b), "row condition": (cond[:, :1], a, b)}[form]
    got, want = select(*args), np.where(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [1, 3, 64, 1024, 16384])
def test_row_sum_accuracy(dtype, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((max(1, 2**16 // n), n)) + 0.3).astype(dtype)
    got = row_sum(x)
    assert got.dtype == dtype and got.shape == (x.shape[0],)
    exact = x.astype(np.float64).sum(-1)
    bound = 4 * np.finfo(dtype).eps * np.abs(x).astype(np.float64).sum(-1)
    assert (np.abs(got - exact) <= bound).all()
    y = x.copy()
    y[:, 0] = -np.inf
    assert (row_sum(y) == -np.inf).all()


@pytest.mark.parametrize("name", ["sparsemax", *LINEAR_USER])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_clipped_affine_link_equals_masked_link(linear_maps, name, dtype):
    """sort_link's one-pass clipped link of degree 1 (``max(a (z - clip), 0)``) is the printed link where
    ``z > clip`` and 0 elsewhere, bit for bit, and so is NumPy's form of it written over the scores
    (:func:`numeric.numpy.steps.link_into`)."""
    mod = linear_maps[name]
    clip = mod.clip()
    z = (np.random.default_rng(0).standard_normal((50, 40)) * 3 + clip).astype(dtype)
    z[:, :5] = clip  # exactly at the clip: 0
    z[:, 5] = -np.inf
    z[:, 6] = np.nextafter(dtype(clip), dtype(np.inf))
    ops = ops_for(dtype)
    r = numpy_routines(mod)
    got = rules.sort_link(ops, r, z)
    with np.errstate(invalid="ignore"):
        want = np.where(z > clip, mod.link(z), 0).astype(dtype)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == dtype and (got >= 0).all()
    zero = np.zeros((z.shape[0], 1), dtype=dtype)
    y = z.copy()
    got = steps.link_into(ops, r, y, zero)  # NumPy's form: over y, in place
    assert got is y
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------- whole maps on long batches
def _special_rows(n, dtype):
    big = 1e30 if dtype == np.float64 else float(np.finfo(dtype).max) / 4
    rows = [
        np.full(n, -np.inf),  # fully masked
        np.r_[np.nan, np.zeros(n - 1)],  # NaN
        np.r_[big, -big, np.zeros(n - 2)],  # huge
        np.r_[1e12, 1e12 - 0.5, np.full(n - 2, -1e12)],  # huge with a small spread
        np.r_[0.25, 0.25, 0.25, np.full(n - 3, -np.inf)],  # ties, masks
        np.zeros(n),  # all tied
        np.arange(n) * 1e-9,  # nearly tied
    ]
    return np.array(rows, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [64, 200])
def test_sparsemax_long_batch_with_special_rows(dtype, n):
    """2048 rows: transposed row maxima (n = 64) and the support rule, with odd rows among them."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal((2048, n)).astype(dtype)
    special = _special_rows(n, dtype)
    at = rng.choice(2048, special.shape[0], replace=False)
    x[at] = special
    p = nm.sparsemax(x)
    assert p.dtype == dtype
    nan_rows = np.isnan(x).any(-1)
    assert np.isnan(p[nan_rows]).all() and not np.isnan(p[~nan_rows]).any()
    assert (p[0 == np.isfinite(x).sum(-1)] == 0).all()
    eps = float(np.finfo(dtype).eps)
    for row, i in zip(special, at):
        if np.isnan(row).any() or not np.isfinite(row).any():
            continue
        want = np.array(reference("sparsemax", row.astype(np.float64)))
        np.testing.assert_allclose(p[i], want, rtol=0, atol=8 * n * eps)
    # every other row as computed alone (no fast path depends on the batch)
    for i in rng.choice(2048, 5, replace=False):
        np.testing.assert_allclose(p[i], nm.sparsemax(x[i]), rtol=0, atol=4 * n * eps)
    # float32 against float64
    if dtype == np.float32:
        ok = ~nan_rows
        np.testing.assert_allclose(p[ok], nm.sparsemax(x[ok].astype(np.float64)), rtol=0, atol=2e-6)


def test_rows_of_length_one_and_two_in_long_batches():
    x = np.random.default_rng(1).standard_normal((3000, 1))
    x[::7] = -np.inf
    p = nm.sparsemax(x)
    assert (p[::7] == 0).all() and (np.delete(p, np.s_[::7], axis=0) == 1).all()
    x2 = np.random.default_rng(2).standard_normal((3000, 2)).astype(np.float32)
    p2 = nm.sparsemax(x2)
    want = np.clip((x2[:, 0] - x2[:, 1] + 1) / 2, 0, 1)
    np.testing.assert_allclose(p2[:, 0], want, rtol=0, atol=4e-7)
    assert math.isclose(float(p2.astype(np.float64).sum()), 3000, rel_tol=1e-6)


# ------------------------------------------------- softmax without a shift, two threads
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_unshifted_softmax_and_its_fallback_rows(dtype):
    """Rows whose exp-sum is finite and >= 1 skip the shift; the others (NaN, masked, overflow,
    every score far below 0) take the shifted path; both agree with the reference."""
    rng = np.random.default_rng(7)
    n = 64
    x = (rng.standard_normal((4096, n)) * 3).astype(dtype)
    top = float(np.finfo(dtype).max)
    odd = {
        0: np.full(n, -np.inf),
        1: np.r_[np.nan, np.zeros(n - 1)],
        2: np.r_[top, -top, np.zeros(n - 2)],  # exp overflows
        3: np.r_[1000.0, 999.0, np.zeros(n - 2)],  # exp overflows in either dtype
        4: np.full(n, -200.0) + np.arange(n),  # all far below 0: the sum is < 1
        5: np.r_[-3000.0, np.full(n - 1, -np.inf)],  # one live score, far below 0
        6: np.r_[80.0, 80.0, np.full(n - 2, -50.0)],  # large but finite in float32
    }
    for i, row in odd.items():
        x[i] = row
    p, tau = nm.get_map("softmax").forward(x)
    assert p.dtype == dtype
    assert (p[0] == 0).all() and tau[0] == np.inf
    assert np.isnan(p[1]).all() and np.isnan(tau[1])
    atol = 1e-12 if dtype == np.float64 else 2e-7
    for i in range(2, 7):
        np.testing.assert_allclose(p[i], reference("softmax", x[i].astype(np.float64)), rtol=0, atol=atol)
    for i in rng.choice(np.arange(7, 4096), 4, replace=False):
        np.testing.assert_allclose(p[i], reference("softmax", x[i].astype(np.float64)), rtol=0, atol=atol)
        # tau: p_i = exp(s_i - tau - 1) for Shannon's link exp(z - 1)
        np.testing.assert_allclose(np.log(p[i, 0]) + 1 + tau[i], x[i, 0], rtol=0, atol=1e3 * atol * (1 + abs(float(x[i, 0]))))
    ok = ~np.isnan(p).any(-1) & np.isfinite(x).any(-1)
    np.testing.assert_allclose(p[ok].astype(np.float64).sum(-1), 1, rtol=0, atol=100 * np.finfo(dtype).eps)


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "entmax"])
def test_two_threads_give_the_rows_of_one(name, monkeypatch):
    from numeric.numpy import backend as maps  # where NumPy rows are cut into chunks

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2**17 // 64 + 3, 64)).astype(np.float32)
    x[5] = np.nan
    x[6] = -np.inf
    x[7, ::2] = -np.inf
    m = nm.get_map(name, **({"alpha": 1.3} if name == "entmax" else {}))
    monkeypatch.setattr(maps, "THREADS_FROM", 1 << 62)
    one, tau_one = m.forward(x)
    monkeypatch.setattr(maps, "THREADS_FROM", 1)
    nm.set_num_threads(2)  # whatever the machine has
    try:
        two, tau_two = m.forward(x)
    finally:
        nm.set_num_threads(None)
    three = m.forward(x.copy(), overwrite=True)[0]
    np.testing.assert_allclose(two, one, rtol=0, atol=1e-7)  # root solvers: rounding of batch-wide sizes
    np.testing.assert_allclose(tau_two, tau_one, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(three, two)
    assert np.isnan(two[5]).all() and (two[6] == 0).all()
    monkeypatch.setattr(maps, "CHUNKS", 7)  # uneven chunks, taken by whichever thread is free
    seven, tau_seven = m.forward(x)
    np.testing.assert_allclose(seven, one, rtol=0, atol=1e-7)
    np.testing.assert_allclose(tau_seven, tau_one, rtol=0, atol=1e-6)


def test_threads_do_not_read_the_machine_load(monkeypatch):
    """Whether rows go to a second thread depends on the sizes and the thread count only, never on /proc/loadavg."""
    from numeric.numpy import backend as maps  # where NumPy rows are cut into chunks

    real_open = open
    read = []

    def spying_open(path, *args, **kwargs):
        if "loadavg" in str(path):
            read.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spying_open)
    monkeypatch.setattr(os, "getloadavg", lambda: read.append("getloadavg") or (0.0, 0.0, 0.0), raising=False)
    monkeypatch.setattr(maps, "THREADS_FROM", 1)
    x = np.random.default_rng(5).standard_normal((64, 32))
    nm.entmax15(x)
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 2, 16, 4))
    monkeypatch.setattr(importlib.import_module("numeric.attention"), "PARALLEL_FROM", 1)
    nm.attention(q, q, q, mapping="sparsemax")
    assert read == []


def test_maps_from_a_worker_thread_and_under_raise():
    """From a thread of the caller's own the rows come out the same; the caller's error state reaches the pool's thread."""
    from concurrent.futures import ThreadPoolExecutor

    x = np.random.default_rng(4).standard_normal((4096, 64)).astype(np.float32)
    x[::9, 1:] = -np.inf
    want = nm.entmax(x, 1.3)
    with ThreadPoolExecutor(1) as pool:
        got = pool.submit(nm.entmax, x, 1.3).result()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
    with np.errstate(all="raise"):  # the solvers silence what they expect, on both threads
        for f in (nm.softmax, nm.sparsemax, nm.entmax15, lambda a: nm.entmax(a, 1.3)):
            np.testing.assert_allclose(f(x), f(x.astype(np.float64)), rtol=0, atol=2e-6)


# ------------------------------------------------------------ alpha-entmax (Tsallis) fast path
ALPHAS = [1.01, 1.3, 4 / 3, 1.5, 2.0, 3.0, 6.0]


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tsallis_power_form_equals_the_generic_root_path(alpha, dtype, halley_forms, piece_solves):
    """root_rule on alpha-entmax's link of the power form ``(a (z - clip))**k`` (Newton on ``F**(1/k)`` for
    ``k >= 1``, else Newton on the piece of the root between two kinks in the weight of its smaller score on the
    candidates and Halley on longer rows, the link as ``exp(k log base)``) and on the generic path (its
    ``link_scale`` hidden: Halley on ``tau - m`` with the printed link and weights) give the same ``p`` and ``tau``."""
    mod = importlib.import_module("numeric._generated.entmax_sparse")
    params = (dtype(alpha),)
    assert mod.LINK_FORM == "power"
    assert float(mod.link_scale(*params)) == pytest.approx(alpha - 1, rel=1e-6)
    assert float(mod.link_exponent(*params)) == pytest.approx(1 / (alpha - 1), rel=1e-6)
    entmax15 = importlib.import_module("numeric._generated.entmax15")
    assert entmax15.LINK_FORM == "power" and (entmax15.link_scale(), entmax15.link_exponent()) == (0.5, 2.0)
    assert importlib.import_module("numeric._generated.softmax").LINK_FORM != "power"
    forms = halley_forms  # the power form each safeguarded Halley solve is given (None: the generic path)
    rng = np.random.default_rng(int(alpha * 100))
    x = rng.standard_normal((300, 50)) * 2
    x[::5, 10:] = -np.inf
    y = _shifted(x).astype(dtype)
    ops = ops_for(dtype)
    with np.errstate(all="ignore"):
        p_power, t_power = rules.root_rule(ops, numpy_routines(mod, params), y)
        power_forms, forms[:] = list(forms), []
        p_generic, t_generic = rules.root_rule(ops, numpy_routines(mod, params, link_scale=None), y)
    # (Halley's rows of 50 scores are screened, numeric.core.screen: a solve on each row's largest scores, then
    # one on the rows whose support is larger)
    if alpha <= 2:  # k >= 1: Newton on F**(1/k)
        assert power_forms == [] and piece_solves == []
    else:  # the candidates by Newton on the root's piece; rows whose support is larger, if any, by Halley (a power form)
        assert len(piece_solves) == 1 and 0 < piece_solves[0] < 1, piece_solves
        assert len(power_forms) <= 1 and all(f is not None for f in power_forms), power_forms
    assert 1 <= len(forms) <= 2 and all(f is None for f in forms), forms
    # both round the link's base differently: relative to the batch's largest p (1) and tau
    rtol = 1e-12 if dtype == np.float64 else 3e-5
    for p in (p_power, p_generic):
        assert np.isfinite(p).all() and (p >= 0).all()
        np.testing.assert_allclose(p.astype(np.float64).sum(-1), 1, rtol=0, atol=rtol)
    np.testing.assert_allclose(p_generic, p_power, rtol=0, atol=rtol)
    np.testing.assert_allclose(t_generic, t_power, rtol=0, atol=rtol * (1 + float(np.abs(t_power).max())))


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tsallis_link_matches_the_50_digit_link(alpha, dtype):
    """The power form's clipped link as the root rule and at_threshold evaluate it (``exp(k log base)``,
    ``base = a (z - clip)``; sort_link's ``u`` or ``u * u`` where ``k`` is 1 or 2) against the 50-digit link at
    the same distance from the clip (derive.reference, ``g`` as a function of ``z - omega'(0+)``).

    The printed link ``((alpha - 1) z + 1/alpha)**(1/(alpha - 1))`` cancels in its base just above the clip
    (for alpha = 6 the next float above it gives ``p`` off by 1e15 ulps), so it is no truth there.
    """
    mod = importlib.import_module("numeric._generated.entmax_sparse")
    params = (dtype(alpha),)
    clip = mod.clip(*params)
    z = (np.random.default_rng(0).standard_normal((40, 30)) * 2).astype(dtype)
    z[:, 0] = clip
    z[:, 1] = -np.inf
    z[:, 2] = np.nextafter(dtype(clip), dtype(np.inf))
    z[:, 3] = 1 / alpha  # omega'(1): p = 1
    ops = ops_for(dtype)
    r = numpy_routines(mod, params)
    with np.errstate(all="ignore"):
        got, _, _ = halley.power_link(ops, r.link_exponent(), r.link_scale() * (z - r.clip()))
    with mpmath.workdps(50):
        c = R.compiled(derivation("entmax_sparse"), {"alpha": mpmath.mpf(float(params[0]))})
        edge = mpmath.mpf(float(clip))
        want = np.array([[float(c.link_from_clip(mpmath.mpf(float(v)) - edge)) if v > -np.inf else 0.0 for v in row]
                         for row in z])
    eps = float(np.finfo(dtype).eps)
    # base = a (z - clip) rounds twice (a relative error of 2 eps), and p = base**k carries k times that;
    # exp(k log base) adds |log p| eps, and the exponent's floor 0.9 log(tiny) leaves p below tiny**0.9
    k = 1 / (alpha - 1)
    tol = dict(rtol=(2 * k + 8) * eps, atol=4 * eps)
    np.testing.assert_allclose(got, want, **tol)
    assert (got[:, [0, 1]] == 0).all() and (got >= 0).all() and np.isfinite(got).all()
    if alpha in (1.5, 2.0):  # k = 2, 1: sort_link's u * u or u, as at_threshold takes it
        # (the printed link computes both of its forms, numpy.where picking one: the form for alpha near 1,
        # exp(log1p(...) / (alpha - 1)), is -inf inside log1p at the clip, where it is not taken)
        with np.errstate(divide="ignore"):
            np.testing.assert_allclose(rules.sort_link(ops, r, z.copy()), want, **tol)


@pytest.mark.parametrize(("alpha", "dtype"), [
    pytest.param(alpha, dtype, marks=pytest.mark.xfail(strict=True, reason=(
        "50 ulps below 1: the base a (z - clip) rounds to 1 - eps/2 (0.35 ulp from its exact value at these float32 "
        "inputs), which k = 100 makes 50 ulps of p; the 50-digit link at these inputs is itself 15.5 ulps below 1, "
        "and the former clipped_link (base z a - a clip, retired) happened to round to 1")))
    if (alpha, dtype) == (1.01, np.float32) else (alpha, dtype)
    for alpha in ALPHAS for dtype in (np.float64, np.float32)])
def test_tsallis_link_is_one_at_omega_prime_of_one(alpha, dtype):
    """The power form's link gives p = 1 within 8 ulps at z = 1/alpha = omega'(1)."""
    mod = importlib.import_module("numeric._generated.entmax_sparse")
    params = (dtype(alpha),)
    r = numpy_routines(mod, params)
    z = np.full((4, 3), 1 / alpha, dtype=dtype)
    with np.errstate(all="ignore"):
        got, _, _ = halley.power_link(ops_for(dtype), r.link_exponent(), r.link_scale() * (z - r.clip()))
    np.testing.assert_allclose(got, 1, rtol=8 * float(np.finfo(dtype).eps))


@pytest.mark.parametrize("alpha", [1.1, 1.25, 1.3, 1.5])
@pytest.mark.parametrize("n", [33, 64, 128, 256])
def test_power_newton_rounds_on_short_rows(alpha, n):
    """alpha <= 3/2 on rows of <= 256: Newton on ``F**(1/k)`` from the Jensen bound (no bracket, no start on
    the largest scores) takes few full-row rounds (at most 6 in [1.25, 2] as test_root_rule_rounds_float32 asks;
    at most 8 at alpha = 1.1), and float32 agrees with float64."""
    mod = importlib.import_module("numeric._generated.entmax_sparse")
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((512, n)) * rng.uniform(0.05, 10, (512, 1))).astype(np.float32)
    x[::7, n // 2:] = -np.inf
    ops = counting_ops(np.float32)
    with np.errstate(all="ignore"):
        p, _ = rules.solve(ops, numpy_routines(mod, (np.float32(alpha),)), x)
        p64, _ = rules.solve(ops_for(np.float64), numpy_routines(mod, (alpha,)), x.astype(np.float64))
    assert len(ops.rounds) == 1 and ops.rounds[0] <= (6 if alpha >= 1.25 else 8), ops.rounds
    np.testing.assert_allclose(p.astype(np.float64).sum(-1), 1, atol=1e-5)
    np.testing.assert_allclose(p, p64, atol=2e-6)


@pytest.mark.parametrize("name", ["entmax15", "entmax"])
@pytest.mark.parametrize("n", [257, 1000, 4096])
def test_root_rule_equals_sort_rule_on_long_rows(name, n):
    """Long rows: the root rule (solve with method="root" for 1.5-entmax, alpha-entmax at alpha = 1.5) against
    1.5-entmax's sort rule on whole rows (method="sort"), also on rows of near-equal scores (a support of the
    whole row)."""
    mod = importlib.import_module(f"numeric._generated.{name}")
    params = (1.5,) if name == "entmax" else ()
    r = numpy_routines(mod, params)
    r15 = numpy_routines(importlib.import_module("numeric._generated.entmax15"))
    ops = ops_for(np.float64)
    rng = np.random.default_rng(n)
    x = rng.standard_normal((40, n)) * rng.uniform(0.05, 10, (40, 1))
    x[::9, ::3] = -np.inf
    flat = x.copy()
    flat[:20] = rng.uniform(-1e-3, 0, (20, n))  # every score in the support
    for rows in (x, flat):
        with np.errstate(all="ignore"):
            got, _ = rules.solve(ops, r, rows, method="root")
            want, _ = rules.solve(ops, r15, rows, method="sort")
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def _row_ops(target, dtype):
    """A target's TensorOps and its array constructor (skipped where the target is not installed)."""
    if target == "numpy":
        return ops_for(dtype), lambda a: np.asarray(a, dtype=dtype), np.asarray
    if target == "torch":
        torch = pytest.importorskip("torch")
        from numeric.torch._ops import ops_for as torch_ops

        tdtype = getattr(torch, np.dtype(dtype).name)
        return torch_ops(tdtype), lambda a: torch.tensor(a, dtype=tdtype), lambda t: t.numpy()
    pytest.importorskip("jax")
    import jax.numpy as jnp

    from numeric.jax._ops import ops_for as jax_ops

    return jax_ops(jnp.float32 if dtype == np.float32 else jnp.float64), lambda a: jnp.asarray(a, dtype=dtype), np.asarray


@pytest.mark.parametrize("target", ["numpy", "torch", "jax"])
def test_at_most_and_rare_on_every_target(target):
    """``at_most(x, v)`` is ``where(x < v, x, v)`` (NaN to v, -inf kept); ``rare(pred, fn, otherwise)`` gives
    ``fn()``'s values whether or not a target skips ``fn`` where ``pred`` is false everywhere."""
    if target == "jax":
        with pytest.importorskip("jax").enable_x64(True):
            _at_most_and_rare(target)
    else:
        _at_most_and_rare(target)


def test_at_most_traced_in_torch():
    """Under ``torch.compile`` torch's ``at_most`` is a comparison and a where (eager torch clamps and mends NaN):
    the same values, NaN and +inf to ``v``, -inf kept."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch._dynamo")
    ops, array, host = _row_ops("torch", np.float32)
    x = np.array([[-np.inf, -3.0, 0.5, 1.0, 1.5, np.inf, np.nan, 1 - 2.0**-24]], dtype=np.float32)
    traced = torch.compile(lambda a: ops.at_most(a, 1.0), backend="aot_eager", fullgraph=True)
    for got in (host(traced(array(x))), host(ops.at_most(array(x), 1.0))):
        np.testing.assert_array_equal(got, np.where(x < 1, x, np.float32(1)))


def _at_most_and_rare(target):
    ops, array, host = _row_ops(target, np.float32)
    x = np.array([[-np.inf, -3.0, 0.5, 1.0, 1.5, np.inf, np.nan, 1 - 2.0**-24]], dtype=np.float32)
    got = host(ops.at_most(array(x), 1.0))
    np.testing.assert_array_equal(got, np.where(x < 1, x, np.float32(1)))
    assert got.dtype == np.float32
    a, b = array(x), array(np.arange(8.0).reshape(1, 8))
    for pred in (np.zeros((1, 8), bool), np.eye(1, 8, 3, dtype=bool)):
        want = np.where(pred, x, np.arange(8.0, dtype=np.float32))
        mask = array(pred) > 0
        got = host(ops.rare(mask, lambda: ops.where(mask, a, b), lambda: b))
        np.testing.assert_array_equal(got, want)
