"""The C heap that NumPy's arrays come from: freed memory kept for the next arrays instead of given back (opt-in).

NumPy takes each array's memory from ``malloc``.  glibc serves a request of at least
``M_MMAP_THRESHOLD`` bytes (128 KiB at start, raised to the largest such block freed, up to
32 MiB) with a fresh ``mmap``, and gives the top of its heap back to the system whenever more
than ``M_TRIM_THRESHOLD`` of it is free.  Either way the next array of that size is new memory,
and its first write faults once per 4 KiB page.  A computation that makes temporaries of a few
hundred KiB, one expression after another, pays that on every call: on the machine of
docs/benchmarks.md a fault costs about 2 microseconds, and ``np.multiply`` of two 1 MiB
arrays into a new one took 1.5 ms where the product itself takes 0.1 ms.  The solvers that
:mod:`numeric` runs make such temporaries; today it is worth most to torch's KKT solve of a
typed map with no closed-form link, whose rounds make temporaries of a MiB and more.

:func:`set_heap_reserve` asks glibc to serve arrays of up to ``nbytes`` from the heap
(``M_MMAP_THRESHOLD``) and to keep ``nbytes`` of free memory at its top when it trims
(``M_TOP_PAD``): temporaries then reuse memory that is already mapped.  These are settings of the
whole process (torch's CPU tensors and every other library's ``malloc`` get them too), so regattn
never changes them unasked: call ``set_heap_reserve(DEFAULT_RESERVE)``, or set
``REGATTN_HEAP_RESERVE`` to a number of bytes before ``import numeric``.  The cost is memory: up
to ``nbytes`` of freed memory stays with the process.  ``benchmarks/bench_heap.py`` measures what
it is worth (docs/benchmarks.md).  Elsewhere than on Linux with glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import warnings
from functools import lru_cache

__all__ = ["DEFAULT_RESERVE", "ENV", "set_heap_reserve", "get_heap_reserve"]

#: Environment variable giving a reserve for ``import numeric`` to set (unset or empty: malloc is left as it is).
ENV = "REGATTN_HEAP_RESERVE"
#: glibc's defaults of both parameters (``mallopt(3)``).
GLIBC_DEFAULT = 128 << 10
#: ``mallopt`` parameters (``malloc.h``).
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
#: glibc takes no mmap threshold above this (``HEAP_MAX_SIZE / 2`` on 64-bit systems).
LARGEST = 32 << 20
#: The reserve to ask for (glibc's own largest mmap threshold).
DEFAULT_RESERVE = LARGEST

_state = {"reserve": None}


@lru_cache(maxsize=None)
def _mallopt():
    """glibc's ``mallopt``, or ``None`` elsewhere (looked up once: ``platform.libc_ver`` reads the interpreter's file)."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def set_heap_reserve(nbytes: int | None) -> bool:
    """Serve arrays of up to ``nbytes`` from the C heap and keep ``nbytes`` of it when trimming (see the module).

    ``0`` or ``None`` puts back glibc's values of both parameters (128 KiB; glibc's own raising of the mmap
    threshold stays off once a value was set).  ``nbytes`` is at most 32 MiB.  Returns whether the
    allocator took the values (``False`` where it is not glibc's).
    """
    value = 0 if nbytes is None else nbytes
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= LARGEST:
        raise ValueError(f"the heap reserve is a whole number of bytes from 0 to {LARGEST}, not {nbytes!r}")
    mallopt = _mallopt()
    if mallopt is None:
        return False
    size = value or GLIBC_DEFAULT
    took = bool(mallopt(M_MMAP_THRESHOLD, size)) and bool(mallopt(M_TOP_PAD, size))
    if took:
        _state["reserve"] = value
    return took


def get_heap_reserve() -> int | None:
    """The reserve last set by :func:`set_heap_reserve` (``None``: never set, or not glibc)."""
    return _state["reserve"]


def _reserve_from_environment() -> int:
    """``REGATTN_HEAP_RESERVE`` as a number of bytes (0 where it is unset or empty)."""
    text = os.environ.get(ENV, "").strip()
    return int(text) if text else 0


def apply_environment() -> None:
    """Set the reserve ``REGATTN_HEAP_RESERVE`` asks for, as ``import numeric`` does; unset, empty or 0 leaves
    ``malloc`` as it is, and a value that is not a reserve warns and leaves it too."""
    try:
        value = _reserve_from_environment()
        if value:
            set_heap_reserve(value)
    except ValueError:
        warnings.warn(f"{ENV}={os.environ.get(ENV)!r} is not a number of bytes from 0 to {LARGEST}: malloc is left as it is",
                      RuntimeWarning, stacklevel=2)
