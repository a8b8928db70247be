"""normmax on JAX (``get_map("normmax")``, a :class:`numeric.jax.JaxMap` of the family :mod:`numeric.families.normmax`)
against the NumPy map (itself checked against :mod:`derive.normmax`): values, jit, the derived JVP by ``check_grads``
(first and second order), the loss, attention with alpha per head, and errors by name."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import numeric as nm  # noqa: E402
from numeric.jax import attention, fenchel_young_loss, get_map, normmax  # noqa: E402

X = np.random.default_rng(0).standard_normal((12, 9))


@pytest.mark.parametrize("alpha", [1.25, 2.0, 3.0])
def test_values_jit_and_gradients(alpha):
    x = X.copy()
    x[3, 2] = -np.inf
    want = nm.normmax(x, alpha)
    np.testing.assert_allclose(normmax(jnp.asarray(x), alpha), want, rtol=0, atol=1e-14)
    np.testing.assert_allclose(jax.jit(lambda z: normmax(z, alpha))(jnp.asarray(x)), want, rtol=0, atol=1e-14)
    np.testing.assert_allclose(normmax(jnp.asarray(x, jnp.float32), alpha), want, rtol=0, atol=2e-6)
    if alpha <= 2:  # (beyond 2, p grows like d^(1/(alpha - 1)) from the support's edge, with an infinite slope
        # there: central differences across an edge are off; the VJP is checked against NumPy's below, which the
        # mpmath Jacobian checks)
        check_grads(lambda z: normmax(z, alpha), (jnp.asarray(X),), order=2, modes=["fwd", "rev"])
    v = np.cos(np.arange(X.size)).reshape(X.shape)
    g = jax.grad(lambda z: (normmax(z, alpha) * v).sum())(jnp.asarray(X))
    m = nm.get_map("normmax", alpha=alpha)
    np.testing.assert_allclose(g, m.vjp(m(X), v), rtol=0, atol=1e-13)


def test_alpha_per_row_along_an_axis():
    x = np.random.default_rng(1).standard_normal((3, 5, 2))
    alpha = np.array([[[1.5, 2.0]], [[3.0, 4.0]], [[2.0, 2.0]]])
    np.testing.assert_allclose(normmax(jnp.asarray(x), jnp.asarray(alpha), axis=1),
                               nm.normmax(x, alpha, axis=1), rtol=0, atol=1e-14)


@pytest.mark.parametrize("alpha", [1.5, 3.0])
def test_loss(alpha):
    labels = np.arange(12) % 9
    m = get_map("normmax", alpha=alpha)
    want, grad = nm.get_map("normmax", alpha=alpha).loss_and_grad(X, labels, reduction="none")
    got = fenchel_young_loss(jnp.asarray(X), jnp.asarray(labels), m, reduction="none")
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
    g = jax.grad(lambda z: fenchel_young_loss(z, jnp.asarray(labels), m, reduction="sum"))(jnp.asarray(X))
    np.testing.assert_allclose(g, grad, rtol=0, atol=1e-14)


def test_attention_with_alpha_per_head():
    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 5, 2, 4))) for _ in range(3))  # (B, T, N, H)
    alpha = jnp.array([1.5, 3.0]).reshape(2, 1, 1)
    m = get_map("normmax", alpha=alpha)
    out = attention(q, k, v, is_causal=True, mapping=m)
    s = np.einsum("btnh,bsnh->bnts", q, k) / 2
    s = np.where(np.tril(np.ones((5, 5), dtype=bool)), s, -np.inf)
    want = np.einsum("bnts,bsnh->btnh", nm.normmax(s, np.asarray(alpha)), v)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-14)


def test_errors_by_name():
    with pytest.raises(ValueError, match="alpha > 1"):
        normmax(jnp.zeros(3), 1.0)
    with pytest.raises(ValueError, match="no box constraints"):
        get_map("normmax")(jnp.zeros(3), upper=0.5)
    with pytest.raises(ValueError, match="no gradient in alpha"):
        jax.grad(lambda a: normmax(jnp.asarray(X), a).sum())(2.0)
