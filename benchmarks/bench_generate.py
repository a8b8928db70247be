"""How long `regattn generate` takes for all built-ins (target: at most 10 s on the 2-core machine).

Run: python benchmarks/bench_generate.py [--repeat N]
Each repeat runs the command in a fresh process (SymPy's caches start cold),
writing into a temporary folder; prints the median and writes
benchmarks/results/generate.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 10.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    times = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "derive.cli", "generate", "--out", tmp], check=True, capture_output=True)
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    result = {
        "benchmark": "regattn generate (all built-ins, cold process)",
        "repeats": args.repeat,
        "median_s": round(median, 3),
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
        "target_s": TARGET_S,
        "met": median <= TARGET_S,
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
    }
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "generate.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"regattn generate, all built-ins: median {median:.2f} s over {args.repeat} runs "
          f"(min {min(times):.2f}, max {max(times):.2f}); target <= {TARGET_S:.0f} s: {'met' if result['met'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
