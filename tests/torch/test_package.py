"""numeric.torch's names are its functions and classes, whatever was imported before."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")


def test_attention_is_the_function_after_the_layer_module_was_imported():
    code = ("import numeric.torch.layers, numeric.torch.attention\n"
            "from numeric import torch as rt\n"
            "from numeric.torch import attention\n"
            "assert callable(attention) and attention is rt.attention and attention.__name__ == 'attention', attention\n"
            "assert sorted(rt.__all__) == sorted(n for n in rt.__all__ if callable(getattr(rt, n)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
