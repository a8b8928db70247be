"""How one sequence's positions lie over the ranks (devices) of context-parallel attention.

Written once for :mod:`numeric.torch.distributed` and :mod:`numeric.jax.distributed`:

* ``"contiguous"``: rank ``r`` of ``P`` holds positions ``[r n, (r + 1) n)``, ``n = L / P``;
* ``"zigzag"``: the sequence is cut into ``2P`` chunks of ``c = n / 2`` and rank ``r`` holds chunks ``r`` and
  ``2P - 1 - r``, in that order, which gives every rank the same causal work.

>>> chunks(4, 1, 2, "zigzag")        # rank 1 of 2, 4 positions each: rows 0-1 are positions 2-3, rows 2-3 are 4-5
[(0, 2, 2), (2, 4, 4)]
>>> layout_positions(8, 2, "zigzag").tolist()   # every rank's positions, rank by rank
[0, 1, 6, 7, 2, 3, 4, 5]
"""

from __future__ import annotations

import numpy as np

__all__ = ["LAYOUTS", "check_layout", "chunks", "layout_positions"]

LAYOUTS = ("contiguous", "zigzag")


def check_layout(layout) -> str:
    """``layout`` if it is one of :data:`LAYOUTS`; a ValueError naming it otherwise."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    return layout


def chunks(n: int, rank, world: int, layout: str) -> list:
    """``(start, stop, position)`` of each run of rank ``rank``'s ``n`` rows: the rows ``start:stop`` hold the
    positions from ``position`` on.  ``rank`` only enters the positions (by arithmetic), so it may be a traced
    value (JAX's axis index); with ``"zigzag"``, ``n`` must be even."""
    if layout == "contiguous":
        return [(0, n, rank * n)]
    c = n // 2
    return [(0, c, rank * c), (c, n, (2 * world - 1 - rank) * c)]


def layout_positions(length: int, world: int, layout: str) -> np.ndarray:
    """The positions of a sequence of ``length`` laid out over ``world`` ranks, rank by rank (each rank's rows in
    order): entry ``i`` of the laid-out sequence is position ``layout_positions(...)[i]``."""
    n = length // world
    return np.concatenate([np.arange(p, p + stop - start) for r in range(world) for start, stop, p in
                           chunks(n, r, world, layout)])
