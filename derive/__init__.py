"""regattn's symbolic layer: regularizers, their attention maps and the ground truth.

    >>> import sympy
    >>> from derive import tsallis, derive_map
    >>> dv = derive_map(tsallis(sympy.Rational(3, 2)))
    >>> dv.threshold.kind
    'sort'
    >>> [round(float(v), 4) for v in dv.evaluate([-2, 0, 0.5])]
    [0.0, 0.326, 0.674]

This package uses SymPy and mpmath and never imports CuPy.
"""

from ._parse import FUNCTIONS
from ._timelimit import DEFAULT_TIMEOUT, TIMEOUT_ENV, TimeLimit
from .argmax import derive_map
from .derivation import Derivation, Inversion, Threshold
from .codegen import generate_module
from .errors import DerivationError, DerivationTimeout
from .regularizers import Parameter, Regularizer, alpha, binary_entropy, gini, p, shannon, tsallis, z

__all__ = [
    # writing a regularizer (derive.regularizers)
    "p", "z", "alpha", "Parameter", "Regularizer", "shannon", "gini", "tsallis", "binary_entropy", "FUNCTIONS",
    # deriving its map (derive.argmax, derive.derivation) and generating its module (derive.codegen)
    "derive_map", "Derivation", "Inversion", "Threshold", "generate_module",
    # errors and time limits
    "DerivationError", "DerivationTimeout", "TimeLimit", "DEFAULT_TIMEOUT", "TIMEOUT_ENV",
]

__version__ = "0.1.0"
