"""Context-parallel attention on CPU: one sequence over 2 gloo processes against one process, per-rank time and memory.

Run: python benchmarks/bench_context_parallel.py [--length 16384] [--heads 2] [--dim 64] [--mapping entmax15]
                                                 [--world 2] [--reps 2] [--layers 4]

``--layers`` causal attention calls in a row, as the attention layers of a model
with residual connections (each layer's queries, keys and values are the
previous layer's plus its output), forward and backward (float32, batch 1),
timed as the smallest of ``--reps`` runs after a small warm-up:

* one process with ``--world`` threads: :func:`numeric.torch.attention` on the
  whole sequence;
* ``--world`` gloo processes with one thread each:
  :func:`numeric.torch.distributed.context_parallel_attention`, contiguous and
  zigzag layouts (the time is the slowest rank's; the ranks wait for each other
  at every collective, so the contiguous layout's imbalance of causal work
  shows as the difference to the zigzag layout).

Memory per rank: the peak resident memory above what the process held before
the layers ran (Linux's VmHWM, reset through /proc/self/clear_refs), and the
bytes the layers keep for the backward pass (counted with
``torch.autograd.graph.saved_tensors_hooks``; each layer keeps its own, while
the gathered keys and values and the blocks' scores live during one layer's
call only).  Each configuration runs in
a fresh process.  Writes benchmarks/results/context_parallel.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _status(field: str) -> int:
    """A memory field of /proc/self/status in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _layers(call, layers: int):
    """``call`` applied ``layers`` times, as attention layers of a model with residual connections: each layer's
    queries, keys and values are the previous layer's plus its output (new tensors, each layer's own to keep)."""
    def stacked(q, k, v):
        for _ in range(layers):
            out = call(q, k, v)
            q, k, v = q + out, k + out, v + out
        return out
    return stacked


def _measure(call, inputs, reps: int) -> dict:
    """Time of forward + backward (smallest of ``reps``), the peak memory above the start, the bytes saved."""
    import torch

    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    times, peak = [], 0
    for rep in range(reps):
        xs = [x.detach().requires_grad_() for x in inputs]
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak resident size starts again from the current one
        base = _status("VmRSS")
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = call(*xs)
        out.backward(torch.ones_like(out))
        times.append(time.perf_counter() - start)
        peak = max(peak, _status("VmHWM") - base)
        if rep == 0:
            kept = sum(saved)
        del out, xs
    return {"seconds": min(times), "peak_mib": peak / 2**20, "saved_mib": kept / 2**20}


def _inputs(args, torch):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, args.heads, args.length, args.dim, generator=g) for _ in range(3)]


def _one(args) -> dict:
    import torch

    from numeric.torch import attention

    torch.set_num_threads(args.world)
    q, k, v = _inputs(args, torch)
    small = [x[..., :256, :] for x in (q, k, v)]
    _measure(lambda *x: attention(*x, is_causal=True, mapping=args.mapping), small, 1)  # warm-up
    return _measure(_layers(lambda *x: attention(*x, is_causal=True, mapping=args.mapping), args.layers), [q, k, v],
                    args.reps)


def _rank(rank, args, layout, init, out):
    import torch
    import torch.distributed as dist

    from numeric.torch.distributed import context_parallel_attention, shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=args.world)
    q, k, v = (shard(x, rank, args.world, layout) for x in _inputs(args, torch))
    q, k, v = q.clone(), k.clone(), v.clone()

    def call(*x):
        return context_parallel_attention(*x, is_causal=True, mapping=args.mapping, layout=layout)

    _measure(call, [x[..., :128, :] for x in (q, k, v)], 1)  # warm-up
    result = _measure(_layers(call, args.layers), [q, k, v], args.reps)
    every = [None] * args.world
    dist.all_gather_object(every, result)
    if rank == 0:
        Path(out).write_text(json.dumps(every))
    dist.destroy_process_group()


def _parallel(args, layout) -> list:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        mp.spawn(_rank, args=(args, layout, os.path.join(tmp, "init"), out), nprocs=args.world)
        return json.loads(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--mapping", default="entmax15")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--child", choices=("one", "contiguous", "zigzag"))
    args = parser.parse_args()
    if args.child:
        result = _one(args) if args.child == "one" else _parallel(args, args.child)
        print(json.dumps(result))
        return
    rows = {}
    for config in ("one", "contiguous", "zigzag"):  # each in a fresh process: its own peak memory
        proc = subprocess.run([sys.executable, __file__, "--child", config] + sys.argv[1:], capture_output=True,
                              text=True, check=True)
        rows[config] = json.loads(proc.stdout.strip().splitlines()[-1])
    one = rows["one"]
    print(f"{args.layers} layers of causal {args.mapping} attention, L = {args.length}, {args.heads} heads of {args.dim}, "
          f"float32, forward + backward; one process with {args.world} threads vs {args.world} gloo processes with one thread each")
    print(f"{'':28s} {'seconds':>8s} {'x one':>6s} {'peak MiB':>9s} {'x one':>6s} {'kept MiB':>9s} {'x one':>6s}")
    print(f"{'one process':28s} {one['seconds']:8.2f} {1:6.2f} {one['peak_mib']:9.1f} {1:6.2f} {one['saved_mib']:9.1f} "
          f"{1:6.2f}")
    for layout in ("contiguous", "zigzag"):
        ranks = rows[layout]
        slow = max(r["seconds"] for r in ranks)
        peak = max(r["peak_mib"] for r in ranks)
        kept = max(r["saved_mib"] for r in ranks)
        print(f"{layout + ' (slowest rank)':28s} {slow:8.2f} {slow / one['seconds']:6.2f} {peak:9.1f} "
              f"{peak / one['peak_mib']:6.2f} {kept:9.1f} {kept / one['saved_mib']:6.2f}")
    out_dir = Path(__file__).resolve().parent / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "context_parallel.json").write_text(json.dumps({"args": vars(args), **rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
