"""numeric.jax.attention: softmax equals jax.nn.dot_product_attention, finite differences in a per-head alpha and a
bias, blocks = one block, jit / vmap and errors.  Gradient checks of masks, causal rows, T != S, grouped heads and
fully masked rows on every framework: tests/attention/test_gradients.py.  Every map against
numeric.attention (NumPy), as torch's: tests/attention/test_against_numpy.py; the properties (masked key = absent
key, permutations, the simplex, causality) on every backend: tests/attention/test_properties.py."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads as _check_grads  # noqa: E402

import numeric as nm  # noqa: E402
from numeric.jax import attention, get_map  # noqa: E402




def check_grads(f, args, order, modes):
    """jax.test_util.check_grads of the jitted function (its finite differences call it many times)."""
    _check_grads(jax.jit(f), args, order=order, modes=modes)


def _qkv(seed, B=2, T=5, S=7, N=4, K=2, H=3, Hv=None, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, T, N, H))
    k = rng.normal(size=(B, S, K, H))
    v = rng.normal(size=(B, S, K, Hv or H))
    return tuple(jnp.asarray(a, dtype) for a in (q, k, v))


def _mask(seed, shape, p=0.35):
    m = np.random.default_rng(seed).random(shape) > p
    return m


def _numpy_attention(q, k, v, mapping, mask=None, causal=False, scale=None):
    """numeric.attention on (B, N, T, H) with key/value heads repeated for the groups."""
    N, K = q.shape[2], k.shape[2]
    rep = lambda a: np.repeat(np.asarray(a), N // K, axis=2)  # noqa: E731
    tr = lambda a: np.transpose(a, (0, 2, 1, 3))  # noqa: E731
    out = nm.attention(tr(np.asarray(q)), tr(rep(k)), tr(rep(v)), mapping=mapping, mask=mask, causal=causal, scale=scale)
    return tr(out)


def _dead(mask, causal, B, N, T, S):
    keep = np.broadcast_to(np.ones((1, 1, 1, 1), bool) if mask is None else mask, (B, N, T, S))
    if causal:
        keep = keep & np.tril(np.ones((T, S), bool))
    return ~keep.any(-1)  # (B, N, T)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("T", "S"), [(5, 7), (7, 5), (6, 6)])
def test_softmax_equals_jax_nn_in_float32(causal, T, S):
    q, k, v = _qkv(0, T=T, S=S, dtype=np.float32)
    mask = _mask(1, (2, 1, T, S))
    mask[0, 0, 1] = False  # a fully masked row
    ref = jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(mask), is_causal=causal)
    out = attention(q, k, v, mask=jnp.asarray(mask), is_causal=causal)
    dead = _dead(mask, causal, 2, 4, T, S)  # (B, N, T)
    live = ~np.transpose(dead, (0, 2, 1))[..., None]
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.where(live, out, 0), np.where(live, ref, 0), rtol=0, atol=2e-6)
    assert np.all(np.asarray(out)[~np.broadcast_to(live, out.shape)] == 0)  # (jax.nn gives the mean of the values)
    # gradients of the live rows
    w = jnp.asarray(np.where(live, 1.0, 0.0) * np.random.default_rng(2).normal(size=out.shape), jnp.float32)
    g_ours = jax.grad(lambda q, k, v: (attention(q, k, v, mask=jnp.asarray(mask), is_causal=causal) * w).sum(),
                      argnums=(0, 1, 2))(q, k, v)
    g_ref = jax.grad(lambda q, k, v: (jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(mask), is_causal=causal)
                                      * w).sum(), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_ours, g_ref):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_softmax_equals_jax_nn_formula_in_float64():
    """jax.nn computes softmax in float32 whatever the inputs: in float64 against its formula with jax.nn.softmax."""
    q, k, v = _qkv(3, N=4, K=4)
    mask = _mask(4, (2, 4, 5, 7))
    mask[..., 0] = True
    s = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(3)
    ref = jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1), v)
    np.testing.assert_allclose(attention(q, k, v, mask=jnp.asarray(mask)), ref, rtol=0, atol=1e-12)


def test_per_head_alpha_equals_numpy_and_has_its_gradient():
    q, k, v = _qkv(7, T=6, S=5)
    alpha = jnp.asarray([1.2, 1.5, 2.0, 3.0]).reshape(4, 1, 1)
    out = attention(q, k, v, is_causal=True, mapping=get_map("entmax", alpha=alpha))
    ref = _numpy_attention(q, k, v, nm.get_map("entmax", alpha=np.asarray(alpha)), causal=True)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)

    def f(q, k, v, a, block):
        return attention(q, k, v, is_causal=True, mapping=get_map("entmax", alpha=a), block_size=block)

    check_grads(lambda q, k, v, a: f(q, k, v, a, None), (q, k, v, alpha), order=1, modes=["fwd", "rev"])
    check_grads(lambda q, k, v, a: f(q, k, v, a, 4), (q, k, v, alpha), order=1, modes=["rev"])
    g1 = jax.grad(lambda a: f(q, k, v, a, None).sum())(alpha)
    g2 = jax.grad(lambda a: f(q, k, v, a, 2).sum())(alpha)
    assert g1.shape == (4, 1, 1)
    np.testing.assert_allclose(g2, g1, rtol=0, atol=1e-12)
    # one alpha per query row, sliced with the blocks (the last block padded)
    rows = jnp.linspace(1.1, 2.5, 6).reshape(1, 1, 6, 1)
    ref_rows = _numpy_attention(q, k, v, nm.get_map("entmax", alpha=np.asarray(rows)))
    np.testing.assert_allclose(attention(q, k, v, mapping=get_map("entmax", alpha=rows), block_size=4), ref_rows,
                               rtol=0, atol=1e-12)


def test_blocks_equal_one_block_jit_vmap_and_unbatched():
    q, k, v = _qkv(11, B=3, T=9, S=8, N=2, K=1)
    mask = jnp.asarray(_mask(12, (3, 2, 9, 8)))
    full = attention(q, k, v, mask=mask, is_causal=True, mapping="entmax15")
    for block in (1, 2, 4, 8, 9, 100):
        np.testing.assert_allclose(attention(q, k, v, mask=mask, is_causal=True, mapping="entmax15", block_size=block),
                                   full, rtol=0, atol=1e-13)
    jitted = jax.jit(lambda q, k, v, m: attention(q, k, v, mask=m, is_causal=True, mapping="entmax15", block_size=4))
    np.testing.assert_allclose(jitted(q, k, v, mask), full, rtol=0, atol=1e-13)
    per_example = jax.vmap(lambda q, k, v, m: attention(q, k, v, mask=m, is_causal=True, mapping="entmax15"))(q, k, v, mask)
    np.testing.assert_allclose(per_example, full, rtol=0, atol=1e-13)
    np.testing.assert_allclose(attention(q[1], k[1], v[1], mask=mask[1], is_causal=True, mapping="entmax15"), full[1],
                               rtol=0, atol=1e-13)
    g = jax.grad(lambda q: (attention(q, k, v, mask=mask, mapping="sparsemax", block_size=2) ** 2).sum())(q)
    g1 = jax.grad(lambda q: (attention(q, k, v, mask=mask, mapping="sparsemax") ** 2).sum())(q)
    np.testing.assert_allclose(g, g1, rtol=0, atol=1e-12)


def test_blocked_backward_does_not_keep_the_scores():
    """The blocked call's jaxpr keeps no (B, N, T, S) array between the passes: the scan's residuals are per block."""
    q, k, v = _qkv(13, B=1, T=64, S=64, N=1, K=1)

    def f(q):
        return attention(q, k, v, is_causal=True, mapping="entmax15", block_size=8).sum()

    _, vjp = jax.vjp(f, q)
    leaves = jax.tree_util.tree_leaves(vjp)
    assert all(getattr(a, "size", 0) < 64 * 64 for a in leaves)


def test_errors():
    q, k, v = _qkv(14)
    with pytest.raises(TypeError, match="query must be a floating-point array"):
        attention(jnp.zeros((2, 5, 4, 3), jnp.int32), k, v)
    with pytest.raises(ValueError, match="must all be"):
        attention(q[0, 0], k, v)
    with pytest.raises(ValueError, match="feature size H"):
        attention(q[..., :2], k, v)
    with pytest.raises(ValueError, match="must divide the query heads"):
        attention(q[:, :, :3], k, v)
    with pytest.raises(ValueError, match="same batch size"):
        attention(q[:1], k, v)
    with pytest.raises(ValueError, match="same length S"):
        attention(q, k, v[:, :3])
    with pytest.raises(TypeError, match="mask must be boolean"):
        attention(q, k, v, mask=jnp.zeros((5, 7)))
    with pytest.raises(ValueError, match="does not broadcast"):
        attention(q, k, v, mask=jnp.ones((3, 7), bool))
    with pytest.raises(ValueError, match="needs a value for alpha"):
        attention(q, k, v, mapping="entmax")
    with pytest.raises(ValueError, match="must have size 1 along axis"):
        attention(q, k, v, mapping=get_map("entmax", alpha=jnp.full((4, 1, 7), 1.5)))
    with pytest.raises(TypeError, match="mapping must be"):
        attention(q, k, v, mapping=3)
    with pytest.raises(ValueError, match="block_size must be"):
        attention(q, k, v, block_size=0)
