"""NumPy's backend folder: its row operations, its row reductions and the backend that runs the maps on NumPy arrays.

* :mod:`numeric.numpy.ops`: :class:`~numeric.numpy.ops.NumpyRowOps`, the operations of :mod:`numeric.core` on
  2-D NumPy arrays, with NumPy's faster forms of some steps.
* :mod:`numeric.numpy.rows`: row sums and maxima, and :func:`~numeric.numpy.rows.select`.
* :mod:`numeric.numpy.backend`: :class:`~numeric.numpy.backend.NumpyBackend`, the maps' rows by
  :func:`numeric.core.rules.solve` on those operations, in chunks of rows on several threads.

NumPy's front end (the :class:`~numeric.maps.Map` class, attention and layers on NumPy and CuPy arrays) is
:mod:`numeric.maps`, :mod:`numeric.attention` and :mod:`numeric.layers`.  Nothing is imported here, so that the
shared core may import :mod:`numeric.numpy.rows` without importing the backend.
"""
