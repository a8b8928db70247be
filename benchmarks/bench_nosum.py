"""The maps without a sum against their closed forms, in one run, as ratios: ``sigmoid`` (the binary entropy's map)
against SciPy's ``expit`` and ``torch.sigmoid``, ``relu`` (Gini's) against ``numpy.maximum`` and ``torch.relu``.

NumPy: the forward; torch: the forward and backward of ``m(x).sum()``; float32 N(0, 1) scores, one thread, the first
quartile of interleaved calls.  Then sigmoid attention, ``sigmoid(scale q k^T) v`` (one batch element, 4 heads,
E = 64): regattn's ``attention(..., mapping="sigmoid")`` (NumPy forward; torch forward and backward) against the
same written with the framework's sigmoid and two matrix products (SciPy's ``expit`` for NumPy).

    python benchmarks/bench_nosum.py [--calls 30]
"""

from __future__ import annotations

import os

os.environ.setdefault("REGATTN_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from scipy.special import expit  # noqa: E402

import numeric as nm  # noqa: E402
from _timing import calls_argument, one_thread_torch, quartile  # noqa: E402

SHAPES = [(8192, 64), (512, 1024)]
LENGTHS = [256, 1024]


def main() -> None:
    calls = calls_argument(__doc__)
    torch, rt = one_thread_torch()
    rng = np.random.default_rng(0)
    peers = {"sigmoid": (expit, "sigmoid"), "relu": (lambda x: np.maximum(x, 0), "relu")}
    print(f"{'map':8s} {'shape':12s} {'NumPy':>8s} {'torch':>8s}   (regattn's time / the closed form's)")
    for shape in SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        for name, (closed, torch_name) in peers.items():
            m = nm.get_map(name)
            ours, theirs = quartile([lambda: m(x), lambda: closed(x)], calls)
            line = f"{name:8s} {str(shape):12s} {ours / theirs:8.2f}"
            if torch is not None:
                tm, xt, fn = rt.get_map(name), torch.tensor(x, requires_grad=True), getattr(torch, torch_name)

                def step(own, tm=tm, xt=xt, fn=fn):
                    (tm(xt) if own else fn(xt)).sum().backward()

                ours, theirs = quartile([lambda: step(True), lambda: step(False)], calls)
                line += f" {ours / theirs:8.2f}"
            print(line)
    print(f"\n{'attention':10s} {'L = S':>6s} {'NumPy':>8s} {'torch':>8s}   (regattn's time / sigmoid and matmul's)")
    for L in LENGTHS:
        q, k, v = (rng.standard_normal((1, 4, L, 64)).astype(np.float32) for _ in range(3))
        scale = np.float32(1 / 8)

        def closed(q=q, k=k, v=v):
            return expit(q @ np.swapaxes(k, -1, -2) * scale) @ v

        ours, theirs = quartile([lambda: nm.attention(q, k, v, mapping="sigmoid"), closed], calls)
        line = f"{'sigmoid':10s} {L:6d} {ours / theirs:8.2f}"
        if torch is not None:
            qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))

            def step(own, qt=qt, kt=kt, vt=vt):
                if own:
                    out = rt.attention(qt, kt, vt, mapping="sigmoid", backend="torch")
                else:
                    out = torch.sigmoid(qt @ kt.transpose(-2, -1) * float(scale)) @ vt
                out.sum().backward()

            ours, theirs = quartile([lambda: step(True), lambda: step(False)], calls)
            line += f" {ours / theirs:8.2f}"
        print(line)


if __name__ == "__main__":
    main()
