"""The bounded solve of :mod:`numeric.core` (``box_solve``, ``box_vjp``) on NumPy rows, against the
bounded mpmath reference (:mod:`derive.box`): values and thresholds to 1e-12 in float64 for the built-ins, the
entmax family on both sides of 1 and typed maps with no closed-form link; the vector-Jacobian products in the
scores, the bounds and the total against the reference's Jacobians."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import numeric as nm
from numeric import family
from derive.box import box_jacobians, solve_box
from numeric.constraints.box import box_jvp, box_solve, box_vjp
from numeric.numpy.ops import ops_for

from tests.numeric.conftest import case_derivation, numpy_routines

BOX_MAPS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3}),
            ("entmax", {"alpha": 0.6}), ("shannon_gini", {}), ("gini_log1p", {})]
BOX_IDS = [name + "".join(f"-{k}{v}" for k, v in params.items()) for name, params in BOX_MAPS]


def _routines(name, params):
    module = family.resolve(nm.get_map(name, **params).module, params)
    return numpy_routines(module, tuple(params.values()))


def _solve(name, params, x, upper, total):
    with np.errstate(all="ignore"):
        return box_solve(ops_for(np.float64), _routines(name, params), x, upper, total)


@st.composite
def bounded_rows(draw):
    """Rows of scores with masks, bounds per entry (some 0, some none) and totals the bounds allow."""
    rows, n = draw(st.integers(1, 4)), draw(st.integers(2, 7))
    x = draw(hnp.arrays(np.float64, (rows, n), elements=st.one_of(st.floats(-4, 4), st.just(-np.inf))))
    x[:, 0] = np.where(np.isfinite(x[:, 0]), x[:, 0], 0.0)  # (every row keeps a score)
    upper = draw(hnp.arrays(np.float64, (rows, n), elements=st.sampled_from([0.0, 0.1, 0.3, 0.6, 1.0, np.inf])))
    upper[:, 0] = np.where(upper[:, 0] > 0, upper[:, 0], 1.0)
    room = np.where(np.isfinite(x), upper, 0).sum(-1, keepdims=True)
    share = draw(hnp.arrays(np.float64, (rows, 1), elements=st.floats(0.05, 0.95)))  # (sum u = total exactly: p = u, decided by rounding)
    total = np.minimum(share * np.minimum(room, 3.0), 2.5)
    return x, upper, total


@pytest.mark.parametrize(("name", "params"), BOX_MAPS, ids=BOX_IDS)
@settings(max_examples=8, deadline=None)
@given(case=bounded_rows())
def test_box_solve_matches_the_reference(name, params, case):
    x, upper, total = case
    p, tau = _solve(name, params, x, upper, total)
    dv, rest = case_derivation(name, params)
    for i in range(x.shape[0]):
        ref = solve_box(dv, x[i].tolist(), upper=upper[i].tolist(), total=float(total[i, 0]), digits=30, **rest)
        np.testing.assert_allclose(p[i], [float(v) for v in ref.p], rtol=0, atol=1e-12)
        assert np.all(p[i] <= upper[i]) and abs(p[i].sum() - total[i, 0]) <= 1e-14 * max(1.0, total[i, 0])


@pytest.mark.parametrize(("name", "params"), BOX_MAPS, ids=BOX_IDS)
def test_no_bound_is_the_map(name, params):
    """``upper = inf``, ``total = 1``: the plain map's ``p`` and ``tau``."""
    x = np.random.default_rng(1).standard_normal((5, 9)) * np.array([[0.1], [1], [3], [10], [1]])
    x[4, 2:5] = -np.inf
    p, tau = _solve(name, params, x, np.full(x.shape, np.inf), np.ones((5, 1)))
    m = nm.get_map(name, **params)
    want, want_tau = m.forward(x)
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-13)
    np.testing.assert_allclose(tau[:, 0], want_tau, rtol=1e-12, atol=1e-12)


def test_rows_that_cannot_be_solved():
    """A fully masked row gives 0 and ``tau = inf``, a NaN row NaN, a row whose bounds cannot hold the total NaN
    (the front end refuses it by name before)."""
    x = np.array([[0.0, 1.0, 2.0], [-np.inf, -np.inf, -np.inf], [np.nan, 0.0, 1.0], [0.5, 0.2, -np.inf]])
    upper = np.array([[0.5, 0.5, 0.5], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.4, 0.4, 5.0]])
    p, tau = _solve("sparsemax", {}, x, upper, np.ones((4, 1)))
    assert np.allclose(p[0], [0.0, 0.5, 0.5]) and np.all(p[1] == 0) and tau[1, 0] == np.inf
    assert np.all(np.isnan(p[2])) and np.isnan(tau[2, 0])
    assert np.all(np.isnan(p[3])) and np.isnan(tau[3, 0])  # 0.8 < 1 on the unmasked entries


def test_budget_sparsemax_saturates_the_top_scores():
    """``upper = 1``, ``total = k``: the top scores far above the rest take 1 each."""
    x = np.array([[5.0, 4.0, 0.1, 0.0, -0.2]])
    p, _ = _solve("sparsemax", {}, x, np.ones_like(x), np.full((1, 1), 2.0))
    np.testing.assert_array_equal(p, [[1.0, 1.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(("name", "params"), BOX_MAPS, ids=BOX_IDS)
def test_box_vjp_is_the_references_jacobians(name, params):
    """``J^T v`` in the scores, the bounds and the total against :func:`derive.box.box_jacobians`."""
    rng = np.random.default_rng(3)
    x = np.array([[4.0, 0.3, 0.2, -0.4, 0.1], [2.5, 0.4, 0.45, -1.0, 0.0]])
    upper = np.array([[0.35, 0.3, 1.0, 1.0, np.inf], [0.3, 0.25, 0.3, 1.0, 0.3]])
    total = np.array([[0.9], [1.0]])
    p, _ = _solve(name, params, x, upper, total)
    v = rng.standard_normal(x.shape)
    with np.errstate(all="ignore"):
        js, ju, jc = box_vjp(ops_for(np.float64), _routines(name, params), p, v, upper)
    dv, rest = case_derivation(name, params)
    for i in range(2):
        jac = box_jacobians(dv, x[i].tolist(), upper=upper[i].tolist(), total=float(total[i, 0]), digits=30, **rest)
        as_array = {k: np.array([[float(e) for e in row] for row in jac[k]]) for k in ("scores", "upper")}
        np.testing.assert_allclose(js[i], as_array["scores"].T @ v[i], rtol=0, atol=1e-11)
        np.testing.assert_allclose(ju[i], as_array["upper"].T @ v[i], rtol=0, atol=1e-11)
        np.testing.assert_allclose(jc[i, 0], np.array([float(e) for e in jac["total"]]) @ v[i], rtol=0, atol=1e-11)
    assert np.all(ju[:, 0] != 0), "entry 0 must be saturated"
    # forward mode, box_jvp, is the transpose: <J_s dx + J_u du + J_c dc, v> = <dx, js> + <du, ju> + dc jc
    dx, du, dc = rng.standard_normal(x.shape), rng.standard_normal(x.shape), rng.standard_normal((2, 1))
    with np.errstate(all="ignore"):
        tangent = box_jvp(ops_for(np.float64), _routines(name, params), p, dx, du, dc, upper)
    np.testing.assert_allclose((tangent * v).sum(-1), (dx * js).sum(-1) + (du * ju).sum(-1) + dc[:, 0] * jc[:, 0],
                               rtol=1e-12, atol=1e-12)
    assert np.all(np.abs(tangent.sum(-1) - dc[:, 0]) < 1e-12)  # the total moves by dc
