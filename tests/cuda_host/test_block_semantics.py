"""The CUDA kernels run on the host with the semantics of CUDA blocks (tests/cuda_host/harness.py).

(a) The emulated primitives against closed forms: block sums and maxima at 256 threads (hand-written and
the generated ``rg_block_sum`` / ``rg_block_max``), ``__shfl_down_sync`` lane by lane, ``__syncthreads``,
``__shared__`` memory per block, exited threads, and the errors the emulation reports.

(b) Each map's generated ``forward_rows``, ``forward_from_tau`` and ``jvp`` kernels, compiled from the
module's own ``CUDA_SOURCE`` (the real reductions, not the one-thread host emulation), at 256 threads per
block with fewer blocks than rows, against numeric's NumPy maps.

(c) The same sources under ThreadSanitizer: a missing ``__syncthreads`` is reported, the generated kernels
have no race (marked slow).
"""

from __future__ import annotations

import math
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import numeric as nm
from numeric.contract import CUDA_THREADS
from numeric.kernels import cuda_file
from tests.numeric.conftest import importable_user_maps
from tests.profile import crossed

from . import harness as H

if shutil.which("g++") is None:
    pytest.skip("g++ is not on PATH: the CUDA host harness compiles the kernels with it", allow_module_level=True)

THREADS = CUDA_THREADS  # 256: what every generated kernel is written for
PRELUDE, REDUCTIONS = cuda_file("prelude.cuh"), cuda_file("reductions.cuh")

# ---------------------------------------------------------------------------------------------------------------
# (a) the primitives

PRIMITIVES = r"""
// block sum and max written here, by hand: shuffle within each warp, one slot per warp in shared memory
extern "C" __global__ void hand_sum_max(const double* x, double* sum, double* mx) {
    __shared__ double part_sum[32];
    __shared__ double part_max[32];
    const unsigned t = threadIdx.x, lane = t % 32, warp = t / 32, warps = blockDim.x / 32;
    double s = x[blockIdx.x * blockDim.x + t], m = s;
    for (unsigned o = 16; o > 0; o /= 2) {
        s += __shfl_down_sync(0xffffffffu, s, o);
        m = fmax(m, __shfl_down_sync(0xffffffffu, m, o));
    }
    if (lane == 0) { part_sum[warp] = s; part_max[warp] = m; }
    __syncthreads();
    if (t == 0) {
        double a = 0, b = part_max[0];
        for (unsigned w = 0; w < warps; ++w) { a += part_sum[w]; b = fmax(b, part_max[w]); }
        sum[blockIdx.x] = a; mx[blockIdx.x] = b;
    }
}

// the package's block reductions (numeric/kernels/reductions.cuh), every thread storing what it got
extern "C" __global__ void generated_sum_max(const double* x, double* sum, double* mx) {
    __shared__ double shared[32];
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    double v = x[i];
    sum[i] = rg_block_sum(v, shared);
    mx[i] = rg_block_max(v, shared);
}

""" + "".join(f"""
extern "C" __global__ void shfl_{tag}(const {T}* x, {T}* out, unsigned delta) {{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = __shfl_down_sync(0xffffffffu, x[i], delta);
}}
""" for tag, T in [("i32", "int"), ("u32", "unsigned"), ("i64", "long long"), ("f32", "float"), ("f64", "double")]) + r"""
// many shuffles in a row, each lane with its own delta: v <- shfl(v, delta[round][lane]) * 3 + round
extern "C" __global__ void shfl_chain(const long long* x, const unsigned* delta, long long* out, int rounds) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    long long v = x[i];
    for (int r = 0; r < rounds; ++r) v = __shfl_down_sync(0xffffffffu, v, delta[r * blockDim.x + threadIdx.x]) * 3 + r;
    out[i] = v;
}

// write shared, sync, read a neighbour's slot (across warps too); rounds reuse the same slots
extern "C" __global__ void neighbours(long long* out, int rounds, int shift) {
    __shared__ long long slot[1024];
    const unsigned t = threadIdx.x, n = blockDim.x;
    long long acc = 0;
    for (int r = 0; r < rounds; ++r) {
        slot[t] = 1000000LL * blockIdx.x + 1000LL * r + t;
        __syncthreads();
        acc = acc * 7 + slot[(t + shift * (r + 1)) % n];
        __syncthreads();
    }
    out[blockIdx.x * n + t] = acc;
}

// what a block finds in shared memory before writing it: each block reads, then writes its number
extern "C" __global__ void shared_fresh(double* seen_f64, int* seen_i32) {
    __shared__ double d[256];
    __shared__ int k[256];
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    seen_f64[i] = d[threadIdx.x];
    seen_i32[i] = k[threadIdx.x];
    __syncthreads();
    d[threadIdx.x] = blockIdx.x;
    k[threadIdx.x] = blockIdx.x;
}

// threads at or past `stay` return at once; the others go through barriers and shuffles without them
extern "C" __global__ void early_exit(int* out, unsigned stay) {
    __shared__ int slot[1024];
    const unsigned t = threadIdx.x;
    if (t >= stay) return;
    slot[t] = t + 1;
    __syncthreads();
    int v = slot[(t + 1) % stay];
    __syncthreads();
    out[t] = v;
}

// lanes 0-15 of warp 0 shuffle before the barrier, every other thread after it: a deadlock
extern "C" __global__ void deadlock(int* out) {
    int v = threadIdx.x;
    if (threadIdx.x < 16) v = __shfl_down_sync(0xffffffffu, v, 1);
    __syncthreads();
    if (threadIdx.x >= 16 && threadIdx.x < 32) v = __shfl_down_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

// the same without the barrier: thread t reads slot t + 1 while thread t + 1 may be writing it (a race)
extern "C" __global__ void racy_neighbours(long long* out) {
    __shared__ long long slot[1024];
    slot[threadIdx.x] = threadIdx.x;
    out[blockIdx.x * blockDim.x + threadIdx.x] = slot[(threadIdx.x + 1) % blockDim.x];
}

extern "C" __global__ void half_mask(int* out) {
    out[threadIdx.x] = __shfl_down_sync(0x0000ffffu, (int)threadIdx.x, 1);
}
"""


@pytest.fixture(scope="module")
def prims():
    lib = H.build(PRELUDE + REDUCTIONS + PRIMITIVES, "primitives")
    yield lib
    lib.release_threads()


def _ids(blocks, threads):
    return np.arange(blocks * threads)


@pytest.mark.parametrize("threads", [32, 256, 1024])
def test_hand_written_block_sum_and_max(prims, threads):
    blocks = 3
    i = _ids(blocks, threads)
    x = ((i * 97) % 1009 + 0.5).astype(np.float64)  # distinct per thread, the maximum nowhere in particular
    s, m = np.zeros(blocks), np.zeros(blocks)
    prims["hand_sum_max"](blocks, threads, x, s, m)
    per_block = x.reshape(blocks, threads)
    # exact: integers + 0.5, sums far below 2**53
    np.testing.assert_array_equal(s, per_block.sum(axis=1))
    np.testing.assert_array_equal(m, per_block.max(axis=1))


@pytest.mark.parametrize("pin", [True, False], ids=["warps-pinned", "threads-anywhere"])
def test_generated_block_sum_and_max_closed_form(prims, pin):
    blocks = 2
    t = np.tile(np.arange(THREADS), blocks)
    b = np.repeat(np.arange(blocks), THREADS)
    x = (1000.0 * b + (t * 37) % THREADS + 1).astype(np.float64)  # a permutation of 1..256 (+1000 b) per block
    s, m = np.empty_like(x), np.empty_like(x)
    prims.set_pin(pin)
    try:
        prims["generated_sum_max"](blocks, THREADS, x, s, m)
    finally:
        prims.set_pin(True)
    want_sum = 1000.0 * THREADS * b + THREADS * (THREADS + 1) / 2  # every thread gets its block's result
    want_max = 1000.0 * b + THREADS
    np.testing.assert_array_equal(s, want_sum)
    np.testing.assert_array_equal(m, want_max)


def test_generated_block_max_propagates_nan_and_sum_of_infinities(prims):
    x = np.zeros(2 * THREADS)
    x[200] = np.nan  # block 0, warp 6
    x[THREADS + 77] = -np.inf  # block 1: sum -inf, max still 0
    s, m = np.empty_like(x), np.empty_like(x)
    prims["generated_sum_max"](2, THREADS, x, s, m)
    assert np.isnan(s[:THREADS]).all() and np.isnan(m[:THREADS]).all()
    assert (s[THREADS:] == -np.inf).all() and (m[THREADS:] == 0).all()


SHUFFLE_TYPES = {
    "shfl_i32": lambda i: (i * 7919 - 3000000).astype(np.int32),
    "shfl_u32": lambda i: (i * 2654435761 % 2**32).astype(np.uint32),
    "shfl_i64": lambda i: i.astype(np.int64) * 3 * 10**12 - 5,  # beyond 32 bits: the whole value travels
    "shfl_f32": lambda i: (i * 0.37 - 41.0).astype(np.float32),
    "shfl_f64": lambda i: i * (1 / 3) - 1e9,
}


def _shfl_down(x, delta, width=32):
    """``__shfl_down_sync`` by its definition: lane l of each warp gets lane l+delta's value if l+delta < 32."""
    lane = np.arange(x.size) % width
    src = np.where(lane + delta < width, np.arange(x.size) + delta, np.arange(x.size))
    return x[src]


@pytest.mark.parametrize("kernel", list(SHUFFLE_TYPES))
@pytest.mark.parametrize("delta", [0, 1, 5, 16, 31, 32])
def test_shfl_down_per_lane(prims, kernel, delta):
    blocks = 2
    x = SHUFFLE_TYPES[kernel](_ids(blocks, THREADS))
    out = np.zeros_like(x)
    prims[kernel](blocks, THREADS, x, out, delta)
    want = _shfl_down(x, delta)
    np.testing.assert_array_equal(out, want)
    lane = np.arange(x.size) % 32
    # lanes whose source is past the warp keep their own value; the others take a value from their own warp
    np.testing.assert_array_equal(out[lane + delta >= 32], x[lane + delta >= 32])
    if 0 < delta < 32:
        assert not np.array_equal(out, x)


def test_shfl_chain_of_rounds_with_per_lane_deltas(prims):
    blocks, rounds = 2, 30  # |v| < 1000 * 3**30: no overflow
    rng = np.random.default_rng(5)
    x = rng.integers(-1000, 1000, blocks * THREADS).astype(np.int64)
    delta = rng.integers(0, 40, (rounds, THREADS)).astype(np.uint32)  # some past the warp
    out = np.zeros_like(x)
    prims["shfl_chain"](blocks, THREADS, x, np.ascontiguousarray(delta), out, rounds)
    v = x.copy()
    lane = np.arange(v.size) % 32
    for r in range(rounds):
        d = np.tile(delta[r], blocks).astype(np.int64)
        src = np.where(lane + d < 32, np.arange(v.size) + d, np.arange(v.size))
        v = v[src] * 3 + r
    np.testing.assert_array_equal(out, v)


@pytest.mark.parametrize("threads, shift", [(256, 1), (256, 33), (1024, 100), (96, 5)])
def test_syncthreads_orders_shared_memory(prims, threads, shift):
    blocks, rounds = 2, 6
    out = np.zeros(blocks * threads, dtype=np.int64)
    prims["neighbours"](blocks, threads, out, rounds, shift)
    t = np.arange(threads)
    for b in range(blocks):
        acc = np.zeros(threads, dtype=np.int64)
        for r in range(rounds):
            acc = acc * 7 + 1000000 * b + 1000 * r + (t + shift * (r + 1)) % threads
        np.testing.assert_array_equal(out[b * threads:(b + 1) * threads], acc)


def test_shared_memory_is_fresh_for_each_block(prims):
    blocks = 3
    f, k = np.zeros(blocks * THREADS), np.zeros(blocks * THREADS, dtype=np.int32)
    prims["shared_fresh"](blocks, THREADS, f, k)
    # never the previous block's numbers: the launcher fills shared memory with 0xff bytes before each block
    assert np.isnan(f).all()
    assert (k == -1).all()


def test_exited_threads_count_as_arrived(prims):
    out = np.zeros(THREADS, dtype=np.int32)
    prims["early_exit"](1, THREADS, out, 100)
    t = np.arange(100)
    np.testing.assert_array_equal(out[:100], (t + 1) % 100 + 1)
    assert (out[100:] == 0).all()


def test_deadlock_is_an_error_not_a_hang(prims):
    prims.set_timeout(0.3)
    try:
        with pytest.raises(H.KernelError, match=r"deadlock.*threads 0-15: __shfl_down_sync; threads 16-255: __syncthreads"):
            prims["deadlock"](1, THREADS, np.zeros(THREADS, dtype=np.int32))
    finally:
        prims.set_timeout(20)
    # the library is usable afterwards
    out = np.zeros(THREADS, dtype=np.int32)
    prims["early_exit"](1, THREADS, out, THREADS)
    np.testing.assert_array_equal(out, np.arange(1, THREADS + 1) % THREADS + 1)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc/self/task")
def test_threads_are_kept_between_launches_until_released(prims):
    def threads():
        return len(os.listdir("/proc/self/task"))

    out = np.zeros(THREADS, dtype=np.int32)
    prims["early_exit"](1, THREADS, out, THREADS)
    kept = threads()
    prims.release_threads()
    base = threads()
    assert base <= kept - THREADS
    prims["early_exit"](1, THREADS, out, THREADS)  # THREADS new threads
    assert threads() == base + THREADS
    np.testing.assert_array_equal(out, np.arange(1, THREADS + 1) % THREADS + 1)


def test_shuffles_outside_the_emulation_are_errors(prims):
    with pytest.raises(H.KernelError, match="leaves out lanes"):
        prims["half_mask"](1, 64, np.zeros(64, dtype=np.int32))
    with pytest.raises(H.KernelError, match="names lanes that do not exist"):  # a full mask in a warp of 16
        prims["shfl_i32"](1, 48, np.zeros(48, dtype=np.int32), np.zeros(48, dtype=np.int32), 1)


def test_arguments_are_checked(prims):
    x = np.zeros(THREADS)
    with pytest.raises(TypeError, match="float64"):
        prims["hand_sum_max"](1, THREADS, x.astype(np.float32), np.zeros(1), np.zeros(1))
    with pytest.raises(TypeError, match="takes 3 arguments"):
        prims["hand_sum_max"](1, THREADS, x, np.zeros(1))
    with pytest.raises(TypeError, match="writeable"):
        prims["hand_sum_max"](1, THREADS, x, np.zeros(1), _readonly(1))
    with pytest.raises(H.KernelError, match="1-D launches"):
        prims["hand_sum_max"](1, 2048, np.zeros(2048), np.zeros(1), np.zeros(1))


def _readonly(n):
    a = np.zeros(n)
    a.flags.writeable = False
    return a


def test_compile_errors_carry_the_compiler_output():
    with pytest.raises(H.CompileError, match="undeclared|not declared"):
        H.build('extern "C" __global__ void broken(int* x) { x[0] = missing; }', "broken")


def test_kernel_signatures_are_parsed():
    src = 'extern "C" __global__ void k(const float* a, double* __restrict__ b,\n long long n, unsigned m) {}'
    (params,) = H.parse_kernels(src).values()
    assert [(p.name, p.ctype, p.pointer, p.const) for p in params] == [
        ("a", "float", True, True), ("b", "double", True, False), ("n", "long long", False, False),
        ("m", "unsigned", False, False)]


# ---------------------------------------------------------------------------------------------------------------
# (b) the generated kernels

MAPS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax_sparse", {"alpha": 1.3}),
        ("entmax_sparse", {"alpha": 1.7}), ("entmax_dense", {"alpha": 0.6}),
        ("shannon_gini", {}), ("gini_log1p", {})]  # user maps (tests/numeric/conftest.py USER), Newton links: the KKT solve, dense and sparse
MAP_IDS = [name + "".join(f"-{k}{v}" for k, v in params.items()) for name, params in MAPS]
SIZES = [1, 37, 255, 256, 257, 1000]  # shorter than, one short of, equal to, one past and longer than the block
ROWS, GRID = 3, 2  # fewer blocks than rows: block 0 takes rows 0 and 2 through the grid-stride loop
DTYPES = {"f64": np.float64, "f32": np.float32}

# float64: the kernels and numeric's NumPy maps compute the same quantities in different orders; 1e-12
F64_TOL = 1e-12

# float32.  Both sides get the same float32 scores (and parameters rounded to float32), so the difference is
# the kernel's float32 arithmetic alone; u = 2**-24.  Scores lie in [-2, 2] (a range R <= 4).
#  * A block sum adds ceil(n/256) terms in each thread, then 8 tree levels (5 shuffles, 3 over the warps'
#    partial sums): error <= (ceil(n/256) + 8) u sum|terms| (first order, Higham 2002, 4.2).
#  * One term g(s_j - tau): rounding z = s_j - tau moves it by w_j u |z_j|, w = g' = 1/omega'' (<= 1 for every
#    map here); w_j |z_j| <= 13 p_j (softmax: |z| <= R + log n <= 11; sparsemax w z = p; entmax15 2p; alpha-entmax
#    p / (alpha - 1) <= 3.4 p; shannon_gini p |z| / (1 + p), |z| <= R + log n + 2); evaluating g costs at most
#    8 u p_j (a few libm calls within an ulp each, or the Newton link's few-eps stop).  So the computed
#    f(tau) = sum_j g(s_j - tau) - 1 is off by df <= (ceil(n/256) + 8 + 13 + 8) u (the terms sum to 1).
#  * The threshold then sits within df / sum_j w_j of the exact one, and an iteration stops within
#    2 u (1 + |tau|) <= 32 u (|tau| <= 2 + 13): p_j moves by at most (w_j / sum w) df + w_j 32 u <= df + 32 u.
#    (The sort maps' support formula takes tau from sums of x and x**2 over the support, x = s - max s, |x| <= W,
#    W <= 2 the support's width: its cancellation costs about 2 W h u <= 4 h u, h = ceil(n/256) + 8, within df.)
#  * p_j's own term: (13 + 8) u p_j <= 21 u; dividing by the computed sum (1 within df + u): another df + u.
#    Total: |p32_j - p_j| <= 2 df + 54 u.
# The JVP, J v = w (v - mean), mean = sum w v / sum w, on the same float32 p and v (|v| <= 1, w <= 1): w_j is off
# by 8 u w_j (sqrt, pow, a division); with h = ceil(n/256) + 8, sum w by (h + 8) u sum w and sum w v by (h + 9) u
# sum w|v| (<= sum w), so the mean (|mean| <= 1) by (2 h + 18) u; v_j - mean (|.| <= 2) adds 2 u, w_j's error 16 u,
# the product 2 u: |out32_j - out_j| <= w_j (2 h + 38) u <= (2 ceil(n/256) + 54) u.
U32 = 2.0**-24


def _f32_df(n: int) -> float:
    return math.ceil(n / THREADS) + 8 + 13 + 8


def f32_tol_forward(n: int) -> float:
    return (2 * _f32_df(n) + 54) * U32


def f32_tol_tau(n: int) -> float:
    """The threshold itself: sum_j w_j >= 1/2 for every map here (sum w >= sum p = 1, or p / (1 + p) >= p / 2 for
    shannon_gini), so the root is off by at most 2 df + 32 u, and rounding the reference to float32 adds |tau| u
    <= 15 u."""
    return (2 * _f32_df(n) + 47) * U32


def f32_tol_jvp(n: int) -> float:
    return (2 * math.ceil(n / THREADS) + 54) * U32


@pytest.fixture(scope="module")
def user_maps(tmp_path_factory):
    with importable_user_maps(tmp_path_factory.mktemp("cuda_host_usermaps")) as folder:
        yield folder


@pytest.fixture(scope="module")
def libraries(user_maps):
    """One compiled library per map module (two g++ at a time)."""
    modules = {name: nm.get_map(name, **params).module for name, params in MAPS}
    with ThreadPoolExecutor(2) as pool:
        built = {name: pool.submit(H.build, mod.CUDA_SOURCE, name) for name, mod in modules.items()}
        libs = {name: fut.result() for name, fut in built.items()}
    yield libs
    for lib in libs.values():
        lib.release_threads()


def _case(name, params, suffix, libraries):
    dtype = DTYPES[suffix]
    # the reference map at the parameters the kernel gets (rounded to its dtype)
    cast = {k: float(dtype(v)) for k, v in params.items()}
    return dtype, nm.get_map(name, **cast), [dtype(v) for v in cast.values()], libraries[name]


def _scores(n, dtype, seed=0):
    """ROWS rows of n scores in [-2, 2]: row 0 with every 5th score from 1 on masked, row 1 fully masked,
    row 2 with a NaN."""
    rng = np.random.default_rng(seed + n)
    s = rng.uniform(-2, 2, (ROWS, n))
    s[0, 1::5] = -np.inf
    s[1] = -np.inf
    s[2, n // 2] = np.nan
    return s.astype(dtype)


def _tol(suffix, n, kind):
    if suffix == "f64":
        return F64_TOL
    return f32_tol_forward(n) if kind == "forward" else f32_tol_jvp(n)


# (each block's threads run as host threads, so a forward row costs about 0.3 s: the CI profile runs each map at three
# of the (size, dtype) pairs and each pair with two maps, the thorough one every triple)
FORWARD = crossed(zip(MAP_IDS, MAPS), [(n, suffix) for n in SIZES for suffix in DTYPES], per=3)


@pytest.mark.parametrize("name, params, n, suffix", [(*m, *case) for (_, m), case in FORWARD],
                         ids=[f"{i}-{n}-{suffix}" for (i, _), (n, suffix) in FORWARD])
def test_forward_rows(libraries, name, params, n, suffix):
    dtype, ref, args, lib = _case(name, params, suffix, libraries)
    s = _scores(n, dtype)
    p, tau = np.full_like(s, 7.0), np.full(ROWS, 7.0, dtype=dtype)
    lib[f"{name}_forward_rows_{suffix}"](GRID, THREADS, s, p, tau, ROWS, n, *args)
    want, want_tau = ref.forward(s.astype(np.float64))
    tol = _tol(suffix, n, "forward")
    np.testing.assert_allclose(p[0], want[0], rtol=0, atol=tol)
    assert (p[0][np.isneginf(s[0])] == 0).all()  # masked: exactly 0
    assert (p[1] == 0).all() and tau[1] == np.inf  # fully masked row
    assert np.isnan(p[2]).all() and np.isnan(tau[2])  # NaN row
    assert abs(float(p[0].astype(np.float64).sum()) - 1) <= n * tol
    # the threshold, written by thread 0, is numeric's: p_j = g_+(s_j - tau)
    tau_tol = F64_TOL * (1 + abs(want_tau[0])) if suffix == "f64" else f32_tol_tau(n)
    assert abs(tau[0] - want_tau[0]) <= tau_tol


@pytest.mark.parametrize("suffix", list(DTYPES))
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name, params", MAPS, ids=MAP_IDS)
def test_forward_from_tau(libraries, name, params, n, suffix):
    dtype, ref, args, lib = _case(name, params, suffix, libraries)
    s = _scores(n, dtype, seed=1)
    want, tau = ref.forward(s.astype(np.float64))
    out = np.full_like(s, 7.0)
    lib[f"{name}_forward_from_tau_{suffix}"](GRID, THREADS, s, tau.astype(dtype), out, ROWS, n, *args)
    np.testing.assert_allclose(out[0], want[0], rtol=0, atol=_tol(suffix, n, "forward"))
    assert (out[0][np.isneginf(s[0])] == 0).all()
    assert (out[1] == 0).all()
    assert np.isnan(out[2]).all()


def _jvp_inputs(ref, n, dtype):
    """p of three rows (masked scores, fully masked, plain scores) in the kernel's dtype, and v in [-1, 1]."""
    rng = np.random.default_rng(100 + n)
    s = rng.uniform(-2, 2, (ROWS, n))
    s[0, 1::5] = -np.inf
    s[1] = -np.inf
    p = ref(s).astype(dtype)
    v = rng.uniform(-1, 1, (ROWS, n)).astype(dtype)
    return p, v


@pytest.mark.parametrize("suffix", list(DTYPES))
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name, params", MAPS, ids=MAP_IDS)
def test_jvp(libraries, name, params, n, suffix):
    dtype, ref, args, lib = _case(name, params, suffix, libraries)
    p, v = _jvp_inputs(ref, n, dtype)
    out = np.full_like(p, 7.0)
    lib[f"{name}_jvp_{suffix}"](GRID, THREADS, p, v, out, ROWS, n, *args)
    want = ref.jvp(p.astype(np.float64), v.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=0, atol=_tol(suffix, n, "jvp"))
    assert (out[1] == 0).all()
    assert (out[0][p[0] == 0] == 0).all()
    # J is a tangent of the simplex: each row of J v sums to 0
    assert abs(float(out[0].astype(np.float64).sum())) <= n * _tol(suffix, n, "jvp")


@pytest.mark.parametrize("name, params", MAPS, ids=MAP_IDS)
def test_jvp_of_a_nan_row_is_nan(libraries, name, params):
    """A row of NaN probabilities gives a NaN JVP, as numeric's NumPy jvp (w = p > 0 ? weight(p) : 0 took NaN for
    off the support: sum(w) = 0 and J v = 0)."""
    dtype, ref, args, lib = _case(name, params, "f64", libraries)
    p = np.full((1, 37), np.nan)
    v = np.ones_like(p)
    out = np.zeros_like(p)
    lib[f"{name}_jvp_f64"](1, THREADS, p, v, out, 1, 37, *args)
    assert np.isnan(out).all()  # (numeric's NumPy jvp agrees except for sparsemax: tests/numeric/test_nan_rows.py)


# ---------------------------------------------------------------------------------------------------------------
# (c) races: the same sources under ThreadSanitizer, which reports any two accesses of the CUDA threads to one
# address that no barrier, shuffle or launch orders (the emulated barriers are atomics it follows)

TSAN_MAIN = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
static void check(int rc) {
    if (rc) { std::fprintf(stderr, "launch failed: %s\n", rg_host_last_error()); std::exit(3); }
}
// ROWS x COLS rows as the kernel tests have them: row 0 with masked scores, row 1 fully masked, row 2 a NaN
struct Rows {
    long long rows = 3, cols = 300;
    std::vector<double> s, p, tau, v, out;
    Rows() : s(rows * cols), p(rows * cols), tau(rows), v(rows * cols), out(rows * cols) {
        for (long long i = 0; i < rows * cols; ++i) { s[i] = 2 * std::sin(0.37 * i); v[i] = std::cos(0.11 * i); }
        for (long long j = 1; j < cols; j += 5) s[j] = -INFINITY;
        for (long long j = 0; j < cols; ++j) s[cols + j] = -INFINITY;
        s[2 * cols + cols / 2] = NAN;
    }
};
int main(int argc, char** argv) {
    const char* what = argc > 1 ? argv[1] : "";
    if (!std::strcmp(what, "racy")) {
        std::vector<long long> out(64);
        check(rg_host::launch(racy_neighbours, dim3{1}, dim3{64}, out.data()));
    } else if (!std::strcmp(what, "broken")) {
        std::vector<double> x(2 * 256, 1.5), sum(2 * 256), mx(2 * 256);
        check(rg_host::launch(broken_sum_max, dim3{2}, dim3{256}, x.data(), sum.data(), mx.data()));
    } else if (!std::strcmp(what, "clean")) {
        std::vector<long long> out(2 * 256);
        check(rg_host::launch(neighbours, dim3{2}, dim3{256}, out.data(), 3, 33));
        std::vector<double> x(2 * 256, 1.5), sum(2 * 256), mx(2 * 256);
        check(rg_host::launch(generated_sum_max, dim3{2}, dim3{256}, x.data(), sum.data(), mx.data()));
        check(rg_host::launch(hand_sum_max, dim3{2}, dim3{256}, x.data(), sum.data(), mx.data()));
    } else if (!std::strcmp(what, "maps")) {
MAP_CALLS
    } else {
        return 2;
    }
    rg_host_release_threads();
    std::puts("done");
}
"""


# the package's block reductions without the barrier between thread 0 writing the total to shared[0] and every
# thread reading it (a real race), renamed to live beside the originals
_WRITE_TOTAL = "    if (threadIdx.x == 0) shared[0] = v;\n"
assert REDUCTIONS.count(_WRITE_TOTAL + "    __syncthreads();\n") == 2
BROKEN_REDUCTIONS = (REDUCTIONS.replace(_WRITE_TOTAL + "    __syncthreads();\n", _WRITE_TOTAL)
                     .replace("REGATTN_REDUCTIONS", "BROKEN_REDUCTIONS").replace("rg_block_", "broken_block_")
                     .replace("rg_warp_", "broken_warp_"))
BROKEN_KERNEL = r"""
extern "C" __global__ void broken_sum_max(const double* x, double* sum, double* mx) {
    __shared__ double shared[32];
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    double v = x[i];
    sum[i] = broken_block_sum(v, shared);
    mx[i] = broken_block_max(v, shared);
}
"""


def _tsan_program():
    """The primitives, the broken reductions, every map's CUDA source (their preludes are guarded, their names
    prefixed) and a main that runs the float64 kernels of each map on rows as the tests above have them."""
    sources, calls = [PRELUDE + REDUCTIONS + PRIMITIVES + BROKEN_REDUCTIONS + BROKEN_KERNEL], []
    for name, params in MAPS:
        if name == "entmax_sparse" and params["alpha"] != 1.3:
            continue  # one alpha: the synchronisation does not depend on it
        sources.append(nm.get_map(name, **params).module.CUDA_SOURCE)
        extra = "".join(f", {float(v)!r}" for v in params.values())
        calls.append(f"""        {{ Rows r;
          check(rg_host::launch({name}_forward_rows_f64, dim3{{2}}, dim3{{256}}, r.s.data(), r.p.data(), r.tau.data(), r.rows, r.cols{extra}));
          check(rg_host::launch({name}_jvp_f64, dim3{{2}}, dim3{{256}}, r.p.data(), r.v.data(), r.out.data(), r.rows, r.cols{extra}));
          check(rg_host::launch({name}_forward_from_tau_f64, dim3{{2}}, dim3{{256}}, r.s.data(), r.tau.data(), r.out.data(), r.rows, r.cols{extra})); }}""")
    return "\n".join(sources), TSAN_MAIN.replace("MAP_CALLS", "\n".join(calls))


@pytest.fixture(scope="module")
def tsan(user_maps):
    if not H.tsan_available():
        pytest.skip("g++ cannot link with -fsanitize=thread here (libtsan missing)")
    source, main = _tsan_program()
    return lambda what: H.run_tsan(source, main, "tsan", what)


@pytest.mark.slow
def test_tsan_reports_a_missing_syncthreads_and_nothing_in_the_primitives(tsan):
    racy = tsan("racy")
    assert racy.returncode == 66 and racy.races >= 1, racy.stderr[-3000:]
    assert "racy_neighbours" in racy.stderr
    broken = tsan("broken")  # the generated reductions less one barrier
    assert broken.returncode == 66 and broken.races >= 1, broken.stderr[-3000:]
    assert "broken_block_" in broken.stderr
    clean = tsan("clean")
    assert clean.returncode == 0 and clean.races == 0 and "done" in clean.stdout, clean.stderr[-3000:]


@pytest.mark.slow
def test_generated_kernels_have_no_race(tsan):
    run = tsan("maps")
    assert run.returncode == 0 and run.races == 0 and "done" in run.stdout, run.stderr[-5000:]


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax_sparse"])
def test_newton_accepts_a_point_on_the_brackets_end(name):
    """The row kernels' safeguarded Newton takes a point on an end of the bracket (the root to rounding) as a
    Newton point: taken for outside, every later step was a bisection (42 steps for sparsemax at n = 1000 in a
    replica of the loop, where 3 do)."""
    import numeric as nm_
    from numeric.newton import NumpyOps, safeguarded_point

    # the kernels solve each row by numeric.core.rules.solve traced (numeric/_generated/rows_solve.py), whose
    # bracketed solves take their next point from numeric.newton.safeguarded_point: the same text, run here on NumPy
    source = nm_.get_map(name, **({"alpha": 1.3} if name == "entmax_sparse" else {})).module.CUDA_SOURCE
    assert "rg_solve_row(map, s + row * cols, p + row * cols, cols, shared, tau);" in source
    ops = NumpyOps(np.float64)
    lo, hi, x = np.array([1.0, 0.0, 0.0]), np.array([2.0, 1.0, 1.0]), np.array([1.0, 1.0, 1.0])
    # a Newton point on either end (the first at x itself: a step rounded to 0), and one that does not move
    # less than half as far as the step before last (a cycle across a kink): the midpoint
    new, took = safeguarded_point(ops, x, lo, hi, np.array([1.0, 3.0, 0.5]), np.array([1.0, 0.0, 0.0]),
                                  np.array([True, True, True]))
    assert took.tolist() == [True, True, False] and new.tolist() == [1.0, 0.0, 0.5]
