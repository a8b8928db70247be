"""How long ``torch.compile(fn, fullgraph=True)`` takes for regattn's maps and causal attention (CPU, float32).

Run:

    python benchmarks/bench_compile_time.py [--cases softmax,entmax15,...] [--what map,attention]
                                            [--passes forward,backward] [--cold-only] [--out benchmarks/results]

For each map (the built-ins softmax, sparsemax, entmax15, alpha-entmax with an
alpha tensor that requires grad, and the typed maps ``p*log(p) + p**3`` and
``p**2/2 + p*log(1 + p)``, user regularizers whose link has no closed form; ``--cases`` takes
any typed map of ``_typed.KINDS`` by name), the map alone on (512, 64) scores and causal attention (N, H, L = S, E) = (2, 4,
256, 64) with it are compiled with inductor, each in a fresh process:

* ``forward``: the first compiled call on inputs that do not require grad
  (tracing and compiling the forward graph, then one run);
* ``backward``: the first compiled call on inputs that require grad and its
  backward pass (compiling the forward and backward graphs, then one run).

``cold`` is a process with an empty inductor cache (``TORCHINDUCTOR_CACHE_DIR``
a new folder), as the first compile on a machine; ``warm`` a second process on
the cache the cold one filled (dynamo still traces; inductor's FX graph cache
serves the compiled code), as every later run.  Each time is the wall time of
the first call alone (imports, map building and the eager inputs excluded);
``cold_cpu_s`` and ``warm_cpu_s`` in the JSON are the CPU seconds of the
process and of the children it waited for (imports included; inductor's C++
compiler runs), which other work on the machine stretches less than wall time.  The
machine's CPU count and load average (before and after each case) are recorded:
compile time is CPU time of one process (inductor's code generation) plus its
C++ compiler's, so other work on the machine lengthens it.  Writes
``compile_time.json`` and ``compile_time.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = ("softmax", "sparsemax", "entmax15", "entmax(alpha tensor)", "plogp_cube", "gini_log1p")
ROWS, N = 512, 64
ATTENTION = (2, 4, 256, 64)


def _one(case: str, what: str, pass_: str) -> float:
    """In this process: the seconds of the first compiled call (and its backward for ``backward``)."""
    import warnings

    import torch

    from numeric import torch as rt

    warnings.simplefilter("ignore")
    grad = pass_ == "backward"
    g = torch.Generator().manual_seed(0)
    from _typed import KINDS, kind_modules

    if case in KINDS:
        m = rt.get_map(kind_modules([case])[case])
    elif case.startswith("entmax("):
        m = None
    else:
        m = rt.get_map(case)
    if what == "map":
        leaves = [torch.randn(ROWS, N, generator=g)]
        if m is None:
            leaves.append(torch.full((ROWS, 1), 1.3))
            entmax = rt.get_map("entmax")

            def fn(x, a):
                return entmax(x, alpha=a)
        else:
            def fn(x):
                return m(x)
    else:
        B, H, L, E = ATTENTION
        leaves = [torch.randn(B, H, L, E, generator=g) for _ in range(3)]
        if m is None:
            leaves.append(torch.full((H, 1, 1), 1.3))

            def fn(q, k, v, a):
                return rt.attention(q, k, v, is_causal=True, mapping=rt.get_map("entmax", alpha=a))
        else:
            def fn(q, k, v):
                return rt.attention(q, k, v, is_causal=True, mapping=m)
    leaves = [t.requires_grad_(grad) for t in leaves]
    compiled = torch.compile(fn, fullgraph=True)
    start = time.perf_counter()
    out = compiled(*leaves)
    if grad:
        out.backward(torch.ones_like(out))
    return time.perf_counter() - start


def _load() -> list:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--what", default="map,attention")
    parser.add_argument("--passes", default="forward,backward")
    parser.add_argument("--cold-only", action="store_true", help="no warm run (half the time)")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--one", nargs=3, metavar=("CASE", "WHAT", "PASS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_one(*args.one)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(python=platform.python_version(), machine=platform.machine(), cpus=os.cpu_count(),
                nproc=len(os.sched_getaffinity(0)), started=time.strftime("%Y-%m-%d %H:%M:%S"))
    try:
        import torch
        meta["torch"] = torch.__version__
        meta["processor"] = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if
                                  ln.startswith("model name")), platform.processor())
    except (ImportError, OSError):
        pass
    rows = []
    header = ("| what (float32, inductor, fullgraph) | pass | cold s | warm s | load before / after |\n"
              "|---|---|---:|---:|---|")
    print(header, flush=True)
    here = Path(__file__).resolve().parent
    for what in args.what.split(","):
        for case in args.cases.split(","):
            for pass_ in args.passes.split(","):
                row = dict(case=case, what=what, pass_=pass_, load_before=_load())
                with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache:
                    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, PYTHONPATH=os.pathsep.join(
                        [str(here.parent), str(here), os.environ.get("PYTHONPATH", "")]))
                    row["warm"] = None
                    for temp in ("cold",) if args.cold_only else ("cold", "warm"):
                        used = resource.getrusage(resource.RUSAGE_CHILDREN)
                        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", case, what,
                                               pass_], env=env, capture_output=True, text=True)
                        now = resource.getrusage(resource.RUSAGE_CHILDREN)
                        # CPU seconds of the process and the children it waited for (imports too): load stretches them less
                        row[f"{temp}_cpu_s"] = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
                        row[temp] = float(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
                        if proc.returncode:
                            row[f"{temp}_error"] = proc.stderr[-2000:]
                row["load_after"] = _load()
                rows.append(row)
                name = f"{case} {'map' if what == 'map' else 'causal attention'}"
                line = (f"| {name} | {'forward' if pass_ == 'forward' else 'forward+backward'} | "
                        f"{row['cold'] if row['cold'] is None else round(row['cold'], 1)} | "
                        f"{row['warm'] if row['warm'] is None else round(row['warm'], 1)} | "
                        f"{row['load_before'][0]} / {row['load_after'][0]} |")
                row["line"] = line
                print(line, flush=True)
                (out / "compile_time.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    (out / "compile_time.md").write_text(header + "\n" + "\n".join(r["line"] for r in rows) + "\n")


if __name__ == "__main__":
    main()
