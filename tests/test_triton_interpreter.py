"""Without a GPU, Triton runs in its interpreter in every test process, whichever test module imports it first
(tests/triton's kernels otherwise skip: a torch.compile test module imports Triton at collection)."""

from __future__ import annotations

import pytest


def test_triton_is_in_its_interpreter_without_a_gpu():
    torch = pytest.importorskip("torch")
    triton = pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("a GPU: Triton runs for real")
    assert triton.knobs.runtime.interpret
