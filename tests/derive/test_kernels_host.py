"""The generated CUDA kernels, compiled for the host (one thread per block) and run through ctypes.

This checks each kernel's logic (row loop, masking, NaN rows, the threshold
iteration and the sort polish, the JVP) without a GPU; block reductions are
the identity here, and the CUDA versions are exercised by tests/gpu.
"""

from __future__ import annotations

import ctypes
import math
import os
from pathlib import Path

import mpmath
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from derive import reference as R
from derive.codegen.compilers import host_kernels

from .test_codegen import ALL_MAPS, derivation_for, module_for

# host builds: host_library's per-process folder (removed at exit), or a folder kept between runs if set
CACHE = Path(os.environ["REGATTN_HOST_CACHE"]) if os.environ.get("REGATTN_HOST_CACHE") else None
PARAMS = {"entmax_sparse": {"alpha": 1.3}, "entmax_dense": {"alpha": 0.6}}
TYPES = {"f64": (np.float64, ctypes.c_double, 1e-12), "f32": (np.float32, ctypes.c_float, 2e-5)}


def _kernel(name, role, suffix):
    mod = module_for(name)
    lib = host_kernels(mod.CUDA_SOURCE, name, CACHE)
    fn = getattr(lib, f"{name}_{role}_{suffix}")
    _, ctype, _ = TYPES[suffix]
    ptr = ctypes.POINTER(ctype)
    nptr = 3 if role in ("forward_rows", "forward_from_tau", "jvp") else 0
    fn.argtypes = [ptr] * nptr + [ctypes.c_longlong, ctypes.c_longlong] + [ctype] * len(mod.PARAMETERS)
    fn.restype = None
    return fn


def _ptr(a, ctype):
    return a.ctypes.data_as(ctypes.POINTER(ctype))


def _reference_rows(name, scores):
    dv = derivation_for(name)
    out = np.zeros(scores.shape)
    for r, row in enumerate(scores.astype(np.float64)):
        if np.isnan(row).any():
            out[r] = np.nan
        else:
            out[r] = [float(q) for q in dv.evaluate(row.tolist(), digits=30, **PARAMS.get(name, {}))]
    return out


rows_strategy = hnp.arrays(
    np.float64,
    hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=12),
    elements=st.one_of(st.floats(-20, 20), st.just(-math.inf)),
)


@pytest.mark.parametrize("name", ALL_MAPS)
@pytest.mark.parametrize("suffix", ["f64", "f32"])
@given(scores=rows_strategy)
def test_forward_rows(name, suffix, scores):
    dtype, ctype, tol = TYPES[suffix]
    s = np.ascontiguousarray(scores, dtype=dtype)
    p = np.empty_like(s)
    tau = np.empty(s.shape[0], dtype=dtype)
    params = [dtype(v) for v in PARAMS.get(name, {}).values()]
    _kernel(name, "forward_rows", suffix)(_ptr(s, ctype), _ptr(p, ctype), _ptr(tau, ctype), s.shape[0], s.shape[1], *params)
    want = _reference_rows(name, s)
    np.testing.assert_allclose(p, want, rtol=tol, atol=tol)
    assert np.all(p[np.isneginf(s)] == 0)


@pytest.mark.parametrize("name", ALL_MAPS)
def test_forward_rows_nan_row_stays_in_its_row(name):
    s = np.array([[0.5, np.nan, 1.0], [0.5, 0.0, 1.0], [-np.inf, -np.inf, -np.inf]])
    p, tau = np.empty_like(s), np.empty(3)
    params = [np.float64(v) for v in PARAMS.get(name, {}).values()]
    _kernel(name, "forward_rows", "f64")(_ptr(s, ctypes.c_double), _ptr(p, ctypes.c_double), _ptr(tau, ctypes.c_double), 3, 3, *params)
    assert np.isnan(p[0]).all()
    np.testing.assert_allclose(p[1], _reference_rows(name, s[1:2])[0], rtol=1e-12, atol=1e-12)
    assert (p[2] == 0).all()


@pytest.mark.parametrize("name", ALL_MAPS)
@given(scores=hnp.arrays(np.float64, (3, 6), elements=st.floats(-5, 5)), v=hnp.arrays(np.float64, (3, 6), elements=st.floats(-1, 1)))
def test_jvp_matches_reference_jacobian(name, scores, v):
    dv = derivation_for(name)
    params = PARAMS.get(name, {})
    probs = _reference_rows(name, scores)
    # the Jacobian jumps where a score crosses the support boundary (and w = 1/(6p) for p**3
    # is unbounded there): judge points with a clear support only
    assume(np.all((probs == 0) | (probs > 1e-6)))
    out = np.empty_like(probs)
    _kernel(name, "jvp", "f64")(_ptr(probs, ctypes.c_double), _ptr(np.ascontiguousarray(v), ctypes.c_double), _ptr(out, ctypes.c_double), 3, 6, *[np.float64(x) for x in params.values()])
    for r in range(3):
        jac = np.array([[float(x) for x in line] for line in R.jacobian(dv, scores[r].tolist(), digits=30, **params)])
        np.testing.assert_allclose(out[r], jac @ v[r], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ALL_MAPS)
@given(scores=hnp.arrays(np.float64, (2, 5), elements=st.floats(-5, 5)))
def test_forward_from_tau(name, scores):
    dv = derivation_for(name)
    params = PARAMS.get(name, {})
    with mpmath.workdps(40):
        taus = np.array([float(R.threshold(dv, r.tolist(), digits=30, **params)) for r in scores])
    out = np.empty_like(scores)
    s = np.ascontiguousarray(scores)
    _kernel(name, "forward_from_tau", "f64")(_ptr(s, ctypes.c_double), _ptr(taus, ctypes.c_double), _ptr(out, ctypes.c_double), 2, 5, *[np.float64(x) for x in params.values()])
    # the reference tau is rounded to double, so compare with the link at that tau
    np.testing.assert_allclose(out, _reference_rows(name, scores), rtol=1e-9, atol=1e-12)
