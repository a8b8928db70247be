"""No sum constraint (``total=None``: ``0 <= p <= upper`` alone) on the maps and the Fenchel-Young loss of every
backend: values, derivatives in the scores, the bounds and alpha, the loss and its gradients, known maps and errors.

Truths: :mod:`derive.nosum`, which solves each entry's one-dimensional argmax by bisection on ``omega'`` (no link,
so a typed map's values are checked against root finding); known closed forms (ReLU, ``exp(s - 1)``); central
differences of the NumPy map; the NumPy map for the other backends to float64's rounding.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import pytest

import numeric as nm
from derive.nosum import nosum_jacobians, nosum_loss, nosum_loss_gradients, solve_nosum
from tests.backends import backend_params
from tests.constraints.cases import TYPED as MAPS
from tests.constraints.cases import TYPED_IDS as IDS
from tests.numeric.conftest import case_derivation

INF = math.inf
EVERY = backend_params()
AUTODIFF = backend_params("autodiff")


def _scores(seed=0):
    """Scores ``(2, 5, 3)`` (the map along axis 1) with a masked score, and bounds of their shape, some infinite."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 5, 3)) * 1.5
    x[1, 3, 2] = -INF
    upper = rng.choice([0.2, 0.5, 1.5, INF], size=x.shape)
    return x, upper


@lru_cache(maxsize=None)
def _reference(name: str, items: tuple, seed: int = 0) -> np.ndarray:
    x, upper = _scores(seed)
    dv, rest = case_derivation(name, dict(items))
    out = np.zeros(x.shape)
    for b in range(2):
        for j in range(3):
            out[b, :, j] = [float(v) for v in solve_nosum(dv, x[b, :, j].tolist(), upper=upper[b, :, j].tolist(),
                                                           digits=30, **rest)]
    return out


def _call(backend, name, params, x, axis=-1, **keywords):
    m = backend.get_map(name, **params)
    return backend.numpy(backend.call(m, backend.array(x), axis, total=None,
                                      **{k: backend.array(v) for k, v in keywords.items()}))


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_values_match_the_one_dimensional_argmax(backend, name, params):
    x, upper = _scores()
    p = _call(backend, name, params, x, axis=1, upper=upper)
    np.testing.assert_allclose(p, _reference(name, tuple(params.items())), rtol=1e-12, atol=1e-13)
    assert p[1, 3, 2] == 0 and np.all(p <= upper)
    if backend.name != "numpy":
        np.testing.assert_allclose(p, nm.get_map(name, **params)(x, axis=1, total=None, upper=upper), rtol=1e-14,
                                   atol=1e-15)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_known_maps(backend):
    """Gini with no sum is ReLU; Shannon's ``exp(s - 1)``; the box's top clips either; scores ``+inf`` take the
    bound, masked ones 0, NaN ones NaN."""
    x = np.random.default_rng(3).standard_normal((4, 6)) * 2
    np.testing.assert_array_equal(_call(backend, "sparsemax", {}, x), np.maximum(x, 0))
    np.testing.assert_allclose(_call(backend, "softmax", {}, x), np.exp(x - 1), rtol=1e-15)
    np.testing.assert_allclose(_call(backend, "softmax", {}, x, upper=np.asarray(0.5)), np.minimum(np.exp(x - 1), 0.5),
                               rtol=1e-15)
    edge = np.array([[INF, -INF, np.nan, 0.5]])
    got = _call(backend, "entmax15", {}, edge, upper=np.array([[0.7, 0.7, 0.7, 2.0]]))
    # (1.5-entmax: omega'(p) = 2 sqrt(p) - 4/3)
    assert got[0, 0] == 0.7 and got[0, 1] == 0 and np.isnan(got[0, 2])
    assert got[0, 3] == pytest.approx(((0.5 + 4 / 3) / 2) ** 2, rel=1e-14)
    assert _call(backend, "sparsemax", {}, np.array([[INF, 1.0]]))[0, 0] == INF


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_numpy_derivatives_match_the_reference(name, params):
    x, upper = _scores(1)
    m = nm.get_map(name, **params)
    dv, rest = case_derivation(name, params)
    dy = np.random.default_rng(4).standard_normal(x.shape)
    p = m(x, axis=1, total=None, upper=upper)
    js = m.vjp(p, dy, axis=1, total=None, upper=upper)
    ju = m.vjp_bounds(p, dy, axis=1, total=None, upper=upper)["upper"]
    for b in range(2):
        for j in range(3):
            ref = nosum_jacobians(dv, x[b, :, j].tolist(), upper=upper[b, :, j].tolist(), digits=30, **rest)
            want_s = np.array([[float(v) for v in row] for row in ref["scores"]]) @ dy[b, :, j]
            want_u = np.array([[float(v) for v in row] for row in ref["upper"]]) @ dy[b, :, j]
            np.testing.assert_allclose(js[b, :, j], want_s, rtol=1e-11, atol=1e-13)
            np.testing.assert_allclose(ju[b, :, j], want_u, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(m.jvp(p, dy, axis=1, total=None, upper=upper), js, rtol=0, atol=0)


@pytest.mark.parametrize(("name", "params"), [MAPS[2], MAPS[4], MAPS[5], MAPS[6]], ids=[IDS[2], IDS[4], IDS[5], IDS[6]])
@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_gradient_checks_in_scores_bounds_and_alpha(backend, name, params):
    """Away from kinks (no entry at 0 or at its bound by a hair), to second order."""
    x = np.array([[0.9, 0.3, -0.2, 1.4], [0.1, 2.0, 0.6, -0.5]])
    upper = np.array([[1.5, 0.2, 1.0, 4.0], [0.9, 0.5, 3.0, 1.0]])
    m = backend.get_map(name, **params)
    backend.check_grads(lambda x, u: backend.call(m, x, -1, total=None, upper=u), backend.array(x), backend.array(upper))
    if params:
        alpha = backend.array(np.array([[1.3], [1.6]]))
        backend.check_grads(lambda x, a: backend.call(backend.get_map("entmax", alpha=a), x, -1, total=None),
                            backend.array(x), alpha, eps=1e-6)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_loss_and_its_gradients_match_the_reference(backend, name, params):
    x, upper = _scores(2)
    x, upper = x[0].T, upper[0].T  # (3, 5)
    y = np.minimum(np.random.default_rng(5).uniform(0, 1.2, x.shape), upper)
    dv, rest = case_derivation(name, params)
    want = [nosum_loss(dv, x[i].tolist(), y[i].tolist(), upper=upper[i].tolist(), digits=30, **rest) for i in range(3)]
    grads = [nosum_loss_gradients(dv, x[i].tolist(), y[i].tolist(), upper=upper[i].tolist(), digits=30, **rest)
             for i in range(3)]
    if backend.name == "numpy":
        value, gx, own = nm.get_map(name, **params).loss_and_grad(x, y, reduction="none", total=None, upper=upper,
                                                                   bounds=True)
        gu = own["upper"]
    else:
        m, t = backend.get_map(name, **params), backend.array(y)
        value = backend.numpy(backend.loss(m, backend.array(x), t, reduction="none", total=None,
                                           upper=backend.array(upper)))
        gx, gu = backend.grad(lambda x, u: backend.loss(m, x, t, reduction="sum", total=None, upper=u),
                              backend.array(x), backend.array(upper))
    np.testing.assert_allclose(value, [float(v) for v in want], rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(gx, [[float(v) for v in g["scores"]] for g in grads], rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(gu, [[float(v) for v in g["upper"]] for g in grads], rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_loss_gradient_checks(backend):
    x = np.array([[0.9, 0.3, -0.2, 1.4], [0.1, 2.0, 0.6, -0.5]])
    upper = np.array([[1.5, 0.2, 1.0, 4.0], [0.9, 0.5, 3.0, 1.0]])
    y = backend.array(np.array([[0.5, 0.1, 0.0, 1.0], [0.0, 0.25, 0.25, 0.0]]))  # (inside the bounds by more than a step)
    m = backend.get_map("entmax15")
    backend.check_grads(lambda x, u: backend.loss(m, x, y, total=None, upper=u), backend.array(x),
                        backend.array(upper), order=1)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_errors(backend):
    m, x = backend.get_map("softmax"), backend.array(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="upper must be >= 0"):
        backend.call(m, x, -1, total=None, upper=backend.array(np.array([1.0, -1.0, 1.0])))
    with pytest.raises(ValueError, match="non-negative"):
        backend.loss(m, x, backend.array(np.array([[0.5, -0.5, 0.0], [0.0, 0.0, 0.0]])), total=None)
    with pytest.raises(ValueError, match="within the upper bounds"):
        backend.loss(m, x, backend.array(np.array([[0.5, 0.9, 0.0], [0.0, 0.0, 0.0]])), total=None,
                     upper=backend.array(np.asarray(0.6)))
    with pytest.raises(ValueError, match="sets do not combine"):
        backend.call(m, x, -1, total=None, sink=backend.array(np.zeros((2, 1))))


def test_squared_relu_is_a_typed_map_without_a_sum():
    """docs/theory.md's table: ``omega(p) = 2 p^(3/2) / 3`` (``omega'(p) = sqrt(p)``) without a sum is ``relu(s)^2``."""
    from derive.testing import generated_map

    x = np.random.default_rng(6).standard_normal((3, 7)) * 2
    with generated_map("2*p**(3/2)/3", "squared_relu_nosum") as module:
        np.testing.assert_allclose(nm.get_map(module)(x, total=None), np.maximum(x, 0) ** 2, rtol=1e-14, atol=0)


@pytest.mark.parametrize(("name", "params"), [*MAPS, ("sigmoid", {}), ("relu", {})], ids=[*IDS, "sigmoid", "relu"])
def test_the_link_at_the_scores_equals_the_clipped_link(name, params, monkeypatch):
    """Where every score lies below the ceiling (and is finite, for a clip of -inf), ``nosum_solve`` takes the link at
    the scores clamped to the clip, with no masks (``ops.rare``'s cheap branch): bit for bit the clipped link's
    masked values, scores far below the clip included; scores of +-inf or NaN take the masks."""
    from numeric.core.ops import TensorOps

    m = nm.get_map(name, **params)
    x = np.random.default_rng(5).standard_normal((6, 40)) * 4
    odd = x.copy()
    odd[5, :3] = [INF, -INF, np.nan]
    upper = np.where(np.arange(40) % 3 == 0, 0.4, INF)
    for scores, dtype in [(s, t) for s in (x, odd) for t in (np.float64, np.float32)]:
        got = m(scores.astype(dtype), total=None, upper=upper.astype(dtype))
        with monkeypatch.context() as patch:
            patch.setattr(TensorOps, "rare", lambda self, pred, fn, otherwise: fn())
            want = m(scores.astype(dtype), total=None, upper=upper.astype(dtype))
        np.testing.assert_array_equal(got, want)
        assert not np.isnan(got[:5]).any() and (got[:5] >= 0).all()
