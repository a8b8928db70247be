"""What glibc's heap reserve (``numeric.set_heap_reserve``) is worth: maps' time with malloc as glibc leaves it
against the reserve of 32 MiB, each setting in processes of its own, run in turns (one thread, float32).

    python benchmarks/bench_heap.py [--turns 3]

Prints, per case, the least median over the turns of each setting (ms, process time: user and system, where the
page faults are paid) and their ratio (glibc's / reserve's: above 1, the reserve saves time).  Needs torch.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from _timing import median_cpu_ms

HERE = Path(__file__).resolve().parent
SHAPES = [(512, 64), (8192, 64), (512, 1024)]
MAPS = ["softmax", "sparsemax", "entmax15", "plogp_cube", "gini_log1p"]


def measure(reserve: int) -> dict:
    """Every case's median process time (ms) in this process, with ``reserve`` bytes of heap (0: glibc's own)."""
    import torch
    from _typed import typed_modules

    import numeric as nm
    import numeric.torch as rt

    if reserve:
        nm.set_heap_reserve(reserve)
    nm.set_num_threads(1)
    torch.set_num_threads(1)
    typed = typed_modules()
    rng = np.random.default_rng(0)
    out = {}
    for shape in SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        xt = torch.from_numpy(x).requires_grad_()
        dy = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
        repeat = 30 if shape[1] <= 64 else 10
        for name in MAPS:
            npm = nm.get_map(typed.get(name, name))
            tm = rt.get_map(typed.get(name, name))

            def torch_both():
                xt.grad = None
                tm(xt, dim=-1).backward(dy)

            out[f"numpy forward {name} {shape}"] = median_cpu_ms(lambda: npm(x), repeat)
            out[f"torch forward+backward {name} {shape}"] = median_cpu_ms(torch_both, repeat)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child)))
        return
    best = {0: {}, 32 << 20: {}}
    for _ in range(args.turns):
        for reserve in best:
            run = subprocess.run([sys.executable, __file__, "--child", str(reserve)], cwd=HERE, capture_output=True,
                                 text=True, env={"REGATTN_HEAP_RESERVE": "0", **_env()})
            if run.returncode:
                sys.exit(run.stderr)
            for case, ms in json.loads(run.stdout).items():
                best[reserve][case] = min(ms, best[reserve].get(case, float("inf")))
    print(f"{'case':55s} {'glibc ms':>9s} {'reserve ms':>10s} {'ratio':>6s}")
    for case, plain in best[0].items():
        kept = best[32 << 20][case]
        print(f"{case:55s} {plain:9.3f} {kept:10.3f} {plain / kept:6.2f}")


def _env():
    import os

    return {k: v for k, v in os.environ.items() if k != "REGATTN_HEAP_RESERVE"}


if __name__ == "__main__":
    main()
