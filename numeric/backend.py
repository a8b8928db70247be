"""The backend seam: one array library's implementation of a map, chosen once per call.

A :class:`Backend` provides, for the rows of a 2-D array of its own kind, the
map's forward pass (row operations, the link and the threshold rule, returning
``p`` and ``tau``) and its JVP, plus the array namespace the front end uses
for the rest (casts, reshapes, the loss).  :class:`numeric.Map` keeps the
front end (argument checks, parameters, axes, dtypes, the loss and
``vjp_params``) and hands the rows to the backend
:func:`numeric.backends.backend_for` picks from the arrays' types.  A
continuous map (:class:`numeric.continuous.ContinuousMap`) hands its checked
``mu`` and ``sigma2`` to the backend the same way for the basis expectations.

NumPy (:mod:`numeric.numpy.backend`) and CuPy (:mod:`numeric.cupy.backend`)
are registered in :mod:`numeric.backends`; another library registers its own
with :func:`numeric.backends.register_backend`.  Everything in :mod:`numeric` returns the kind of
array it was given; CuPy is imported only when a CuPy array is seen.

Also here: :func:`array_module` (NumPy or CuPy for attention's matrix
products), :func:`to_compute_dtype` and the CuPy kernel cache.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from types import ModuleType

import numpy as np

from . import contract

__all__ = ["Backend", "bound_routines", "at_zero", "array_module", "is_cupy", "to_compute_dtype", "kernels", "CUDA_THREADS"]

CUDA_THREADS = contract.CUDA_THREADS
_lock = threading.Lock()
_kernel_cache: dict[tuple[str, int, int], dict[str, object]] = {}


class Backend:
    """One array library's implementation of a map's rows.  Subclasses set :attr:`name` and implement:

    * :meth:`owns`: whether an array is of this backend's kind;
    * :meth:`namespace`: its NumPy-like array namespace;
    * :meth:`forward`: ``(p, tau)`` for the rows of a 2-D array ``x``, for
      ``mapping`` (a :class:`numeric.Map`: ``mapping.module`` is the generated
      module, ``mapping.threshold`` the threshold rule, ``mapping.cast_params(dtype)``
      the parameter values in ``x``'s dtype); ``tau`` is ``+inf`` on fully masked
      rows and NaN on rows holding a NaN, whose ``p`` is 0 and NaN;
    * :meth:`jvp`: ``J dx`` along the last axis at ``y = m(x)``;
    * :meth:`rbf_expectation` (for continuous maps only): ``(r, dr/dmu, dr/dsigma2)``
      with ``r = E_p[psi(t)]`` over the Gaussian ``basis`` for float64 ``mu`` and
      ``sigma2`` of one shape, for ``cmap`` (a :class:`numeric.continuous.ContinuousMap`:
      ``cmap.module`` is the generated continuous module); results gain a last
      axis of the basis size, and the derivatives are ``None`` when ``grad`` is false.
    """

    name = "abstract"

    def owns(self, array) -> bool:
        raise NotImplementedError

    def namespace(self):
        raise NotImplementedError

    def shares_memory(self, a, b) -> bool:
        """Whether ``a`` and ``b`` may share memory (``True`` when unknown: nothing is overwritten)."""
        return True

    def forward(self, mapping, x, *, overwrite: bool = False):
        raise NotImplementedError

    def jvp(self, mapping, y, dx):
        raise NotImplementedError

    def row_ops(self, dtype):
        """The row operations of :mod:`numeric.core` on this backend's arrays of ``dtype``
        (:class:`numeric.core.array_ops.ArrayOps` on :meth:`namespace`, unless a backend has its own)."""
        from .core.array_ops import ArrayOps

        return ArrayOps(self.namespace(), dtype)

    def constrained(self, mapping, cset, x, arrays: tuple):
        """``(p, tau)`` of the rows ``x`` over the constraint set ``cset`` (a
        :class:`numeric.constraints.ConstraintSet`; ``arrays``: its arrays laid out as rows of ``x``), by the set's
        solve on :meth:`row_ops`: every set runs on every backend (a set that appends a score to each row,
        :attr:`~numeric.constraints.ConstraintSet.appends`, by the backend's own solve on the longer rows)."""
        if cset.appends is not None:  # (the backend's own solve on the longer rows)
            column = cset.appended(arrays)
            if mapping.threshold == "closed" == mapping.module.THRESHOLD:
                solved = self.closed_with(mapping, x, column)
                if solved is not None:
                    return solved
            p, t = self.forward(mapping, self.namespace().concatenate([x, column], axis=-1), overwrite=True)
            return p[:, :x.shape[-1]], t
        with np.errstate(all="ignore"):  # (off-support branches are evaluated and masked)
            p, t = cset.solve(self.row_ops(x.dtype), bound_routines(mapping, x.dtype), x, *arrays)
        return p, t[:, 0]

    def closed_with(self, mapping, x, column):
        """``(p, tau)`` of a map with a closed threshold over the rows ``[x, column]`` without the column
        (:func:`numeric.core.rules.closed_with`) with no copy of the rows, or ``None`` where the backend has no such
        solve (the rows are then concatenated)."""
        return None

    def constrained_vjp(self, mapping, cset, y, dy, arrays: tuple, x=None):
        """``(J^T dy, (dp/da^T dy for each array a))`` of the map over ``cset`` at ``y``
        (:meth:`numeric.constraints.ConstraintSet.vjp`; ``x``: the scores, or ``None``)."""
        with np.errstate(all="ignore"):
            return cset.vjp(self.row_ops(y.dtype), bound_routines(mapping, y.dtype), y, dy, *arrays,
                            at_zero=at_zero(mapping.module), x=x)

    def rbf_expectation(self, cmap, mu, sigma2, basis, grad: bool):
        raise NotImplementedError(f"backend {self.name!r} has no continuous maps")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def bound_routines(mapping, dtype):
    """A map's routines bound to its parameter values in ``dtype`` (NumPy's routines: they take CuPy arrays too)."""
    from .core.ops import Routines

    return Routines(mapping.module, contract.module_routines(mapping.module), mapping.cast_params(dtype))


@lru_cache(maxsize=64)
def at_zero(module):
    """:func:`numeric.core.derivatives.weight_at_zero` of a module, once."""
    from .core import derivatives

    return derivatives.weight_at_zero(module)


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
