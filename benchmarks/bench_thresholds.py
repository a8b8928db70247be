"""Sort-based threshold: full sort against partial selection (numpy.partition), the sort-free fixed point
(links of degree 1: sparsemax), and the root solver.

Run: python benchmarks/bench_thresholds.py
Float32 rows, about 2**20 scores per case, median of 5 runs; two score
scales: N(0, 1) (small supports) and N(0, 0.01) (supports of most of the row).
The figures decide numeric.threshold.PARTIAL_FROM and FIXED_POINT_BELOW; results go to
benchmarks/results/thresholds.json.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np

from numeric.root import root_threshold
from numeric.threshold import sort_threshold
from _timing import median_seconds


def main() -> None:
    rows = []
    for name in ("sparsemax", "entmax15"):
        mod = importlib.import_module(f"numeric._generated.{name}")
        for scale in (1.0, 0.01):
            for n in (64, 128, 256, 1024, 4096, 16384):
                x = (np.random.default_rng(n).standard_normal((max(1, 2**20 // n), n)) * scale).astype(np.float32)
                full = median_seconds(lambda: sort_threshold(mod, x, (), method="full"))
                partial = median_seconds(lambda: sort_threshold(mod, x, (), method="partial"))
                root = median_seconds(lambda: root_threshold(mod, x, ()), repeat=3)
                same = float(np.abs(sort_threshold(mod, x, (), method="full") - sort_threshold(mod, x, (), method="partial")).max())
                row = dict(map=name, scale=scale, n=n, full_ms=full * 1e3, partial_ms=partial * 1e3, root_ms=root * 1e3, max_diff=same)
                fixed = ""
                if mod.THRESHOLD_DEGREE == 1:
                    row["fixed_ms"] = median_seconds(lambda: sort_threshold(mod, x, (), method="fixed")) * 1e3
                    fixed = f"  fixed point {row['fixed_ms']:7.2f} ms"
                rows.append(row)
                print(f"{name:9s} scale {scale:<5} n {n:6d}: full {full*1e3:7.2f} ms  partial {partial*1e3:7.2f} ms "
                      f"({full/partial:5.1f}x)  root {root*1e3:7.2f} ms{fixed}  |full - partial| = {same:.1e}")
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "thresholds.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
