"""The CuPy backend: maps on CuPy arrays with the generated CUDA kernels, one block per row.

The kernels (``NAME_forward_rows_f32/f64``, ``NAME_jvp_f32/f64``, and a
continuous map's ``NAME_rbf_context_f64``) come from the module's
``CUDA_SOURCE``, compiled once per device (:func:`numeric.backend.kernels`) and
launched with :data:`numeric.contract.CUDA_THREADS` threads per block.  CuPy is
imported only when a CuPy array is seen.
"""

from __future__ import annotations

import numpy as np

from ..backend import Backend, is_cupy, kernels
from ..contract import CUDA_THREADS

__all__ = ["CupyBackend"]

#: Most blocks one launch uses; rows beyond it are taken by the grid-stride loop of the kernels.
MAX_BLOCKS = 65535


class CupyBackend(Backend):
    """Maps on CuPy arrays: the generated row kernels."""

    name = "cupy"

    def owns(self, array) -> bool:
        return is_cupy(array)

    def namespace(self):
        import cupy

        return cupy

    def _suffix(self, x) -> str:
        return "f64" if x.dtype == np.float64 else "f32"

    def forward(self, mapping, x, *, overwrite: bool = False):
        """``(p, tau)`` for the rows of ``x`` (2-D, C-contiguous) by the ``forward_rows`` kernel."""
        import cupy

        rows, n = x.shape
        p = cupy.empty_like(x)
        tau = cupy.empty(rows, dtype=x.dtype)
        kern = kernels(mapping.module)[f"{mapping.name}_forward_rows_{self._suffix(x)}"]
        kern((min(rows, MAX_BLOCKS),), (CUDA_THREADS,), (x, p, tau, np.int64(rows), np.int64(n), *mapping.cast_params(x.dtype)))
        return p, tau

    def jvp(self, mapping, y, dx):
        """``J dx`` along the last axis at ``y = m(x)`` by the ``jvp`` kernel."""
        import cupy

        y, dx = cupy.ascontiguousarray(y), cupy.ascontiguousarray(dx)
        rows, n = y.shape
        out = cupy.empty_like(y)
        kern = kernels(mapping.module)[f"{mapping.name}_jvp_{self._suffix(y)}"]
        kern((min(rows, MAX_BLOCKS),), (CUDA_THREADS,), (y, dx, out, np.int64(rows), np.int64(n), *mapping.cast_params(y.dtype)))
        return out

    def rbf_expectation(self, cmap, mu, sigma2, basis, grad: bool):
        """``(r, dr/dmu, dr/dsigma2)`` of a continuous map by the ``rbf_context`` kernel (the gradients cost little more)."""
        import cupy

        shape = mu.shape + (len(basis),)
        rows, n = int(np.prod(mu.shape, dtype=np.int64)), len(basis)
        c, s2 = cupy.asarray(basis.centers), cupy.asarray(basis.variances)
        outs = [cupy.empty(shape, dtype=np.float64) for _ in range(3)]
        kern = kernels(cmap.module)[f"{cmap.name}_rbf_context_f64"]
        blocks = max(1, min((rows * n + CUDA_THREADS - 1) // CUDA_THREADS, MAX_BLOCKS))
        kern((blocks,), (CUDA_THREADS,), (cupy.ascontiguousarray(mu), cupy.ascontiguousarray(sigma2), c, s2,
                                         np.int64(rows), np.int64(n), *outs))
        return tuple(outs) if grad else (outs[0], None, None)
