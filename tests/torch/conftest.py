"""Maps under test for numeric.torch: the built-ins and the two user regularizers of tests/numeric (generated the same way)."""

from __future__ import annotations

import pytest

try:
    from numeric.torch.maps import TorchMap
except ImportError:  # (torch absent: the tests of this folder skip)
    TorchMap = object

from tests.numeric.conftest import FRAMEWORK_IDS as IDS  # noqa: F401 (IDS, MAPS: for the tests)
from tests.numeric.conftest import FRAMEWORK_MAPS as MAPS  # noqa: F401
from tests.numeric.conftest import importable_user_maps  # noqa: F401


@pytest.fixture(scope="session", autouse=True)
def torch_user_modules(tmp_path_factory):
    with importable_user_maps(tmp_path_factory.mktemp("torch_usermaps")) as folder:
        yield folder


class RecordingMap(TorchMap):
    """A TorchMap that records the shape of every block of scores it is given (attention calls ``run``, through
    which every call of a map goes)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def run(self, x, dim, params, **kw):
        self.calls.append(tuple(x.shape))
        return super().run(x, dim, params, **kw)
