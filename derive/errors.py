"""Errors raised by the symbolic layer."""

from __future__ import annotations

__all__ = ["DerivationError"]


class DerivationError(ValueError):
    """A regularizer or an expression cannot be turned into an attention map.

    The message names the condition that failed (strict convexity, a free
    symbol, a function outside the whitelist, ...) and the offending value.
    Subclasses :class:`ValueError`, so ``except ValueError`` also catches it.
    """
