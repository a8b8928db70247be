"""regattn's maps, losses, attention and layers for PyTorch (the optional extra ``[torch]``).

Everything here is computed from the ``torch_routines()`` section of a
generated map module (:data:`numeric.contract.SECTIONS`): the same derivation
as the NumPy maps, printed for torch tensors.  Importing this package imports
torch; ``import numeric`` does not.

    >>> import torch
    >>> from numeric import torch as rt
    >>> rt.sparsemax(torch.tensor([-2.0, 0.0, 0.5]))
    tensor([0.0000, 0.2500, 0.7500])
"""

from __future__ import annotations

import importlib

try:
    import torch as _torch  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError("numeric.torch needs PyTorch: pip install 'regattn[torch]' "
                              "(the CPU wheel first: pip install torch)", name=exc.name) from None

#: public name -> the submodule that defines it
_EXPORTS = {
    "TorchMap": "maps", "get_map": "maps", "softmax": "maps", "sparsemax": "maps", "entmax15": "maps", "entmax": "maps",
    "fenchel_young_loss": "losses", "FenchelYoungLoss": "losses",
    "attention": "attention",
    "MultiheadAttention": "layers",
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
