"""Compile generated CUDA source without a GPU: NVRTC to PTX, and g++ for the host.

* :func:`nvrtc_compile` runs NVRTC through the ``cuda-bindings`` and
  ``nvidia-cuda-nvrtc`` wheels (extra ``cuda``); no device or driver is needed.
  CuPy's own compile API needs a device, so this is what CI uses.
* :func:`host_library` compiles the *device* part of a module
  (``CUDA_DEVICE_SOURCE``) with g++ behind a header that empties
  ``__device__``/``__forceinline__``, adds ``extern "C"`` wrappers for float
  and double, and loads the result with :mod:`ctypes`, so tests can call the
  very functions the kernels call.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "NvrtcResult",
    "nvrtc_available",
    "nvrtc_compile",
    "host_library",
    "host_kernels",
    "HOST_HEADER",
    "HOST_EMULATION_HEADER",
]

ARCHES = ("compute_80", "compute_90")

HOST_HEADER = """// host build of regattn device functions
#include <cmath>
#define __device__
#define __forceinline__ inline
"""


# The kernels themselves on the host: one block of one thread, so the block
# reductions are the identity and each kernel walks its rows sequentially.
HOST_EMULATION_HEADER = HOST_HEADER + """#define __global__
#define __shared__ static
#define REGATTN_HOST_EMULATION
struct rg_dim3 { unsigned x; };
static const rg_dim3 threadIdx = {0}, blockIdx = {0}, blockDim = {1}, gridDim = {1};
static inline void __syncthreads() {}
template <typename T> T rg_block_sum(T v, T*) { return v; }
template <typename T> T rg_block_max(T v, T*) { return v; }
"""


@dataclass(frozen=True)
class NvrtcResult:
    """Outcome of one NVRTC compilation."""

    arch: str
    ok: bool
    log: str
    ptx_size: int


def nvrtc_available() -> bool:
    """Whether ``cuda.bindings.nvrtc`` imports and can create a program."""
    try:
        from cuda.bindings import nvrtc

        err, _ = nvrtc.nvrtcVersion()[0], None
        return err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    except Exception:  # ImportError, or a wheel without its shared library
        return False


def nvrtc_compile(source: str, arch: str = "compute_80", name: str = "regattn.cu") -> NvrtcResult:
    """Compile ``source`` to PTX for ``arch`` with NVRTC; never raises on a compile error.

    Raises
    ------
    ImportError
        If the ``cuda-bindings`` / ``nvidia-cuda-nvrtc`` wheels are not installed.
    """
    from cuda.bindings import nvrtc

    ok_code = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if err != ok_code:
        raise RuntimeError(f"nvrtcCreateProgram failed: {err}")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        ptx_size = 0
        if result == ok_code:
            err, ptx_size = nvrtc.nvrtcGetPTXSize(prog)
        return NvrtcResult(arch, result == ok_code, log.decode(errors="replace").strip("\x00 \n"), int(ptx_size))
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


_CTYPE = {"float": ctypes.c_float, "double": ctypes.c_double}


def host_library(
    device_source: str,
    prefix: str,
    functions: dict[str, int],
    cache_dir: str | os.PathLike | None = None,
) -> dict[str, dict[str, object]]:
    """Compile ``device_source`` for the host and return callables.

    Parameters
    ----------
    device_source:
        A module's ``CUDA_DEVICE_SOURCE``.
    prefix:
        The map's name (device functions are ``{prefix}_{function}``).
    functions:
        Function name (without prefix) -> number of arguments (parameters included).
    cache_dir:
        Where to keep the shared library (keyed by a hash of the source); by
        default one temporary directory per process, removed when the process
        exits.

    Returns
    -------
    ``{"float": {name: f}, "double": {name: f}}`` with ``f`` taking and returning
    Python floats, computed in that C type.
    """
    wrappers = []
    for ctype in ("float", "double"):
        for fname, nargs in functions.items():
            args = ", ".join(f"{ctype} a{j}" for j in range(nargs))
            call = ", ".join(f"a{j}" for j in range(nargs))
            wrappers.append(
                f'extern "C" {ctype} host_{fname}_{ctype}({args}) {{ return {prefix}_{fname}<{ctype}>({call}); }}'
            )
    text = HOST_HEADER + device_source + "\n" + "\n".join(wrappers) + "\n"
    lib_path = _build(text, prefix, cache_dir)
    lib = ctypes.CDLL(str(lib_path))
    out: dict[str, dict[str, object]] = {}
    for ctype in ("float", "double"):
        table = {}
        for fname, nargs in functions.items():
            fn = getattr(lib, f"host_{fname}_{ctype}")
            fn.restype = _CTYPE[ctype]
            fn.argtypes = [_CTYPE[ctype]] * nargs
            table[fname] = fn
        out[ctype] = table
    return out


_DEFAULT_CACHE: list[Path] = []
_DEFAULT_CACHE_LOCK = threading.Lock()


def _default_cache() -> Path:
    """This process's build folder: created on first use, removed (with its libraries) at exit."""
    with _DEFAULT_CACHE_LOCK:
        if not _DEFAULT_CACHE:
            folder = Path(tempfile.mkdtemp(prefix="regattn-host-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            _DEFAULT_CACHE.append(folder)
        return _DEFAULT_CACHE[0]


#: g++ flags of the host builds of generated CUDA (a shared library)
HOST_FLAGS = ("-O2", "-std=c++17", "-fPIC", "-shared", "-Wall", "-Werror", "-Wno-unused-variable",
              "-Wno-unused-function")


def _build(text: str, prefix: str, cache_dir, flags=HOST_FLAGS, suffix: str = ".so") -> Path:
    """g++ ``text`` with ``flags`` into a file named by the hash of both (reused when present); ``suffix``
    names the output (a shared library, or a program where ``flags`` make one)."""
    if shutil.which("g++") is None:
        raise RuntimeError("g++ is not on PATH; the host build of generated CUDA needs it")
    digest = hashlib.sha256("\0".join([text, *flags]).encode()).hexdigest()[:16]
    folder = Path(cache_dir) if cache_dir is not None else _default_cache()
    folder.mkdir(parents=True, exist_ok=True)
    lib_path = folder / f"{prefix}-{digest}{suffix}"
    if not lib_path.exists():
        # per-process names for the source and the output being built: processes sharing a folder never
        # read each other's half-written files
        src = folder / f"{prefix}-{digest}.{os.getpid()}.cpp"
        src.write_text(text)
        tmp = folder / f"{prefix}-{digest}.{os.getpid()}{suffix}"
        proc = subprocess.run(["g++", *flags, "-o", str(tmp), str(src)], capture_output=True, text=True)
        if proc.returncode != 0:  # the source stays for the error's line numbers
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"g++ {' '.join(flags)} failed on {prefix} (source kept at {src}):\n"
                               f"{proc.stdout}{proc.stderr}")
        src.unlink(missing_ok=True)
        os.replace(tmp, lib_path)
    return lib_path


def host_kernels(cuda_source: str, prefix: str, cache_dir: str | os.PathLike | None = None) -> ctypes.CDLL:
    """Compile a module's whole ``CUDA_SOURCE`` for the host under :data:`HOST_EMULATION_HEADER`.

    Each ``extern "C"`` kernel becomes a C function with the same arguments,
    running one row after another on one thread; set ``argtypes`` before calling.
    """
    return ctypes.CDLL(str(_build(HOST_EMULATION_HEADER + cuda_source, prefix, cache_dir)))
