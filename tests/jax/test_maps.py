"""numeric.jax's maps and loss against numeric's NumPy maps (values, JVP, parameter and loss gradients), finite differences
(jax.test_util.check_grads, first and second order), jit / vmap / grad against eager, the map's properties and errors.

Light on compilation (XLA's compile of a map's solver, ~0.2-0.5 s on a CPU, is most of these tests' time): the maps are
called eagerly, which runs each map's own jitted program (one per map, shape and dtype, and one per derivative of it,
all cached by JAX), and the scores of almost every test have, or flatten to, rows of ``ROWS`` = (12, 9), so the tests
share those programs; alpha-entmax at every alpha is one program (alpha is an argument, not a constant).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra.numpy import arrays  # noqa: E402
from jax.test_util import check_grads as _check_grads  # noqa: E402

import numeric as nm  # noqa: E402
from numeric.jax import JaxMap, entmax, entmax15, get_map, softmax, sparsemax  # noqa: E402

from .conftest import IDS, MAPS  # noqa: E402
from tests.numeric.conftest import hard_rows  # noqa: E402

INF = math.inf
#: the shape of (almost) every test's rows: one compiled program per map and derivative serves them all
ROWS = (12, 9)


def check_grads(f, args, order, modes=("fwd", "rev")):
    """jax.test_util.check_grads of ``f`` as it is (not wrapped in a new jit, which would compile every derivative
    again for each test): the maps inside run their cached programs, and JAX caches the derivatives of those."""
    _check_grads(f, args, order=order, modes=modes)


def _scores(seed, shape=ROWS, scale=3.0):
    return np.random.default_rng(seed).normal(size=shape) * scale


def _hard_rows(seed=0):
    return hard_rows(_scores(seed))


def _close(a, b, atol=1e-12):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    assert np.array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(a, b, rtol=0, atol=atol, equal_nan=True)


# ------------------------------------------------------------------ values
#: a map applied under jit (the JaxMap is a pytree argument: one compilation per map and shape, alpha traced)
_apply = jax.jit(lambda m, x: m(x))


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_values_match_numpy(name, params):
    m = nm.get_map(name, **params)
    x = _hard_rows()
    expected = m(x)
    for threshold in ("auto", "root", "sort") if m.module.THRESHOLD == "sort" else ("auto", "root"):
        jm = JaxMap(name, threshold=threshold, **params)
        p = jm(jnp.asarray(x))
        assert p.dtype == jnp.float64 and p.shape == x.shape
        _close(p, expected)
        if threshold == "auto":
            _close(_apply(jm, jnp.asarray(x)), expected)
        assert np.all(np.asarray(p[2]) == 0) and np.all(np.isnan(np.asarray(p[3]))) and p[1, 3] == 0


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_values_along_other_axes_and_long_rows(name, params):
    m = nm.get_map(name, **params)
    x = _scores(1, shape=(3, 9, 4))  # (rows of 9 along axis 1: 12 of them, as ROWS)
    _close(JaxMap(name, **params)(jnp.asarray(x), axis=1), m(x, axis=1))
    x = _scores(1, shape=(9, 3, 4))
    _close(JaxMap(name, **params)(jnp.asarray(x), axis=-3), m(x, axis=0))
    long = _scores(2, shape=(3, 5000), scale=2.0)
    _close(JaxMap(name, **params)(jnp.asarray(long)), m(long))


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_float32_close_to_float64(name, params):
    x = _scores(3)
    p32 = JaxMap(name, **params)(jnp.asarray(x, jnp.float32))
    assert p32.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(p32, np.float64), nm.get_map(name, **params)(x), rtol=0, atol=2e-5)
    np.testing.assert_allclose(np.asarray(p32.sum(-1), np.float64), 1, atol=1e-5)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_float32_far_rows(name, params):
    """Scores far from 0 in float32 (a grid of 1/4 shifted, exact in float32): the map of the unshifted scores,
    to float32's rounding (the solvers shift each row by its maximum first)."""
    x = np.round(_scores(4) * 4) / 4
    want = nm.get_map(name, **params)(x)
    for shift in (1e3, 1e5, -1e5):
        p32 = JaxMap(name, **params)(jnp.asarray(x + shift, jnp.float32))
        np.testing.assert_allclose(np.asarray(p32, np.float64), want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("alpha", [1000.0, 1e6])
def test_constant_rows_at_huge_alpha(alpha, dtype):
    """``(1/n)**(alpha - 1)`` below the normal range (``c = p_max**(1/k)`` underflows; the rows are solved in
    ``log(a / c)``): a constant row is uniform, to the rounding of its sum, with alpha a number or per row."""
    x = np.zeros((3, 346))  # (a row of ROWS' 9 scores is solved well either way)
    x[1] = -1e6
    x[2, -1] = -INF
    counts = np.isfinite(x).sum(-1)
    eps = float(jnp.finfo(dtype).eps)
    for a in (alpha, jnp.full((3, 1), alpha, dtype)):
        p = np.asarray(entmax(jnp.asarray(x, dtype), a), np.float64)
        for row, count in enumerate(counts):
            assert (p[row, :count] == p[row, 0]).all() and (p[row, count:] == 0).all()
            np.testing.assert_allclose(p[row, :count], 1 / count, rtol=eps * (16 + count / 8), atol=0)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize(("name", "params"), MAPS[:4], ids=IDS[:4])
def test_half_precision_computes_in_float32(name, params, dtype):
    x = jnp.asarray(_scores(4), dtype)
    p = JaxMap(name, **params)(x)
    assert p.dtype == dtype
    expected = nm.get_map(name, **params)(np.asarray(x, np.float64))  # the map of the rounded scores
    # the float32 result rounded once to the half format
    np.testing.assert_allclose(np.asarray(p, np.float64), expected, rtol=0, atol=float(jnp.finfo(dtype).eps))
    g = jax.grad(lambda x: (JaxMap(name, **params)(x) * jnp.arange(9, dtype=x.dtype)).sum())(x)
    assert g.dtype == dtype and bool(jnp.all(jnp.isfinite(g)))


def test_builtin_functions_are_the_maps():
    x = jnp.asarray(_scores(5))
    _close(softmax(x), nm.softmax(np.asarray(x)))
    _close(sparsemax(x, axis=0), nm.sparsemax(np.asarray(x), axis=0))
    _close(entmax15(x), nm.entmax15(np.asarray(x)))
    _close(entmax(x, 1.7), nm.entmax(np.asarray(x), 1.7))
    assert get_map(get_map("entmax", alpha=1.2)).params == {"alpha": 1.2}
    assert get_map(nm.get_map("softmax").module).name == "softmax"


# ------------------------------------------------------------- derivatives
def _live(x):
    """Scores whose rows all have a support, a masked score and a fully masked row kept apart."""
    x = np.array(x)
    x[1, 3] = -INF
    x[2] = -INF
    return x


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_jvp_and_vjp_equal_numpy(name, params):
    m = nm.get_map(name, **params)
    jm = JaxMap(name, **params)
    x = _live(_scores(6))
    v = _scores(7, scale=1.0)
    p = m(x)
    p_j, jv = jax.jvp(jm, (jnp.asarray(x),), (jnp.asarray(v),))
    _close(p_j, p)
    _close(jv, m.jvp(p, v))
    _, pull = jax.vjp(jm, jnp.asarray(x))
    (g,) = pull(jnp.asarray(v))
    _close(g, m.vjp(p, v))
    assert np.all(np.asarray(g[2]) == 0) and g[1, 3] == 0


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_check_grads_first_and_second_order(name, params):
    jm = JaxMap(name, **params)
    x = jnp.asarray(_scores(8, scale=1.5))
    check_grads(jm, (x,), order=2, modes=["fwd", "rev"])
    masked = x.at[1, 2].set(-INF).at[3].set(-INF)

    def f(x):  # finite differences of the live scores only (a masked score stays -inf)
        return jm(jnp.where(jnp.isfinite(masked), x, -INF))

    check_grads(f, (x,), order=1, modes=["fwd", "rev"])
    assert bool(jnp.all(jax.grad(lambda x: f(x)[3].sum())(x) == 0))  # a fully masked row: zero gradients


@pytest.mark.parametrize("alpha", [1.3, 1.01, 2.0, 3.5])
def test_alpha_scalar_gradient(alpha):
    x = jnp.asarray(_live(_scores(9)))
    u = jnp.asarray(_scores(10, scale=1.0))
    m = nm.get_map("entmax", alpha=alpha)
    p = m(np.asarray(x))
    g = jax.grad(lambda a: (entmax(x, a) * u).sum())(jnp.asarray(alpha))
    expected = m.vjp_params(p, np.asarray(u), reduce=True)["alpha"]
    np.testing.assert_allclose(float(g), expected, rtol=1e-12, atol=1e-12)
    check_grads(lambda a: entmax(x, a), (jnp.asarray(alpha),), order=2, modes=["fwd", "rev"])
    check_grads(lambda x, a: entmax(x, a), (jnp.asarray(_scores(11)), jnp.asarray(alpha)), order=1, modes=["fwd", "rev"])


def test_alpha_per_row_gradient():
    x = _live(_scores(12))
    alpha = np.linspace(1.05, 3.0, 12).reshape(12, 1)
    u = _scores(13, scale=1.0)
    m = nm.get_map("entmax", alpha=alpha)
    p = m(x)
    _close(entmax(jnp.asarray(x), jnp.asarray(alpha)), p)
    g = jax.grad(lambda a: (entmax(jnp.asarray(x), a) * u).sum())(jnp.asarray(alpha))
    assert g.shape == (12, 1)
    _close(g, m.vjp_params(p, u, reduce=True)["alpha"])
    check_grads(lambda a: entmax(jnp.asarray(x), a), (jnp.asarray(alpha),), order=2, modes=["fwd", "rev"])
    # per head: alpha (2, 1, 1) for scores (2, 6, 9) (12 rows of 9, as ROWS)
    xh = jnp.asarray(_scores(14, shape=(2, 6, 9)))
    ah = jnp.asarray([[[1.2]], [[1.8]]])
    _close(entmax(xh, ah), np.stack([nm.entmax(np.asarray(xh[i]), float(ah[i, 0, 0])) for i in range(2)]))
    check_grads(lambda a: entmax(xh, a), (ah,), order=1, modes=["fwd", "rev"])
    # along another axis: size 1 there (scores (2, 9, 6) along axis 1)
    xa = jnp.moveaxis(xh, 2, 1)
    aa = jnp.asarray([[[1.2, 1.5, 2.5, 1.1, 1.7, 1.3]]])
    _close(entmax(xa, aa, axis=1), np.moveaxis(nm.entmax(np.asarray(xh), np.moveaxis(np.asarray(aa), 2, 1)), 2, 1))
    check_grads(lambda a: entmax(xa, a, axis=1), (aa,), order=1, modes=["fwd", "rev"])


def test_float32_alpha_gradient_is_accurate_near_one():
    x = _live(_scores(15))
    u = _scores(16, scale=1.0)
    m = nm.get_map("entmax", alpha=1.001)
    expected = m.vjp_params(m(x), u, reduce=True)["alpha"]
    g = jax.grad(lambda a: (entmax(jnp.asarray(x, jnp.float32), a) * jnp.asarray(u, jnp.float32)).sum())(
        jnp.asarray(1.001, jnp.float32))
    np.testing.assert_allclose(float(g), expected, rtol=2e-3)


# ----------------------------------------------------------- transforms
@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_jit_vmap_grad_agree_with_eager(name, params):
    jm = JaxMap(name, **params)
    x = jnp.asarray(_scores(17, shape=(3, 4, 9)))
    eager = jm(x)
    _close(_apply(jm, x), eager)
    _close(jax.vmap(jm)(x), eager)
    _close(jax.vmap(jax.vmap(jm))(x), eager)
    _close(jax.vmap(lambda r: jm(r, axis=-1), in_axes=1, out_axes=1)(x), eager)

    def loss(x):
        return (jm(x) * jnp.arange(9.0)).sum()

    g = jax.grad(loss)(x)
    _close(jax.jit(jax.grad(loss))(x), g)
    _close(jax.vmap(jax.grad(lambda r: (jm(r) * jnp.arange(9.0)).sum()))(x.reshape(ROWS)).reshape(x.shape), g)
    h = jax.hessian(lambda r: jm(r)[0])(x[0, 0])
    _close(jax.jit(jax.hessian(lambda r: jm(r)[0]))(x[0, 0]), h)


def test_vmap_over_alpha_and_a_bound_map_through_jit():
    x = jnp.asarray(_scores(18))
    alphas = jnp.asarray([1.1, 1.5, 2.0, 4.0])
    got = jax.vmap(lambda a: entmax(x, a))(alphas)
    for i, a in enumerate(alphas):
        _close(got[i], nm.entmax(np.asarray(x), float(a)))
    bound = get_map("entmax", alpha=jnp.asarray(1.4))
    _close(jax.jit(lambda m, x: m(x))(bound, x), nm.entmax(np.asarray(x), 1.4))
    g = jax.jit(jax.grad(lambda m: m(x)[:, 0].sum()))(bound)
    assert isinstance(g, JaxMap) and g.params["alpha"].shape == ()


# --------------------------------------------------------------- properties
# 12 rows of 1, 2 or 9 scores: a few shapes, each compiled once per map (removing a score: 1 and 8 as well)
_rows = st.sampled_from([1, 2, 9]).flatmap(
    lambda n: arrays(np.float64, (ROWS[0], n), elements=st.floats(-20, 20, allow_nan=False, allow_infinity=False)))


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@given(x=_rows, shift=st.floats(-1e3, 1e3), seed=st.integers(0, 2**16))
def test_properties(name, params, x, shift, seed):
    jm = JaxMap(name, **params)
    p = np.asarray(jm(jnp.asarray(x)))
    assert np.all(p >= 0)
    np.testing.assert_allclose(p.sum(-1), 1, atol=1e-12)  # on the simplex
    _close(jm(jnp.asarray(x + shift)), p, atol=1e-9 * (1 + abs(shift)))  # shift invariance
    perm = np.random.default_rng(seed).permutation(x.shape[-1])
    _close(jm(jnp.asarray(x[:, perm])), p[:, perm])  # permutation equivariance
    if x.shape[-1] > 1:  # masking a score = removing it
        masked = x.copy()
        masked[:, 0] = -INF
        pm = np.asarray(jm(jnp.asarray(masked)))
        assert np.all(pm[:, 0] == 0)
        _close(pm[:, 1:], jm(jnp.asarray(x[:, 1:])))


# ------------------------------------------------------------------- errors
def test_errors_name_the_argument():
    x = jnp.asarray(_scores(27, shape=(2, 3)))
    with pytest.raises(TypeError, match="scores must be a floating array"):
        softmax(jnp.arange(3))
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        softmax(x, axis=2)
    with pytest.raises(ValueError, match="at least one dimension"):
        softmax(jnp.asarray(1.0))
    with pytest.raises(ValueError, match=r"parameter alpha = 0.0 is outside \(0.0, inf\)"):
        entmax(x, 0.0)
    with pytest.raises(ValueError, match="parameter alpha = -0.5 is outside"):
        entmax(x, jnp.asarray([[1.5], [-0.5]]))
    with pytest.raises(ValueError, match="must have size 1 along axis"):
        entmax(x, jnp.full((2, 3), 1.5))
    with pytest.raises(ValueError, match="does not broadcast"):
        entmax(x, jnp.full((5, 1), 1.5))
    with pytest.raises(TypeError, match="parameter alpha must be a real"):
        entmax(x, "1.5")
    with pytest.raises(ValueError, match=r"has no parameter\(s\) \['beta'\]"):
        get_map("entmax", beta=1.0)
    with pytest.raises(ValueError, match="needs a value for alpha"):
        get_map("entmax")(x)
    with pytest.raises(ValueError, match="no map named"):
        get_map("nonexistent_map_xyz")
    with pytest.raises(ValueError, match="threshold must be one of"):
        get_map("softmax", threshold="closed-form")
    with pytest.raises(ValueError, match="'sort' needs a link"):
        get_map("softmax", threshold="sort")
    with pytest.raises(TypeError, match="a map is a name"):
        get_map(3.0)
    # a traced alpha is not checked (its value is unknown); a concrete one is, also inside jit via the bound map
    assert jax.jit(lambda a: entmax(x, a))(1.5).shape == (2, 3)
