"""Attention maps ``p*(s) = argmax_{p in simplex} <p, s> - Omega(p)`` assembled from generated kernels.

A :class:`Map` wraps one module of :mod:`numeric._generated` (or a module
written by ``regattn generate --expr ... --name ... --out DIR``) and the values
of its parameters.  It provides

* ``m(x, axis=-1)``: the map along ``axis`` (any batch shape);
* ``m.jvp(y, dx)`` / ``m.vjp(y, dy)``: ``J v = w*v - w (w.v) / sum(w)`` with
  ``w = 1/omega''(y)`` on the support (``J`` is symmetric, so both are the same);
* ``m.vjp_params(y, dy)``: gradients with respect to the map's parameters
  (``dp/dalpha = -J c`` with ``c_i = d omega'(p_i) / d alpha``);
* ``m.loss(x, target)`` and ``m.loss_and_grad(x, target)``: the Fenchel-Young
  loss ``Omega*(s) + Omega(y) - <s, y>`` and its gradient ``p*(s) - y``.

Scores of ``-inf`` are masked (probability exactly 0, as if absent); a row
with every score masked gives zeros and zero gradients; a NaN makes its row
NaN and leaves the others alone.  float16 computes in float32 and returns
float16; float32 and float64 compute as themselves.  CuPy arrays run the
generated CUDA kernels on the device.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Callable

import numpy as np

from . import trust, contract
from .backend import array_module, to_compute_dtype
from .backends import backend_for

__all__ = ["Map", "get_map", "softmax", "sparsemax", "entmax15", "entmax", "REQUIRED"]

#: What a module must define to serve as a map (the contract, :mod:`numeric.contract`).
REQUIRED = contract.required_names()
_THRESHOLDS = ("auto", "closed", "sort", "root")


def _check_param(module: ModuleType, name: str, value):
    """A parameter value checked against its domain: a float, or (one value per row) a float64 NumPy array."""
    lo, hi = module.PARAMETER_DOMAINS[name]
    if isinstance(value, bool) or not (isinstance(value, (int, float, np.integer, np.floating)) or hasattr(value, "shape")):
        raise TypeError(f"parameter {name} must be a real number or an array of them, got {value!r}")
    if hasattr(value, "get") and type(value).__module__.split(".")[0] == "cupy":
        value = value.get()
    a = np.asarray(value)
    if a.dtype.kind not in "iuf":
        raise TypeError(f"parameter {name} must be real, got dtype {a.dtype}")
    a = a.astype(np.float64)
    bad = ~((lo < a) & (a < hi))  # NaN is outside too
    if bad.any():
        shown = value if a.ndim == 0 else a[bad].ravel()[0]
        raise ValueError(f"parameter {name} = {shown} is outside ({lo}, {hi}) for map {module.NAME!r}")
    return float(a) if a.ndim == 0 else a


def _check_axis(x, axis: int) -> int:
    if x.ndim == 0:
        raise ValueError(f"scores must have at least one dimension, got shape {x.shape}")
    if not isinstance(axis, (int, np.integer)) or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for scores of shape {x.shape}")
    if x.shape[axis] == 0:
        raise ValueError(f"axis {axis} of scores with shape {x.shape} is empty")
    return int(axis) % x.ndim


def _rows(x, axis: int):
    """Move ``axis`` last and flatten the rest: returns (2-D view/copy, restore function)."""
    xp = array_module(x)
    moved = xp.moveaxis(x, axis, -1)
    shape = moved.shape
    flat = xp.ascontiguousarray(moved.reshape(-1, shape[-1]))

    def restore(a):
        return xp.moveaxis(a.reshape(shape), -1, axis)

    return flat, restore


class Map:
    """A regularized-argmax map from a generated module, with bound parameter values.

    Parameters
    ----------
    module:
        A generated module (see :data:`REQUIRED`).
    threshold:
        ``"auto"`` (the module's own kind), or force ``"sort"``/``"root"``
        (``"root"`` applies to every map; ``"sort"`` only to sort maps).
    **params:
        Values of the module's parameters, e.g. ``alpha=1.5``.
    """

    def __init__(self, module: ModuleType, threshold: str = "auto", **params: float):
        contract.check_map_module(module)
        if threshold not in _THRESHOLDS:
            raise ValueError(f"threshold must be one of {_THRESHOLDS}, got {threshold!r}")
        if threshold == "sort" and module.THRESHOLD != "sort":
            raise ValueError(f"map {module.NAME!r} has a {module.THRESHOLD} threshold; 'sort' needs a link of degree 1 or 2")
        if threshold == "closed" and module.THRESHOLD != "closed":
            raise ValueError(f"map {module.NAME!r} has no closed-form threshold")
        names = tuple(module.PARAMETERS)
        unknown = set(params) - set(names)
        if unknown:
            raise ValueError(f"map {module.NAME!r} has no parameter(s) {sorted(unknown)}; it has {list(names)}")
        missing = [n for n in names if n not in params]
        if missing:
            raise ValueError(f"map {module.NAME!r} needs a value for {', '.join(missing)}")
        self.module = module
        self.threshold = module.THRESHOLD if threshold == "auto" else threshold
        self.params = {name: _check_param(module, name, params[name]) for name in names}
        self._set_values()

    def _set_values(self):
        self.per_row = any(isinstance(v, np.ndarray) for v in self.params.values())
        self._values = None if self.per_row else tuple(self.params.values())

    def bound(self, values: dict) -> Map:
        """This map with parameter values already checked (floats or float64 arrays)."""
        m = object.__new__(Map)
        m.module, m.threshold, m.params = self.module, self.threshold, dict(values)
        m._set_values()
        return m

    # ---------------------------------------------------------------- info
    @property
    def name(self) -> str:
        return self.module.NAME

    @property
    def sparse(self) -> bool:
        return self.module.SPARSE

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" if not isinstance(v, np.ndarray) else f", {k}=<array {v.shape}>"
                        for k, v in self.params.items())
        return f"Map({self.name!r}, threshold={self.threshold!r}{extra})"

    def cast_params(self, dtype):
        """The parameter values as scalars of ``dtype`` (a map with one value per parameter)."""
        return tuple(np.asarray(v, dtype=dtype)[()] for v in self._values)

    # ------------------------------------------------------ per-row values
    def _param_rows(self, shape: tuple, axis: int) -> np.ndarray:
        """The parameters broadcast to the rows of scores of ``shape`` along ``axis``: ``(rows, n_params)``."""
        axis = axis % len(shape)
        rows = shape[:axis] + (1,) + shape[axis + 1:]
        cols = []
        for name, v in self.params.items():
            a = np.asarray(v)
            if a.ndim > len(shape):
                raise ValueError(f"parameter {name} of shape {a.shape} has more dimensions than the scores {shape}")
            padded = (1,) * (len(shape) - a.ndim) + a.shape
            if padded[axis] != 1:
                raise ValueError(f"parameter {name} of shape {a.shape} must have size 1 along the map's axis "
                                 f"{axis - len(shape)} of the scores {shape} (e.g. shape (H, 1) for scores (H, n))")
            try:
                b = np.broadcast_to(a.reshape(padded), rows)
            except ValueError:
                raise ValueError(f"parameter {name} of shape {a.shape} does not broadcast to the scores {shape}") from None
            cols.append(np.moveaxis(b, axis, -1).reshape(-1))
        return np.stack(cols, axis=-1)

    def _groups(self, shape: tuple, axis: int, xp):
        """``[(map, rows)]``: the rows (indices into the flattened rows, or None for all) sharing parameter values.

        Rows with equal values are solved together, by a map with one value per
        parameter, so the solvers and kernels see scalars; one value per head
        costs one gather and one scatter of the scores.
        """
        if not self.per_row:
            return [(self, None)]
        values, inverse = np.unique(self._param_rows(shape, axis), axis=0, return_inverse=True)
        names = tuple(self.params)
        maps = [self.bound(dict(zip(names, map(float, row)))) for row in values]
        if len(maps) == 1:
            return [(maps[0], None)]
        inverse = inverse.reshape(-1)
        return [(m, xp.asarray(np.flatnonzero(inverse == g))) for g, m in enumerate(maps)]

    def _values_like(self, y, axis: int, xp):
        """The parameters as scalars of ``y``'s dtype, or as arrays broadcasting against ``y`` (size 1 along ``axis``)."""
        if not self.per_row:
            return self.cast_params(y.dtype)
        table = self._param_rows(y.shape, axis)
        shape = y.shape[:axis] + y.shape[axis + 1:] + (1,)
        return tuple(xp.moveaxis(xp.asarray(table[:, i].reshape(shape), dtype=y.dtype), -1, axis)
                     for i in range(table.shape[1]))

    # ------------------------------------------------------------- forward
    def __call__(self, x, axis: int = -1):
        """``p*(x)`` along ``axis``; same array kind, shape and (float) dtype as ``x``."""
        return self.forward(x, axis)[0]

    def threshold_of(self, x, axis: int = -1):
        """The threshold ``tau`` of each row (``+inf`` for fully masked rows, NaN for rows with NaN)."""
        return self.forward(x, axis)[1]

    def forward(self, x, axis: int = -1, *, overwrite: bool = False):
        """``(p*(x), tau)``: the map along ``axis`` and the threshold of each row (batch shape).

        ``overwrite=True`` lets the NumPy path use ``x`` as scratch space (attention
        passes its own score buffers this way, saving an allocation and a pass);
        copies made here (a cast, a moved axis) are used as scratch anyway.
        """
        backend = backend_for(x)
        given = x
        x, out_dtype = to_compute_dtype(x, backend.namespace())
        axis = _check_axis(x, axis)
        flat, restore = _rows(x, axis)
        # scratch space: a copy made here (a cast or a moved axis), or the caller's buffer if allowed
        own = not backend.shares_memory(flat, given)
        groups = self._groups(x.shape, axis, backend.namespace())
        if groups[0][1] is None:
            p, tau = backend.forward(groups[0][0], flat, overwrite=overwrite or own)
        else:
            xp = backend.namespace()
            p, tau = xp.empty_like(flat), xp.empty(flat.shape[0], dtype=flat.dtype)
            for m, rows in groups:
                p[rows], tau[rows] = backend.forward(m, flat[rows], overwrite=True)
        batch = x.shape[:axis] + x.shape[axis + 1:]
        return restore(p).astype(out_dtype, copy=False), tau.reshape(batch)

    # --------------------------------------------------------- derivatives
    def on_support(self, fn, y, xp, off=0.0, values=None):
        """``fn(y, *values)`` where ``y > 0``, ``off`` elsewhere; ``fn`` is evaluated at 1 off the support.

        ``values``: the parameters (scalars or arrays broadcasting against ``y``), by default :meth:`_cast`'s.
        """
        pos = y > 0
        value = xp.asarray(fn(y + ~pos, *(self.cast_params(y.dtype) if values is None else values)))
        return (value * pos + off * ~pos if off else value * pos).astype(y.dtype, copy=False)

    def jvp(self, y, dx, axis: int = -1):
        """``J dx`` at ``y = m(x)``: ``w*dx - w (w.dx) / sum(w)``, ``w = w(y)`` on the support."""
        backend = backend_for(y, dx)
        xp = backend.namespace()
        y, out_dtype = to_compute_dtype(y, xp)
        dx = xp.asarray(dx).astype(y.dtype, copy=False)
        if dx.shape != y.shape:
            raise ValueError(f"tangent of shape {dx.shape} does not match the output shape {y.shape}")
        axis = _check_axis(y, axis)
        fy, restore = _rows(y, axis)
        fd, _ = _rows(dx, axis)
        groups = self._groups(y.shape, axis, xp)
        if groups[0][1] is None:
            return restore(backend.jvp(groups[0][0], fy, fd)).astype(out_dtype, copy=False)
        out = xp.empty_like(fy)
        for m, rows in groups:
            out[rows] = backend.jvp(m, fy[rows], fd[rows])
        return restore(out).astype(out_dtype, copy=False)

    def vjp(self, y, dy, axis: int = -1):
        """``J^T dy`` at ``y = m(x)``; ``J`` is symmetric, so this equals :meth:`jvp`."""
        return self.jvp(y, dy, axis=axis)

    def vjp_params(self, y, dy, axis: int = -1, *, reduce: bool = False) -> dict:
        """``{name: sum_i dy_i dp_i/dq}`` per row (batch shape), for each parameter ``q``.

        From the KKT system, ``dp/dq = -J c`` with ``c_i = d omega'(p_i)/dq`` on the
        support; computed in float64 (the printed ``d omega'/d alpha`` cancels near
        ``alpha = 1`` in float32).  ``reduce=True`` sums each over the rows that
        share a value: a float for a parameter given as a number, an array of the
        parameter's shape for one given per row.
        """
        xp = array_module(y, dy)
        y64 = xp.asarray(y).astype(np.float64)
        dy64 = xp.asarray(dy).astype(np.float64)
        if dy64.shape != y64.shape:
            raise ValueError(f"cotangent of shape {dy64.shape} does not match the output shape {y64.shape}")
        axis = _check_axis(y64, axis)
        jdy = self.jvp(y64, dy64, axis=axis)
        values = self._values_like(y64, axis, xp)
        out = {}
        for name in self.params:
            c = self.on_support(getattr(self.module, f"omega_prime_d_{name}"), y64, xp, values=values)
            out[name] = -(jdy * c).sum(axis=axis)
        return self.reduce_to_params(out, y64.shape, axis) if reduce else out

    def reduce_to_params(self, grads: dict, shape: tuple, axis: int = -1) -> dict:
        """Per-row gradients (for scores of ``shape`` along ``axis``) summed to each parameter's shape."""
        axis = axis % len(shape)
        out = {}
        for name, g in grads.items():
            value = self.params[name]
            if not isinstance(value, np.ndarray):
                out[name] = float(g.sum())
                continue
            g = array_module(g).expand_dims(g, axis)  # size 1 along the map's axis, as the parameter
            extra = g.ndim - value.ndim
            g = g.sum(axis=tuple(range(extra))) if extra else g
            axes = tuple(i for i, n in enumerate(value.shape) if n == 1 and g.shape[i] != 1)
            out[name] = g.sum(axis=axes, keepdims=True) if axes else g
        return out

    # ---------------------------------------------------------------- loss
    def _target(self, x, target, axis, xp):
        target = xp.asarray(target)
        if target.dtype.kind in "iu":
            batch = x.shape[:axis] + x.shape[axis + 1:]
            if target.shape != batch:
                raise ValueError(f"integer labels must have shape {batch} for scores {x.shape} along axis {axis}, got {target.shape}")
            n = x.shape[axis]
            if target.size and (int(target.min()) < 0 or int(target.max()) >= n):
                raise ValueError(f"labels must lie in [0, {n}) for axis {axis} of length {n}")
            onehot = xp.moveaxis(xp.arange(n) == xp.expand_dims(target, -1), -1, axis)
            return onehot.astype(x.dtype)
        if target.dtype.kind not in "fb":
            raise TypeError(f"target must be integer labels or real distributions, got dtype {target.dtype}")
        target = target.astype(x.dtype, copy=False)
        if target.shape != x.shape:
            raise ValueError(f"target of shape {target.shape} does not match scores of shape {x.shape}")
        # a distribution along axis: non-negative, summing to 1 up to sqrt(eps) (room for the
        # rounding of a computed distribution; a target off the simplex has no loss)
        if target.size:
            total = target.sum(axis=axis)
            slack = math.sqrt(float(np.finfo(x.dtype).eps))
            negative = float(xp.min(target)) < 0
            worst = float(xp.max(xp.abs(total - 1)))
            if negative or not worst <= slack:  # (NaN fails too)
                what = "a negative entry" if negative else f"a sum of {float(total.ravel()[int(xp.argmax(xp.abs(total - 1)))])!r}"
                raise ValueError(f"target must be a distribution along axis {axis} (non-negative, summing to 1 "
                                 f"within {slack:.1e}); it has {what}")
        return target

    def loss(self, x, target, axis: int = -1, reduction: str = "mean"):
        """Fenchel-Young loss ``Omega*(s) + Omega(y) - <s, y>`` (see :meth:`loss_and_grad`)."""
        return self.loss_and_grad(x, target, axis=axis, reduction=reduction)[0]

    def loss_and_grad(self, x, target, axis: int = -1, reduction: str = "mean"):
        """``(loss, dloss/dx)`` with ``target`` integer labels or distributions along ``axis``.

        ``Omega*(s) = <p*, s> - Omega(p*)`` and the scores are shifted by their
        maximum first (the loss is shift-invariant), so huge scores lose no
        precision.  Masked scores are left out; a target with mass on a masked
        score has infinite loss.  The gradient is ``p*(s) - y`` (divided by the
        number of rows for ``reduction="mean"``).  ``reduction`` is ``"none"``
        (one value per row, batch shape), ``"sum"`` or ``"mean"``.

        The loss is summed score by score, ``omega(y_i) - omega(p_i) - (y_i - p_i) s_i``,
        each term 0 where ``y_i = p_i``: a regularizer infinite at 0 (``-log(p)``,
        ``1/p``) gives 0 at ``y = p*(s)`` and ``+inf`` only for a target outside its
        domain (a zero where ``p_i > 0``).  A score whose distance to the row maximum
        overflows (``s - max(s) = -inf``) has ``p_i = 0`` and no term, unless the
        target puts mass there (``+inf``).  A target that is not a distribution
        (negative entries, or sums off 1 by more than ``sqrt(eps)``) raises
        :class:`ValueError`.
        """
        if reduction not in ("none", "sum", "mean"):
            raise ValueError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
        xp = array_module(x, target)
        x, out_dtype = to_compute_dtype(x, xp)
        axis = _check_axis(x, axis)
        y = self._target(x, target, axis, xp)
        p = self(x, axis=axis).astype(x.dtype, copy=False)
        params = self._values_like(x, axis, xp)
        finite = xp.isfinite(x)
        m = xp.max(xp.where(finite, x, -xp.inf), axis=axis, keepdims=True)
        with np.errstate(over="ignore"):  # a spread beyond the dtype's range is -inf, as in the map
            s = xp.where(finite, x - xp.where(xp.isfinite(m), m, 0), 0)
        if self.per_row:  # one value of omega(0+) per row
            omega_zero = xp.asarray(self.module.omega_zero(*params), dtype=x.dtype)
            infinite_at_zero = xp.isinf(omega_zero)
        else:
            omega_zero = float(self.module.omega_zero(*params))
            infinite_at_zero = math.isinf(omega_zero)

        def omega_of(q):
            """omega(q) on q > 0, omega(0+) (maybe +inf) at 0; q * s there, 0 at q = 0."""
            pos = q > 0
            with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
                val = xp.asarray(self.module.omega(xp.where(pos, q, 1), *params))
                return xp.where(pos, val, omega_zero), xp.where(pos, q * s, 0)

        with np.errstate(over="ignore", invalid="ignore"):
            om_p, ps = omega_of(p)
            om_y, ys = omega_of(y)
            term = (om_y - om_p) - (ys - ps)
            # p_i = 0 on a finite score of a dense map (an underflow far below the maximum):
            # omega*(s_i - tau) falls slower than linearly, so -y_i s_i wins: +inf
            if self.per_row:
                term = xp.where((p == 0) & (y > 0) & infinite_at_zero, xp.inf, term)
            elif infinite_at_zero:
                term = xp.where((p == 0) & (y > 0), xp.inf, term)
            value = xp.where(finite & (y != p), term, 0).sum(axis=axis)
        masked_mass = (xp.where(finite, 0, y) > 0).any(axis=axis)
        value = xp.where(masked_mass, xp.inf, value)
        value = xp.where(xp.isnan(x).any(axis=axis), xp.nan, value)  # a NaN score makes its row NaN
        grad = p - y
        rows = max(1, value.size)
        if reduction == "sum":
            value = value.sum()
        elif reduction == "mean":
            value = value.sum() / rows
            grad = grad / rows
        return value.astype(out_dtype), grad.astype(out_dtype)


class FrameworkMap:
    """What the torch and JAX maps (:class:`numeric.torch.TorchMap`, :class:`numeric.jax.JaxMap`) share: the
    ``module``, its name, and parameters checked by the framework's ``check_param(module, name, value)``."""

    module: ModuleType
    check_param: Callable
    #: the thresholds a framework's map takes
    THRESHOLDS = ("auto", "sort", "root")

    def _bind(self, mapping, threshold: str, params: dict) -> None:
        """Sets ``module``, ``threshold`` and ``params`` (those of ``mapping`` if it is a map of this class,
        updated with ``params``), checked."""
        module = module_of(mapping, type(self), check=True)
        if threshold not in self.THRESHOLDS:
            raise ValueError(f"threshold must be one of {self.THRESHOLDS}, got {threshold!r}")
        if threshold == "sort" and module.THRESHOLD != "sort":
            raise ValueError(f"map {module.NAME!r} has a {module.THRESHOLD} threshold; 'sort' needs a link of degree 1 or 2")
        self.module = module
        self.threshold = threshold
        bound = dict(mapping.params) if isinstance(mapping, type(self)) else {}
        self.params = {**bound, **self._checked(params)}

    def _checked(self, params: dict) -> dict:
        names = tuple(self.module.PARAMETERS)
        unknown = set(params) - set(names)
        if unknown:
            raise ValueError(f"map {self.module.NAME!r} has no parameter(s) {sorted(unknown)}; it has {list(names)}")
        return {name: type(self).check_param(self.module, name, value) for name, value in params.items()}

    @property
    def name(self) -> str:
        return self.module.NAME


def import_map_module(name: str) -> ModuleType:
    """The generated module for a built-in or a top-level module name, its header checked before it runs."""
    from ._generated import BUILTINS

    full = f"numeric._generated.{name}" if name in BUILTINS else name
    if full is name and not name.isidentifier():
        raise ValueError(
            f"no map named {name!r}: a generated module is found by a plain top-level name "
            "(pass a module inside a package as the module object)"
        )
    try:
        return trust.import_generated(full)
    except ModuleNotFoundError as exc:
        if exc.name != full:
            raise
        raise ValueError(
            f"no map named {name!r}: built-ins are {', '.join(BUILTINS)}; a generated module "
            "must be importable by that name (or pass the module itself)"
        ) from None


def module_of(mapping, own: type, check: bool = False) -> ModuleType:
    """The generated module of a map given as a name, a module (checked: :func:`numeric.trust.check_module`) or an
    instance of a front end's map class ``own`` (its module); ``check``: a module not taken from an ``own`` map
    is checked against the contract too (:func:`numeric.contract.check_map_module`)."""
    if isinstance(mapping, own):
        return mapping.module
    if isinstance(mapping, ModuleType):
        module = trust.check_module(mapping)
    elif isinstance(mapping, str):
        module = import_map_module(mapping)
    else:
        raise TypeError(f"a map is a name, a generated module or a {own.__name__}, got {type(mapping).__name__}")
    if check:
        contract.check_map_module(module)
    return module


def get_map(name, *, threshold: str = "auto", **params) -> Map:
    """The :class:`Map` for a built-in name, an importable generated module's name, or the module itself.

    A module found by name is checked before it runs: its header must be
    ``regattn generate``'s and its content hash must match its body, else
    :class:`ValueError` (nothing of it is executed).  A module object passed in
    has already run; its source file (``__file__``) is checked the same way.  The
    error for a module that is not a generated map is both a :class:`ValueError`
    and a :class:`TypeError`.

    >>> import numpy as np, numeric as nm
    >>> nm.get_map("sparsemax")(np.array([-2.0, 0.0, 0.5]))
    array([0.  , 0.25, 0.75])
    """
    if isinstance(name, Map):
        return name if not params and threshold == "auto" else Map(name.module, threshold, **{**name.params, **params})
    return Map(module_of(name, Map), threshold, **params)


def softmax(x, axis: int = -1):
    """Softmax ``p_i = exp(s_i) / sum_j exp(s_j)``: the map of Shannon's ``p log p``."""
    return get_map("softmax")(x, axis=axis)


def sparsemax(x, axis: int = -1):
    """Sparsemax ``p = [s - tau]_+``: the map of ``p**2 / 2`` (Euclidean projection on the simplex)."""
    return get_map("sparsemax")(x, axis=axis)


def entmax15(x, axis: int = -1):
    """1.5-entmax ``p = [s/2 - tau]_+**2``: the map of Tsallis alpha = 3/2."""
    return get_map("entmax15")(x, axis=axis)


def entmax(x, alpha: float, axis: int = -1):
    """alpha-entmax ``p = [(alpha - 1) s - tau]_+**(1/(alpha - 1))``, alpha > 1 (Tsallis)."""
    return get_map("entmax", alpha=alpha)(x, axis=axis)
