"""numeric.parallel: the thread count, results that do not depend on it, fork safety, BLAS limits under concurrency."""

from __future__ import annotations

import importlib
import multiprocessing
import threading
import time

import numpy as np
import pytest

import numeric as nm
from numeric import parallel

A = importlib.import_module("numeric.attention")  # the package exports a function of that name
M = importlib.import_module("numeric.numpy.backend")  # where NumPy rows are cut into chunks


@pytest.fixture(autouse=True)
def default_threads():
    nm.set_num_threads(None)
    yield
    nm.set_num_threads(None)


def _blas_threads():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    counts = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    return counts[0] if counts else None


def test_set_and_get_num_threads(monkeypatch):
    monkeypatch.delenv(parallel.ENV, raising=False)
    assert 1 <= nm.get_num_threads() <= parallel.DEFAULT_MAX
    monkeypatch.setenv(parallel.ENV, "3")
    assert nm.get_num_threads() == 3
    nm.set_num_threads(5)
    assert nm.get_num_threads() == 5
    nm.set_num_threads(None)
    assert nm.get_num_threads() == 3
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv(parallel.ENV, bad)
        with pytest.raises(ValueError, match=f"REGATTN_NUM_THREADS must be a positive integer, got '{bad}'"):
            nm.get_num_threads()
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="number of threads must be a positive integer"):
            nm.set_num_threads(bad)


def test_run_tasks_spreads_nests_and_raises():
    seen = []

    def task(i):
        time.sleep(0.01)
        seen.append((i, threading.get_ident()))

    nm.set_num_threads(2)
    parallel.run_tasks(task, 8)
    assert sorted(i for i, _ in seen) == list(range(8))
    assert len({t for _, t in seen}) == 2
    nm.set_num_threads(1)
    seen.clear()
    parallel.run_tasks(task, 4)
    assert {t for _, t in seen} == {threading.get_ident()}

    nm.set_num_threads(2)
    inner = []

    def outer(i):  # a task's own tasks stay on its thread
        me = threading.get_ident()
        parallel.run_tasks(lambda j: inner.append(threading.get_ident() == me), 3)

    parallel.run_tasks(outer, 4)
    assert inner == [True] * 12

    def failing(i):
        if i == 5:
            raise KeyError("task 5")

    with pytest.raises(KeyError, match="task 5"):
        parallel.run_tasks(failing, 9)
    with np.errstate(divide="raise"):  # the caller's error state reaches every thread
        states = []
        parallel.run_tasks(lambda i: (time.sleep(0.01), states.append(np.geterr()["divide"])), 4)
    assert states == ["raise"] * 4


def test_blas_is_single_threaded_inside_blas_single_tasks_and_restored_after():
    before = _blas_threads()
    if before is None:
        pytest.skip("no BLAS that threadpoolctl controls")
    for threads in (1, 2):
        nm.set_num_threads(threads)
        inside = []
        parallel.run_tasks(lambda i: inside.append(_blas_threads()), 3, blas_single=True)
        assert inside == [1, 1, 1]
        assert _blas_threads() == before


def _inputs():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 96, 16)).astype(np.float32) for _ in range(3))
    mask = rng.random((96, 96)) > 0.2
    dout = rng.standard_normal((2, 4, 96, 16)).astype(np.float32)
    x = (rng.standard_normal((3000, 48)) * 3).astype(np.float32)
    x[::7, 20:] = -np.inf
    return q, k, v, mask, dout, x


@pytest.mark.parametrize("mapping", ["softmax", "sparsemax", "entmax15", "entmax"])
def test_results_are_the_same_bits_for_every_thread_count(mapping, monkeypatch):
    """Attention (forward and backward) and the maps give identical bits under 1, 2 and 3 threads."""
    monkeypatch.setattr(A, "PARALLEL_FROM", 1)  # every call cut into tasks
    monkeypatch.setattr(A, "TASK_WORK", 96 * 96 * 3)  # tasks of 3 heads: slices of the head axis
    m = nm.get_map(mapping, **({"alpha": 1.3} if mapping == "entmax" else {}))
    q, k, v, mask, dout, x = _inputs()
    assert x.size >= M.THREADS_FROM  # the map runs in chunks of rows
    results = {}
    for threads in (1, 2, 3):
        nm.set_num_threads(threads)
        results[threads] = [
            nm.attention(q, k, v, mapping=m, mask=mask, causal=True),
            nm.attention(q, k, v, mapping=m, block=40),
            *nm.attention_backward(q, k, v, dout, mapping=m, mask=mask),
            *m.forward(x),
        ]
    for threads in (2, 3):
        for a, b in zip(results[threads], results[1]):
            np.testing.assert_array_equal(a, b)
    # and the numbers are attention's: the serial path (no tasks) agrees to rounding
    monkeypatch.setattr(A, "PARALLEL_FROM", 1 << 62)
    np.testing.assert_allclose(results[2][0], nm.attention(q, k, v, mapping=m, mask=mask, causal=True), atol=1e-5)


def test_tasks_cover_the_batch_once():
    for batch, per_item in [((2, 8), 1 << 22), ((2, 8), 1000), ((3, 5, 7), 20000), ((4,), 1), ((1, 6), 300000)]:
        seen = np.zeros(batch, int)
        for index in A._tasks(batch, per_item):
            seen[index] += 1
        assert (seen == 1).all(), (batch, per_item)


def _child(conn, q, x):
    conn.send((nm.attention(q, q, q, mapping="entmax15"), nm.entmax15(x)))
    conn.close()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
# JAX, once an earlier test in this process imported it, warns at every fork about its own threads
@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
def test_a_forked_child_runs_what_the_parent_ran(monkeypatch):
    """After attention and a map ran on the pool in the parent, the same calls in a fork child finish."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    monkeypatch.setattr(A, "PARALLEL_FROM", 1)
    monkeypatch.setattr(M, "THREADS_FROM", 1)
    nm.set_num_threads(2)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 16, 4))
    x = rng.standard_normal((64, 16))
    want = nm.attention(q, q, q, mapping="entmax15"), nm.entmax15(x)
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(send, q, x))
    child.start()
    send.close()
    try:
        assert receive.poll(60), "the fork child did not answer within 60 s"
        got = receive.recv()
        child.join(60)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_concurrent_attention_leaves_blas_as_it_was(monkeypatch):
    """Four threads running attention on the pool at once: BLAS gets its own thread count back."""
    before = _blas_threads()
    if before is None or before < 2:
        pytest.skip("BLAS already runs on one thread: nothing to restore")
    monkeypatch.setattr(A, "PARALLEL_FROM", 1)
    nm.set_num_threads(2)
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 2, 8, 4))
    want = nm.attention(q, q, q)
    errors = []

    def calls():
        try:
            for _ in range(60):
                np.testing.assert_array_equal(nm.attention(q, q, q), want)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=calls) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert _blas_threads() == before
