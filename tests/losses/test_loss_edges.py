"""Fenchel-Young loss edges: regularizers infinite at 0, score spreads that overflow, targets off the simplex.

Truths: the mpmath reference loss (derive.reference.loss), 0 at the map's own
output, torch's cross_entropy.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import numeric as nm
from derive import Regularizer, derive_map, generate_module
from derive import reference as R
from derive.codegen.files import load_module

#: regularizers infinite at 0 (dense maps, omega(0+) = +inf)
AT_ZERO_INFINITE = {"neglog": "-log(p)", "inverse": "1/p"}


@pytest.fixture(scope="module")
def infinite_maps(tmp_path_factory):
    folder = tmp_path_factory.mktemp("infinite")
    out = {}
    for name, expr in AT_ZERO_INFINITE.items():
        d = derive_map(Regularizer.from_string(expr, name=name))
        path = folder / f"{name}.py"
        path.write_text(generate_module(d, name))
        module = load_module(path)
        assert module.omega_zero() == np.inf
        out[name] = (d, nm.get_map(module))
    return out


@pytest.mark.parametrize("name", list(AT_ZERO_INFINITE))
@given(x=hnp.arrays(np.float64, (3, 5), elements=st.floats(-4, 4)),
       weights=hnp.arrays(np.int64, (3, 5), elements=st.integers(1, 5)))
def test_infinite_at_zero_matches_reference(infinite_maps, name, x, weights):
    d, m = infinite_maps[name]
    # zero at the map's own output, where the old sum formed inf * 0
    np.testing.assert_allclose(m.loss(x, m(x), reduction="none"), 0, atol=1e-12)
    y = weights / weights.sum(-1, keepdims=True)  # inside the domain: every y_i > 0
    got = m.loss(x, y, reduction="none")
    for r in range(3):
        exact = [sp.Rational(int(w), int(weights[r].sum())) for w in weights[r]]
        want = float(R.loss(d, x[r].tolist(), exact, digits=30))
        assert got[r] == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("name", list(AT_ZERO_INFINITE))
def test_infinite_at_zero_outside_the_domain(infinite_maps, name):
    d, m = infinite_maps[name]
    x = np.array([[0.3, -1.2, 2.0, 0.0], [1.0, 1.0, 1.0, -np.inf]])
    labels = np.array([2, 0])  # one-hot: zeros where omega(0) = +inf
    got = m.loss(x, labels, reduction="none")
    assert got.tolist() == [np.inf, np.inf]
    assert float(R.loss(d, x[0].tolist(), [0, 0, 1, 0], digits=30)) == np.inf
    # a zero on a masked score is no zero of the regularizer: finite
    assert np.isfinite(m.loss(x[1:], np.array([[1 / 3, 1 / 3, 1 / 3, 0.0]]), reduction="none")).all()


def test_overflowing_spread_matches_cross_entropy():
    torch = pytest.importorskip("torch")
    x = np.array([[1e308, -1e308, 0.0], [1e308, -1e308, 0.0], [-1e308, 1e308, 5.0]])
    labels = np.array([0, 2, 1])
    want = torch.nn.functional.cross_entropy(torch.from_numpy(x), torch.from_numpy(labels), reduction="none").numpy()
    value, grad = nm.get_map("softmax").loss_and_grad(x, labels, reduction="none")
    np.testing.assert_array_equal(value, want)  # 0, inf (1e308 overflowing), 0
    assert np.isfinite(grad).all()
    for name in ("sparsemax", "entmax15"):
        assert nm.get_map(name).loss(x[:1], labels[:1], reduction="none").tolist() == [0.0]
    assert nm.get_map("entmax", alpha=1.3).loss(x[:1], labels[:1], reduction="none").tolist() == [0.0]
    # the mass on a score 2e308 below the maximum: +inf, as the (overflowing) exact value
    assert nm.get_map("sparsemax").loss(x[:1], np.array([1]), reduction="none").tolist() == [np.inf]


def test_targets_may_be_array_likes():
    """NumPy's loss takes labels and distributions as lists, as NumPy functions take array-likes."""
    m = nm.get_map("sparsemax")
    x = np.array([[1.0, 0.5, -1.0], [0.0, 0.2, 0.1]])
    np.testing.assert_array_equal(m.loss(x, [0, 2], reduction="none"), m.loss(x, np.array([0, 2]), reduction="none"))
    dist = [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    np.testing.assert_array_equal(m.loss(x, dist, reduction="none"), m.loss(x, np.array(dist), reduction="none"))
