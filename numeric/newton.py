"""The inversion of a link with no closed form, written once for every target.

A map whose link ``g = (omega')^-1`` has no printable closed form evaluates
``p = g(z)`` by :func:`invert_link`: Newton's method on ``u = log p`` for
``omega'(e^u) = z`` inside a bracket that shrinks at every step, bisecting
whenever a Newton step would leave the bracket or fails to halve the step
before last (the safeguard of Numerical Recipes' ``rtsafe``), then two
Newton steps in ``p`` itself, since ``u`` carries an absolute error of
``eps |u|`` and ``p`` must be relatively exact.

The algorithm is written against a handful of operations (:class:`Ops`), in a
predicated form: every update is a ``where``, and a loop runs while any entry
is still going.  One text therefore serves three targets:

* :class:`NumpyOps` runs it on arrays, all entries at once (the NumPy map);
* ``derive.reference`` runs it on ``mpmath`` numbers at working precision
  (the reference), through :class:`ScalarOps`;
* ``derive.codegen.cuda`` runs it on a tracer whose values are C expressions
  and prints the ``NAME_link`` device function from the trace.

A new target (torch, JAX, Triton) implements the operations.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .numpy.rows import scalar, select

__all__ = ["invert_link", "safeguarded_point", "Ops", "NumpyOps", "ScalarOps", "numpy_invert_link", "WIDEN_STEPS",
           "NEWTON_STEPS", "POLISH_STEPS"]

WIDEN_STEPS = 64  # unit moves of the bracket's upper end past u = 0 (p = 1)
NEWTON_STEPS = 200  # iterations of the bracketed Newton solve in a floating-point format
POLISH_STEPS = 2  # Newton steps in p after the solve in log p


class Ops:
    """The operations :func:`invert_link` is written in, and the number format's constants.

    Values support ``+ - * /``, unary ``-``, ``abs``, comparisons and ``&`` on
    the booleans comparisons give.  A target provides:

    * ``log_tiny``: the lower end of the bracket of ``u = log p`` (below it,
      ``p`` counts as 0); ``eps``: the format's relative resolution;
      ``newton_steps``: the iteration budget of the bracketed solve;
    * ``full(like, value)``, ``exp(x)``, ``where(cond, a, b)``, ``not_(b)``;
    * ``repeat(n, body, state, going)``: while an entry of ``going`` is true and
      fewer than ``n`` rounds have run, ``state, going = body(state)``; returns
      ``state``.
    """

    log_tiny: Any
    eps: Any
    newton_steps: int = NEWTON_STEPS

    def full(self, like, value):  # pragma: no cover - interface
        raise NotImplementedError

    def exp(self, x):  # pragma: no cover - interface
        raise NotImplementedError

    def where(self, cond, a, b):  # pragma: no cover - interface
        raise NotImplementedError

    def not_(self, b):  # pragma: no cover - interface
        raise NotImplementedError

    def repeat(self, n: int, body: Callable, state: tuple, going) -> tuple:  # pragma: no cover - interface
        raise NotImplementedError


def safeguarded_point(ops: Ops, x, lo, hi, step_old, newton, usable, free=False):
    """The next point of a bracketed Newton solve (the safeguard of Numerical Recipes' ``rtsafe``): ``(x_new, took)``.

    ``x`` is the current point, ``[lo, hi]`` the bracket (already moved to ``x``) and ``step_old`` the step
    before last.  The Newton point ``newton`` is taken (``took``) where ``usable``, it lies in the bracket (an
    end included: where the step rounds to 0 it is ``x`` itself, the root to rounding) and, unless ``free``,
    it moves less than half as far as ``step_old``; elsewhere the bracket's midpoint.  The halving rule is
    what stops Newton cycling across a kink (each step landing on the bracket's other end).

    Written once for every bracketed solve of the package: :func:`invert_link`, the KKT and Halley solves of
    :mod:`numeric.core` (traced with them into the CUDA row kernels, ``derive.codegen.trace_rows``),
    and, traced by ``derive.codegen.trace``, the fused Triton attention's threshold loops (``safeguarded_point``).
    """
    take = usable & (newton >= lo) & (newton <= hi) & (free | (abs(newton - x) < 0.5 * abs(step_old)))
    return ops.where(take, newton, lo + 0.5 * (hi - lo)), take


def invert_link(ops: Ops, z, omega_prime: Callable, omega_second: Callable):
    """``p = g(z)`` solving ``omega'(p) = z``, with ``omega'`` increasing on ``(0, inf)``.

    ``p`` is 0 where ``omega'`` at the format's smallest positive ``e^log_tiny``
    already reaches ``z``; the bracket's upper end moves out from ``u = 0``
    while ``omega'(e^u) < z`` (at most :data:`WIDEN_STEPS` times), and not past ``u = 0`` where omega's domain
    ends at 1 (``omega'(1) = +oo``); the polishing Newton steps in ``p`` stay inside that bracket.
    """
    lo = ops.full(z, ops.log_tiny)
    hi = ops.full(z, 0)
    underflow = omega_prime(ops.exp(lo)) >= z

    def widen(state):
        lo, hi = state
        short = omega_prime(ops.exp(hi)) < z
        return (ops.where(short, hi, lo), ops.where(short, hi + 1, hi)), short

    lo, hi = ops.repeat(WIDEN_STEPS, widen, (lo, hi), ops.full(z, True))

    def newton(state):
        u, lo, hi, step, step_old, active = state
        q = ops.exp(u)
        f = omega_prime(q) - z
        active = active & (f != 0)  # an exact root stays where it is
        hi = ops.where(active & (f > 0), u, hi)
        lo = ops.where(active & (f < 0), u, lo)
        df = omega_second(q) * q  # d omega'(e^u) / du
        rising = df > 0
        nxt, _ = safeguarded_point(ops, u, lo, hi, step_old, u - f / ops.where(rising, df, 1), rising)
        new_step = nxt - u
        step_old = ops.where(active, step, step_old)
        step = ops.where(active, new_step, step)
        u = ops.where(active, u + step, u)
        active = active & (abs(step) > 4 * ops.eps * (1 + abs(u)))
        return (u, lo, hi, step, step_old, active), active

    going = ops.not_(underflow)
    width = hi - lo
    u, *_ = ops.repeat(ops.newton_steps, newton, (hi, lo, hi, width, width, going), going)
    q = ops.exp(u)
    top = ops.exp(hi)  # (the bracket's end, where omega' reaches z: 1 where omega's domain ends there)
    for _ in range(POLISH_STEPS):
        nxt = q - (omega_prime(q) - z) / omega_second(q)
        q = ops.where((nxt > 0) & (nxt <= top), nxt, q)
    return ops.where(underflow, 0, q)


class NumpyOps(Ops):
    """:class:`Ops` on NumPy arrays of one floating dtype, elementwise."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self.log_tiny = scalar(np.log(np.finfo(self.dtype).tiny), self.dtype)
        self.eps = np.finfo(self.dtype).eps

    def full(self, like, value):
        return np.full(np.shape(like), value, dtype=bool if isinstance(value, bool) else self.dtype)

    exp = staticmethod(np.exp)
    where = staticmethod(select)
    not_ = staticmethod(np.logical_not)

    @staticmethod
    def repeat(n, body, state, going):
        for _ in range(n):
            if not going.any():
                break
            state, going = body(state)
        return state


class ScalarOps(Ops):
    """:class:`Ops` on one number at a time (Python floats, ``mpmath`` numbers): a target sets the format's
    constants, ``exp`` and ``number`` (the type a value is made with)."""

    number: Callable = float

    def full(self, like, value):
        return value if isinstance(value, bool) else self.number(value)

    @staticmethod
    def where(cond, a, b):
        return a if cond else b

    @staticmethod
    def not_(b):
        return not b

    @staticmethod
    def repeat(n, body, state, going):
        for _ in range(n):
            if not going:
                break
            state, going = body(state)
        return state


def numpy_invert_link(z: np.ndarray, omega_prime: Callable, omega_second: Callable) -> np.ndarray:
    """:func:`invert_link` on a NumPy array, in its dtype (overflow and underflow are expected)."""
    with np.errstate(over="ignore", under="ignore"):
        p = invert_link(NumpyOps(z.dtype), z, omega_prime, omega_second)
    return np.asarray(p).astype(z.dtype, copy=False)
