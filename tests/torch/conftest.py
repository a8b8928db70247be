"""Maps under test for numeric.torch: the built-ins and the two user regularizers of tests/numeric (generated the same way)."""

from __future__ import annotations

import sys

import pytest

from derive import generate_module
from tests.numeric.conftest import USER, derivation

#: (name, parameters) of every map tested: the built-ins, alpha-entmax at a few alphas, the user maps
MAPS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3}), ("entmax", {"alpha": 1.01}),
        ("entmax", {"alpha": 5.0}), ("shannon_gini", {}), ("cube", {})]
IDS = [name + "".join(f"-{k}{v}" for k, v in params.items()) for name, params in MAPS]


@pytest.fixture(scope="session", autouse=True)
def torch_user_modules(tmp_path_factory):
    """Write the user maps with the generator of `regattn generate --expr` and make them importable."""
    folder = tmp_path_factory.mktemp("torch_usermaps")
    for name in USER:
        (folder / f"{name}.py").write_text(generate_module(derivation(name), name))
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
