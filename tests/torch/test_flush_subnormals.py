"""alpha-entmax near alpha = 2 with subnormal numbers flushed to zero (``torch.set_flush_denormal``).

The power-form Newton rule's floor of ``base`` rounded to a subnormal for
``k - 1 <= 0.9``; flushed, it gave NaN rows at alpha = 2 and silently wrong rows
at alpha = 1.99 (the same fault as under XLA). Checked against the NumPy maps.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import numeric  # noqa: E402
from numeric.torch import entmax  # noqa: E402

ALPHAS = [1.5, 1.6, 1.9, 1.99, 1.999, 2.0]


@pytest.fixture
def flushing():
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormal numbers")
    yield
    torch.set_flush_denormal(False)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_flushed_subnormals_match_numpy(flushing, alpha):
    rng = np.random.default_rng(20261125)
    x = rng.normal(size=(6, 9)) * np.array([[0.1], [1], [3], [10], [30], [100]])
    got = entmax(torch.from_numpy(x), alpha).numpy()
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, numeric.entmax(x, alpha), rtol=0, atol=1e-12)
    per_row = entmax(torch.from_numpy(x), torch.full((6, 1), alpha, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(per_row, got, rtol=0, atol=1e-12)
