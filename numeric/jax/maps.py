"""Attention maps ``p*(s) = argmax_{p in simplex} <p, s> - Omega(p)`` and their Fenchel-Young loss on JAX arrays.

A :class:`JaxMap` wraps a generated map module (a built-in name, the name of
an importable module ``regattn generate`` wrote, or the module itself, checked
as :func:`numeric.get_map` checks it) and solves it with the rules of
:mod:`numeric.core` on the module's NumPy routines run on JAX arrays
(:func:`numeric.contract.routines_on` with ``jax.numpy``) through
:class:`~numeric.jax._ops.JaxOps` (loops are ``lax.while_loop``, so a map
traces under ``jax.jit`` and ``jax.vmap``).  Each call is a
:func:`jax.custom_jvp` function whose JVP is the derived one: for a tangent
``dx`` of the scores and ``dq`` of a parameter ``q`` (``alpha``),

    dp = J (dx - c dq),   J v = w*v - w (w.v) / sum(w),

with ``w = weight(p)`` and ``c = omega_prime_d_q(p)`` on the support.  The
rule is linear in the tangents, so reverse mode (``jax.grad``, ``jax.vjp``)
transposes it, and it is written in JAX operations of the output ``p`` (itself
this function), so it can be differentiated again: grad of grad, Hessians.

Conventions are :class:`numeric.Map`'s: scores of ``-inf`` are masked
(probability exactly 0), a fully masked row gives zeros and zero gradients,
a NaN score makes its row NaN.  float16 and bfloat16 compute in float32 and
return their dtype.  Parameters are Python numbers or arrays broadcasting to
the scores with size 1 along ``axis`` (one value per row, e.g. per head,
shape ``(N, 1, 1)`` for ``(B, N, T, S)`` scores); a concrete value is
checked against the parameter's domain (a traced one, under ``jit`` or
``grad``, cannot be).  With float32 scores and 64-bit JAX enabled the
parameter derivative ``c`` is evaluated in float64 (the printed
``d omega'/d alpha`` cancels near ``alpha = 1`` in float32, as in
:meth:`numeric.Map.vjp_params`).

**Box constraints.**  ``upper=`` and ``total=`` (keywords of every map and of
the loss) replace the simplex by the box ``0 <= p <= upper``, ``sum p = total``:
``p_i = min(u_i, g_+(s_i - tau))`` (:func:`numeric.constraints.box.box_solve`,
:meth:`numeric.Map.__call__`), with the JVP of
:func:`numeric.constraints.box.box_jvp`: on the free entries ``0 < p_i < u_i``
``dp_i = w_i (dx_i - c_i dq - dtau)``, on the saturated ones ``dp_j = du_j``,
``dtau`` keeping ``sum p = total``; gradients flow to bound and total arrays.
Bounds that cannot hold a row's total (those of its unmasked scores summing to
less) are refused where the values can be read, and give a NaN row where they
are traced.

:func:`fenchel_young_loss` is :meth:`numeric.Map.loss_and_grad`'s loss with
the gradient ``p*(s) - y`` in the scores and the envelope theorem's in the
parameters (with the box: ``mu = [s - tau - omega'(u)]_+`` in the bounds and
``tau`` in the total).

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.array([[-2.0, 0.0, 0.5]])
    >>> entmax(x, 1.5).round(6)  # (float32: Newton's last step leaves the last digit to rounding)
    Array([[0.      , 0.326007, 0.673993]], dtype=float32)
    >>> round(float(jax.grad(lambda a: entmax(x, a)[0, 2])(1.5)), 6)
    0.123886
"""

from __future__ import annotations

import math  # noqa: F401 (the doctests use it)
from functools import lru_cache, partial
from types import ModuleType

import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np
from jax.custom_derivatives import SymbolicZero

from .. import contract, family, front
from ..constraints import SIMPLEX, split
from ..core import derivatives, rules
from ..core.ops import Routines
from ..families import functions
from ..maps import FrameworkMap, choose_for
from ._ops import ops_for

__all__ = ["JaxMap", "get_map", "softmax", "sparsemax", "entmax15", "entmax", "fenchel_young_loss", "FAMILY_FUNCTIONS"]

_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


@lru_cache(maxsize=None)
def routine_table(module: ModuleType) -> dict:
    """The module's routines on JAX arrays (bound once per module)."""
    return contract.routines_on(module, jnp, erf=jax.scipy.special.erf)


def _concrete(a) -> bool:
    """Whether the array's values can be read (not a tracer of jit, grad or vmap)."""
    return not isinstance(a, jax.core.Tracer)


class _JaxArrays(front.Arrays):
    """:class:`numeric.front.Arrays` of JAX arrays: a parameter array is kept (traced or not); a traced value cannot
    be read, and is not checked."""

    def __init__(self):
        super().__init__(jnp)

    def kind(self, a) -> str:
        dtype = jnp.dtype(a.dtype)
        return "f" if jnp.issubdtype(dtype, jnp.floating) else dtype.kind

    def readable(self, a):
        # (read as a NumPy array: inside a trace jnp operations on a concrete array closed over are staged out too)
        return np.asarray(a, dtype=np.float64) if _concrete(a) else None

    def keep(self, a):
        a = jnp.asarray(a)
        return a if jnp.issubdtype(a.dtype, jnp.floating) else a.astype(jnp.result_type(float))

    def eps(self, dtype) -> float:
        return float(jnp.finfo(dtype).eps)

    def one_hot(self, labels, n: int, like):
        return jax.nn.one_hot(labels, n, dtype=like.dtype)


#: JAX's :class:`numeric.front.Arrays`
ARRAYS = _JaxArrays()


def as_scores(x, what: str = "scores"):
    """``x`` as a floating JAX array (NumPy arrays and nested lists are taken; integers are refused)."""
    if not (hasattr(x, "dtype") or isinstance(x, (list, tuple, float, int))):
        raise TypeError(f"{what} must be an array, got {type(x).__name__}")
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{what} must be a floating array, got dtype {x.dtype}")
    return x


def compute_dtype(dtype):
    return jnp.dtype(jnp.float32) if jnp.dtype(dtype) in _HALF else jnp.dtype(dtype)


class _Solver(front.Solver):
    """A module's constants and JAX routines for one threshold rule (static under jit: hashed by identity)."""

    def __init__(self, module: ModuleType, threshold: str):
        super().__init__(module, threshold, routine_table(module), ops_for)

    def forward(self, x, params):
        """``p`` for the rows of the 2-D ``x``."""
        p, _ = rules.solve(ops_for(x.dtype), self.routines(params), x, method=self.method)
        return p

    def direction(self, p, params, name):
        """``c = omega_prime_d_name(p)`` on the support, 0 elsewhere (in float64 for float32 ``p`` where JAX has it)."""
        wide = p.dtype == jnp.float32 and jax.config.jax_enable_x64
        pw = p.astype(jnp.float64) if wide else p
        qs = tuple(q.astype(pw.dtype) for q in params)
        pos = ops_for(pw.dtype).support(pw)
        c = getattr(self.routines(qs), f"omega_prime_d_{name}")(pw + (1 - pos)) * pos
        return c.astype(p.dtype)


@lru_cache(maxsize=None)
def _solver(module: ModuleType, threshold: str) -> _Solver:
    return _Solver(module, threshold)


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def map_rows(solver: _Solver, x, params: tuple):
    """``p = m(x)`` on rows ``x`` (2-D), parameters of shape ``(rows, 1)`` or ``()``."""
    return solver.forward(x, params)


@map_rows.defjvp
def _map_rows_jvp(solver, primals, tangents):
    x, params = primals
    dx, dparams = tangents
    p = map_rows(solver, x, params)
    v = dx
    for name, dq in zip(solver.names, dparams):
        v = v - solver.direction(p, params, name) * dq  # dp/dq = -J c
    return p, derivatives.jvp(ops_for(p.dtype), solver.routines(params), p, v)


# eager calls run compiled (one compilation per solver, shapes and dtypes); inside a traced function they inline
_map_rows_jit = jax.jit(map_rows, static_argnums=0)


def _zero(t) -> bool:
    """Whether a tangent is a symbolic zero (an input not differentiated: :func:`jax.custom_jvp`'s ``symbolic_zeros``)."""
    return isinstance(t, SymbolicZero)


@partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _constrained_rows(solver: _Solver, cset, x, arrays: tuple, params: tuple):
    """``(p, tau)`` over the constraint set ``cset`` on rows ``x`` (2-D), its ``arrays`` laid out as rows (``(rows,
    n)`` or ``(rows, 1)``), ``tau`` of shape ``(rows, 1)``, parameters of shape ``(rows, 1)`` or ``()``."""
    return solver.constrained(cset, x, arrays, params)


@partial(_constrained_rows.defjvp, symbolic_zeros=True)
def _constrained_rows_jvp(solver, cset, primals, tangents):
    """``dp`` of :meth:`numeric.constraints.ConstraintSet.jvp`, with ``v = dx - sum_q c_q dq`` for the scores'
    tangent; and ``dtau``: on an entry that moves, ``omega'(p_i) = s_i - tau``, so ``tau = sum_i a_i (s_i -
    omega'(p_i))`` for any weights ``a`` summing to 1 over those entries (held constant), here ``a = w / sum w``,
    whose tangent ``sum_i a_i (v_i - omega''(p_i) dp_i)`` is the ``dtau`` that keeps the set's sums.  (Symbolic
    zeros: the set's arrays of a call that does not differentiate them cost nothing.)"""
    x, arrays, params = primals
    dx, darrays, dparams = tangents
    p, tau = _constrained_rows(solver, cset, x, arrays, params)
    ops, r = ops_for(p.dtype), solver.routines(params)
    v = 0 if _zero(dx) else dx
    darrays = [0 if _zero(d) else d for d in darrays]
    for name, dq in zip(solver.names, dparams):
        if not _zero(dq):
            v = v - solver.direction(p, params, name) * dq  # dp/dq = -J c, as the plain map's
            for i, c in enumerate(cset.param_directions(ops, r, p, name, *arrays, x=x)):
                darrays[i] = darrays[i] - c * dq  # (and through the set's arrays that the parameter moves)
    still = all(isinstance(d, int) for d in darrays)
    dp = cset.jvp(ops, r, p, v, tuple(darrays), *arrays, x=None if still and not cset.jacobian_scores else x)
    free, a = derivatives.threshold_weights(ops, r, cset, p, *arrays)
    a = jax.lax.stop_gradient(a)
    _, curve = jax.jvp(lambda q: r.omega_prime(jnp.where(free, q, 1)), (p,), (dp,))  # omega''(p) dp
    return (p, tau), (dp, ops.row_sum(jnp.where(free, a * (v - curve), 0)))


def _constrained_map(solver, cset, x, arrays, params):
    return _constrained_rows(solver, cset, x, arrays, params)[0]


_constrained_map_jit = jax.jit(_constrained_map, static_argnums=(0, 1))


def _inner_rows(solver, fam, x, values):
    """The inner map's ``r`` of a map family at the scaled rows ``x`` (:meth:`numeric.families.base.Family.scale`)."""
    inner = fam.inner_params(*values)
    return map_rows(solver, x * fam.scale(*values), tuple(inner[n] for n in solver.names))


@partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _family_rows(solver: _Solver, fam, x, values: tuple):
    """A map family's ``p`` on rows ``x`` (2-D), its parameters of shape ``()`` or ``(rows, 1)``; ``solver``: its
    inner map's.  The JVP is the family's product from ``p`` (:meth:`numeric.families.base.Family.vjp`, symmetric:
    reverse mode transposes it); a tangent of the parameters raises (no gradient in them)."""
    return fam.output(ops_for(x.dtype), _inner_rows(solver, fam, x, values), *values)


@partial(_family_rows.defjvp, symbolic_zeros=True)
def _family_rows_jvp(solver, fam, primals, tangents):
    x, values = primals
    dx, dvalues = tangents
    if not all(_zero(d) for d in dvalues):
        raise ValueError(fam.no_gradient)
    p = _family_rows(solver, fam, x, values)
    return p, jnp.zeros_like(p) if _zero(dx) else fam.vjp(ops_for(p.dtype), p, dx, *values)


_family_rows_jit = jax.jit(_family_rows, static_argnums=(0, 1))


@partial(jax.tree_util.register_pytree_node_class)
class JaxMap(FrameworkMap):
    """A regularized-argmax map on JAX arrays, from a generated module, with bound parameter values.

    ``mapping``: a built-in name (``"softmax"``, ``"sparsemax"``, ``"entmax15"``,
    ``"entmax"``), the name of an importable generated module, the module itself, or a
    :class:`JaxMap`.  ``threshold``: ``"auto"`` (the module's rule), ``"sort"`` (a sort
    map's rule on fully sorted rows) or ``"root"`` (the root rule, for any map).
    ``params``: values of the module's parameters, numbers or arrays (traced ones
    too: a map built inside a differentiated function passes gradients to them);
    those not bound here are given at the call.  A JaxMap is a pytree (its
    parameter values are the leaves), so it can be an argument of a jitted function.

    >>> import jax.numpy as jnp
    >>> m = JaxMap("entmax", alpha=1.5)
    >>> m(jnp.array([[-2.0, 0.0, 0.5]])).round(6)
    Array([[0.      , 0.326007, 0.673993]], dtype=float32)
    >>> m(jnp.array([-2.0, 0.0, 0.5]), alpha=2.0)
    Array([0.  , 0.25, 0.75], dtype=float32)
    """

    arrays = ARRAYS

    def __init__(self, mapping, *, threshold: str = "auto", **params):
        self._bind(mapping, threshold, params)

    # pytree: the parameter values are the children
    def tree_flatten(self):
        names = tuple(self.params)
        return tuple(self.params[n] for n in names), (self.module, self.threshold, names, self.family)

    @classmethod
    def tree_unflatten(cls, aux, children):
        m = object.__new__(cls)
        m.module, m.threshold, names, m.family = aux
        m.params = dict(zip(names, children))
        return m

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" if isinstance(v, float) else f", {k}=<array {tuple(jnp.shape(v))}>"
                        for k, v in self.params.items())
        return f"JaxMap({self.name!r}, threshold={self.threshold!r}{extra})"

    def param_rows(self, name, value, shape: tuple, axis: int, dtype):
        """A parameter as an array of ``dtype``: shape ``()`` for a single value, else ``(rows, 1)`` in the rows' order."""
        if isinstance(value, float):
            return jnp.asarray(value, dtype)
        return front.param_rows(jnp, name, jnp.asarray(value).astype(dtype), shape, axis)

    def solver_for(self, values: dict) -> _Solver:
        """The solver for these parameter values: a family's case's where they all lie in one open case (values a
        trace cannot read take the family's)."""
        return _solver(family.resolve(self.module, values, ARRAYS.readable), self.threshold)

    def _family_solver(self, values: dict) -> _Solver:
        """A map family's inner solver for its parameters' ``values`` (:meth:`solver_for` of the inner map's)."""
        given = (v if isinstance(v, float) else jnp.asarray(v) for v in (values[n] for n in self.family.parameters))
        return self.solver_for(self.family.inner_params(*given))

    def __call__(self, x, axis: int = -1, **kwargs):
        """``p*(x)`` along ``axis``: same shape and dtype as ``x``.

        ``kwargs``: values of the map's parameters, and the keywords of a constraint set other than the simplex
        (:mod:`numeric.constraints`), differentiable in its arrays (traced or not).  The box: ``upper`` (a number or
        an array broadcasting to ``x``, ``>= 0``; ``None``: no bound) and ``total`` (a number or an array
        broadcasting to ``x`` with size 1 along ``axis``, finite), the map over ``0 <= p <= upper``, ``sum p =
        total`` (:meth:`numeric.Map.__call__`; laid out and checked by :func:`numeric.constraints.box.box_rows`).
        Bounds whose unmasked entries sum below a row's total are refused where the values can be read; traced
        (under ``jit``, ``grad``, ``vmap``), such a row comes out NaN.

        >>> import jax.numpy as jnp
        >>> JaxMap("sparsemax")(jnp.array([3.0, 2.9, 0.1, 0.0]), upper=1.0, total=2.0)
        Array([1., 1., 0., 0.], dtype=float32)
        """
        constraints, params = split(kwargs)
        if self.family is not None:
            self.family.check_set(constraints)
        cset, own = choose_for(self, constraints)
        x = as_scores(x)
        axis = front.check_axis(x.shape, axis)
        values = self.values(params)
        dtype = compute_dtype(x.dtype)
        xc = x.astype(dtype)
        moved = jnp.moveaxis(xc, axis, -1)
        flat = moved.reshape(-1, x.shape[axis])
        tensors = tuple(self.param_rows(n, values[n], tuple(x.shape), axis, dtype) for n in self.declared.PARAMETERS)
        if self.family is not None:
            p = _family_rows_jit(self._family_solver(values), self.family, flat, tensors)
        elif cset is not SIMPLEX and cset.appends is not None:  # (the plain map on the longer rows)
            arrays = cset.rows(jnp, ARRAYS, xc, own, axis)
            ext = jnp.concatenate([flat, cset.appended(arrays)], axis=-1)
            p = _map_rows_jit(self.solver_for(values), ext, tensors)[:, :flat.shape[-1]]
        elif cset is not SIMPLEX:
            arrays = cset.rows(jnp, ARRAYS, xc, own, axis)
            p = _constrained_map_jit(self.solver_for(values), cset, flat, arrays, tensors)
        else:
            p = _map_rows_jit(self.solver_for(values), flat, tensors)
        return jnp.moveaxis(p.reshape(moved.shape), -1, axis).astype(x.dtype)


def get_map(mapping, *, threshold: str = "auto", **params) -> JaxMap:
    """The :class:`JaxMap` for a name, a generated module or a :class:`JaxMap` (rebound with ``params``).

    >>> import jax.numpy as jnp
    >>> get_map("sparsemax")(jnp.array([-2.0, 0.0, 0.5]))
    Array([0.  , 0.25, 0.75], dtype=float32)
    """
    if isinstance(mapping, JaxMap) and not params and threshold == "auto":
        return mapping
    if isinstance(mapping, JaxMap) and threshold == "auto":
        threshold = mapping.threshold
    return JaxMap(mapping, threshold=threshold, **params)


_BUILTIN: dict = {}


def _builtin(name: str) -> JaxMap:
    m = _BUILTIN.get(name)
    if m is None:
        m = _BUILTIN[name] = JaxMap(name)
    return m


def softmax(x, axis: int = -1, **constraints):
    """Softmax ``p_i = exp(s_i) / sum_j exp(s_j)``: the map of ``p log p``.

    ``upper``, ``total``: over the box ``0 <= p <= upper``, ``sum p = total`` instead (:meth:`JaxMap.__call__`):
    constrained softmax, ``p_i = min(u_i, exp(s_i - tau))``.

    >>> import jax.numpy as jnp
    >>> softmax(jnp.array([0.0, 0.0, math.log(2.0)]))
    Array([0.25, 0.25, 0.5 ], dtype=float32)
    >>> softmax(jnp.array([0.0, 0.0, math.log(2.0)]), upper=0.4)
    Array([0.3, 0.3, 0.4], dtype=float32)
    """
    return _builtin("softmax")(x, axis=axis, **constraints)


def sparsemax(x, axis: int = -1, **constraints):
    """Sparsemax ``p = [s - tau]_+``: the map of ``p**2 / 2``.

    ``upper``, ``total``: the projection on the box ``0 <= p <= upper``, ``sum p = total`` instead
    (:meth:`JaxMap.__call__`); ``sparsemax(x, upper=1, total=k)`` is budget (k-subset) sparsemax.

    >>> import jax.numpy as jnp
    >>> sparsemax(jnp.array([[1.0, 0.5, -1.0]]), axis=1)
    Array([[0.75, 0.25, 0.  ]], dtype=float32)
    """
    return _builtin("sparsemax")(x, axis=axis, **constraints)


def entmax15(x, axis: int = -1, **constraints):
    """1.5-entmax ``p = [s/2 - tau]_+**2``: Tsallis alpha = 3/2 (``upper``, ``total``: over the box,
    :meth:`JaxMap.__call__`).

    >>> import jax.numpy as jnp
    >>> entmax15(jnp.array([-2.0, 0.0, 0.5]))
    Array([0.        , 0.32600737, 0.67399263], dtype=float32)
    """
    return _builtin("entmax15")(x, axis=axis, **constraints)


def entmax(x, alpha, axis: int = -1, **constraints):
    """alpha-entmax ``p = [(alpha - 1) s - tau]_+**(1/(alpha - 1))`` for any alpha > 0 (sparse above 1, softmax
    at 1, dense below): a number or an array broadcasting to ``x`` with size 1 along ``axis`` (differentiable; the
    map and its gradient in alpha are continuous through 1).  ``upper``, ``total``: over the box ``0 <= p <=
    upper``, ``sum p = total`` instead (:meth:`JaxMap.__call__`), at any alpha, per row too.

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.array([[-2.0, 0.0, 0.5], [-2.0, 0.0, 0.5]])
    >>> entmax(x, jnp.array([[1.5], [2.0]])).round(6)
    Array([[0.      , 0.326007, 0.673993],
           [0.      , 0.25    , 0.75    ]], dtype=float32)
    >>> jax.grad(lambda a: entmax(x, a)[:, 2].sum())(jnp.array([[1.5], [2.0]])).shape
    (2, 1)
    """
    return _builtin("entmax")(x, axis=axis, alpha=alpha, **constraints)


# ------------------------------------------------------------------ the loss
def _omega_terms(module, x, p, y, params, cset=SIMPLEX, arrays: tuple = ()):
    """Per row ``sum_i [omega(y_i) - omega(p_i)] - (y_i - p_i) s_i`` over the constraint set ``cset``
    (:meth:`numeric.constraints.ConstraintSet.loss_terms`, its ``arrays`` laid out as rows), rows 2-D."""
    r = Routines(module, routine_table(module), params)
    return cset.loss_terms(ops_for(x.dtype), r, x, p, y, *arrays)[..., 0]


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _loss_rows(solver: _Solver, x, y, params: tuple):
    """The Fenchel-Young loss of each row of ``x`` (2-D) against the distributions ``y``."""
    return _omega_terms(solver.module, x, map_rows(solver, x, params), y, params)


@_loss_rows.defjvp
def _loss_rows_jvp(solver, primals, tangents):
    x, y, params = primals
    dx, _, dparams = tangents  # (the target is a constant: its tangent is not used)
    p = map_rows(solver, x, params)
    if params:  # the envelope theorem: d/dq at the optimum p, held fixed
        value, dvalue = jax.jvp(lambda *q: _omega_terms(solver.module, x, p, y, q), params, tuple(dparams))
    else:
        value, dvalue = _omega_terms(solver.module, x, p, y, params), 0
    return value, dvalue + jnp.sum((p - y) * dx, axis=-1)


_loss_rows_jit = jax.jit(_loss_rows, static_argnums=0)


@partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _constrained_loss_rows(solver: _Solver, cset, x, y, arrays: tuple, params: tuple):
    """The Fenchel-Young loss of each row of ``x`` (2-D) against ``y`` over the constraint set ``cset``
    (:func:`_constrained_rows`' layout): the set's loss terms at the constrained map's ``p``."""
    return _omega_terms(solver.module, x, solver.constrained(cset, x, arrays, params)[0], y, params, cset, arrays)


@partial(_constrained_loss_rows.defjvp, symbolic_zeros=True)
def _constrained_loss_rows_jvp(solver, cset, primals, tangents):
    """``(p - y).dx + sum_a g_a.da`` and the parameters' envelope term, with ``p`` and ``tau`` of
    :func:`_constrained_rows` (differentiable again) and ``g_a`` the set's loss gradients
    (:meth:`numeric.constraints.ConstraintSet.loss_gradients`; the box: ``mu = [s - tau - omega'(u)]_+`` in the
    bounds, ``tau`` in the total); an argument not differentiated adds nothing."""
    x, y, arrays, params = primals
    dx, _, darrays, dparams = tangents  # (the target is a constant: its tangent is not used)
    p, tau = _constrained_rows(solver, cset, x, arrays, params)
    if params and not all(_zero(dq) for dq in dparams):  # the envelope theorem: d/dq at the optimum p, held fixed
        dq = tuple(jnp.zeros_like(q) if _zero(d) else d for q, d in zip(params, dparams))
        value, dvalue = jax.jvp(lambda *q: _omega_terms(solver.module, x, p, y, q, cset, arrays), params, dq)
    else:
        value = _omega_terms(solver.module, x, p, y, params, cset, arrays)
        dvalue = jnp.zeros_like(value)
    if not _zero(dx):
        dvalue = dvalue + jnp.sum((p - y) * dx, axis=-1)
    if not all(_zero(d) for d in darrays):
        grads = cset.loss_gradients(ops_for(x.dtype), solver.routines(params), x, tau, *arrays, p=p, y=y)
        for g, d in zip(grads, darrays):
            if not _zero(d):
                dvalue = dvalue + jnp.sum(g * d, axis=-1)
    return value, dvalue


_constrained_loss_rows_jit = jax.jit(_constrained_loss_rows, static_argnums=(0, 1))


@partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _family_loss_rows(solver: _Solver, fam, x, y, values: tuple):
    """A map family's Fenchel-Young loss of each row of ``x`` (2-D) against ``y`` (:func:`_family_rows`' layout,
    :meth:`numeric.families.base.Family.loss`); its JVP ``(p - y).dx``, a tangent of the parameters raises."""
    return fam.loss(ops_for(x.dtype), x, _family_rows(solver, fam, x, values), y, *values)[..., 0]


@partial(_family_loss_rows.defjvp, symbolic_zeros=True)
def _family_loss_rows_jvp(solver, fam, primals, tangents):
    x, y, values = primals
    dx, _, dvalues = tangents  # (the target is a constant)
    if not all(_zero(d) for d in dvalues):
        raise ValueError(fam.no_gradient)
    p = _family_rows(solver, fam, x, values)
    value = fam.loss(ops_for(x.dtype), x, p, y, *values)[..., 0]
    return value, jnp.zeros_like(value) if _zero(dx) else jnp.sum((p - y) * dx, axis=-1)


_family_loss_rows_jit = jax.jit(_family_loss_rows, static_argnums=(0, 1))


def fenchel_young_loss(scores, target, mapping="softmax", reduction: str = "mean", axis: int = -1, **constraints):
    """The Fenchel-Young loss ``Omega*(s) + Omega(y) - <s, y>`` of ``mapping`` (a name, a generated module or a
    :class:`JaxMap` with its parameters bound, traced or not).

    ``target``: integer labels (the batch shape: ``scores`` without ``axis``) or
    distributions like ``scores`` (a constant: no gradient flows into it).
    ``reduction``: ``"none"`` (one value per row, batch shape), ``"sum"`` or ``"mean"``
    (over rows).  The conventions are :meth:`numeric.Map.loss_and_grad`'s.  Gradients:
    ``p*(s) - y`` for the scores (so the Hessian is the map's Jacobian), and for a map
    parameter ``q`` the envelope theorem's ``sum_i d omega(y_i)/dq - d omega(p_i)/dq`` at
    fixed ``p``.

    ``constraints``: the loss of the map over a constraint set (:meth:`JaxMap.__call__`), ``Omega`` plus the
    set's indicator (:meth:`numeric.Map.loss_and_grad`).  The box, ``upper=``, ``total=``: the same terms at the
    bounded ``p``, the target inside the box (each row summing to its total, no entry above its bound, checked
    where the values can be read).  Its gradients: ``p - y`` in the scores, ``mu = [s - tau - omega'(u)]_+`` in
    the bounds (non-zero on the saturated ones; ``+inf`` where ``u_i = 0`` and ``omega'(0+) = -inf``), the
    threshold ``tau`` in the total, the envelope theorem's in the parameters.

    >>> import jax, jax.numpy as jnp
    >>> s = jnp.array([[1.0, 0.5, -1.0]])
    >>> fenchel_young_loss(s, jnp.array([0]), "sparsemax")
    Array(0.0625, dtype=float32)
    >>> jax.grad(fenchel_young_loss)(s, jnp.array([0]), "sparsemax")
    Array([[-0.25,  0.25,  0.  ]], dtype=float32)
    """
    front.check_reduction(reduction)
    m = get_map(mapping)
    x = as_scores(scores)
    axis = front.check_axis(x.shape, axis)
    m.values()
    dtype = compute_dtype(x.dtype)
    xc = x.astype(dtype)
    if m.family is not None:
        m.family.check_set(constraints)
    cset, own = choose_for(m, constraints)
    arrays = cset.rows(jnp, ARRAYS, xc, own, axis)
    y = jax.lax.stop_gradient(front.check_target(xc, jnp.asarray(target) if isinstance(target, (list, tuple)) else target,
                                                 axis, ARRAYS, constraint=(cset, arrays)))
    n = x.shape[axis]
    rows = lambda a: jnp.moveaxis(a, axis, -1).reshape(-1, n)  # noqa: E731
    params = tuple(m.param_rows(name, m.params[name], tuple(x.shape), axis, dtype) for name in m.declared.PARAMETERS)
    if m.family is not None:  # (a map family's own loss)
        value = _family_loss_rows_jit(m._family_solver(m.params), m.family, rows(xc), rows(y), params)
    elif cset is SIMPLEX:
        value = _loss_rows_jit(m.solver_for(m.params), rows(xc), rows(y), params)
    else:
        value = _constrained_loss_rows_jit(m.solver_for(m.params), cset, rows(xc), rows(y), arrays, params)
    return front.reduce(value.reshape(x.shape[:axis] + x.shape[axis + 1:]), reduction).astype(x.dtype)


#: The map families' functions, ``NAME(x, *values, axis=-1)`` (:func:`numeric.families.table.functions`), which
#: ``numeric.jax`` exports beside the named maps above.
FAMILY_FUNCTIONS = functions(get_map, "axis", "numeric.jax")
