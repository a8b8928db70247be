"""regattn's numeric layer: NumPy (and CuPy) maps, attention and layers.

This package never imports SymPy.  Its kernels come from modules in
:mod:`numeric._generated`, written by ``regattn generate`` from the symbolic
derivations in :mod:`derive`.  The maps, attention functions and layers are
built in later milestones (see the issues); this package is importable now so
that the layout is fixed.
"""

__version__ = "0.1.0"
