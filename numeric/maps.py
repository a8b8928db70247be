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

import copy

import difflib
from types import ModuleType

import numpy as np

from . import contract, family, front, trust
from .constraints import SIMPLEX, choose
from .core.array_ops import ArrayOps
from .core.ops import Routines
from .families import FAMILIES, Family, family_of, functions
from .front import NUMPY, check_axis
from .backend import array_module, to_compute_dtype
from .backends import backend_for

__all__ = ["Map", "get_map", "softmax", "sparsemax", "entmax15", "entmax", "REQUIRED", "FAMILY_FUNCTIONS"]

#: What a module must define to serve as a map (the contract, :mod:`numeric.contract`).
REQUIRED = contract.required_names()


def _same(a):
    return a


def to_rows(x, axis: int):
    """Move ``axis`` last and flatten the rest: returns (2-D view/copy, restore function)."""
    xp = array_module(x)
    if x.ndim == 2 and axis in (1, -1) and getattr(getattr(x, "flags", None), "c_contiguous", False):
        return x, _same  # already rows: no moves (each costs microseconds a call)
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
        A generated module (see :data:`REQUIRED`), or a map family (:class:`numeric.families.base.Family`: ``p``
        follows from its inner generated map's, through the family's hooks; ``module`` is then that map's module).
    threshold:
        ``"auto"`` (the module's own kind), or force ``"sort"``/``"root"``
        (``"root"`` applies to every map; ``"sort"`` only to sort maps); a family's: its inner map's.
    **params:
        Values of the module's parameters, e.g. ``alpha=1.5`` (a family's: its own, each with its default).
    """

    #: the constraint keywords the map's name binds (:func:`bound_keywords`), a call's own overriding them
    keywords: dict = {}
    #: the name the map was asked for where it is not its module's (``relu``: sparsemax's module)
    label: str | None = None

    def __init__(self, module: ModuleType | Family, threshold: str = "auto", **params: float):
        self.family = module if isinstance(module, Family) else None
        declared = module
        if self.family is not None:
            params = {**self.family.parameters, **params}
            module = import_map_module(self.family.inner)
        contract.check_map_module(module)
        front.check_threshold(module, threshold)
        front.check_names(declared, params, complete=True)
        self.module = module
        # (a family's "auto" is each case's own rule; a map family's, its inner map's)
        self.threshold = module.THRESHOLD if threshold == "auto" and not family.is_family(module) \
            and self.family is None else threshold
        self._auto = threshold == "auto"
        if self.family is None:
            self.params = {name: front.check_param(module, name, params[name], NUMPY) for name in module.PARAMETERS}
        else:
            self.params = {name: self.family.check(name, params[name], NUMPY) for name in self.family.parameters}
        self._set_values()

    def _set_values(self):
        self.per_row = any(isinstance(v, np.ndarray) for v in self.params.values())
        self._values = None if self.per_row else tuple(self.params.values())

    def bound(self, values: dict, module: ModuleType | None = None) -> Map:
        """This map with parameter values already checked (floats or float64 arrays); ``module``: another module
        (a case of this family), the threshold its own where this map's is ``"auto"``."""
        m = object.__new__(type(self))
        m.module, m.threshold, m._auto, m.params = self.module, self.threshold, self._auto, dict(values)
        m.family, m.keywords, m.label = self.family, self.keywords, self.label
        if module is not None:
            m.module = module
            m.threshold = module.THRESHOLD if self._auto else self.threshold
            m.params = {name: values[name] for name in module.PARAMETERS}
        m._set_values()
        return m

    def _case(self, host: bool = True) -> Map:
        """The map that solves this one (a map with one value per parameter): for a family, its case's
        (:func:`numeric.family.resolve`), or on the host the family's own routines where no case serves (a
        point, a value near one); ``host=False`` (CuPy: kernels) takes the case module then too."""
        if not family.is_family(self.module):
            return self
        module = family.resolve(self.module, self.params)
        if module is self.module:
            if host:
                return self
            module = family.case_modules(self.module)[family.case_index(self.module.CASES, self.params[module.FAMILY_PARAMETER])]
        return self.bound(self.params, module)

    # ---------------------------------------------------------------- info
    @property
    def name(self) -> str:
        return self.label or (self.module.NAME if self.family is None else self.family.name)

    @property
    def sparse(self) -> bool | None:
        """Whether the map is sparse (``None`` for a family with values in cases of both kinds)."""
        if self.family is not None:
            return self.family.sparse
        if family.is_family(self.module) and not self.per_row:
            return self._case(host=False).sparse
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
            b = np.broadcast_to(a.reshape(front.param_shape(name, a.shape, shape, axis)), rows)
            cols.append(np.moveaxis(b, axis, -1).reshape(-1))
        return np.stack(cols, axis=-1)

    def _groups(self, shape: tuple, axis: int, xp):
        """``[(map, rows)]``: the rows (indices into the flattened rows, or None for all) sharing parameter values.

        Rows with equal values are solved together, by a map with one value per
        parameter, so the solvers and kernels see scalars; one value per head
        costs one gather and one scatter of the scores.
        """
        host = xp is np
        if not self.per_row:
            return [(self._case(host), None)]
        values, inverse = np.unique(self._param_rows(shape, axis), axis=0, return_inverse=True)
        names = tuple(self.params)
        maps = [self.bound(dict(zip(names, map(float, row))))._case(host) for row in values]
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
    def __call__(self, x, axis: int = -1, **constraints):
        """``p*(x)`` along ``axis``; same array kind, shape and (float) dtype as ``x``.

        ``constraints``: the keywords of a constraint set other than the simplex (:mod:`numeric.constraints`).
        The box: ``upper`` (a number or an array broadcasting to ``x``, ``>= 0``; ``None``: no bound) and
        ``total`` (a number or an array with size 1 along ``axis``, ``>= 0``), the map over ``0 <= p <= upper``,
        ``sum p = total``, ``p_i = min(u_i, g_+(s_i - tau))`` (:mod:`derive.box`): constrained softmax and
        sparsemax, and ``sparsemax(x, upper=1, total=k)`` the budget map.  Infeasible bounds (those of a row's
        unmasked scores summing to less than its total) are refused.
        """
        return self.forward(x, axis, **constraints)[0]

    def threshold_of(self, x, axis: int = -1):
        """The threshold ``tau`` of each row (``+inf`` for fully masked rows, NaN for rows with NaN)."""
        return self.forward(x, axis)[1]

    def forward(self, x, axis: int = -1, *, overwrite: bool = False, **constraints):
        """``(p*(x), tau)``: the map along ``axis`` and the threshold of each row (batch shape).

        ``overwrite=True`` lets the NumPy path use ``x`` as scratch space (attention
        passes its own score buffers this way, saving an allocation and a pass);
        copies made here (a cast, a moved axis) are used as scratch anyway.
        ``constraints``: a constraint set's keywords (:meth:`__call__`).
        """
        if self.family is not None:
            return self._family_forward(x, axis, constraints)
        cset, values = choose_for(self, constraints)
        backend = backend_for(x)
        given = x
        x, out_dtype = to_compute_dtype(x, backend.namespace())
        axis = check_axis(x.shape, axis)
        flat, restore = to_rows(x, axis)
        if cset is not SIMPLEX:
            xp = backend.namespace()
            arrays = cset.rows(xp, front.Arrays(xp), x, values, axis)
            groups = self._groups(x.shape, axis, xp)
            if groups[0][1] is None:  # (one group: the solve's own arrays, no copy; a sink's p may be a view)
                p, tau = backend.constrained(groups[0][0], cset, flat, arrays)
            else:
                p, tau = xp.empty_like(flat), xp.empty(flat.shape[0], dtype=flat.dtype)
                for m, rows in groups:
                    p[rows], tau[rows] = backend.constrained(m, cset, flat[rows], tuple(a[rows] for a in arrays))
            batch = x.shape[:axis] + x.shape[axis + 1:]
            return restore(p).astype(out_dtype, copy=False), tau.reshape(batch)
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

    def _family_forward(self, x, axis: int, constraints: dict):
        """:meth:`forward` of a map family's map: its inner map at the scaled scores, then the family's ``p``."""
        fam = self.family
        fam.check_set(constraints)
        xp = array_module(x)
        x, out_dtype = to_compute_dtype(x, xp)
        axis = check_axis(x.shape, axis)
        inner = Map(self.module, self.threshold, **fam.inner_params(*self.params.values()))
        with np.errstate(invalid="ignore"):  # (-inf times a positive scale stays -inf; NaN rows stay NaN)
            r, tau = inner.forward(x * fam.scale(*self._values_like(x, axis, xp)), axis, overwrite=True)
        rows, restore = to_rows(r, axis)
        with np.errstate(divide="ignore", invalid="ignore"):
            p = fam.output(ArrayOps(xp, x.dtype), rows, *self._row_values(x.shape, axis, x.dtype, xp))
        return restore(p).astype(out_dtype, copy=False), tau

    # --------------------------------------------------------- derivatives
    def on_support(self, fn, y, xp, off=0.0, values=None):
        """``fn(y, *values)`` where ``y > 0``, ``off`` elsewhere; ``fn`` is evaluated at 1 off the support.

        ``values``: the parameters (scalars or arrays broadcasting against ``y``), by default :meth:`_cast`'s.
        """
        pos = y > 0
        value = xp.asarray(fn(y + ~pos, *(self.cast_params(y.dtype) if values is None else values)))
        return (value * pos + off * ~pos if off else value * pos).astype(y.dtype, copy=False)

    def jvp(self, y, dx, axis: int = -1, *, x=None, **constraints):
        """``J dx`` at ``y = m(x)``: ``w*dx - w (w.dx) / sum(w)``, ``w = w(y)`` on the support (with a constraint
        set's keywords: the set's, :meth:`numeric.constraints.ConstraintSet.vjp`; ``J`` is symmetric).  ``x``: the
        scores, which a set whose Jacobian needs them requires (a sink's weight,
        :attr:`numeric.constraints.ConstraintSet.jacobian_scores`)."""
        cset, values = choose_for(self, constraints)
        if cset.jacobian_scores and x is None:
            raise ValueError(f"the {cset.name} set's derivatives need the scores: pass x=")
        backend, xp, y, out_dtype, axis, fy, fd, restore = tangent_rows(y, dx, axis, "tangent")
        if self.family is not None:  # (a map family's own product, from p)
            self.family.check_set(constraints)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                out = self.family.vjp(ArrayOps(xp, y.dtype), fy, fd, *self._row_values(y.shape, axis, y.dtype, xp))
            return restore(out).astype(out_dtype, copy=False)
        if cset is not SIMPLEX:
            fx = None if x is None else tangent_rows(y, x, axis, "score")[6]
            js, _ = self._constrained_vjp(backend, cset, values, y, fy, fd, axis, fx)
            return restore(js).astype(out_dtype, copy=False)
        groups = self._groups(y.shape, axis, xp)
        if groups[0][1] is None:
            return restore(backend.jvp(groups[0][0], fy, fd)).astype(out_dtype, copy=False)
        out = xp.empty_like(fy)
        for m, rows in groups:
            out[rows] = backend.jvp(m, fy[rows], fd[rows])
        return restore(out).astype(out_dtype, copy=False)

    def vjp(self, y, dy, axis: int = -1, *, x=None, **constraints):
        """``J^T dy`` at ``y = m(x)``; ``J`` is symmetric, so this equals :meth:`jvp`."""
        return self.jvp(y, dy, axis=axis, x=x, **constraints)

    def vjp_bounds(self, y, dy, axis: int = -1, *, x=None, **constraints) -> dict:
        """``{"upper": sum_i dy_i dp_i/du, "total": sum_i dy_i dp_i/dc}`` at ``y = m(x, upper=upper, total=total)``:
        the first of the scores' shape (non-zero on the saturated entries, ``dy_j - (w.dy)/sum w``), the second
        per row (batch shape), ``(w.dy)/sum w`` with ``w`` the weights of the free entries (:mod:`derive.box`).

        In a row where no entry is free (each at 0 or at its bound, as budget sparsemax's ``[1, 1, 0]``) the
        derivatives are one-sided, on the side where ``tau`` rises (the right-derivative in the bounds, the left
        in the total): the saturated entries that leave their bound first take the free ones' place
        (:func:`numeric.constraints.box.box_exits`); that needs the scores ``x``, and such a row without them raises
        :class:`ValueError`."""
        cset, values = choose_for(self, constraints)
        if self.family is not None:  # (a map family runs on the simplex, which has no arrays)
            self.family.check_set(constraints)
            return {}
        fx = None if x is None else tangent_rows(y, x, axis, "score")[6]
        backend, xp, y, out_dtype, axis, fy, fd, restore = tangent_rows(y, dy, axis, "cotangent")
        _, grads = self._constrained_vjp(backend, cset, values, y, fy, fd, axis, fx, own=True)
        batch = y.shape[:axis] + y.shape[axis + 1:]
        return {name: (restore(g) if name in cset.per_score else g.reshape(batch)).astype(out_dtype, copy=False)
                for name, g in zip(cset.keywords, grads)}

    def _constrained_vjp(self, backend, cset, values, y, fy, fd, axis, fx, own: bool = False):
        """:meth:`Backend.constrained_vjp` on the rows ``fy``, ``fd`` of ``y`` (groups of parameter values solved
        apart), with the scores' rows ``fx`` (``None``: none given): ``(J^T dy, (the set's arrays' VJPs))``;
        ``own``: the derivatives in the set's arrays are wanted, which a row with no free entry gives only with the
        scores (:attr:`~numeric.constraints.ConstraintSet.needs_scores`)."""
        xp = backend.namespace()
        arrays = cset.rows(xp, front.Arrays(xp), y, values, axis)
        if own and fx is None and cset.needs_scores:
            moving = cset.moving(backend.row_ops(fy.dtype), fy, *arrays)
            pinned = ~moving.any(axis=-1) & (fy > 0).any(axis=-1)
            if bool(pinned.any()):
                raise ValueError(f"row {int(xp.argmax(pinned))} has no entry free of its bounds: its derivatives in "
                                 f"the bounds and the total are one-sided and need the scores (pass x=)")
        js = xp.empty_like(fy)
        grads = [xp.empty_like(a if a.shape == fy.shape else xp.empty((fy.shape[0], 1), dtype=fy.dtype)) for a in arrays]
        for m, rows in self._groups(y.shape, axis, xp):
            rows = slice(None) if rows is None else rows
            js[rows], own_rows = backend.constrained_vjp(m, cset, fy[rows], fd[rows], tuple(a[rows] for a in arrays),
                                                         None if fx is None else fx[rows])
            for g, v in zip(grads, own_rows):
                g[rows] = v
        return js, grads

    def vjp_params(self, y, dy, axis: int = -1, *, reduce: bool = False, x=None, **constraints) -> dict:
        """``{name: sum_i dy_i dp_i/dq}`` per row (batch shape), for each parameter ``q``.

        From the KKT system, ``dp/dq = -J c`` with ``c_i = d omega'(p_i)/dq`` on the
        support; computed in float64 (the printed ``d omega'/d alpha`` cancels near
        ``alpha = 1`` in float32).  ``reduce=True`` sums each over the rows that
        share a value: a float for a parameter given as a number, an array of the
        parameter's shape for one given per row.  ``constraints``: at the constrained map's ``y`` (the box's: ``J`` the
        Jacobian on the free entries (the saturated ones do not move); a sink's: the sink moves too, and ``x``, the
        scores, are needed).  A map family without gradients in its parameters raises :class:`NotImplementedError`.
        """
        if self.family is not None:
            raise NotImplementedError(self.family.no_gradient)
        xp = array_module(y, dy)
        y64 = xp.asarray(y).astype(np.float64)
        dy64 = xp.asarray(dy).astype(np.float64)
        if dy64.shape != y64.shape:
            raise ValueError(f"cotangent of shape {dy64.shape} does not match the output shape {y64.shape}")
        axis = check_axis(y64.shape, axis)
        cset, set_values = choose_for(self, constraints)
        values = self._values_like(y64, axis, xp)
        if cset is SIMPLEX:
            jdy, more = self.jvp(y64, dy64, axis=axis), {}
        else:  # (the set's arrays that a parameter moves, param_directions, with their VJPs)
            backend, xp, y64, _, axis, fy, fd, restore = tangent_rows(y64, dy64, axis, "cotangent")
            fx = None if x is None else tangent_rows(y64, x, axis, "score")[6]
            js, grads = self._constrained_vjp(backend, cset, set_values, y64, fy, fd, axis, fx)
            jdy = restore(js)
            arrays = cset.rows(xp, front.Arrays(xp), y64, set_values, axis)
            ops = backend.row_ops(np.float64)
            r = self._routines(y64.shape, axis, np.float64, xp)
            with np.errstate(all="ignore"):
                more = {name: sum(-(g * c).sum(axis=-1) for g, c in
                                  zip(grads, cset.param_directions(ops, r, fy, name, *arrays, x=fx)))
                        for name in self.params}
        out = {}
        for name in self.params:
            c = self.on_support(getattr(self.module, f"omega_prime_d_{name}"), y64, xp, values=values)
            out[name] = -(jdy * c).sum(axis=axis)
            if isinstance(more.get(name), np.ndarray):
                out[name] = out[name] + more[name].reshape(out[name].shape)
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
    def loss(self, x, target, axis: int = -1, reduction: str = "mean", **constraints):
        """Fenchel-Young loss ``Omega*(s) + Omega(y) - <s, y>`` (see :meth:`loss_and_grad`)."""
        return self.loss_and_grad(x, target, axis=axis, reduction=reduction, **constraints)[0]

    def loss_and_grad(self, x, target, axis: int = -1, reduction: str = "mean", *, bounds: bool = False,
                      **constraints):
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

        ``constraints``: the loss of the map over a constraint set (:meth:`__call__`), ``Omega`` plus the set's
        indicator; the same terms with ``p`` the constrained map's, the target inside the set.  ``bounds=True``
        returns a third item, the gradients in the set's arrays by keyword
        (:meth:`numeric.constraints.ConstraintSet.loss_gradients`), reduced as the gradient in the scores: the
        box's ``{"upper": mu, "total": tau}``, the multipliers ``[s_i - tau - omega'(u_i)]_+`` of the saturated
        bounds (the scores' shape) and the threshold ``tau`` (the batch shape); the simplex has none (``{}``).

        A map family's loss is its own (:meth:`numeric.families.base.Family.loss`), with the same gradient.
        """
        if self.family is not None:
            self.family.check_set(constraints)
        front.check_reduction(reduction)
        xp = array_module(x, target)
        x, out_dtype = to_compute_dtype(x, xp)
        axis = check_axis(x.shape, axis)
        arrays = front.Arrays(xp)
        cset, values = choose_for(self, constraints)
        own = cset.rows(xp, arrays, x, values, axis)
        y = front.check_target(x, xp.asarray(target), axis, arrays, constraint=(cset, own))  # (NumPy takes array-likes)
        p, tau = self.forward(x, axis=axis, **constraints)
        p = p.astype(x.dtype, copy=False)
        rows = [to_rows(a, axis)[0] for a in (x, p, y)]
        r = None if self.family is not None else self._routines(x.shape, axis, x.dtype, xp)
        ops = ArrayOps(xp, x.dtype)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            value = cset.loss_terms(ops, r, *rows, *own)[..., 0] if r is not None else \
                self.family.loss(ops, *rows, *self._row_values(x.shape, axis, x.dtype, xp))
        value = value.reshape(x.shape[:axis] + x.shape[axis + 1:])
        scale = 1.0 / max(1, value.size) if reduction == "mean" else 1.0
        grad = (p - y) * scale if scale != 1.0 else p - y
        out = (front.reduce(value, reduction).astype(out_dtype), grad.astype(out_dtype))
        if not bounds:
            return out
        with np.errstate(invalid="ignore", divide="ignore"):
            grads = cset.loss_gradients(ops, r, rows[0], tau.reshape(-1, 1), *own, p=rows[1], y=rows[2])
        restore = to_rows(x, axis)[1]
        batch = tau.shape
        return (*out, {name: ((restore(g) if name in cset.per_score else g.reshape(batch)) * scale).astype(out_dtype)
                       for name, g in zip(cset.keywords, grads)})

    def _row_values(self, shape: tuple, axis: int, dtype, xp) -> tuple:
        """The parameters as scalars of ``dtype``, or one value per row of scores of ``shape`` along ``axis``
        (``(rows, 1)``)."""
        if not self.per_row:
            return self.cast_params(dtype)
        table = self._param_rows(shape, axis)
        return tuple(xp.asarray(table[:, i:i + 1], dtype=dtype) for i in range(table.shape[1]))

    def _routines(self, shape: tuple, axis: int, dtype, xp) -> Routines:
        """The module's NumPy routines bound to the parameters (:meth:`_row_values`)."""
        return Routines(self.module, contract.module_routines(self.module), self._row_values(shape, axis, dtype, xp))


def tangent_rows(y, d, axis, word: str):
    """``(backend, xp, y, out_dtype, axis, y rows, d rows, restore)`` for a derivative at ``y = m(x)`` along
    ``d`` (a tangent or cotangent of ``y``'s shape), both in the compute dtype."""
    backend = backend_for(y, d)
    xp = backend.namespace()
    y, out_dtype = to_compute_dtype(y, xp)
    d = xp.asarray(d).astype(y.dtype, copy=False)
    if d.shape != y.shape:
        raise ValueError(f"{word} of shape {d.shape} does not match the output shape {y.shape}")
    axis = check_axis(y.shape, axis)
    fy, restore = to_rows(y, axis)
    return backend, xp, y, out_dtype, axis, fy, to_rows(d, axis)[0], restore


class FrameworkMap:
    """What the torch and JAX maps (:class:`numeric.torch.TorchMap`, :class:`numeric.jax.JaxMap`) share: the
    ``module``, the map ``family`` (``None``: the module's own map), the name, the threshold, and parameters checked
    by :func:`numeric.front.check_param` (a family's: :meth:`numeric.families.base.Family.check`) on the
    framework's :class:`numeric.front.Arrays` (``arrays``)."""

    module: ModuleType
    family: Family | None
    arrays: front.Arrays
    #: as :attr:`Map.keywords` and :attr:`Map.label`
    keywords: dict = {}
    label: str | None = None

    def _bind(self, mapping, threshold: str, params: dict) -> None:
        """Sets ``family``, ``module``, ``threshold`` and ``params`` (those of ``mapping`` if it is a map of this
        class, updated with ``params``; a family's defaults first), checked."""
        self.family = family_of(mapping, type(self))
        if self.family is None:
            module = module_of(mapping, type(self), check=True)
        else:
            module = mapping.module if isinstance(mapping, type(self)) else import_map_module(self.family.inner)
        self.module = module
        self.threshold = front.check_threshold(module, threshold)
        bound = dict(mapping.params) if isinstance(mapping, type(self)) else \
            dict(self.family.parameters) if self.family is not None else {}
        self.params = {**bound, **self._checked(params)}
        same = isinstance(mapping, type(self))
        self.keywords = mapping.keywords if same else bound_keywords(mapping)
        self.label = mapping.label if same else mapping if isinstance(mapping, str) and self.keywords else None

    @property
    def declared(self):
        """What declares the map's parameters: its family, else its module (``PARAMETERS``, ``PARAMETER_DOMAINS``)."""
        return self.module if self.family is None else self.family

    def _checked(self, params: dict) -> dict:
        front.check_names(self.declared, params, complete=False)
        if self.family is not None:
            return {name: self.family.check(name, value, self.arrays) for name, value in params.items()}
        return {name: front.check_param(self.module, name, value, self.arrays) for name, value in params.items()}

    def values(self, params: dict | None = None) -> dict:
        """The bound parameter values updated with ``params`` (checked), all of the map's parameters present."""
        values = {**self.params, **self._checked(params)} if params else self.params
        front.check_names(self.declared, values, complete=True)
        return values

    @property
    def name(self) -> str:
        return self.label or (self.module.NAME if self.family is None else self.family.name)


def import_map_module(name: str) -> ModuleType:
    """The generated module for a built-in or a top-level module name, its header checked before it runs.

    A name that is neither is a :class:`ValueError` naming the closest built-in (by :mod:`difflib`) and listing
    them all (the generated built-ins and the map families of :data:`numeric.families.table.FAMILIES`)."""
    from ._generated import ALIASES, BUILTINS

    name = ALIASES.get(name, name)
    full = f"numeric._generated.{name}" if name in BUILTINS else name

    def unknown():
        builtins = (*BUILTINS, *ALIASES, *(n for n in FAMILIES if n not in BUILTINS))
        closest = difflib.get_close_matches(name, builtins, n=1)
        hint = f" (did you mean {closest[0]!r}?)" if closest else ""
        return f"no map named {name!r}{hint}: built-ins are {', '.join(builtins)}"

    if full is name and not name.isidentifier():
        raise ValueError(f"{unknown()}; any other generated module is found by a plain top-level name "
                         "(pass a module inside a package as the module object)")
    try:
        return trust.import_generated(full)
    except ModuleNotFoundError as exc:
        if exc.name != full:
            raise
        raise ValueError(f"{unknown()}; a generated module must be importable by that name (or pass the module itself)") from None


def with_keywords(m, constraints: dict) -> dict:
    """A call's constraint keywords on the map ``m`` (a front end's map; a plain callable binds none): those its name
    binds (:attr:`Map.keywords`), overridden by the call's."""
    bound = getattr(m, "keywords", None)
    return {**bound, **constraints} if bound else constraints


def unbound(m):
    """``m`` without the keywords its name binds (a shallow copy where it binds some): the map a front end that has
    read a call's keywords (:func:`with_keywords`) runs itself, with the set it chose."""
    if not getattr(m, "keywords", None):
        return m
    plain = copy.copy(m)
    plain.keywords = {}
    return plain


def take_keywords(m, constraints: dict) -> tuple:
    """``(unbound(m), with_keywords(m, constraints))``: what attention and the layers run a map with."""
    return unbound(m), with_keywords(m, constraints)


def choose_for(m, constraints: dict) -> tuple:
    """:func:`numeric.constraints.choose` of :func:`with_keywords`; an error says which keywords the name bound."""
    try:
        return choose(with_keywords(m, constraints))
    except ValueError as exc:
        bound = {k: v for k, v in getattr(m, "keywords", {}).items() if k not in constraints}
        if not bound:
            raise
        given = ", ".join(f"{k}={v!r}" for k, v in bound.items())
        raise ValueError(f"{exc} ({m.name} binds {given}; a call gives its own to leave it: total=1 is the "
                         "simplex)") from None


def bound_keywords(mapping) -> dict:
    """The constraint keywords a map's name binds (``numeric._generated.KEYWORDS``: ``sigmoid`` and ``relu`` have
    no sum, ``total=None``), which a call's own keywords override; ``{}`` for other names and for modules."""
    from ._generated import KEYWORDS

    return dict(KEYWORDS.get(mapping, {})) if isinstance(mapping, str) else {}


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
    """The :class:`Map` for a built-in name, an importable generated module's name, or the module itself; or for
    a map family (:data:`numeric.families.table.FAMILIES`), by name or as the family.

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
        if not params and threshold == "auto":
            return name
        m = Map(name.module if name.family is None else name.family, threshold, **{**name.params, **params})
        m.keywords, m.label = name.keywords, name.label
        return m
    fam = family_of(name, Map)
    if fam is not None:
        return Map(fam, threshold, **params)
    m = Map(module_of(name, Map), threshold, **params)
    m.keywords = bound_keywords(name)
    m.label = name if isinstance(name, str) and m.keywords else None
    return m


def softmax(x, axis: int = -1, **constraints):
    """Softmax ``p_i = exp(s_i) / sum_j exp(s_j)``: the map of Shannon's ``p log p``."""
    return get_map("softmax")(x, axis=axis, **constraints)


def sparsemax(x, axis: int = -1, **constraints):
    """Sparsemax ``p = [s - tau]_+``: the map of ``p**2 / 2`` (Euclidean projection on the simplex).

    ``upper``, ``total``: the projection on the box ``0 <= p <= upper``, ``sum p = total`` instead
    (:meth:`Map.__call__`); ``sparsemax(x, upper=1, total=k)`` is budget (k-subset) sparsemax."""
    return get_map("sparsemax")(x, axis=axis, **constraints)


def entmax15(x, axis: int = -1, **constraints):
    """1.5-entmax ``p = [s/2 - tau]_+**2``: the map of Tsallis alpha = 3/2."""
    return get_map("entmax15")(x, axis=axis, **constraints)


def entmax(x, alpha: float, axis: int = -1, **constraints):
    """alpha-entmax ``p = [(alpha - 1) s - tau]_+**(1/(alpha - 1))`` for any alpha > 0 (Tsallis): sparse for
    alpha > 1, softmax at 1, dense with heavy tails below 1 (the family ``entmax``, :mod:`numeric.family`).
    ``alpha``: a number or an array broadcasting to ``x`` with size 1 along ``axis`` (values on either side of 1
    at once)."""
    return get_map("entmax", alpha=alpha)(x, axis=axis, **constraints)


#: The map families' functions, ``NAME(x, *values, axis=-1)`` (:func:`numeric.families.table.functions`), which
#: ``numeric`` exports beside the named maps above.
FAMILY_FUNCTIONS = functions(get_map, "axis", "numeric")
