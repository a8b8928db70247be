"""The CUDA row kernels at the edges the NumPy maps were fixed for, compiled for the host.

Large alpha (``F`` jumps across 1 at a kink: the sum-1 combination of the
bracket's ends), constant rows at large alpha (``p_max**(alpha - 1)``
underflows: the kernel iterates on ``log(a / c)``), float32 on wide supports
(the link's base cancels: the ratios ``1 + r y`` do not), steep power links
(``omega = p**100``) and a general-form link with an infinite slope at its
clip.  Truths: the mpmath reference (more digits where a kink needs them),
symmetry, and the float64 kernel on the same float32 rows.
"""

from __future__ import annotations

import ctypes
import random

import numpy as np
import pytest

from derive import Regularizer, derive_map, generate_module
from derive.codegen.files import load_module
from derive.codegen.compilers import host_kernels

from ..numeric.test_map_edges import kink_tolerance, power_truth, tsallis_reference
from .test_codegen import module_for
from .test_kernels_host import CACHE

TYPES = {np.float64: (ctypes.c_double, "f64"), np.float32: (ctypes.c_float, "f32")}


def forward_rows(module, x, *params):
    """``(p, tau)`` from ``module``'s ``forward_rows`` kernel (one thread per block) on the rows of ``x``."""
    ctype, suffix = TYPES[x.dtype.type]
    lib = host_kernels(module.CUDA_SOURCE, module.NAME, CACHE)
    fn = getattr(lib, f"{module.NAME}_forward_rows_{suffix}")
    ptr = ctypes.POINTER(ctype)
    fn.argtypes = [ptr] * 3 + [ctypes.c_longlong] * 2 + [ctype] * len(module.PARAMETERS)
    fn.restype = None
    s = np.ascontiguousarray(x)
    p, tau = np.empty_like(s), np.empty(s.shape[0], dtype=s.dtype)
    fn(*(a.ctypes.data_as(ptr) for a in (s, p, tau)), s.shape[0], s.shape[1], *(x.dtype.type(v) for v in params))
    return p, tau


@pytest.fixture(scope="module")
def entmax():
    module = module_for("entmax_sparse")  # (the power-form case of the family: its kernels)
    assert module.LINK_FORM == "power" and module.THRESHOLD == "root"
    return module


# ------------------------------------------------- alpha-entmax at large alpha
def test_large_alpha_row_from_the_issue(entmax):
    x = np.array([[.2227, -.0053, .1203, -.0124, .0394, .0365, .0265, .0658]])
    want = tsallis_reference(x[0], 10.0)
    p, _ = forward_rows(entmax, x, 10.0)
    np.testing.assert_allclose(p[0], want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("alpha", [10.0, 16.0, 20.0])
def test_large_alpha_matches_reference(entmax, alpha):
    x = np.random.default_rng(int(alpha)).standard_normal((40, 8)) * 0.1
    p, _ = forward_rows(entmax, x, alpha)
    np.testing.assert_allclose(p.sum(-1), 1, rtol=0, atol=1e-14)
    for r in range(x.shape[0]):
        want = tsallis_reference(x[r], alpha)
        np.testing.assert_allclose(p[r], want, rtol=0, atol=kink_tolerance(want, alpha))


# --------------------------------------------------------- constant rows
@pytest.mark.parametrize(("n", "alpha", "dtype"), [(1000, 4.0, np.float32), (100, 10.0, np.float64),
                                                    (5000, 1e3, np.float64), (300, 40.0, np.float32)])
def test_constant_rows_are_uniform(entmax, n, alpha, dtype):
    x = np.zeros((2, n), dtype=dtype)
    x[1, n // 2:] = -np.inf  # half of the second row masked
    p, tau = forward_rows(entmax, x, alpha)
    eps = float(np.finfo(dtype).eps)
    np.testing.assert_allclose(p[0], 1 / n, rtol=8 * eps, atol=0)
    np.testing.assert_allclose(p[1, : n // 2], 2 / n, rtol=8 * eps, atol=0)
    assert (p[1, n // 2:] == 0).all()
    assert np.isfinite(tau).all()


# ------------------------------------------------- float32 on wide supports
@pytest.mark.parametrize("alpha", [2.0, 2.5, 4.0])
@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1.0])
def test_float32_wide_supports_match_float64(entmax, alpha, scale):
    """L1 distance to the float64 kernel on the same float32 rows within 12 ulps of the row's mass
    (the bound of the NumPy maps, tests/numeric/test_map_edges.py).

    Each ``p = q / Q`` carries the ulps of ``u = 1 + r y`` (``r = exp(rho)`` resolved to about
    ``|rho|`` ulps, one rounding of ``r y``) and of the power ``exp(k log u)`` (``|log p|`` ulps, 8 at
    ``p = 1/4096``); summed over the row, relative to a mass of 1.
    """
    x = (np.random.default_rng(int(alpha * 10)).standard_normal((8, 4096)) * scale).astype(np.float32)
    p32, _ = forward_rows(entmax, x, alpha)
    p64, _ = forward_rows(entmax, x.astype(np.float64), alpha)
    l1 = np.abs(p32.astype(np.float64) - p64).sum(-1)
    assert l1.max() <= 12 * np.finfo(np.float32).eps, l1.max()


# ------------------------------------------------- steep links at their kinks
@pytest.fixture(scope="module")
def steep(tmp_path_factory):
    """``omega = p**100`` (power form) and ``p**12 + p**13`` (general form, Newton link, infinite slope at 0)."""
    folder = tmp_path_factory.mktemp("steep_kernels")
    out = {}
    for name, text in (("power100", "p**100"), ("power12_13", "p**12 + p**13")):
        d = derive_map(Regularizer.from_string(text, name=name))
        path = folder / f"{name}.py"
        path.write_text(generate_module(d, name))
        out[name] = d, load_module(path)
    return out


def test_steep_power_row_at_a_kink(steep):
    d, module = steep["power100"]
    assert module.LINK_FORM == "power"
    draw = random.Random(0)
    for _ in range(5):
        draw.gauss(0, 2)
    for _ in range(5):
        row = np.array([draw.gauss(0, 3) for _ in range(draw.randint(1, 40))])
    want, tau, bound = power_truth(d, 100, row - row.max())
    p, got_tau = forward_rows(module, row[None, :])
    np.testing.assert_allclose(p[0], want, rtol=0, atol=bound)
    assert got_tau[0] - row.max() == pytest.approx(tau, rel=0, abs=1e-14)


def test_steep_powers_on_random_rows(steep):
    d, module = steep["power100"]
    x = np.random.default_rng(5).standard_normal((30, 12)) * 3
    p, _ = forward_rows(module, x)
    for r in range(x.shape[0]):
        y = x[r] - x[r].max()
        want, _, bound = power_truth(d, 100, y)
        np.testing.assert_allclose(p[r], want, rtol=0, atol=bound)


def test_general_root_kernel_at_kinks(steep):
    """The general root kernel (tau by safeguarded Newton) combines the bracket's ends where F jumps."""
    d, module = steep["power12_13"]
    assert module.LINK_FORM == "general" and module.THRESHOLD == "root"
    x = np.random.default_rng(3).standard_normal((60, 6)) * 0.1
    p, _ = forward_rows(module, x)
    np.testing.assert_allclose(p.sum(-1), 1, rtol=0, atol=1e-13)
    for r in range(x.shape[0]):
        want = np.array([float(v) for v in d.evaluate(x[r].tolist(), digits=200)])
        # one ulp of a score moves p_i by about eps w_i, w = 1/omega''(p); the score with the largest
        # w (at a kink, unbounded) is fixed by the sum constraint
        w = np.sort(1 / (132 * want[want > 0] ** 10 + 156 * want[want > 0] ** 11))
        np.testing.assert_allclose(p[r], want, rtol=0, atol=1e-12 * max(1.0, float(w[:-1].sum())))
