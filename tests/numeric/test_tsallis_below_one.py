"""The Tsallis family with its parameter declared below 1: ``(p**a - p)/(a (a - 1))``, ``a in (0, 1)``, as a user
generates it (``regattn generate --expr ... --param a:0:1``): a dense map with heavy tails.

Checked against the 50-digit reference, the KKT conditions, finite differences of the parameter's gradient,
and torch and JAX against NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numeric as nm
from derive import Regularizer, derive_map

from .conftest import importable_map

TEXT = "(p**a - p)/(a*(a-1))"


@pytest.fixture(scope="module")
def low(tmp_path_factory):
    with importable_map(tmp_path_factory.mktemp("tsallis_low"), TEXT, "tsallis_low", ("a in (0, 1)",)) as module:
        yield module, derive_map(Regularizer.from_string(TEXT, name="tsallis_low", parameters=("a in (0, 1)",)))


@settings(max_examples=20, deadline=None)
@given(x=st.lists(st.floats(-20, 20), min_size=1, max_size=12), a=st.sampled_from([0.05, 0.3, 0.5, 0.9, 0.999]))
def test_matches_the_reference_and_is_dense(low, x, a):
    module, d = low
    x = np.array(x)
    p = nm.get_map(module, a=a)(x)
    want = np.array([float(v) for v in d.evaluate(list(map(float, x)), digits=50, a=a)])
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-13)
    assert (p > 0).all()  # dense: omega'(0+) = -oo


def test_kkt_and_heavy_tails(low):
    module, _ = low
    x = np.random.default_rng(0).standard_normal((6, 40)) * 4
    for a in (0.2, 0.5, 0.8):
        m = nm.get_map(module, a=a)
        p, tau = m.forward(x)
        np.testing.assert_allclose(p.sum(-1), 1, rtol=0, atol=1e-14)
        # omega'(p_i) = s_i - tau on every score
        np.testing.assert_allclose(module.omega_prime(p, a), x - tau[:, None], rtol=1e-11, atol=1e-11)
        # heavier tails than softmax: a score 30 below the top keeps a power-law weight, not exp(-30)
        far = m(np.array([0.0, -30.0]))[1]
        assert far > 1e-6 > nm.softmax(np.array([0.0, -30.0]))[1]


def test_the_gradient_in_a_by_finite_differences(low):
    module, _ = low
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((4, 9)), rng.standard_normal((4, 9))
    a = np.array([[0.2], [0.4], [0.6], [0.85]])
    m = nm.get_map(module, a=a)
    got = m.vjp_params(m(x), dy)["a"]
    h = 1e-6
    want = ((nm.get_map(module, a=a + h)(x) - nm.get_map(module, a=a - h)(x)) * dy).sum(-1) / (2 * h)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_torch_and_jax_give_numpys_p(low, framework):
    module, _ = low
    x = np.random.default_rng(2).standard_normal((5, 16)) * 3
    a = np.array([[0.1], [0.3], [0.5], [0.7], [0.95]])
    want = nm.get_map(module, a=a)(x)
    if framework == "torch":
        torch = pytest.importorskip("torch")
        from numeric import torch as rt

        got = rt.get_map(module, a=torch.from_numpy(a))(torch.from_numpy(x)).numpy()
    else:
        jax = pytest.importorskip("jax")
        from numeric import jax as rj

        with jax.enable_x64(True):
            got = np.asarray(rj.get_map(module, a=jax.numpy.asarray(a))(jax.numpy.asarray(x)))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
