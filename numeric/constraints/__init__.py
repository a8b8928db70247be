"""Constraint sets beyond the simplex, one module each, on the row operations of :mod:`numeric.core`.

* :mod:`numeric.constraints.box`: ``0 <= p <= upper``, ``sum p = total``.
"""
