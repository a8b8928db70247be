"""numeric.jax's tests: float64 inside each test module of this folder, and the user maps of tests/numeric generated.

64-bit JAX is switched on by a context (``jax.enable_x64``) entered when a module of
this folder starts and left when it ends, so it does not reach the tests of other
folders (tests/derive/test_sections.py, numeric.jax's float32 doctests).
"""

from __future__ import annotations

import pytest

from tests.numeric.conftest import FRAMEWORK_IDS as IDS  # noqa: F401 (IDS, MAPS: for the tests)
from tests.numeric.conftest import FRAMEWORK_MAPS as MAPS  # noqa: F401
from tests.numeric.conftest import importable_user_maps  # noqa: F401


@pytest.fixture(scope="module", autouse=True)
def float64():
    jax = pytest.importorskip("jax")
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="session", autouse=True)
def jax_user_modules(tmp_path_factory):
    with importable_user_maps(tmp_path_factory.mktemp("jax_usermaps")) as folder:
        yield folder
