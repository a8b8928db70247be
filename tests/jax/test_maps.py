"""What is JAX's own in numeric.jax's maps: jit, vmap and grad against eager calls, vmap over alpha, a map as a pytree
through jit, a traced alpha, the built-in functions.  What every backend shares is tested in tests/maps/.

The scores have, or flatten to, rows of ``ROWS`` = (12, 9), the shape tests/maps uses too, so these tests share
its compiled programs (one per map, shape and dtype, and one per derivative).
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import numeric as nm  # noqa: E402
from numeric.jax import JaxMap, entmax, entmax15, get_map, softmax, sparsemax  # noqa: E402

from tests.profile import THOROUGH  # noqa: E402

from .conftest import IDS, MAPS  # noqa: E402

ROWS = (12, 9)
#: a map applied under jit (the JaxMap is a pytree argument: one compilation per map and shape, alpha traced)
_apply = jax.jit(lambda m, x: m(x))


def _scores(seed, shape=ROWS, scale=3.0):
    return np.random.default_rng(seed).normal(size=shape) * scale


def _close(a, b, atol=1e-12):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    assert np.array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(a, b, rtol=0, atol=atol, equal_nan=True)


def test_builtin_functions_are_the_maps():
    x = jnp.asarray(_scores(5))
    _close(softmax(x), nm.softmax(np.asarray(x)))
    _close(sparsemax(x, axis=0), nm.sparsemax(np.asarray(x), axis=0))
    _close(entmax15(x), nm.entmax15(np.asarray(x)))
    _close(entmax(x, 1.7), nm.entmax(np.asarray(x), 1.7))
    assert get_map(get_map("entmax", alpha=1.2)).params == {"alpha": 1.2}
    assert get_map(nm.get_map("softmax").module).name == "softmax"


# (each transformation traces the map again, 2 to 11 s a map: the CI profile takes a map of each rule, sparsemax's
# sort, cube's root and entmax's at alpha below 1, gini_log1p's KKT solve, softmax's closed form; the thorough profile
# every map)
JIT_VMAP = [m for m in MAPS if THOROUGH or m[0] not in ("entmax15", "shannon_gini") and m[1].get("alpha") != 1.3]


@pytest.mark.parametrize(("name", "params"), JIT_VMAP, ids=[IDS[MAPS.index(m)] for m in JIT_VMAP])
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


def test_a_traced_alpha_is_not_checked():
    """A traced alpha's value is unknown, so it is not checked; a concrete one is, also inside jit via the bound
    map (tests/maps/test_get_map.py)."""
    x = jnp.asarray(_scores(27, shape=(2, 3)))
    assert jax.jit(lambda a: entmax(x, a))(1.5).shape == (2, 3)


@pytest.mark.parametrize("name", ["cube", "gini_log1p"])
def test_sparse_rows_take_their_candidates_above_a_cut(name, monkeypatch):
    """A sparse user map (the root rule's power form; the KKT solve) on rows of 100 scores under jit, made to take
    its candidates above a cut (numeric.core.screen; JAX on the CPU takes whole rows this short): the NumPy map's
    p, which takes the largest, on rows of every spread (a flat row has too many scores above every level, and
    takes the whole row), masked scores and a row with one score left."""
    from numeric.jax._ops import JaxOps

    monkeypatch.setattr(JaxOps, "cut_up_to", 256)
    gathered = []
    above = JaxOps.above
    monkeypatch.setattr(JaxOps, "above", staticmethod(lambda *a: gathered.append(a[-1]) or above(*a)))
    x = np.random.default_rng(3).normal(size=(8, 100)) * np.array([0, 0.05, 0.3, 1, 3, 10, 30, 1])[:, None]
    x[-1, 1:] = -np.inf
    x[3, 50:] = -np.inf
    got = jax.jit(get_map(name))(jnp.asarray(x))
    assert gathered and gathered[0] == 16
    _close(got, nm.get_map(name)(x), atol=1e-13)


@pytest.mark.parametrize("name", ["cube", "gini_log1p", "shannon_gini"])
def test_the_last_rows_going_end_their_rounds_gathered(name, monkeypatch):
    """A user map's solve under jit on 128 rows of 40 scores (whole rows: the root rule's power form, the KKT solve
    of a sparse and of a dense map), whose loops end on the eighth of the rows going last, gathered
    (TensorOps.repeat_rows): every row's p bit for bit as when every row takes every round, and NumPy's p."""
    from numeric.jax._ops import JaxOps

    x = np.random.default_rng(5).normal(size=(128, 40)) * np.geomspace(0.1, 30, 128)[:, None]
    x[7, 20:] = -np.inf
    gathered = []
    first_rows = JaxOps.first_rows
    monkeypatch.setattr(JaxOps, "first_rows", staticmethod(lambda mask, size: gathered.append(size) or
                                                           first_rows(mask, size)))
    tail = jax.jit(get_map(name))(jnp.asarray(x))
    assert gathered and set(gathered) == {16}
    monkeypatch.setattr(JaxOps, "gathers_tail", False)
    every = jax.jit(get_map(name))(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(tail), np.asarray(every))
    _close(tail, nm.get_map(name)(x), atol=1e-13)
