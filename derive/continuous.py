"""Continuous attention: the regularized argmax over densities on the real line (issue 8, first part).

For scores ``f(t) = theta_1 t + theta_2 t^2`` with ``theta_2 < 0`` and a
separable regularizer ``Omega(p) = int omega(p(t)) dt``, the stationarity
conditions are those of the discrete case pointwise: ``omega'(p(t)) = f(t) - tau``
on the support, so ``p(t) = g_+(f(t) - tau)`` with the same link ``g`` and clip
``omega'(0+)`` as :func:`derive.derive_map` finds (Martins et al., "Sparse and
continuous attention mechanisms", NeurIPS 2020).  Writing ``f`` around its peak,
``f(t) - tau = lambda - u^2 / (2 sigma^2)`` with ``u = t - mu``,
``mu = -theta_1 / (2 theta_2)``, ``sigma^2 = -1 / (2 theta_2)``:

* a dense map (``omega'(0+) = -oo``, Shannon) has full support; normalising
  ``int exp(f - tau - 1) dt = 1`` gives the Gaussian ``N(mu, sigma^2)``;
* a sparse map is supported on ``|u| < a`` with ``lambda = omega'(0+) + a^2 / (2 sigma^2)``;
  for a polynomial link the normalisation ``int_{-a}^{a} g(...) du = 1`` is a
  monomial equation in ``a``: sparsemax gives the truncated parabola with
  ``a = (3 sigma^2 / 2)^(1/3)``, Tsallis 3/2 the biweight with ``a = (15 sigma^4)^(1/5)``.

The context needs ``E_p[psi(t)]`` for Gaussian basis functions
``psi(t) = N(t; c, s^2)``; :meth:`ContinuousMap.rbf_expectation` derives it in
closed form (``erf`` and ``exp`` terms) from the antiderivatives of
``v^k exp(-v^2)``, built by their recurrence rather than by ``sympy.integrate``
(which takes minutes on these symbolic integrals).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .argmax import derive_map
from .errors import DerivationError
from .regularizers import Regularizer, z

__all__ = ["ContinuousMap", "derive_continuous", "t", "u", "mu", "sigma2", "radius", "c", "s2", "theta1", "theta2"]

t, u = sp.symbols("t u", real=True)
mu, c = sp.symbols("mu c", real=True)
sigma2, s2 = sp.symbols("sigma2 s2", positive=True)
radius = sp.Symbol("a", positive=True)
theta1 = sp.Symbol("theta_1", real=True)
theta2 = sp.Symbol("theta_2", negative=True)
_v = sp.Symbol("v", real=True)


@dataclass(frozen=True)
class ContinuousMap:
    """The continuous regularized argmax of one regularizer for quadratic scores.

    Attributes
    ----------
    family:
        ``"gaussian"`` (dense) or ``"compact"`` (a sparse map: support ``|t - mu| < a``).
    density:
        ``p`` as a function of ``u = t - mu`` (and ``sigma2``; ``a`` for compact support).
    support_radius:
        ``a`` in terms of ``sigma2`` (``oo`` for the Gaussian).
    mean, variance:
        ``mu`` and ``sigma2`` in terms of ``theta_1``, ``theta_2``.
    """

    regularizer: Regularizer
    family: str
    density: sp.Expr
    support_radius: sp.Expr

    @property
    def mean(self) -> sp.Expr:
        return -theta1 / (2 * theta2)

    @property
    def variance(self) -> sp.Expr:
        return -1 / (2 * theta2)

    def density_at(self) -> sp.Expr:
        """``p(t)`` with the radius substituted, in ``t``, ``mu``, ``sigma2`` (inside the support)."""
        return self.density.subs(radius, self.support_radius).subs(u, t - mu)

    def rbf_expectation(self) -> sp.Expr:
        """``E_p[N(t; c, s2)]`` in closed form, in ``mu``, ``sigma2``, ``c``, ``s2``."""
        if self.family == "gaussian":
            total = sigma2 + s2
            return sp.exp(-((c - mu) ** 2) / (2 * total)) / sp.sqrt(2 * sp.pi * total)
        a = self.support_radius
        # u = d + sqrt(2 s2) v with d = c - mu: psi du = exp(-v^2) dv / sqrt(pi)
        d = c - mu
        scale = sp.sqrt(2 * s2)
        poly = sp.Poly(sp.expand(self.density.subs(radius, a).subs(u, d + scale * _v)), _v)
        lo, hi = (-a - d) / scale, (a - d) / scale
        total = sp.Integer(0)
        for (power,), coeff in poly.terms():
            total += coeff * (_antiderivative(power, hi) - _antiderivative(power, lo))
        return total / sp.sqrt(sp.pi)


    def rbf_expectation_theta(self) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
        """``(E, dE/dtheta_1, dE/dtheta_2)`` for ``E = E_p[N(t; c, s2)]``, in ``theta_1``, ``theta_2``, ``c``, ``s2``.

        Through ``mu = -theta_1 / (2 theta_2)`` and ``sigma^2 = -1 / (2 theta_2)``:
        the Jacobian a continuous attention layer back-propagates through.
        """
        expr = self.rbf_expectation()
        d_mu, d_var = sp.diff(expr, mu), sp.diff(expr, sigma2)
        at = {mu: self.mean, sigma2: self.variance}
        dmu = (sp.diff(self.mean, theta1), sp.diff(self.mean, theta2))
        dvar = (sp.diff(self.variance, theta1), sp.diff(self.variance, theta2))
        value = expr.subs(at)
        g1 = (d_mu * dmu[0] + d_var * dvar[0]).subs(at)
        g2 = (d_mu * dmu[1] + d_var * dvar[1]).subs(at)
        return value, g1, g2


def _antiderivative(k: int, x: sp.Expr) -> sp.Expr:
    """``J_k(x) = int_0^x v^k exp(-v^2) dv`` by ``J_k = -x^(k-1) e^(-x^2)/2 + (k-1)/2 J_(k-2)``."""
    if k == 0:
        return sp.sqrt(sp.pi) / 2 * sp.erf(x)
    if k == 1:
        return (1 - sp.exp(-(x**2))) / 2
    return -(x ** (k - 1)) * sp.exp(-(x**2)) / 2 + sp.Rational(k - 1, 2) * _antiderivative(k - 2, x)


def derive_continuous(reg: Regularizer) -> ContinuousMap:
    """Derive the continuous map of ``reg`` for quadratic scores (see the module docstring).

    Raises
    ------
    DerivationError
        If the regularizer has parameters, its link has no closed form, or (for a
        sparse map) the normalisation has no closed-form radius.
    """
    if reg.parameters:
        raise DerivationError("continuous maps need a regularizer without symbolic parameters")
    dv = derive_map(reg)
    if dv.link is None or dv.inversion.method != "closed":
        raise DerivationError(f"the link of {reg.name} has no printable closed form; continuous maps need one")
    if not dv.sparse:
        # p(u) = g(lambda - u^2/(2 sigma^2)); exponential links make it Gaussian after normalising
        lam = sp.Symbol("lambda", real=True)
        shape = dv.link.subs(z, lam - u**2 / (2 * sigma2))
        norm = sp.integrate(shape, (u, -sp.oo, sp.oo), conds="none")
        roots = sp.solve(sp.Eq(norm, 1), lam)
        if not roots:
            raise DerivationError(f"cannot normalise the dense continuous map of {reg.name}")
        density = sp.simplify(shape.subs(lam, roots[0]))
        return ContinuousMap(reg, "gaussian", density, sp.oo)
    zz = dv.clip + (radius**2 - u**2) / (2 * sigma2)
    density = sp.expand(dv.link.subs(z, zz))
    total = sp.integrate(density, (u, -radius, radius))
    roots = [r for r in sp.solve(sp.Eq(total, 1), radius) if r.is_positive is not False and not r.has(sp.I)]
    if not roots:
        raise DerivationError(f"the normalisation of the continuous {reg.name} map has no closed-form radius")
    return ContinuousMap(reg, "compact", density, sp.simplify(roots[0]))
