"""Generated continuous modules against their SymPy expressions evaluated by mpmath at 50 digits,
within the running error bound of :mod:`derive.codegen.verify_continuous`."""

from __future__ import annotations

import ctypes
import math
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from derive.codegen.builtins import CONTINUOUS_MAPS
from derive.codegen.files import load_module
from derive.codegen.compilers import host_kernels, host_library, nvrtc_available, nvrtc_compile
from derive.codegen import verify_continuous as VC
from derive.codegen.continuous import DEVICE_FUNCTIONS, THETA_PARTS, continuous_functions, numpy_function
from derive.continuous import derive_continuous

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "numeric" / "_generated"
# host builds: host_library's per-process folder (removed at exit), or a folder kept between runs if set
CACHE = Path(os.environ["REGATTN_HOST_CACHE"]) if os.environ.get("REGATTN_HOST_CACHE") else None
NAMES = list(CONTINUOUS_MAPS)


@lru_cache(maxsize=None)
def cmap(name):
    return derive_continuous(CONTINUOUS_MAPS[name]())


@lru_cache(maxsize=None)
def module(name):
    return load_module(GENERATED / f"{name}.py")


@lru_cache(maxsize=None)
def pieces(name):
    return {piece.name: piece for piece in continuous_functions(cmap(name))}


@lru_cache(maxsize=None)
def reference(name, fname):
    """``(expression, argument symbols)`` of one generated function."""
    return VC.functions(cmap(name))[fname]


def arguments(fname):
    """Hypothesis points inside the domain the layer uses (the sampler of regattn verify, drawn by hypothesis)."""
    return st.randoms(use_true_random=False).map(lambda r: VC.sample(fname, r.uniform))


def _check(name, fname, args, got, ctype, where):
    expr, symbols = reference(name, fname)
    ratio, exact, bound = VC.judge(expr, symbols, args, got, ctype)
    assert ratio <= 1, (where, args, got, exact, bound)


SCALARS = [(name, piece.name) for name in NAMES for piece in continuous_functions(cmap(name))]


@pytest.mark.parametrize("name, fname", SCALARS)
@given(data=st.data())
def test_numpy_functions_match_reference(name, fname, data):
    args = data.draw(arguments(fname))
    got = numpy_function(module(name), fname)(*[np.array([a]) for a in args])
    _check(name, fname, args, float(np.broadcast_to(got, (1,))[0]), "double", f"{name}.{fname}")


@pytest.mark.parametrize("name", NAMES)
@given(args=arguments("rbf_expectation"), theta=arguments("rbf_expectation_dtheta_1"))
def test_numpy_tuple_functions_agree_with_the_scalar_ones(name, args, theta):
    mod = module(name)
    grad = mod.rbf_expectation_grad(*args)
    for got, fname in zip(grad, ("rbf_expectation", "rbf_expectation_dmu", "rbf_expectation_dsigma2")):
        _check(name, fname, args, float(got), "double", f"{name}.rbf_expectation_grad")
    value, d1, d2 = mod.rbf_expectation_theta(*theta)
    th1, th2, cc, ss = theta
    _check(name, "rbf_expectation", (-th1 / (2 * th2), -1 / (2 * th2), cc, ss), float(value), "double", "theta value")
    _check(name, "rbf_expectation_dtheta_1", theta, float(d1), "double", "theta 1")
    _check(name, "rbf_expectation_dtheta_2", theta, float(d2), "double", "theta 2")


@pytest.mark.parametrize("name", NAMES)
@given(mu_=st.floats(-1, 1), var=st.floats(1e-3, 2))
def test_density_is_zero_off_the_support_and_vectorises(name, mu_, var):
    mod = module(name)
    ts = np.linspace(-4, 4, 801)
    dens = mod.density(ts, mu_, var)
    assert dens.shape == ts.shape and np.all(dens >= 0)
    a = float(mod.support_radius(var))
    if mod.FAMILY == "compact":
        assert np.all(dens[np.abs(ts - mu_) >= a] == 0)
        assert np.all(dens[np.abs(ts - mu_) < 0.99 * a] > 0)
    else:
        assert math.isinf(a) and np.all(dens[np.abs(ts - mu_) < 3 * math.sqrt(var)] > 0)


@lru_cache(maxsize=None)
def host(name):
    fns = {fname: len(piece.args) for fname, piece in pieces(name).items() if fname in DEVICE_FUNCTIONS}
    return host_library(module(name).CUDA_DEVICE_SOURCE, name, fns, cache_dir=CACHE)


@pytest.mark.parametrize("name, fname", [(n, f) for n, f in SCALARS if f in DEVICE_FUNCTIONS])
@pytest.mark.parametrize("ctype", ["double", "float"])
@given(data=st.data())
def test_device_functions_match_reference(name, fname, ctype, data):
    args = data.draw(arguments(fname))
    if ctype == "float":  # the reference at the float32 inputs actually used
        args = tuple(float(np.float32(a)) for a in args)
    got = host(name)[ctype][fname](*args)
    if ctype == "float":
        assume(abs(got) > 1e-30)  # below float32's normal range relative bounds say nothing
    _check(name, fname, args, got, ctype, f"{ctype} {name}_{fname}")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("suffix, dtype, ctype", [("f64", np.float64, ctypes.c_double), ("f32", np.float32, ctypes.c_float)])
def test_context_kernel_on_the_host(name, suffix, dtype, ctype):
    """The rbf_context kernel (one thread per block on the host) against the NumPy functions."""
    mod = module(name)
    lib = host_kernels(mod.CUDA_SOURCE, name, CACHE)
    fn = getattr(lib, f"{name}_rbf_context_{suffix}")
    ptr = ctypes.POINTER(ctype)
    fn.argtypes = [ptr] * 4 + [ctypes.c_longlong] * 2 + [ptr] * 3
    fn.restype = None
    rng = np.random.default_rng(0)
    mus, vars_ = rng.uniform(0, 1, 5).astype(dtype), rng.uniform(0.002, 0.2, 5).astype(dtype)
    cs, ss = np.linspace(0, 1, 7).astype(dtype), np.full(7, 0.01, dtype=dtype)
    outs = [np.empty((5, 7), dtype=dtype) for _ in range(3)]
    fn(*[a.ctypes.data_as(ptr) for a in (mus, vars_, cs, ss)], 5, 7, *[o.ctypes.data_as(ptr) for o in outs])
    want = mod.rbf_expectation_grad(mus[:, None].astype(np.float64), vars_[:, None].astype(np.float64), cs.astype(np.float64), ss.astype(np.float64))
    rtol = 1e-11 if dtype == np.float64 else 2e-3
    for got, exp in zip(outs, want):
        np.testing.assert_allclose(got, exp, rtol=rtol, atol=rtol * np.abs(exp).max())
    # null gradient pointers: only E is written
    e = np.empty((5, 7), dtype=dtype)
    fn(*[a.ctypes.data_as(ptr) for a in (mus, vars_, cs, ss)], 5, 7, e.ctypes.data_as(ptr), None, None)
    np.testing.assert_array_equal(e, outs[0])


@pytest.mark.skipif(not nvrtc_available(), reason="cuda-bindings / nvidia-cuda-nvrtc not installed")
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_cuda_source_compiles_with_nvrtc(name, arch):
    result = nvrtc_compile(module(name).CUDA_SOURCE, arch)
    assert result.ok, result.log
    assert result.ptx_size > 1000


@pytest.mark.parametrize("name", NAMES)
def test_module_shape(name):
    mod = module(name)
    assert mod.NAME == name and mod.FAMILY == cmap(name).family
    assert mod.CUDA_KERNELS == (f"{name}_rbf_context_f32", f"{name}_rbf_context_f64")
    for fname in list(pieces(name)) + ["density", "rbf_expectation_grad", "rbf_expectation_theta"]:
        assert callable(getattr(mod, fname, None)) != (fname in THETA_PARTS), fname
    assert "numpy.power(2" not in (GENERATED / f"{name}.py").read_text()  # constants print as their values
