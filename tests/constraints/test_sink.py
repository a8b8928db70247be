"""Sinks (``sink=b``: the map over ``[s, b]`` without the sink's column) on the maps and the Fenchel-Young loss of
every backend: values, derivatives in the scores, the sink and alpha, the loss and its gradients, rows that attend
to nothing, and errors.

Truths: the map itself over the concatenated scores (the definition); :mod:`derive.sink` (the mpmath reference on
``[s, b]``) for values, Jacobians and the loss; softmax1's closed form; central differences through autodiff's
checks; the NumPy map for the other backends to float64's rounding.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import pytest

import numeric as nm
from derive.sink import sink_jacobians, sink_loss, sink_loss_gradients, solve_sink
from tests.backends import backend_params
from tests.profile import backend_grid, crossed
from tests.constraints.cases import TYPED as MAPS
from tests.constraints.cases import TYPED_IDS as IDS
from tests.numeric.conftest import case_derivation

INF = math.inf
EVERY = backend_params()
AUTODIFF = backend_params("autodiff")


def _scores(seed=0):
    """Scores ``(2, 5, 3)`` (the map along axis 1) with a masked score, and a sink per row ``(2, 1, 3)``: one far
    above its row (a sparse map attends to nothing there), one far below."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 5, 3))
    x[1, 3, 2] = -INF
    b = rng.standard_normal((2, 1, 3))
    b[0, 0, 0], b[1, 0, 1] = 6.0, -30.0
    return x, b


@lru_cache(maxsize=None)
def _reference(name: str, items: tuple) -> np.ndarray:
    x, b = _scores()
    dv, rest = case_derivation(name, dict(items))
    out = np.zeros(x.shape)
    for i in range(2):
        for j in range(3):
            out[i, :, j] = [float(v) for v in solve_sink(dv, x[i, :, j].tolist(), float(b[i, 0, j]), digits=30, **rest)]
    return out


def _call(backend, name, params, x, axis=-1, **keywords):
    m = backend.get_map(name, **params)
    return backend.numpy(backend.call(m, backend.array(x), axis,
                                      **{k: backend.array(v) if isinstance(v, np.ndarray) else v
                                         for k, v in keywords.items()}))


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_a_sink_is_the_map_over_the_concatenated_scores(backend, name, params):
    x, b = _scores()
    p = _call(backend, name, params, x, axis=1, sink=b)
    whole = _call(backend, name, params, np.concatenate([x, b], axis=1), axis=1)[:, :-1]
    np.testing.assert_allclose(p, whole, rtol=0, atol=1e-15)
    np.testing.assert_allclose(p, _reference(name, tuple(params.items())), rtol=1e-12, atol=1e-13)
    assert p[1, 3, 2] == 0 and np.all(p.sum(axis=1) <= 1 + 1e-15)
    one = _call(backend, name, params, x[0].T, sink=0.25)  # (a number)
    np.testing.assert_allclose(one, _call(backend, name, params, np.c_[x[0].T, np.full(3, 0.25)])[:, :-1], atol=1e-15)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_softmax1_a_masked_sink_and_rows_that_attend_to_nothing(backend):
    x = np.random.default_rng(1).standard_normal((4, 6))
    e = np.exp(x)
    np.testing.assert_allclose(_call(backend, "softmax", {}, x, sink=0.0), e / (1 + e.sum(-1, keepdims=True)), rtol=1e-14)
    for name in ("softmax", "entmax15"):  # (the shared rules on n + 1 scores against a backend's own path: a few
        # roundings apart)
        np.testing.assert_allclose(_call(backend, name, {}, x, sink=-INF), _call(backend, name, {}, x), rtol=4e-15,
                                   atol=1e-17)
    # a sparse map puts every weight on a sink more than 1 above the largest score (sparsemax: tau = b - 1)
    p = _call(backend, "sparsemax", {}, x, sink=x.max(-1, keepdims=True) + 1.5)
    assert np.all(p == 0)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_numpy_derivatives_match_the_reference(name, params):
    x, b = _scores(2)
    m = nm.get_map(name, **params)
    dv, rest = case_derivation(name, params)
    dy = np.random.default_rng(4).standard_normal(x.shape)
    p = m(x, axis=1, sink=b)
    js = m.vjp(p, dy, axis=1, x=x, sink=b)
    jb = m.vjp_bounds(p, dy, axis=1, x=x, sink=b)["sink"]
    for i in range(2):
        for j in range(3):
            ref = sink_jacobians(dv, x[i, :, j].tolist(), float(b[i, 0, j]), digits=30, **rest)
            want = np.array([[float(v) for v in row] for row in ref["scores"]]) @ dy[i, :, j]
            np.testing.assert_allclose(js[i, :, j], want, rtol=1e-10, atol=1e-12)
            assert jb[i, j] == pytest.approx(float(np.dot([float(v) for v in ref["sink"]], dy[i, :, j])), rel=1e-10,
                                             abs=1e-12)
    np.testing.assert_allclose(m.jvp(p, dy, axis=1, x=x, sink=b), js, rtol=0, atol=0)
    with pytest.raises(ValueError, match="need the scores: pass x="):
        m.vjp(p, dy, axis=1, sink=b)


# (the CI profile checks each map in one framework, the thorough one in each)
@pytest.mark.parametrize(("backend", "name", "params"),
                         backend_grid(crossed([(IDS[i], MAPS[i]) for i in (1, 2, 4, 5, 6)], AUTODIFF)),
                         indirect=["backend"])
def test_gradient_checks_in_scores_sink_and_alpha(backend, name, params):
    """Away from kinks, to second order (sparsemax's first order: its second derivatives are 0)."""
    x = np.array([[0.9, 0.3, -0.2, 1.4], [0.1, 2.0, 0.6, -0.5]])
    b = np.array([[0.7], [-0.3]])
    m = backend.get_map(name, **params)
    backend.check_grads(lambda x, b: backend.call(m, x, -1, sink=b), backend.array(x), backend.array(b),
                        order=1 if name == "sparsemax" else 2)
    if params:
        alpha = backend.array(np.array([[1.3], [1.6]]))
        backend.check_grads(lambda x, a: backend.call(backend.get_map("entmax", alpha=a), x, -1, sink=backend.array(b)),
                            backend.array(x), alpha, eps=1e-6)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_loss_and_its_gradients_match_the_reference(backend, name, params):
    x, b = _scores(3)
    x, b = x[0].T, b[0].T  # (3, 5), (3, 1)
    y = np.array([[0.5, 0.25, 0.0, 0.125, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.125, 0.125]])
    dv, rest = case_derivation(name, params)
    want = [sink_loss(dv, x[i].tolist(), y[i].tolist(), float(b[i, 0]), digits=30, **rest) for i in range(3)]
    grads = [sink_loss_gradients(dv, x[i].tolist(), y[i].tolist(), float(b[i, 0]), digits=30, **rest) for i in range(3)]
    if backend.name == "numpy":
        value, gx, own = nm.get_map(name, **params).loss_and_grad(x, y, reduction="none", sink=b, bounds=True)
        gb = own["sink"].reshape(3, 1)
    else:
        m, t = backend.get_map(name, **params), backend.array(y)
        value = backend.numpy(backend.loss(m, backend.array(x), t, reduction="none", sink=backend.array(b)))
        gx, gb = backend.grad(lambda x, b: backend.loss(m, x, t, reduction="sum", sink=b), backend.array(x),
                              backend.array(b))
    np.testing.assert_allclose(value, [float(v) for v in want], rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(gx, [[float(v) for v in g["scores"]] for g in grads], rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(np.reshape(gb, -1), [float(g["sink"]) for g in grads], rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_loss_gradient_checks(backend):
    x = np.array([[0.9, 0.3, -0.2, 1.4], [0.1, 2.0, 0.6, -0.5]])
    y = backend.array(np.array([[0.5, 0.1, 0.0, 0.25], [0.0, 0.5, 0.25, 0.0]]))
    m = backend.get_map("entmax15")
    backend.check_grads(lambda x, b: backend.loss(m, x, y, sink=b), backend.array(x),
                        backend.array(np.array([[0.7], [-0.3]])), order=1)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_errors(backend):
    m, x = backend.get_map("softmax"), backend.array(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="sum to at most 1"):
        backend.loss(m, x, backend.array(np.array([[0.5, 0.75, 0.0], [0.0, 0.0, 0.0]])), sink=0.0)
    with pytest.raises(ValueError, match="sink"):
        backend.call(m, x, -1, sink=backend.array(np.zeros((2, 3))))  # (one per row: size 1 along the axis)
    with pytest.raises(ValueError, match="sets do not combine"):
        backend.call(m, x, -1, sink=0.0, upper=0.5)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_a_closed_maps_sink_on_hard_rows_is_the_map_over_the_longer_rows(backend, dtype):
    """Softmax with a sink solves without concatenating the rows (the sink's term joins the row sums:
    numeric.core.rules.closed_with, NumPy's closed_unshifted): on rows whose sums leave the unshifted path (scores far
    below 0 or far above, a masked row, a NaN score, a NaN or masked sink) it equals the map over ``[s, b]`` without
    the last column."""
    x = np.random.default_rng(3).standard_normal((12, 5))
    x[1] = -INF
    x[2, 0] = math.nan
    x[6] -= 200.0
    x[7] += 80.0
    x[8, :2] = -INF
    x[9] = [-60.0, 5.0, 4.0, 6.0, 5.5]  # (torch reads lse from the first column: b - x_0 = 90 overflows exp(b - x_0)
    # in float32, while p_0 is normal and p_1..4 ~ 1e-11)
    x[10, 0] = -120.0  # (the first column's softmax underflows in float32)
    b = np.array([0.3, 0.1, 0.0, 0.5, -INF, math.nan, 0.0, 1.0, -1.0, 30.0, 2.0, INF])[:, None]
    m = backend.get_map("softmax")
    with backend.context():
        got = backend.numpy(backend.call(m, backend.array(x, dtype), sink=backend.array(b, dtype)))
        want = backend.numpy(backend.call(m, backend.array(np.concatenate([x, b], axis=1), dtype)))[:, :5]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=8 * eps, atol=8 * eps)
    # (row 9's p ~ 1e-11: relative, at the rounding of scores 25 below the row's maximum)
    np.testing.assert_allclose(got[9], want[9], rtol=64 * eps, atol=0)


def test_torch_softmax_sink_double_backward():
    """torch's softmax with a sink (torch.softmax of the scores rescaled, its own backward): second derivatives in
    the scores and the sink by central differences, on rows with a masked score."""
    torch = pytest.importorskip("torch")
    import numeric.torch as rt

    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x[1, 0] = -INF
    x.requires_grad_(True)
    b = torch.tensor([[0.5], [-1.0], [2.0]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x, b: rt.softmax(x, sink=b), (x, b))
