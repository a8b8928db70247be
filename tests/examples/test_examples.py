"""Every example script runs and prints what it claims."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script, tmp_path):
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


def test_derive_a_map_prints_reference_values(tmp_path):
    script = next(s for s in EXAMPLES if s.name == "derive_a_map.py")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300).stdout
    assert "LambertW" in out
    assert "softmax : ['0.048611', '0.359188', '0.592201']" in out


def test_birds_sometimes_walk_prints_the_seed_numbers(tmp_path):
    script = next(s for s in EXAMPLES if s.name == "birds_sometimes_walk.py")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "v_walk . v_birds            = -0.090" in out
    assert "A[walk] @ V = [0.18, 0.11, 0.01]" in out
    assert "context(walk) . v_birds     = 0.043" in out
    for name in ("softmax", "sparsemax", "entmax15"):
        assert f"{name} weights" in out
    assert (tmp_path / "birds_sometimes_walk.png").stat().st_size > 10_000
