"""numeric.jax.context_parallel_attention: one sequence sharded along T over 2 host devices equals one device.

In float64 the output and the gradients in query, key, value (and alpha per head, a differentiated argument) of
context-parallel attention over 2 devices equal numeric.jax.attention's on one device to 1e-12 relative to the
largest magnitude, for softmax, sparsemax, entmax15, entmax with alpha per head and a generated map with no
closed-form link (``p**2/2 + p*log(1 + p)``, Newton's), causal or not, in both layouts, with grouped heads
(K < N) and T / P = 6 query rows a device in blocks of 4 (the blocked loop with a padded last block) or one
block, and with the box (a bound per score, its query and key axes in the layout's order, with its gradient); the output is sharded along T; the backward pass keeps no array of the whole length T on a device (the
gathered keys and values are gathered again).  The number of host devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=2``) is read once, when JAX starts, so those checks run in a
subprocess, every case in one (tests/jax/_context_parallel_worker.py: JAX's start and the compilations
dominate; LLVM's optimizations are turned off there, ``--xla_backend_optimization_level=0``, which compiles 3
times faster and computes the same IEEE operations).  Layouts and argument errors run here, on one device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import numeric.jax as rj  # noqa: E402
from derive.testing import generated_map  # noqa: E402

from ._context_parallel_worker import AXIS, CASES, DEVICES, SHAPE  # noqa: E402

WORKER = Path(__file__).resolve().parent / "_context_parallel_worker.py"
TOLERANCE = 1e-12


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    """The worker's lines by case, run once over 2 host devices."""
    folder = tmp_path_factory.mktemp("cp_usermap")
    with generated_map("p**2/2 + p*log(1 + p)", "cp_gini_log1p", folder=str(folder)):
        pass  # (the module file stays in folder: the worker imports it from there)
    # (the run's XLA flags, the CI profile's among them, and 2 host devices; XLA without its LLVM optimisations)
    flags = os.environ.get("XLA_FLAGS", "")
    flags += "" if "--xla_backend_optimization_level" in flags else " --xla_backend_optimization_level=0"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={DEVICES}"}
    proc = subprocess.run([sys.executable, str(WORKER), str(folder)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    found = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {d["case"]: d for d in found}


@pytest.mark.parametrize("case", list(CASES))
def test_two_devices_equal_one_in_float64(lines, case):
    line = lines[case]
    B, T, N, K, H, Hv = SHAPE
    learned = CASES[case][0] == "entmax_alpha"
    box = CASES[case][4:] == (True,)
    assert line["finite"], line
    for name in ("out", "dq", "dk", "dv", *(("dalpha",) if learned else ()), *(("dupper",) if box else ())):
        assert line[name] <= TOLERANCE, (name, line)
    assert ("dalpha" in line) == learned, line
    assert ("dupper" in line) == box, line
    assert line["sharding"] == [None, AXIS], line  # NamedSharding(mesh, P(None, AXIS))
    assert line["shards"] == [[B, T // DEVICES, N, Hv]], line


def test_the_backward_pass_keeps_no_whole_sequence(lines):
    """The residuals are each device's shards of query, key, value (T / P rows) and alpha: not the gathered keys and
    values (T rows), with the query blocks' loop or one block."""
    B, T, N, K, H, Hv = SHAPE
    shapes = lines["residuals"]["shapes"]
    assert set(shapes) == {"4", "None"}
    for kept in shapes.values():
        assert sorted(kept) == sorted([[B, T // DEVICES, N, H], [B, T // DEVICES, K, H], [B, T // DEVICES, K, Hv],
                                       [1, N, 1, 1]]), kept
        assert not any(T in shape for shape in kept), kept


def test_lengths_the_layout_cannot_cut_over_two_devices(lines):
    messages = lines["errors"]["messages"]
    assert "T = 5 is not divisible by 2" in messages["contiguous"], messages
    assert "T = 6 is not divisible by 4" in messages["zigzag"], messages


# ---- one device, in this process


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()[:1]), ("seq",))


def test_zigzag_layout_and_its_inverse():
    x = jnp.arange(16).reshape(1, 16)
    laid = rj.shard_layout(x, 4, "zigzag")
    # 8 chunks of 2: device r holds chunks r and 7 - r
    assert laid[0].tolist() == [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9]
    assert rj.unshard_layout(laid, 4, "zigzag")[0].tolist() == list(range(16))
    assert rj.shard_layout(x, 4, "contiguous")[0].tolist() == list(range(16))
    y = jnp.arange(24.0).reshape(2, 3, 4)
    assert jnp.array_equal(rj.unshard_layout(rj.shard_layout(y, 1, "zigzag", axis=-1), 1, "zigzag", axis=-1), y)


def test_one_device_equals_attention(mesh):
    q, k, v = (jnp.asarray(np.random.default_rng(3).normal(size=(2, 6, n, 3))) for n in (2, 1, 1))
    f = jax.jit(lambda q, k, v: rj.context_parallel_attention(q, k, v, mesh=mesh, axis_name="seq", is_causal=True,
                                                              layout="zigzag", mapping="sparsemax", block_size=2))
    assert np.max(np.abs(f(q, k, v) - rj.attention(q, k, v, is_causal=True, mapping="sparsemax"))) <= 1e-14


@pytest.mark.parametrize(("change", "error", "words"), [  # (T, S: the lengths; the rest: the call's keywords)
    (dict(layout="striped"), ValueError, "layout must be one of 'contiguous', 'zigzag', got 'striped'"),
    (dict(axis_name="tokens"), ValueError, "axis_name 'tokens' is not an axis of the mesh, whose axes are ('seq',)"),
    (dict(T=5, layout="zigzag"), ValueError, "zigzag layout over 1 device cuts the sequence into 2 equal chunks: "
                                             "its length T = 5 is not divisible by 2"),
    (dict(S=4), ValueError, "the keys' and values' length S = 4 must equal the queries' T = 6"),
    (dict(mesh="seq"), TypeError, "mesh must be a jax.sharding.Mesh, got str"),
    (dict(is_causal=1), TypeError, "is_causal must be True or False, got 1"),
    (dict(block_size=0), ValueError, "block_size must be a positive integer, got 0"),
    (dict(mapping="entmax"), ValueError, "map 'entmax' needs a value for alpha"),
])
def test_errors_name_the_value(mesh, change, error, words):
    change = dict(change)
    T, S = change.pop("T", 6), change.pop("S", None)
    q = jnp.zeros((1, T, 2, 3))
    kv = jnp.zeros((1, S or T, 1, 3))
    kwargs = {"mesh": mesh, "axis_name": "seq", **change}
    with pytest.raises(error) as info:
        rj.context_parallel_attention(q, kv, kv, **kwargs)
    assert words in str(info.value)


@pytest.mark.parametrize(("args", "words"), [
    ((3, "zigzag"), "zigzag layout over 3 devices cuts axis 1 into 6 equal chunks: its length T = 8 is not divisible by 6"),
    ((0, "contiguous"), "parts must be a positive integer (the number of devices), got 0"),
    ((2, "zig"), "layout must be one of 'contiguous', 'zigzag', got 'zig'"),
    ((2, "zigzag", 2), "axis must be an integer in [-2, 2) for an array of shape (1, 8), got 2"),
])
def test_layout_errors(args, words):
    with pytest.raises(ValueError) as info:
        rj.shard_layout(jnp.zeros((1, 8)), *args)
    assert words in str(info.value)
    with pytest.raises(ValueError):
        rj.unshard_layout(jnp.zeros((1, 8)), *args)
