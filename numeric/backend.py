"""Array-module dispatch and the CuPy kernel cache.

Everything in :mod:`numeric` accepts NumPy or CuPy arrays and returns the
same kind.  CuPy is imported only when a CuPy array is seen; NumPy code never
needs it.
"""

from __future__ import annotations

import threading
from types import ModuleType

import numpy as np

from . import contract

__all__ = ["array_module", "is_cupy", "to_compute_dtype", "kernels", "CUDA_THREADS"]

CUDA_THREADS = contract.CUDA_THREADS
_lock = threading.Lock()
_kernel_cache: dict[tuple[str, int, int], dict[str, object]] = {}


def is_cupy(x: object) -> bool:
    """Whether ``x`` is a CuPy array (checked without importing CuPy)."""
    return type(x).__module__.split(".")[0] == "cupy"


def array_module(*arrays: object) -> ModuleType:
    """``numpy`` or ``cupy`` for the given arrays (``None`` entries are ignored).

    Raises
    ------
    TypeError
        If NumPy and CuPy arrays are mixed.
    """
    kinds = {is_cupy(a) for a in arrays if a is not None and not isinstance(a, (int, float, bool))}
    if kinds == {True, False}:
        raise TypeError(
            "mixed NumPy and CuPy arrays: " + ", ".join(type(a).__module__ + "." + type(a).__name__ for a in arrays if a is not None)
        )
    if True in kinds:
        import cupy

        return cupy
    return np


def to_compute_dtype(x, xp):
    """``(x as a float array in its compute dtype, the dtype to return)``.

    float64 and float32 compute as themselves; float16 (and bfloat16-like
    small floats) compute in float32 and return their own dtype; wider floats
    (``longdouble``, float96/float128 where it is wider than float64) compute in
    float64, the widest dtype the solvers and the generated kernels support, and
    return their own dtype (so they carry float64's precision, not their own);
    integers and booleans compute and return in float64.
    """
    x = xp.asarray(x)
    dtype = x.dtype
    if dtype == np.float64 or dtype == np.float32:
        return x, dtype
    if dtype.kind == "f":
        # by size: longdouble is float64 itself on some platforms (MSVC), wider on others
        return x.astype(np.float64 if dtype.itemsize > 4 else np.float32), dtype
    if dtype.kind in "iub":
        return x.astype(np.float64), np.dtype(np.float64)
    raise TypeError(f"scores must be real numbers, got dtype {dtype}")


def kernels(module: ModuleType) -> dict[str, object]:
    """The compiled CUDA kernels of a generated module on the current device, built once and cached."""
    import cupy

    device = cupy.cuda.runtime.getDevice()
    key = (module.NAME, id(module), device)
    with _lock:
        if key not in _kernel_cache:
            raw = cupy.RawModule(code=module.CUDA_SOURCE, options=("-std=c++17",))
            _kernel_cache[key] = {name: raw.get_function(name) for name in module.CUDA_KERNELS}
        return _kernel_cache[key]
