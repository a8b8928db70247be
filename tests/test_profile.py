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


@pytest.mark.parametrize(("rows", "columns", "per"), [(8, 2, 1), (6, 5, 2), (5, 3, 1), (8, 12, 3), (3, 7, 2)])
def test_crossed_takes_every_row_and_column_or_every_pair(rows, columns, per, monkeypatch):
    """The CI profile's pairs: each row ``per`` times with distinct columns, every column once before any twice
    (so every column where there are enough rows); the thorough profile's: every pair."""
    import tests.profile as profile

    monkeypatch.setattr(profile, "THOROUGH", False)
    pairs = profile.crossed(range(rows), range(columns), per=per)
    assert [r for r, _ in pairs] == [r for r in range(rows) for _ in range(per)]
    assert all(len({c for r, c in pairs if r == row}) == per for row in range(rows))
    counts = [sum(c == column for _, c in pairs) for column in range(columns)]
    assert max(counts) - min(counts) <= 1 and (min(counts) >= 1 or rows * per < columns)
    shifted = profile.crossed(range(rows), range(columns), per=per, start=1)
    assert shifted == [(r, (c + 1) % columns) for r, c in pairs]
    monkeypatch.setattr(profile, "THOROUGH", True)
    assert profile.crossed(range(rows), range(columns), per=per) == [(r, c) for r in range(rows) for c in range(columns)]
