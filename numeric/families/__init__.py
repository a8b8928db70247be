"""The rules of map families that are not separable generated maps, on the row operations of :mod:`numeric.core`.

* :mod:`numeric.families.normmax`: normmax, ``p`` from an entmax's, its Jacobian and its loss.
"""
