"""Maps under test: the built-ins and two user regularizers generated into a temporary package."""

from __future__ import annotations

import sys
from functools import lru_cache

import pytest
import sympy as sp

from derive import Regularizer, derive_map, generate_module
from derive.codegen.builtins import BUILTIN_MAPS

USER = {"shannon_gini": "p*log(p) + p**2/2", "cube": "p**3"}
PARAMS = {"entmax": {"alpha": 1.3}}


@lru_cache(maxsize=None)
def derivation(name: str):
    if name in BUILTIN_MAPS:
        return derive_map(BUILTIN_MAPS[name]())
    return derive_map(Regularizer.from_string(USER[name], name=name))


@pytest.fixture(scope="session", autouse=True)
def user_modules(tmp_path_factory):
    """Write the user maps with the same generator as `regattn generate --expr` and make them importable."""
    folder = tmp_path_factory.mktemp("usermaps")
    for name in USER:
        (folder / f"{name}.py").write_text(generate_module(derivation(name), name))
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def reference(name: str, row, digits: int = 30, **params):
    params = params or PARAMS.get(name, {})
    return [float(v) for v in derivation(name).evaluate(list(map(float, row)), digits=digits, **params)]


ALPHA = sp.Symbol("alpha")
