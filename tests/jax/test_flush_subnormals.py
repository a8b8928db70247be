"""alpha-entmax near alpha = 2 under XLA, which flushes subnormal numbers to zero on CPU.

The power-form Newton rule floors ``p = base**k`` at a number that rounded to a
subnormal for ``k - 1 <= 0.9`` (alpha >= ~1.53); flushed to 0 it gave ``0 * log(0)``:
NaN rows at alpha = 2 and rows left at Newton's starting point (no error) at alpha = 1.99.
Checked against regattn's NumPy maps, which do not flush.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import numeric  # noqa: E402
from numeric.jax import entmax  # noqa: E402

ALPHAS = [1.5, 1.6, 1.9, 1.99, 1.999, 2.0]


def rows():
    rng = np.random.default_rng(20261125)
    x = rng.normal(size=(6, 9)) * np.array([[0.1], [1], [3], [10], [30], [100]])
    return np.vstack([x, [[0.1, 0.5, 0.9, -1e6, 0, 0, 0, 0, 0]]])


@pytest.mark.parametrize("alpha", ALPHAS)
def test_python_alpha_matches_numpy(alpha):
    x = rows()
    got = np.asarray(entmax(jnp.asarray(x), alpha))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, numeric.entmax(x, alpha), rtol=0, atol=1e-12)


def test_per_row_alpha_matches_numpy():
    x = rows()
    alphas = np.resize(np.array(ALPHAS), (x.shape[0], 1))
    got = np.asarray(jax.jit(entmax)(jnp.asarray(x), jnp.asarray(alphas)))
    want = np.vstack([numeric.entmax(x[i:i + 1], float(alphas[i, 0])) for i in range(x.shape[0])])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_float32_near_two_is_a_distribution():
    x = rows().astype(np.float32)
    for alpha in ALPHAS:
        got = np.asarray(entmax(jnp.asarray(x), alpha))
        np.testing.assert_allclose(got, numeric.entmax(x.astype(np.float64), alpha), rtol=0, atol=1e-5)
