"""Generated continuous modules against their SymPy expressions evaluated by mpmath at 50 digits.

The closed forms subtract nearly equal terms where the support is narrow next
to the basis function (``erf(x_+) - erf(x_-)`` with ``x_+ ~ x_-``), or where
symmetry makes a derivative vanish, so no relative bound holds everywhere.  The
bound is a first-order running error analysis of the expression tree the code
evaluates (:func:`error_bound`): each operation contributes ``u`` times the
size of its result, propagated through the derivatives of what follows, with
``u`` = 1e-13 (double) and 3e-6 (float) per operation.
"""

from __future__ import annotations

import ctypes
import math
import os
from functools import lru_cache
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import assume, given
from hypothesis import strategies as st

from derive.codegen.builtins import CONTINUOUS_MAPS, load_module
from derive.codegen.compilers import host_kernels, host_library, nvrtc_available, nvrtc_compile
from derive.codegen.continuous import continuous_functions
from derive.continuous import c, derive_continuous, mu, s2, sigma2, t, theta1, theta2

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "numeric" / "_generated"
CACHE = Path("/tmp") / f"regattn-host-{os.getuid()}"
NAMES = list(CONTINUOUS_MAPS)
SYMBOLS = {"t": t, "mu": mu, "sigma2": sigma2, "c": c, "s2": s2, "theta_1": theta1, "theta_2": theta2}


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
    piece = pieces(name)[fname]
    return piece.expr, [SYMBOLS[a] for a in piece.args]


def error_bound(expr, env, u):
    """``(value, bound)``: ``expr`` at ``env`` and a first-order bound on the rounding error of evaluating it.

    Every operation's result carries a relative error of at most ``u``; errors
    propagate through sums (absolutely), products and powers (relatively) and
    ``exp``/``erf``/``sqrt`` (through their derivatives).
    """
    memo = {}

    def walk(node):
        if node in memo:
            return memo[node]
        if node.is_Symbol:
            out = (env[node], mpmath.mpf(0))
        elif node == sp.oo:
            out = (mpmath.inf, mpmath.mpf(0))
        elif node.is_Number or node.is_NumberSymbol or node.is_number:
            v = mpmath.mpf(sp.N(node, 60))
            out = (v, mpmath.mpf(0) if node.is_Integer else u * abs(v))
        elif node.is_Add:
            parts = [walk(a) for a in node.args]
            v = mpmath.fsum(p[0] for p in parts)
            out = (v, mpmath.fsum(p[1] for p in parts) + u * len(parts) * mpmath.fsum(abs(p[0]) for p in parts))
        elif node.is_Mul:
            parts = [walk(a) for a in node.args]
            v = mpmath.fprod(p[0] for p in parts)
            err = mpmath.fsum(
                p[1] * mpmath.fprod(abs(q[0]) for j, q in enumerate(parts) if j != i) for i, p in enumerate(parts)
            )
            out = (v, err + u * len(parts) * abs(v))
        elif node.is_Pow:
            (b, eb), e = walk(node.base), node.exp
            if not e.is_number:
                raise AssertionError(f"symbolic exponent in {node}")
            e = mpmath.mpf(sp.N(e, 60))
            v = b**e
            out = (v, abs(e) * abs(b) ** (e - 1) * eb + 4 * u * abs(v))
        elif isinstance(node, sp.exp):
            x, ex = walk(node.args[0])
            v = mpmath.exp(x)
            out = (v, v * ex + u * v * (1 + abs(x)))
        elif isinstance(node, sp.erf):
            x, ex = walk(node.args[0])
            v = mpmath.erf(x)
            out = (v, 2 / mpmath.sqrt(mpmath.pi) * mpmath.exp(-x * x) * ex + u * abs(v))
        else:
            raise AssertionError(f"no error rule for {type(node).__name__} in {node}")
        memo[node] = out
        return out

    return walk(expr)


def arguments(fname):
    """Hypothesis points for a function's arguments, inside the domain the layer uses."""
    if fname == "support_radius":
        return st.tuples(st.floats(1e-3, 10))
    if fname == "density_inside":
        return st.tuples(st.floats(-3, 3), st.floats(-2, 2), st.floats(1e-3, 4))
    if "theta" in fname:
        return st.tuples(st.floats(-5, 5), st.floats(-20, -0.1), st.floats(-3, 3), st.floats(5e-3, 3))
    return st.tuples(st.floats(-2, 2), st.floats(1e-3, 4), st.floats(-3, 3), st.floats(5e-3, 3))


def _check(name, fname, args, got, tol, where):
    expr, symbols = reference(name, fname)
    with mpmath.workdps(50):
        env = {x: mpmath.mpf(a) for x, a in zip(symbols, args)}
        want, bound = error_bound(expr, env, mpmath.mpf(tol))
        if mpmath.isinf(want):  # the Gaussian's support radius
            assert got == want, (where, args, got)
            return
        assert abs(mpmath.mpf(got) - want) <= bound + mpmath.mpf(10) ** -300, (where, args, got, want, bound)


SCALARS = [(name, piece.name) for name in NAMES for piece in continuous_functions(cmap(name))]


@pytest.mark.parametrize("name, fname", SCALARS)
@given(data=st.data())
def test_numpy_functions_match_reference(name, fname, data):
    args = data.draw(arguments(fname))
    got = getattr(module(name), fname)(*[np.array([a]) for a in args])
    _check(name, fname, args, float(np.broadcast_to(got, (1,))[0]), 1e-13, f"{name}.{fname}")


@pytest.mark.parametrize("name", NAMES)
@given(args=arguments("rbf_expectation"), theta=arguments("rbf_expectation_dtheta_1"))
def test_numpy_tuple_functions_agree_with_the_scalar_ones(name, args, theta):
    mod = module(name)
    grad = mod.rbf_expectation_grad(*args)
    for got, fname in zip(grad, ("rbf_expectation", "rbf_expectation_dmu", "rbf_expectation_dsigma2")):
        _check(name, fname, args, float(got), 1e-13, f"{name}.rbf_expectation_grad")
    value, d1, d2 = mod.rbf_expectation_theta(*theta)
    th1, th2, cc, ss = theta
    _check(name, "rbf_expectation", (-th1 / (2 * th2), -1 / (2 * th2), cc, ss), float(value), 1e-13, "theta value")
    _check(name, "rbf_expectation_dtheta_1", theta, float(d1), 1e-13, "theta 1")
    _check(name, "rbf_expectation_dtheta_2", theta, float(d2), 1e-13, "theta 2")


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
    fns = {fname: len(piece.args) for fname, piece in pieces(name).items()}
    return host_library(module(name).CUDA_DEVICE_SOURCE, name, fns, cache_dir=CACHE)


@pytest.mark.parametrize("name, fname", SCALARS)
@pytest.mark.parametrize("ctype, tol", [("double", 1e-13), ("float", 3e-6)])
@given(data=st.data())
def test_device_functions_match_reference(name, fname, ctype, tol, data):
    args = data.draw(arguments(fname))
    if ctype == "float":  # the reference at the float32 inputs actually used
        args = tuple(float(np.float32(a)) for a in args)
    got = host(name)[ctype][fname](*args)
    if ctype == "float":
        assume(abs(got) > 1e-30)  # below float32's normal range relative bounds say nothing
    _check(name, fname, args, got, tol, f"{ctype} {name}_{fname}")


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
        assert callable(getattr(mod, fname)), fname
    assert "numpy.power(2" not in (GENERATED / f"{name}.py").read_text()  # constants print as their values
