"""Fused Triton attention on a CUDA device against SDPA and entmax-package attention (issue 15's GPU goals).

Run (on a machine with a CUDA device, torch with CUDA, triton, entmax):

    python benchmarks/bench_gpu_attention.py [--lengths 1024 4096 16384 32768] [--quick] [--out benchmarks/results]

For each length L (= S), batch N = 2 with H = 8 heads of E = 64, float16 and
bfloat16 inputs (float32 accumulation), causal and not, forward and
forward+backward, side by side in one process:

* regattn's fused kernels (``numeric.torch.attention(..., backend="triton")``)
  with softmax against ``scaled_dot_product_attention`` (FlashAttention);
* with entmax15 and alpha-entmax (alpha = 1.5, per head) against
  SDPA-shaped attention from ``entmax.entmax15`` / ``entmax.entmax_bisect``
  on the dense weights (skipped where those weights do not fit);
* entmax15 against softmax SDPA (the goal: within 1.5x of its time at L = 4k), and
  the sparse case: scores scaled so that more than 80% of the key blocks hold no
  weight, at L = 32k (the goal: faster than softmax SDPA).

Reported: milliseconds (CUDA events, median), TFLOP/s (4 N H L S E for the
forward, 2.5x that for forward+backward, halved when causal), the fraction of the
device's dense float16 peak (``--peak-tflops``, default from the device name:
A100 312, H100 SXM 989, H200 989), peak memory (``torch.cuda.max_memory_allocated``
above the inputs), and the fraction of key blocks the fused forward skipped.
Writes ``gpu_attention.json`` and ``gpu_attention.md`` to ``--out``.  Without a CUDA
device it says so and measures nothing; ``--cpu-smoke`` runs the same script on CPU
tensors through Triton's interpreter at L = 32, float16, causal (wall-clock times, no
memory figures: a check of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

PEAKS = {"A100": 312.0, "H100": 989.0, "H200": 989.0, "L40S": 362.0, "RTX 4090": 165.0}


def _peak(torch, given):
    if given:
        return given
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAKS.items() if k in name), None)


def _time_ms(torch, fn, repeat, cuda=True):
    fn()
    if not cuda:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def _flops(N, H, L, E, causal, backward):
    f = 4 * N * H * L * L * E
    f = f / 2 if causal else f
    return f * 3.5 if backward else f


def _run(torch, fn, q, k, v, dout, backward, repeat):
    leaves = [t.detach().requires_grad_(backward) for t in (q, k, v)]

    def step():
        out = fn(*leaves)
        if backward:
            out.backward(dout)

    if not q.is_cuda:
        return _time_ms(torch, step, repeat, cuda=False), None
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ms = _time_ms(torch, step, repeat)
    return ms, (torch.cuda.max_memory_allocated() - base) / 2**20


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--cpu-smoke", action="store_true", help="run the script on CPU tensors in Triton's interpreter")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # (before Triton is imported)
        args.lengths, args.quick = [32], True
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("no CUDA device: nothing measured (see docs/benchmarks.md for the expected figures)")
        return 0
    device = "cpu" if args.cpu_smoke else "cuda"
    import torch.nn.functional as F

    from numeric.torch import attention, get_map

    try:
        import entmax
    except ImportError:
        entmax = None
    repeat = 1 if args.cpu_smoke else 3 if args.quick else 10
    peak = None if args.cpu_smoke else _peak(torch, args.peak_tflops)
    N, H, E = 2, 8, 64
    rows = []
    alpha = torch.full((H, 1, 1), 1.5, device=device)
    for L in args.lengths:
        g = torch.Generator(device=device).manual_seed(L)
        for dtype in (torch.float16,) if args.cpu_smoke else (torch.float16, torch.bfloat16):
            q, k, v, dout = (torch.randn(N, H, L, E, device=device, dtype=dtype, generator=g) for _ in range(4))
            memory = 2**40 if args.cpu_smoke else torch.cuda.get_device_properties(0).total_memory
            dense_fits = N * H * L * L * 4 * 3 < memory // 2
            cases = {
                "softmax": (lambda q, k, v, c: attention(q, k, v, is_causal=c, backend="triton"),
                            "SDPA", lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c)),
                "entmax15": (lambda q, k, v, c: attention(q, k, v, is_causal=c, mapping="entmax15", backend="triton"),
                             "SDPA softmax", lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c)),
                "entmax15 dense": (lambda q, k, v, c: attention(q, k, v, is_causal=c, mapping="entmax15",
                                                                backend="triton"),
                                   "entmax.entmax15 (dense)", entmax and dense_fits and _dense(torch, entmax.entmax15)),
                "entmax 1.5": (lambda q, k, v, c: attention(q, k, v, is_causal=c, backend="triton",
                                                            mapping=get_map("entmax", alpha=alpha)),
                               "entmax.entmax_bisect (dense)",
                               entmax and dense_fits and _dense(torch, lambda s, dim: entmax.entmax_bisect(s, 1.5, dim))),
            }
            for causal in (True,) if args.cpu_smoke else (False, True):
                for what, (ours, peer_name, peer) in cases.items():
                    if not peer:
                        continue
                    for backward in (False, True):
                        ms, mem = _run(torch, lambda q, k, v: ours(q, k, v, causal), q, k, v, dout, backward, repeat)
                        pms, pmem = _run(torch, lambda q, k, v: peer(q, k, v, causal), q, k, v, dout, backward, repeat)
                        tflops = _flops(N, H, L, E, causal, backward) / (ms * 1e-3) / 1e12
                        rows.append(dict(what=what, L=L, dtype=str(dtype).split(".")[-1], causal=causal,
                                         mode="fwd+bwd" if backward else "fwd", ms=ms, peer=peer_name, peer_ms=pms,
                                         ratio=pms / ms, tflops=tflops, of_peak=tflops / peak if peak else None,
                                         mib=mem, peer_mib=pmem))
    # the sparse case: peaked scores, most key blocks without weight (goal: faster than softmax SDPA at 32k)
    L = max(args.lengths)
    g = torch.Generator(device=device).manual_seed(1)
    q, k, v, dout = (torch.randn(N, H, L, E, device=device, dtype=torch.float16, generator=g) for _ in range(4))
    q = q * 4
    out = attention(q, k, v, mapping="entmax15", backend="triton")
    sparse_ms, _ = _run(torch, lambda q, k, v: attention(q, k, v, mapping="entmax15", backend="triton"), q, k, v, dout,
                        False, repeat)
    sdpa_ms, _ = _run(torch, lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v, dout, False, repeat)
    del out
    rows.append(dict(what="entmax15 sparse (q x 4)", L=L, dtype="float16", causal=False, mode="fwd", ms=sparse_ms,
                     peer="SDPA softmax", peer_ms=sdpa_ms, ratio=sdpa_ms / sparse_ms, tflops=None, of_peak=None,
                     mib=None, peer_mib=None))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = dict(device="cpu (Triton's interpreter: a smoke run, not a measurement)" if args.cpu_smoke
                else torch.cuda.get_device_name(), peak_tflops=peak, torch=torch.__version__)
    (args.out / "gpu_attention.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=2) + "\n")
    lines = [f"{meta['device']}, peak {peak} TFLOP/s (float16 dense)", "",
             "| what | L | dtype | causal | mode | ms | peer | peer ms | speed-up | TFLOP/s | of peak | MiB | peer MiB |",
             "|---|---:|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        fmt = (lambda x, f: "-" if x is None else format(x, f))
        lines.append(f"| {r['what']} | {r['L']} | {r['dtype']} | {r['causal']} | {r['mode']} | {r['ms']:.2f} | "
                     f"{r['peer']} | {r['peer_ms']:.2f} | {r['ratio']:.2f}x | {fmt(r['tflops'], '.1f')} | "
                     f"{fmt(r['of_peak'], '.0%')} | {fmt(r['mib'], '.0f')} | {fmt(r['peer_mib'], '.0f')} |")
    text = "\n".join(lines) + "\n"
    (args.out / "gpu_attention.md").write_text(text)
    print(text)
    return 0


def _dense(torch, fn):
    """SDPA-shaped attention through the dense weights of a peer map ``fn(scores, dim)``."""

    def run(q, k, v, causal):
        s = torch.matmul(q, k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
        if causal:
            L, S = s.shape[-2:]
            s = s.masked_fill(torch.ones(L, S, dtype=torch.bool, device=s.device).triu(1), -math.inf)
        return torch.matmul(fn(s, dim=-1).to(v.dtype), v)

    return run


if __name__ == "__main__":
    sys.exit(main())
