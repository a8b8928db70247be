"""regattn's maps and attention for JAX (the optional extra ``[jax]``).

Everything here is computed from the ``jax_routines()`` section of a
generated map module (:data:`numeric.contract.SECTIONS`): the same derivation
as the NumPy maps, printed for JAX arrays.  Importing this package imports
JAX; ``import numeric`` does not.

    >>> import jax.numpy as jnp
    >>> from numeric import jax as rj
    >>> rj.sparsemax(jnp.array([-2.0, 0.0, 0.5]))
    Array([0.  , 0.25, 0.75], dtype=float32)
"""

from __future__ import annotations

import importlib

try:
    import jax as _jax  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError("numeric.jax needs JAX: pip install 'regattn[jax]'", name=exc.name) from None

#: public name -> the submodule that defines it
_EXPORTS = {
    "JaxMap": "maps", "get_map": "maps", "softmax": "maps", "sparsemax": "maps", "entmax15": "maps", "entmax": "maps",
    "fenchel_young_loss": "maps",
    "attention": "attention",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
