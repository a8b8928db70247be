"""regattn's maps and attention for JAX (the optional extra ``[jax]``).

Everything here is computed from the routines of a generated map module run on
JAX arrays (:func:`numeric.contract.routines_on`): the NumPy maps' code, with
``jax.numpy`` for NumPy.  Importing this package imports
JAX; ``import numeric`` does not.

    >>> import jax.numpy as jnp
    >>> from numeric import jax as rj
    >>> rj.sparsemax(jnp.array([-2.0, 0.0, 0.5]))
    Array([0.  , 0.25, 0.75], dtype=float32)
"""

from __future__ import annotations

try:
    import jax as _jax  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError("numeric.jax needs JAX: pip install 'regattn[jax]'", name=exc.name) from None

from .attention import attention  # the function (the submodule of the same name is numeric.jax.attention)
from .distributed import context_parallel_attention, shard_layout, unshard_layout
from .maps import FAMILY_FUNCTIONS, JaxMap, entmax, entmax15, fenchel_young_loss, get_map, softmax, sparsemax

globals().update(FAMILY_FUNCTIONS)  # the map families' functions (numeric.families)

__all__ = ["JaxMap", "get_map", "softmax", "sparsemax", "entmax15", "entmax", *FAMILY_FUNCTIONS, "fenchel_young_loss",
           "attention", "context_parallel_attention", "shard_layout", "unshard_layout"]
