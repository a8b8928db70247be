"""regattn's numeric layer: attention maps in NumPy and CuPy, from generated kernels.

    >>> import numpy as np
    >>> import numeric as nm
    >>> nm.softmax(np.array([-2.0, 0.0, 0.5])).round(4)
    array([0.0486, 0.3592, 0.5922])
    >>> nm.entmax15(np.array([-2.0, 0.0, 0.5])).round(4)
    array([0.   , 0.326, 0.674])

This package never imports SymPy.  Its kernels come from modules in
:mod:`numeric._generated`, written by ``regattn generate`` from the symbolic
derivations in :mod:`derive`.
"""

from .attention import attention, attention_backward
from .continuous import ContinuousAttention, GaussianBasis, continuous_attention, continuous_attention_backward, get_continuous_map
from .layers import MultiHeadAttention, SelfAttention, sinusoidal_encoding
from .maps import FAMILY_FUNCTIONS, Map, entmax, entmax15, get_map, softmax, sparsemax
from .heap import apply_environment as _heap_from_environment
from .heap import get_heap_reserve, set_heap_reserve
from .parallel import get_num_threads, set_num_threads

_heap_from_environment()  # (only where REGATTN_HEAP_RESERVE asks: numeric.heap)
globals().update(FAMILY_FUNCTIONS)  # the map families' functions (numeric.families)

__all__ = [
    "Map",
    "get_map",
    "softmax",
    "sparsemax",
    "entmax15",
    "entmax",
    *FAMILY_FUNCTIONS,
    "attention",
    "attention_backward",
    "SelfAttention",
    "MultiHeadAttention",
    "sinusoidal_encoding",
    "get_continuous_map",
    "GaussianBasis",
    "continuous_attention",
    "continuous_attention_backward",
    "ContinuousAttention",
    "set_num_threads",
    "get_num_threads",
    "set_heap_reserve",
    "get_heap_reserve",
]
__version__ = "0.1.0"
