"""The PyTorch distributed example: DistributedDataParallel over 2 gloo processes.

One step's gradients under DDP (each process takes half the batch, DDP averages)
equal one process's gradients on the whole batch, in float64; the loss of the run
the docs show falls.  Both run the example script itself in a subprocess.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "distributed_torch.py"
pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _run(tmp_path, *args):
    """The example's output, run with ``args``; with none it runs as the docs show it (150 steps over 2 processes),
    and its output is kept for the docs build (tests/examples/test_examples.py ``run_example``)."""
    from tests.examples.test_examples import run_example

    proc = run_example(SCRIPT, tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_one_ddp_step_has_the_single_process_gradients(tmp_path):
    out = _run(tmp_path, "--check-gradients")
    line = next(ln for ln in out.splitlines() if "largest relative difference" in ln)
    assert float(line.split()[-1]) <= 1e-12, line


def test_the_loss_falls_under_ddp(tmp_path):
    out = _run(tmp_path)
    line = next(ln for ln in out.splitlines() if ln.startswith("loss fell from"))
    first, last = float(line.split()[3]), float(line.split()[5])
    assert last < 0.8 * first, line  # chance is log(16) = 2.77
    alphas = [float(a) for a in next(ln for ln in out.splitlines() if ln.startswith("alpha per head")).split(":")[1].split()]
    assert len(alphas) == 4 and all(1 < a < 2 for a in alphas)
