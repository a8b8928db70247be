"""Hypothesis profiles: ``ci`` (fast, the default of ``make test``), ``dev`` and ``thorough``.

Select one with ``pytest --hypothesis-profile=NAME`` (``make test PROFILE=NAME``).
"""

from hypothesis import HealthCheck, settings

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=15, derandomize=True, print_blob=True, **_common)
settings.register_profile("dev", max_examples=60, **_common)
settings.register_profile("thorough", max_examples=500, **_common)
settings.load_profile("dev")

# numeric.torch and numeric.jax import their framework (optional extras): where one is not installed, their
# doctests are not collected (the tests of tests/torch and tests/jax skip, and are counted, on their own)
import importlib.util  # noqa: E402

collect_ignore = [f"numeric/{name}" for name in ("torch", "jax") if importlib.util.find_spec(name) is None]

# Triton's interpreter (TRITON_INTERPRET=1) is chosen when Triton is first imported, and any test module may
# import it first (torch._dynamo does, at collection): without a GPU the kernels run only in the interpreter,
# so it is chosen here, before any test module is imported (with a GPU, tests/triton's conftest chooses it
# when Triton is still unimported, and the GPU tests run Triton for real otherwise)
import os  # noqa: E402
import sys  # noqa: E402

if "triton" not in sys.modules and importlib.util.find_spec("triton") is not None:
    try:
        import torch
    except ImportError:
        _gpu = False
    else:
        _gpu = torch.cuda.is_available()
    if not _gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
