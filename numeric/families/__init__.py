"""Map families, one module each: maps whose ``p`` follows from a generated map's (:mod:`numeric.families.base`,
the protocol).

* :mod:`numeric.families.normmax`: normmax, ``p`` from an entmax's, its Jacobian and its loss.

:data:`FAMILIES` (:mod:`numeric.families.table`) is the table every front end reads: :func:`numeric.get_map` and
its torch and JAX namesakes find a family there by name, and each front end's functions of the families
(``nm.NAME``) are made from it (:func:`functions`).  A new family is a module here that defines a
:class:`~numeric.families.base.Family` and :func:`register`\\ s it, imported below.
"""

from __future__ import annotations

from . import normmax  # noqa: F401 (registers the family)
from .base import Family
from .table import FAMILIES, family_of, functions, register

__all__ = ["Family", "FAMILIES", "register", "family_of", "functions"]
