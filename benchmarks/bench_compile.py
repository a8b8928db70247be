"""torch.compile against eager for regattn's torch maps and attention, forward+backward, in one run (CPU, float32).

Run:

    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install -e '.[torch]'
    python benchmarks/bench_compile.py [--quick] [--threads 1] [--out benchmarks/results]

* maps on (512, n) scores, n = 64 and 1024: softmax, sparsemax, entmax15,
  alpha-entmax with an alpha tensor per row that requires grad, and the typed maps
  (user regularizers with no closed-form link) ``p*log(p) + p**3`` and
  ``p**2/2 + p*log(1 + p)``;
* attention, (N, H, L = S, E) = (2, 4, 256, 64), causal: softmax, sparsemax,
  entmax15, alpha-entmax with an alpha per head that requires grad, and
  ``p**2/2 + p*log(1 + p)``.

Each function is compiled once with ``torch.compile(fn, fullgraph=True)``
(inductor) and timed against the same function run eagerly: the figure is the
ratio of the medians, compiled / eager (below 1: compiling pays), beside the
time of the first compiled call (tracing, compiling the forward and backward
graphs).  Writes ``compile.json`` and ``compile.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

from _timing import median_seconds
from _typed import typed_modules

SIZES = (64, 1024)
ROWS = 512
ATTENTION = (2, 4, 256, 64)
#: each figure's runs fill at least this long
MIN_SECONDS = 0.5


def _measure(torch, fn, leaves, grads, repeat):
    """``(eager s, compiled s, first compiled call s)`` of forward+backward: ``fn(*leaves)`` then its backward
    with ``grads``."""
    torch._dynamo.reset()  # (the cases' functions share code objects, on which dynamo's cache and its limit sit)
    compiled = torch.compile(fn, fullgraph=True)

    def step(f):
        for t in leaves:
            t.grad = None
        torch.autograd.backward(f(*leaves), grads)

    start = time.perf_counter()
    step(compiled)
    first = time.perf_counter() - start
    eager = median_seconds(lambda: step(fn), repeat, min_seconds=MIN_SECONDS)
    fast = median_seconds(lambda: step(compiled), repeat, min_seconds=MIN_SECONDS)
    return eager, fast, first


def _maps(torch, rt, typed, sizes, repeat):
    rows = []
    maps = {name: rt.get_map(name) for name in ("softmax", "sparsemax", "entmax15")}
    maps.update({name: rt.get_map(module) for name, module in typed.items()})
    entmax = rt.get_map("entmax")
    for n in sizes:
        g = torch.Generator().manual_seed(n)
        x = torch.randn(ROWS, n, generator=g).requires_grad_()
        dy = torch.randn(ROWS, n, generator=g)
        alpha = torch.full((ROWS, 1), 1.3).requires_grad_()
        cases = {name: ((lambda m: lambda x: m(x))(m), (x,)) for name, m in maps.items()}
        cases["entmax(alpha tensor)"] = (lambda x, a: entmax(x, alpha=a), (x, alpha))
        for what, (fn, leaves) in cases.items():
            eager, fast, first = _measure(torch, fn, leaves, dy, repeat)
            rows.append(dict(what=f"{what} n={n}", eager_ms=eager * 1e3, compiled_ms=fast * 1e3, first_s=first))
            print(_line(rows[-1]), flush=True)
    return rows


def _attention(torch, rt, typed, repeat):
    rows = []
    N, H, L, E = ATTENTION
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(N, H, L, E, generator=g).requires_grad_() for _ in range(3))
    dy = torch.randn(N, H, L, E, generator=g)
    alpha = torch.full((H, 1, 1), 1.3).requires_grad_()
    cases = {name: rt.get_map(name) for name in ("softmax", "sparsemax", "entmax15")}
    cases["gini_log1p"] = rt.get_map(typed["gini_log1p"])
    for what, m in cases.items():
        fn = (lambda m: lambda q, k, v: rt.attention(q, k, v, is_causal=True, mapping=m))(m)
        eager, fast, first = _measure(torch, fn, (q, k, v), dy, repeat)
        rows.append(dict(what=f"attention {what}", eager_ms=eager * 1e3, compiled_ms=fast * 1e3, first_s=first))
        print(_line(rows[-1]), flush=True)

    def fn(q, k, v, a):
        return rt.attention(q, k, v, is_causal=True, mapping=rt.get_map("entmax", alpha=a))

    eager, fast, first = _measure(torch, fn, (q, k, v, alpha), dy, repeat)
    rows.append(dict(what="attention entmax(alpha per head)", eager_ms=eager * 1e3, compiled_ms=fast * 1e3, first_s=first))
    print(_line(rows[-1]), flush=True)
    return rows


def _line(row):
    return (f"| {row['what']} | {row['eager_ms']:.3f} | {row['compiled_ms']:.3f} | "
            f"{row['compiled_ms'] / row['eager_ms']:.2f} | {row['first_s']:.0f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 64 only, fewer runs")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (default 1)")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    import torch

    from numeric import torch as rt

    warnings.simplefilter("ignore")  # (torch's own tracing warnings)
    torch.set_num_threads(args.threads)
    repeat = 5 if args.quick else 21
    typed = typed_modules()
    print("| what (float32, forward+backward) | eager ms | compiled ms | compiled / eager | first call s |")
    print("|---|---:|---:|---:|---:|")
    rows = _maps(torch, rt, typed, SIZES[:1] if args.quick else SIZES, repeat) + _attention(torch, rt, typed, repeat)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(torch=torch.__version__, python=platform.python_version(), machine=platform.machine(),
                processor=platform.processor(), threads=args.threads)
    (out / "compile.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    table = ["| what (float32, forward+backward) | eager ms | compiled ms | compiled / eager | first call s |",
             "|---|---:|---:|---:|---:|", *map(_line, rows)]
    (out / "compile.md").write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
