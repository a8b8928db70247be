"""Check generated continuous modules against the SymPy expressions they were printed from.

Shared by the test-suite and ``regattn verify --continuous``.  The closed forms
subtract nearly equal terms where the support is narrow next to the basis
function (``erf(x_+) - erf(x_-)`` with ``x_+ ~ x_-``), or where symmetry makes a
derivative vanish, so no relative bound holds everywhere.  The bound is a
first-order running error analysis of the expression tree the code evaluates
(:func:`running_error`): every operation contributes ``u`` times the size of its
result, propagated through the derivatives of what follows, with ``u`` from
:data:`UNIT` (1e-13 for double code, 3e-6 for float code: a few hundred and a few
dozen ulp per operation).  A function passes where ``|computed - exact| <= bound``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mpmath
import numpy as np
import sympy as sp

from ..continuous import ContinuousDerivation, c, mu, s2, sigma2, t, theta1, theta2
from .continuous import continuous_functions
from .verify import Report

__all__ = ["UNIT", "SYMBOLS", "running_error", "functions", "sample", "judge", "check", "ContinuousReport"]

#: Rounding error allowed per operation, by C type.
UNIT = {"double": 1e-13, "float": 3e-6}
#: Argument names of the generated functions -> SymPy symbols.
SYMBOLS = {"t": t, "mu": mu, "sigma2": sigma2, "c": c, "s2": s2, "theta_1": theta1, "theta_2": theta2}


def functions(cm: ContinuousDerivation) -> dict[str, tuple[sp.Expr, list[sp.Symbol]]]:
    """Generated scalar function name -> (SymPy expression, argument symbols)."""
    return {piece.name: (piece.expr, [SYMBOLS[a] for a in piece.args]) for piece in continuous_functions(cm)}


def running_error(expr: sp.Expr, env: dict, u) -> tuple:
    """``(value, bound)``: ``expr`` at ``env`` (symbols -> mpf) and a first-order bound on the rounding
    error of evaluating it operation by operation, each result off by at most ``u`` relatively.

    Sums add their arguments' errors plus ``u`` per term times the sum of magnitudes;
    products and powers propagate relative errors; ``exp`` and ``erf`` through
    their derivatives.  Call inside ``mpmath.workdps``.
    """
    memo: dict = {}
    u = mpmath.mpf(u)

    def walk(node):
        if node in memo:
            return memo[node]
        if node.is_Symbol:
            out = (env[node], mpmath.mpf(0))
        elif node == sp.oo:
            out = (mpmath.inf, mpmath.mpf(0))
        elif node.is_number:
            v = mpmath.mpf(sp.N(node, mpmath.mp.dps + 10))
            out = (v, mpmath.mpf(0) if node.is_Integer else u * abs(v))
        elif node.is_Add:
            parts = [walk(a) for a in node.args]
            v = mpmath.fsum(q[0] for q in parts)
            out = (v, mpmath.fsum(q[1] for q in parts) + u * len(parts) * mpmath.fsum(abs(q[0]) for q in parts))
        elif node.is_Mul:
            parts = [walk(a) for a in node.args]
            v = mpmath.fprod(q[0] for q in parts)
            err = mpmath.fsum(
                q[1] * mpmath.fprod(abs(r[0]) for j, r in enumerate(parts) if j != i) for i, q in enumerate(parts)
            )
            out = (v, err + u * len(parts) * abs(v))
        elif node.is_Pow and node.exp.is_number:
            (b, eb), e = walk(node.base), mpmath.mpf(sp.N(node.exp, mpmath.mp.dps + 10))
            v = b**e
            out = (v, abs(e) * abs(b) ** (e - 1) * eb + 4 * u * abs(v))
        elif isinstance(node, sp.exp):
            x, ex = walk(node.args[0])
            v = mpmath.exp(x)
            out = (v, v * ex + u * v * (1 + abs(x)))
        elif isinstance(node, sp.erf):
            x, ex = walk(node.args[0])
            v = mpmath.erf(x)
            out = (v, 2 / mpmath.sqrt(mpmath.pi) * mpmath.exp(-x * x) * ex + u * abs(v))
        else:
            raise TypeError(f"no rounding-error rule for {type(node).__name__} in {node}")
        memo[node] = out
        return out

    return walk(expr)


def sample(fname: str, uniform: Callable[[float, float], float]) -> tuple[float, ...]:
    """A point inside the domain the layer uses (``uniform(lo, hi)`` supplies the randomness)."""
    if fname in ("support_radius", "support_radius_dsigma2"):
        return (uniform(1e-3, 10),)
    if fname == "density_inside":
        return (uniform(-3, 3), uniform(-2, 2), uniform(1e-3, 4))
    if "theta" in fname:
        return (uniform(-5, 5), uniform(-20, -0.1), uniform(-3, 3), uniform(5e-3, 3))
    return (uniform(-2, 2), uniform(1e-3, 4), uniform(-3, 3), uniform(5e-3, 3))


def judge(expr: sp.Expr, symbols: list[sp.Symbol], args, got: float, ctype: str) -> tuple[float, object, object]:
    """``(ratio, exact, bound)``: ``|got - exact| / bound`` (at most 1 passes), at 50 digits."""
    with mpmath.workdps(50):
        exact, bound = running_error(expr, {x: mpmath.mpf(a) for x, a in zip(symbols, args)}, UNIT[ctype])
        if mpmath.isinf(exact):
            return (0.0 if got == exact else float("inf")), exact, bound
        return float(abs(mpmath.mpf(got) - exact) / (bound + mpmath.mpf(10) ** -300)), exact, bound


@dataclass(frozen=True)
class ContinuousReport(Report):
    """Largest ``|error| / bound`` of each function over the points checked (at most 1 passes)."""

    @property
    def ok(self) -> bool:
        return all(v <= 1 for v in self.worst.values())


def check(cm: ContinuousDerivation, call: Callable[[str, tuple], float], ctype: str, where: str, points: int = 40,
          seed: int = 0, only=None) -> ContinuousReport:
    """Evaluate ``call(fname, args)`` at random points of every generated function (of those named in ``only``,
    when given) and judge it."""
    rng = np.random.default_rng(seed)
    uniform = lambda lo, hi: float(rng.uniform(lo, hi))  # noqa: E731
    worst = {}
    for fname, (expr, symbols) in functions(cm).items():
        if only is not None and fname not in only:
            continue
        ratios = []
        for _ in range(points):
            args = sample(fname, uniform)
            if ctype == "float":
                args = tuple(float(np.float32(a)) for a in args)
            got = call(fname, args)
            if ctype == "float" and abs(got) < 1e-30:
                continue  # below float32's normal range the bound says nothing
            ratios.append(judge(expr, symbols, args, got, ctype)[0])
        worst[fname] = max(ratios, default=0.0)
    return ContinuousReport(where, ctype, points, worst)
