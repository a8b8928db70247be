"""A sink's cost: each map with ``sink=b`` (one sink per row) against the same map without one, in one run, as
ratios (issue 45 asks for at most 1.1).

NumPy: the forward; torch: the forward and backward of ``m(x, sink=b).sum()``; float32 N(0, 1) scores, one thread,
the first quartile of interleaved calls.

    python benchmarks/bench_sink.py [--calls 30]
"""

from __future__ import annotations

import os

os.environ.setdefault("REGATTN_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import numeric as nm  # noqa: E402
from _timing import calls_argument, one_thread_torch, quartile  # noqa: E402

SHAPES = [(8192, 64), (512, 1024), (4096, 1024)]
MAPS = ["softmax", "sparsemax", "entmax15"]


def main() -> None:
    calls = calls_argument(__doc__)
    torch, rt = one_thread_torch()
    rng = np.random.default_rng(0)
    print(f"{'map':10s} {'shape':12s} {'NumPy':>8s} {'torch':>8s}")
    for shape in SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        b = rng.standard_normal((shape[0], 1)).astype(np.float32)
        for name in MAPS:
            m = nm.get_map(name)
            plain, sink = quartile([lambda: m(x), lambda: m(x, sink=b)], calls)
            line = f"{name:10s} {str(shape):12s} {sink / plain:8.2f}"
            if torch is not None:
                tm, xt, bt = rt.get_map(name), torch.tensor(x, requires_grad=True), torch.tensor(b, requires_grad=True)

                def step(with_sink, tm=tm, xt=xt, bt=bt):
                    (tm(xt, sink=bt) if with_sink else tm(xt)).sum().backward()

                plain, sink = quartile([lambda: step(False), lambda: step(True)], calls)
                line += f" {sink / plain:8.2f}"
            print(line)


if __name__ == "__main__":
    main()
