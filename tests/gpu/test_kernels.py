"""The generated CUDA kernels, launched for real through CuPy (skipped without a GPU).

Same tolerances as the host checks: the row kernel's probabilities against the
50-digit reference within 1e-12 (double) and 1e-5 (float), the JVP against the
reference Jacobian.
"""

from __future__ import annotations

import importlib

import mpmath
import numpy as np
import pytest

from derive import derive_map
from derive import reference as R
from derive.codegen.builtins import BUILTIN_MAPS

from ._device import GPU, cp

pytestmark = GPU

PARAMS = {"entmax_sparse": {"alpha": 1.3}, "entmax_dense": {"alpha": 0.6}}


def _module(name):
    return importlib.import_module(f"numeric._generated.{name}")


def _kernels(name):
    mod = _module(name)
    raw = cp.RawModule(code=mod.CUDA_SOURCE, options=("-std=c++17",))
    return mod, {k: raw.get_function(k) for k in mod.CUDA_KERNELS}


@pytest.mark.parametrize("name", list(BUILTIN_MAPS))
@pytest.mark.parametrize("dtype, suffix, tol", [(np.float64, "f64", 1e-12), (np.float32, "f32", 1e-5)])
def test_row_kernel_matches_reference(name, dtype, suffix, tol):
    mod, kern = _kernels(name)
    dv = derive_map(BUILTIN_MAPS[name]())
    params = PARAMS.get(name, {})
    rng = np.random.default_rng(0)
    scores = (rng.standard_normal((7, 300)) * 3).astype(dtype)
    scores[2, ::3] = -np.inf  # masked entries
    scores[3, :] = -np.inf  # fully masked row
    s = cp.asarray(scores)
    out = cp.empty_like(s)
    tau = cp.empty(s.shape[0], dtype=dtype)
    args = (s, out, tau, np.int64(s.shape[0]), np.int64(s.shape[1]), *[dtype(v) for v in params.values()])
    kern[f"{name}_forward_rows_{suffix}"]((s.shape[0],), (mod.CUDA_THREADS,), args)
    got = cp.asnumpy(out)
    for row in range(scores.shape[0]):
        want = np.array([float(v) for v in dv.evaluate(scores[row].astype(np.float64).tolist(), digits=30, **params)])
        np.testing.assert_allclose(got[row], want, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(BUILTIN_MAPS))
def test_jvp_kernel_matches_reference_jacobian(name):
    mod, kern = _kernels(name)
    dv = derive_map(BUILTIN_MAPS[name]())
    params = PARAMS.get(name, {})
    rng = np.random.default_rng(1)
    scores = rng.standard_normal((3, 40))
    v = rng.standard_normal((3, 40))
    probs = np.array([[float(q) for q in dv.evaluate(r.tolist(), digits=30, **params)] for r in scores])
    out = cp.empty((3, 40))
    kern[f"{name}_jvp_f64"]((3,), (mod.CUDA_THREADS,), (cp.asarray(probs), cp.asarray(v), out, np.int64(3), np.int64(40), *[np.float64(x) for x in params.values()]))
    for row in range(3):
        jac = np.array([[float(x) for x in line] for line in R.jacobian(dv, scores[row].tolist(), digits=30, **params)])
        np.testing.assert_allclose(cp.asnumpy(out)[row], jac @ v[row], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(BUILTIN_MAPS))
def test_forward_from_tau_kernel(name):
    mod, kern = _kernels(name)
    dv = derive_map(BUILTIN_MAPS[name]())
    params = PARAMS.get(name, {})
    rng = np.random.default_rng(2)
    scores = rng.standard_normal((4, 50))
    with mpmath.workdps(40):
        taus = np.array([float(R.threshold(dv, r.tolist(), digits=30, **params)) for r in scores])
    out = cp.empty((4, 50))
    n = scores.size
    kern[f"{name}_forward_from_tau_f64"](((n + 255) // 256,), (256,), (cp.asarray(scores), cp.asarray(taus), out, np.int64(4), np.int64(50), *[np.float64(x) for x in params.values()]))
    for row in range(4):
        want = np.array([float(q) for q in dv.evaluate(scores[row].tolist(), digits=30, **params)])
        np.testing.assert_allclose(cp.asnumpy(out)[row], want, rtol=1e-12, atol=1e-13)
