"""Properties of every backend's maps (NumPy, torch, JAX), each written once and drawn by hypothesis: the weights lie
on the simplex, the map is equivariant under permutations of the scores and invariant under shifts, masking a
score is removing it; torch and JAX equal NumPy.

NumPy and torch draw the shapes; JAX, whose every new shape is a new XLA program, draws rows of 1, 2 or 9 scores
(12 rows each).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import numeric as nm
from tests.backends import backend_params
from tests.numeric.conftest import FRAMEWORK_IDS as IDS
from tests.numeric.conftest import FRAMEWORK_MAPS as MAPS

INF = math.inf
_finite = st.floats(-20, 20, allow_nan=False, allow_infinity=False)
_drawn = arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 12)), elements=_finite)
_fixed = st.sampled_from([1, 2, 9]).flatmap(lambda n: arrays(np.float64, (12, n), elements=_finite))
#: the backend fixture lives as long as the test, across its examples (it holds no state between them)
_fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", backend_params(), indirect=True)
@_fixture_ok
@given(data=st.data(), shift=st.floats(-1e3, 1e3))
def test_properties(backend, name, params, data, shift):
    x = data.draw(_fixed if backend.name == "jax" else _drawn, label="x")
    m = backend.get_map(name, **params)

    def run(x):
        return backend.numpy(backend.call(m, backend.array(x)))

    p = run(x)
    assert np.all(p >= 0)
    np.testing.assert_allclose(p.sum(-1), 1, atol=1e-12)
    if backend.name != "numpy":
        np.testing.assert_allclose(p, nm.get_map(name, **params)(x), rtol=0, atol=1e-12)
    perm = np.array(data.draw(st.permutations(range(x.shape[1])), label="perm"))
    np.testing.assert_allclose(run(x[:, perm]), p[:, perm], rtol=0, atol=1e-12)
    # shift invariance: exactly representable spacings kept (a shift of 4), and any shift to its rounding
    np.testing.assert_allclose(run(x + 4.0), p, rtol=0, atol=1e-12)
    np.testing.assert_allclose(run(x + shift), p, rtol=0, atol=1e-9 * (1 + abs(shift)))
    if x.shape[1] > 1:
        j = data.draw(st.integers(0, x.shape[1] - 1), label="masked")
        masked = x.copy()
        masked[:, j] = -INF
        keep = [i for i in range(x.shape[1]) if i != j]
        pm = run(masked)
        assert np.all(pm[:, j] == 0)
        np.testing.assert_allclose(pm[:, keep], run(x[:, keep]), rtol=0, atol=1e-12)
