"""The registry of backends (:class:`numeric.backend.Backend`) and the choice of one per call.

:func:`backend_for` picks the backend that owns the given arrays, once per
call; NumPy and CuPy are registered here, another array library adds its own
with :func:`register_backend` (docs/architecture.md, "Adding a backend").
"""

from __future__ import annotations

import threading

import numpy as np

from .backend import Backend
from .cupy.backend import CupyBackend
from .numpy.backend import NumpyBackend

__all__ = ["backend_for", "register_backend", "backends"]


_lock = threading.Lock()
_NUMPY = NumpyBackend()
_registry: list[Backend] = [CupyBackend(), _NUMPY]
_defaults_only = True  # no backend registered beyond NumPy and CuPy


def register_backend(backend: Backend) -> Backend:
    """Add ``backend`` (tried before those registered earlier); returns it."""
    if not isinstance(backend, Backend):
        raise TypeError(f"a backend must be a numeric.backend.Backend, got {type(backend).__name__}")
    global _defaults_only
    with _lock:
        _registry.insert(0, backend)
        _defaults_only = False
    return backend


def backends() -> tuple[Backend, ...]:
    """The registered backends, in the order they are tried (NumPy last: it also takes Python scalars and lists)."""
    return tuple(_registry)


def backend_for(*arrays: object) -> Backend:
    """The backend of ``arrays`` (``None`` entries ignored; Python numbers and lists are NumPy's).

    Raises
    ------
    TypeError
        If the arrays belong to different backends.
    """
    if _defaults_only and all(type(a) is np.ndarray or a is None for a in arrays):
        return _NUMPY  # the common case: no search
    found: dict[str, Backend] = {}
    registered = backends()
    default = registered[-1]
    for a in arrays:
        if a is None:
            continue
        owner = next((b for b in registered if b.owns(a)), default)
        found[owner.name] = owner
    if len(found) > 1:
        raise TypeError("arrays of different backends in one call: " + ", ".join(
            f"{type(a).__module__}.{type(a).__name__}" for a in arrays if a is not None))
    return next(iter(found.values()), default)
