"""Score modifiers: what attention does to its scores before the map, each in one place.

* :class:`Softcap` (``softcap=c``, Gemma 2): ``s -> c tanh(s / c)``, applied to the scores before a mask or bias is
  added; its derivative ``1 - (c tanh(s / c) / c)^2`` is a function of the capped score (:meth:`Softcap.slope`).
* the sliding window (``window=w``) is a plan's: :class:`numeric.plan.Plan`.

The executors (NumPy's and torch's attention, which compute their own backward, and JAX's, which differentiates
through ``__call__``) take a modifier from :func:`softcap` and call it on each block of scores.
"""

from __future__ import annotations

import math
import numbers

__all__ = ["Softcap", "softcap"]


class Softcap:
    """``s -> c tanh(s / c)`` for a cap ``c > 0``: scores squashed into ``(-c, c)``, close to ``s`` where
    ``|s| << c``."""

    def __init__(self, cap: float):
        self.cap = cap

    def __call__(self, tanh, s):
        """The capped scores, ``tanh`` the array namespace's (``numpy.tanh``, ``torch.tanh``, ``jax.numpy.tanh``)."""
        return self.cap * tanh(s / self.cap)

    def slope(self, capped):
        """``d capped / d s`` at the capped scores: ``1 - (capped / c)^2``."""
        t = capped / self.cap
        return 1 - t * t

    def __repr__(self) -> str:
        return f"Softcap({self.cap!r})"


def softcap(value) -> Softcap | None:
    """The :class:`Softcap` of attention's ``softcap=`` keyword (``None``: none), checked: a real number, finite and
    ``> 0``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 < float(value) < math.inf):
        raise ValueError(f"softcap must be a finite number > 0, got {value!r}")
    return Softcap(float(value))
