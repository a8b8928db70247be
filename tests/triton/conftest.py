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


def _patch_the_language_once_per_launch():
    """Triton's interpreter patches ``triton.language`` (every builtin of ``tl``, ``tl.math``, ``tl.tensor``, found
    by ``inspect.getmembers``) when a kernel is launched, for the whole grid, and undoes it when the grid ends; it
    also patches it again on every call of a ``@triton.jit`` device function inside the kernel, which changes
    nothing while the launch's patch holds (a builtin already patched is no longer a builtin) and took a third of
    the interpreter's time in these tests, whose kernels call their helpers per key block.  Here a device call
    inside a launch whose language modules that launch has patched skips the repeat; a launch, or a device call
    reaching modules not patched yet, patches as before.  (Where Triton's interpreter lacks these names, nothing
    changes.)"""
    try:
        from triton.runtime import interpreter as ti
    except ImportError:
        return
    if not all(hasattr(ti, n) for n in ("_patch_lang", "_LangPatchScope", "GridExecutor", "tl")):
        return
    patch_lang, launch = ti._patch_lang, ti.GridExecutor.__call__
    patched: set = set()  # the language modules the running launch has patched (empty outside a launch)
    running = [0]

    def languages(fn):
        return frozenset(id(v) for v in fn.__globals__.values() if v is ti.tl or v is ti.tl.core)

    def patch_once(fn):
        langs = languages(fn)
        if running[0] and langs <= patched:
            return ti._LangPatchScope()
        scope = patch_lang(fn)
        if running[0]:
            patched.update(langs)
        return scope

    def run_launch(self, *args, **kwargs):
        running[0] += 1
        try:
            return launch(self, *args, **kwargs)
        finally:
            running[0] -= 1
            if not running[0]:
                patched.clear()

    ti._patch_lang, ti.GridExecutor.__call__ = patch_once, run_launch


if interpreter_reason() is None:  # (the interpreter runs the kernels)
    _patch_the_language_once_per_launch()
