"""alpha-entmax near alpha = 2 where subnormal numbers are flushed to zero: torch with ``torch.set_flush_denormal``,
XLA on the CPU always.

The power-form Newton rule floors ``p = base**k`` at a number that rounded to a subnormal for ``k - 1 <= 0.9``
(alpha >= ~1.53); flushed to 0 it gave ``0 * log(0)``: NaN rows at alpha = 2 and rows left at Newton's starting
point (no error) at alpha = 1.99.  Checked on every backend against regattn's NumPy maps, which do not flush.
"""

from __future__ import annotations

import numpy as np
import pytest

import numeric
from tests.backends import backend_params

ALPHAS = [1.5, 1.6, 1.9, 1.99, 1.999, 2.0]
FLUSHING = backend_params("autodiff")  # (torch and JAX: the backends that flush)


@pytest.fixture
def flushing(backend):
    """The backend with subnormal numbers flushed to zero (XLA on the CPU flushes them always)."""
    if backend.name != "torch":
        yield backend
        return
    if not backend.torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormal numbers")
    yield backend
    backend.torch.set_flush_denormal(False)


def rows():
    rng = np.random.default_rng(20261125)
    x = rng.normal(size=(6, 9)) * np.array([[0.1], [1], [3], [10], [30], [100]])
    return np.vstack([x, [[0.1, 0.5, 0.9, -1e6, 0, 0, 0, 0, 0]]])


def _entmax(backend):
    return backend.get_map("entmax")


@pytest.mark.parametrize("backend", FLUSHING, indirect=True)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_flushed_subnormals_match_numpy(flushing, alpha):
    b = flushing
    x = rows()
    got = b.numpy(b.call(_entmax(b), b.array(x), alpha=alpha))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, numeric.entmax(x, alpha), rtol=0, atol=1e-12)
    per_row = b.call(_entmax(b), b.array(x), alpha=b.array(np.full((x.shape[0], 1), alpha)))
    np.testing.assert_allclose(b.numpy(per_row), got, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", FLUSHING, indirect=True)
def test_an_alpha_per_row_matches_numpy(flushing):
    b = flushing
    x = rows()
    alphas = np.resize(np.array(ALPHAS), (x.shape[0], 1))
    fn = (lambda s, a: b.call(_entmax(b), s, alpha=a))
    if "jit" in b.features:
        fn = b.jit(fn)
    got = b.numpy(fn(b.array(x), b.array(alphas)))
    want = np.vstack([numeric.entmax(x[i:i + 1], float(alphas[i, 0])) for i in range(x.shape[0])])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", FLUSHING, indirect=True)
def test_float32_near_two_is_a_distribution(flushing):
    b = flushing
    x = rows().astype(np.float32)
    for alpha in ALPHAS:
        got = b.numpy(b.call(_entmax(b), b.array(x, np.float32), alpha=alpha))
        np.testing.assert_allclose(got, numeric.entmax(x.astype(np.float64), alpha), rtol=0, atol=1e-5)
