"""The cost of the agreement check of context-parallel attention: one all-gather of a small descriptor per call.

Run: python benchmarks/bench_context_parallel_check.py [--world 2] [--reps 200]

On ``--world`` gloo processes (one thread each, CPU), each rank times:

* the check alone (``numeric.torch.distributed._agree``: the descriptor built, all-gathered and compared);
* whole calls of :func:`numeric.torch.distributed.context_parallel_attention`, forward only (no gradients), at
  a small and a moderate size, with the check and with it replaced by nothing (the difference is its cost).

Times are medians over ``--reps`` calls, in microseconds, the slowest rank's.  Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: (name, local length, heads, head dim): a call whose time the check's would be most of, and a moderate one
SIZES = [("local 64, 2 heads, E 32", 64, 2, 32), ("local 1024, 4 heads, E 64", 1024, 4, 64)]


def _median_us(fn, reps: int) -> float:
    import torch.distributed as dist

    times = []
    for _ in range(reps):
        dist.barrier()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def _run(rank, init, world, reps, out):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    from numeric.torch import distributed as cp

    results = {}
    q = torch.randn(1, 2, 64, 32)
    fn = cp.resolve_mapping("entmax15")[0]
    results["check alone"] = _median_us(lambda: cp._agree(None, q, q, q, True, "zigzag", None, fn, None), reps)
    agree = cp._agree
    for name, n, h, e in SIZES:
        x = torch.randn(1, h, n, e)

        def call():
            with torch.no_grad():
                cp.context_parallel_attention(x, x, x, is_causal=True, mapping="entmax15", layout="zigzag")

        call()
        with_check = _median_us(call, reps if n <= 64 else max(5, reps // 20))
        cp._agree = lambda *a: None
        try:
            without = _median_us(call, reps if n <= 64 else max(5, reps // 20))
        finally:
            cp._agree = agree
        results[name] = {"with the check": with_check, "without": without}
    both = [None] * world
    dist.all_gather_object(both, results)
    if rank == 0:
        slowest = {}
        for k, v in both[0].items():
            slowest[k] = max(r[k] for r in both) if not isinstance(v, dict) else \
                {kk: max(r[k][kk] for r in both) for kk in v}
        Path(out).write_text(json.dumps(slowest, indent=1))
    dist.destroy_process_group()


def main():
    import torch.multiprocessing as mp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        mp.spawn(_run, args=(os.path.join(tmp, "init"), args.world, args.reps, out), nprocs=args.world)
        print(Path(out).read_text())


if __name__ == "__main__":
    main()
