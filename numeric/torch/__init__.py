"""regattn's maps, losses, attention and layers for PyTorch (the optional extra ``[torch]``).

Everything here is computed from the routines of a generated map module run on
torch tensors (:func:`numeric.contract.routines_on`): the NumPy maps' code, with
torch for NumPy.  Importing this package imports
torch; ``import numeric`` does not.

    >>> import torch
    >>> from numeric import torch as rt
    >>> rt.sparsemax(torch.tensor([-2.0, 0.0, 0.5]))
    tensor([0.0000, 0.2500, 0.7500])
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError("numeric.torch needs PyTorch: pip install 'regattn[torch]' "
                              "(the CPU wheel first: pip install torch --index-url https://download.pytorch.org/whl/cpu)", name=exc.name) from None

from .attention import attention  # the function (the submodule of the same name is numeric.torch.attention)
from .layers import MultiheadAttention
from .losses import FenchelYoungLoss, fenchel_young_loss
from .maps import FAMILY_FUNCTIONS, TorchMap, entmax, entmax15, get_map, softmax, sparsemax

globals().update(FAMILY_FUNCTIONS)  # the map families' functions (numeric.families)

__all__ = ["TorchMap", "get_map", "softmax", "sparsemax", "entmax15", "entmax", *FAMILY_FUNCTIONS,
           "fenchel_young_loss", "FenchelYoungLoss", "attention", "MultiheadAttention"]
