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
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import threading

import mpmath

from .errors import DerivationError, DerivationTimeout

__all__ = ["DEFAULT_TIMEOUT", "TIMEOUT_ENV", "TimeLimit", "default_timeout", "resolve_timeout"]

#: Seconds allowed for building a regularizer and, separately, for deriving its map.
DEFAULT_TIMEOUT = 60.0
#: Environment variable that replaces :data:`DEFAULT_TIMEOUT` (seconds; ``inf`` for none).
TIMEOUT_ENV = "REGATTN_TIMEOUT"
#: Seconds between repeats of an exception that the block did not act on.
_REFIRE = 1.0
#: Seconds before an exception swallowed by a finaliser or a garbage-collector callback is raised again.
_AFTER_FINALISER = 0.01

_set_async_exc = getattr(getattr(ctypes, "pythonapi", None), "PyThreadState_SetAsyncExc", None)


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

    def run(self, fn, /, *args, **kwargs):
        """``fn(*args, **kwargs)``, abandoned with :class:`~derive.errors.DerivationTimeout` after :attr:`seconds`.

        Calls may nest (each :class:`TimeLimit` converts only its own deadline)
        and may run on any thread.
        """
        if math.isinf(self.seconds) or _set_async_exc is None:
            return fn(*args, **kwargs)
        _drop_expired_unraisables()
        return _Watch(self.seconds).call(fn, args, kwargs, self)


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
