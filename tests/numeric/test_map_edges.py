"""Edge cases of the root-solved maps against independent truths.

alpha-entmax at large alpha (the sum constraint where ``F`` jumps across 1 at a
kink), constant rows (every weight underflowing), float32 on wide supports (the
link's base cancelling), the generic root path at kinks, and wide float dtypes.
Truths: the 50-digit reference (more digits where it needs them), KKT
conditions, symmetry (a constant row is uniform), float64 on the same float32
row, and the entmax package.
"""

from __future__ import annotations

import importlib
import math
import random

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import numeric as nm
from derive import Regularizer, derive_map, generate_module
from derive import reference as R
from derive.codegen.files import load_module

from .conftest import derivation


def tsallis_reference(x, alpha):
    """Reference alpha-entmax of one row, with enough digits for the row.

    At a kink the link's base of the entering score is below ``10**-digits`` and its
    ``p = base**(1/(alpha - 1))`` is resolved only to ``10**(-digits / (alpha - 1))``:
    where the 50-digit answer does not sum to 1 within 1e-30, evaluate again with
    ``17 (alpha - 1) + 40`` digits.
    """
    row = [float(v) for v in x]
    want = derivation("entmax").evaluate(row, digits=50, alpha=float(alpha))
    if abs(sum(want) - 1) > 1e-30:
        want = derivation("entmax").evaluate(row, digits=int(17 * (alpha - 1)) + 40, alpha=float(alpha))
    return np.array([float(v) for v in want])


def kink_tolerance(want, alpha, scale=1e-12):
    """``scale`` times the sum of the Jacobian weights ``w = p**(2 - alpha)`` on the support but the largest.

    One ulp of a score moves ``p_i`` by about ``eps w_i``; the score with the largest
    weight (at a kink, unbounded) is fixed by the sum constraint, so it carries the
    others' errors, not its own.
    """
    support = np.sort(want[want > 0] ** (2 - alpha))
    return scale * max(1.0, float(support[:-1].sum()))


# ------------------------------------------------- alpha-entmax at large alpha
def test_large_alpha_row_from_the_issue():
    x = np.array([.2227, -.0053, .1203, -.0124, .0394, .0365, .0265, .0658])
    want = tsallis_reference(x, 10.0)
    assert want[0] == pytest.approx(0.991, abs=1e-3) and want[2] == pytest.approx(0.009, abs=1e-3)
    np.testing.assert_allclose(nm.entmax(x, 10.0), want, rtol=0, atol=1e-12)


@given(
    x=st.lists(st.one_of(st.floats(-1, 1), st.floats(-0.05, 0.05), st.integers(-2, 2).map(float)), min_size=2, max_size=10),
    alpha=st.one_of(st.floats(2.0, 20.0), st.sampled_from([10.0, 16.0, 20.0])),
)
@example(x=[0.0, 0.0625, 1e-20], alpha=13.0)  # found by the thorough profile: 0 and 1e-20 tie once shifted
def test_large_alpha_matches_reference(x, alpha):
    x = np.array(x)
    # the truth of the shifted row y = fl(x - max(x)), the problem float64 can state: 0 and 1e-20 beside
    # a maximum of 0.0625 round to the same y (a backward error below half an ulp of each score), while
    # at a kink the reference gives all the entering mass to the larger of two scores 1e-20 apart
    want = tsallis_reference(x - x.max(), alpha)
    got = nm.entmax(x, alpha)
    np.testing.assert_allclose(got, want, rtol=0, atol=kink_tolerance(want, alpha))


@pytest.mark.parametrize("alpha", [10.0, 16.0, 20.0])
def test_large_alpha_batches_meet_kkt(alpha):
    """Many rows: the KKT conditions (one threshold for the whole support) hold on every row."""
    x = np.random.default_rng(int(alpha)).standard_normal((400, 8)) * 0.1
    p = nm.entmax(x, alpha)
    np.testing.assert_allclose(p.sum(-1), 1, rtol=0, atol=1e-14)
    worst = max(float(R.kkt_residual(derivation("entmax_sparse"), x[r].tolist(), p[r].tolist(), digits=30, alpha=alpha))
                for r in range(x.shape[0]))
    assert worst < 1e-12


@pytest.mark.parametrize("alpha", [10.0, 20.0])
def test_large_alpha_reference_on_random_rows(alpha):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((40, 8)) * 0.1
    got = nm.entmax(x, alpha)
    for r in range(x.shape[0]):
        want = tsallis_reference(x[r], alpha)
        np.testing.assert_allclose(got[r], want, rtol=0, atol=kink_tolerance(want, alpha))


@pytest.mark.parametrize("form", ["power", "general"])
def test_generic_root_map_at_kinks(tmp_path, form, halley_forms, piece_solves):
    """omega = p**12 has g(z) = (z/12)**(1/11), an infinite slope at the clip.  It is derived to be of
    the power form, solved by Newton on the piece of the root between two kinks; with LINK_FORM set to "general"
    the generic root path runs (safeguarded Halley): the same p."""
    d = derive_map(Regularizer.from_string("p**12", name="power12"))
    assert d.inversion.form.form == "power"
    path = tmp_path / "power12.py"
    path.write_text(generate_module(d, "power12"))
    module = load_module(path)
    module.LINK_FORM = form
    assert module.THRESHOLD == "root"
    forms = halley_forms  # the power form each safeguarded Halley solve is given (None: the generic path)
    x = np.random.default_rng(3).standard_normal((60, 6)) * 0.1
    got = nm.get_map(module)(x)
    if form == "power":
        assert piece_solves and not forms
    else:
        assert forms and all(power is None for power in forms) and not piece_solves
    np.testing.assert_allclose(got.sum(-1), 1, rtol=0, atol=1e-14)
    for r in range(x.shape[0]):
        want = np.array([float(v) for v in d.evaluate(x[r].tolist(), digits=200)])
        support = np.sort(1 / (132 * want[want > 0] ** 10))  # w = 1/omega''(p)
        atol = 1e-12 * max(1.0, float(support[:-1].sum()))
        np.testing.assert_allclose(got[r], want, rtol=0, atol=atol)



@pytest.fixture(scope="module")
def steep_powers(tmp_path_factory):
    """Generated modules of omega = p**k for k = 30, 100: links (z/k)**(1/(k - 1)), steep at every kink."""
    folder = tmp_path_factory.mktemp("steep")
    out = {}
    for k in (30, 100):
        d = derive_map(Regularizer.from_string(f"p**{k}", name=f"power{k}"))
        assert d.inversion.form.form == "power"
        for form in ("power", "general"):  # the derived form, and the generic root path forced
            name = f"power{k}_{form}"
            path = folder / f"{name}.py"
            path.write_text(generate_module(d, name))
            module = load_module(path)
            module.LINK_FORM = form
            out[k, form] = d, module
    return out


def power_truth(d, k, y):
    """The 200-digit ``p*`` and ``tau`` of the shifted row ``y`` and an error bound for a float64 solver.

    The solver works on ``y`` and resolves ``tau`` to a few ulps: each ``p_i = g_+(y_i - tau)``
    is then known only within ``dp_i = g_+(z_i + delta) - g_+(z_i - delta)``, ``z_i = y_i - tau``,
    ``delta = 8 ulp(1 + |y_i|)``, ``g_+(z) = max(z/k, 0)**(1/(k - 1))``.  This is first order
    (``w_i delta``) away from the kink and up to ``g(delta)`` at it.  The score with the largest
    ``dp`` is fixed by the sum constraint, so the bound is the sum of the others' ``dp``.
    """
    import mpmath

    with mpmath.workdps(200):
        want = d.evaluate(y.tolist(), digits=200)
        tau = R.threshold(d, y.tolist(), digits=200)
        link = lambda z: (max(z, 0) / k) ** (mpmath.mpf(1) / (k - 1))  # noqa: E731
        spread = []
        for v in y:
            delta = 8 * np.spacing(1 + abs(float(v)))
            z = mpmath.mpf(float(v)) - tau
            spread.append(float(link(z + delta) - link(z - delta)))
    spread = np.sort(spread)
    return np.array([float(v) for v in want]), float(tau), 1e-14 + float(spread[:-1].sum())


@pytest.mark.parametrize("form", ["power", "general"])
def test_steep_power_row_at_a_kink(steep_powers, form):
    """omega = p**100 on a row whose threshold lies 1e-131 below its second score: F jumps from 0.955 to
    1.65 across one ulp of tau (a solve on the row's 32 largest scores alone stops with F < 1 on the wrong
    side of tau)."""
    d, module = steep_powers[100, form]
    draw = random.Random(0)
    for _ in range(5):
        draw.gauss(0, 2)
    for _ in range(5):
        row = np.array([draw.gauss(0, 3) for _ in range(draw.randint(1, 40))])
    y = row - row.max()
    want, tau, bound = power_truth(d, 100, y)
    assert row.size == 35 and 0.04 < np.sort(want)[-2] < 0.05
    np.testing.assert_allclose(nm.get_map(module)(row), want, rtol=0, atol=bound)
    assert bound < 1e-12
    # tau comes from the solver's bracket of a few ulps (the Newton step from the kink lands far outside)
    got = nm.get_map(module).forward(row[None, :])[1][0] - row.max()
    assert got == pytest.approx(tau, rel=0, abs=1e-15 * (1 + abs(tau)))


@given(
    rows=st.lists(st.lists(st.floats(-9, 9), min_size=1, max_size=40), min_size=1, max_size=6),
    k=st.sampled_from([30, 100]),
    top=st.integers(0, 3),
    form=st.sampled_from(["power", "general"]),
)
def test_steep_powers_match_reference(steep_powers, rows, k, top, form):
    """Batches of rows of up to 40 scores, some with the top scores tied."""
    d, module = steep_powers[k, form]
    n = max(len(r) for r in rows)
    x = np.full((len(rows), n), -np.inf)
    for i, r in enumerate(rows):
        x[i, : len(r)] = r
        x[i, : min(top, len(r))] = max(r)
    got, taus = nm.get_map(module).forward(x)
    taus = taus - x.max(-1)
    for i, r in enumerate(rows):
        # the truth of the shifted row: subtracting the maximum rounds (a backward error of half an
        # ulp of each y_i); scores 1e-71 apart become equal and tie exactly at a kink
        y = x[i, : len(r)] - x[i].max()
        want, tau, bound = power_truth(d, k, y)
        np.testing.assert_allclose(got[i, : len(r)], want, rtol=0, atol=bound)
        assert (got[i, len(r):] == 0).all()
        assert taus[i] == pytest.approx(tau, rel=0, abs=1e-15 * (1 + abs(tau)))

# --------------------------------------------------------- constant rows
@given(
    n=st.integers(1, 5000),
    alpha=st.one_of(st.floats(1.01, 40.0), st.sampled_from([4.0, 10.0, 100.0, 1e3, 1e6])),
    value=st.sampled_from([0.0, 3.5, -1e6, 1e30]),
    dtype=st.sampled_from([np.float32, np.float64]),
    masked=st.integers(0, 3),
)
def test_constant_rows_are_uniform(n, alpha, value, dtype, masked):
    x = np.full(n, value, dtype=dtype)
    x[n - min(masked, n - 1):] = -np.inf
    count = int(np.isfinite(x).sum())
    p = nm.entmax(x, alpha)  # pytest turns the RuntimeWarning of a NaN into an error
    eps = float(np.finfo(dtype).eps)
    assert (p[:count] == p[0]).all() and (p[count:] == 0).all()
    # the division by the row sum: SIMD partial sums of count equal terms, count / 8 additions a lane
    np.testing.assert_allclose(p[:count], 1 / count, rtol=eps * (16 + count / 8), atol=0)


@pytest.mark.parametrize(("n", "alpha", "dtype"), [(1000, 4.0, np.float32), (100, 10.0, np.float64),
                                                     (4096, 20.0, np.float32), (100, 400.0, np.float64)])
def test_constant_rows_from_the_issue(n, alpha, dtype):
    p = nm.entmax(np.zeros(n, dtype), alpha)
    np.testing.assert_allclose(p, 1 / n, rtol=16 * float(np.finfo(dtype).eps))


def test_constant_scores_in_attention_and_loss():
    m = nm.get_map("entmax", alpha=10.0)
    rng = np.random.default_rng(0)
    q = np.zeros((2, 5, 4))  # every score 0: uniform weights
    k = rng.standard_normal((2, 300, 4))
    v = rng.standard_normal((2, 300, 3))
    out = nm.attention(q, k, v, mapping=m)
    np.testing.assert_allclose(out, np.broadcast_to(v.mean(axis=1, keepdims=True), out.shape), atol=1e-12)
    x = np.zeros((3, 200))
    value, grad = m.loss_and_grad(x, np.full((3, 200), 1 / 200), reduction="none")
    np.testing.assert_allclose(value, 0, atol=1e-12)
    np.testing.assert_allclose(grad, 0, atol=1e-15)


@pytest.mark.parametrize("alpha", [60.0, 400.0, 2000.0])
@pytest.mark.parametrize("scale", [1e-2, 1e-4, 1e-6])
def test_huge_alpha_long_rows(alpha, scale):
    """(1/n)**(alpha - 1) below float64's range: the ratio solver (no reference: it would need 17 alpha digits).

    Checks what holds exactly: a sum of 1, the order of the scores, ties equal, float32 (solved in
    float64) equal to float64 on the same scores, and the largest score alone when the others are
    out of reach (``(alpha - 1)(s_max - s_i) > 1``).
    """
    rng = np.random.default_rng(int(alpha))
    x = (-np.abs(rng.standard_normal((6, 3000))) * scale).astype(np.float32).astype(np.float64)
    x[:, 0] = 0.0
    x[1, 1] = 0.0  # a tie with the maximum
    x[2, 1:] -= 2 / (alpha - 1)  # every other score out of reach
    x[3, 2000:] = -np.inf
    p = nm.entmax(x, alpha)
    assert np.isfinite(p).all() and (p >= 0).all()
    np.testing.assert_allclose(p.sum(-1), 1, rtol=0, atol=1e-13)
    order = np.argsort(-x, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=-1)
    assert (np.diff(sorted_p, axis=-1) <= 1e-15).all()
    assert p[1, 0] == p[1, 1]
    assert p[2, 0] == 1 and (p[2, 1:] == 0).all()
    assert (p[3, 2000:] == 0).all()
    np.testing.assert_allclose(nm.entmax(x.astype(np.float32), alpha), p, rtol=0, atol=1e-6)


# ------------------------------------------------- float32 on wide supports
@pytest.mark.parametrize("alpha", [2.0, 2.5, 4.0])
@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1.0])
def test_float32_wide_supports_match_float64(alpha, scale):
    """L1 distance to float64 on the same float32 rows within 12 ulps of the row's mass.

    The floor is the power ``exp(k log(base))`` (numeric.core' power form): a relative error
    of about ``|log p|`` ulps on each ``p``, 8 at ``p = 1/4096`` (the entmax package's float32
    bisection: 5 to 290 ulps on these rows; before the shifted variable: up to 3e6 ulps).
    """
    x = (np.random.default_rng(int(alpha * 10)).standard_normal((8, 4096)) * scale).astype(np.float32)
    p32 = nm.entmax(x, alpha)
    p64 = nm.entmax(x.astype(np.float64), alpha)
    l1 = np.abs(p32.astype(np.float64) - p64).sum(-1)
    assert l1.max() <= 12 * np.finfo(np.float32).eps, l1.max()


def test_float32_wide_supports_match_the_entmax_package():
    torch = pytest.importorskip("torch")
    entmax = pytest.importorskip("entmax")
    x = (np.random.default_rng(1).standard_normal((8, 4096)) * 1e-6).astype(np.float32)
    p64 = nm.entmax(x.astype(np.float64), 4.0)
    theirs = entmax.entmax_bisect(torch.from_numpy(x.astype(np.float64)), alpha=4.0, dim=-1, n_iter=100).numpy()
    np.testing.assert_allclose(p64, theirs, rtol=0, atol=1e-12)
    np.testing.assert_allclose(nm.entmax(x, 4.0), p64, rtol=0, atol=1e-6)


def test_root_solver_variable_for_tsallis():
    """alpha-entmax iterates on t = -p_max**(alpha - 1) / (alpha - 1): tau - max(s) follows with the offset."""
    mod = importlib.import_module("numeric._generated.entmax")
    x = np.random.default_rng(0).standard_normal((20, 50))
    for alpha in (1.3, 2.0, 4.0):
        p, tau = nm.get_map(mod, alpha=alpha).forward(x)
        pmax = p.max(-1)
        want = x.max(-1) + (1 / alpha - pmax ** (alpha - 1)) / (alpha - 1)  # omega'(p_max) = s_max - tau
        np.testing.assert_allclose(tau, want, rtol=0, atol=1e-13)


# ------------------------------------------------------------- dtypes
@pytest.mark.skipif(np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps, reason="longdouble is float64 here")
@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "entmax"])
def test_longdouble_computes_in_float64(name):
    m = nm.get_map(name, **({"alpha": 1.3} if name == "entmax" else {}))
    x = np.array([0.0, 1e-10, 3e-10, -2e-10])  # differences float32 cannot hold
    got = m(x.astype(np.longdouble))
    assert got.dtype == np.longdouble
    want = [float(v) for v in derivation(name).evaluate(x.tolist(), digits=30, **({"alpha": 1.3} if name == "entmax" else {}))]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(got.astype(np.float64), m(x))
    loss = m.loss(x.astype(np.longdouble)[None], np.array([0]))
    assert math.isclose(float(loss), float(m.loss(x[None], np.array([0]))), rel_tol=0, abs_tol=0)


@pytest.mark.parametrize("name", ["entmax15", "sparsemax"])
@pytest.mark.parametrize("ties", [12, 31, 40, 120, 700])
def test_one_score_above_many_ties_sums_to_one(name, ties):
    """One score 1.94 above many tied ones (the sort rule's prefix sums cancel there): p sums to 1 to rounding
    and is the 30-digit reference's.  The prefix sums lose up to ``k + 1`` ulps on a support of ``k``
    (documented in numeric.core.rules): a row whose loss is above ``CANCELLATION`` is solved about its mean."""
    from numeric.core.rules import CANCELLATION

    from .conftest import derivation

    x = np.array([4.938726034089008] + [3.0] * ties)
    p = getattr(nm, name)(x)
    want = np.array(derivation(name).evaluate(list(map(float, x)), digits=30), dtype=float)
    lost = x.size + 1 if x.size <= CANCELLATION else 0
    assert abs(p.sum() - 1) <= np.finfo(float).eps * (8 * math.log2(x.size) + lost)
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-14)
