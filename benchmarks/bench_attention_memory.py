"""Peak extra memory of causal attention at long length (target: well under the 1 GiB of a dense score matrix).

Run: python benchmarks/bench_attention_memory.py [--length 16384] [--dim 64] [--mapping softmax]
Float32, one head; tracemalloc follows NumPy's allocations, so the peak is
what attention allocates above its inputs.  Writes benchmarks/results/attention_memory.json.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from pathlib import Path

import numpy as np

import numeric as nm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--mapping", default="softmax")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((args.length, args.dim)).astype(np.float32) for _ in range(3))
    dense_bytes = args.length * args.length * 4
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    start = time.perf_counter()
    out = nm.attention(q, k, v, mapping=args.mapping, causal=True)
    took = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    out_bytes = out.nbytes
    result = dict(length=args.length, dim=args.dim, mapping=args.mapping, seconds=round(took, 2),
                  peak_extra_mib=round(peak / 2**20, 1), output_mib=round(out_bytes / 2**20, 1),
                  dense_scores_mib=round(dense_bytes / 2**20, 1), target_mib=256, met=peak / 2**20 <= 256)
    out_dir = Path(__file__).resolve().parent / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / f"attention_memory_{args.mapping}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"causal {args.mapping} attention, L = {args.length}, d = {args.dim}, float32: {took:.1f} s, peak extra memory "
          f"{peak / 2**20:.1f} MiB (output {out_bytes / 2**20:.1f} MiB; a dense score matrix alone is {dense_bytes / 2**20:.0f} MiB; "
          f"target <= 256 MiB: {'met' if result['met'] else 'MISSED'})")


if __name__ == "__main__":
    main()
