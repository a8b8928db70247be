"""The maps without a sum against their closed forms, in one run, as ratios: ``sigmoid`` (the binary entropy's map)
against SciPy's ``expit`` and ``torch.sigmoid``, ``relu`` (Gini's) against ``numpy.maximum`` and ``torch.relu``.

NumPy: the forward; torch: the forward and backward of ``m(x).sum()``; float32 N(0, 1) scores, one thread, the first
quartile of interleaved calls.

    python benchmarks/bench_nosum.py [--calls 30]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("REGATTN_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from scipy.special import expit  # noqa: E402

import numeric as nm  # noqa: E402
from _timing import quartile  # noqa: E402

SHAPES = [(8192, 64), (512, 1024)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    try:
        import torch

        import numeric.torch as rt

        torch.set_num_threads(1)
    except ModuleNotFoundError:
        torch = None
    rng = np.random.default_rng(0)
    peers = {"sigmoid": (expit, "sigmoid"), "relu": (lambda x: np.maximum(x, 0), "relu")}
    print(f"{'map':8s} {'shape':12s} {'NumPy':>8s} {'torch':>8s}   (regattn's time / the closed form's)")
    for shape in SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        for name, (closed, torch_name) in peers.items():
            m = nm.get_map(name)
            ours, theirs = quartile([lambda: m(x), lambda: closed(x)], args.calls)
            line = f"{name:8s} {str(shape):12s} {ours / theirs:8.2f}"
            if torch is not None:
                tm, xt, fn = rt.get_map(name), torch.tensor(x, requires_grad=True), getattr(torch, torch_name)

                def step(own, tm=tm, xt=xt, fn=fn):
                    (tm(xt) if own else fn(xt)).sum().backward()

                ours, theirs = quartile([lambda: step(True), lambda: step(False)], args.calls)
                line += f" {ours / theirs:8.2f}"
            print(line)


if __name__ == "__main__":
    main()
