"""Maps under test for numeric.torch: the built-ins and the two user regularizers of tests/numeric (generated the same way)."""

from __future__ import annotations

import sys

import pytest

try:
    from numeric.torch.maps import TorchMap
except ImportError:  # (torch absent: the tests of this folder skip)
    TorchMap = object

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


class RecordingMap(TorchMap):
    """A TorchMap that records the shape of every block of scores it is given (attention calls ``_run``, through
    which every call of a map goes)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def _run(self, x, dim, params, **kw):
        self.calls.append(tuple(x.shape))
        return super()._run(x, dim, params, **kw)
