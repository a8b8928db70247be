"""Rows at the edges, on every backend (NumPy, torch, JAX), each property written once: a fully masked row (every
score ``-inf``: a query that may attend to no key) gives zeros and zero derivatives, in the maps and in attention,
and leaves the other rows alone; a NaN row gives NaN, its derivatives too (a constant weight, sparsemax's 1, used
to drop the NaN: NumPy and torch gave 0 there, JAX NaN).

Truths: the map of the row without its masked scores; attention written out with the NumPy map; what SDPA gives
is pinned in tests/torch/test_fully_masked_rows.py (torch's behaviour, not regattn's).  Bounded maps' edge rows:
tests/constraints/test_box_edges.py; the loss's: tests/losses.
"""

from __future__ import annotations

import numpy as np
import pytest

import numeric as nm
from tests.backends import backend_params
from tests.numeric.conftest import FRAMEWORK_IDS as IDS
from tests.numeric.conftest import FRAMEWORK_MAPS as MAPS

INF = np.inf
EVERY = backend_params()


def _vjp(backend, name, params, x, dy):
    """``(p, J^T dy)`` of the map on ``backend`` as NumPy arrays (NumPy's ``vjp``, the others' autodiff)."""
    if backend.name == "numpy":
        m = nm.get_map(name, **params)
        p = m(x)
        return p, m.vjp(p, dy)
    m, d = backend.get_map(name, **params), backend.array(dy)
    p = backend.numpy(backend.call(m, backend.array(x)))
    return p, backend.grad(lambda s: (backend.call(m, s) * d).sum(), backend.array(x))


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_a_nan_row_and_its_derivatives_are_nan(backend, name, params):
    x = np.array([[0.3, np.nan, -1.0, 2.0], [0.3, 0.1, -1.0, 2.0]])
    p, jv = _vjp(backend, name, params, x, np.ones_like(x))
    assert np.isnan(p[0]).all() and np.isnan(jv[0]).all()
    assert np.isfinite(jv[1]).all()  # the other row is untouched
    np.testing.assert_allclose(p[1], nm.get_map(name, **params)(x[1]), rtol=0, atol=1e-14)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_fully_masked_rows_give_zeros_and_zero_derivatives(backend, name, params):
    """A fully masked row: zeros, zero derivatives (no warning: pytest turns any into an error); a masked score
    elsewhere is a score removed; the loss of the other rows finite."""
    x = np.array([[-INF, -INF, -INF], [0.0, 1.0, -INF]])
    p, jv = _vjp(backend, name, params, x, np.array([[1.0, 2.0, 3.0], [1.0, -1.0, 0.5]]))
    assert (p[0] == 0).all() and (jv[0] == 0).all()
    np.testing.assert_allclose(p[1, :2], nm.get_map(name, **params)(x[1, :2]), rtol=0, atol=1e-14)
    assert p[1, 2] == 0 and p[1].sum() == pytest.approx(1)
    m = backend.get_map(name, **params)
    value = backend.loss(m, backend.array(x[1:]), backend.array(np.array([1])), reduction="sum")
    assert np.isfinite(backend.numpy(value))


def _masked_inputs():
    """``q, k, v`` ``(2, 3, L=4, ·)`` with ``S = 5`` keys, a mask on which query 1 may attend to no key and query 3
    to some (``True``: kept), and a cotangent of the output."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 3, 4, 8)), rng.standard_normal((2, 3, 5, 8)), rng.standard_normal((2, 3, 5, 6))
    keep = np.ones((4, 5), bool)
    keep[1] = False
    keep[3, :2] = False
    return q, k, v, keep, rng.standard_normal((2, 3, 4, 6))


@pytest.mark.parametrize(("name", "params"), [("softmax", {}), ("sparsemax", {}), ("entmax15", {}),
                                              ("entmax", {"alpha": 1.3}), ("normmax", {"alpha": 2.0})],
                         ids=["softmax", "sparsemax", "entmax15", "entmax-alpha1.3", "normmax-alpha2.0"])
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_attention_gives_zero_on_a_fully_masked_row(backend, name, params, kind):
    """A boolean mask (all False) or a float one (all -inf) on a query's row: output 0 and a zero gradient in that
    query; the other rows the map of the masked scores times the values, every gradient finite."""
    q, k, v, keep, dout = _masked_inputs()
    mask = keep if kind == "bool" else np.where(keep, 0.0, -INF)
    if backend.name == "numpy":
        m = nm.get_map(name, **params)
        out = nm.attention(q, k, v, mapping=m, mask=keep if kind == "bool" else mask)
        dq, dk, dv = nm.attention_backward(q, k, v, dout, mapping=m, mask=keep if kind == "bool" else mask)
    else:
        m, mb, d = backend.get_map(name, **params), backend.array(mask), backend.array(dout)
        out = backend.numpy(backend.attention(*(backend.array(a) for a in (q, k, v)), m, mask=mb))
        dq, dk, dv = backend.grad(lambda q, k, v: (backend.attention(q, k, v, m, mask=mb) * d).sum(),
                                  *(backend.array(a) for a in (q, k, v)))
    assert np.array_equal(out[..., 1, :], np.zeros_like(out[..., 1, :]))
    assert np.array_equal(dq[..., 1, :], np.zeros_like(dq[..., 1, :]))
    assert np.isfinite(out).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    s = np.where(keep, q @ np.swapaxes(k, -1, -2) / np.sqrt(8), -INF)
    np.testing.assert_allclose(out, nm.get_map(name, **params)(s) @ v, rtol=0, atol=1e-12)
