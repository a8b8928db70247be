"""normmax: ``p = argmax_{p in simplex} <p, s> - ||p||_alpha`` for ``alpha > 1``, and its reduction to a separable map.

``Omega(p) = ||p||_alpha`` is not separable, but it is positively homogeneous of degree 1, and that makes its map
a separable one in disguise.  With ``N = ||p||_alpha`` the gradient is ``dOmega/dp_i = (p_i / N)^(alpha - 1)``
(:func:`normmax_derivation` derives it with SymPy), so the KKT conditions read

    (p_i / N)^(alpha - 1) = s_i - tau   on the support,      s_i <= tau   off it.

Write ``d_i = [s_i - tau]_+``, ``k = 1 / (alpha - 1)`` and ``q = alpha / (alpha - 1)`` (the dual exponent): then
``p_i = N d_i^k`` and ``N = ||p||_alpha = N (sum_i d_i^q)^(1/alpha)`` by homogeneity, so ``tau`` is the root of the
separable equation

    sum_i [s_i - tau]_+^q = 1,

the threshold equation of the separable regularizer ``p^a / a`` with ``a = 1 + 1/q = (2 alpha - 1) / alpha``
(alpha-entmax at ``a`` of the scores ``s / (a - 1)``: its ``r_i = d_i^q``), and ``p_i = d_i^k / sum_j d_j^k =
r_i^(1/alpha) / sum_j r_j^(1/alpha)`` (``k / q = 1 / alpha``), ``N = 1 / sum_j d_j^k``.  At ``alpha = 2``: ``r`` is
1.5-entmax of ``2 s`` and ``p`` is proportional to ``sqrt(r)``, the shifted scores themselves.

The Jacobian.  Differentiating ``sum d^q = 1`` gives ``dtau = sum_i d_i^(q - 1) ds_i / sum_j d_j^(q - 1)``, and
``d^(q - 1) = d^k`` is proportional to ``p``: ``dtau = <p, ds>``.  Then ``dp = m (ds - dtau) - p <m, ds - dtau>``
with ``m_i = k p_i / d_i = k p_i^(2 - alpha) N^(alpha - 1)`` on the support (0 off it), so

    J = (I - p 1^T) diag(m) (I - 1 p^T),

symmetric, from ``p`` alone.  For ``alpha > 2`` the factor ``p^(2 - alpha)`` is unbounded near the support's edge:
normmax is not Lipschitz there.

The Fenchel-Young loss ``Omega*(s) + ||y||_alpha - <s, y>`` with ``Omega*(s) = <p, s> - ||p||_alpha`` has the
gradient ``p - y`` in the scores.

Solved here independently of :mod:`numeric`: ``tau`` by bisection and Newton steps in its bracket
``[max s - 1, max s]`` in mpmath, then ``p``; :func:`normmax_kkt_residual` checks the conditions of the original
(non-separable) problem from the norm's gradient, not from the reduction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mpmath
import sympy as sp

from .reference import GUARD_DIGITS, to_mp_vector

__all__ = ["NormmaxDerivation", "normmax_derivation", "solve_normmax", "normmax_kkt_residual", "normmax_jacobian",
           "normmax_loss", "reduced_alpha"]


@dataclass(frozen=True)
class NormmaxDerivation:
    """The symbolic derivation (module docstring), in the symbols ``alpha``, ``p_i`` (``p``), ``N`` and ``s - tau``
    (``z``): ``gradient`` ``dOmega/dp_i`` in terms of ``p_i`` and ``N``; ``link`` ``p_i / N`` from ``z``;
    ``exponent`` ``q`` of the threshold equation ``sum [s - tau]_+^q = 1``; ``reduced`` the separable
    regularizer with that threshold equation (``p^a / a``) and ``reduced_alpha`` its Tsallis alpha ``a``;
    ``weight`` the Jacobian's ``m`` in terms of ``p_i`` and ``N``."""

    alpha: sp.Symbol
    gradient: sp.Expr
    link: sp.Expr
    exponent: sp.Expr
    reduced: sp.Expr
    reduced_alpha: sp.Expr
    weight: sp.Expr


def normmax_derivation() -> NormmaxDerivation:
    """The reduction of normmax to a separable threshold equation, derived with SymPy from ``||p||_alpha`` itself.

    The gradient is differentiated from the norm of a 3-vector (component 0; the others by symmetry), and the
    homogeneity step is checked: ``p_i = N d_i^k`` satisfies the gradient condition and ``||p||_alpha = N`` exactly
    when ``sum d^q = 1``."""
    alpha = sp.Symbol("alpha", positive=True)
    ps = sp.symbols("p0:3", positive=True)
    n_sym, z, p = sp.Symbol("N", positive=True), sp.Symbol("z", positive=True), sp.Symbol("p", positive=True)
    norm = sp.Add(*(v**alpha for v in ps)) ** (1 / alpha)
    grad0 = sp.diff(norm, ps[0])
    gradient = sp.simplify(grad0.subs(norm, n_sym).subs(sp.Add(*(v**alpha for v in ps)), n_sym**alpha))
    gradient = sp.powsimp(sp.simplify(gradient.subs(ps[0], p)), force=True)
    if sp.simplify(gradient - (p / n_sym) ** (alpha - 1)) != 0:  # (a derivation check, not an input check)
        raise AssertionError(f"unexpected gradient of the alpha-norm: {gradient}")
    k = 1 / (alpha - 1)
    q = sp.simplify(alpha / (alpha - 1))
    link = z**k  # p_i / N solving (p_i / N)^(alpha - 1) = z
    ds = sp.symbols("d0:3", positive=True)
    # homogeneity: ||N d^k||_alpha^alpha = N^alpha sum d^q, so ||p||_alpha = N exactly when sum d^q = 1
    powered = sp.Add(*(sp.powdenest(sp.expand_power_base((n_sym * d**k) ** alpha, force=True), force=True) for d in ds))
    if sp.simplify(powered / n_sym**alpha - sp.Add(*(d**q for d in ds))) != 0:
        raise AssertionError(f"homogeneity check failed: {powered}")
    a = sp.simplify(1 + 1 / q)
    reduced = p**a / a
    if sp.simplify(sp.powdenest(sp.diff(reduced, p).subs(p, z**q), force=True) - z) != 0:  # its link is z^q: r_i = d_i^q
        raise AssertionError("the reduced regularizer's link is not z^q")
    weight = sp.simplify(k * p ** (2 - alpha) * n_sym ** (alpha - 1))
    return NormmaxDerivation(alpha, gradient, link, q, reduced, a, weight)


def reduced_alpha(alpha) -> float:
    """Tsallis' ``a = (2 alpha - 1) / alpha`` whose map of ``s / (a - 1)`` gives ``r_i = [s_i - tau]_+^q``."""
    return (2 * alpha - 1) / alpha


def _check_alpha(alpha) -> mpmath.mpf:
    value = mpmath.mpf(alpha) if not isinstance(alpha, str) else mpmath.mpf(sp.Rational(alpha).p) / sp.Rational(alpha).q
    if not value > 1 or not mpmath.isfinite(value):
        raise ValueError(f"normmax needs alpha > 1 (finite), got {alpha!r}")
    return value


def _solve(values, alpha):
    """``(p, tau)`` at the working precision for scores ``values`` (``-inf``: masked)."""
    finite = [v for v in values if v != -mpmath.inf]
    if not finite:
        return [mpmath.mpf(0)] * len(values), None
    q = alpha / (alpha - 1)
    k = 1 / (alpha - 1)
    top = max(finite)
    lo, hi = top - 1, top  # G(lo) >= 0 >= G(hi) for G(t) = sum [s - t]_+^q - 1

    def G(t):
        return mpmath.fsum(max(v - t, 0) ** q for v in finite) - 1

    def dG(t):
        return -q * mpmath.fsum(max(v - t, 0) ** (q - 1) for v in finite)

    t = (lo + hi) / 2
    tol = mpmath.mpf(2) ** (-mpmath.mp.prec + 4)
    for _ in range(8 * mpmath.mp.prec):
        g = G(t)
        if g > 0:
            lo = t
        else:
            hi = t
        if abs(g) <= tol or hi - lo <= tol * (1 + abs(t)):
            break
        slope = dG(t)
        step = t - g / slope if slope != 0 else None
        t = step if step is not None and lo < step < hi else (lo + hi) / 2
    d = [max(v - t, 0) if v != -mpmath.inf else mpmath.mpf(0) for v in values]
    powers = [di**k if di > 0 else mpmath.mpf(0) for di in d]
    z = mpmath.fsum(powers)
    return [w / z for w in powers], t


def solve_normmax(scores: Any, alpha: Any = 2, digits: int = 50):
    """``(p, tau)``: normmax of one score vector (``-inf``: masked) at ``digits`` significant digits; ``tau`` is
    ``None`` for a fully masked row (``p = 0``)."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        p, tau = _solve(to_mp_vector(scores), _check_alpha(alpha))
    return p, tau


def normmax_kkt_residual(scores: Any, probs: Any, alpha: Any = 2, digits: int = 50):
    """The KKT residual of ``probs`` for normmax of ``scores``, from the norm's gradient (not the reduction):
    the spread of ``s_i - (p_i / N)^(alpha - 1)`` over the support, how far an entry off the support rises above
    that threshold, and ``|sum p - 1|`` and any negative entry; the largest of them."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        alpha = _check_alpha(alpha)
        s, p = to_mp_vector(scores), to_mp_vector(probs)
        n = mpmath.fsum(v**alpha for v in p if v > 0) ** (1 / alpha)
        support = [i for i, v in enumerate(p) if v > 0]
        taus = [s[i] - (p[i] / n) ** (alpha - 1) for i in support]
        tau = mpmath.fsum(taus) / len(taus)
        worst = max(abs(t - tau) for t in taus)
        off = [s[i] - tau for i in range(len(p)) if p[i] == 0 and s[i] != -mpmath.inf]
        worst = max([worst, abs(mpmath.fsum(p) - 1)] + [max(o, 0) for o in off] + [max(-v, 0) for v in p])
        return worst


def normmax_jacobian(scores: Any, alpha: Any = 2, digits: int = 50):
    """``dp/ds`` (``n x n``, row ``a`` column ``b``: ``dp_a / ds_b``) = ``(I - p 1^T) diag(m) (I - 1 p^T)``,
    ``m_i = k p_i / d_i`` on the support (module docstring)."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        alpha = _check_alpha(alpha)
        values = to_mp_vector(scores)
        p, tau = _solve(values, alpha)
        k = 1 / (alpha - 1)
        m = [k * pi / (v - tau) if pi > 0 else mpmath.mpf(0) for pi, v in zip(p, values)]
        n = len(values)
        # M = diag(m) (I - 1 p^T): row a is m_a (e_a - p); J = (I - p 1^T) M: J[a] = M[a] - p_a sum_c M[c]
        rows = [[m[a] * ((1 if a == b else 0) - p[b]) for b in range(n)] for a in range(n)]
        col = [mpmath.fsum(rows[c][b] for c in range(n)) for b in range(n)]
        return [[rows[a][b] - p[a] * col[b] for b in range(n)] for a in range(n)]


def normmax_loss(scores: Any, target: Any, alpha: Any = 2, digits: int = 50):
    """The Fenchel-Young loss ``Omega*(s) + ||y||_alpha - <s, y>``, ``Omega*(s) = <p, s> - ||p||_alpha``; the target a
    distribution (no mass on masked scores)."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        alpha = _check_alpha(alpha)
        values, ys = to_mp_vector(scores), to_mp_vector(target)
        p, _ = _solve(values, alpha)

        def norm(v):
            return mpmath.fsum(x**alpha for x in v if x > 0) ** (1 / alpha)

        if any(y > 0 and v == -mpmath.inf for y, v in zip(ys, values)):
            return mpmath.inf
        inner = mpmath.fsum((pi - yi) * v for pi, yi, v in zip(p, ys, values) if v != -mpmath.inf)
        return inner - norm(p) + norm(ys)
