"""The JVP of a NaN row (the output of a row with a NaN score) is NaN, as the row itself, under NumPy, torch and JAX.

(A constant weight, sparsemax's 1, used to drop the NaN: NumPy and torch gave 0 there, JAX NaN.)
"""

from __future__ import annotations

import numpy as np
import pytest

import numeric as nm

from .conftest import IDS, MAPS


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
def test_jvp_of_a_nan_row_is_nan(name, params, framework):
    x = np.array([[0.3, np.nan, -1.0, 2.0], [0.3, 0.1, -1.0, 2.0]])
    m = nm.get_map(name, **params)
    if framework == "numpy":
        p = m(x)
        jv = m.jvp(p, np.ones_like(p))
    elif framework == "torch":
        torch = pytest.importorskip("torch")
        from numeric.torch import get_map

        xt = torch.tensor(x, requires_grad=True)
        p = get_map(name, **params)(xt)
        (jv,) = torch.autograd.grad(p, xt, torch.ones_like(p))
        p, jv = p.detach().numpy(), jv.numpy()
    else:
        jax = pytest.importorskip("jax")
        from numeric.jax import get_map

        with jax.enable_x64(True):
            p, pull = jax.vjp(get_map(name, **params), jax.numpy.asarray(x))
            (jv,) = pull(jax.numpy.ones_like(p))
        p, jv = np.asarray(p), np.asarray(jv)
    assert np.isnan(p[0]).all() and np.isnan(jv[0]).all()
    assert np.isfinite(jv[1]).all()  # the other row is untouched
