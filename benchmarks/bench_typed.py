"""Typed maps of every kind against ``entmax15`` in one run (issue 46: within 3x in the torch forward+backward and
the NumPy forward), as ratios: float32 N(0, 1) scores of shape (512, n), n = 64 and 1024, one thread, the first
quartile of interleaved calls.  Each map's rule (its generated module's ``THRESHOLD`` and ``LINK_FORM``) is printed
beside it.

    python benchmarks/bench_typed.py [--calls 15]
"""

from __future__ import annotations

import os

os.environ.setdefault("REGATTN_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import numeric as nm  # noqa: E402
from _timing import calls_argument, one_thread_torch, quartile  # noqa: E402
from _typed import KINDS, typed_modules  # noqa: E402

SIZES = (64, 1024)


def main() -> None:
    calls = calls_argument(__doc__)
    torch, rt = one_thread_torch()
    modules = typed_modules({name: expr for name, (expr, _) in KINDS.items()})
    rng = np.random.default_rng(0)
    print(f"{'map':13s} {'kind':45s} {'rule':14s} {'n':>5s} {'NumPy':>7s} {'torch f+b':>10s}")
    for n in SIZES:
        x = rng.standard_normal((512, n)).astype(np.float32)
        ref = nm.get_map("entmax15")
        if torch is not None:
            xt = torch.tensor(x, requires_grad=True)
            ref_t = rt.get_map("entmax15")
        for name, (_, kind) in KINDS.items():
            module = modules[name]
            m = nm.get_map(module)
            base, mine = quartile([lambda: ref(x), lambda: m(x)], calls)
            rule = f"{module.THRESHOLD}/{module.LINK_FORM}"
            line = f"{name:13s} {kind:45s} {rule:14s} {n:5d} {mine / base:7.2f}"
            if torch is not None:
                mt = rt.get_map(module)

                def step(mapping, xt=xt):
                    mapping(xt).sum().backward()

                base, mine = quartile([lambda: step(ref_t), lambda: step(mt)], calls)
                line += f" {mine / base:10.2f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
