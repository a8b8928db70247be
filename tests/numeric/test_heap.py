"""numeric.heap: NumPy's temporaries served from memory the process already has (glibc's malloc parameters)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import numeric as nm
from numeric import heap

glibc = pytest.mark.skipif(heap._mallopt() is None, reason="malloc is not glibc's")


_FAULTS = """
import resource

import numpy as np

import numeric as nm


def faults_per_round(size, rounds=20):
    # minor page faults per round of three temporaries of size bytes, one made from the other
    a = np.ones(size // 4, np.float32)

    def once():
        b = a * 2
        c = b + 1
        return float((c * b)[0])

    once()
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        once()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / rounds


assert nm.set_heap_reserve(0) and nm.get_heap_reserve() == 0
fresh = faults_per_round(1 << 20)
assert nm.set_heap_reserve(32 << 20) and nm.get_heap_reserve() == 32 << 20
kept = faults_per_round(1 << 20)
print(fresh, kept)
"""


@glibc
def test_reserve_keeps_temporaries_in_mapped_memory():
    # 1 MiB temporaries: 256 pages each, which glibc maps afresh every time with an mmap threshold of 128 KiB.  In a
    # fresh interpreter: where earlier frees left free chunks of 1 MiB in the heap's bins, malloc serves the
    # temporaries from them whatever the threshold (a test worker's heap depends on the tests it ran before)
    env = {k: v for k, v in os.environ.items() if k != heap.ENV}
    run = subprocess.run([sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True, check=True)
    fresh, kept = map(float, run.stdout.split())
    assert fresh >= 256  # at least one of the three temporaries new memory each round
    assert kept <= fresh / 20


_SPY = """
import ctypes
looked_up = []
class Spy(ctypes.CDLL):
    def __getattr__(self, name):
        looked_up.append(name)
        return super().__getattr__(name)
ctypes.CDLL = Spy
import numeric as nm
import numeric.torch
print("mallopt" in looked_up, nm.get_heap_reserve())
"""


@glibc
def test_import_leaves_malloc_as_it_is():
    # (in a child whose ctypes records the C functions looked up: this process's reserve is the tests' to change)
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k != heap.ENV}
    run = subprocess.run([sys.executable, "-c", _SPY], env=env, capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["False", "None"]
    run = subprocess.run([sys.executable, "-c", _SPY], env=dict(env, **{heap.ENV: "1048576"}), capture_output=True,
                         text=True, check=True)
    assert run.stdout.split() == ["True", "1048576"]


@pytest.mark.parametrize("value", [-1, (32 << 20) + 1, 1.5, True, "1024"])
def test_reserve_out_of_range_is_an_error(value):
    with pytest.raises(ValueError, match="heap reserve"):
        nm.set_heap_reserve(value)


def _reserve_in_child(env_value: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **{heap.ENV: env_value})
    return subprocess.run([sys.executable, "-W", "always", "-c", "import numeric as nm; print(nm.get_heap_reserve())"],
                          env=env, capture_output=True, text=True, check=True)


@glibc
@pytest.mark.parametrize(("env_value", "reserve"), [("0", "None"), ("1048576", "1048576"), ("", "None"), ("33554432", str(heap.DEFAULT_RESERVE))])
def test_environment_sets_the_reserve(env_value, reserve):
    assert _reserve_in_child(env_value).stdout.strip() == reserve


@pytest.mark.parametrize("env_value", ["a lot", "-5", str(1 << 40)])
def test_a_bad_environment_value_warns_and_leaves_malloc(env_value):
    run = _reserve_in_child(env_value)
    assert run.stdout.strip() == "None"
    assert "REGATTN_HEAP_RESERVE" in run.stderr and "malloc is left as it is" in run.stderr
