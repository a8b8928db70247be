"""CuPy's backend folder: :mod:`numeric.cupy.backend` (:class:`~numeric.cupy.backend.CupyBackend`, the package's CUDA
kernels with each map's device functions), imported only when a CuPy array is seen.  Nothing is imported here."""
