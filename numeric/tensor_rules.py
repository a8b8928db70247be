"""The threshold rules and the derivative formulas of a map, written once for every array framework.

The functions here take an operations object (:class:`TensorOps`, an
extension of :class:`numeric.newton.Ops`), a table of the map's routines
bound to its parameter values (:class:`Routines`, built from a generated
module's routines on the framework's arrays, :func:`numeric.contract.routines_on`) and 2-D arrays of scores
with rows along the last axis.  They are functional (no array is written in
place), keep shapes static (masks are ``where``, never boolean indexing) and
branch on values only through the operations ``repeat`` (a loop with a fixed
budget that may stop early when no row is still going) and ``branch`` (a
computation needed only when some row asks for it), so one text serves
PyTorch (:mod:`numeric.torch`) and a JAX backend (``lax.while_loop`` and
``lax.cond``).

Parameters are arrays of shape ``(rows, 1)`` (one value per row) or of
shape ``()``; constants a routine returns as Python floats (``clip()`` of a
map without parameters) take part as numbers.

* :func:`solve`: ``(p, tau)`` for rows of scores: masked scores ``-inf`` get
  ``p = 0``, a fully masked row zeros (``tau = +inf``), a row with a NaN (or
  ``+inf``) NaN; the other rows are shifted by their maximum and solved by the
  module's rule:
* :func:`closed_rule`: ``p = B(y) / sum B(y)``, ``tau - m = tau_from_sum(S)``;
* :func:`sort_rule`: sorted scores, cumulative sums of the shifted scores and
  their squares, ``tau_candidate`` (and ``discriminant`` for degree 2), the
  largest valid support size;
* :func:`support_rule`: the same ``tau`` without sorting, for a sort map:
  Newton steps on ``F(t) = sum g_+(y - t)`` from a lower bound until the
  support ``S`` at ``t`` gives a candidate ``tau_S`` whose own support is
  ``S`` (then ``tau_S`` is exact); rows that do not get there within the
  budget take :func:`sort_rule`;
* :func:`root_rule`: safeguarded Halley on ``omega'(F(t)) = omega'(1)`` inside
  the bracket ``[-omega'(1), -omega'(1/n)]``, with the
  link of the power form ``(a (z - clip))**k`` evaluated as ``exp(k log base)``
  in the variable ``t = -c / a`` (``c = p_max**(1/k)``; rows where ``c`` may leave the
  normal range, large alpha on long rows, in ``log(a / c)``), else the printed link,
  else :func:`numeric.newton.invert_link`;
* :func:`jvp`: ``J v = w*v - w (w.v) / sum(w)``, ``w = weight(p)`` on the support;
* :func:`param_vjp`: ``sum_i u_i dp_i/dq = -(J u) . c`` with ``c = omega_prime_d_q(p)``.

Routines are evaluated at ``p = 1`` off the support and masked, so no inf or
NaN of an unused branch reaches a result or a gradient.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable

from .newton import Ops, invert_link, safeguarded_point

__all__ = ["TensorOps", "CompactRows", "Routines", "solve", "closed_rule", "sort_rule", "sort_threshold", "support_rule", "root_rule", "kkt_rule",
           "sort_link", "at_threshold", "recomputable", "jvp", "box_solve", "box_vjp", "box_free", "box_exits", "clipped_link", "param_vjp", "omega_terms", "ROOT_STEPS", "SUPPORT_STEPS", "KKT_STEPS",
           "KKT_FREE_STEPS", "KKT_CANDIDATES", "KKT_BLOCK", "weight_at_zero"]

#: Iteration budget of the root rule's safeguarded Halley solve.
ROOT_STEPS = 100
#: Newton steps of :func:`support_rule` before its remaining rows take the sort rule.
SUPPORT_STEPS = 12
#: Iteration budget of :func:`kkt_rule` before its remaining rows take the safeguarded Halley solve.
KKT_STEPS = 40
#: Iteration budget of :func:`_power_log_rule`'s bisection (a bracket of ``log(n) / k`` to a few ulps).
LOG_STEPS = 200
#: Steps of :func:`kkt_rule` that need only land in the bracket; later ones must also halve the step before last.
KKT_FREE_STEPS = 8
#: The largest step of :func:`kkt_rule` in ``log p`` (``p`` grows at most by ``e`` a step there).
KKT_LOG_STEP = 1.0
#: A sparse map's :func:`kkt_rule` solves its rows' KKT_CANDIDATES + 1 largest scores first.
KKT_CANDIDATES = 15
#: The largest factor by which :func:`_kkt_newton`'s step in ``p**beta`` multiplies ``p**beta`` (a sparse map's;
#: :func:`_elastic_step`).
KKT_ELASTIC_CEIL = 2.0**20
#: Rounds of Michelot's fixed point for a sparse map's start in :func:`kkt_rule` (``_linear_start``).
LINEAR_START_STEPS = 6
#: The most scores in one block of rows of :func:`kkt_rule` on whole rows (1 MiB of float32), where a target
#: solves in blocks (:meth:`TensorOps.in_blocks`): each block pays a round's fixed costs, and a larger one
#: leaves the cache (512 x 1024 float32, one thread: torch forward 15.5 ms in blocks of 2**18 scores, 20 ms
#: of 2**16, 25 ms of 2**15, 20 ms of 2**19).
KKT_BLOCK = 1 << 18


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
      at ``index`` in each row; ``int_max(x)``: the largest entry of ``x`` (whole numbers)
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

    def put(self, values, index, like):  # pragma: no cover - interface
        raise NotImplementedError

    def int_max(self, x):  # pragma: no cover - interface
        raise NotImplementedError

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

    #: Whether the target sorts rows (:meth:`sort_desc`); where it does not (device code), :func:`support_rule`'s
    #: open rows take the support at :func:`root_rule`'s threshold instead of :func:`sort_rule`.
    sorts = True

    def at_most(self, x, v):
        """``where(x < v, x, v)`` for a number ``v`` (NaN to ``v``)."""
        return self.where(x < v, x, v)

    def rare(self, pred, fn: Callable, otherwise: Callable):
        """``fn()`` if any entry of ``pred`` is true, else ``otherwise()``, where ``otherwise()`` is ``fn()``
        made cheaper by ``pred`` being false everywhere (``where(pred, a, b)`` that is ``b``).

        A target that fuses elementwise work (JAX under ``jit``) takes ``fn()`` and no branch; one that
        runs each operation as it comes skips the work ``pred`` would have masked.
        """
        return self.branch(pred, fn, otherwise)

    #: Whether :func:`solve` takes a closed threshold from the unshifted scores where that is exact
    #: (:func:`closed_unshifted`; a target whose results must not move by rounding leaves it off).
    shift_free = False

    #: The shortest rows on which :func:`kkt_rule` solves a sparse map's candidates first: where ``top(x, k)``
    #: costs more than a few passes over ``x`` (XLA's ``top_k`` on the CPU: 0.8 ms on 512 x 64 float32
    #: scores, 2.2 ms on 512 x 1024, as long as a whole entmax15), only on rows long enough that the
    #: rounds on whole rows cost more.
    candidates_from = 0

    def sub_rows(self, x, c, out=None):
        """``x - c`` for ``(R, n)`` ``x`` and ``(R, 1)`` ``c``; a target may write it into ``out`` (``None``: none given)."""
        return x - c

    def div_rows(self, b, total, out=None):
        """``b / total`` for ``(R, n)`` ``b`` and ``(R, 1)`` ``total``; a target may write it into ``b``, which
        the rules no longer read, or into ``out`` (``None``: none given)."""
        return b / total

    def exp_into(self, x, out=None):
        """``exp(x)``; a target may write it into ``out`` where that is not ``x``'s memory."""
        return self.exp(x)

    def pos_part_into(self, x, out=None):
        """``pos_part(x)``; a target may write it into ``x`` (which the rules no longer read) or ``out``."""
        return self.pos_part(x)

    def square_into(self, x):
        """``x * x``; a target may write it into ``x``, which the rules no longer read."""
        return x * x

    #: Row length from which a sort map's threshold comes from each row's largest scores, selected and
    #: sorted (:func:`sort_threshold`); ``None``: never (then :func:`support_rule`, no sort).
    partial_from = None
    #: With :attr:`partial_from`: rows shorter than this of a link of degree 1 take :func:`support_rule`.
    support_below = 0

    def largest(self, x, k: int):
        """The ``k`` largest entries of each row, in decreasing order."""
        return self.sort_desc(self.top(x, k)[0])

    def support_sums(self, y, c, squares: bool):
        """``(count, sum, sum of squares or None)`` per row of ``u = (y - c)_+`` over ``u > 0``."""
        u = self.pos_diff(y, c)
        return self.row_sum(self.support(u)), self.row_sum(u), self.row_sum(u * u) if squares else None

    def power_sums(self, b, c, km1, floor):
        """``(p, sum p, sum p / max(u, floor))`` per row of ``u = (b - c)_+``, ``p = max(u, floor)**km1 * u``
        (the power-form Newton's values; ``km1 = k - 1``, ``floor`` a number or ``(R, 1)``)."""
        u = self.pos_diff(b, c)
        safe = self.clamp_min(u, floor)
        p = self.exp(km1 * self.log(safe)) * u
        return p, self.row_sum(p), self.row_sum(p / safe)

    def repeat_rows(self, n: int, body: Callable, state: tuple, going, rows: tuple = ()):
        """:meth:`repeat` of ``body(state, rows) -> (state, going)`` that computes each row from that row alone.

        ``state`` holds arrays of shape ``(R, ...)``; ``rows`` holds arrays of shape
        ``(R, ...)`` and numbers or 0-d arrays (the same for every row).  A target may
        run a round on the rows still going only, with those rows of ``state`` and
        ``rows``; the rows that stopped keep their state.
        """
        return self.repeat(n, lambda state: body(state, rows), state, going)

    def on_rows(self, mask, fn: Callable, rows: tuple, otherwise):
        """``fn(*rows)`` where the ``(R, 1)`` boolean ``mask`` is true, ``otherwise`` elsewhere (``fn`` works row by row).

        ``rows`` as in :meth:`repeat_rows`; a target may evaluate ``fn`` on the masked rows only.
        """
        return self.branch(mask, lambda: self.where(mask, fn(*rows), otherwise), lambda: otherwise)


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

    def repeat_rows(self, n: int, body: Callable, state: tuple, going, rows: tuple = ()):
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
                state, rows, going = self._take_all(state, keep, count), self._take_all(rows, keep, count), going[keep]
            state, going = body(tuple(state), rows)
        return tuple(self._put_all(done, where, state))

    def on_rows(self, mask, fn: Callable, rows: tuple, otherwise):
        keep = self.row_index(mask)
        if len(keep) == 0:
            return otherwise
        if len(keep) == mask.shape[0]:
            return fn(*rows)
        return self.put_rows(otherwise, keep, fn(*self._take_all(rows, keep, mask.shape[0])))

    def in_blocks(self, size: int, fn: Callable, rows: tuple):
        count = rows[0].shape[0]
        size = max(1, size // rows[0].shape[-1])
        if size >= count:
            return fn(*rows)
        parts = [fn(*self._take_all(rows, slice(lo, lo + size), count)) for lo in range(0, count, size)]
        return self.cat_rows(parts)

    def _take_all(self, values, keep, count):
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

    def __getattr__(self, name: str):
        table = self.__dict__["table"]
        if name not in table:
            raise AttributeError(name)
        fn = table[name]
        if fn is None:
            return None
        params = self.__dict__["params"]
        return (lambda *args: fn(*args, *params)) if params else fn


# ------------------------------------------------------------------ forward
def solve(ops: TensorOps, r: Routines, x, *, method: str = "auto", relative: bool = False, out=None):
    """``(p, tau)`` for the rows of ``x`` (2-D), ``tau`` of shape ``(rows, 1)``.

    ``method``: ``"auto"`` (the module's rule; a sort map takes :func:`sort_threshold`),
    or ``"sort"`` / ``"root"`` to force one (``"root"`` applies to every map).
    ``relative``: ``tau`` less each row's maximum score, as the rules find it (the
    absolute ``tau`` rounds at the scale of the scores, which may be far larger than
    their spread); ``inf`` for a fully masked row and NaN for a NaN one either way.
    ``out``: an array of ``x``'s shape (it may be ``x``) that a target may use for
    ``p`` and as scratch (see :meth:`TensorOps.sub_rows`); ``p`` is returned either way.
    """
    kind = r.module.THRESHOLD if method == "auto" else method
    if kind == "closed" and ops.shift_free and not relative:
        return closed_unshifted(ops, r, x, out)
    return _solve_shifted(ops, r, x, method, kind, relative, out)


def closed_unshifted(ops: TensorOps, r: Routines, x, out=None):
    """:func:`solve` for a closed map, with no shift where none is needed: ``p_i = B(s_i) / S``, ``S = sum_j B(s_j)``.

    For a closed threshold ``B`` is an exponential, ``b e^{c s}``.  Unshifted, a row
    is as accurate as shifted by its maximum (more: ``s - m`` rounds, ``s`` does not)
    when ``S`` is finite and ``S >= 1``: then ``p_i <= B(s_i)``, so where ``B(s_i)``
    leaves the normal range ``p_i`` is below it too.  That saves the row maximum and
    the shift (two passes of three).  The other rows (NaN, fully masked,
    overflowing, or all scores far below 0) are solved shifted.
    """
    b = ops.exp_into(x, out) if getattr(r.module, "TERM_IS_EXP", False) else r.term(x)
    total = ops.row_sum(b)
    ok = (total >= 1) & (total < float("inf"))  # False for NaN
    n = x.shape[-1]

    def shifted():
        def rows(x, *params):
            return ops.cat(*_solve_shifted(ops, Routines(r.module, r.table, params), x, "auto", "closed", False))

        both = ops.on_rows(ops.not_(ok), rows, (x, *r.params), ops.cat(b, total))  # (reads x before out is written)
        safe = ops.where(ok, total, 1)
        p = ops.div_rows(b, safe, out)
        return ops.where(ok, p, both[..., :n]), ops.where(ok, r.tau_from_sum(safe), both[..., n:])

    return ops.branch(ops.not_(ok), shifted, lambda: (ops.div_rows(b, total, out), r.tau_from_sum(total)))


def _solve_shifted(ops, r, x, method, kind, relative, out=None):
    """:func:`solve` with every row shifted by its maximum."""
    m = ops.row_max(x)  # NaN with a NaN in the row, -inf when fully masked, +inf with a +inf score
    bad = ops.not_(ops.isfinite(m))
    m0 = ops.where(bad, 0, m)
    # bad rows are solved as zeros and overwritten below (full-size masks only where there are some)
    y = ops.branch(bad, lambda: ops.where(bad, 0, x - m0), lambda: ops.sub_rows(x, m0, out))
    if kind == "closed":
        p, t = closed_rule(ops, r, y, out)
    elif kind == "root":
        p, t = root_rule(ops, r, y)
    else:
        t = sort_rule(ops, r, y) if method == "sort" else sort_threshold(ops, r, y)
        p = sort_link(ops, r, ops.sub_rows(y, t, out), out)
    tau = t if relative else m0 + t

    def overwrite():
        invalid = ops.isnan(m) | (m > 0) & bad
        nan = ops.full(m, float("nan"))
        return (ops.where(bad, ops.where(invalid, nan, 0), p),
                ops.where(bad, ops.where(invalid, nan, float("inf")), tau))

    return ops.branch(bad, overwrite, lambda: (p, tau))


def recomputable(r: Routines) -> bool:
    """Whether a map's ``p`` is :func:`at_threshold` of its ``tau``: a sort or closed map, or a link of the power form
    (whose rows where ``tau`` does not carry ``p`` :func:`at_threshold` solves again).
    """
    module = r.module
    return (module.THRESHOLD == "sort" or module.THRESHOLD == "closed" and r.has("link")
            or module.LINK_FORM == "power" and r.has("link_scale"))


def at_threshold(ops: TensorOps, r: Routines, x, t):
    """``p = g_+(x - tau) / sum g_+(x - tau)`` for rows ``x`` and the relative threshold ``t = tau - max(x)``
    that :func:`solve` gave them with ``relative=True`` (a :func:`recomputable` map): a maximum and one
    pass instead of a solve, e.g. for the weights of attention's backward pass.

    ``x - tau`` is computed as ``(x - max(x)) - t``, as the solve did.  The sum is 1 to
    rounding; dividing by it gives the solved ``p`` to rounding.  A fully masked row
    (``t = inf``) gives 0, a NaN row (``t`` NaN) NaN.  A root map's rows whose sum is
    not 1 to rounding (at a kink of ``F`` the root rule combines the ends of a bracket;
    no single ``tau`` gives that ``p``), or whose ``c = p_max**(1/k)`` leaves the normal
    range (:func:`_power_log_rule`), are solved again.
    """
    m = ops.row_max(x)
    z = x - ops.where(ops.isfinite(m), m, 0) - t
    power = r.module.LINK_FORM == "power" and r.has("link_scale")
    if power and _small_power(r) is None:
        g, _, _ = _power_link(ops, r.link_exponent(), r.link_scale() * (z - r.clip()))
    else:  # the clipped link, as the sort rule evaluates it
        g = sort_link(ops, r, z)
    total = ops.row_sum(g)
    p = ops.where(total == 0, 0, g / total)
    if r.module.THRESHOLD != "root" or not power:
        return p
    # rows whose tau does not carry p: c = p_max**(1/k) out of range (solved in log(a / c)), or, where F
    # jumps at a kink (k < 1), F(tau) not 1 to the root rule's tolerance (its p combines a bracket's ends)
    def again(x, *params):
        return solve(ops, Routines(r.module, r.table, params), x)[0]

    k = r.link_exponent()
    far = _far_rows(ops, k, x)  # (a Python bool where k is a number)
    if far is True:
        return again(x, *r.params)
    if isinstance(k, (int, float)) and k >= 1:
        return p
    redo = ops.isfinite(t) & (abs(total - 1) > 4 * ops.eps)
    if not isinstance(k, (int, float)):
        redo = redo & (k < 1) | far
    return ops.on_rows(redo, again, (x, *r.params), p)


def closed_rule(ops: TensorOps, r: Routines, y, out=None):
    """``(p, tau - m)`` for shifted rows ``y`` (maximum 0) of a map with a closed threshold."""
    b = r.term(y)
    total = ops.row_sum(b)
    return ops.div_rows(b, total, out), r.tau_from_sum(total)


def _small_power(r):
    """``(a, k)`` where a map's link is derived to be ``(a (z - clip))**k`` with a number ``k`` of 1 or 2, else ``None``."""
    if r.module.LINK_FORM != "power" or not r.has("link_scale"):
        return None
    k = r.link_exponent()
    return (r.link_scale(), k) if isinstance(k, (int, float)) and k in (1, 2) else None


def sort_link(ops: TensorOps, r: Routines, z, out=None):
    """``g_+(z)`` of a sort map (degree 1 or 2), or of any map with a printed link: the link where ``z > clip``,
    else 0.

    A link of the power form ``(a (z - clip))**k``, ``k`` 1 or 2, is evaluated as
    ``u = max(a (z - clip), 0)`` (``max(z, 0)`` where ``a = 1`` and ``clip = 0``), ``u`` or ``u * u``;
    other links are the printed ones.  ``z`` is not read afterwards: a target may write ``g`` over
    it or into ``out`` (see :meth:`TensorOps.pos_part_into`).
    """
    clip = r.clip()
    power = _small_power(r)
    if power is not None:
        a, k = power
        u = z if isinstance(clip, (int, float)) and clip == 0 else z - clip
        u = ops.pos_part_into(u if isinstance(a, (int, float)) and a == 1 else a * u, out)
        return u if k == 1 else ops.square_into(u)
    live = z > clip
    g = r.link(ops.where(live, z, clip))
    return ops.where(live & (g > 0), g, 0)


def _reach_one(ops, r, like):
    """``omega'(1)`` per row (``like`` has shape ``(rows, 1)``)."""
    return r.omega_prime(ops.full(like, 1.0))


def sort_threshold(ops: TensorOps, r: Routines, y):
    """``tau - m`` for shifted rows ``y`` of a sort map, by the target's choice (:attr:`TensorOps.partial_from`).

    Without one, :func:`support_rule`.  With one, rows shorter than it take :func:`sort_rule`
    (a link of degree 1 on rows shorter than :attr:`TensorOps.support_below` :func:`support_rule`),
    longer ones :func:`sort_rule` on their ``K = min(64, max(8, n // 4))`` largest scores: the support
    being a prefix of the sorted scores, the answer is exact where the support ends before ``K``;
    rows where it does not are solved again with ``4 K``, and so on up to whole rows.
    """
    start = ops.partial_from
    n = y.shape[-1]
    if start is None:
        return support_rule(ops, r, y)
    power = _small_power(r)
    if power is not None and power[1] == 1 and n < ops.support_below:
        return support_rule(ops, r, y)
    if n < start:
        return sort_rule(ops, r, y)
    return _sort_largest(ops, r, y, min(64, max(8, n // 4)))


def _sort_largest(ops, r, y, k):
    """:func:`sort_threshold` from each row's ``k`` largest scores, then ``4 k`` on the rows whose support fills them."""
    n = y.shape[-1]
    if k >= n:
        return sort_rule(ops, r, y)
    ys = ops.largest(y, k)
    t = sort_rule(ops, r, ys, ordered=True)
    # the smallest of the k off the support: so is every score left out
    full = ys[..., k - 1:] - t > r.clip()

    def more(y, *params):
        return _sort_largest(ops, Routines(r.module, r.table, params), y, 4 * k)

    return ops.on_rows(full, more, (y, *r.params), t)


def sort_rule(ops: TensorOps, r: Routines, y, ordered: bool = False):
    """``tau - m`` for shifted rows ``y`` by the support rule on sorted scores (``ordered``: ``y`` is sorted
    in decreasing order already)."""
    ys = y if ordered else ops.sort_desc(y)
    clip = r.clip()
    # tau >= m - omega'(1): scores at most omega'(0+) - omega'(1) below the maximum never count
    reach = clip - _reach_one(ops, r, ys[..., :1])
    live = ys > reach
    y0 = ops.where(live, ys, 0)
    s1 = ops.cumsum(y0)
    s2 = ops.cumsum(y0 * y0)
    k = ops.cumsum(ops.full(ys, 1.0))
    ok = live
    if r.has("discriminant"):
        ok = ok & (r.discriminant(k, s1, s2) >= 0)
    # (1, 0, 0): the always-feasible support of the largest score alone
    cand = r.tau_candidate(ops.where(ok, k, 1), ops.where(ok, s1, 0), ops.where(ok, s2, 0))
    good = ok & (ys - cand > clip) | (k == 1)
    last = ops.row_max(ops.where(good, k, 0))
    return ops.row_sum(ops.where(k == last, cand, 0))


def support_rule(ops: TensorOps, r: Routines, y, steps: int = SUPPORT_STEPS):
    """``tau - m`` for shifted rows ``y`` of a sort map, without sorting.

    ``F(t) = sum_i g_+(y_i - t)`` is convex and decreasing for the sort maps' links
    (degree 1 or 2, ``g = (a (z - clip))**k`` with ``k >= 1``), so Newton's method
    from a lower bound of ``t*`` stays below it and converges.  At every step the
    support ``S = {y > t + clip}`` gives the candidate ``tau_S = tau_candidate(|S|,
    sum_S y, sum_S y**2)``; where the support at ``tau_S`` is ``S`` again (same
    count: both are sets of largest scores), ``F(tau_S) = 1`` on the link's rising
    branch, so ``tau_S`` is ``t*``.  The start is the larger of ``-omega'(1)`` and the
    Jensen bound ``mean(y) - omega'(1/n)`` (on rows without masked scores).  For degree 1 the Newton step is
    ``tau_S`` itself (Michelot's algorithm).  Rows still open after ``steps`` steps
    take :func:`sort_rule` (on a target that cannot sort, :func:`_support_at_root`).
    """
    power = _small_power(r)
    n = y.shape[-1]
    lo = -_reach_one(ops, r, y[..., :1])
    # Jensen: F(t) >= n g(mean(y) - t); -inf where a score is masked (then -omega'(1) alone)
    jensen = ops.row_sum(y) / n - r.omega_prime(lo * 0 + 1 / n)
    t = ops.where(jensen > lo, jensen, lo)
    result = lo * float("nan")
    active = ops.isfinite(lo)
    rows = (y, *r.params)  # what a row's rounds read: its scores and parameters

    def bound(rows):
        return rows[0], Routines(r.module, r.table, rows[1:])

    if power is None:
        t, result, active = _support_generic(ops, bound, rows, t, result, active, steps)
    elif power[1] == 1:  # F is piecewise linear: the Newton step is the candidate (Michelot), exact once S repeats
        # Start from the middle of [-omega'(1), -omega'(0+)] where Jensen's bound is below it: the start need not be
        # a lower bound, since from any t with a non-empty support the first step lands on one (F is convex: its
        # tangent lies below it), and most rows start closer to t* (a round fewer on N(0, 1) rows)
        mid = (lo - r.clip()) / 2
        t = ops.where(t > mid, t, mid)

        def body(state, rows):
            y, r = bound(rows)
            t, below, result, size, active = state
            c = t + r.clip()  # the support at t: y > c
            kk, su, _ = ops.support_sums(y, c, False)
            cand = r.tau_candidate(kk, su + kk * c, 0 * kk)
            exact = kk == size
            result = ops.where(active & exact, cand, result)
            # t rises from the lower bound ``below`` (-omega'(1) before the first round, t itself after it)
            t = ops.where(active, ops.where(cand > below, cand, below), t)
            size = ops.where(active, kk, size)
            active = active & ops.not_(exact)
            return (t, t, result, size, active), active

        t, _, result, _, active = ops.repeat_rows(steps + 1, body, (t, lo, result, lo * 0 + (n + 1), active), active,
                                                  rows)
    else:
        def body(state, rows):
            y, r = bound(rows)
            t, result, active = state
            a, clip = r.link_scale(), r.clip()
            c = t + clip
            kk, su, su2 = ops.support_sums(y, c, True)
            s1 = su + kk * c
            s2 = su2 + 2 * c * su + kk * c * c  # sum_S y**2 with y = u + c
            cand = r.tau_candidate(kk, s1, s2)
            exact = (r.discriminant(kk, s1, s2) >= 0) & (ops.support_sums(y, cand + clip, False)[0] == kk)
            # Newton on F = a**2 sum u**2, F' = -2 a**2 sum u, from below (F is convex)
            nxt = t + (a * a * su2 - 1) / (2 * a * a * su)
            result = ops.where(active & exact, cand, result)
            t = ops.where(active & (nxt > t), nxt, t)
            active = active & ops.not_(exact)
            return (t, result, active), active

        t, result, active = ops.repeat_rows(steps, body, (t, result, active), active, rows)
    if ops.sorts:
        return ops.on_rows(active, lambda *rows: sort_rule(ops, bound(rows)[1], rows[0]), rows, result)
    return ops.on_rows(active, lambda *rows: _support_at_root(ops, *bound(rows)), rows, result)


def _support_at_root(ops, y, r):
    """``tau - m`` of a sort map for a target that cannot sort: the candidate ``tau_S`` of the support ``S`` at
    :func:`root_rule`'s threshold (exact where the root rule finds the support; its threshold where ``S`` is empty
    or gives no real candidate)."""
    _, t = root_rule(ops, r, y)
    clip = r.clip()
    pos = y - t > clip
    k = ops.row_sum(ops.float_(pos))
    s1 = ops.row_sum(ops.where(pos, y, 0))
    s2 = ops.row_sum(ops.where(pos, y * y, 0))
    ok = k > 0
    if r.has("discriminant"):
        ok = ok & (r.discriminant(k, s1, s2) >= 0)
    return ops.where(ok, r.tau_candidate(ops.where(ok, k, 1), s1, s2), t)


def _support_generic(ops, bound, rows, t, result, active, steps):
    """:func:`support_rule`'s rounds with the printed link (a sort map whose link is not of the power form): ``(t, result, active)``."""
    def body(state, rows):
        y, r = bound(rows)
        t, result, active = state
        clip = r.clip()
        z = y - t
        pos = z > clip
        k = ops.row_sum(ops.float_(pos))
        s1 = ops.row_sum(ops.where(pos, y, 0))
        if r.has("discriminant"):
            live = y > -float("inf")
            s2 = ops.row_sum(ops.where(pos & live, y * y, 0))
            valid = r.discriminant(k, s1, s2) >= 0
        else:
            s2, valid = 0 * s1, k > 0
        cand = r.tau_candidate(k, s1, s2)
        exact = valid & (ops.row_sum(ops.float_(y - cand > clip)) == k)
        safe = ops.where(pos, z, -t)
        f = ops.row_sum(ops.where(pos, r.link(safe), 0))
        df = ops.row_sum(ops.where(pos, r.link_dtau(safe), 0))
        nxt = t - (f - 1) / df  # Newton on F from below (F is convex)
        result = ops.where(active & exact, cand, result)
        t = ops.where(active & (nxt > t), nxt, t)
        active = active & ops.not_(exact)
        return (t, result, active), active

    return ops.repeat_rows(steps, body, (t, result, active), active, rows)


def _power_parts(ops, r, y):
    """For a link of the power form: ``(a, k, b = a y, reach)`` with ``reach(q) = q**(1/k) / a``."""
    a = r.link_scale()
    k = r.link_exponent()
    return a, k, a * y, (lambda q: ops.exp(ops.log(q) / k) / a)


def root_rule(ops: TensorOps, r: Routines, y, steps: int = ROOT_STEPS):
    """``(p, tau - m)`` for shifted rows ``y`` by safeguarded Halley on ``h(t) = omega'(F(t)) - omega'(1)``.

    A Halley (else Newton) step is taken only where it lands in the bracket and
    moves less than half as far as the step before last, otherwise the bracket is
    bisected (the safeguard of Numerical Recipes' ``rtsafe``,
    :func:`numeric.newton.safeguarded_point`: no cycles across the kinks where a
    score enters or leaves the support); a row stops where
    ``|F - 1| <= 4 eps``, where the step would change ``F`` by less than that, or
    where its bracket is a few ulps wide.  ``p = g_+(y - t) / F(t)``; a row whose
    ``F`` jumps across 1 at a kink (a link with an infinite slope at ``omega'(0+)``)
    takes the combination of ``p`` at the two ends of its final bracket with sum 1:
    every score away from the kink moves by a few ulps between the two ends, so the
    scores at the kink receive the mass the others leave.

    A link of the power form with ``k >= 1`` on every row takes :func:`_power_newton`
    instead (plain Newton from a lower bound: no bracket, fewer operations a step), and
    a link with no closed form :func:`kkt_rule` (no inversion of the link inside the
    threshold's iteration).
    """
    clip = r.clip()
    n = y.shape[-1]
    count = ops.full(y[..., :1], _length(y))  # (masked scores make -reach(1/n) a looser upper end, still one)
    power = r.module.LINK_FORM == "power" and r.has("link_scale")
    if not power and not r.has("link"):
        return kkt_rule(ops, r, y)
    if not power:
        return _root_halley(ops, r, y, steps, None, -r.omega_prime(ops.full(count, 1.0)), -r.omega_prime(1 / count))
    # the variable t = tau - m - clip = -c / a, c = p_max**(1/k): base = max(a y - a t, 0), p = base**k
    a, k, b, reach = _power_parts(ops, r, y)
    far = _far_rows(ops, k, y)
    if far is True:
        return _power_log_rule(ops, r, y)
    lo = -reach(ops.full(count, 1.0))
    hi = -reach(1 / count)
    # g_+ convex (k >= 1): F(t) >= n g(mean(y) - t) (Jensen), so t >= mean(y) - reach(1/n)
    jensen = ops.row_sum(y) / n - reach(1 / count)  # -inf where a score is masked
    jensen = ops.where(jensen < hi, jensen, hi)
    start = ops.where(jensen > lo, jensen, lo)  # a lower bound of t* where k >= 1

    def newton():
        p, t = _power_newton(ops, a, k, b, start, steps)
        return p, t - clip  # tau - m = t - clip

    if isinstance(k, (int, float)) and far is False:  # a number: the rule is chosen here
        return newton() if k >= 1 else _root_halley(ops, r, y, steps, (a, k, b), lo, hi)
    p, t = ops.branch(k < 1, lambda: _root_halley(ops, r, y, steps, (a, k, b), ops.where(k >= 1, start, lo), hi), newton)

    def log_rule(y, *params):
        return ops.cat(*_power_log_rule(ops, Routines(r.module, r.table, params), y))

    return _split(ops.on_rows(far, log_rule, (y, *r.params), ops.cat(p, t)), n)


def _far_rows(ops, k, y):
    """Where a power-form link's ``c = p_max**(1/k)`` may leave the normal range on the rows ``y`` of ``n``
    scores: ``(1/n)**(1/k) < tiny / eps`` (large alpha on long rows).  A Python bool for a number ``k``,
    else ``(R, 1)`` booleans; those rows take :func:`_power_log_rule`."""
    limit = ops.log_tiny - _log(ops, ops.eps)
    n = _length(y)
    if isinstance(k, (int, float)) and isinstance(n, float):
        return bool(-math.log(n) / k < limit)
    return -_log(ops, n) / (k + ops.full(y[..., :1], 0.0)) < limit


def _power_log_rule(ops, r: Routines, y, steps: int = LOG_STEPS):
    """``(p, tau - m)`` for shifted rows ``y`` of a power-form map whose ``c = p_max**(1/k)`` may underflow.

    The link is ``g_+(z) = max(a (z - clip), 0)**k``.  With ``r = a / c`` the ratios
    ``q_i = p_i / p_max = max(1 + r y_i, 0)**k`` lie in ``[0, 1]`` and ``p_max = c**k``, so
    ``F = sum p = exp(k (log(a) - rho)) Q(rho)``, ``Q = sum q``, in ``rho = log r``, which is
    representable where ``c`` and ``r`` are not: ``r y_i = -exp(rho + log(-y_i))``.  ``F``
    decreases in ``rho`` from at least 1 at ``log(a)`` (``p_max = 1``) to at most 1 at
    ``log(a) + log(count) / k`` (``p_max = 1/count``); bisection keeps ``F(lo) >= 1 >= F(hi)``
    until the bracket is a few ulps wide.  ``p`` is the combination of ``p(lo)`` and ``p(hi)``
    with sum 1 (as :func:`_root_halley` at a kink, where ``F`` jumps across 1 between
    neighbouring floats), divided by its sum.  ``tau - m = -exp(-rho) - clip`` (``-c / a``
    underflows to 0 in the far rows; :func:`at_threshold` solves them again).
    """
    k = r.link_exponent()
    a = r.link_scale()
    log_a = math.log(a) if isinstance(a, (int, float)) else ops.log(a)
    count = ops.row_sum(ops.float_(ops.isfinite(y)))
    log_y = ops.log(-y)  # -inf at the maximum, +inf where masked (p = 0: 1 - inf < 0)

    def values(rho, log_y, log_a, k):
        """``p_i = exp(k (log(u_i) + log(a) - rho))``, ``u_i = max(1 - exp(rho + log(-y_i)), 0)``."""
        return ops.exp(k * (ops.log(ops.pos_part(1 - ops.exp(log_y + rho))) + log_a - rho))

    def body(state, rows):
        lo, hi = state
        mid = 0.5 * (lo + hi)
        above = ops.row_sum(values(mid, *rows)) >= 1  # F(mid) >= 1: the root is at larger rho
        lo, hi = ops.where(above, mid, lo), ops.where(above, hi, mid)
        return (lo, hi), hi - lo > 4 * ops.eps * abs(hi)

    lo = log_a + ops.full(count, 0.0)
    hi = log_a + ops.log(count) / k
    lo, hi = ops.repeat_rows(steps, body, (lo, hi), ops.full(count, True), (log_y, log_a, k))
    p_lo, p_hi = values(lo, log_y, log_a, k), values(hi, log_y, log_a, k)
    f_lo, f_hi = ops.row_sum(p_lo), ops.row_sum(p_hi)
    ok = f_lo > f_hi
    lam = ops.where(ok, (f_lo - 1) / ops.where(ok, f_lo - f_hi, 1), 0)
    p = p_lo + lam * (p_hi - p_lo)
    return p / ops.row_sum(p), -ops.exp(-lo) - r.clip()


def kkt_rule(ops: TensorOps, r: Routines, y, steps: int = KKT_STEPS, candidates: int = KKT_CANDIDATES):
    """``(p, tau - m)`` for shifted rows ``y`` of a map whose link has no closed form: Newton on the KKT system.

    Every score takes part in every round of a dense map (``omega'(0+) = -inf``): its rows are solved in
    blocks of at most :data:`KKT_BLOCK` scores (:meth:`TensorOps.in_blocks`), whose temporaries stay in
    the cache.  A sparse map (``omega'(0+)`` a finite number) whose rows hold more than twice
    ``candidates + 1`` scores solves each row's ``candidates + 1`` largest scores first
    (from :attr:`TensorOps.candidates_from` scores):
    where the smallest of them is off that solution's support, every other score is
    too, and the solution is the row's.  Where it is not, the candidates' threshold is
    below the row's (fewer scores need larger weights), so the row's support lies among
    the scores above it: those rows are solved again on that many largest scores and one
    more (``TensorOps.int_max``), or, where a target cannot read the count (JAX under
    ``jit``), on four times as many as before.
    """
    n = y.shape[-1]
    clip = r.clip()
    if not isinstance(clip, (int, float)) or not math.isfinite(clip) or n <= 2 * (candidates + 1) or n < ops.candidates_from:
        def whole(y, *params):
            return ops.cat(*_kkt_newton(ops, Routines(r.module, r.table, params), y, steps))

        return _split(ops.in_blocks(KKT_BLOCK, whole, (y, *r.params)), n)
    values, index = ops.top(y, candidates + 1)
    p, t = _kkt_newton(ops, r, values, steps)
    # the smallest candidate off the support (masked scores are): the excluded scores are too
    ok = -ops.row_max(-values) - t <= clip
    both = ops.cat(ops.put(p, index, y), t)

    def more(y, t, *params):
        rr = Routines(r.module, r.table, params)
        above = ops.int_max(ops.row_sum(ops.float_(y - t > clip)))
        q, s = kkt_rule(ops, rr, y, steps, 4 * candidates + 3 if above is None else max(above, 2 * candidates + 1))
        return ops.cat(q, s)

    return _split(ops.on_rows(ops.not_(ok), more, (y, t, *r.params), both), n)


def _split(both, n):
    """``(p, t)`` from ``p`` and ``t`` side by side."""
    return both[..., :n], both[..., n:]


def _length(y):
    """The length of the rows ``y`` as a float (or as a target that traces gives it, a value of its own)."""
    n = y.shape[-1]
    return float(n) if isinstance(n, int) else n


def _log(ops, x):
    """``log(x)`` of a number (``math.log``) or of a target's value."""
    return math.log(x) if isinstance(x, (int, float)) else ops.log(x)


def _kkt_newton(ops: TensorOps, r: Routines, y, steps: int):
    """:func:`kkt_rule` on whole rows: Newton in ``(p, tau)`` together.

    The unknowns are the threshold ``t = tau - m`` and every ``p_i`` together:
    ``omega'(p_i) = y_i - t`` on the support ``y_i - t > omega'(0+)`` (``p_i = 0`` off it)
    and ``omega'(sum p) = omega'(1)`` (the constraint ``sum p = 1`` in the form whose
    Newton step is exact for Shannon's ``log``, as :func:`root_rule`'s ``h``).  With
    ``r_i = omega'(p_i) - y_i + t``, ``w_i = 1/omega''(p_i)`` and ``P = sum p`` the step is

        ``dt = -(D + sum w r) / sum w``, ``D = (omega'(1) - omega'(P)) / omega''(P)``,
        ``dp_i = -w_i (r_i + dt)``:

    one evaluation of ``omega'``, ``omega'''`` and of the weight per score and step, and
    no inversion of the link (an iteration inside the iteration).

    * Start: a dense map's link is replaced by the exponential through ``(omega'(1/n), 1/n)``
      with the link's slope there, whose threshold has a closed form (a log-sum-exp); ``t``
      starts there (clamped into the bracket) and ``p`` at that link's values.  For Shannon
      the start is exact, for maps near it (``p log p + p**3``) a few steps off.  A sparse
      map's is replaced by a linear link, sparsemax's form (:func:`_linear_start`).
    * ``p`` stays in the domain.  A dense map's score steps in ``p`` or in ``log p``, whichever
      linearisation of ``omega'`` curves less there (``|omega'''| <= |omega''/p + omega'''|``,
      that is ``omega''' p w >= -1/2``: ``log p`` for Shannon), in ``log p`` wherever
      ``p + dp <= 0``, and there up by a factor of at most ``e`` (:data:`KKT_LOG_STEP`).
      A sparse map's steps by Newton's in ``v = p**beta``, ``beta = p omega''(p) / (omega'(p) -
      omega'(0+))`` the elasticity of ``omega' - omega'(0+)`` at ``p``, in which ``omega'`` is
      linear wherever it is a power of ``p`` (:func:`_elastic_step`; Gini: ``beta = 1``, a step
      in ``p``; alpha-entmax: ``alpha - 1``, exact near ``p = 0``, where a step in ``p`` or
      ``log p`` converges only linearly), towards ``omega'(p) = z - dt``.  With the linear
      start, on rows of 8 to 1024 scores of spreads 0.1 to 30, ``p**4 + p**2/2`` and
      ``(p**1.5 - p)/0.75 + p**3`` take at most 12 rounds (23 and 45 with the exponential start
      and steps in ``p`` or ``log p``).  A score entering the support (``p = 0``) starts from
      ``w(0) (z - omega'(0+))`` where ``w(0)`` is finite and positive, else from the
      start's exponential (a sparse map's then takes one step in ``p**beta``); a score whose ``p`` underflowed to 0 stays there where ``g(z)``
      is below the smallest normal number (``z <= omega'(tiny)``).
    * ``t`` stays in the bracket ``[-omega'(1), -omega'(1/n)]``, which shrinks where the
      first-order value ``F(t) ~ P - sum w r`` is farther from 1 than twice its own
      correction; a step leaving the bracket, or after :data:`KKT_FREE_STEPS` steps one
      not halving the step before last, bisects it (``rtsafe``'s safeguard, :func:`numeric.newton.safeguarded_point`).
    * A row stops where its step is within rounding: ``t`` moves by at most
      ``4 eps (1 + |t| + sum w e / sum w)`` and every ``p_i`` by at most ``16 eps (p_i + w_i e_i) + tiny``,
      with ``e_i = |z_i| + |t| + |omega'(p_i)|`` the scale of the rounding of ``r_i``, or where the
      round's next step, taken at its end, leaves only a remainder below that rounding
      (:func:`_final_step`: one round fewer per row); ``p`` is then
      taken to sum 1 by a first-order step in ``t`` (:func:`_to_sum_one`).  Rows that do
      not (the budget of ``steps`` runs out, or the bracket closes on a kink of ``F``)
      are solved by :func:`_root_halley` with the link inverted by
      :func:`numeric.newton.invert_link`.
    """
    n = y.shape[-1]
    live = ops.isfinite(y)
    count = ops.row_sum(ops.float_(live))
    one = r.omega_prime(ops.full(count, 1.0))
    lo = -one
    hi = -r.omega_prime(1 / count)
    clip = r.clip()
    # the support is z > clip; where omega'(0+) = -inf that is every live score, whose p stays positive
    sparse = not isinstance(clip, (int, float)) or math.isfinite(clip)
    if sparse:  # the exponential through (omega'(1), 1) and (omega'(1/n), 1/n), for scores entering the support
        anchor, at = one, ops.full(count, 0.0)
        span = one + hi
        c = ops.where(span > 0, ops.log(count) / ops.where(span > 0, span, 1), 0)
        p, t = _linear_start(ops, r, y, live, count, clip)
    else:  # the exponential through (omega'(1/n), 1/n) with the link's slope there, 1 / (p omega''(p))
        anchor, at = -hi, -ops.log(count)
        c = count * r.weight(1 / count)
        c = ops.where(ops.isfinite(c) & (c > 0), c, 0)
        e = ops.exp(ops.where(live, c * y, float("-inf")))
        t = ops.where(c > 0, (ops.log(ops.row_sum(e)) + at) / ops.where(c > 0, c, 1) - anchor, lo)
        # p = exp(c (y - t - anchor) + at), at most 1: the exponentials above times a factor per row
        p = e * ops.exp(at - c * (t + anchor))
        p = ops.where(p > 1, 1, p)
    t = ops.where(t < lo, lo, ops.where(t > hi, hi, t))
    # a score at 0 enters where g(z) is a normal number, z > omega'(tiny) (a dense map's p underflows below it)
    edge = r.omega_prime(ops.full(count, ops.tiny))
    rows = (y, c, anchor, at, one, edge, *r.params)  # what a row's steps read
    tol_p = 16 * ops.eps
    tol_t = 4 * ops.eps
    width = hi - lo

    def body(state, rows):
        y, c, anchor, at, one, edge, *params = rows
        rr = Routines(r.module, r.table, params)
        t, p, lo, hi, step, step_old, k, settled, active = state
        z = y - t
        if sparse:
            p = ops.where(z > rr.clip(), p, 0)
        zero = p == 0
        need = zero & (z > edge)

        def enter():
            w0 = rr.weight(ops.full(t, 0.0))
            e = c * (z - anchor) + at
            start = ops.where(ops.isfinite(w0) & (w0 > 0), w0 * (z - rr.clip()), ops.exp(ops.where(e < 0, e, 0)))
            if sparse:  # one step of Newton's on omega'(p) = z from the start (see _elastic_step)
                on = need & (start > 0)
                q = ops.where(on, start, 1)
                start = ops.where(on, _elastic_step(ops, rr, q, q, rr.omega_prime(q), rr.weight(q), z), start)
            q = ops.where(need, start, p)
            return q, q == 0

        p, zero = ops.branch(need, enter, lambda: (p, zero))

        # (a dense map's p is 0 only where it underflowed)
        ps, zs, w = _on_support(ops, rr, p, z) if sparse else ops.rare(zero, lambda: _on_support(ops, rr, p, z),
                                                                        lambda: (p, z, rr.weight(p)))
        o1 = rr.omega_prime(ps)
        res = o1 - zs
        wr = w * res
        corr = ops.row_sum(wr)
        total = ops.row_sum(p)
        f = total - corr  # F(t) to first order
        sure = abs(f - 1) > 2 * ops.row_sum(abs(wr))
        lo = ops.where(sure & (f > 1), t, lo)
        hi = ops.where(sure & (f < 1), t, hi)
        safe = ops.where(total > 0, total, 1)
        sum_w = ops.row_sum(w)
        # Newton on omega'(F) = omega'(1) or on F = 1: the longer step where F > 1, the shorter
        # where F < 1 (the larger dt either way; see the docstring)
        dt = -((one - rr.omega_prime(safe)) / rr.omega_second(safe) + corr) / sum_w
        plain = (f - 1) / sum_w
        dt = ops.where(dt > plain, dt, plain)
        new, _ = safeguarded_point(ops, t, lo, hi, step_old, t + dt, ops.isfinite(t + dt), k < KKT_FREE_STEPS)
        dt = new - t
        dp = (-dt - res) * w  # 0 off the support
        if sparse:
            p_new = _elastic_step(ops, rr, p, ps, o1, w, zs - dt)
        else:
            du = dp / ps

            def log_step():
                return p * ops.exp(ops.at_most(du, KKT_LOG_STEP))

            ahead = p + dp
            in_p = (rr.omega_third(ps) * ps * w >= -0.5) & (ahead > 0)

            def mixed():
                return ops.rare(in_p, lambda: ops.where(in_p, ahead, log_step()), log_step)

            p_new = ops.rare(ops.not_(in_p), mixed, lambda: ahead)
        # steps within the rounding of the residuals: eps (|z| + |omega'(p)|) in each r_i
        scale = abs(zs) + abs(o1) + abs(t)  # the scale of res's rounding
        noise = w * scale
        small_t = abs(dt) <= tol_t * (1 + abs(t) + ops.row_sum(noise) / sum_w)
        # (tiny: subnormal p carry few digits)
        now = ops.rare(small_t, lambda: small_t & (ops.row_max(abs(dp) - tol_p * (ps + noise)) <= ops.tiny), lambda: small_t)
        # a row whose next step is Newton's in p to within rounding takes it and stops (_final_step)
        more = active & ops.not_(now)

        def final():
            last, q, s = _final_step(ops, rr, y, p_new, new, scale, edge, sparse)
            last = more & last
            return last, ops.where(last, q, p_new), ops.where(last, s, new)

        last, p_new, new = ops.rare(more, final, lambda: (more, p_new, new))
        now = now | last
        # a row that stopped keeps its state (the rounds may go on over every row)
        going = active & ops.not_(now) & (hi - lo > tol_t * (1 + abs(new)))
        keep = lambda a, b: ops.where(active, a, b)  # noqa: E731
        p_new = ops.rare(ops.not_(active), lambda: keep(p_new, state[1]), lambda: p_new)
        return (keep(new, t), p_new, keep(lo, state[2]), keep(hi, state[3]), keep(dt, step),
                keep(step, step_old), k + 1, keep(now, settled), going), going

    true = ops.full(count, True)
    state = (t, p, lo, hi, width, width, ops.full(count, 0.0), ops.not_(true), true)
    t, p, _, _, _, _, _, settled, _ = ops.repeat_rows(steps, body, state, true, rows)
    p = ops.where(live & (y - t > clip) if sparse else live, p, 0)
    total = ops.row_sum(p)
    # (rows off 1 by more than rounding: the others take the division alone)
    p = ops.on_rows(abs(total - 1) > 16 * ops.eps, lambda p, *params: _to_sum_one(ops, Routines(r.module, r.table, params), p),
                    (p, *r.params), p / total)

    def halley(y, c, anchor, at, one, edge, *params):
        rr = Routines(r.module, r.table, params)
        size = ops.full(y[..., :1], _length(y))
        q, s = _root_halley(ops, rr, y, ROOT_STEPS, None, -rr.omega_prime(ops.full(size, 1.0)), -rr.omega_prime(1 / size))
        return ops.cat(q, s)

    return _split(ops.on_rows(ops.not_(settled), halley, rows, ops.cat(p, t)), n)


def _on_support(ops, r: Routines, p, z):
    """``(ps, zs, w)``: ``p``, ``z`` and ``weight(p)`` on the support (``p > 0``); off it ``p`` reads as 1, ``z`` as 0
    and the weight is 0."""
    sup = p > 0
    ps = ops.where(sup, p, 1)
    return ps, ops.where(sup, z, 0), ops.where(sup, r.weight(ps), 0)


def _final_step(ops, r: Routines, y, p, t, scale, edge, sparse: bool):
    """``(last, p', t')``: :func:`_kkt_newton`'s next step from ``(p, t)`` taken in ``p`` without safeguards, and
    per row whether it is the last one, its result within rounding of the solution.

    The step is Newton's, ``dt = (sum p - sum w r - 1) / sum w`` and ``dp_i = -w_i (r_i + dt)``, with
    ``r_i = omega'(p_i) - y_i + t`` and ``w_i = 1/omega''(p_i)`` (``sum p' = 1`` to rounding).  After it each
    equation is left with the linearisation's remainder, ``omega'''(xi) dp_i**2 / 2``: a row's step is its last
    where that, with ``omega'''`` at ``p_i``, is at most half a rounding of its residual, ``eps scale_i``
    (``scale = |y - t| + |t| + |omega'(p)|``, the round's: the scale of the rounding, which its step changes
    by ``|dt|`` and ``|d omega'(p)|``), where no ``p_i`` moves by more than an eighth of itself (so that ``xi``
    is near ``p_i``) and no score enters the support: a sparse map's scores that left it at ``t`` are dropped
    (``p_i = 0``), and every score off it must stay there at ``t + dt``.  Its next step would then be within the
    rounding that :func:`_kkt_newton`'s stopping test allows.
    """
    z = y - t
    if sparse:  # a score that left the support (z <= omega'(0+)) is dropped: the step solves the rest
        p = ops.where(z > r.clip(), p, 0)
    off = ops.not_(p > 0)
    ps, zs, w = _on_support(ops, r, p, z) if sparse else ops.rare(off, lambda: _on_support(ops, r, p, z),
                                                                   lambda: (p, z, r.weight(p)))
    res = r.omega_prime(ps) - zs  # (weight 0 off the support)
    sum_w = ops.row_sum(w)
    some = sum_w > 0
    dt = (ops.row_sum(p) - ops.row_sum(w * res) - 1) / ops.where(some, sum_w, 1)
    dp = -w * (res + dt)
    fine = (abs(r.omega_third(ps)) * (dp * dp) <= ops.eps * scale) & (abs(dp) <= 0.125 * ps)
    if sparse:  # every score off the support stays off it at t + dt
        crossing = off & (z - dt > r.clip())
    else:
        crossing = ops.rare(off, lambda: off & (z > edge), lambda: off)
    bad = ops.float_(ops.not_(fine) | crossing)
    return some & (ops.row_max(bad) <= 0), p + dp, t + dt


def _to_sum_one(ops, r: Routines, p):
    """``p`` moved to sum 1 by the threshold's first-order step, ``p + w (1 - P) / sum w`` (``w = weight(p)`` on the
    support, ``P = sum p``), then divided by its sum (the rounding left).

    The step puts the sum's error where ``p`` is least determined by its own equation ``omega'(p_i) = z_i - t``:
    at a kink, a score just inside the support with a flat ``omega'`` (``p**12 + p**13``: ``w`` of ``p = 0.07``
    is 1e8 times that of ``p = 0.5``) stops within its wide rounding, and dividing by the sum would spread its
    error over every score.  A row the step would take off the support (a ``p`` at most 0) is only divided.
    (:func:`_kkt_newton` takes the step on the rows whose sum is off 1 by more than rounding, and divides the others.)
    """
    w = _weights(ops, r, p)
    total = ops.row_sum(p)
    sum_w = ops.row_sum(w)
    q = p + w * ops.where(sum_w > 0, (1 - total) / ops.where(sum_w > 0, sum_w, 1), 0)
    off = ops.row_sum(ops.float_((p > 0) & ops.not_(q > 0))) > 0
    q = ops.where(off, p, q)
    return q / ops.row_sum(q)


def _elastic_step(ops, r: Routines, p, ps, o1, w, z):
    """``p`` after one Newton step on ``omega'(p) = z`` in ``v = p**beta``, ``beta = p omega''(p) / (omega'(p) - omega'(0+))``
    the elasticity of ``omega' - omega'(0+)`` at ``p`` (see :func:`_kkt_newton`).

    In ``v`` the derivative of ``omega'`` is ``(omega'(p) - omega'(0+)) / v``, so the step multiplies ``v`` by
    ``ratio = (z - omega'(0+)) / (omega'(p) - omega'(0+))`` and ``p`` by ``ratio**(1/beta)``, with
    ``1/beta = w (omega'(p) - omega'(0+)) / p``.  ``ratio`` is kept in ``[tiny, KKT_ELASTIC_CEIL]``: a score
    whose ``z`` falls to ``omega'(0+)`` goes to 0 (it leaves the support, and enters again where the next
    ``t`` puts it above), one just above it falls as far as Newton's step says (a floor of a fixed
    factor made such rows converge linearly), and where ``omega'(p) - omega'(0+)`` rounds to 0 (``p`` within
    rounding of the support's edge: ``p**(alpha-1)`` below ``eps``) ``1/beta`` is 0 and ``p`` stays.  ``ps`` is ``p`` where ``p > 0`` and 1 elsewhere,
    ``o1 = omega'(ps)`` and ``w = 1 / omega''(ps)``, 0 off the support, where ``p`` stays 0.
    """
    above = o1 - r.clip()
    ratio = ops.at_most(ops.clamp_min((z - r.clip()) / above, ops.tiny), KKT_ELASTIC_CEIL)  # (NaN: the ceiling)
    return p * ops.exp(w * above / ps * ops.log(ratio))


def _linear_start(ops, r: Routines, y, live, count, clip, steps: int = LINEAR_START_STEPS):
    """A sparse map's start for :func:`_kkt_newton`: ``(p, t)`` of the linear link through ``(omega'(0+), 0)`` and
    ``(omega'(1/2), 1/2)``, ``p_i = a (y_i - clip - t)_+``, whose threshold is Michelot's fixed point.

    From every live score in the support, ``t <- (sum_S (y_i - clip) - 1/a) / |S|`` over the scores
    ``S`` above the last ``t`` rises to the linear link's threshold, and stops there (a support that
    no longer shrinks); at most ``steps`` rounds, a start from below it after those.
    Scores above ``t`` hold the support (the row's maximum always does), so ``|S| >= 1``.
    """
    half = ops.full(count, 0.5)
    a = half / (r.omega_prime(half) - clip)
    ys = ops.where(live, y - clip, float("-inf"))
    t = (ops.row_sum(ops.where(live, ys, 0)) - 1 / a) / count

    def body(state, rows):
        t, size = state
        ys, a = rows
        on = ys > t
        now = ops.row_sum(ops.float_(on))
        return ((ops.row_sum(ops.where(on, ys, 0)) - 1 / a) / now, now), now < size

    t, _ = ops.repeat_rows(steps, body, (t, count), ops.full(count, True), (ys, a))
    return a * ops.pos_part(ys - t), t


def _power_newton(ops, a, k, b, t, steps):
    """``(p, t*)`` for a link of the power form with ``k >= 1`` on every row: Newton on ``phi(t) = F(t)**(1/k)``.

    ``b = a y``; ``t`` is a lower bound of ``t*`` (``F(t) >= 1``).  ``phi(t) = ||(b - a t)_+||_k``
    is convex and decreasing for ``k >= 1`` (a norm, increasing on the nonnegative orthant,
    of convex functions of ``t``), so Newton's steps from the left stay left of ``t*`` and
    increase: no bracket or safeguard.  (``omega'`` is affine in ``p**(1/k)``, so this is
    Newton on :func:`root_rule`'s ``h``; a support of one score is solved in one step.)  The
    step is ``(phi - 1) / -phi' = (F - F**(1 - 1/k)) / (a S)``, ``S = sum base**(k - 1)``.
    ``base**(k - 1)`` is ``exp((k - 1) log base)``, one log and one exp per score and step
    (``p = base**(k - 1) * base``, ``S = sum p / base``), with ``base`` at least
    ``floor = tiny**(0.9 / max(k - 1, 0.9))`` under log, so that the exponent is at least
    ``0.9 log(tiny)``: no zero, infinity or subnormal number reaches log and exp (their
    slow paths; a ``base`` below ``floor`` has ``p`` below ``tiny**0.9 floor`` either way);
    ``p`` is exactly 0 off the support (``base = 0`` there).  A row stops where
    ``F - 1 <= (4 + log2(n)) eps`` (about the rounding of ``F``'s sum; ``F < 1``: past ``t*``
    by rounding) or its step is below ``4 eps |t|``, and keeps its ``t`` (evaluated again
    it stops again): the loop's last evaluation is at every row's final ``t`` and gives ``p / F``.
    """
    tol = (4 + _log(ops, _length(b)) / math.log(2)) * ops.eps
    tol_t = -4 * ops.eps  # t < 0
    km1 = k - 1
    # at least tiny: the exponent rounds below log(tiny) for k - 1 <= 0.9, and a subnormal floor
    # is 0 where subnormals are flushed (XLA on CPU): log(0) would give 0 * inf
    if isinstance(km1, (int, float)) and isinstance(ops.log_tiny, numbers.Real):  # (not a traced value)
        floor = max(math.exp(0.9 * ops.log_tiny / max(km1, 0.9)), ops.tiny)
    else:
        floor = ops.clamp_min(ops.exp(0.9 * ops.log_tiny / ops.clamp_min(km1, 0.9)), ops.tiny)

    def body(state, rows):
        t, _, _ = state
        a, k, b, floor = rows
        p, f, total = ops.power_sums(b, a * t, k - 1, floor)
        step = (f - ops.exp(ops.log(f) * (1 - 1 / k))) / (a * total)
        going = (f - 1 > tol) & (step > tol_t * t)
        return (ops.where(going, t + step, t), p, f), going

    t, p, f = ops.repeat_rows(steps, body, (t, ops.full(b, 0.0), ops.full(t, 1.0)), ops.full(t, True), (a, k, b, floor))
    return p / f, t


def _power_link(ops, k, raw):
    """``(p, base, mask)``: ``p = raw_+**k`` for a link of the power form (``raw = a (z - clip)``).

    ``p = base**k = exp(k log base)`` with ``base >= tiny`` and ``k log base >= 0.9 log(tiny)``: no
    zero, infinity, underflow or subnormal number reaches log and exp (their slow paths; ``p`` below
    ``tiny**0.9`` is off by less than that); off the support (``mask``) ``p`` is then exactly 0.
    """
    base = ops.clamp_min(raw, ops.tiny)
    mask = ops.support(ops.pos_part(raw))
    return ops.exp(ops.clamp_min(k * ops.log(base), 0.9 * ops.log_tiny)) * mask, base, mask


def _root_halley(ops, r, y, steps, power, lo, hi):
    """:func:`root_rule`'s safeguarded Halley from the bracket ``[lo, hi]``; ``power``: ``(a, k, b)`` of the link's power form, or ``None``."""
    t, lo, hi, active, settled, weights = halley_threshold(ops, r, y, lo, hi, steps=steps, power=power)
    p = weights(t)
    total = ops.row_sum(p)
    p = p / total
    # a row whose F jumps across 1 between the ends of its bracket: p(lo) + lam (p(hi) - p(lo)), sum 1
    kink = (active | ops.not_(settled)) & (abs(total - 1) > 4 * ops.eps)

    def combine():
        p_lo, p_hi = weights(lo), weights(hi)
        f_lo, f_hi = ops.row_sum(p_lo), ops.row_sum(p_hi)
        ok = (f_lo >= 1) & (f_hi <= 1) & (f_lo > f_hi)
        lam = ops.where(ok, (f_lo - 1) / ops.where(ok, f_lo - f_hi, 1), 0)
        mixed = ops.where(ok, p_lo + lam * (p_hi - p_lo), p_lo / ops.where(f_lo > 0, f_lo, 1))
        return ops.where(kink, mixed, p)

    p = ops.branch(kink, combine, lambda: p)
    return p, t + (-r.clip() if power is not None else 0)  # (power: tau - m = t - clip)


def narrow_bracket(ops, t, lo, hi, active, f):
    """The bracket ``[lo, hi]`` of a decreasing ``F``'s root of ``F = 1`` moved to ``t``, where ``F`` is ``f``, on
    the rows ``active``."""
    return ops.where(active & (f > 1), t, lo), ops.where(active & (f < 1), t, hi)


def threshold_round(ops, t, lo, hi, step, step_old, active, f, slope, point, usable, scale, free=False):
    """One round of a bracketed solve of ``F(t) = 1`` for a decreasing ``F``, at ``t``, where ``F`` is ``f`` and
    ``F'`` is ``slope``, towards ``point``: ``(t, step, step_old, active, exact, took)``.

    The bracket ``[lo, hi]`` is already moved to ``t`` (:func:`narrow_bracket`).  The point is taken
    (``took``) where ``usable`` and as :func:`numeric.newton.safeguarded_point` allows, which needs it to
    halve the step before last unless ``free`` or the step is small; otherwise the bracket is bisected.  A
    row is done (no longer ``active``) where ``F`` is 1 to ``4 eps`` (``exact``: it keeps ``t``), where it
    takes a small step (one that moves ``F`` by less than that, or ``t`` by less than the resolution of
    ``s - t``, ``eps (scale + |t|)``: ``t`` is the root to rounding, and the step is still worth up to
    ``|F'|`` times the resolution), or where the bracket is 4 resolutions wide.  Rows not ``active`` keep
    ``t`` and their steps.

    Written once for the threshold solves: :func:`halley_threshold`'s rounds (the host's, and the fused
    Triton attention's kept scores), and the rounds of that attention's passes over the keys, whose point
    comes from its kept scores (traced, ``threshold_round``).
    """
    tol = 4 * ops.eps
    resolution = ops.eps * (scale + abs(t))
    exact = abs(f - 1) <= tol
    step_small = (abs((point - t) * slope) <= tol) | (abs(point - t) <= resolution)
    new, took = safeguarded_point(ops, t, lo, hi, step_old, point, usable, step_small if free is False else free | step_small)
    done = exact | (took & step_small) | (hi - lo <= 4 * resolution)
    return (ops.where(active & ops.not_(exact), new, t), ops.where(active, new - t, step),
            ops.where(active, step, step_old), active & ops.not_(done), exact, took)


def halley_threshold(ops, r, y, lo, hi, *, steps: int = ROOT_STEPS, power=None, start=None, going=None, rest=None,
                     peak=None):
    """The threshold of the rows ``y`` in the bracket ``[lo, hi]`` by safeguarded Halley on
    ``h(t) = omega'(F(t)) - omega'(1)`` (:func:`root_rule`): ``(t, lo, hi, active, settled, weights)``.

    ``t``, ``lo`` and ``hi`` have shape ``(rows, 1)``: ``F(lo) >= 1 >= F(hi)`` and ``t = tau - m`` for rows
    shifted to their maximum ``m`` (``peak``, the rows' largest score, is 0 where ``None``; a device kernel
    passes the scores as they are and their maximum).  ``power``: ``(a, k, b)`` of the link's power form (then ``t`` is
    ``tau - m - clip`` and ``y`` is read through ``b``), or ``None``: the link ``r.link`` or, without one,
    the link inverted (:meth:`TensorOps.invert_link`).  ``active``: the rows still going after ``steps``
    rounds; ``settled``: where ``F`` was 1 to ``4 eps`` or a step would have moved it less;
    ``weights(t)``: ``g_+(y - t)``.

    The fused Triton attention solves each query block's kept scores with this text, traced
    (:mod:`derive.codegen.trace`): from ``start`` (else ``lo``), on the rows ``going`` (else all; the
    others keep ``start``), with ``F`` the kept scores' sum plus ``rest(t)``, ``(value, first, second
    derivative)`` of the row's other scores at ``t`` (a model of them; ``None``: the row is whole).
    """
    clip = r.clip()
    if power is not None:
        a, k, b = power
        scale = 0  # t has no offset: the bracket's width is judged relative to t

        def probabilities(t):
            return _power_link(ops, k, b - a * t)

        def sums(t):
            p, base, _ = probabilities(t)
            q = p / base  # w / (a k), 0 off the support
            total = ops.row_sum(p)
            d1 = -a * k * ops.row_sum(q)
            d2 = a * a * k * (k - 1) * ops.row_sum(q / base)
            return total, d1, d2
    else:
        scale = 1 if peak is None else 1 + abs(peak)

        def probabilities(t):
            return clipped_link(ops, r, y, t, clip, peak)

        def sums(t):
            p, pos = probabilities(t)
            safe = ops.where(pos, p, 1)
            total = ops.row_sum(p)
            d1 = -ops.row_sum(ops.where(pos, r.weight(safe), 0))
            d2 = ops.row_sum(ops.where(pos, r.weight_d2(safe), 0))
            return total, d1, d2

    def weights(t):
        return probabilities(t)[0]

    one = _reach_one(ops, r, lo)
    tol = 4 * ops.eps
    width = hi - lo
    start = lo if start is None else start
    going = ops.full(lo, True) if going is None else going
    state = (start, lo, hi, width, width, going, ops.full(lo, False))

    def inside(v, lo, hi):
        return (v > lo) & (v < hi) & ops.isfinite(v)

    def body(state):
        t, lo, hi, step, step_old, active, settled = state
        total, d1, d2 = sums(t)
        if rest is not None:
            more, more_d1, more_d2 = rest(t)
            total, d1, d2 = total + more, d1 + more_d1, d2 + more_d2
        lo, hi = narrow_bracket(ops, t, lo, hi, active, total)
        # (F = 0 and F' = 0 only on a row without scores: its derivatives are taken at 1 and it bisects, so that
        # no lane of a device block divides by 0)
        some = total > 0
        at = ops.where(some, total, 1)
        o2 = r.omega_second(at)
        o3 = r.omega_third(at)
        h = r.omega_prime(at) - one
        h1 = o2 * d1
        h2 = o3 * d1 * d1 + o2 * d2
        denom = 2 * h1 * h1 - h * h2
        sloped = h1 != 0
        halley = t - 2 * h * h1 / ops.where(denom > 0, denom, 1)
        newton = t - h / ops.where(sloped, h1, 1)
        new = ops.where((denom > 0) & inside(halley, lo, hi), halley, newton)
        usable = ops.isfinite(new) & sloped & some
        t_new, step, step_old, going, exact, _ = threshold_round(ops, t, lo, hi, step, step_old, active, total, d1,
                                                                 new, usable, scale)
        settled_now = exact | ((newton != t) & (abs((newton - t) * d1) <= tol))
        settled = ops.where(active, settled_now, settled)
        return (t_new, lo, hi, step, step_old, going, settled), going

    t, lo, hi, _, _, active, settled = ops.repeat(steps, body, state, state[5])
    return t, lo, hi, active, settled, weights


def clipped_link(ops, r: Routines, y, t, clip, peak=None, ceiling=None):
    """``(g_+(y - t), support)`` for rows ``y`` and thresholds ``t`` (``(rows, 1)``): the link where ``y - t`` is
    above the clip ``omega'(0+)``, 0 elsewhere; a link with no closed form inverted
    (:meth:`TensorOps.invert_link`).  Off the support the link is evaluated at the row's maximum, ``peak - t``
    (``peak`` 0 where ``None``: rows shifted to their maximum), inside the support where ``t <= -omega'(c/n)``.

    ``ceiling``: ``omega'(inf)``, where ``omega'`` is bounded above (Tsallis with ``alpha < 1``: ``1 / (alpha
    (1 - alpha))``); ``z`` at or beyond it gives ``g = inf`` (no ``p`` has ``omega'(p) = z``).  ``None``: every
    ``z`` the caller passes has a link value.
    """
    z = y - t
    pos = z > clip
    inside = pos if ceiling is None else pos & (z < ceiling)
    safe = ops.where(inside, z, -t if peak is None else peak - t)
    if r.has("link"):
        g = r.link(safe)
    else:
        g = ops.invert_link(safe, r.omega_prime, r.omega_second)
    if ceiling is not None:
        g = ops.where(pos & ops.not_(inside), float("inf"), g)
    pos = pos & (g > 0)
    return ops.where(pos, g, 0), pos


# ------------------------------------------------------------ box constraints
def box_solve(ops: TensorOps, r: Routines, x, upper, total, steps: int = ROOT_STEPS):
    """``(p, tau)`` for the rows of ``x`` (2-D) with ``0 <= p <= upper`` and ``sum p = total``:
    ``p_i = min(u_i, g_+(s_i - tau))`` (:mod:`derive.box`), every map (its link, or the link inverted).

    ``upper``: ``x``'s shape, ``>= 0`` (``inf``: no bound); ``total``: ``(rows, 1)``, finite and ``> 0``; a row
    with a NaN or negative bound or a total outside ``(0, inf)`` gives NaN (``p`` and ``tau``), as does one with a
    NaN or ``+inf`` score, and a fully masked row zeros (``tau = inf``); the bounds of each
    row's unmasked entries must sum to at least its total, within ``sqrt(eps)`` of it (the front end checks it,
    :func:`numeric.front.box_short`; a row where they do not gives NaN; one short within it is solved with its
    total taken as the room: every entry saturates, ``p = u``).  ``F(tau) = sum_i min(u_i, g_+(s_i - tau))`` decreases; its root of ``F = total`` is bracketed by
    ``hi = max(s) - omega'(total / n)`` (every entry at most ``total / n``) and ``lo = min_i s_i -
    omega'(min(u_i, total))`` over the entries that can hold mass (each at least ``min(u_i, total)``; an entry
    whose ``s_i - tau`` passes ``omega'(inf)`` where ``omega'`` is bounded counts as ``g = inf``), and found
    by Newton steps in that bracket (the rounds of :func:`threshold_round`; ``F' = -sum w`` over the free
    entries ``0 < p_i < u_i``).  The free entries are then scaled to sum to ``total`` less the saturated ones.
    """
    m = ops.row_max(x)
    bad = ops.not_(ops.isfinite(m))
    # rows that give NaN: a NaN or +inf score (as the plain map), a total not finite and > 0, a NaN or negative
    # bound (eager calls refuse the last two by name, numeric.front.box_rows; a traced call cannot raise)
    invalid = (ops.isnan(m) | (m > 0) & bad | ops.not_((total > 0) & (total < float("inf")))
               | (ops.row_sum(ops.float_(ops.not_(upper >= 0))) > 0))
    m0 = ops.where(bad, 0, m)
    y = ops.where(bad, 0, x - m0)
    live = ops.isfinite(x) & (upper > 0) & ops.not_(bad)
    room = ops.row_sum(ops.where(live, upper, 0))
    # bounds short of the total by at most sqrt(eps) of it are feasible, with the total taken as the room (their
    # rounding: numeric.front.box_short); every entry saturates there
    feasible = ops.not_(box_short(total, room, ops.eps))
    total = ops.where(feasible & (room < total), room, total)
    count = ops.row_sum(ops.float_(ops.isfinite(x)))
    clip = r.clip()
    hi = box_high(ops, r, total, count)
    lo = box_lowest(ops, r, y, upper, total, live)
    # (moved out by 4 resolutions of s - t: where omega'(u_i) rounds to omega'(0+), a link steeper than the
    # resolution, F at the computed end may still be below the total)
    lo = lo - 4 * ops.eps * (1 + abs(ops.where(ops.isfinite(lo), lo, 0)))
    lo = ops.where(lo < hi, lo, hi)
    ceiling = box_ceiling(ops, r, m)

    def sums(t):
        return box_sums(ops, r, y, t, upper, live, clip, ceiling)

    def body(state):
        t, lo, hi, step, step_old, active = state
        _, f, slope, _, _ = sums(t)
        return box_round(ops, t, lo, hi, step, step_old, active, f, slope, total, 1)

    width = hi - lo
    going = ops.not_(bad | invalid) & feasible
    state = (ops.where(going, (lo + hi) / 2, 0), lo, hi, width, width, going)
    t, lo, hi = ops.repeat(steps, body, state, going)[:3]
    p, _, _, free, saturated = sums(t)
    rest = total - ops.row_sum(ops.where(saturated, upper, 0))
    share = ops.row_sum(ops.where(free, p, 0))
    scaled = p * (rest / ops.where(share > 0, share, 1))
    p = ops.where(free & (share > 0), ops.where(scaled < upper, scaled, upper), p)
    # rows whose free entries cannot hold the rest to sqrt(eps) (or there is none): F jumps across the total
    # between thresholds that s - t cannot tell apart, a link steeper than the resolution (alpha-entmax at large
    # alpha)
    jump = going & ((abs(rest - share) > total * math.sqrt(ops.eps)) | ((share <= 0) & (rest != 0)))
    p, t = ops.rare(jump, lambda: box_between(ops, r, y, t, lo, hi, p, upper, total, live, clip, ceiling, jump, steps),
                    lambda: (p, t))
    nan = ops.full(m, float("nan"))
    nan_rows = invalid | ops.not_(bad) & ops.not_(feasible)  # (a fully masked row: zeros, tau = inf)
    p = ops.where(nan_rows, nan, ops.where(bad, 0, p))
    tau = ops.where(nan_rows, nan, ops.where(bad, float("inf"), m0 + t))
    return p, tau


def box_between(ops, r: Routines, y, t, lo, hi, p, upper, total, live, clip, ceiling, rows, steps: int = ROOT_STEPS):
    """``(p, t)`` of :func:`box_solve` on the ``rows`` whose ``F`` jumps across the total between two thresholds
    that ``y - t`` cannot tell apart (its other rows keep ``p`` and ``t``).

    The bracket ``[lo, hi]`` is first bisected to the resolution of ``y - t`` (or to ``F = total`` within ``4
    eps``).  Between its ends each entry's link goes from ``a_i = g_+(y_i - hi)`` to ``b_i = g_+(y_i - lo)``
    (both capped at the total, which no entry exceeds); the entries that move there are those whose ``y_i - tau``
    is the same to that resolution, sharing one level ``q`` of the link: ``p_i = min(u_i, a_i + theta (b_i -
    a_i))``, ``theta`` in ``[0, 1]`` the root of ``S(theta) = sum p_i = total``.  ``S`` is piecewise linear,
    increasing and concave, so Newton's steps from ``theta = 0`` (``S(0) = F(hi) <= total``) stay below the
    root and reach it in at most one step per bound they pass; a last blend towards ``p`` at ``theta = 1`` (or 0)
    makes the sum the total to rounding.  ``t`` becomes ``hi - theta (hi - lo)``.
    """
    def sums(t):
        return box_sums(ops, r, y, t, upper, live, clip, ceiling)

    def bisect(state):
        t, lo, hi, step, step_old, active = state
        _, f, _, _, _ = sums(t)
        return box_round(ops, t, lo, hi, step, step_old, active, f, 0 * f, total, 1)

    width = hi - lo
    state = (ops.where(rows, lo + 0.5 * width, t), lo, hi, width, width, rows)
    t_mid, lo, hi = ops.repeat(LOG_STEPS, bisect, state, rows)[:3]
    p_mid, f_mid, _, _, _ = sums(t_mid)
    exact = abs(f_mid - total) <= 4 * ops.eps * total
    lo, hi = ops.where(exact, t_mid, lo), ops.where(exact, t_mid, hi)

    def link(t):
        g, _ = clipped_link(ops, r, y, t, clip, ceiling=ceiling)
        return ops.where(live, ops.where(g < total, g, total), 0)

    a, b = link(hi), link(lo)
    rise = b - a

    def level(theta):
        q = a + theta * rise
        below = q < upper
        return ops.where(below, q, upper), ops.where(below, rise, 0)

    def newton(state):
        theta, active = state
        q, slope = level(theta)
        s, ds = ops.row_sum(q), ops.row_sum(slope)
        new = theta + (total - s) / ops.where(ds > 0, ds, 1)
        new = ops.where(new < 1, new, 1)
        going = active & (s < total) & (ds > 0) & (new > theta)
        return (ops.where(going, new, theta), going), going

    theta = ops.repeat(steps, newton, (ops.full(t, 0.0), rows), rows)[0]
    q, _ = level(theta)
    s = ops.row_sum(q)
    other, _ = level(ops.where(s < total, 1.0, 0.0))
    s_other = ops.row_sum(other)
    gap = s_other - s
    blend = ops.where(gap != 0, (total - s) / ops.where(gap != 0, gap, 1), 0)
    q = q + blend * (other - q)
    return ops.where(rows, q, p), ops.where(rows, hi - theta * (hi - lo), t)


def box_short(total, room, eps):
    """Where bounds summing to ``room`` cannot hold ``total``: ``total - room > sqrt(eps) * total`` (a shortfall
    within ``sqrt(eps)`` of the total is rounding: the total is clipped to the room).  The one rule of
    :func:`box_solve` and of the front end's check (:func:`numeric.front.box_rows`)."""
    return total - room > total * math.sqrt(eps)


def box_high(ops, r: Routines, total, count):
    """The right end of the bounded threshold's bracket, ``-omega'(total / n)`` for ``n`` keys (every entry at
    most ``total / n`` there), relative to the row's largest score."""
    return -r.omega_prime(total / ops.where(count > 0, count, 1))


def box_lowest(ops, r: Routines, y, upper, total, live):
    """The left end of the bounded threshold's bracket before it is capped at :func:`box_high`: the least
    ``y_i - omega'(min(u_i, total))`` over the entries ``live`` (those that can hold mass: each holds at least
    ``min(u_i, total)`` left of it), ``inf`` in a row with none.  A minimum, so that a kernel takes it key
    block by key block."""
    cap = ops.where(upper < total, upper, total)
    reach = y - r.omega_prime(ops.where(live, cap, total))
    return -ops.row_max(ops.where(live, -reach, float("-inf")))


def box_ceiling(ops, r: Routines, like):
    """``omega'(inf)`` where ``omega'`` is bounded above (:func:`clipped_link`'s ``ceiling``), else ``inf``."""
    ceiling = r.omega_prime(ops.full(like, float("inf")))  # (NaN where omega' has no value at inf: no ceiling)
    return ops.where(ops.isnan(ceiling), float("inf"), ceiling)


def box_sums(ops, r: Routines, y, t, upper, live, clip, ceiling, peak=None):
    """``(p, F, -F', free, saturated)`` at the threshold ``t`` of the scores ``y`` (shifted by their row's
    largest, or ``peak`` as in :func:`clipped_link`) bounded by ``upper``: ``p_i = min(u_i, g_+(y_i - t))`` on
    the entries ``live``, 0 elsewhere, its row sums, the row sums of ``w`` over the free entries ``0 < p_i <
    u_i``, and where entries are free and where saturated.  Sums over a block of a row's keys add up to the
    row's (the fused attention's passes)."""
    g, pos = clipped_link(ops, r, y, t, clip, peak=peak, ceiling=ceiling)
    saturated = live & (g >= upper)
    p = ops.where(saturated, upper, ops.where(live, g, 0))
    free = pos & live & ops.not_(saturated)
    w = ops.where(free, r.weight(ops.where(free, g, 1)), 0)
    return p, ops.row_sum(p), ops.row_sum(w), free, saturated


def box_round(ops, t, lo, hi, step, step_old, active, f, slope, total, scale):
    """One Newton round of the bounded threshold's solve of ``F(t) = total`` at ``t``, ``F`` being ``f`` and
    ``-F'`` ``slope`` there (:func:`box_sums`): the bracket narrowed and :func:`threshold_round` on ``F / total``;
    returns ``(t, lo, hi, step, step_old, active)``.  ``scale``: as :func:`threshold_round`'s."""
    lo, hi = narrow_bracket(ops, t, lo, hi, active, f / total)
    point = t + (f - total) / ops.where(slope > 0, slope, 1)
    usable = ops.isfinite(point) & (slope > 0)
    t, step, step_old, going, _, _ = threshold_round(ops, t, lo, hi, step, step_old, active, f / total,
                                                     -slope / total, point, usable, scale)
    return (t, lo, hi, step, step_old, going), going


def box_free(ops: TensorOps, p, upper):
    """Where ``p`` is free of its bounds, ``0 < p < upper`` (the entries the Jacobian moves)."""
    return (p > 0) & (p < upper)


def box_exits(ops: TensorOps, r: Routines, p, upper, w, x):
    """``(w, saturated)`` for the bounds' and the total's derivatives at the bounded map's ``p`` (:mod:`derive.box`):
    the weights ``w`` of the free entries ``0 < p_i < u_i`` and the saturated entries ``p_j = u_j > 0``, except in
    a row where no entry is free (``W = 0``).

    There ``p`` is piecewise constant in the bounds and the total with a kink at the point itself (``sum p =
    total`` always: a bound raised must take its mass from another entry), and the derivatives are one-sided: the
    side on which ``tau`` rises, the right-derivative in each bound and the left-derivative in the total (the side
    that stays feasible where the bounds sum to the total).  As ``tau`` rises the saturated entries that leave
    their bound first, ``K``, those with the least ``s_k - omega'(u_k)``, become free: they stand in for the free
    entries with their weights at the bound, ``w_k = 1 / omega''(u_k)``, and are not counted saturated.  So
    ``dp/du_j = e_j - w_K / W_K`` for a saturated ``j`` outside ``K`` (0 for one in it) and ``dp/dc = w_K / W_K``:
    ``d sum(p)/du = 0``, ``d sum(p)/dc = 1``.  ``x``: the scores (``None``: the free entries as they are, 0 in a
    row with none).  ``w``: the free entries' weights, 0 elsewhere."""
    saturated = (p >= upper) & (p > 0)
    if x is None:
        return w, saturated
    none = (ops.row_sum(w) <= 0) & (ops.row_sum(ops.float_(saturated)) > 0)

    def exits():
        gap = ops.where(saturated, x - r.omega_prime(ops.where(saturated, upper, 1)), math.inf)
        first = saturated & (gap <= -ops.row_max(-gap)) & none
        w_k = ops.where(first, r.weight(ops.where(first, upper, 1)), 0)
        return ops.where(none, w_k, w), saturated & ops.not_(first)

    return ops.rare(none, exits, lambda: (w, saturated))


def box_vjp(ops: TensorOps, r: Routines, p, v, upper, at_zero=None, x=None):
    """``(J v, dp/du^T v, dp/dc^T v)`` of the bounded map at ``p`` (:mod:`derive.box`): ``J v`` the simplex's on the
    free entries (:func:`jvp`; ``J`` is symmetric), ``v_j - (w.v)/sum w`` on the saturated entries ``j`` (0
    elsewhere) and ``(w.v)/sum w`` per row (``(rows, 1)``).  In a row where no entry is free ``J = 0`` and the
    bounds' and the total's are one-sided, :func:`box_exits` (``x``: the scores it needs; ``None``: 0 there)."""
    w_free = ops.where(box_free(ops, p, upper), _weights(ops, r, p, at_zero), 0)
    jv, _ = _centred(ops, w_free, v)
    w, saturated = box_exits(ops, r, p, upper, w_free, x)
    _, mean = _centred(ops, w, v)
    nan = ops.isnan(ops.row_sum(p))  # (a NaN row's derivatives are NaN, as the plain map's)
    return (ops.where(nan, math.nan, jv), ops.where(nan, math.nan, ops.where(saturated, v - mean, 0)),
            ops.where(nan, math.nan, mean))


def box_jvp(ops: TensorOps, r: Routines, p, dx, du, dc, upper, at_zero=None, x=None):
    """``J_s dx + J_u du + J_c dc``: the bounded map's tangent at ``p`` (:mod:`derive.box`), the transpose of
    :func:`box_vjp` for forward mode.  On the free entries ``dp_i = w_i (dx_i - dtau)``, on the saturated ones
    ``dp_j = du_j``, elsewhere 0, with ``dtau = (sum_free w dx + sum_sat du - dc) / sum_free w`` keeping ``sum p =
    total``.  ``du`` (``upper``'s shape) and ``dc`` (``(rows, 1)``) may be ``0``; a map parameter's tangent ``dq``
    enters as ``dx = -dq omega'_q(p)`` on the free entries.  In a row where no entry is free ``dx`` moves nothing
    and ``du``, ``dc`` move ``p`` one-sidedly (:func:`box_exits`, given the scores ``x``)."""
    w_free = ops.where(box_free(ops, p, upper), _weights(ops, r, p, at_zero), 0)
    w, saturated = box_exits(ops, r, p, upper, w_free, x)
    moved = ops.where(saturated, du, 0)
    total = ops.row_sum(w)
    shift = ops.row_sum(w_free * dx) + ops.row_sum(moved) - dc
    dtau = ops.where(total > 0, shift / ops.where(total > 0, total, 1), 0)
    dp = w_free * dx - w * dtau + moved
    # a NaN row's tangent is NaN: added as NaN times the tangents, linear in them, so that the transpose (reverse
    # mode, which JAX derives from this) is NaN there too (a where with a NaN constant transposes to 0)
    nan = ops.where(ops.isnan(ops.row_sum(p)), math.nan, 0)
    return dp + nan * (dx + du - dc)


def box_multipliers(ops: TensorOps, r: Routines, x, tau, upper):
    """The multipliers ``mu_i = [s_i - tau - omega'(u_i)]_+`` of the bounds ``p_i <= u_i`` at the bounded map's
    threshold ``tau`` (``(rows, 1)``, unshifted): the gradient of ``Omega*`` over the box, and so of the
    Fenchel-Young loss, in the bounds (:func:`derive.box.box_loss_gradients`).  0 where ``u_i = inf`` or the score
    is masked; ``+inf`` where ``u_i = 0`` and ``omega'(0+) = -inf`` (softmax: the first mass has an infinite
    marginal value); NaN in a NaN row.  The gradient in the total is ``tau`` itself."""
    bounded = ops.isfinite(upper) & ops.isfinite(x)
    z = ops.where(bounded, x - tau, 0) - r.omega_prime(ops.where(bounded, upper, 1))
    mu = ops.where(bounded & (z > 0), z, 0)
    return ops.where(ops.isnan(tau), math.nan, mu)


# ------------------------------------------------------------------ normmax
def normmax_from(ops: TensorOps, r, alpha):
    """normmax's ``p`` from ``r = entmax_a(s / (a - 1))``, ``a = (2 alpha - 1) / alpha`` (:mod:`derive.normmax`):
    ``p = r^(1/alpha) / sum r^(1/alpha)`` per row, 0 where ``r`` is (a fully masked row: zeros), NaN where ``r``
    is.  ``alpha``: a number or ``(rows, 1)``."""
    pos = r > 0
    w = ops.where(pos, ops.exp(ops.log(ops.where(pos, r, 1)) / alpha), 0)
    w = ops.where(ops.isnan(r), math.nan, w)
    total = ops.row_sum(w)
    return w / ops.where(total > 0, total, 1)


def _normmax_m(ops, p, alpha):
    """``m_i = p_i^(2 - alpha) N^(alpha - 1) / (alpha - 1)`` on the support, ``N = ||p||_alpha``; 0 elsewhere."""
    pos = p > 0
    logp = ops.log(ops.where(pos, p, 1))
    log_n = ops.log(ops.row_sum(ops.where(pos, ops.exp(alpha * logp), 0))) / alpha
    return ops.where(pos, ops.exp((2 - alpha) * logp + (alpha - 1) * log_n) / (alpha - 1), 0)


def normmax_vjp(ops: TensorOps, p, v, alpha):
    """``J v`` of normmax at ``p`` (``J`` is symmetric: also the VJP), ``J = (I - p 1^T) diag(m) (I - 1 p^T)``:
    ``c = m (v - <p, v>)``, then ``c - p sum c`` (:mod:`derive.normmax`)."""
    c = _normmax_m(ops, p, alpha) * (v - ops.row_sum(p * v))
    return c - p * ops.row_sum(c)


def normmax_loss(ops: TensorOps, x, p, y, alpha):
    """normmax's Fenchel-Young loss per row, ``(rows, 1)``: ``||y||_alpha - ||p||_alpha - <y - p, s>`` with ``s`` the
    scores less their row maximum (masked scores left out; mass of the target on one: ``+inf``; a NaN row NaN)."""
    finite = ops.isfinite(x)
    m = ops.row_max(ops.where(finite, x, -math.inf))
    s = ops.where(finite, x - ops.where(ops.isfinite(m), m, 0), 0)

    def norm(q):
        pos = q > 0
        total = ops.row_sum(ops.where(pos, ops.exp(alpha * ops.log(ops.where(pos, q, 1))), 0))
        return ops.where(total > 0, ops.exp(ops.log(ops.where(total > 0, total, 1)) / alpha), 0)

    value = norm(y) - norm(p) - ops.row_sum(ops.where(finite, (y - p) * s, 0))
    value = ops.where(ops.row_max(ops.where(finite, 0, y)) > 0, math.inf, value)
    return ops.where(ops.isnan(ops.row_max(x)), math.nan, value)


# -------------------------------------------------------------- derivatives
def _weights(ops, r: Routines, p, at_zero=None):
    """``w = weight(p)`` on the support, 0 elsewhere, NaN where ``p`` is NaN.

    ``at_zero``: what ``weight(0)`` is, where the caller knows (a map without
    parameters): ``"zero"`` (softmax ``p``, 1.5-entmax ``sqrt(p)``): ``weight(p)`` as it is;
    ``"finite"`` (sparsemax ``1``): times the support's indicator; otherwise (or for
    a derivative of the JVP, whose ``weight'`` may be infinite at 0) the weight is
    evaluated at ``p + 1`` off the support and masked.  There a link of the power form
    ``(a (z - clip))**k`` has ``weight(p) = g'(z) = a k p**(1 - 1/k)``, evaluated as
    ``a k exp((1 - 1/k) log p)`` (a printed power of a tensor exponent costs several
    times a log and an exp).
    """
    if at_zero == "zero":
        return r.weight(p)
    pos = ops.support(p)
    if at_zero == "finite":
        # (+ 0 p: a constant weight such as sparsemax's 1 would drop a NaN p, and a NaN row's JVP must stay NaN)
        return r.weight(p) * pos + 0 * p
    safe = p + (1 - pos)
    if r.module.LINK_FORM == "power" and r.has("link_scale"):
        a, k = r.link_scale(), r.link_exponent()
        return ops.exp((1 - 1 / k) * ops.log(safe)) * (pos * (a * k))
    return r.weight(safe) * pos


def omega_terms(ops: TensorOps, r: Routines, x, p, y):
    """Per row ``sum_i [omega(y_i) - omega(p_i)] - (y_i - p_i) s_i``, shape ``(..., 1)``: the Fenchel-Young loss of
    the map's ``p = m(x)`` against the distributions ``y`` (``numeric.Map.loss_and_grad``'s terms).

    ``s`` is the scores shifted by their row maximum (masked scores left out); ``omega(0)`` is the module's
    ``omega_zero``.  A ``p_i = 0`` of a dense map (underflow far below the maximum) where ``y_i > 0``, or a
    target with mass on a masked score, gives ``+inf``; a NaN score NaN.  Differentiable in the parameters
    where the target differentiates (``p`` and ``s`` are constants of the envelope theorem).
    """
    finite = ops.isfinite(x)
    m = ops.row_max(ops.where(finite, x, -math.inf))
    s = ops.where(finite, x - ops.where(ops.isfinite(m), m, 0), 0)
    zero = ops.full(m, 0.0) + r.omega_zero()
    infinite_at_zero = ops.not_(ops.isfinite(zero))

    def omega_of(q):
        pos = q > 0
        return ops.where(pos, r.omega(ops.where(pos, q, 1)), zero), ops.where(pos, q * s, 0)

    om_p, ps = omega_of(p)
    om_y, ys = omega_of(y)
    term = (om_y - om_p) - (ys - ps)
    term = ops.rare(infinite_at_zero, lambda: ops.where((p == 0) & (y > 0) & infinite_at_zero, math.inf, term),
                    lambda: term)
    value = ops.row_sum(ops.where(finite & (y != p), term, 0))
    value = ops.where(ops.row_max(ops.where(finite, 0, y)) > 0, math.inf, value)
    return ops.where(ops.isnan(ops.row_max(x)), math.nan, value)


def weight_at_zero(module) -> str | None:
    """:func:`_weights`' ``at_zero`` for a map module: ``"zero"`` or ``"finite"`` where the map has no parameters
    and its ``weight(0)`` is 0 or a finite number, else ``None`` (read off the module's NumPy ``weight``)."""
    import numpy as np  # (the module's NumPy routine, on a NumPy zero: a Python 0.0 may divide by zero)

    if module.PARAMETERS:
        return None
    with np.errstate(all="ignore"):  # (0 ** negative, log(0): the weight's off-support branches)
        w0 = float(module.weight(np.float64(0.0)))
    return "zero" if w0 == 0 else "finite" if math.isfinite(w0) else None


def jvp(ops: TensorOps, r: Routines, p, v, at_zero=None):
    """``J v = w*v - w (w.v) / sum(w)`` at ``p = m(x)``, ``w = weight(p)`` on the support (``J`` is symmetric: also the VJP).

    ``at_zero``: see :func:`_weights`.
    """
    return _centred(ops, _weights(ops, r, p, at_zero), v)[0]


def _centred(ops, w, v):
    """``(w * (v - mean), mean)``, ``mean = (w.v) / sum(w)`` per row (0 where ``sum(w) = 0``)."""
    total = ops.row_sum(w)
    dot = ops.row_sum(w * v)
    mean = ops.where(total > 0, dot / ops.where(total > 0, total, 1), 0)
    return w * (v - mean), mean


def param_vjp(ops: TensorOps, r: Routines, p, u, name: str, ju=None):
    """``sum_i u_i dp_i/dq`` per row, shape ``(rows, 1)``, for the parameter ``name``: ``-(J u) . c``, ``c = omega_prime_d_q(p)``.

    ``ju``: ``J u`` if already computed.
    """
    pos = ops.support(p)
    c = getattr(r, f"omega_prime_d_{name}")(p + (1 - pos)) * pos
    ju = jvp(ops, r, p, u) if ju is None else ju
    return -ops.row_sum(ju * c)
