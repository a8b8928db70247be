"""The JAX distributed example: the batch sharded over 2 host devices with jax.sharding and jit.

One step's gradients with the batch sharded over 2 devices (XLA's partitioner
splits the forward and backward passes and all-reduces the gradients) equal one
device's gradients on the whole batch, in float64; the loss of the run the docs show falls.
Both run the example script itself in a subprocess: the number of host devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=2``) is read once, when JAX
starts, so it cannot be set inside this test process (where JAX is running already).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("jax")

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "distributed_jax.py"


def _run(tmp_path, *args):
    """The example's output, run with ``args``; with none it runs as the docs show it (150 steps over 2 devices),
    and its output is kept for the docs build (tests/examples/test_examples.py ``run_example``)."""
    from tests.examples.test_examples import run_example

    proc = run_example(SCRIPT, tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_one_sharded_step_has_the_single_device_gradients(tmp_path):
    out = _run(tmp_path, "--check-gradients")
    line = next(ln for ln in out.splitlines() if "largest relative difference" in ln)
    assert "2 devices vs one: 17 parameters" in line, line
    assert float(line.split()[-1]) <= 1e-12, line


def test_the_loss_falls_with_the_batch_sharded(tmp_path):
    out = _run(tmp_path)
    line = next(ln for ln in out.splitlines() if ln.startswith("loss fell from"))
    first, last = float(line.split()[3]), float(line.split()[5])
    assert "over 2 devices" in line, line
    assert last < 0.8 * first, line  # chance is log(16) = 2.77
    alphas = [float(a) for a in next(ln for ln in out.splitlines() if ln.startswith("alpha per head")).split(":")[1].split()]
    assert len(alphas) == 4 and all(1 < a < 2 for a in alphas)
