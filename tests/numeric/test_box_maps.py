"""Box constraints on the NumPy maps: ``m(x, axis, upper=, total=)``, ``jvp``/``vjp`` and ``vjp_bounds``.

Truths: the bounded mpmath reference (:mod:`derive.box`) for values, central differences of the map itself for
the derivatives in the scores, the bounds and the total, and the plain map where nothing binds.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

import numeric as nm
from derive.box import box_loss, box_loss_gradients, solve_box
from derive.reference import compiled

from .conftest import case_derivation

MAPS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 0.6}), ("shannon_gini", {})]
IDS = [name + "".join(f"-{k}{v}" for k, v in params.items()) for name, params in MAPS]


def _case(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 6, 3)) * 1.5
    x[1, 4, 2] = -np.inf
    upper = rng.choice([0.15, 0.3, 0.6, np.inf], size=x.shape)
    upper[:, :2] = 0.5  # (every row can hold its total)
    total = np.array([[[0.8, 1.0, 0.6]], [[0.9, 0.7, 1.0]]])  # size 1 along axis 1
    return x, upper, total


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_values_along_an_axis_match_the_reference(name, params):
    x, upper, total = _case()
    m = nm.get_map(name, **params)
    p = m(x, axis=1, upper=upper, total=total)
    dv, rest = case_derivation(name, params)
    for b in range(2):
        for j in range(3):
            ref = solve_box(dv, x[b, :, j].tolist(), upper=upper[b, :, j].tolist(), total=float(total[b, 0, j]),
                            digits=30, **rest)
            np.testing.assert_allclose(p[b, :, j], [float(v) for v in ref.p], rtol=0, atol=1e-12)
    p32 = m(x.astype(np.float32), axis=1, upper=upper, total=total)
    assert p32.dtype == np.float32
    np.testing.assert_allclose(p32, p, rtol=0, atol=3e-6)


def test_the_family_per_row_across_one_with_bounds():
    x, upper, total = _case(1)
    alpha = np.array([[[0.5, 1.0, 1.7]]])  # per row (size 1 along axis 1): dense, softmax, sparse
    p = nm.entmax(x, alpha, axis=1, upper=upper, total=total)
    for b in range(2):
        for j in range(3):
            dv, rest = case_derivation("entmax", {"alpha": float(alpha[0, 0, j])})
            ref = solve_box(dv, x[b, :, j].tolist(), upper=upper[b, :, j].tolist(), total=float(total[b, 0, j]),
                            digits=30, **rest)
            np.testing.assert_allclose(p[b, :, j], [float(v) for v in ref.p], rtol=0, atol=1e-12)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_no_binding_bound_is_the_plain_map(name, params):
    x = np.random.default_rng(2).standard_normal((4, 7))
    m = nm.get_map(name, **params)
    np.testing.assert_allclose(m(x, upper=np.inf, total=1.0), m(x), rtol=0, atol=1e-14)
    np.testing.assert_allclose(m(x, upper=2.0), m(x), rtol=0, atol=1e-14)


def _fd(f, a, h=1e-6):
    out = np.zeros(a.shape + f(a).shape)
    for idx in np.ndindex(a.shape):
        up, down = a.copy(), a.copy()
        up[idx] += h
        down[idx] -= h
        out[idx] = (f(up) - f(down)) / (2 * h)
    return out


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_derivatives_are_finite_differences_of_the_map(name, params):
    """``vjp`` in the scores, ``vjp_bounds`` in the bounds and the total, against central differences."""
    x = np.array([[2.0, 0.3, 0.2, -0.4, 0.1], [1.5, 0.4, 0.45, -1.0, 0.0]])
    upper = np.array([[0.35, 0.3, 1.0, 1.0, np.inf], [0.3, 0.25, 0.3, 1.0, 0.3]])
    total = np.array([[0.9], [1.0]])
    m = nm.get_map(name, **params)
    p = m(x, upper=upper, total=total)
    dy = np.random.default_rng(4).standard_normal(x.shape)
    got = m.vjp(p, dy, upper=upper, total=total)
    bounds = m.vjp_bounds(p, dy, upper=upper, total=total)
    want = np.einsum("abij,ij->ab", _fd(lambda a: m(a, upper=upper, total=total), x), dy)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
    finite = np.isfinite(upper)
    u0 = np.where(finite, upper, 5.0)
    fd_u = np.einsum("abij,ij->ab", _fd(lambda a: m(x, upper=np.where(finite, a, np.inf), total=total), u0), dy)
    np.testing.assert_allclose(np.where(finite, bounds["upper"], 0), fd_u, rtol=0, atol=1e-7)
    fd_c = np.einsum("abij,ij->ab", _fd(lambda a: m(x, upper=upper, total=a), total), dy)
    np.testing.assert_allclose(bounds["total"], fd_c[:, 0], rtol=0, atol=1e-7)
    assert np.all(bounds["upper"][:, 0] != 0)  # entry 0 saturates in both rows


def test_budget_sparsemax():
    x = np.array([[3.0, 2.9, 0.1, 0.0], [0.4, 0.3, 0.2, 0.1]])
    p = nm.sparsemax(x, upper=1, total=2)
    np.testing.assert_allclose(p[0], [1, 1, 0, 0], atol=1e-15)
    np.testing.assert_allclose(p[1], x[1] - (x[1].sum() - 2) / 4, atol=1e-15)  # every entry free


def test_bounds_are_checked_by_name():
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match=r"infeasible bounds: in row 1 .* sum to 0.9 < total = 1"):
        nm.sparsemax(x, upper=np.array([[0.5], [0.3]]))
    with pytest.raises(ValueError, match="infeasible"):  # a masked score's bound does not count
        nm.softmax(np.array([[0.0, -np.inf]]), upper=0.6)
    with pytest.raises(ValueError, match=">= 0"):
        nm.sparsemax(x, upper=np.array([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="total must be finite and > 0"):
        nm.sparsemax(x, total=-1.0)
    with pytest.raises(ValueError, match="total must be finite and > 0"):
        nm.sparsemax(x, total=np.inf)
    with pytest.raises(ValueError, match="upper of shape .* does not broadcast"):
        nm.sparsemax(x, upper=np.ones(4))
    with pytest.raises(ValueError, match="must have size 1 along axis"):
        nm.sparsemax(x, total=np.ones((2, 3)))
    with pytest.raises(TypeError, match="upper must be a real number"):
        nm.sparsemax(x, upper="1")


def _loss_case():
    """Two rows with a saturated bound each, away from kinks; a target inside the box, off its bounds."""
    x = np.array([[2.0, 0.3, 0.2, -0.4, 0.1], [1.5, 0.4, 0.45, -1.0, 0.0]])
    upper = np.array([[0.35, 0.3, 1.0, 1.0, np.inf], [0.3, 0.25, 0.3, 1.0, 0.3]])
    total = np.array([[0.875], [1.0]])
    y = np.array([[0.25, 0.25, 0.125, 0.125, 0.125], [0.25, 0.125, 0.25, 0.25, 0.125]])  # (sums exact in binary)
    return x, upper, total, y


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_loss_with_bounds_matches_the_reference(name, params):
    """The loss and its gradients in the scores, the bounds and the total against :mod:`derive.box`'s."""
    x, upper, total, y = _loss_case()
    m = nm.get_map(name, **params)
    value, grad, bounds = m.loss_and_grad(x, y, upper=upper, total=total, reduction="none", bounds=True)
    dv, rest = case_derivation(name, params)
    for i in range(2):
        args = (dv, x[i].tolist(), y[i].tolist())
        kw = dict(upper=upper[i].tolist(), total=float(total[i, 0]), digits=30, **rest)
        assert abs(value[i] - float(box_loss(*args, **kw))) < 1e-12
        ref = box_loss_gradients(*args, **kw)
        np.testing.assert_allclose(grad[i], [float(v) for v in ref["scores"]], rtol=0, atol=1e-12)
        np.testing.assert_allclose(bounds["upper"][i], [float(v) for v in ref["upper"]], rtol=0, atol=1e-10)
        assert abs(bounds["total"][i] - float(ref["total"])) < 1e-10
    assert np.all(bounds["upper"][:, 0] > 0)
    mean = m.loss_and_grad(x, y, upper=upper, total=total, bounds=True)
    assert mean[0] == pytest.approx(value.mean(), abs=1e-15)
    np.testing.assert_allclose(mean[2]["upper"], bounds["upper"] / 2, rtol=1e-15)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_loss_gradients_in_the_bounds_are_finite_differences(name, params):
    """``d loss / d u`` by central differences of the loss (the target fixed inside the box); ``d loss / d c`` with the
    target scaled to the total, ``tau + sum_i (omega'(y_i) - s_i) y_i / c``."""
    x, upper, total, y = _loss_case()
    m = nm.get_map(name, **params)
    _, _, bounds = m.loss_and_grad(x, y, upper=upper, total=total, reduction="sum", bounds=True)
    finite = np.isfinite(upper)
    u0 = np.where(finite, upper, 5.0)
    fd = _fd(lambda a: np.asarray(m.loss(x, y, upper=np.where(finite, a, np.inf), total=total, reduction="sum")), u0)
    np.testing.assert_allclose(np.where(finite, bounds["upper"], 0), fd, rtol=0, atol=1e-7)
    fd_c = _fd(lambda c: m.loss(x, y * (c / total), upper=upper, total=c, reduction="none"), total)
    dv, rest = case_derivation(name, params)
    op = compiled(dv, rest).d1  # omega' in mpmath
    for i in range(2):
        extra = sum((float(op(mpmath.mpf(v))) - s) * v for v, s in zip(y[i], x[i])) / total[i, 0]
        assert fd_c[i, 0, i] == pytest.approx(bounds["total"][i] + extra, abs=1e-7)


def test_loss_checks_the_target_against_the_box():
    x = np.zeros((1, 3))
    with pytest.raises(ValueError, match="summing to its total"):
        nm.get_map("sparsemax").loss(x, np.array([[0.5, 0.3, 0.2]]), total=2.0)
    with pytest.raises(ValueError, match="within the upper bounds; an entry exceeds its bound by 0.1"):
        nm.get_map("sparsemax").loss(x, np.array([[0.5, 0.3, 0.2]]), upper=0.4)
    with pytest.raises(ValueError, match="within the upper bounds"):  # a label's one-hot over its bound
        nm.get_map("softmax").loss(x, np.array([1]), upper=0.5)
    value = nm.get_map("sparsemax").loss(np.array([[3.0, 2.9, 0.1, 0.0]]), np.array([[1.0, 1.0, 0, 0]]), upper=1,
                                         total=2, reduction="none")
    assert value[0] == pytest.approx(0.0, abs=1e-15)  # budget sparsemax at its own top-2


def test_bounds_summing_to_the_total_within_rounding_are_feasible():
    """A decoder's remaining fertilities sum to the total only up to rounding (``1 - 1e-16``): feasible, every entry
    saturated (it raised "infeasible bounds ... sum to 1 < total = 1")."""
    upper = np.array([0.1, 0.2, 0.7 - 1e-16])
    assert upper.sum() < 1
    for name in ("softmax", "sparsemax", "entmax15"):
        p = nm.get_map(name)(np.array([0.3, 0.1, 0.5]), upper=upper)
        np.testing.assert_allclose(p, upper, rtol=0, atol=2e-16)
    p = nm.sparsemax(np.zeros(3), upper=np.array([0.1, 0.2, 0.7 - 1e-12]))  # within sqrt(eps): the total clipped
    np.testing.assert_allclose(p, [0.1, 0.2, 0.7 - 1e-12], rtol=0, atol=2e-16)
    with pytest.raises(ValueError, match="infeasible bounds"):  # beyond sqrt(eps) = 1.5e-8 of the total
        nm.sparsemax(np.zeros(3), upper=np.array([0.1, 0.2, 0.7 - 1e-7]))


def test_a_total_of_zero_is_refused():
    """``total`` must be finite and ``> 0``, as :func:`derive.box.solve_box` and docs/frameworks.md say: a total of 0
    leaves only ``p = 0``, at the edge of the feasible totals, where the derivatives in the total are one-sided.  It
    was taken as ``p = 0`` (issue 43, item 14); the other backends and traced calls: tests/numeric/test_box_edges.py."""
    x = np.array([[0.3, -1.0, 2.0], [0.0, 0.5, 1.0]])
    for name in ("softmax", "sparsemax", "entmax15"):
        m = nm.get_map(name)
        with pytest.raises(ValueError, match=r"total must be finite and > 0, got 0.0"):
            m.forward(x, upper=1.0, total=np.array([[0.0], [1.0]]))
        with pytest.raises(ValueError, match=r"total must be finite and > 0, got 0.0"):
            m(x, upper=1.0, total=0)


def test_fully_masked_and_nan_rows_with_bounds():
    """A fully masked row gives zeros with bounds as without (it was refused as "infeasible", which made
    ``upper=`` unusable with padding masks); a NaN row gives NaN and NaN derivatives (they were 0, or refused)."""
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, 1.0, np.nan], [0.0, 1.0, 2.0]])
    for name in ("softmax", "sparsemax", "entmax15"):
        m = nm.get_map(name)
        p = m(x, upper=0.6)
        np.testing.assert_array_equal(p[0], 0)
        assert np.isnan(p[1]).all() and np.all(np.isfinite(p[2]))
        d = m.vjp(p, np.ones_like(p), upper=0.6)
        np.testing.assert_array_equal(d[0], 0)
        assert np.isnan(d[1]).all() and np.all(np.isfinite(d[2]))
    q = np.zeros((1, 3, 2))
    mask = np.array([[False, False, False], [True, True, True], [True, True, True]])  # query 0 sees no key
    out = nm.attention(q, q, np.ones((1, 3, 2)), mask=mask, upper=0.6)
    np.testing.assert_array_equal(out[0, 0], 0)
