"""The simplex ``p >= 0``, ``sum p = 1``: the set of every map by default, with no keywords of its own.

Its solve is :func:`numeric.core.rules.solve`, its Jacobian :func:`numeric.core.derivatives.jvp` (symmetric:
also the VJP).  The front ends run it by their own paths (a backend's kernels, torch's softmax, thresholds kept
for attention's backward); this member gives the generic path and the loss target's check.
"""

from __future__ import annotations

from ..core import derivatives, rules
from ..front import simplex_target
from .base import ConstraintSet

__all__ = ["Simplex", "SIMPLEX"]


class Simplex(ConstraintSet):
    """The probability simplex (see the module's docstring)."""

    name = "simplex"
    fused = "simplex"

    def asks(self, values: dict) -> bool:
        return False  # (numeric.constraints.choose takes the simplex where every keyword leaves its set out)

    def solve(self, ops, r, x):
        return rules.solve(ops, r, x)

    def vjp(self, ops, r, p, v, at_zero=None, x=None):
        return derivatives.jvp(ops, r, p, v, at_zero), ()

    def jvp(self, ops, r, p, dx, tangents: tuple = (), at_zero=None, x=None):
        return derivatives.jvp(ops, r, p, dx, at_zero)

    def check_target(self, xp, target, rows: tuple, slack: float, word: str, axis: int):
        return simplex_target(target, slack, word, axis)


#: the simplex
SIMPLEX = Simplex()
