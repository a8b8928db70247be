// CUDA block semantics on the host: every CUDA thread of a block is an OS thread.
//
// Include this header once, before the CUDA source, in one translation unit compiled with
// g++ -std=c++20 -pthread (Linux: the barriers sleep on futexes).  It does NOT define
// REGATTN_HOST_EMULATION: the kernels' own block reductions (warp shuffles, shared memory,
// __syncthreads) compile and run as written.
//
// * threadIdx, blockIdx, blockDim, gridDim: thread_local values, set in each OS thread for each block;
// * __syncthreads(): a barrier over the block's threads that have not exited;
// * __shfl_down_sync(mask, v, delta) for any value of at most 8 bytes (int, unsigned, long long,
//   float, double): lane i gets lane i+delta's v inside its warp of 32, its own v where
//   i+delta >= 32.  The warp's threads write an exchange buffer, meet at a warp barrier, read
//   (two buffers, used in turn, so one barrier per shuffle suffices).  The mask must name exactly
//   the warp's existing lanes: a partial mask, a lane that does not exist, or reading a lane that
//   has exited or is at another shuffle is reported as an error, not guessed at;
// * __shared__: a static in the section "rg_shared".  Blocks run one after another, so each block
//   has the statics to itself; before each block the launcher fills the section with 0xff bytes
//   (NaN in float and double, -1 in integers), so shared memory read before it is written shows
//   up instead of holding the previous block's values.  (g++ drops the section of a static in a
//   template function: such __shared__ memory is per block too, but not refilled);
// * rg_host::launch(kernel, grid, block, args...): runs the blocks of a 1-D grid one after
//   another, each with `block` threads; returns 0, or 1 with the reason in rg_host_last_error().
//   Launches hold a lock: one at a time per library.  The OS threads are kept in a pool between
//   blocks and launches (each CUDA thread starts its block with fresh thread_local values) until
//   rg_host_release_threads();
//   pinned (the default), warp w runs on CPU w * ncpu / nwarps of those the launcher may use.
//
// A barrier that waits longer than the timeout (rg_host_set_timeout_ms, 20 s by default) is a
// deadlock (e.g. __syncthreads reached by part of the block while the rest waits in a shuffle):
// the block is stopped, every thread unwinds, and the error names where each thread was.
#ifndef RG_BLOCK_SEMANTICS_H
#define RG_BLOCK_SEMANTICS_H

#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __shared__ static __attribute__((section("rg_shared")))

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
struct uint3 {
    unsigned int x = 0, y = 0, z = 0;
};

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
inline constexpr int warpSize = 32;

namespace rg_host {

// thrown inside a CUDA thread to unwind its kernel once its block has failed
struct Aborted {};

inline std::atomic<long long> timeout_ms{20000};
inline std::atomic<bool> pin{true};
inline std::string last_error;

inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t value, const timespec* limit = nullptr) {
    static_assert(sizeof(std::atomic<std::uint32_t>) == 4, "a futex word is 4 bytes");
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, value, limit, nullptr, 0);
}
inline void futex_wake(std::atomic<std::uint32_t>& word, int count = INT_MAX) {
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr, 0);
}

enum Where : int { RUNNING = 0, AT_SYNCTHREADS = 1, AT_SHUFFLE = 2, EXITED = 3 };

struct Block;
void fail_block(Block& block, const std::string& why);
std::string thread_states(Block& block);

// A reusable barrier whose count drops when a thread exits (as a GPU counts exited threads as
// arrived), with a timeout, and that every waiter leaves (throwing Aborted) once the block fails.
// `state_` holds (expected << 32) | arrived, so an arrival and an exit never both complete a
// phase; `phase_` (the futex word) counts completed phases, its top bit marks a failed block.
class Barrier {
  public:
    static constexpr std::uint32_t FAILED = 0x80000000u;
    Barrier(Block* block, unsigned count) : block_(block), state_(std::uint64_t(count) << 32) {}

    void arrive_and_wait() {
        const std::uint32_t mine = phase_.load(std::memory_order_acquire);
        if (mine & FAILED) throw Aborted{};
        std::uint64_t s = state_.load();
        for (;;) {  // arrive; the thread that makes arrived == expected completes the phase
            const std::uint64_t expected = s >> 32, arrived = (s & 0xffffffffu) + 1;
            const std::uint64_t next = arrived == expected ? (expected << 32) : (expected << 32) | arrived;
            if (state_.compare_exchange_weak(s, next, std::memory_order_acq_rel)) {
                if (arrived == expected) {
                    complete();
                    return;
                }
                break;
            }
        }
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms.load());
        for (;;) {
            const std::uint32_t now = phase_.load(std::memory_order_acquire);
            if (now & FAILED) throw Aborted{};
            if (now != mine) return;
            const auto left = deadline - std::chrono::steady_clock::now();
            if (left <= std::chrono::nanoseconds(0)) {
                fail_block(*block_, "deadlock: a barrier waited more than " + std::to_string(timeout_ms.load()) +
                                        " ms with " + std::to_string(arrived()) + " of " + std::to_string(expected()) +
                                        " threads arrived (" + thread_states(*block_) + ")");
                throw Aborted{};
            }
            const long long ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
            const timespec limit{time_t(ns / 1000000000), long(ns % 1000000000)};
            futex_wait(phase_, mine, &limit);
        }
    }

    void arrive_and_drop() {
        std::uint64_t s = state_.load();
        for (;;) {  // one fewer expected; if everyone left has arrived, this completes the phase
            const std::uint64_t expected = (s >> 32) - 1, arrived = s & 0xffffffffu;
            const bool done = expected > 0 && arrived == expected;
            const std::uint64_t next = done ? (expected << 32) : (expected << 32) | arrived;
            if (state_.compare_exchange_weak(s, next, std::memory_order_acq_rel)) {
                if (done) complete();
                return;
            }
        }
    }

    void poison() {
        phase_.fetch_or(FAILED);
        futex_wake(phase_);
    }
    unsigned arrived() const { return unsigned(state_.load() & 0xffffffffu); }
    unsigned expected() const { return unsigned(state_.load() >> 32); }

  private:
    void complete() {
        phase_.fetch_add(1, std::memory_order_acq_rel);
        futex_wake(phase_);
    }
    Block* block_;
    std::atomic<std::uint64_t> state_;
    std::atomic<std::uint32_t> phase_{0};
};

struct Slot {
    alignas(8) unsigned char bytes[8];
    unsigned mask = 0;
    unsigned long long round = 0;  // how many shuffles this lane has made, this one included
};

struct Warp {
    Warp(Block* block, unsigned n) : bar(block, n), size(n) {}
    Barrier bar;
    unsigned size;     // existing lanes: 32, or fewer in the last warp of a block
    Slot slot[2][32];  // shuffle r uses slot[r % 2]: no lane reaches shuffle r + 2 before all have read r
};

struct Thread {
    Block* block;
    Warp* warp;
    unsigned tid, lane;
    unsigned long long round = 0;
};

inline thread_local Thread* self = nullptr;

struct Block {
    Block(unsigned index, unsigned n) : index(index), nthreads(n), sync(this, n), where(n) {
        for (unsigned w = 0; w * 32 < n; ++w) warps.emplace_back(std::make_unique<Warp>(this, std::min(32u, n - w * 32)));
        for (auto& s : where) s.store(RUNNING);
    }
    unsigned index, nthreads;
    Barrier sync;
    std::vector<std::unique_ptr<Warp>> warps;
    std::vector<std::atomic<int>> where;
    std::atomic<bool> failed{false};
    std::mutex message_m;
    std::string message;
};

// the first failure's message wins; every waiter is woken and unwinds
inline void fail_block(Block& b, const std::string& why) {
    {
        std::lock_guard<std::mutex> lock(b.message_m);
        if (b.message.empty()) b.message = "block " + std::to_string(b.index) + ": " + why;
    }
    b.failed.store(true);
    b.sync.poison();
    for (auto& w : b.warps) w->bar.poison();
}

// "threads 0-15: __shfl_down_sync; threads 16-255: __syncthreads" (runs of equal state)
inline std::string thread_states(Block& b) {
    static const char* names[] = {"running", "__syncthreads", "__shfl_down_sync", "exited"};
    std::string out;
    unsigned start = 0;
    for (unsigned t = 1; t <= b.nthreads; ++t) {
        if (t < b.nthreads && b.where[t].load() == b.where[start].load()) continue;
        if (!out.empty()) out += "; ";
        out += "threads " + std::to_string(start) + (t - 1 > start ? "-" + std::to_string(t - 1) : "") + ": " +
               names[b.where[start].load()];
        start = t;
    }
    return out;
}

inline void fail_here(const std::string& why) {
    fail_block(*self->block, "thread " + std::to_string(self->tid) + ": " + why);
    throw Aborted{};
}

template <typename T>
T shfl_down(unsigned mask, T v, unsigned delta) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "__shfl_down_sync takes a value of at most 8 bytes");
    Thread& t = *self;
    Warp& w = *t.warp;
    Block& b = *t.block;
    const unsigned existing = w.size == 32 ? 0xffffffffu : (1u << w.size) - 1u;
    if (mask & ~existing) fail_here("__shfl_down_sync mask " + std::to_string(mask) + " names lanes that do not exist");
    if (mask != existing)
        fail_here("__shfl_down_sync mask " + std::to_string(mask) + " leaves out lanes of the warp (not emulated)");
    Slot& mine = w.slot[(t.round + 1) % 2][t.lane];
    std::memcpy(mine.bytes, &v, sizeof(T));
    mine.mask = mask;
    mine.round = ++t.round;
    b.where[t.tid].store(AT_SHUFFLE);
    w.bar.arrive_and_wait();  // every live lane of the warp has written
    T out = v;
    const unsigned src = t.lane + delta;
    if (src < 32) {
        const Slot& theirs = w.slot[t.round % 2][src];
        if (theirs.round != t.round || theirs.mask != mask)
            fail_here("__shfl_down_sync reads lane " + std::to_string(src) +
                      ", which has exited or is at another shuffle or mask");
        std::memcpy(&out, theirs.bytes, sizeof(T));
    }
    b.where[t.tid].store(RUNNING);
    return out;
}

// the section that holds __shared__ (its bounds are defined by the linker where it exists)
extern "C" unsigned char __start_rg_shared[] __attribute__((weak, visibility("hidden")));
extern "C" unsigned char __stop_rg_shared[] __attribute__((weak, visibility("hidden")));

inline void poison_shared() {
    if (__start_rg_shared && __stop_rg_shared) std::memset(__start_rg_shared, 0xff, __stop_rg_shared - __start_rg_shared);
}

// The OS threads: worker k is CUDA thread k of every block.  It sleeps on its own futex word `go`
// until the launcher hands it a block, runs the kernel, and the last worker to finish wakes the
// launcher (`running` down to 0).  The pool itself is never destroyed (workers may outlive static
// destruction); release() ends the workers.
struct Pool {
    static constexpr std::uint32_t STOP = 0xffffffffu;
    struct Worker {
        std::atomic<std::uint32_t> go{0};
        pthread_t thread;
        Pool* pool;
        unsigned tid;
    };
    std::mutex launch_mutex;
    pid_t pid = getpid();
    std::vector<std::unique_ptr<Worker>> workers;
    std::atomic<std::uint32_t> running{0};
    void (*run)(void* ctx, unsigned tid) = nullptr;  // the block's body, type-erased
    void* ctx = nullptr;
    std::vector<int> cpu;  // per worker for this block: the CPU to run on, or -1 for any of `allowed`
    cpu_set_t allowed;

    static void* main(void* arg) {
        Worker& w = *static_cast<Worker*>(arg);
        Pool& p = *w.pool;
        std::uint32_t seen = 0;
        int placed = -2;  // the affinity this thread has: a CPU, -1 for `allowed`, -2 for not set
        for (;;) {
            std::uint32_t now;
            while ((now = w.go.load(std::memory_order_acquire)) == seen) futex_wait(w.go, seen);
            if (now == STOP) return nullptr;
            seen = now;
            if (p.cpu[w.tid] != placed) {
                placed = p.cpu[w.tid];
                cpu_set_t set = p.allowed;
                if (placed >= 0) {
                    CPU_ZERO(&set);
                    CPU_SET(placed, &set);
                }
                sched_setaffinity(0, sizeof set, &set);
            }
            threadIdx = uint3{w.tid, 0, 0};
            p.run(p.ctx, w.tid);
            if (p.running.fetch_sub(1, std::memory_order_acq_rel) == 1) futex_wake(p.running);
        }
    }

    // at least n workers; false if the OS refused a thread
    bool grow(unsigned n) {
        if (pid != getpid()) {  // a forked child has none of its parent's threads
            workers.clear();
            pid = getpid();
        }
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        bool ok = true;
        while (ok && workers.size() < n) {
            auto w = std::make_unique<Worker>();
            w->pool = this;
            w->tid = unsigned(workers.size());
            ok = pthread_create(&w->thread, &attr, &Pool::main, w.get()) == 0;
            if (ok) workers.push_back(std::move(w));
        }
        pthread_attr_destroy(&attr);
        cpu.resize(workers.size(), -1);
        return ok;
    }

    // end every worker (the next launch starts new ones)
    void release() {
        if (pid == getpid()) {
            for (auto& w : workers) {
                w->go.store(STOP, std::memory_order_release);
                futex_wake(w->go);
            }
            for (auto& w : workers) pthread_join(w->thread, nullptr);
        }
        workers.clear();
        cpu.clear();
    }

    // run `body(ctx, tid)` on workers 0..n-1 and wait for all of them
    void run_block(unsigned n, void (*body)(void*, unsigned), void* context) {
        run = body;
        ctx = context;
        running.store(n, std::memory_order_relaxed);
        for (unsigned k = 0; k < n; ++k) {
            workers[k]->go.fetch_add(1, std::memory_order_acq_rel);
            futex_wake(workers[k]->go, 1);
        }
        std::uint32_t left;
        while ((left = running.load(std::memory_order_acquire)) != 0) futex_wait(running, left);
    }
};

inline Pool& pool() {
    static Pool* p = new Pool;
    return *p;
}

template <typename... P>
int launch(void (*kernel)(P...), dim3 grid, dim3 block, std::type_identity_t<P>... args) {
    Pool& pl = pool();
    std::lock_guard<std::mutex> lock(pl.launch_mutex);
    last_error.clear();
    if (grid.x < 1 || grid.y != 1 || grid.z != 1 || block.x < 1 || block.x > 1024 || block.y != 1 || block.z != 1) {
        last_error = "only 1-D launches of 1 to 1024 threads per block and at least one block are emulated";
        return 1;
    }
    if (!pl.grow(block.x)) {
        last_error = "the OS refused a thread: " + std::to_string(pl.workers.size()) + " of " + std::to_string(block.x);
        return 1;
    }
    // where each CUDA thread runs: warp w on cpus[w * ncpu / nwarps], or anywhere it may
    CPU_ZERO(&pl.allowed);
    sched_getaffinity(0, sizeof pl.allowed, &pl.allowed);
    std::vector<int> cpus;
    const unsigned warps = (block.x + 31) / 32;
    for (int c = 0; c < CPU_SETSIZE && cpus.size() < warps; ++c)
        if (CPU_ISSET(c, &pl.allowed)) cpus.push_back(c);
    for (unsigned k = 0; k < block.x; ++k) pl.cpu[k] = pin.load() && !cpus.empty() ? cpus[(k / 32) * cpus.size() / warps] : -1;

    struct Context {
        Block* block;
        dim3 grid, dim;
        void (*kernel)(P...);
        std::tuple<P...> args;
    } ctx{nullptr, grid, block, kernel, std::tuple<P...>(args...)};
    // one block as CUDA thread `tid` sees it; exiting counts as arriving at every later barrier
    auto body = [](void* c, unsigned tid) {
        Context& cx = *static_cast<Context*>(c);
        Block& b = *cx.block;
        Thread t{&b, b.warps[tid / 32].get(), tid, tid % 32};
        self = &t;
        blockIdx = uint3{b.index, 0, 0};
        blockDim = cx.dim;
        gridDim = cx.grid;
        try {
            std::apply(cx.kernel, cx.args);
        } catch (const Aborted&) {
        } catch (const std::exception& e) {
            fail_block(b, "thread " + std::to_string(tid) + " threw " + e.what());
        } catch (...) {
            fail_block(b, "thread " + std::to_string(tid) + " threw an exception");
        }
        b.where[tid].store(EXITED);
        t.warp->bar.arrive_and_drop();
        b.sync.arrive_and_drop();
        self = nullptr;
    };
    for (unsigned bi = 0; bi < grid.x; ++bi) {
        poison_shared();
        Block b(bi, block.x);
        ctx.block = &b;
        pl.run_block(block.x, body, &ctx);
        if (b.failed.load()) {
            last_error = b.message;
            return 1;
        }
    }
    return 0;
}

}  // namespace rg_host

template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta) {
    return rg_host::shfl_down(mask, v, delta);
}

inline void __syncthreads() {
    rg_host::Thread& t = *rg_host::self;
    t.block->where[t.tid].store(rg_host::AT_SYNCTHREADS);
    t.block->sync.arrive_and_wait();
    t.block->where[t.tid].store(rg_host::RUNNING);
}

extern "C" const char* rg_host_last_error() { return rg_host::last_error.c_str(); }
extern "C" void rg_host_set_timeout_ms(long long ms) { rg_host::timeout_ms.store(ms); }
extern "C" void rg_host_set_pin(int on) { rg_host::pin.store(on != 0); }
extern "C" void rg_host_release_threads() {
    std::lock_guard<std::mutex> lock(rg_host::pool().launch_mutex);
    rg_host::pool().release();
}

#endif  // RG_BLOCK_SEMANTICS_H
