"""Sort-map thresholds on NumPy (numeric.core and numeric.numpy.steps on numeric.numpy.ops.NumpyRowOps): the sort
rule on whole sorted rows against the partial selection of each row's largest scores, the sort-free support rule
(the shared text and NumPy's rounds over one buffer), and the root rule.

Run: python benchmarks/bench_thresholds.py [--quick] [--out benchmarks/results]
Float32 rows, about 2**20 scores per case, median of 5 runs (``--quick``: n = 64, 1024
and 2**18 scores, 3 runs); two score scales: N(0, 1) (small supports) and N(0, 0.01)
(supports of most of the row).  The rows are shifted by their maxima once, outside
the timings (every rule takes shifted rows):

* ``full``: :func:`~numeric.core.rules.sort_rule` (a full sort, O(n log n));
* ``partial``: :func:`~numeric.numpy.steps.largest_threshold` from each row's ``K`` largest
  scores (``numpy.partition``, O(n)), for sparsemax too;
* ``support``: :func:`~numeric.core.rules.support_rule` (Newton on the support, no sort;
  Michelot's algorithm for sparsemax), and for sparsemax ``rounds``, NumPy's form of it
  (:func:`~numeric.numpy.steps.support_rounds`);
* ``root``: :func:`~numeric.core.rules.root_rule` (what ``threshold="root"`` runs).

The figures decide :data:`numeric.numpy.steps.PARTIAL_FROM` (rows from which a sort map selects
before sorting) and :data:`numeric.numpy.steps.SUPPORT_BELOW` (rows of a link of degree 1 shorter
than this take the support rounds); results go to ``--out``/thresholds.json.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import numpy as np

from numeric import contract
from numeric.core import rules
from numeric.core.ops import Routines
from numeric.numpy import steps
from numeric.numpy.ops import ops_for
from _timing import median_seconds


def routines(module) -> Routines:
    """A module's routines as the NumPy backend binds them (no parameters)."""
    table = {name: getattr(module, name, None) for name in contract.routine_names(module.PARAMETERS)}
    return Routines(module, table, ())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 64 and 1024, 2**18 scores a case, 3 runs")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    sizes = (64, 1024) if args.quick else (64, 128, 256, 1024, 4096, 16384)
    scores = 2**18 if args.quick else 2**20
    repeat = 3 if args.quick else 5
    ops = ops_for(np.float32)
    rows = []
    for name in ("sparsemax", "entmax15"):
        r = routines(importlib.import_module(f"numeric._generated.{name}"))
        for scale in (1.0, 0.01):
            for n in sizes:
                x = (np.random.default_rng(n).standard_normal((max(1, scores // n), n)) * scale).astype(np.float32)
                y = x - x.max(axis=-1, keepdims=True)
                with np.errstate(all="ignore"):
                    full = median_seconds(lambda: rules.sort_rule(ops, r, y), repeat=repeat)
                    k = min(64, max(8, n // 4))
                    partial = median_seconds(lambda: steps.largest_threshold(ops, r, y, k), repeat=repeat)
                    support = median_seconds(lambda: rules.support_rule(ops, r, y), repeat=repeat)
                    rounds = (median_seconds(lambda: steps.support_rounds(ops, r, y), repeat=repeat)
                              if name == "sparsemax" else float("nan"))
                    root = median_seconds(lambda: rules.root_rule(ops, r, y), repeat=min(repeat, 3))
                    t_full = rules.sort_rule(ops, r, y)
                    diff = float(np.abs(t_full - steps.largest_threshold(ops, r, y, k)).max())
                    diff_support = float(np.abs(t_full - rules.support_rule(ops, r, y)).max())
                row = dict(map=name, scale=scale, n=n, full_ms=full * 1e3, partial_ms=partial * 1e3, support_ms=support * 1e3,
                           rounds_ms=rounds * 1e3, root_ms=root * 1e3, max_diff=diff, max_diff_support=diff_support)
                rows.append(row)
                print(f"{name:9s} scale {scale:<5} n {n:6d}: full {full*1e3:7.2f} ms  partial {partial*1e3:7.2f} ms "
                      f"({full/partial:5.1f}x)  support {support*1e3:7.2f} ms  rounds {rounds*1e3:7.2f} ms  root {root*1e3:7.2f} ms  "
                      f"|full - partial| = {diff:.1e}  |full - support| = {diff_support:.1e}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "thresholds.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
