"""Constraint sets, one module each: what a map's ``p`` lies in (:mod:`numeric.constraints.base`, the protocol).

* :mod:`numeric.constraints.simplex`: ``p >= 0``, ``sum p = 1`` (every map's, by default);
* :mod:`numeric.constraints.box`: ``0 <= p <= upper``, ``sum p = total`` (``upper=``, ``total=``);
* :mod:`numeric.constraints.nosum`: ``0 <= p <= upper`` and no sum (``total=None``, ``upper=``);
* :mod:`numeric.constraints.sink`: ``sum p <= 1``, the slack a sink's weight (``sink=``).

:data:`SETS` (:mod:`numeric.constraints.table`) is the table every front end reads: :func:`choose` finds the set a
call's keyword arguments select, :func:`split` takes them out of a call's other keyword arguments (a map's
parameters).  A new set is a module here that defines a :class:`~numeric.constraints.base.ConstraintSet` and
:func:`register`\\ s it, imported below.
"""

from __future__ import annotations

from .base import ConstraintSet
from .box import BOX
from .nosum import NO_SUM
from .sink import SINK
from .simplex import SIMPLEX
from .table import KEYWORDS, SETS, choose, register, simplex_only, split

__all__ = ["ConstraintSet", "SETS", "KEYWORDS", "SIMPLEX", "BOX", "NO_SUM", "SINK", "register", "choose", "split", "simplex_only"]
