"""The Fenchel-Young loss on the simplex on every backend (NumPy's ``Map.loss``/``loss_and_grad``,
``numeric.torch.fenchel_young_loss``, ``numeric.jax.fenchel_young_loss``), each property written once: values and
gradients, the gradient checks to second order (the Hessian in the scores is the map's Jacobian), the gradient in
alpha (the envelope theorem), half precision, errors.

Truths: the mpmath reference loss (:func:`derive.reference.loss`) for NumPy's, and NumPy's for the other backends;
cross-entropy for softmax's; central differences; the frameworks' own gradient checks.  Bounded losses:
tests/constraints/test_box.py; edges (regularizers infinite at 0, overflowing spreads): test_loss_edges.py.
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import sympy as sp
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import numeric as nm
from derive import reference as R
from tests.backends import backend_params
from tests.profile import backend_grid, crossed
from tests.numeric.conftest import FRAMEWORK_IDS as IDS
from tests.numeric.conftest import FRAMEWORK_MAPS as MAPS
from tests.numeric.conftest import PARAMS, USER, case_derivation

INF = math.inf
EVERY = backend_params()
AUTODIFF = backend_params("autodiff")
#: the shape of the scores of most tests: one compiled JAX program per map and derivative serves them all
ROWS = (12, 9)
#: how close each framework's loss is to NumPy's
LOSS_ATOL = {"torch": 1e-12, "jax": 1e-10}


def _scores(seed, shape=ROWS, scale=3.0):
    return np.random.default_rng(seed).normal(size=shape) * scale


def _loss(backend, m, x, target, reduction="mean"):
    """``backend``'s loss of the map ``m`` (its own) with NumPy arrays in and out."""
    return backend.numpy(backend.loss(m, backend.array(x), backend.array(target), reduction=reduction))


# ------------------------------------------------------------------------------- against NumPy's
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_loss_and_gradient_match_numpy(backend, name, params, reduction):
    """Labels, distributions (one with a 0 on a masked score) and the map's own output, on scores with a masked
    score, a fully masked row (loss 0, gradient 0) and a NaN row; a target's mass on a masked score: infinite."""
    m, bm = nm.get_map(name, **params), backend.get_map(name, **params)
    x = _scores(19)
    x[1, 3] = -INF
    x[2] = -INF
    x[4, 1] = math.nan
    labels = np.random.default_rng(20).integers(0, 9, size=12)
    labels[1] = 0
    dist = np.random.default_rng(21).dirichlet(np.ones(9), size=12)
    dist[1, 3] = 0
    dist[1] /= dist[1].sum()
    at_p = m(x)
    at_p[2] = dist[2]  # (the fully masked row has p = 0: a distribution there, infinite loss as for the others)
    at_p[4] = dist[4]
    for target in (labels, dist, at_p):
        value, grad = m.loss_and_grad(x, target, reduction=reduction)
        np.testing.assert_allclose(_loss(backend, bm, x, target, reduction), value, rtol=1e-12,
                                   atol=LOSS_ATOL[backend.name], equal_nan=True)
        t = backend.array(target)
        g = backend.grad(lambda s: backend.loss(bm, s, t, reduction=reduction).sum(), backend.array(x))
        np.testing.assert_allclose(g, grad, rtol=0, atol=1e-12, equal_nan=True)
        assert np.isnan(g[4]).all()
    bad = np.zeros(ROWS)
    bad[:, 3] = 1
    assert _loss(backend, bm, x, bad, "none")[1] == INF


# (the CI profile checks each map in one framework, the pairs that tests/maps/test_derivatives.py's second-order check
# leaves out: between them every pair; the thorough profile every pair in each)
@pytest.mark.parametrize(("backend", "name", "params"), backend_grid(crossed(zip(IDS, MAPS), AUTODIFF, start=1)),
                         indirect=["backend"])
def test_gradient_checks_and_the_hessian_is_the_jacobian(backend, name, params):
    """The loss's derivatives in the scores to second order by the framework's check, for labels and
    distributions; its Hessian in one row's scores is the map's Jacobian."""
    bm = backend.get_map(name, **params)
    x = backend.array(_scores(22, scale=1.5))
    for y in (np.random.default_rng(23).dirichlet(np.ones(ROWS[1]), size=ROWS[0]),
              np.random.default_rng(23).integers(0, ROWS[1], size=ROWS[0])):
        y = backend.array(y)
        backend.check_grads(lambda s: backend.loss(bm, s, y, reduction="sum"), x, order=2)
    y0 = backend.array(np.random.default_rng(23).dirichlet(np.ones(ROWS[1])))
    h = backend.hessian(lambda r: backend.loss(bm, r, y0, reduction="sum"), x[0])
    np.testing.assert_allclose(h, backend.jacobian(lambda r: backend.call(bm, r), x[0]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("alpha", [1.2, 1.5, 2.5])
@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_gradient_in_alpha(backend, alpha):
    """A number's (to second order) and one per row (first order) by the framework's check; central differences
    of the loss in alpha; and the envelope theorem: the derivative at fixed ``p`` (``sum omega_alpha(y) -
    omega_alpha(p)``) is the total derivative, as ``p`` is optimal."""
    x = backend.array(_scores(24, scale=1.5))
    labels = np.random.default_rng(25).integers(0, ROWS[1], size=ROWS[0])
    y = backend.array(labels)

    def loss(a, reduction="sum"):
        return backend.loss(backend.get_map("entmax", alpha=a), x, y, reduction=reduction)

    backend.check_grads(lambda a: loss(a, "mean"), backend.array(np.asarray(alpha)), order=2)
    per_row = np.full((ROWS[0], 1), alpha)
    assert backend.grad(loss, backend.array(per_row)).shape == (ROWS[0], 1)
    backend.check_grads(loss, backend.array(per_row), order=1)
    g = float(backend.grad(loss, backend.array(np.asarray(alpha))))
    h = 1e-6
    fd = (float(backend.numpy(loss(alpha + h))) - float(backend.numpy(loss(alpha - h)))) / (2 * h)
    assert g == pytest.approx(fd, abs=1e-7)
    xs, xp = backend.numpy(x), backend.xp
    p = backend.array(nm.entmax(xs, alpha))
    omega = importlib.import_module(f"numeric.{backend.name}.maps").routine_table(
        nm.get_map("entmax", alpha=alpha).module)["omega"]  # (the printed omega on the framework's arrays)
    onehot = backend.array(np.eye(ROWS[1])[labels])

    def fixed(a):
        om = lambda q: xp.where(q > 0, omega(xp.where(q > 0, q, 1), a), 0)  # noqa: E731
        return (om(onehot) - om(p)).sum()

    assert g == pytest.approx(float(backend.grad(fixed, backend.array(np.asarray(alpha)))), rel=1e-10)


#: each framework's half precision, and how close its loss is to NumPy's of the rounded scores
HALF = {"torch": ("bfloat16", 1e-2), "jax": ("float16", 2e-3)}


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_half_precision(backend):
    """The loss keeps the scores' half dtype (computed in float32), close to NumPy's loss of the rounded scores."""
    name, rtol = HALF[backend.name]
    dtype = getattr(backend.xp, name)
    x = backend.astype(backend.array(_scores(26)), dtype)
    labels = np.arange(ROWS[0]) % ROWS[1]
    value = backend.loss(backend.get_map("entmax15"), x, backend.array(labels))
    assert value.dtype == dtype
    ref = nm.get_map("entmax15").loss(backend.numpy(backend.astype(x, backend.xp.float64)), labels)
    assert float(value) == pytest.approx(float(ref), rel=rtol)
    if backend.name == "torch":  # (its gradient in the scores' dtype; NumPy has no bfloat16 to hand it back in)
        xg = x.clone().requires_grad_()
        backend.loss(backend.get_map("entmax15"), xg, backend.array(labels)).backward()
        assert xg.grad.dtype == dtype


@pytest.mark.parametrize("backend", backend_params("jit"), indirect=True)
def test_loss_under_jit(backend):
    x, y = backend.array(_scores(26)), backend.array(np.arange(ROWS[0]) % ROWS[1])
    m = backend.get_map("entmax15")
    got = backend.jit(lambda s, t: backend.loss(m, s, t, reduction="sum"))(x, y)
    np.testing.assert_allclose(backend.numpy(got), backend.numpy(backend.loss(m, x, y, reduction="sum")), rtol=0,
                               atol=1e-12)


# ------------------------------------------------------------------------ against known values
@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "entmax"] + list(USER))
@given(x=hnp.arrays(np.float64, (3, 4), elements=st.floats(-4, 4)),
       t=hnp.arrays(np.int64, (3, 4), elements=st.integers(0, 4)))
def test_loss_gradient_and_zero(name, x, t):
    """NumPy's loss against the reference; its gradient ``p - y`` against central differences; 0 exactly at the
    map's own output, positive elsewhere (the Fenchel-Young inequality)."""
    assume((t.sum(-1) > 0).all())
    y = t / t.sum(-1, keepdims=True)
    m = nm.get_map(name, **PARAMS.get(name, {}))
    value, grad = m.loss_and_grad(x, y, reduction="sum")
    per_row = m.loss(x, y, reduction="none")
    assert per_row.shape == (3,) and (per_row >= -1e-12).all()
    assert value == pytest.approx(per_row.sum())
    np.testing.assert_allclose(grad, m(x) - y, atol=1e-15)
    h = 1e-6
    for j in range(4):
        e = np.zeros_like(x)
        e[:, j] = h
        fd = (m.loss(x + e, y, reduction="sum") - m.loss(x - e, y, reduction="sum")) / (2 * h)
        assert fd == pytest.approx(grad[:, j].sum(), abs=1e-6)
    assert np.abs(m.loss(x, m(x), reduction="none")).max() < 1e-12
    far = np.abs(y - m(x)).sum(-1) > 1e-3
    assert (per_row[far] > 0).all()
    for r in range(3):
        exact = [sp.Rational(int(v), int(t[r].sum())) for v in t[r]]
        dv, params = case_derivation(name, PARAMS.get(name, {}))
        want = float(R.loss(dv, x[r].tolist(), exact, digits=30, **params))
        assert per_row[r] == pytest.approx(want, abs=1e-10)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_softmax_loss_is_cross_entropy_and_mean_reduction(backend):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 7))
    labels = rng.integers(0, 7, 5)
    ce = np.log(np.exp(x).sum(-1)) - x[np.arange(5), labels]
    m = backend.get_map("softmax")
    assert float(_loss(backend, m, x, labels)) == pytest.approx(ce.mean(), abs=1e-14)
    t = backend.array(labels)
    if backend.name == "numpy":
        grad = nm.get_map("softmax").loss_and_grad(x, labels, reduction="mean")[1]
    else:
        grad = backend.grad(lambda s: backend.loss(m, s, t), backend.array(x))
    np.testing.assert_allclose(grad, (nm.softmax(x) - np.eye(7)[labels]) / 5, rtol=0, atol=1e-16)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_loss_masks_and_huge_scores(backend):
    """Finite with masked scores and scores of 1e30 (shifted by the row maximum first, so no precision is lost);
    infinite for a target's mass on a masked score."""
    m = backend.get_map("sparsemax")
    x = np.array([[1e30, 1e30 - 2e14, -INF], [0.0, 1.0, -INF]])
    assert np.isfinite(_loss(backend, m, x, np.array([0, 1]), "none")).all()
    assert _loss(backend, m, x, np.array([[0, 0, 1.0], [0, 0, 1.0]]), "none").tolist() == [INF, INF]
    assert float(_loss(backend, m, np.array([[1e30, 1e30]]), np.array([[0.5, 0.5]]), "sum")) == pytest.approx(
        0.0, abs=1e-15)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_nan_scores_give_nan_rows(backend):
    x = np.array([[np.nan, np.nan], [0.0, 1.0], [np.nan, 1.0]])
    value = _loss(backend, backend.get_map("sparsemax"), x, np.array([0, 1, 1]), "none")
    assert np.isnan(value[0]) and np.isfinite(value[1]) and np.isnan(value[2])


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_errors_name_the_argument(backend):
    x = _scores(27, shape=(2, 3))
    softmax = backend.get_map("softmax")
    with pytest.raises(ValueError, match="reduction must be"):
        _loss(backend, softmax, x, np.array([0, 1]), "avg")
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        _loss(backend, softmax, x, np.array([0, 3]))
    with pytest.raises(ValueError, match="integer labels must have shape"):
        _loss(backend, softmax, x, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="target must be a distribution"):
        _loss(backend, softmax, x, np.full((2, 3), 0.5))
    with pytest.raises(ValueError, match=f"target must be a distribution along {backend.axis_word} 1.*summing to 1.5"):
        _loss(backend, softmax, np.zeros((2, 3)), np.array([[0.5, 0.5, 0.5], [1.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="negative entry"):
        _loss(backend, softmax, np.zeros((2, 3)), np.array([[1.5, -0.5, 0.0], [1.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="target must be a distribution"):
        _loss(backend, softmax, np.zeros((2, 3)), np.array([[np.nan, 0.5, 0.5], [1.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="does not match scores"):
        _loss(backend, softmax, x, np.array([[0.5, 0.5], [0.5, 0.5]]))
    with pytest.raises(ValueError, match="needs a value for alpha"):
        _loss(backend, backend.get_map("entmax"), x, np.array([0, 1]))
    # a computed float32 distribution passes (rounding within sqrt(eps))
    y = nm.softmax(np.random.default_rng(0).standard_normal((4, 1000)).astype(np.float32))
    assert np.isfinite(backend.numpy(backend.loss(softmax, backend.array(np.zeros((4, 1000)), np.float32),
                                                  backend.array(y, np.float32))))


@pytest.mark.parametrize("backend", backend_params(only=("torch",)), indirect=True)
def test_torch_module(backend):
    """``FenchelYoungLoss(mapping, reduction)`` as a module: the function's value and its checks."""
    from numeric.torch import FenchelYoungLoss

    torch = backend.torch
    loss = FenchelYoungLoss("sparsemax", reduction="sum")
    x = torch.tensor([[1.0, 0.5, -1.0]])
    assert float(loss(x, torch.tensor([0]))) == pytest.approx(0.0625)
    with pytest.raises(ValueError, match="reduction"):
        FenchelYoungLoss("softmax", reduction="avg")
    with pytest.raises(ValueError, match="labels must lie in"):
        loss(x, torch.tensor([3]))
