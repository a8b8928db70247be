"""The maps' front end, written once for NumPy (and CuPy), torch and JAX.

What a map call checks and how it lays out its parameters is the same on every
backend; only the arrays differ.  This module holds that part:

* the thresholds a map takes (:data:`THRESHOLDS`, :func:`check_threshold`), the
  parameter names (:func:`check_names`) and values (:func:`check_param`), the axis
  (:func:`check_axis`), the Fenchel-Young loss's target (:func:`check_target`) and
  reduction (:func:`check_reduction`, :func:`reduce`), each with one error text;
* the layout of a parameter given per row: a shape broadcasting to the scores with
  size 1 along the map's axis (:func:`param_shape`), as an array of one value per row
  of the flattened scores (:func:`param_rows`);

A front end describes its arrays by an :class:`Arrays` (how to tell one, read its
values where they can be read, make a range of integers like it), and keeps its
own autograd and dtype glue.  The word for the map's axis is the backend's
keyword: ``axis`` for NumPy and JAX, ``dim`` for torch.
"""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np

from .core.ops import Routines

__all__ = ["THRESHOLDS", "REDUCTIONS", "Arrays", "check_threshold", "check_names", "check_param", "check_axis",
           "is_number", "param_shape", "param_rows", "check_learned", "learned_range", "check_target", "check_reduction", "reduce",
           "simplex_target"]

#: The thresholds every map takes: the module's own rule, or one forced (``"closed"`` and ``"sort"`` where the
#: module's rule is that one; ``"root"`` for every map).
THRESHOLDS = ("auto", "closed", "sort", "root")
#: The Fenchel-Young loss's reductions over the rows.
REDUCTIONS = ("none", "sum", "mean")


class Arrays:
    """How a front end reads its arrays (NumPy's here; torch and JAX subclass it).

    ``namespace`` is the array namespace of the layout and the target (``numpy``,
    ``cupy``, ``torch`` or ``jax.numpy``: ``moveaxis``, ``broadcast_to``).
    The checks compute on :meth:`readable`'s arrays with methods NumPy, CuPy and torch
    share (``min``, ``max``, ``sum(axis=)``, ``any``, ``reshape``, ``argmax``).
    """

    def __init__(self, namespace=np):
        self.namespace = namespace

    def is_array(self, a) -> bool:
        """Whether ``a`` is an array this front end takes (a parameter value, a target)."""
        return hasattr(a, "shape") and hasattr(a, "dtype")

    def kind(self, a) -> str:
        """NumPy's kind character of the array's dtype (``"f"``, ``"i"``, ``"u"``, ``"b"``, ``"c"``, ...)."""
        return np.dtype(a.dtype).kind

    def readable(self, a):
        """An array holding ``a``'s values that the checks can compute on and read, or ``None`` where they cannot be
        read (a traced value)."""
        return a

    def eps(self, dtype) -> float:
        return float(np.finfo(dtype).eps)

    def check_traced(self, a, lo, hi, message: str) -> None:
        """Where :meth:`readable` cannot read ``a``: check ``lo < a < hi`` as the target can (or not at all)."""

    def keep(self, a):
        """A checked parameter array as the map stores it: a float64 NumPy array, a float for one of shape ``()``."""
        if hasattr(a, "get") and type(a).__module__.split(".")[0] == "cupy":
            a = a.get()
        a = np.asarray(a, dtype=np.float64)
        return float(a) if a.ndim == 0 else a

    def astype(self, a, dtype):
        return a.astype(dtype)

    def full(self, shape: tuple, value: float, like):
        """An array of ``shape`` filled with ``value``, in ``like``'s dtype (and device)."""
        return self.namespace.full(shape, value, dtype=like.dtype)

    def one_hot(self, labels, n: int, like):
        """Integer ``labels`` as rows of ``n`` zeros and a one, in ``like``'s dtype (and device)."""
        return (self.namespace.arange(n) == labels[..., None]).astype(like.dtype)


#: NumPy's :class:`Arrays`
NUMPY = Arrays()


# ------------------------------------------------------------------ the map
class Solver:
    """A generated module's constants and one framework's routines (``table``) for a threshold rule: :meth:`routines`
    binds them to parameter values, ``ops_for(dtype)`` gives the framework's row operations, and :meth:`constrained`
    solves over a constraint set.  torch's and JAX's solvers add their own passes."""

    def __init__(self, module: ModuleType, threshold: str, table: dict, ops_for):
        self.module = module
        self.table = table
        self.names = tuple(module.PARAMETERS)
        self.method = threshold
        self.ops_for = ops_for

    def routines(self, params) -> Routines:
        return Routines(self.module, self.table, params)

    def constrained(self, cset, x, arrays, params):
        """``(p, tau)`` over the constraint set ``cset`` (its ``arrays`` laid out as rows) for the rows of the 2-D
        ``x``, ``tau`` the threshold (``(rows, 1)``)."""
        return cset.solve(self.ops_for(x.dtype), self.routines(params), x, *arrays)


def check_threshold(module: ModuleType, threshold) -> str:
    """``threshold`` checked against :data:`THRESHOLDS` and the module's rule."""
    if threshold not in THRESHOLDS:
        raise ValueError(f"threshold must be one of {THRESHOLDS}, got {threshold!r}")
    if threshold == "sort" and module.THRESHOLD != "sort":
        raise ValueError(f"map {module.NAME!r} has a {module.THRESHOLD} threshold; 'sort' needs a link of degree 1 or 2")
    if threshold == "closed" and module.THRESHOLD != "closed":
        raise ValueError(f"map {module.NAME!r} has no closed-form threshold")
    return threshold


def check_names(module: ModuleType, params: dict, *, complete: bool) -> None:
    """Every name of ``params`` is a parameter of the module; ``complete``: every parameter has a value."""
    names = tuple(module.PARAMETERS)
    unknown = set(params) - set(names)
    if unknown:
        raise ValueError(f"map {module.NAME!r} has no parameter(s) {sorted(unknown)}; it has {list(names)}")
    if complete:
        missing = [n for n in names if n not in params]
        if missing:
            raise ValueError(f"map {module.NAME!r} needs a value for {', '.join(missing)}")


def is_number(value) -> bool:
    """Whether ``value`` is one real number (a Python or NumPy int or float, not a bool nor an array)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def check_param(module: ModuleType, name: str, value, arrays: Arrays):
    """A parameter value checked against its declared domain ``(lo, hi)``: a float for a number, else the array
    as ``arrays`` keeps it (its values checked where they can be read)."""
    lo, hi = module.PARAMETER_DOMAINS[name]
    where = f"outside ({lo}, {hi}) for map {module.NAME!r}"
    if is_number(value):
        v = float(value)
        if not lo < v < hi:
            raise ValueError(f"parameter {name} = {v} is {where}")
        return v
    if isinstance(value, (bool, np.bool_)) or not arrays.is_array(value):
        raise TypeError(f"parameter {name} must be a real number or an array of them, got {value!r}")
    kind = arrays.kind(value)
    if kind not in "iuf":
        raise TypeError(f"parameter {name} must be real, got dtype {value.dtype}")
    if math.prod(value.shape) == 0:
        raise ValueError(f"parameter {name} is an empty array")
    v = arrays.readable(value)
    if v is None:
        arrays.check_traced(value, lo, hi, f"a value of parameter {name} is {where}")
    else:
        bad = ~((lo < v) & (v < hi))  # NaN is outside too
        if bad.any():
            raise ValueError(f"parameter {name} = {float(v[bad].reshape(-1)[0])} is {where}")
    return arrays.keep(value)


def check_axis(shape: tuple, axis, word: str = "axis") -> int:
    """The map's axis of scores of ``shape``, from ``-ndim`` to ``ndim - 1``, as a non-negative int."""
    shape = tuple(shape)
    if not shape:
        raise ValueError(f"scores must have at least one dimension, got shape {shape}")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)) or not -len(shape) <= axis < len(shape):
        raise ValueError(f"{word} {axis!r} is out of range for scores of shape {shape}")
    if shape[axis] == 0:
        raise ValueError(f"{word} {int(axis)} of scores with shape {shape} is empty")
    return int(axis) % len(shape)


def param_shape(name: str, value_shape: tuple, shape: tuple, axis: int, word: str = "axis") -> tuple:
    """The shape of a parameter given per row, padded on the left to the scores' dimensions: it must broadcast to
    the scores of ``shape`` with size 1 along the map's ``axis`` (non-negative)."""
    value_shape, shape = tuple(value_shape), tuple(shape)
    if len(value_shape) > len(shape):
        raise ValueError(f"parameter {name} of shape {value_shape} has more dimensions than the scores {shape}")
    padded = (1,) * (len(shape) - len(value_shape)) + value_shape
    if padded[axis] != 1:
        raise ValueError(f"parameter {name} of shape {value_shape} must have size 1 along {word} {axis - len(shape)} "
                         f"of the scores {shape} (e.g. shape (H, 1) for scores (H, n))")
    if any(v not in (1, n) for v, n in zip(padded, shape)):
        raise ValueError(f"parameter {name} of shape {value_shape} does not broadcast to the scores {shape}")
    return padded


def param_rows(xp, name: str, value, shape: tuple, axis: int, word: str = "axis"):
    """A parameter array (checked) as one value per row of the scores of ``shape`` flattened with ``axis`` last:
    shape ``()`` for a single value, else ``(rows, 1)``."""
    padded = param_shape(name, value.shape, shape, axis, word)
    if math.prod(value.shape) == 1:
        return value.reshape(())
    rows = tuple(shape[:axis]) + (1,) + tuple(shape[axis + 1:])
    return xp.moveaxis(xp.broadcast_to(value.reshape(padded), rows), axis, -1).reshape(-1, 1)


# ------------------------------------------------- parameters learned per head
def check_learned(module: ModuleType, learn, ranges) -> tuple:
    """The names of the map parameters a layer learns (``learn``: names, or ``True`` for all) and the ``ranges``
    given for them, checked: ``(names, ranges)``."""
    names = tuple(module.PARAMETERS) if learn is True else tuple(learn or ())
    unknown = [n for n in names if n not in module.PARAMETERS]
    if unknown:
        raise ValueError(f"map {module.NAME!r} has no parameter(s) {unknown} to learn; it has {list(module.PARAMETERS)}")
    ranges = dict(ranges or {})
    if set(ranges) - set(names):
        raise ValueError(f"ranges given for parameters that are not learned: {sorted(set(ranges) - set(names))}")
    return names, ranges


def learned_range(module: ModuleType, name: str, start=None, given=None, what: str = "range") -> tuple:
    """``(lo, hi, logit)``: the range a parameter learned per head is kept in, as ``lo + (hi - lo) sigmoid(logit)``,
    and the logit it starts from.

    The range is ``given``, else the parameter's declared domain with an infinite end put 1 from the other, or
    twice the start's distance from it where that is more (alpha-entmax's ``(1, inf)`` from 1.5: ``(1, 2)``, the
    range of Correia et al. 2019; the entmax family's ``(0, inf)`` from 1.5: ``(0, 3)``, around softmax; a family
    with no start: its last case's domain, entmax's ``(1, 2)``), or 1 either side of the start where both ends
    are infinite.  It must be finite and inside the domain.  The start
    is the map's value ``start`` (a number inside the range), else the range's middle.
    """
    lo, hi = module.PARAMETER_DOMAINS[name]
    number = start is not None and is_number(start)
    if given is None and start is None and getattr(module, "FAMILY_PARAMETER", None) == name:
        lo, hi = module.CASES[-1][:2]  # a family with no value: its last case's (entmax: (1, 2), from 1.5)
    if given is None:
        centre = float(start) if number else 0.0
        span = (lambda d: max(1.0, 2 * d)) if number else (lambda d: 1.0)  # noqa: E731
        lo_r = lo if math.isfinite(lo) else (hi - span(hi - centre) if math.isfinite(hi) else centre - 1)
        hi_r = hi if math.isfinite(hi) else (lo_r + span(centre - lo_r) if math.isfinite(lo) else lo_r + 2)
    else:
        try:
            lo_r, hi_r = (float(v) for v in given)
        except (TypeError, ValueError):
            raise ValueError(f"{what} of {name} must be a pair of numbers (lo, hi), got {given!r}") from None
    if not (math.isfinite(lo_r) and math.isfinite(hi_r) and lo <= lo_r < hi_r <= hi):
        raise ValueError(f"{what} ({lo_r}, {hi_r}) of {name} must be finite, with lo < hi, and inside its domain "
                         f"({lo}, {hi}) for map {module.NAME!r}")
    if start is None:
        start = (lo_r + hi_r) / 2
    elif not (number and lo_r < float(start) < hi_r):
        raise ValueError(f"map parameter {name} = {start!r} must be one number inside the range ({lo_r}, {hi_r}) "
                         f"to start the learned values from")
    start = float(start)
    return lo_r, hi_r, math.log((start - lo_r) / (hi_r - start))


# ----------------------------------------------------------------- the loss
def check_reduction(reduction) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    return reduction


def reduce(value, reduction: str):
    """The loss per row (batch shape) reduced: as it is, summed, or averaged over the rows."""
    if reduction == "sum":
        return value.sum()
    if reduction == "mean":
        return value.sum() / max(1, math.prod(value.shape))
    return value


def check_target(x, target, axis: int, arrays: Arrays, word: str = "axis", constraint=None):
    """The loss's ``target`` as distributions like the scores ``x`` (integer labels of the batch shape become
    one-hot along ``axis``), checked where their values can be read: labels in range, distributions in the map's
    constraint set within ``sqrt(eps)`` (room for the rounding of a computed distribution).

    ``constraint``: ``(set, arrays)``, a :class:`numeric.constraints.ConstraintSet` and its arrays as its
    :meth:`~numeric.constraints.ConstraintSet.rows` lays them out; ``None``: the simplex (non-negative, summing
    to 1).  Integer labels lie in the simplex; they are checked against another set.
    """
    cset, rows = constraint if constraint is not None else (None, ())
    if not arrays.is_array(target):
        raise TypeError(f"target must be an array of integer labels or distributions, got {type(target).__name__}")
    xp = arrays.namespace
    n = x.shape[axis]
    kind = arrays.kind(target)
    if kind in "iu":
        batch = tuple(x.shape[:axis]) + tuple(x.shape[axis + 1:])
        if tuple(target.shape) != batch:
            raise ValueError(f"integer labels must have shape {batch} for scores {tuple(x.shape)} along {word} {axis}, "
                             f"got {tuple(target.shape)}")
        labels = arrays.readable(target) if math.prod(batch) else None
        if labels is not None and (int(labels.min()) < 0 or int(labels.max()) >= n):
            raise ValueError(f"target labels must lie in [0, {n}) for {word} {axis} of length {n}")
        onehot = arrays.one_hot(target, n, x)
        target = onehot if axis == len(x.shape) - 1 else xp.moveaxis(onehot, -1, axis)
        if not rows:
            return target
    elif kind not in "fb":
        raise TypeError(f"target must be integer labels or real distributions, got dtype {target.dtype}")
    elif tuple(target.shape) != tuple(x.shape):
        raise ValueError(f"target of shape {tuple(target.shape)} does not match scores of shape {tuple(x.shape)}")
    target = arrays.astype(target, x.dtype)
    t = arrays.readable(target) if math.prod(target.shape) else None
    if t is None:
        return target
    t = xp.moveaxis(t, axis, -1).reshape(-1, n)
    slack = math.sqrt(arrays.eps(x.dtype))
    message = simplex_target(t, slack, word, axis) if cset is None else \
        cset.check_target(xp, t, tuple(arrays.readable(a) for a in rows), slack, word, axis)
    if message is not None:
        raise ValueError(message)
    return target


def simplex_target(target, slack: float, word: str, axis: int) -> str | None:
    """The error message for a loss's target (readable rows) off the simplex by more than ``slack``, else ``None``."""
    total = target.sum(axis=-1)
    off = abs(total - 1)
    if bool((target < 0).any()) or not float(off.max()) <= slack:  # (NaN fails)
        what = ("a negative entry" if bool((target < 0).any()) else
                f"a row summing to {float(total.reshape(-1)[int(off.reshape(-1).argmax())])!r}")
        return (f"target must be a distribution along {word} {axis} (non-negative, summing to 1 within "
                f"{slack:.1e}); it has {what}")
    return None
