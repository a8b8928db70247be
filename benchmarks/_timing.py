"""Timing shared by the benchmark scripts: medians of repeated runs after a warm-up, medians of two functions' calls
alternated, first quartiles of interleaved calls."""

import statistics
import time


def median_seconds(fn, repeat: int = 5, warmup: bool = True, min_seconds: float = 0.0) -> float:
    """Median wall time of ``fn()`` over ``repeat`` runs (one untimed warm-up run first), or over as
    many more runs (up to 1000) as fill ``min_seconds``: short calls get enough runs for a stable median."""
    if warmup:
        fn()
    times = []
    while len(times) < repeat or sum(times) < min_seconds and len(times) < 1000:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def paired_seconds(base, ours, repeat: int = 5, min_seconds: float = 0.0) -> tuple:
    """Median wall times ``(base, ours)`` of ``base()`` and ``ours()`` called in turn (one untimed call of each
    first) over ``repeat`` rounds, or over as many more rounds (up to 1000) as fill ``min_seconds`` with both
    functions' calls: the two figures of a ratio see the same machine, whatever it does between rounds."""
    base()
    ours()
    times = [], []
    while len(times[0]) < repeat or sum(times[0]) + sum(times[1]) < min_seconds and len(times[0]) < 1000:
        for fn, t in zip((base, ours), times):
            start = time.perf_counter()
            fn()
            t.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def median_cpu_ms(fn, repeat: int) -> float:
    """Median process time (user and system, ms) of ``fn()`` over ``repeat`` runs after one untimed run: the time
    this process spent, page faults included, whatever else the machine runs."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3


def quartile(fns, calls: int) -> list:
    """The first quartile of each function's wall time, calls interleaved (after three untimed rounds): functions
    compared in one run see the same machine."""
    for _ in range(3):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(calls):
        for fn, t in zip(fns, times):
            start = time.perf_counter()
            fn()
            t.append(time.perf_counter() - start)
    return [statistics.quantiles(t, n=4)[0] for t in times]


def one_thread_torch():
    """``(torch, numeric.torch)`` with torch on one thread, or ``(None, None)`` where torch is not installed (the
    benchmarks that compare a torch column beside NumPy's)."""
    try:
        import torch

        import numeric.torch as rt
    except ModuleNotFoundError:
        return None, None
    torch.set_num_threads(1)
    return torch, rt


def calls_argument(doc: str):
    """The parsed ``--calls`` (default 30) of a benchmark whose docstring's first line is ``doc``."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    return parser.parse_args().calls
