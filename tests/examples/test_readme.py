"""The Python snippets of the README and of docs/getting_started.md run as written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_readme_snippets_run(tmp_path):
    blocks = _blocks(ROOT / "README.md")
    assert len(blocks) >= 2
    code = "\n".join(blocks)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_getting_started_runs(tmp_path):
    # the page generates `mixed` with the CLI first, as it tells the reader to
    proc = subprocess.run([sys.executable, "-m", "derive.cli", "generate", "--expr", "p*log(p) + p**2/2", "--name", "mixed",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    code = "\n".join(_blocks(ROOT / "docs" / "getting_started.md"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("page", ["README.md", "docs/getting_started.md"])
def test_pages_have_snippets(page):
    assert _blocks(ROOT / page)


def test_frameworks_page_runs(tmp_path):
    """docs/frameworks.md's snippets (PyTorch, then JAX) run as written where both frameworks are installed."""
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    pytest.importorskip("transformers")
    # the page uses `shannon_gini`, generated with the CLI as docs/getting_started.md tells the reader
    proc = subprocess.run([sys.executable, "-m", "derive.cli", "generate", "--expr", "p*log(p) + p**2/2", "--name",
                           "shannon_gini", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    blocks = _blocks(ROOT / "docs" / "frameworks.md")
    assert len(blocks) >= 2
    proc = subprocess.run([sys.executable, "-c", "\n".join(blocks)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("page", ["README.md", "docs/getting_started.md"])
def test_evaluate_example_shows_what_a_user_gets(page):
    """The pages' comments on ``dv.evaluate`` show what it returns and how its 50 digits are seen."""
    import mpmath
    import sympy

    from derive import derive_map, tsallis

    text = (ROOT / page).read_text()
    probs = derive_map(tsallis(sympy.Rational(3, 2))).evaluate([-2, 0, 0.5])
    shown = re.search(r"^probs = dv\.evaluate\(\[-2, 0, 0\.5\]\) +# .*?(\[mpf.*\])$", text, flags=re.M)
    assert shown and shown.group(1) == repr(probs)
    digits = re.search(r"^mpmath\.nstr\(probs\[1\], 50\) +# '([0-9.]+)'", text, flags=re.M)
    assert digits and digits.group(1) == mpmath.nstr(probs[1], 50)


def test_torch_index_chooses_where_set_up_takes_torch():
    """``make ... TORCH_INDEX=URL`` (the README's way to torch's CPU wheel) installs torch from URL; without it,
    from pip's own indexes."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_INDEX", "MAKEFLAGS", "MFLAGS")}

    def torch_line(*args):  # the recipe line that installs torch, printed, not run (-n; -W: as if set-up were due)
        proc = subprocess.run(["make", "-n", "-W", "pyproject.toml", "setup", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return next(line for line in proc.stdout.splitlines() if "torch==2.13.0" in line).split()

    url = "https://download.pytorch.org/whl/cpu"
    assert torch_line()[-1] == "torch==2.13.0"
    assert torch_line(f"TORCH_INDEX={url}")[-3:] == ["torch==2.13.0", "--index-url", url]
    assert f"make test TORCH_INDEX={url}" in (ROOT / "README.md").read_text()
