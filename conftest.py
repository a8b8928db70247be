"""Hypothesis profiles: ``ci`` (fast, the default of ``make test``), ``dev`` and ``thorough``.

Select one with ``pytest --hypothesis-profile=NAME`` (``make test PROFILE=NAME``).
"""

from hypothesis import HealthCheck, settings

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=15, derandomize=True, print_blob=True, **_common)
settings.register_profile("dev", max_examples=60, **_common)
settings.register_profile("thorough", max_examples=500, **_common)
settings.load_profile("dev")


def _requested_profile(argv):
    """The ``--hypothesis-profile`` given on the command line ``argv``, or None."""
    for i, arg in enumerate(argv):
        if arg.startswith("--hypothesis-profile="):
            return arg.partition("=")[2]
        if arg == "--hypothesis-profile" and i + 1 < len(argv):
            return argv[i + 1]
    return None


# Hypothesis's plugin loads the requested profile in pytest_configure, after the conftests of the folders named on
# the command line are imported (``pytest tests/triton``): tests/profile.THOROUGH, read by those conftests, would
# see "dev" there.  So the profile is loaded here, first of all conftests, and handed to xdist's workers (whose
# command line is not pytest's) through the environment.
import os  # noqa: E402
import sys  # noqa: E402

# Each of xdist's workers is one of several processes sharing the cores: OpenMP's threads (torch's intra-op pool,
# inductor's kernels) in every worker oversubscribe them, and their spin-waits take the other workers' time.  So a
# worker gets its share of the cores (the user's OMP_NUM_THREADS wins).  On 2 cores with 2 workers, measured:
# tests/attention/test_gradients.py 52 -> 40 s wall; a mix of a generate test, tests/torch/test_compile_maps.py and
# tests/jax/test_attention.py 130 -> 119 s with inductor's cache cold, 110 -> 92 s warm (docs/benchmarks.md).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
if _workers > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _workers))

_PROFILE_ENV = "REGATTN_HYPOTHESIS_PROFILE"
_requested = _requested_profile(sys.argv[1:]) or os.environ.get(_PROFILE_ENV)
if _requested in ("ci", "dev", "thorough"):
    settings.load_profile(_requested)
    os.environ[_PROFILE_ENV] = _requested

# numeric.torch, numeric.jax and numeric.torch.hf import their framework (optional extras): where one is not installed, their
# doctests are not collected (the tests of tests/torch and tests/jax skip, and are counted, on their own)
import importlib.util  # noqa: E402

collect_ignore = [f"numeric/{name}" for name in ("torch", "jax") if importlib.util.find_spec(name) is None]
if importlib.util.find_spec("transformers") is None:  # the extra [hf]
    collect_ignore.append("numeric/torch/hf.py")

# Triton's interpreter (TRITON_INTERPRET=1) is chosen when Triton is first imported, and any test module may
# import it first (torch._dynamo does, at collection): without a GPU the kernels run only in the interpreter,
# so it is chosen here, before any test module is imported (with a GPU, tests/triton's conftest chooses it
# when Triton is still unimported, and the GPU tests run Triton for real otherwise)

if "triton" not in sys.modules and importlib.util.find_spec("triton") is not None:
    try:
        import torch
    except ImportError:
        _gpu = False
    else:
        _gpu = torch.cuda.is_available()
    if not _gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")


# JAX's 64-bit switch is process-wide: a test that turns it on with ``jax.config.update`` (instead of the
# ``jax.enable_x64`` context) changes the dtypes every later test in its worker sees, numeric.jax's float32
# doctests among them, and which tests those are depends on how xdist deals them out.  A test that leaves the
# switch changed fails here, by name.
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _jax_x64_left_as_found():
    jax = sys.modules.get("jax")
    before = jax.config.jax_enable_x64 if jax is not None else False
    yield
    jax = sys.modules.get("jax")
    if jax is not None and jax.config.jax_enable_x64 != before:
        jax.config.update("jax_enable_x64", before)
        pytest.fail(f"the test left jax_enable_x64 = {not before}: use the jax.enable_x64 context", pytrace=False)


# Each executable XLA compiles stays loaded while JAX caches it, and holds about a dozen memory mappings; a worker
# that runs tests/jax's hypothesis cases compiles thousands of shapes and reaches Linux's limit of 65,530 mappings
# a process (vm.max_map_count) about ten minutes in, where the next compile dies of a segmentation fault inside
# XLA.  So JAX's caches are cleared when the worker holds more than half the limit (counted every 16 tests).
from tests import map_limit  # noqa: E402

_tests_run = [0]


@pytest.fixture(autouse=True)
def _jax_executables_within_the_map_limit():
    yield
    _tests_run[0] += 1
    jax = sys.modules.get("jax")
    if jax is not None and map_limit.LIMIT is not None and _tests_run[0] % 16 == 0:
        map_limit.kept_below(map_limit.LIMIT // 2, jax)


@pytest.fixture
def backend(request):
    """The backend a test is parametrised with (``indirect=True``; ``tests.backends.backend_params``), inside its
    context (JAX: 64-bit); skipped where its framework is not installed."""
    from tests.backends import BACKENDS

    b = BACKENDS[request.param]()
    with b.context():
        yield b
