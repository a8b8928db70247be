"""The generated Triton kernels run in Triton's interpreter on CPU tensors.

The interpreter is chosen when Triton is first imported (``TRITON_INTERPRET=1``):
this conftest sets the variable while the tests are collected, before any test
imports Triton.  If Triton was imported without it (or is absent), the tests of
this folder skip, saying why.
"""

from __future__ import annotations

import os
import sys

import pytest

if "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.numeric.conftest import importable_user_maps  # noqa: E402


def interpreter_reason() -> str | None:
    """Why the kernels cannot run here (``None``: they can)."""
    try:
        import torch  # noqa: F401
        import triton
    except ImportError as exc:
        return f"needs torch and triton ({exc})"
    if not triton.knobs.runtime.interpret:
        return "Triton was imported before TRITON_INTERPRET=1 was set"
    return None


@pytest.fixture(scope="session", autouse=True)
def triton_user_modules(tmp_path_factory):
    with importable_user_maps(tmp_path_factory.mktemp("triton_usermaps")) as folder:
        yield folder
