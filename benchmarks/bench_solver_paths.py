"""Process time of the paths a solver change touches, one thread, float32: for a before/after comparison.

Run on the tree and on a clone of the old commit (``PYTHONPATH=<clone>``), alternating, and compare the
medians line by line (only figures from one machine and one session compare):

    python benchmarks/bench_solver_paths.py [--repeat 15]

* NumPy ``nm.entmax(x, alpha)`` on (512, n) scores, n = 64 and 1024, alpha 1.3 (the power Newton, k >= 1)
  and 3.0 (the safeguarded Halley, k < 1);
* torch ``rt.entmax`` forward+backward on the same scores;
* torch ``rt.attention`` forward+backward, (2, 4, 512, 64), causal, alpha a number or one per head (the
  backward rebuilds the weights from each row's threshold, ``rules.at_threshold``);
* NumPy forward of the typed maps (``benchmarks/_typed.py``: the KKT solve) and NumPy ``jvp`` of softmax,
  1.5-entmax, entmax(1.3) and a typed map, on the same scores.

Prints ``what<TAB>ms`` lines.
"""

from __future__ import annotations

import argparse

import numpy as np
from _timing import median_cpu_ms


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    import torch

    import numeric as nm
    import numeric.torch as rt

    torch.set_num_threads(1)
    nm.set_num_threads(1)
    rng = np.random.default_rng(0)
    rows = {}
    for n in (64, 1024):
        x = rng.standard_normal((512, n)).astype(np.float32)
        xt = torch.from_numpy(x).requires_grad_()
        d = torch.randn(512, n)
        for alpha in (1.3, 3.0):
            rows[f"numpy entmax({alpha}) n={n}"] = median_cpu_ms(lambda: nm.entmax(x, alpha), args.repeat)
            rows[f"torch entmax({alpha}) fwd+bwd n={n}"] = median_cpu_ms(
                lambda: torch.autograd.grad((rt.entmax(xt, alpha) * d).sum(), xt), args.repeat)
    from _typed import typed_modules

    typed = {name: nm.Map(module) for name, module in typed_modules().items()}
    for n in (64, 1024):
        x = rng.standard_normal((512, n)).astype(np.float32)
        d = rng.standard_normal((512, n)).astype(np.float32)
        for name, mapping in typed.items():
            rows[f"numpy {name} n={n}"] = median_cpu_ms(lambda: mapping(x), args.repeat)
        for name, mapping in (("softmax", nm.get_map("softmax")), ("entmax15", nm.get_map("entmax15")),
                              ("entmax(1.3)", nm.get_map("entmax", alpha=1.3)), ("plogp_cube", typed["plogp_cube"])):
            p = mapping(x)
            rows[f"numpy jvp {name} n={n}"] = median_cpu_ms(lambda: mapping.jvp(p, d), args.repeat)
    q, k, v = (torch.randn(2, 4, 512, 64, requires_grad=True) for _ in range(3))
    for alpha in (1.3, 3.0):
        for per_head in (False, True):
            mapping = rt.get_map("entmax", alpha=torch.full((4, 1, 1), alpha) if per_head else alpha)
            rows[f"torch attention entmax({alpha}){' per head' if per_head else ''} fwd+bwd"] = median_cpu_ms(
                lambda: torch.autograd.grad(rt.attention(q, k, v, mapping=mapping, is_causal=True).sum(), (q, k, v)),
                max(3, args.repeat // 3))
    for what, ms in rows.items():
        print(f"{what}\t{ms:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
