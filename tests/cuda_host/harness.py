"""Generated CUDA kernels compiled with g++ and run on the host with the semantics of CUDA blocks.

:func:`build` compiles ``block_semantics.h`` (one OS thread per CUDA thread, ``__syncthreads`` a
barrier, ``__shfl_down_sync`` per warp of 32, ``__shared__`` per block), a CUDA source exactly as
given, and one ``extern "C" int NAME_launch(grid, block, args...)`` wrapper per ``extern "C"
__global__`` kernel (made from the kernel's own signature) into a shared library, cached under the
hash of the text and the flags (by :func:`derive.codegen.compilers._build`, as the one-thread host
builds: in ``$REGATTN_HOST_CACHE`` if set, else in a folder of this process removed at exit), and
loads it with :mod:`ctypes`.  :class:`Kernel` runs one kernel at a grid and block size on NumPy arrays
(one launch at a time per library).  :func:`run_tsan` builds the same text with a C++ ``main``
under ThreadSanitizer and reports the data races between CUDA threads.  See README.md for what
is emulated and what is not.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from derive.codegen.compilers import _build

import numpy as np

__all__ = ["HEADER", "CXXFLAGS", "TSAN_FLAGS", "CompileError", "KernelError", "Param", "parse_kernels", "launch_wrappers",
           "build", "Library", "Kernel", "gxx_available", "tsan_available", "TsanRun", "run_tsan"]

HEADER = Path(__file__).with_name("block_semantics.h")
CXXFLAGS = ("-std=c++20", "-pthread", "-O2", "-fPIC", "-shared", "-Wall", "-Werror", "-Wno-unused-variable",
            "-Wno-unused-function", "-Wno-unused-but-set-variable")
TSAN_FLAGS = ("-std=c++20", "-pthread", "-O1", "-g", "-fsanitize=thread", "-Wall", "-Werror", "-Wno-unused-variable",
              "-Wno-unused-function", "-Wno-unused-but-set-variable")
# C type -> (NumPy dtype, ctypes type) of the scalar types a kernel argument may have
_TYPES = {
    "float": (np.float32, ctypes.c_float),
    "double": (np.float64, ctypes.c_double),
    "int": (np.int32, ctypes.c_int),
    "unsigned": (np.uint32, ctypes.c_uint),
    "unsigned int": (np.uint32, ctypes.c_uint),
    "long long": (np.int64, ctypes.c_longlong),
    "unsigned long long": (np.uint64, ctypes.c_ulonglong),
}
_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)\s*\{')
_PARAM = re.compile(r"^(const\s+)?(" + "|".join(sorted(map(re.escape, _TYPES), key=len, reverse=True)) +
                    r")\s*(\*)?\s*(?:__restrict__\s+)?(\w+)$")


class CompileError(RuntimeError):
    """g++ rejected the source; the message holds its output."""


class KernelError(RuntimeError):
    """A launch failed in the emulation: a deadlock, a shuffle outside what is emulated, a thread's exception."""


@dataclass(frozen=True)
class Param:
    """One kernel parameter: ``ctype`` (a key of the scalar types), pointer or not, const or not."""

    name: str
    ctype: str
    pointer: bool
    const: bool

    @property
    def c_text(self) -> str:
        return f"{'const ' if self.const else ''}{self.ctype}{'*' if self.pointer else ''} {self.name}"


def parse_kernels(source: str) -> dict[str, tuple[Param, ...]]:
    """The ``extern "C" __global__`` kernels of ``source``: name -> parameters, in order."""
    out = {}
    for match in _KERNEL.finditer(source):
        name, text = match.group(1), " ".join(match.group(2).split())
        params = []
        for piece in filter(None, (p.strip() for p in text.split(","))):
            m = _PARAM.match(piece)
            if m is None:
                raise ValueError(f"kernel {name}: parameter {piece!r} is not one the harness can pass")
            const, ctype, star, pname = m.groups()
            params.append(Param(pname, " ".join(ctype.split()), bool(star), bool(const)))
        out[name] = tuple(params)
    return out


def launch_wrappers(kernels: dict[str, tuple[Param, ...]]) -> str:
    """``extern "C" int NAME_launch(unsigned grid, unsigned block, args...)`` for each kernel."""
    lines = []
    for name, params in kernels.items():
        decl = "".join(", " + p.c_text for p in params)
        call = "".join(", " + p.name for p in params)
        lines.append(f'extern "C" int {name}_launch(unsigned grid, unsigned block{decl}) '
                     f"{{ return rg_host::launch({name}, dim3{{grid, 1, 1}}, dim3{{block, 1, 1}}{call}); }}")
    return "\n".join(lines) + "\n"


def gxx_available() -> bool:
    return shutil.which("g++") is not None


def _compile(text: str, name: str, flags=CXXFLAGS, suffix: str = ".so") -> Path:
    """g++ ``text`` with ``flags`` by :func:`derive.codegen.compilers._build` (cached under the hash of both, in
    ``$REGATTN_HOST_CACHE`` if set, else in a folder of this process removed at exit)."""
    if not gxx_available():
        raise CompileError("g++ is not on PATH")
    try:
        return _build(text, name, os.environ.get("REGATTN_HOST_CACHE") or None, flags, suffix)
    except RuntimeError as exc:
        raise CompileError(str(exc)) from None


class Kernel:
    """One kernel of a :class:`Library`: ``kernel(grid, block, *args)`` runs it.

    Pointer arguments are C-contiguous NumPy arrays of the parameter's type (writeable unless the
    parameter is ``const``); scalars are converted to the parameter's type.  Raises
    :class:`KernelError` with the emulation's message where the launch fails.
    """

    def __init__(self, library: Library, name: str, params: tuple[Param, ...]):
        self.library, self.name, self.params = library, name, params
        self._fn = getattr(library.cdll, f"{name}_launch")
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_uint, ctypes.c_uint] + [
            ctypes.c_void_p if p.pointer else _TYPES[p.ctype][1] for p in params
        ]

    def __call__(self, grid: int, block: int, *args) -> None:
        if len(args) != len(self.params):
            raise TypeError(f"{self.name} takes {len(self.params)} arguments, got {len(args)}")
        values = []
        for p, a in zip(self.params, args):
            dtype = np.dtype(_TYPES[p.ctype][0])
            if p.pointer:
                if not isinstance(a, np.ndarray) or a.dtype != dtype or not a.flags.c_contiguous:
                    raise TypeError(f"{self.name}: {p.name} must be a C-contiguous {dtype} array")
                if not p.const and not a.flags.writeable:
                    raise TypeError(f"{self.name}: {p.name} is written and must be writeable")
                values.append(a.ctypes.data)
            else:
                if dtype.kind in "iu" and not (np.iinfo(dtype).min <= int(a) <= np.iinfo(dtype).max):
                    raise OverflowError(f"{self.name}: {p.name} = {a} does not fit {p.ctype}")
                values.append(dtype.type(a).item())
        if self._fn(grid, block, *values) != 0:
            raise KernelError(f"{self.name}<<<{grid}, {block}>>>: {self.library.last_error()}")


class Library:
    """A compiled source: ``library[name]`` is the :class:`Kernel` called ``name``."""

    def __init__(self, path: Path, kernels: dict[str, tuple[Param, ...]]):
        self.path = path
        self.cdll = ctypes.CDLL(str(path))
        self.cdll.rg_host_last_error.restype = ctypes.c_char_p
        self.cdll.rg_host_set_timeout_ms.argtypes = [ctypes.c_longlong]
        self.cdll.rg_host_set_pin.argtypes = [ctypes.c_int]
        self.cdll.rg_host_release_threads.restype = None
        self.kernels = {name: Kernel(self, name, params) for name, params in kernels.items()}

    def __getitem__(self, name: str) -> Kernel:
        return self.kernels[name]

    def last_error(self) -> str:
        return self.cdll.rg_host_last_error().decode(errors="replace")

    def set_timeout(self, seconds: float) -> None:
        """How long a barrier may wait before the launch fails as a deadlock (20 s at first)."""
        self.cdll.rg_host_set_timeout_ms(int(seconds * 1000))

    def release_threads(self) -> None:
        """End the OS threads kept between launches (up to one per CUDA thread of the largest block run); the next
        launch starts new ones."""
        self.cdll.rg_host_release_threads()

    def set_pin(self, on: bool) -> None:
        """Whether each warp's threads share one CPU, the warps spread over the CPUs this process may use (at
        first), or the OS places every thread.  Pinned, a warp's shuffles wake no other CPU: about twice as fast."""
        self.cdll.rg_host_set_pin(int(on))


def build(source: str, name: str = "kernels") -> Library:
    """``block_semantics.h`` + ``source`` + launch wrappers for its kernels, compiled (or found in the cache) and loaded."""
    kernels = parse_kernels(source)
    if not kernels:
        raise ValueError('no extern "C" __global__ kernel in the source')
    text = f"// {HEADER.name}\n{HEADER.read_text()}\n// {name}\n{source}\n// launch wrappers\n{launch_wrappers(kernels)}"
    return Library(_compile(text, name), kernels)


def tsan_available() -> bool:
    """Whether g++ links a program with ThreadSanitizer here (libtsan installed)."""
    if not gxx_available():
        return False
    try:
        _compile("int main() { return 0; }\n", "tsan-probe", TSAN_FLAGS, ".tsan")
    except CompileError:
        return False
    return True


@dataclass(frozen=True)
class TsanRun:
    """A ThreadSanitizer run: exit status (66 where races were reported), output, and how many races."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def races(self) -> int:
        return self.stderr.count("WARNING: ThreadSanitizer: data race")


def run_tsan(source: str, main: str, name: str, *argv: str, timeout: float = 120) -> TsanRun:
    """``block_semantics.h`` + ``source`` + ``main`` (a C++ ``main`` calling ``rg_host::launch``) built with
    ThreadSanitizer and run: every pair of accesses of the CUDA threads to one address that no barrier,
    shuffle or launch orders is reported as a data race."""
    text = f"// {HEADER.name}\n{HEADER.read_text()}\n// {name}\n{source}\n// main\n{main}"
    exe = _compile(text, name, TSAN_FLAGS, ".tsan")
    env = {**os.environ, "TSAN_OPTIONS": "halt_on_error=0 exitcode=66 history_size=2"}
    proc = subprocess.run([str(exe), *argv], capture_output=True, text=True, timeout=timeout, env=env)
    return TsanRun(proc.returncode, proc.stdout, proc.stderr)
