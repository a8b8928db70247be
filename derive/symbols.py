"""The symbols a derivation is written in, shared by the derivation, its reference and its printers.

``p`` (a probability) and ``z`` (the link's argument) live with the
regularizers in :mod:`derive.regularizers`.
"""

from __future__ import annotations

import sympy as sp

__all__ = ["score", "s", "y", "tau", "i", "d", "k", "s_max", "s_min", "S", "S1", "S2", "s_k"]

#: A single score (scalar) and the score vector as an indexed base ``s[i]``.
score = sp.Symbol("s", real=True)
s = sp.IndexedBase("s", real=True)
#: Target distribution of the Fenchel-Young loss.
y = sp.IndexedBase("y", real=True)
#: Threshold (the Lagrange multiplier of ``sum_i p_i = 1``).
tau = sp.Symbol("tau", real=True)
#: Index, dimension and support size.
i = sp.Symbol("i", integer=True, positive=True)
d = sp.Symbol("d", integer=True, positive=True)
k = sp.Symbol("k", integer=True, positive=True)
#: Largest score, the sum ``S = sum_i B(s_i)`` of a closed threshold, and the
#: sums of the ``k`` largest scores and of their squares (sort threshold).
s_max = sp.Symbol("s_max", real=True)
#: Smallest score: the threshold's lower bracket where omega's domain ends at 1 (``omega'(1) = +oo``).
s_min = sp.Symbol("s_min", real=True)
S = sp.Symbol("S", positive=True)
S1 = sp.Symbol("S_1", real=True)
S2 = sp.Symbol("S_2", real=True)
#: The k-th largest score (sort threshold).
s_k = sp.Symbol("s_(k)", real=True)
