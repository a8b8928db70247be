"""Check generated code against the SymPy expressions it was printed from.

Shared by the test-suite and ``regattn verify``.  A function ``f`` evaluated in
floating point at ``x`` can be no more accurate than its condition number
``kappa = sum_j |x_j df/dx_j| / |f|`` allows, so agreement is measured as

    |computed - exact| / (|exact| (1 + kappa)),

which must stay below 1e-13 in double and 1e-6 in float.  ``exact`` is the
SymPy expression evaluated by mpmath at 50 digits at the very inputs the code
received (after rounding to float32 for float code).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import mpmath
import numpy as np
import sympy as sp

from ..derivation import Derivation
from ..symbols import S, S1, S2, k, score
from ..regularizers import p, z

__all__ = ["functions", "sample_point", "sample_range", "exact_value", "scaled_error", "TOLERANCE"]

#: Bound on :func:`scaled_error` for double and float code.
TOLERANCE = {"double": 1e-13, "float": 1e-6}
#: Where a parameter is drawn relative to a finite end of its domain when the other end is
#: infinite: ``(lower + 0.05, lower + 3)`` (Tsallis' alpha on (1, oo): (1.05, 4)), mirrored for an
#: upper end; a finite domain is drawn on its middle 90%, the whole line on (-3, 3).
HALF_LINE_RANGE = (0.05, 3.0)
#: The same offsets for float32 code of d omega'/d parameter (see sample_point).
FLOAT_PARAM_DERIVATIVE_RANGE = (0.25, 3.0)


def sample_range(parameter, ctype: str = "double", derivative: bool = False) -> tuple[float, float]:
    """The interval inside ``parameter``'s declared domain ``(lower, upper)`` where verify draws it."""
    lo, hi = parameter.lower, parameter.upper
    near, far = FLOAT_PARAM_DERIVATIVE_RANGE if (derivative and ctype == "float") else HALF_LINE_RANGE
    if lo.is_finite and hi.is_finite:
        width = float(hi - lo)
        return float(lo) + 0.05 * width, float(hi) - 0.05 * width
    if lo.is_finite:
        return float(lo) + near, float(lo) + far
    if hi.is_finite:
        return float(hi) - far, float(hi) - near
    return -far, far


def functions(dv: Derivation) -> dict[str, tuple[sp.Expr, list[sp.Symbol]]]:
    """Generated function name -> (SymPy expression, argument symbols before the parameters).

    The routines the emitter writes for ``dv`` (:mod:`numeric.contract`), each with
    the expression its docstring shows; constants that are infinite (``clip = -oo``
    for a dense map, ``omega_zero = +oo`` where omega is infinite at 0) print as
    ``math.inf`` and have no error to judge.
    """
    cached = dv._cache.get("verify.functions")
    if cached is not None:  # sample_point and exact_value ask for it at every point: build it once
        return cached
    from .emit import map_pieces, symbols_for

    out = dv._cache["verify.functions"] = {}
    for piece in map_pieces(dv):
        if not piece.args and piece.expr.is_finite is False:
            continue
        table = symbols_for(piece.args)
        out[piece.name] = (piece.expr, [table[a] for a in piece.args])
    return out


def sample_point(
    dv: Derivation,
    fname: str,
    uniform: Callable[[float, float], float],
    integer: Callable[[int, int], int],
    ctype: str = "double",
) -> tuple[list[float], list[float]] | None:
    """``(args, params)`` inside the domain where the function is used, or ``None`` to draw again.

    ``uniform(lo, hi)`` and ``integer(lo, hi)`` supply the randomness (a NumPy
    generator or hypothesis draws).  Probabilities lie in ``[1e-6, 1]``; link
    arguments are ``z = omega'(p0)`` with ``p0`` in ``[1e-4, 1]`` (both below 1 where omega's domain ends there); shifted scores
    ``s - max(s)`` in ``[-700, 0]``; sums ``S`` in ``[1, 1e6]``; sort sums come
    from up to 31 scores in ``[-5/k, 0]`` including a 0, with a real ``tau_k``.
    """
    # d omega'/d alpha carries (alpha - 1)**2 in a denominator: its printed form cancels in
    # float32 near the domain's end alpha = 1 (the numeric side evaluates it in float64)
    derivative = fname.startswith("omega_prime_d_")
    params = [uniform(*sample_range(q, ctype, derivative)) for q in dv.parameters]
    subs = {q.symbol: sp.Float(v, 30) for q, v in zip(dv.parameters, params)}
    _, args = functions(dv)[fname]
    if not args:
        return [], params
    top = 1 - 2.0**-53 if dv.omega_one is not None else 1.0  # (omega's domain ends at 1: p < 1)
    if args == [p]:
        return [uniform(1e-6, top)], params
    if args == [z]:
        return [float(dv.omega_prime.subs(subs).subs(p, uniform(1e-4, top)))], params
    if args == [score]:
        return [uniform(-700.0, 0.0)], params
    if args == [S]:
        return [uniform(1.0, 1e6)], params
    count = integer(0, 30)
    width = uniform(0.0, 5.0) / (1 + count)  # supports of k scores have spreads of order 1/k
    xs = [uniform(-width, 0.0) for _ in range(count)] + [0.0]
    s1, s2 = math.fsum(xs), math.fsum(x * x for x in xs)
    disc = dv.threshold.discriminant
    if disc is not None and not disc.subs({k: len(xs), S1: sp.Float(s1, 30), S2: sp.Float(s2, 30)}).subs(subs) > 1e-12:
        return None
    return [float(len(xs)), s1, s2], params


def exact_value(dv: Derivation, fname: str, args: list[float], params: list[float]):
    """``(value, kappa)`` at 50 digits; ``(None, None)`` outside the real domain."""
    expr, syms = functions(dv)[fname]
    allsyms = syms + [q.symbol for q in dv.parameters]
    values = [mpmath.mpf(v) for v in list(args) + list(params)]
    with mpmath.workdps(50):
        try:
            f = sp.lambdify(allsyms, expr, "mpmath")(*values)
        except (ZeroDivisionError, OverflowError, ValueError):
            return None, None  # a pole or a point outside the domain (float32 rounding can land there)
        if isinstance(f, mpmath.mpc):
            if abs(f.imag) > mpmath.mpf(10) ** -40 * max(1, abs(f.real)):
                return None, None
            f = f.real
        if f == 0:
            return mpmath.mpf(0), mpmath.mpf(0)
        if not mpmath.isfinite(f):
            return None, None
        kappa = mpmath.mpf(0)
        for sym, val in zip(allsyms, values):
            try:
                d = sp.lambdify(allsyms, sp.diff(expr, sym), "mpmath")(*values)
            except (ZeroDivisionError, OverflowError, ValueError):
                return None, None  # infinitely ill-conditioned here: not judged
            kappa += abs(mpmath.re(d) * val)
        return mpmath.mpf(f), kappa / abs(f)


def scaled_error(got: float, exact, kappa) -> float:
    """``|got - exact| / (|exact| (1 + kappa))``; 0 when both are 0, inf when only ``exact`` is."""
    with mpmath.workdps(50):
        err = abs(mpmath.mpf(got) - exact)
        if exact == 0:
            return 0.0 if err == 0 else math.inf
        return float(err / (abs(exact) * (1 + kappa)))


def representable(exact, ctype: str) -> bool:
    """Whether ``exact`` is 0 or a normal number of ``ctype`` (relative error is meaningless otherwise)."""
    info = np.finfo(np.float32 if ctype == "float" else np.float64)
    return exact == 0 or float(info.tiny) <= abs(exact) <= float(info.max)


@dataclass(frozen=True)
class Report:
    """Largest scaled error of each function over the points checked."""

    where: str
    ctype: str
    points: int
    worst: dict[str, float]
    #: the arguments (before the parameters) where each function's worst error was found
    at: dict[str, tuple[float, ...]] = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        return all(v <= TOLERANCE[self.ctype] for v in self.worst.values())

    @property
    def max_error(self) -> float:
        return max(self.worst.values(), default=0.0)


def check(dv: Derivation, call: Callable[[str, list[float], list[float]], float], ctype: str, where: str, points: int = 50, seed: int = 0) -> Report:
    """Evaluate ``call(fname, args, params)`` at random points of every function and compare."""
    rng = np.random.default_rng(seed)
    uniform = lambda lo, hi: float(rng.uniform(lo, hi))  # noqa: E731
    integer = lambda lo, hi: int(rng.integers(lo, hi + 1))  # noqa: E731
    worst, at = {}, {}
    for fname in functions(dv):
        errors: list[float] = []
        where_worst: tuple[float, ...] = ()
        for _ in range(20 * points):
            if len(errors) == points:
                break
            drawn = sample_point(dv, fname, uniform, integer, ctype)
            if drawn is None:
                continue
            args, params = drawn
            if ctype == "float":
                args = [float(np.float32(a)) for a in args]
                params = [float(np.float32(a)) for a in params]
            exact, kappa = exact_value(dv, fname, args, params)
            if exact is None or not representable(exact, ctype) or TOLERANCE[ctype] * kappa >= 1:
                continue  # rounding left the domain, or the type cannot resolve the value: not judged
            errors.append(scaled_error(call(fname, args, params), exact, kappa))
            if errors[-1] >= max(errors):
                where_worst = tuple(args)
        worst[fname] = max(errors, default=0.0)
        at[fname] = where_worst
    return Report(where, ctype, points, worst, at)
