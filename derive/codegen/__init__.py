"""Code generation: the rewriting into stable forms, the printers (NumPy, CUDA C++, Triton) and module emission.

    >>> from derive import derive_map, gini
    >>> from derive.codegen import generate_module
    >>> text = generate_module(derive_map(gini()), "sparsemax")
    >>> "CUDA_SOURCE" in text and "def weight(p):" in text
    True
"""

from .emit import HEADER_MARK, check_name, content_hash, generate_module

__all__ = ["generate_module", "check_name", "content_hash", "HEADER_MARK"]
