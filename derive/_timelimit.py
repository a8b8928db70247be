"""Time limits for the symbolic work, on any thread.

SymPy's ``simplify``, ``solve`` and ``limit`` have no time bound of their own:
a regularizer such as ``sinh(sinh(sinh(sinh(sinh(p)))))`` keeps them busy for
minutes.  :meth:`TimeLimit.run` calls a function under a wall-clock deadline;
:class:`~derive.regularizers.Regularizer` and :func:`~derive.argmax.derive_map`
run their SymPy work through it.

How it works: the call starts a small watcher thread.  When the deadline
passes before the function has returned, the watcher asks the interpreter to
raise an exception in the calling thread (``PyThreadState_SetAsyncExc``, the
C API that delivers an exception to another thread).  The exception derives
from :class:`BaseException`, so ``except Exception`` clauses inside SymPy do
not swallow it, and :meth:`TimeLimit.run` turns it into a one-line
:class:`~derive.errors.DerivationTimeout`.  Nothing is added to the work itself
(no polling, no tracing): a call that finishes in time runs exactly as without
a limit, and the limit works the same on the main thread and on any other.
Should the exception be lost (a bare ``except:``), the watcher raises it again
every :data:`_REFIRE` seconds until the call returns.

Granularity: the interpreter delivers the exception between bytecodes, so a
single long call into C (one huge integer power, say) finishes first; the
structural limits checked when a :class:`~derive.regularizers.Regularizer` is
built keep such calls short.  After a timeout mpmath's working precision (a
process-wide setting that an interrupted ``workdps`` block may leave raised)
is restored.

Limits nest: an inner call (one SymPy ``solve`` given a few seconds before the
derivation falls back to a numeric method) converts only its own deadline;
when an outer deadline passes inside it, the outer one wins.

Without CPython's C API (another interpreter) calls run without a limit.

A single call into C is not interrupted that way: SymPy's primality test of a
huge integer (``pow`` in ``isprime``) or a gcd of huge polynomials holds the
interpreter for minutes, and no other thread runs meanwhile.  :meth:`TimeLimit.run_isolated`
therefore runs the work in a child process (``os.fork``: it starts with the
caller's memory, so nothing is imported again), the limit of :meth:`TimeLimit.run`
inside it, and the caller waits for its pickled result at most until the
deadline, then kills it: the limit holds whatever SymPy does.  The derivation
(:func:`~derive.argmax.derive_map`) and the checks of a
:class:`~derive.regularizers.Regularizer` run so when a limit is given
(``timeout=`` or ``$REGATTN_TIMEOUT``; the ``regattn`` command always, through
:func:`hard_limits`).  The default limit alone keeps the work in the caller's
process: a child's work does not warm the caller's SymPy cache, which costs a
quarter more CPU time over many derivations (a fork itself about 10 ms).
Where there is no ``os.fork``, with no limit (``math.inf``), or inside such a
child already (a family's cases derived inside the family's derivation), the
work runs in the caller's process under :meth:`TimeLimit.run`.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import os
import pickle
import select
import signal
import sys
import threading
import time
import warnings

import mpmath

from .errors import DerivationError, DerivationTimeout

__all__ = ["DEFAULT_TIMEOUT", "TIMEOUT_ENV", "TimeLimit", "default_timeout", "hard_limits", "resolve_timeout"]

#: Seconds allowed for building a regularizer and, separately, for deriving its map.
DEFAULT_TIMEOUT = 60.0
#: Environment variable that replaces :data:`DEFAULT_TIMEOUT` (seconds; ``inf`` for none).
TIMEOUT_ENV = "REGATTN_TIMEOUT"
#: Seconds between repeats of an exception that the block did not act on.
_REFIRE = 1.0
#: Seconds before an exception swallowed by a finaliser or a garbage-collector callback is raised again.
_AFTER_FINALISER = 0.01

#: Seconds a child of :meth:`TimeLimit.run_isolated` is given past the deadline to send its own timeout, and
#: between the parent's checks for an exception of its own (an enclosing limit, Ctrl-C).
_CHILD_GRACE = 0.25
_POLL = 0.05

_set_async_exc = getattr(getattr(ctypes, "pythonapi", None), "PyThreadState_SetAsyncExc", None)
# whether this process is a child of run_isolated (its own isolated calls then run in it)
_in_child = False
# whether the default limit is hard too (hard_limits, the regattn command)
_hard = [False]


@contextlib.contextmanager
def hard_limits():
    """Within the block the default limit is held as a given one is: :meth:`TimeLimit.run_isolated` forks for
    it too (the ``regattn`` command, which derives one map per process, runs so)."""
    before = _hard[0]
    _hard[0] = True
    try:
        yield
    finally:
        _hard[0] = before


class _Expired(BaseException):
    """Raised asynchronously in a thread whose time limit has passed (never seen by callers)."""


def default_timeout() -> float:
    """The time limit in seconds: ``$REGATTN_TIMEOUT`` if set, else :data:`DEFAULT_TIMEOUT`."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise DerivationError(f"{TIMEOUT_ENV} must be a positive number of seconds (or inf), got {text!r}")
    return value


def resolve_timeout(timeout: float | None) -> float:
    """``timeout`` checked (a positive number, ``math.inf`` for none), or the default when ``None``."""
    if timeout is None:
        return default_timeout()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise DerivationError(f"timeout must be a positive number of seconds (or math.inf), got {timeout!r}")
    return float(timeout)


class TimeLimit:
    """A wall-clock limit on one call: :meth:`run` raises :class:`~derive.errors.DerivationTimeout` when it passes.

    Parameters
    ----------
    seconds:
        The limit; ``None`` reads :func:`default_timeout`, ``math.inf`` means none.
    what:
        Words for the message, e.g. ``"deriving the map of omega(p) = p**3"``.

    Examples
    --------
    >>> from derive import Regularizer, TimeLimit, derive_map
    >>> reg = Regularizer.from_string("p**3")
    >>> dv = TimeLimit(30, "deriving a cubic map").run(derive_map, reg)
    >>> dv.sparse
    True
    """

    def __init__(self, seconds: float | None = None, what: str = "the symbolic work"):
        self.seconds = resolve_timeout(seconds)
        self.what = what
        #: whether :meth:`run_isolated` forks: a limit given (``seconds`` or ``$REGATTN_TIMEOUT``), or
        #: :func:`hard_limits` in force; the default limit alone is kept in the caller's process
        self.hard = seconds is not None or bool(os.environ.get(TIMEOUT_ENV, "").strip()) or _hard[0]

    def run(self, fn, /, *args, **kwargs):
        """``fn(*args, **kwargs)``, abandoned with :class:`~derive.errors.DerivationTimeout` after :attr:`seconds`.

        Calls may nest (each :class:`TimeLimit` converts only its own deadline)
        and may run on any thread.
        """
        if math.isinf(self.seconds) or _set_async_exc is None:
            return fn(*args, **kwargs)
        _drop_expired_unraisables()
        return _Watch(self.seconds).call(fn, args, kwargs, self)

    def run_isolated(self, fn, /, *args, **kwargs):
        """``fn(*args, **kwargs)`` in a child process killed at the deadline: the limit holds even through a
        single long call into C, which :meth:`run` cannot interrupt.

        The child is forked (it shares the caller's state at the call; what ``fn`` changes stays in the child)
        and runs ``fn`` under :meth:`run`; its result or exception comes back pickled, and is returned or
        raised here.  Past :attr:`seconds` (and a short grace for the child's own timeout to arrive) the child
        is killed and :class:`~derive.errors.DerivationTimeout` raised.  Without ``os.fork``, without a limit,
        or in such a child already, this is :meth:`run`.
        """
        if math.isinf(self.seconds) or _in_child or not hasattr(os, "fork") or not self.hard:
            return self.run(fn, *args, **kwargs)
        read, write = os.pipe()
        try:
            with warnings.catch_warnings():
                # JAX warns at every fork that its threads may deadlock the child; this child runs only
                # SymPy and ends with os._exit, never touching JAX (or torch)
                warnings.simplefilter("ignore", RuntimeWarning)
                pid = os.fork()
        except BaseException:
            os.close(read)
            os.close(write)
            raise
        if pid == 0:  # the child: never returns
            _child(self, read, write, fn, args, kwargs)
        os.close(write)
        try:
            data = _receive(read, pid, time.monotonic() + self.seconds + _CHILD_GRACE)
        finally:
            os.close(read)
            _end(pid)
        if data is None:
            raise DerivationTimeout(self.seconds, self.what)
        if not data:  # (the child died: killed by the system, say)
            raise DerivationError(f"{self.what} ended without a result: its process stopped")
        kind, value = pickle.loads(data)
        if kind == "unsent":  # a result that does not pickle: the work again, here
            return self.run(fn, *args, **kwargs)
        if kind == "error":
            raise value
        return value


def _child(limit: TimeLimit, read: int, write: int, fn, args, kwargs):
    """The child of :meth:`TimeLimit.run_isolated`: run ``fn``, write ``(kind, value)`` pickled, exit."""
    global _in_child
    code = 0
    try:
        os.close(read)
        _in_child = True
        # no cyclic garbage collection in the short-lived child: a collection walks every object the parent
        # holds, and touching them copies the parent's memory page by page (copy-on-write)
        gc.disable()
        try:
            outcome = ("result", limit.run(fn, *args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - every outcome goes back to the caller
            outcome = ("error", exc)
        try:
            data = pickle.dumps(outcome)
        except Exception:
            if outcome[0] == "result":
                data = pickle.dumps(("unsent", None))
            else:  # an exception that does not pickle: its words
                exc = outcome[1]
                data = pickle.dumps(("error", DerivationError(f"{type(exc).__name__}: {' '.join(str(exc).split())}")))
        view = memoryview(data)
        while view:
            view = view[os.write(write, view):]
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _receive(read: int, pid: int, deadline: float) -> bytes | None:
    """The bytes the child writes until it closes its end (none if it died), or ``None`` at ``deadline`` (the
    child is then killed by :func:`_end`).  Waits in short slices so that an exception for this thread (an enclosing limit,
    Ctrl-C) is raised here without delay."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([read], [], [], min(left, _POLL))
        if ready:
            chunk = os.read(read, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def _end(pid: int) -> None:
    """Kill the child ``pid`` if it still runs, and reap it."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except ChildProcessError:  # reaped already
        pass


def _drop_expired_unraisables() -> None:
    """Wrap :data:`sys.unraisablehook` (once per hook) so that it ignores a delivered :class:`_Expired`.

    The interpreter may deliver the exception inside a finaliser or a garbage
    collector callback that happens to run in the limited thread; there it
    cannot propagate and goes to ``sys.unraisablehook``.  The hook wakes the
    call's watcher, which raises it again :data:`_AFTER_FINALISER` seconds
    later (once the finaliser has returned), and reports nothing (a report
    would be noise, an error under ``-W error``).  Every other
    unraisable exception goes to the hook that was installed.
    """
    hook = sys.unraisablehook
    if getattr(hook, "_regattn_drops_expired", False):
        return

    def unraisable(args, _inner=hook):
        if isinstance(args.exc_value, _Expired):
            watch = getattr(type(args.exc_value), "watch", None)
            if watch is not None:
                watch._wake.set()
        else:
            _inner(args)

    unraisable._regattn_drops_expired = True
    sys.unraisablehook = unraisable


class _Watch:
    """One limited call: a watcher thread that raises :attr:`error` in the calling thread at the deadline.

    The order of the statements in :meth:`call` and :meth:`_watch` is what
    makes the mechanism race-free under the GIL: between reading ``_done``
    and injecting the exception the watcher runs no bytecode at which the
    interpreter could switch threads, and the calling thread sets ``_done``
    and drops a pending exception before it runs any bytecode at which an
    asynchronous exception could be delivered (the interpreter checks only
    at function entries, backward jumps and after calls into C).
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        # each limited call raises its own class, so nested limits tell their deadlines apart
        self.error = type("_Expired", (_Expired,), {"watch": self})
        self._exc = ctypes.py_object(self.error)
        self._cid = ctypes.c_ulong(threading.get_ident())
        self._done = False
        self._fired = False
        self._wake = threading.Event()

    def _watch(self) -> None:
        wait = self.seconds
        while True:
            if self._wake.wait(wait):  # woken by the end of the call, or by the unraisable hook
                self._wake.clear()
                # the hook runs inside the finaliser that swallowed the exception: fire again once the
                # calling thread has had time to leave it
                if not self._done:
                    self._wake.wait(_AFTER_FINALISER)
                    self._wake.clear()
            if self._done:
                return
            self._fired = True
            _set_async_exc(self._cid, self._exc)
            wait = _REFIRE

    def call(self, fn, args, kwargs, limit: TimeLimit):
        precision = mpmath.mp.prec
        expired = False
        try:
            threading.Thread(target=self._watch, name="regattn-time-limit", daemon=True).start()
            return fn(*args, **kwargs)
        except self.error:
            expired = True
        finally:
            self._done = True
            if self._fired:
                _set_async_exc(self._cid, None)  # None passes NULL: drops an exception not yet delivered
            self._wake.set()
        # the exception may have cut a `with workdps(...)` short: mpmath's precision is process-wide
        mpmath.mp.prec = precision
        if expired:
            raise DerivationTimeout(limit.seconds, limit.what)
