"""Threads in one place: the thread count, one lazily made pool, and BLAS held at one thread when needed.

``numeric`` spreads work over threads in two ways, both through :func:`run_tasks`:
attention runs groups of batch elements (heads) as tasks, each with BLAS on one
thread, and the maps solve large inputs in chunks of rows.  How the work is cut
into tasks depends only on the shapes, never on the thread count or on the
machine's load, and each task writes its own part of the output, so the results
are bit-identical whatever :func:`set_num_threads` says.

* :func:`set_num_threads` / :func:`get_num_threads`: the most threads ``numeric``
  works on at once (the caller's thread included).  The default comes from the
  environment variable ``REGATTN_NUM_THREADS``, else the number of cores this
  process may run on, at most 8.  BLAS keeps its own setting (limit it with
  threadpoolctl) except while tasks that asked for one BLAS thread run.
* The pool is made on first use and made again in a child process after
  ``fork`` (:func:`os.register_at_fork`); its worker threads from the parent do
  not exist there.
* BLAS is held at one thread while any call that asked for it runs, and
  restored when the last such call finishes: one reference count, and one
  thread of this module's own that sets and restores the limit (threadpoolctl
  lets only the thread that set an OpenBLAS limit change it again).
  A ``fork`` while the limit is held leaves the child's BLAS at one thread.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import numbers
import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["set_num_threads", "get_num_threads", "run_tasks", "ENV"]

#: Environment variable giving the default thread count.
ENV = "REGATTN_NUM_THREADS"
#: Most threads used by default (more cores than this rarely pay for the heads' share of the memory bandwidth).
DEFAULT_MAX = 8


def _check(n, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"{what} must be a positive integer, got {n!r}")
    return int(n)


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _default_threads() -> int:
    text = os.environ.get(ENV, "").strip()
    if not text:
        return max(1, min(_available_cores(), DEFAULT_MAX))
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"the environment variable {ENV} must be a positive integer, got {text!r}")
    return value


class _State:
    """Everything that must start afresh in a forked child."""

    def __init__(self):
        self.lock = threading.Lock()
        self.threads: int | None = None  # set_num_threads; None: the default
        self.pool: ThreadPoolExecutor | None = None
        self.pool_workers = 0
        self.local = threading.local()  # .inside: this thread runs a task already
        self.blas = _BlasHold()


def set_num_threads(n: int | None) -> None:
    """Use at most ``n`` threads (the caller's included); ``None`` returns to the default.

    The default is ``REGATTN_NUM_THREADS`` if set, else the cores available to
    this process, at most :data:`DEFAULT_MAX`.  Results do not depend on it.
    """
    value = None if n is None else _check(n, "the number of threads")
    with _state.lock:
        _state.threads = value


def get_num_threads() -> int:
    """The most threads ``numeric`` works on at once (see :func:`set_num_threads`)."""
    threads = _state.threads
    return _default_threads() if threads is None else threads


def _pool(workers: int) -> ThreadPoolExecutor:
    with _state.lock:
        if _state.pool is None or _state.pool_workers < workers:
            old = _state.pool
            _state.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="regattn")
            _state.pool_workers = workers
            if old is not None:
                old.shutdown(wait=False)  # its running tasks finish; later ones go to the new pool
        return _state.pool


def run_tasks(task, count: int, *, blas_single: bool = False) -> None:
    """``task(i)`` for every ``i`` in ``range(count)``, on up to :func:`get_num_threads` threads.

    The caller's thread and up to ``get_num_threads() - 1`` pool threads take the
    next index from one shared counter until none is left, so a thread that
    starts late takes fewer tasks instead of holding the call up.  A task that
    calls :func:`run_tasks` itself runs its tasks on its own thread.  The
    caller's context (NumPy's error state) travels with the tasks.  With
    ``blas_single`` BLAS runs on one thread during the tasks (whatever the
    thread count, so that the numbers do not depend on it).  The first error
    raised by a task is raised here once the threads have stopped.
    """
    if count <= 0:
        return
    hold = _state.blas if blas_single else contextlib.nullcontext()
    local = _state.local
    threads = min(get_num_threads(), count)
    with hold:
        if threads < 2 or getattr(local, "inside", False):
            for i in range(count):
                task(i)
            return
        order = itertools.count()
        lock = threading.Lock()  # next() on a count is atomic under the GIL, not on free-threaded builds
        failed = []

        def work():
            before = getattr(local, "inside", False)
            local.inside = True
            try:
                while not failed:
                    with lock:
                        i = next(order)
                    if i >= count:
                        return
                    try:
                        task(i)
                    except BaseException:
                        failed.append(True)
                        raise
            finally:
                local.inside = before

        pool = _pool(threads - 1)
        helpers = [pool.submit(contextvars.copy_context().run, work) for _ in range(threads - 1)]
        try:
            work()
        finally:
            # helpers that have not started (the pool busy with other callers) are not waited for
            started = [f for f in helpers if not f.cancel()]
            for f in started:
                f.exception()  # waits
        for f in started:
            f.result()  # a helper's error


class _BlasHold:
    """BLAS at one thread while any holder is inside; restored when the last one leaves.

    One thread of its own sets the limit when the first holder enters and
    restores it when the last leaves (threadpoolctl lets only the thread that
    set an OpenBLAS limit change it again; callers enter and leave on any
    thread).  Without threadpoolctl nothing is limited.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._users = 0
        self._held = False
        self._thread: threading.Thread | None = None

    def __enter__(self):
        with self._cond:
            self._users += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="regattn-blas", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            while not self._held:
                self._cond.wait()
        return self

    def __exit__(self, *exc):
        with self._cond:
            self._users -= 1
            if self._users == 0:
                self._cond.notify_all()
                while self._held and self._users == 0:  # the limit is restored when the last holder returns
                    self._cond.wait()

    def _serve(self):
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # nothing to limit with
            threadpool_limits = None
        with self._cond:
            while True:
                while self._users == 0:
                    self._cond.wait()
                try:
                    limit = threadpool_limits(1, user_api="blas") if threadpool_limits else contextlib.nullcontext()
                except Exception:  # a library that refuses: run unlimited rather than hang the holders
                    limit = contextlib.nullcontext()
                try:
                    with limit:
                        self._held = True
                        self._cond.notify_all()
                        while self._users > 0:
                            self._cond.wait()
                except Exception:  # a failed restore leaves BLAS as it is; the holders must not hang
                    pass
                finally:
                    self._held = False
                    self._cond.notify_all()


def _after_fork_in_child():
    # the parent's worker threads (and the BLAS thread) do not exist here, and its locks may be held
    global _state
    threads = _state.threads  # the setting carries over
    _state = _State()
    _state.threads = threads


_state = _State()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
