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
* the loss's terms per row (:func:`loss_rows`, on :func:`numeric.core.derivatives.omega_terms`).

A front end describes its arrays by an :class:`Arrays` (how to tell one, read its
values where they can be read, make a range of integers like it), and keeps its
own autograd and dtype glue.  The word for the map's axis is the backend's
keyword: ``axis`` for NumPy and JAX, ``dim`` for torch.
"""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np

from .constraints.box import box_short
from .core import derivatives
from .core.ops import Routines, TensorOps

__all__ = ["THRESHOLDS", "REDUCTIONS", "Arrays", "check_threshold", "check_names", "check_param", "check_axis",
           "is_number", "param_shape", "param_rows", "check_learned", "learned_range", "check_target", "check_reduction", "reduce",
           "loss_rows", "RowOps", "is_box", "box_rows"]

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


# ------------------------------------------------------------ box constraints
def is_box(upper, total) -> bool:
    """Whether a call asks for box constraints: a bound, or a total other than the number 1."""
    return upper is not None or not (is_number(total) and float(total) == 1.0)


def box_rows(xp, arrays: Arrays, x, upper, total, axis: int, word: str = "axis"):
    """``(upper, total)`` of a bounded call as rows of the scores ``x`` flattened with ``axis`` last: ``(rows, n)``
    bounds (``inf``: none) and ``(rows, 1)`` totals, in ``x``'s dtype, checked.

    ``upper``: ``None``, a number or an array broadcasting to the scores, ``>= 0``; ``total``: a number or an array
    broadcasting to the scores with size 1 along the map's axis, finite and ``> 0`` (a NaN or negative bound, or a
    total outside ``(0, inf)``, is refused by name; traced values, which cannot be read, give NaN rows instead,
    :func:`numeric.constraints.box.box_solve`).  Where the values can be read
    (:meth:`Arrays.readable`) the bounds of each row's unmasked scores must sum to at least its total, within
    ``sqrt(eps)`` of it (``sqrt(eps) * total``: float64 1.5e-8, float32 3.5e-4) ("infeasible bounds", with the row
    and the two sums); a fully masked row is exempt (it gives zeros).  Bounds computed from other sums (what is
    left of a budget, ``fertility - attention so far``) carry the rounding of those sums, which is relative to
    their magnitudes, not to the total's, and which the bounds do not show: ``sqrt(eps)`` (the target's slack in
    :func:`check_target`) covers it for any reasonable accumulation.  A row short of its total within it is
    solved with the total taken as its room (:func:`numeric.constraints.box.box_solve`: every entry saturates, ``p
    = u``); :func:`box_short` is the rule.
    """
    shape, n = tuple(x.shape), x.shape[axis]
    rows = math.prod(shape) // n

    def layout(value, name, along):
        if is_number(value):
            return arrays.full((rows, n if along else 1), float(value), x)
        if not arrays.is_array(value) or arrays.kind(value) not in "fiub":
            raise TypeError(f"{name} must be a real number or a real array, got {type(value).__name__}")
        value = arrays.astype(value, x.dtype)
        if along:
            if len(value.shape) > len(shape) or any(v not in (1, m) for v, m in
                                                       zip((1,) * (len(shape) - len(value.shape)) + tuple(value.shape), shape)):
                raise ValueError(f"{name} of shape {tuple(value.shape)} does not broadcast to the scores {shape}")
            full = xp.broadcast_to(value.reshape((1,) * (len(shape) - len(value.shape)) + tuple(value.shape)), shape)
            return xp.moveaxis(full, axis, -1).reshape(rows, n)
        padded = param_shape(name, value.shape, shape, axis, word)
        each = tuple(shape[:axis]) + (1,) + tuple(shape[axis + 1:])
        return xp.moveaxis(xp.broadcast_to(value.reshape(padded), each), axis, -1).reshape(rows, 1)

    u = layout(math.inf if upper is None else upper, "upper", True)
    c = layout(total, "total", False)
    # (a number is read even inside a trace, whose arrays full() makes cannot be)
    ru = np.float64(upper) if is_number(upper) else arrays.readable(u)
    rc = np.full((1, 1), float(total)) if is_number(total) else arrays.readable(c)
    rx = arrays.readable(x)
    if ru is not None and bool((ru != ru).any() | (ru < 0).any()):
        raise ValueError(f"upper must be >= 0 everywhere (inf: no bound), got {float(ru[~(ru >= 0)].reshape(-1)[0])!r}")
    if rc is not None and not bool(((rc > 0) & (rc < math.inf)).all()):
        raise ValueError(f"total must be finite and > 0, got {float(rc[~((rc > 0) & (rc < math.inf))].reshape(-1)[0])!r}")
    ru = arrays.readable(u) if is_number(upper) else ru
    rc = arrays.readable(c) if is_number(total) else rc
    if ru is not None and rc is not None and rx is not None:
        live = xp.moveaxis(rx, axis, -1).reshape(rows, n) != -math.inf  # (a NaN counts: its row comes out NaN)
        room = xp.where(live, ru, 0).sum(axis=-1)
        # (within sqrt(eps) of the total: feasible, the total clipped to the room; a fully masked row gives zeros)
        short = box_short(rc[:, 0], room, arrays.eps(x.dtype)) & live.any(axis=-1)
        if bool(short.any()):
            i = int((room - rc[:, 0]).argmin())
            raise ValueError(f"infeasible bounds: in row {i} the upper bounds of the unmasked scores sum to "
                             f"{float(room[i]):.6g} < total = {float(rc[i, 0]):.6g}")
    return u, c


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


def check_target(x, target, axis: int, arrays: Arrays, word: str = "axis", box=None):
    """The loss's ``target`` as distributions like the scores ``x`` (integer labels of the batch shape become
    one-hot along ``axis``), checked: labels in range, distributions non-negative and summing to 1 within
    ``sqrt(eps)`` (room for the rounding of a computed distribution) where their values can be read.

    ``box``: ``(upper, total)`` as :func:`box_rows` lays them out; the target must then lie in the box, each row
    summing to its total within ``sqrt(eps)`` of it and no entry above its bound by more than ``sqrt(eps)``.
    """
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
        if box is None:
            return target
    elif kind not in "fb":
        raise TypeError(f"target must be integer labels or real distributions, got dtype {target.dtype}")
    elif tuple(target.shape) != tuple(x.shape):
        raise ValueError(f"target of shape {tuple(target.shape)} does not match scores of shape {tuple(x.shape)}")
    target = arrays.astype(target, x.dtype)
    t = arrays.readable(target) if math.prod(target.shape) else None
    if t is None:
        return target
    slack = math.sqrt(arrays.eps(x.dtype))
    if box is None:
        total, want, over = t.sum(axis=axis), 1.0, None
    else:
        u, c = (arrays.readable(b) for b in box)
        if c is None:
            return target
        rows = xp.moveaxis(t, axis, -1).reshape(c.shape[0], n)
        total, want = rows.sum(axis=-1), c[:, 0]
        over = None if u is None else rows - u
    negative = bool((t < 0).any())
    off = abs(total - want)
    if negative or not float(off.max()) <= slack * (1 if box is None else max(1.0, float(want.max()))):  # (NaN fails)
        what = ("a negative entry" if negative else
                f"a row summing to {float(total.reshape(-1)[int(off.reshape(-1).argmax())])!r}")
        to = "1" if box is None else "its total"
        raise ValueError(f"target must be a distribution along {word} {axis} (non-negative, summing to {to} within "
                         f"{slack:.1e}); it has {what}")
    if over is not None and bool((over > slack).any()):
        raise ValueError(f"target must lie within the upper bounds; an entry exceeds its bound by "
                         f"{float(over.max()):.6g}")
    return target


class RowOps(TensorOps):
    """The operations of :func:`numeric.core.derivatives.omega_terms` on rows of any array namespace (NumPy, CuPy)."""

    def __init__(self, xp, dtype):
        self.xp = xp
        self.dtype = dtype

    def full(self, like, value):
        return self.xp.full(like.shape, value, dtype=bool if isinstance(value, bool) else self.dtype)

    def where(self, cond, a, b):
        return self.xp.where(cond, a, b)

    def isfinite(self, x):
        return self.xp.isfinite(x)

    def isnan(self, x):
        return self.xp.isnan(x)

    def exp(self, x):
        return self.xp.exp(x)

    def log(self, x):
        return self.xp.log(x)

    def not_(self, b):
        return ~b

    def row_sum(self, x):
        return x.sum(axis=-1, keepdims=True)

    def row_max(self, x):
        return x.max(axis=-1, keepdims=True)

    def branch(self, pred, fn, otherwise):
        return fn() if bool(pred.any()) else otherwise()


def loss_rows(ops, r: Routines, x, p, y):
    """The Fenchel-Young loss of each row of the 2-D scores ``x`` against the distributions ``y``, with ``p`` the
    map's output: ``sum_i [omega(y_i) - omega(p_i)] - (y_i - p_i) s_i`` (:func:`numeric.core.derivatives.omega_terms`),
    shape ``(rows,)``."""
    return derivatives.omega_terms(ops, r, x, p, y)[..., 0]
