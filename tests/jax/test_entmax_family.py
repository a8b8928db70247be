"""alpha-entmax for every alpha > 0 on JAX: under jit (alpha traced: the family's routines, every case computed and
picked per row) and eagerly (a case's own rules), equal to NumPy, with gradients in alpha continuous through 1."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import numeric as nm  # noqa: E402
import numeric.jax as rj  # noqa: E402

ALPHAS = np.array([0.4, 0.9, 1.0, 1.0 + 1e-6, 1.3, 2.5])[:, None]


def _x():
    return np.random.default_rng(0).normal(size=(len(ALPHAS), 7)) * 3


def test_jit_and_eager_equal_numpy_across_one():
    x = _x()
    want = nm.get_map("entmax", alpha=ALPHAS)(x)
    np.testing.assert_allclose(rj.entmax(jnp.asarray(x), jnp.asarray(ALPHAS)), want, rtol=0, atol=1e-15)
    got = jax.jit(lambda s, a: rj.entmax(s, a))(jnp.asarray(x), jnp.asarray(ALPHAS))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_gradient_in_alpha_equals_numpys_vjp_through_one():
    x = _x()
    dy = np.random.default_rng(1).normal(size=x.shape)
    m = nm.get_map("entmax", alpha=ALPHAS)
    want = m.vjp_params(m(x), dy)["alpha"]
    got = np.asarray(jax.jit(jax.grad(lambda a: jnp.sum(rj.entmax(jnp.asarray(x), a) * dy)))(jnp.asarray(ALPHAS)))[:, 0]
    # within 1e-6 of 1 the printed d omega'/d alpha of the sparse case is a difference that cancels (its terms
    # ~ 1/(alpha - 1)**2 apart from the sum): XLA's and NumPy's roundings differ there by 1e-11 relative
    near = np.abs(ALPHAS[:, 0] - 1) < 1e-4
    np.testing.assert_allclose(got[~near], want[~near], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got[near], want[near], rtol=1e-9, atol=1e-14)


def test_loss_gradient_in_alpha_matches_finite_differences():
    x = _x()
    labels = np.arange(len(ALPHAS)) % x.shape[1]

    def loss(a):
        return rj.fenchel_young_loss(jnp.asarray(x), jnp.asarray(labels), rj.get_map("entmax", alpha=a), reduction="sum")

    got = np.asarray(jax.jit(jax.grad(loss))(jnp.asarray(ALPHAS)))[:, 0]
    h = 1e-6
    for i in range(len(ALPHAS)):
        up, down = ALPHAS.copy(), ALPHAS.copy()
        up[i] += h
        down[i] -= h
        fd = (nm.get_map("entmax", alpha=up).loss(x, labels, reduction="sum")
              - nm.get_map("entmax", alpha=down).loss(x, labels, reduction="sum")) / (2 * h)
        assert got[i] == pytest.approx(fd, abs=1e-7)
