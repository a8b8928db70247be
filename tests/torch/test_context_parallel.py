"""numeric.torch.distributed.context_parallel_attention on 2 gloo processes against one process, in float64.

The cases run once, in one subprocess (tests/torch/_context_parallel_worker.py spawns the 2 ranks); each test
reads its case's largest relative errors: the output shard, and the gradients of the local queries, keys and
values (each key's gradient reduce-scattered to its owner) and of an alpha per head (summed over the ranks) all
equal one process's :func:`numeric.torch.attention` on the whole sequence to 1e-12.  Maps: the built-ins, alpha
per head, a typed map with no closed-form link, a plain callable; causal or not; both layouts; grouped keys; the
box (``upper=`` per score, this rank's rows against every key in position order, and ``total=``), with the bounds'
gradient.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from tests.torch._context_parallel_worker import CASES  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TYPED = ("p**2/2 + p*log(1 + p)", "cp_gini_log1p")  # no closed-form link: Newton's method on the link


@pytest.fixture(scope="module")
def errors(tmp_path_factory):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from derive.testing import generated_map

    folder = tmp_path_factory.mktemp("cp_typed")
    out = folder / "errors.json"
    with generated_map(TYPED[0], TYPED[1], str(folder)):
        proc = subprocess.run([sys.executable, "-m", "tests.torch._context_parallel_worker", str(out), str(folder),
                               TYPED[1]], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_shards_equal_one_process(errors, case):
    e = errors[case]
    grads = {k: v for k, v in e.items() if k.startswith("d")}
    assert {"dq", "dk", "dv"} <= set(grads)
    if case.startswith("entmax_alpha_per_head"):
        assert "dalpha" in grads
    if case.endswith("-box"):  # the box: a bound per score, this rank's rows against every key, with its gradient
        assert "dupper" in grads
    assert e["output"] <= 1e-12, e
    assert e["output_no_grad"] <= 1e-12, e
    assert max(grads.values()) <= 1e-12, e
    # what the backward pass keeps is local: no tensor larger than this rank's inputs (the gathered ones are not kept)
    assert e["saved_over_local"] <= 1.0, e


def test_ranks_that_disagree_raise_the_same_error_on_every_rank(tmp_path):
    """Calls whose shapes, dtypes, causality, layout, map or gradients differ between the 2 ranks: each rank raises
    the same ValueError naming what differs and each rank's value (no process aborts in the collectives, none
    hangs); a call invalid on one rank only raises on both; afterwards an agreeing call runs."""
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from tests.torch._context_parallel_worker import DISAGREE

    out = tmp_path / "disagree.json"
    proc = subprocess.run([sys.executable, "-m", "tests.torch._context_parallel_worker", "--disagree", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(out.read_text())
    expect = {"lengths": ["the local shape of query: (2, 3, 4, 4) on rank 0, (2, 3, 6, 4) on rank 1",
                          "the local shape of key: (2, 3, 4, 4) on rank 0, (2, 3, 6, 4) on rank 1"],
              "dtypes": ["the dtype of query: torch.float64 on rank 0, torch.float32 on rank 1"],
              "causality": ["is_causal: False on rank 0, True on rank 1"],
              "layouts": ["layout: 'contiguous' on rank 0, 'zigzag' on rank 1"],
              "maps": ["mapping: entmax15 on rank 0, sparsemax on rank 1"],
              "map-parameters": ["mapping: entmax(alpha=1.5) on rank 0, entmax(alpha=1.25) on rank 1"],
              "gradients": ["which of query, key, value need gradients: (True, True, True) on rank 0, "
                            "(True, False, True) on rank 1"],
              "zigzag-odd-on-one-rank": ["the local shape of query: (2, 3, 5, 4) on rank 0, (2, 3, 6, 4) on rank 1"],
              "invalid-on-one-rank": ["valid arguments: yes on rank 0, no on rank 1"],
              "constraint-keywords": ["the constraint keywords: none on rank 0, upper=0.9 on rank 1"]}
    for name, *_ in DISAGREE:
        ranks = got[name]
        assert ranks[0] == ranks[1], (name, ranks)  # the same exception, the same message
        if name == "zigzag-odd-on-both":  # the same invalid arguments everywhere: the local error on every rank
            assert ranks[0]["type"] == "ValueError" and "local length must be even, got 5" in ranks[0]["message"]
            continue
        assert ranks[0]["type"] == "ValueError", (name, ranks)
        assert "every rank of the group must call" in ranks[0]["message"], (name, ranks)
        for part in expect[name]:
            assert part in ranks[0]["message"], (name, part, ranks[0]["message"])
    assert got["agreeing-call-after"] == 4
    assert got["agreeing-callable-object"] == 4


def test_errors_name_what_is_wrong():
    from numeric.torch.distributed import context_parallel_attention, shard

    q = torch.zeros(1, 6, 4)
    with pytest.raises(ValueError, match="layout must be one of"):
        context_parallel_attention(q, q, q, layout="ring")
    with pytest.raises(ValueError, match="local length must be even, got 5"):
        context_parallel_attention(q[:, :5], q[:, :5], q[:, :5], layout="zigzag")
    with pytest.raises(ValueError, match="same positions"):
        context_parallel_attention(q, q[:, :4], q[:, :4], is_causal=True)
    if not torch.distributed.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            context_parallel_attention(q, q, q)
    with pytest.raises(ValueError, match="does not split into 4 equal chunks"):
        shard(torch.zeros(6), 0, 2, "zigzag", dim=0)


def test_shard_and_unshard_are_inverse():
    from numeric.torch.distributed import positions, shard, unshard

    x = torch.arange(24).reshape(2, 12)
    for layout in ("contiguous", "zigzag"):
        shards = [shard(x, r, 3, layout, dim=-1) for r in range(3)]
        assert torch.equal(unshard(shards, layout, dim=-1), x)
        for r in range(3):
            assert torch.equal(x[0, positions(4, r, 3, layout)], shards[r][0])
    # zigzag: every rank the same causal work (sum over its positions of the keys each sees)
    work = [int((positions(4, r, 3, "zigzag") + 1).sum()) for r in range(3)]
    assert len(set(work)) == 1, work


EXAMPLE = ROOT / "examples" / "context_parallel_torch.py"


def _example(tmp_path, *args):
    from tests.examples.test_examples import run_example

    proc = run_example(EXAMPLE, tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_example_one_step_has_the_single_process_gradients(tmp_path):
    out = _example(tmp_path, "--check-gradients", "--layout", "contiguous")
    line = next(ln for ln in out.splitlines() if "largest relative difference" in ln)
    assert "2 processes (contiguous) vs one: 17 parameters" in line, line
    assert float(line.split()[-1]) <= 1e-12, line


def test_example_loss_falls_with_sequences_sharded(tmp_path):
    out = _example(tmp_path)
    line = next(ln for ln in out.splitlines() if ln.startswith("loss fell from"))
    first, last = float(line.split()[3]), float(line.split()[5])
    assert last < 0.7 * first, line  # chance is log(16) = 2.77
    alphas = [float(a) for a in next(ln for ln in out.splitlines() if ln.startswith("alpha per head")).split(":")[1].split()]
    assert len(alphas) == 4 and all(1 < a < 2 for a in alphas)
