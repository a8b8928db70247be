"""The hypothesis profile named on the command line sizes the parametrisations (tests/profile.THOROUGH) however
pytest is pointed at the tests: a folder's conftest that reads the flag is imported before hypothesis's plugin
loads the profile, so the root conftest loads it first (and hands it to xdist's workers)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.profile import THOROUGH

ROOT = Path(__file__).resolve().parents[1]


def _collected(profile: str, *extra: str) -> int:
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--co", "-p", "no:cacheprovider",
                          f"--hypothesis-profile={profile}", "tests/triton/test_fused_attention.py", *extra],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    found = re.search(r"(\d+) tests? collected", out.stdout)
    assert found, out.stdout + out.stderr
    return int(found.group(1))


@pytest.mark.parametrize("workers", [(), ("-n", "2")] if THOROUGH else [()], ids=["one process", "xdist"][:2 if THOROUGH else 1])
def test_a_folder_run_takes_the_thorough_profile(workers):
    # tests/triton/conftest.py reads the flag when it is imported, as the first conftest of that folder
    pytest.importorskip("triton")
    assert _collected("thorough", *workers) > _collected("ci", *workers)
