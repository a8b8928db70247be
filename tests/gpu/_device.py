"""CuPy and a CUDA device for the GPU tests: importing this skips the importing module without them."""

import pytest

cp = pytest.importorskip("cupy", reason="CuPy is not installed (extra 'cuda')")
try:
    HAS_GPU = cp.cuda.runtime.getDeviceCount() > 0
except Exception:  # no driver, no device
    HAS_GPU = False

#: Apply to a GPU test module: ``pytestmark = GPU``.
GPU = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")]
