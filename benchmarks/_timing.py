"""Timing shared by the benchmark scripts: medians of repeated runs after a warm-up."""

import statistics
import time


def median_seconds(fn, repeat: int = 5, warmup: bool = True) -> float:
    """Median wall time of ``fn()`` over ``repeat`` runs (one untimed warm-up run first)."""
    if warmup:
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
