"""Errors raised by the symbolic layer."""

from __future__ import annotations

__all__ = ["DerivationError", "DerivationTimeout"]


class DerivationError(ValueError):
    """A regularizer or an expression cannot be turned into an attention map.

    The message is one line: it names the condition that failed (strict
    convexity, a free symbol, a function outside the whitelist, ...) and the
    offending value.  Subclasses :class:`ValueError`, so ``except ValueError``
    also catches it.
    """


class DerivationTimeout(DerivationError):
    """The symbolic work did not finish within its time limit and was abandoned.

    Attributes
    ----------
    seconds:
        The limit that passed.
    what:
        What was being done, e.g. ``"deriving the map of omega(p) = p**3"``.
    """

    def __init__(self, seconds: float, what: str):
        self.seconds = seconds
        self.what = what
        super().__init__(
            f"gave up {what} after {seconds:g} s (the time limit; raise it with timeout=... "
            f"or the environment variable REGATTN_TIMEOUT)"
        )

    def __reduce__(self):
        return (type(self), (self.seconds, self.what))
