"""The memory mappings a test process holds, against Linux's limit per process (``vm.max_map_count``).

XLA keeps each executable it compiled loaded while JAX caches it, at about a dozen mappings each; the root
conftest clears JAX's caches through :func:`kept_below` before a worker reaches the limit.
"""

from __future__ import annotations

import gc


def _limit():
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


#: Linux's limit of memory mappings a process (None where there is no /proc).
LIMIT = _limit()


def mappings() -> int:
    """The number of memory mappings this process holds."""
    with open("/proc/self/maps", "rb") as f:
        return sum(1 for _ in f)


def kept_below(limit: int, jax) -> bool:
    """Clear ``jax``'s caches where this process holds more than ``limit`` mappings; returns whether it did."""
    if mappings() <= limit:
        return False
    jax.clear_caches()
    gc.collect()
    return True
