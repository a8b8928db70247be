"""A test worker stays below Linux's limit of memory mappings however many shapes JAX compiles (tests/map_limit)."""

from __future__ import annotations

import numpy as np
import pytest

from tests import map_limit

jax = pytest.importorskip("jax")
pytestmark = pytest.mark.skipif(map_limit.LIMIT is None, reason="no /proc/sys/vm/max_map_count")


def test_clearing_the_caches_gives_back_the_compiled_executables_mappings():
    f = jax.jit(lambda x: jax.numpy.tanh(x) + jax.numpy.exp(x).sum())
    start = map_limit.mappings()
    for n in range(2, 42):  # one compile a length
        f(np.linspace(0.0, 1.0, n, dtype=np.float32)).block_until_ready()
    grown = map_limit.mappings()
    assert grown - start >= 40 * 4, "each compiled executable holds mappings"
    assert not map_limit.kept_below(grown + 1000, jax)
    assert map_limit.kept_below(start + 100, jax)
    assert map_limit.mappings() <= start + 100
