"""The row operations every threshold rule runs on, and a map's routines bound to its parameter values.

The rules of :mod:`numeric.core` (and those of :mod:`numeric.constraints` and :mod:`numeric.families`) take an
operations object (:class:`TensorOps`, an extension of :class:`numeric.newton.Ops`), a table of the map's
routines bound to its parameter values (:class:`Routines`, built from a generated module's routines on the
framework's arrays, :func:`numeric.contract.routines_on`) and 2-D arrays of scores with rows along the last
axis.  They are functional (no array is written in place), keep shapes static (masks are ``where``, never
boolean indexing) and branch on values only through the operations ``repeat`` (a loop with a fixed budget that
may stop early when no row is still going) and ``branch`` (a computation needed only when some row asks for
it), so one text serves NumPy (:mod:`numeric.numpy.ops`), PyTorch (:mod:`numeric.torch`) and a JAX backend
(``lax.while_loop`` and ``lax.cond``), and traces into CUDA and Triton (:mod:`derive.codegen.trace_rows`,
:mod:`derive.codegen.trace`).

Parameters are arrays of shape ``(rows, 1)`` (one value per row) or of shape ``()``; constants a routine
returns as Python floats (``clip()`` of a map without parameters) take part as numbers.  Routines are evaluated
at ``p = 1`` off the support and masked, so no inf or NaN of an unused branch reaches a result or a gradient.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..newton import Ops, invert_link

__all__ = ["TAIL_PART", "TensorOps", "CompactRows", "Routines", "uncat", "row_length", "log_of"]

#: :meth:`TensorOps.repeat_rows` on a target that gathers its tail: the rows going on alone, a part of all of them
TAIL_PART = 8


class TensorOps(Ops):
    """:class:`numeric.newton.Ops` and the row operations the rules need, on 2-D arrays ``(rows, n)``.

    Besides ``full``, ``exp``, ``where``, ``not_``, ``repeat``, ``log_tiny``, ``eps`` and
    ``newton_steps`` (see :class:`numeric.newton.Ops`) a target provides:

    * ``float_(b)``: a boolean array as 0 and 1 in the format's dtype; ``pos_part(x)``:
      ``max(x, 0)`` elementwise (``-inf`` to 0, NaN stays NaN); ``support(u)`` for ``u >= 0``: 1
      where ``u > 0``, 0 where ``u == 0`` (NaN stays NaN), in the dtype (``sign``);
      ``clamp_min(x, v)``: ``max(x, v)`` for a number ``v``;
    * ``log(x)`` (``log(0) = -inf``), ``isfinite(x)``, ``isnan(x)``, and ``tiny``, the
      smallest positive normal number of the format;
    * ``row_sum(x)``, ``row_max(x)`` (NaN where the row has one): reductions along the
      last axis keeping it, shape ``(rows, 1)``; ``cat(a, b)``: ``a`` and ``b`` side by side
      along the last axis;
    * ``sort_desc(x)`` and ``cumsum(x)`` along the last axis;
    * ``top(x, k)``: ``(values, index)`` of the ``k`` largest entries of each row, in any
      order; ``put(values, index, like)``: an array of ``like``'s shape, 0 but for ``values``
      at ``index`` in each row; ``at_place(x, k)``: each row's entry at its place ``k`` (counted from 1;
      ``(rows, 1)`` whole numbers in the format's dtype), shape ``(rows, 1)``; ``int_max(x)``: the largest entry of ``x`` (whole numbers)
      as a Python int, or ``None`` where the target traces instead of reading values;
    * ``branch(pred, fn, otherwise)``: ``fn()`` if any entry of the boolean array
      ``pred`` is true, else ``otherwise()`` (both give arrays of the same shapes).

    Two operations on row-wise computations have defaults here, which a target may
    replace by ones that compute only the rows concerned (:meth:`repeat_rows`,
    :meth:`on_rows`); ``pos_diff(y, c)`` is ``pos_part(y - c)``, :meth:`at_most` a ``where``
    and :meth:`rare` is ``branch`` unless a target replaces them.
    """

    tiny: Any

    def float_(self, b):  # pragma: no cover - interface
        raise NotImplementedError

    def pos_part(self, x):  # pragma: no cover - interface
        raise NotImplementedError

    def support(self, u):  # pragma: no cover - interface
        raise NotImplementedError

    def clamp_min(self, x, v):  # pragma: no cover - interface
        raise NotImplementedError

    def log(self, x):  # pragma: no cover - interface
        raise NotImplementedError

    def isfinite(self, x):  # pragma: no cover - interface
        raise NotImplementedError

    def isnan(self, x):  # pragma: no cover - interface
        raise NotImplementedError

    def row_sum(self, x):  # pragma: no cover - interface
        raise NotImplementedError

    def cat(self, a, b):  # pragma: no cover - interface
        raise NotImplementedError

    def row_max(self, x):  # pragma: no cover - interface
        raise NotImplementedError

    def sort_desc(self, x):  # pragma: no cover - interface
        raise NotImplementedError

    def cumsum(self, x):  # pragma: no cover - interface
        raise NotImplementedError

    def top(self, x, k: int):  # pragma: no cover - interface
        raise NotImplementedError

    #: The longest rows on which :func:`~numeric.core.screen.screened` takes a sparse map's candidates above a cut
    #: (:meth:`above`) instead of the ``k`` largest (:meth:`top`).
    cut_up_to = 0

    def above(self, x, cut, k: int):  # pragma: no cover - interface
        """``(values, index)``, shape ``(rows, k)``: the first ``k`` entries of each row of ``x`` above its ``cut``
        (shape ``(rows, 1)``) and their columns, padded with ``-inf`` at column ``x.shape[-1]`` (:meth:`put`
        leaves those out)."""
        raise NotImplementedError

    def put(self, values, index, like):  # pragma: no cover - interface
        raise NotImplementedError

    def int_max(self, x):  # pragma: no cover - interface
        raise NotImplementedError

    #: Whether a sparse map's KKT solve starts long rows from many candidates when they are not above a cut
    #: (:func:`~numeric.core.screen.screened`'s ``wide_start``): where the target traces, and so every row takes a
    #: stage that any row needs, and its ``top(x, k)`` costs as much for 16 scores as for 64 (torch under
    #: ``torch.compile``: ``torch.topk`` on 512 x 1024 float32 scores, 2.7 ms either way; not XLA's ``top_k`` on the
    #: CPU, with which JAX's ``p**2/2 + p*log(1 + p)`` on such rows took 2.5x entmax15's time instead of 1.3x).
    wide_top = False

    def number(self, x):
        """A single parameter value ``x`` as the rules choose by it: a number where the target can read it, else
        ``x`` (a NumPy scalar is one already; a traced value is not read)."""
        return x

    def branch(self, pred, fn: Callable, otherwise: Callable):  # pragma: no cover - interface
        raise NotImplementedError

    def pos_diff(self, y, c):
        return self.pos_part(y - c)

    def in_blocks(self, size: int, fn: Callable, rows: tuple):
        """``fn(*rows)``, an array of shape ``(R, ...)`` computed row by row, which a target may compute on
        consecutive blocks of rows holding at most ``size`` scores (at least one row) and put together.

        ``rows`` as in :meth:`repeat_rows`; the first holds the scores.
        """
        return fn(*rows)

    def invert_link(self, z, omega_prime: Callable, omega_second: Callable):
        """``g(z) = (omega')^{-1}(z)`` of a link with no closed form: :func:`numeric.newton.invert_link` on this
        target (a device target calls the map's own ``link``, that algorithm traced)."""
        return invert_link(self, z, omega_prime, omega_second)

    #: Whether the target sorts rows (:meth:`sort_desc`); where it does not (device code),
    #: :func:`~numeric.core.rules.support_rule`'s
    #: open rows take the support at :func:`~numeric.core.rules.root_rule`'s threshold instead of
    #: :func:`~numeric.core.rules.sort_rule`.
    sorts = True

    def at_most(self, x, v):
        """``where(x < v, x, v)`` for a number ``v`` (NaN to ``v``)."""
        return self.where(x < v, x, v)

    def below(self, a, b):
        """``where(a < b, a, b)`` for arrays ``a``, without NaN, and ``b`` (NaN in ``b`` stays NaN)."""
        return self.where(a < b, a, b)

    def rare(self, pred, fn: Callable, otherwise: Callable):
        """``fn()`` if any entry of ``pred`` is true, else ``otherwise()``, where ``otherwise()`` is ``fn()``
        made cheaper by ``pred`` being false everywhere (``where(pred, a, b)`` that is ``b``).

        A target that fuses elementwise work (JAX under ``jit``) takes ``fn()`` and no branch; one that
        runs each operation as it comes skips the work ``pred`` would have masked.
        """
        return self.branch(pred, fn, otherwise)

    #: The shortest rows on which a sparse map's rule solves its candidates first (:func:`~numeric.core.screen.screened`): where ``top(x, k)``
    #: costs more than a few passes over ``x`` (XLA's ``top_k`` on the CPU: 0.8 ms on 512 x 64 float32
    #: scores, 2.2 ms on 512 x 1024, as long as a whole entmax15), only on rows long enough that the
    #: rounds on whole rows cost more.
    candidates_from = 0

    def support_sums(self, y, c, squares: bool, y_max=None):
        """``(count, sum, sum of squares or None)`` per row of ``u = (y - c)_+`` over ``u > 0``.

        ``y_max``: a number no entry of ``y`` exceeds, where the caller knows one (the rules' shifted rows: 0); a
        target may use it to count the support from ``u`` by a cheaper operation where it bounds ``u``."""
        u = self.pos_diff(y, c)
        return self.row_sum(self.support(u)), self.row_sum(u), self.row_sum(u * u) if squares else None

    def power_sums(self, b, c, km1, floor):
        """``(p, sum p, sum p / max(u, floor))`` per row of ``u = (b - c)_+``, ``p = max(u, floor)**km1 * u``
        (the power-form Newton's values; ``km1 = k - 1``, ``floor`` a number or ``(R, 1)``)."""
        u = self.pos_diff(b, c)
        safe = self.clamp_min(u, floor)
        p = self.exp(km1 * self.log(safe)) * u
        return p, self.row_sum(p), self.row_sum(p / safe)

    def repeat_rows(self, n: int, body: Callable, state: tuple, going, rows: tuple = (), tail: bool = False):
        """:meth:`repeat` of ``body(state, rows) -> (state, going)`` that computes each row from that row alone.

        ``state`` holds arrays of shape ``(R, ...)``; ``rows`` holds arrays of shape
        ``(R, ...)`` and numbers or 0-d arrays (the same for every row).  A target may
        run a round on the rows still going only, with those rows of ``state`` and
        ``rows``; the rows that stopped keep their state (``body`` leaves a row that is not going as it is).

        Here every row takes every round; with ``tail`` (rounds that cost more than gathering rows: a solve's
        transcendental links, not Michelot's sums), until at most :meth:`tail_rows` rows are going, where a target
        gives that size: then those rows, and others up to that many, are gathered and go on alone
        (:meth:`_repeat_tail`).
        """
        count = going.shape[0] if tail and self.gathers_tail else None
        tail = self.tail_rows(count) if isinstance(count, int) else 0
        if not 0 < tail < count:
            return self.repeat(n, lambda state: body(state, rows), state, going)
        return self._repeat_tail(n, body, tuple(state), going, rows, tail)

    #: Whether :meth:`repeat_rows` ends its rounds on the rows still going, gathered: a target whose rounds run on
    #: every row (a traced loop with static shapes) sets it and gives ``take_rows(a, index)``,
    #: ``put_rows(a, index, b)`` (a copy of ``a`` with the rows ``index`` set to ``b``), ``first_rows(mask, size)``
    #: (the index of ``size`` distinct rows, those where the ``(R, 1)`` boolean ``mask`` is true first) and
    #: ``count_true(mask)`` (a 0-d count).
    gathers_tail = False

    def tail_rows(self, count: int) -> int:
        """How many of ``count`` rows :meth:`repeat_rows` gathers to end its rounds on (0: none, every row takes
        every round): an eighth of them, on targets that :attr:`gathers_tail`, from 64 rows.  (On 512 N(0, 1)
        rows of 64, ``p**3``'s Halley rounds leave 52 rows going after 7 of its 17; ``p**2/2 + p**4/4``'s 58
        after 3 of 7.)"""
        return count // TAIL_PART if self.gathers_tail and count >= 8 * TAIL_PART else 0

    def _repeat_tail(self, n: int, body: Callable, state: tuple, going, rows: tuple, tail: int):
        """:meth:`repeat_rows` in two loops: every row while more than ``tail`` are going, then the ``tail`` rows
        gathered (those going first), each row within its ``n`` rounds (counted per row, ``k``)."""
        count = going.shape[0]
        k = self.float_(going) * 0

        def head(carry):
            *inner, k, _ = carry
            new, now = body(tuple(inner), rows)
            return (*new, k + 1, now), now & (self.count_true(now) > tail)

        *state, k, going = self.repeat(n, head, (*state, k, going), going)
        going = going & (k < n)
        index = self.first_rows(going, tail)

        def take(values):
            return tuple(self.take_rows(v, index) if getattr(v, "ndim", 0) and v.shape[0] == count else v
                         for v in values)

        few = take(rows)

        def rest(carry):
            *inner, k, _ = carry
            new, now = body(tuple(inner), few)
            k = k + 1
            now = now & (k < n)
            return (*new, k, now), now

        *done, _, _ = self.repeat(n, rest, take((*state, k, going)), self.take_rows(going, index))
        return tuple(self.put_rows(a, index, b) for a, b in zip(state, done))

    def on_rows(self, mask, fn: Callable, rows: tuple, otherwise):
        """``fn(*rows)`` where the ``(R, 1)`` boolean ``mask`` is true, ``otherwise`` elsewhere (``fn`` works row by row).

        ``rows`` as in :meth:`repeat_rows`; a target may evaluate ``fn`` on the masked rows only.
        """
        return self.branch(mask, lambda: self.where(mask, fn(*rows), otherwise), lambda: otherwise)

    def rare_rows(self, mask, fn: Callable, r: "Routines", rows: tuple, otherwise):
        """:meth:`on_rows` of ``fn(ops, r, *rows)`` for rows that seldom need it (a solve's fallback): ``fn`` a
        module-level function, ``r`` a generated module's routines (their parameters among ``rows``, as ``fn``
        binds them).  A target that traces may run it outside its graph, on the rows concerned alone, so that the
        graph holds none of its operations (:class:`numeric.torch._ops.TorchOps`: a compile of ``fn``'s solve
        costs as much as the rest of a typed map's)."""
        return self.on_rows(mask, lambda *rows: fn(self, r, *rows), rows, otherwise)


class CompactRows:
    """:meth:`TensorOps.repeat_rows` and :meth:`TensorOps.on_rows` computing only the rows concerned, for a target
    that reads values eagerly (NumPy, torch outside compilation).

    A round runs on the rows still going once they are at most half of those of the round before (gathered
    together); the others' state is written back then.  The target provides ``count_rows(mask)`` and
    ``row_index(mask)`` (how many rows, and which, an ``(R, 1)`` boolean marks: an int, a 1-D index),
    ``take_rows(a, index)`` (``index`` also a slice) and ``put_rows(a, index, b)`` (a copy
    of ``a`` with those rows ``b``), and ``cat_rows(arrays)``, arrays one below the other
    (:meth:`in_blocks` solves blocks of rows one after the other).
    """

    def repeat_rows(self, n: int, body: Callable, state: tuple, going, rows: tuple = (), tail: bool = False):
        state = tuple(state)
        done = list(state)
        where = None  # the original index of each row in the rounds, None: all of them in order
        for _ in range(n):
            live = self.count_rows(going)
            if live == 0:
                break
            count = going.shape[0]
            if 2 * live <= count:
                keep = self.row_index(going)
                done = self._put_all(done, where, state)
                where = keep if where is None else where[keep]
                state, rows, going = self.take_all(state, keep, count), self.take_all(rows, keep, count), going[keep]
            state, going = body(tuple(state), rows)
        return tuple(self._put_all(done, where, state))

    def on_rows(self, mask, fn: Callable, rows: tuple, otherwise):
        keep = self.row_index(mask)
        if len(keep) == 0:
            return otherwise
        if len(keep) == mask.shape[0]:
            return fn(*rows)
        return self.put_rows(otherwise, keep, fn(*self.take_all(rows, keep, mask.shape[0])))

    def in_blocks(self, size: int, fn: Callable, rows: tuple):
        count = rows[0].shape[0]
        size = max(1, size // rows[0].shape[-1])
        if size >= count:
            return fn(*rows)
        parts = [fn(*self.take_all(rows, slice(lo, lo + size), count)) for lo in range(0, count, size)]
        return self.cat_rows(parts)

    def take_all(self, values, keep, count):
        """The rows ``keep`` of each array with ``count`` rows; other values (numbers, 0-d arrays) as they are."""
        return tuple(self.take_rows(v, keep) if getattr(v, "ndim", 0) and v.shape[0] == count else v for v in values)

    def _put_all(self, done, where, state):
        """``done`` with the rows ``where`` (all where ``None``) set to ``state``."""
        if where is None:
            return list(state)
        return [self.put_rows(d, where, s) for d, s in zip(done, state)]


class Routines:
    """A map's routines (``{name: function or None}``) bound to parameter values: ``r.omega(p)`` is ``omega(p, *params)``.

    ``module`` gives the constants (``THRESHOLD``, ``THRESHOLD_DEGREE``, ``LINK_FORM``, ``PARAMETERS``).
    """

    def __init__(self, module, table: dict, params: tuple = ()):
        self.module = module
        self.table = table
        self.params = tuple(params)

    def has(self, name: str) -> bool:
        return self.table.get(name) is not None

    def bound(self, params: tuple) -> "Routines":
        """The same routines bound to ``params`` (a block of rows' own values: :meth:`TensorOps.repeat_rows`)."""
        return Routines(self.module, self.table, params)

    def __getattr__(self, name: str):
        table = self.__dict__["table"]
        if name not in table:
            raise AttributeError(name)
        fn = table[name]
        if fn is None:
            return None
        params = self.__dict__["params"]
        return (lambda *args: fn(*args, *params)) if params else fn


def uncat(both, n):
    """``(p, t)`` from ``p`` and ``t`` side by side."""
    return both[..., :n], both[..., n:]


def row_length(y):
    """The length of the rows ``y`` as a float (or as a target that traces gives it, a value of its own)."""
    n = y.shape[-1]
    return float(n) if isinstance(n, int) else n


def log_of(ops, x):
    """``log(x)`` of a number (``math.log``) or of a target's value."""
    return math.log(x) if isinstance(x, (int, float)) else ops.log(x)
