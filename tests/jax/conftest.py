"""numeric.jax's tests: float64 inside each test module of this folder, and the user maps of tests/numeric generated.

64-bit JAX is switched on by a context (``jax.enable_x64``) entered when a module of
this folder starts and left when it ends, so it does not reach the tests of other
folders (tests/derive/test_sections.py, numeric.jax's float32 doctests).
"""

from __future__ import annotations

import sys

import pytest

from derive import generate_module
from tests.numeric.conftest import USER, derivation

#: (name, parameters) of every map tested: the built-ins, alpha-entmax at a few alphas, the user maps
MAPS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3}), ("entmax", {"alpha": 1.01}),
        ("entmax", {"alpha": 5.0}), ("shannon_gini", {}), ("cube", {})]
IDS = [name + "".join(f"-{k}{v}" for k, v in params.items()) for name, params in MAPS]


@pytest.fixture(scope="module", autouse=True)
def float64():
    jax = pytest.importorskip("jax")
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="session", autouse=True)
def jax_user_modules(tmp_path_factory):
    """Write the user maps with the generator of `regattn generate --expr` and make them importable."""
    folder = tmp_path_factory.mktemp("jax_usermaps")
    for name in USER:
        (folder / f"{name}.py").write_text(generate_module(derivation(name), name))
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
