"""The link inversion is written once (numeric.newton.invert_link) and every target runs that text.

NumPy runs it on arrays, the reference on mpmath numbers, the CUDA source is its
trace; a fourth target (plain Python floats, below) needs only the operations.
Each is judged against the 50-digit root of ``omega'(p) = z``.
"""

from __future__ import annotations

import functools
import math

import mpmath
import numpy as np
import pytest

from derive import Regularizer, derive_map, generate_module
from derive.codegen.compilers import host_library
from derive.codegen.files import load_module
from derive.reference import compiled
from numeric import newton
from numeric.numpy.ops import ops_for

from .test_kernels_host import CACHE

# links with no closed form: a dense one (omega' = log p + 1 + p**2) and a sparse
# one with an infinite slope at 0 (omega' = 12 p**11 + 13 p**12)
TEXTS = {"shannon_cubic": "p*log(p) + p**3/3", "power12_13": "p**12 + p**13"}
Z = np.concatenate([np.linspace(-40, 40, 161), [1e-9, 1e-3, 0.5, 300.0, 4000.0, -700.0]])


@pytest.fixture(scope="module", params=sorted(TEXTS))
def newton_map(request, tmp_path_factory):
    name = request.param
    d = derive_map(Regularizer.from_string(TEXTS[name], name=name))
    assert d.inversion.method == "newton"
    path = tmp_path_factory.mktemp("newton") / f"{name}.py"
    path.write_text(generate_module(d, name))
    return name, d, load_module(path)


@functools.lru_cache(maxsize=None)
def _truth_table(text: str) -> dict[float, float]:
    """The root of ``omega'(p) = z`` for each of ``Z``: 240 bisections of ``u = log p`` at 50 digits."""
    d = derive_map(Regularizer.from_string(text))
    out = {}
    with mpmath.workdps(50):
        c = compiled(d, {})
        for v in Z:
            zz = mpmath.mpf(float(v))
            if (d.sparse and zz <= c.clip()) or c.d1(mpmath.mpf(2) ** -1074) >= zz:
                out[float(v)] = 0.0  # off the support, or below the smallest float
                continue
            lo, hi = mpmath.mpf(-745), mpmath.mpf(40)
            for _ in range(240):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if c.d1(mpmath.exp(mid)) < zz else (lo, mid)
            out[float(v)] = float(mpmath.exp((lo + hi) / 2))
    return out


def _truth(d, z: float) -> float:
    return _truth_table(TEXTS[d.name])[float(z)]


def _close(got, want, ulps):
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    np.testing.assert_allclose(got, want, rtol=ulps * np.finfo(float).eps, atol=1e-300)


def test_numpy_link_is_the_description(newton_map):
    _, d, mod = newton_map
    live = Z > mod.clip()
    want = [_truth(d, v) for v in Z[live]]
    _close(newton.numpy_invert_link(Z[live], mod.omega_prime, mod.omega_second), want, 8)
    # the same text on the row operations numeric.core runs on NumPy (its root rule's link, kkt_rule's fallback)
    with np.errstate(over="ignore", under="ignore"):
        _close(newton.invert_link(ops_for(np.float64), Z[live], mod.omega_prime, mod.omega_second), want, 8)


def test_reference_link_is_the_description(newton_map):
    _, d, mod = newton_map
    with mpmath.workdps(40):
        c = compiled(d, {})
        for v in Z[Z > mod.clip()]:
            assert float(c.g(mpmath.mpf(float(v)))) == pytest.approx(_truth(d, v), rel=1e-16, abs=1e-300)


def test_cuda_link_is_the_trace_of_the_description(newton_map):
    name, d, mod = newton_map
    assert "numeric.newton.invert_link" in mod.CUDA_DEVICE_SOURCE
    lib = host_library(mod.CUDA_DEVICE_SOURCE, name, {"link": 1}, cache_dir=CACHE)
    live = Z[Z > mod.clip()]
    got = [lib["double"]["link"](float(v)) for v in live]
    # the same operations in the same order as NumPy's: equal up to libm's exp and log
    _close(got, newton.numpy_invert_link(live, mod.omega_prime, mod.omega_second), 4)
    _close(got, [_truth(d, v) for v in live], 8)
    got32 = np.array([lib["float"]["link"](float(v)) for v in live], dtype=np.float32)
    want32 = newton.numpy_invert_link(live.astype(np.float32), mod.omega_prime, mod.omega_second)
    np.testing.assert_allclose(got32, want32, rtol=8 * np.finfo(np.float32).eps, atol=np.finfo(np.float32).tiny)


class _FloatOps(newton.ScalarOps):
    """A new target: Python floats, one value at a time (the format's constants and exp are all it sets)."""

    log_tiny = math.log(2.2250738585072014e-308)
    eps = 2.0**-52
    exp = staticmethod(math.exp)


def test_a_new_target_implements_the_operations_only(newton_map):
    _, d, mod = newton_map

    def d1(q):
        return float(mod.omega_prime(np.float64(q)))

    def d2(q):
        return float(mod.omega_second(np.float64(q)))

    live = Z[(Z > mod.clip()) & (Z < 1000)]  # omega'(e^u) overflows a Python float's exp beyond
    got = [newton.invert_link(_FloatOps(), float(v), d1, d2) for v in live]
    _close(got, [_truth(d, v) for v in live], 8)
