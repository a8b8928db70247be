"""Continuous attention: the regularized argmax over densities on the real line.

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

The family is read off the derived density, not assumed from the regularizer:

* ``"gaussian"``: full support and ``log p`` a quadratic in ``u`` (its variance
  is read from the ``u^2`` coefficient, so ``2 p log p`` gives ``N(mu, 2 sigma^2)``);
* ``"compact"``: a sparse map, support ``|u| < a``; a *truncated polynomial*
  when ``p`` is a polynomial in ``u`` (an integer power of the clipped quadratic);
* ``"general"``: full support but not Gaussian (``-log p`` gives a Cauchy density).

The context needs ``E_p[psi(t)]`` for Gaussian basis functions
``psi(t) = N(t; c, s^2)``; :meth:`ContinuousDerivation.rbf_expectation` derives it in
closed form (``erf`` and ``exp`` terms) from the antiderivatives of
``v^k exp(-v^2)``, built by their recurrence rather than by ``sympy.integrate``
(which takes minutes on these symbolic integrals).  Only the Gaussian and the
truncated polynomials have one (:attr:`ContinuousDerivation.closed_context`); for the
others it raises :class:`~derive.errors.DerivationError` in one line, while the
density itself is still derived and shown.
"""

from __future__ import annotations

from dataclasses import dataclass

import mpmath
import sympy as sp

from .argmax import derive_map
from .derivation import Derivation
from .errors import DerivationError
from .regularizers import Regularizer, z

__all__ = ["ContinuousDerivation", "derive_continuous", "check_density", "t", "u", "mu", "sigma2", "radius", "c", "s2", "theta1", "theta2"]

t, u = sp.symbols("t u", real=True)
mu, c = sp.symbols("mu c", real=True)
sigma2, s2 = sp.symbols("sigma2 s2", positive=True)
radius = sp.Symbol("a", positive=True)
theta1 = sp.Symbol("theta_1", real=True)
theta2 = sp.Symbol("theta_2", negative=True)
_v = sp.Symbol("v", real=True)
_d = sp.Symbol("d", real=True)
_lo, _hi = sp.Symbol("x_-", real=True), sp.Symbol("x_+", real=True)
X = sp.Symbol("x", real=True)
#: The context of a Gaussian basis function, as the derivation's steps name it (LaTeX), and its plain-text name.
_CONTEXT = sp.Symbol(r"E_p[\mathcal{N}(t; c, s^2)]")
_CONTEXT_TEXT = sp.Symbol("E_p[N(t; c, s²)]")


@dataclass(frozen=True)
class ContinuousDerivation:
    """The continuous regularized argmax of one regularizer for quadratic scores.

    Attributes
    ----------
    family:
        ``"gaussian"`` (full support, ``log p`` quadratic in ``u``), ``"compact"``
        (a sparse map: support ``|t - mu| < a``) or ``"general"`` (full support,
        not Gaussian), classified from :attr:`density`.
    density:
        ``p`` as a function of ``u = t - mu`` (and ``sigma2``; ``a`` for compact support).
    support_radius:
        ``a`` in terms of ``sigma2`` (``oo`` for full support).
    level:
        ``lambda(sigma2)``: on the support ``f(t) - tau = lambda - (t - mu)^2 / (2 sigma2)``,
        so ``lambda = omega'(p(mu))``, the height of the scores above the threshold at the peak.
    mean, variance:
        ``mu`` and ``sigma2`` in terms of ``theta_1``, ``theta_2``; the property
        :attr:`threshold` gives ``tau`` in the same terms.
    """

    regularizer: Regularizer
    family: str
    density: sp.Expr
    support_radius: sp.Expr
    level: sp.Expr

    @property
    def mean(self) -> sp.Expr:
        return -theta1 / (2 * theta2)

    @property
    def variance(self) -> sp.Expr:
        return -1 / (2 * theta2)

    @property
    def threshold(self) -> sp.Expr:
        """``tau``: ``f(mu) - lambda`` with ``f(mu) = -theta_1^2 / (4 theta_2)`` the peak score."""
        peak = -(theta1**2) / (4 * theta2)
        return sp.simplify(peak - self.level.subs(sigma2, self.variance))

    @property
    def gaussian_variance(self) -> sp.Expr:
        """The variance of a Gaussian density, in ``sigma2``: ``-1 / (2 k)`` for ``k`` the ``u^2`` coefficient of ``log p``."""
        if self.family != "gaussian":
            raise DerivationError(f"the {self.regularizer.name} density is {self.family}, not Gaussian")
        return _gaussian_variance(self.density)

    @property
    def closed_context(self) -> bool:
        """Whether ``E_p[N(t; c, s2)]`` has a closed form: a Gaussian, or a polynomial density on a compact support."""
        return self.family == "gaussian" or (self.family == "compact" and self.density.is_polynomial(u))

    def no_closed_context(self) -> str:
        """One line saying why ``E_p[psi]`` has no closed form (empty when it has one)."""
        if self.closed_context:
            return ""
        kind = "not a polynomial on its support" if self.family == "compact" else "full-support but not Gaussian"
        return (f"E_p[psi] has no closed form here: the {self.regularizer.name} density "
                f"p(u) = {sp.sstr(self.density)} is {kind}; its context would need quadrature")

    @property
    def degree(self) -> int:
        """The degree in ``u`` of a truncated-polynomial density."""
        if not (self.family == "compact" and self.closed_context):
            raise DerivationError(self.no_closed_context() or "a Gaussian density has no polynomial degree")
        return sp.Poly(self.density, u).degree()

    def shape(self) -> sp.Expr | None:
        """``P(x) = a p(a x)`` on ``|x| < 1`` when it does not depend on ``sigma2`` (else ``None``).

        Then ``p(u) = P(u / a) / a`` with ``int_{-1}^{1} P = 1``: the density is a
        fixed shape stretched over its support, as for every power link.
        """
        if self.family != "compact":
            return None
        x = sp.Symbol("x", real=True)
        a = self.support_radius
        scaled = sp.expand(sp.simplify(a * self.density.subs(u, a * x).subs(radius, a)))
        return None if scaled.has(sigma2) else scaled.subs(x, X)

    def density_at(self) -> sp.Expr:
        """``p(t)`` with the radius substituted, in ``t``, ``mu``, ``sigma2`` (inside the support)."""
        return self.density.subs(radius, self.support_radius).subs(u, t - mu)

    def rbf_expectation(self) -> sp.Expr:
        """``E_p[N(t; c, s2)]`` in closed form, in ``mu``, ``sigma2``, ``c``, ``s2``."""
        if self.family == "gaussian":
            total = self.gaussian_variance + s2
            return sp.exp(-((c - mu) ** 2) / (2 * total)) / sp.sqrt(2 * sp.pi * total)
        expr, at = self._compact_expectation()
        return expr.subs(at, simultaneous=True).subs(radius, self.support_radius)

    def _compact_expectation(self) -> tuple[sp.Expr, dict]:
        """The compact-support expectation in ``a``, ``d = c - mu``, ``x_-``, ``x_+`` and ``s2``.

        With ``u = d + sqrt(2 s2) v``, ``psi du = exp(-v^2) dv / sqrt(pi)`` and the
        support ``|u| < a`` is ``x_- < v < x_+``, ``x_+- = (+-a - d) / sqrt(2 s2)``.
        Returns the expression and the substitution back to ``mu``, ``c``, ``s2``.
        """
        if not self.closed_context:
            raise DerivationError(self.no_closed_context())
        scale = sp.sqrt(2 * s2)
        poly = sp.Poly(sp.expand(self.density.subs(u, _d + scale * _v)), _v)
        total = sp.Integer(0)
        for (power,), coeff in poly.terms():
            total += sp.factor(coeff) * (_antiderivative(power, _hi) - _antiderivative(power, _lo))
        d = c - mu
        return total / sp.sqrt(sp.pi), {_hi: (radius - d) / scale, _lo: (-radius - d) / scale, _d: d}

    def rbf_expectation_grad(self) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
        """``(E, dE/dmu, dE/dsigma2)`` for ``E = E_p[N(t; c, s2)]``, in ``mu``, ``sigma2``, ``c``, ``s2``.

        The radius ``a(sigma2)`` moves with ``sigma2``; the density vanishes at
        ``|u| = a``, so the moving ends add nothing and differentiating the
        closed form is exact.
        """
        expr = self.rbf_expectation()
        return expr, sp.diff(expr, mu), sp.diff(expr, sigma2)

    def rbf_expectation_theta(self) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
        """``(E, dE/dtheta_1, dE/dtheta_2)`` for ``E = E_p[N(t; c, s2)]``, in ``theta_1``, ``theta_2``, ``c``, ``s2``.

        Through ``mu = -theta_1 / (2 theta_2)`` and ``sigma^2 = -1 / (2 theta_2)``:
        the Jacobian a continuous attention layer back-propagates through.
        """
        expr, d_mu, d_var = self.rbf_expectation_grad()
        at = {mu: self.mean, sigma2: self.variance}
        dmu = (sp.diff(self.mean, theta1), sp.diff(self.mean, theta2))
        dvar = (sp.diff(self.variance, theta1), sp.diff(self.variance, theta2))
        value = expr.subs(at)
        g1 = (d_mu * dmu[0] + d_var * dvar[0]).subs(at)
        g2 = (d_mu * dmu[1] + d_var * dvar[1]).subs(at)
        return value, g1, g2


    def _steps(self) -> list[tuple[str, sp.Expr | sp.Eq]]:
        f = theta1 * t + theta2 * t**2
        steps = [
            ("scores", sp.Eq(sp.Function("f")(t), f)),
            ("mean and variance", sp.Eq(sp.Tuple(mu, sigma2), sp.Tuple(self.mean, self.variance))),
            ("threshold", sp.Eq(sp.Symbol("tau"), self.threshold)),
        ]
        if self.family == "gaussian":
            steps.append(("density (Gaussian, full support)", sp.Eq(sp.Function("p")(t), self.density_at())))
        elif self.family == "general":
            steps.append(("density (full support, not Gaussian)", sp.Eq(sp.Function("p")(t), self.density_at())))
        else:
            steps += [
                ("support", sp.Eq(sp.Abs(t - mu), radius, evaluate=False)),
                ("radius", sp.Eq(radius, self.support_radius)),
                ("density on the support", sp.Eq(sp.Function("p")(t), self.density.subs(u, t - mu))),
            ]
        psi = _CONTEXT
        if self.family == "gaussian":
            steps.append(("context of a Gaussian basis function", sp.Eq(psi, self.rbf_expectation())))
        elif not self.closed_context:
            kind = "not a polynomial" if self.family == "compact" else "neither Gaussian nor compactly supported"
            steps.append(("context of a Gaussian basis function", sp.Symbol(rf"\text{{no closed form (the density is {kind})}}")))
        else:
            expr, at = self._compact_expectation()
            steps += [
                ("context of a Gaussian basis function", sp.Eq(psi, expr)),
                ("where", sp.Tuple(*(sp.Eq(k, v) for k, v in at.items()))),
            ]
        return steps

    def _display_steps(self, text: bool = False) -> list[tuple[str, sp.Basic]]:
        """The steps with ``sigma2``, ``s2`` shown as squares; ``text``: the context's name in plain text
        (SymPy's text printer reads the LaTeX name's ``s^2`` as a superscript and prints ``s__2``)."""
        show = {sigma2: sp.Symbol("sigma^2", positive=True), s2: sp.Symbol("s^2", positive=True)}
        if text:
            show[_CONTEXT] = _CONTEXT_TEXT
        return [(title, eq.subs(show)) for title, eq in self._steps()]

    def latex(self) -> str:
        """The continuous map as LaTeX: scores, mean and variance, support, density, context."""
        lines = [rf"\text{{continuous map of }} \omega(p) = {sp.latex(self.regularizer.omega)} \\"]
        for title, eq in self._display_steps():
            lines.append(rf"\text{{{title}:}}\quad {sp.latex(eq)} \\")
        return "\n".join(lines)

    def markdown(self) -> str:
        """The continuous map as Markdown with display math (for MyST/MathJax)."""
        out = [f"Continuous map of $\\omega(p) = {sp.latex(self.regularizer.omega)}$ ({self.family} density).", ""]
        for title, eq in self._display_steps():
            out += [f"**{title.capitalize()}:**", "", "$$", sp.latex(eq), "$$", ""]
        return "\n".join(out)

    def pretty(self) -> str:
        """The continuous map as plain Unicode text."""
        out = [f"continuous map of omega(p) = {sp.sstr(self.regularizer.omega)}  ({self.family})"]
        for title, eq in self._display_steps(text=True):
            text = eq.name[6:-1] if isinstance(eq, sp.Symbol) and eq.name.startswith("\\text{") else sp.pretty(eq, use_unicode=True)
            out += [f"{title}:", text, ""]
        return "\n".join(out).rstrip() + "\n"

    def __str__(self) -> str:
        return self.pretty()


def check_density(cm: ContinuousDerivation, mean, var, digits: int = 30) -> tuple:
    """``(|int p - 1|, spread)`` at ``mu = mean``, ``sigma2 = var`` by mpmath quadrature at ``digits``.

    ``spread`` is the largest difference between values of ``omega'(p(t)) + (t - mu)^2 / (2 sigma2)``
    at five points of the support: stationarity makes it the constant ``f(mu) - tau``.
    """
    with mpmath.workdps(digits + 10):
        m, v = mpmath.mpf(mean), mpmath.mpf(var)
        dens = sp.lambdify([t, mu, sigma2], cm.density_at(), "mpmath")
        d1 = sp.lambdify([sp.Symbol("p", positive=True)], cm.regularizer.first_derivative, "mpmath")
        if cm.family == "compact":
            a = sp.lambdify([sigma2], cm.support_radius, "mpmath")(v)
            total = mpmath.quad(lambda x: dens(x, m, v), [m - a, m, m + a])
            points = [m + k * a for k in (-0.9, -0.5, 0, 0.3, 0.8)]
        else:
            total = mpmath.quad(lambda x: dens(x, m, v), [-mpmath.inf, m, mpmath.inf])
            points = [m + k * mpmath.sqrt(v) for k in (-3, -1, 0, 0.5, 2)]
        levels = [d1(dens(x, m, v)) + (x - m) ** 2 / (2 * v) for x in points]
        return abs(total - 1), max(levels) - min(levels)


def _antiderivative(k: int, x: sp.Expr) -> sp.Expr:
    """``J_k(x) = int_0^x v^k exp(-v^2) dv`` by ``J_k = -x^(k-1) e^(-x^2)/2 + (k-1)/2 J_(k-2)``."""
    if k == 0:
        return sp.sqrt(sp.pi) / 2 * sp.erf(x)
    if k == 1:
        return (1 - sp.exp(-(x**2))) / 2
    return -(x ** (k - 1)) * sp.exp(-(x**2)) / 2 + sp.Rational(k - 1, 2) * _antiderivative(k - 2, x)


def _gaussian_variance(density: sp.Expr) -> sp.Expr | None:
    """``v`` if ``density`` is ``exp`` of a quadratic ``k_0 - u^2 / (2 v)`` in ``u`` (``v > 0``), else ``None``."""
    log_p = sp.expand(sp.expand_log(sp.log(density), force=True))
    if not log_p.is_polynomial(u):
        return None
    poly = sp.Poly(log_p, u)
    if poly.degree() != 2 or sp.simplify(poly.coeff_monomial(u)) != 0:
        return None
    variance = sp.simplify(-1 / (2 * poly.coeff_monomial(u**2)))
    return variance if variance.subs(sigma2, 1).is_positive else None


def _positive_at_peak(density: sp.Expr) -> bool:
    """Whether ``density`` is finite and positive at ``u = 0`` for ``sigma2 = 1`` (a root of the normalisation that is a density)."""
    value = sp.N(density.subs({u: 0, sigma2: 1}))
    return bool(value.is_real and value.is_finite and value > 0)


def derive_continuous(reg: Regularizer, derivation: Derivation | None = None) -> ContinuousDerivation:
    """Derive the continuous map of ``reg`` for quadratic scores (see the module docstring); ``derivation``:
    ``derive_map(reg)``, where the caller has it already.

    Raises
    ------
    DerivationError
        If the regularizer has parameters, its link has no closed form, or (for a
        sparse map) the normalisation has no closed-form radius.
    """
    if reg.parameters:
        raise DerivationError("continuous maps need a regularizer without symbolic parameters")
    dv = derive_map(reg) if derivation is None else derivation
    if dv.regularizer is not reg:
        raise DerivationError("derive_continuous: the derivation given is not that of the regularizer")
    if dv.link is None or dv.inversion.method != "closed":
        raise DerivationError(f"the link of {reg.name} has no printable closed form; continuous maps need one")
    if not dv.sparse:
        # p(u) = g(lambda - u^2/(2 sigma^2)) on the whole line, lambda from int p = 1;
        # sympy's integral may carry polar numbers (exp_polar, polar_lift): unpolarify them
        lam = sp.Symbol("lambda", real=True)
        shape = dv.link.subs(z, lam - u**2 / (2 * sigma2))
        norm = sp.unpolarify(sp.integrate(shape, (u, -sp.oo, sp.oo), conds="none"))
        roots = [sp.simplify(sp.unpolarify(r)) for r in sp.solve(sp.Eq(norm, 1), lam)]
        densities = [(r, sp.simplify(sp.unpolarify(shape.subs(lam, r)))) for r in roots]
        densities = [(r, q) for r, q in densities if _positive_at_peak(q)]
        if not densities:
            raise DerivationError(f"cannot normalise the dense continuous map of {reg.name}")
        level, density = densities[0]
        family = "gaussian" if _gaussian_variance(density) is not None else "general"
        return ContinuousDerivation(reg, family, density, sp.oo, level)
    zz = dv.clip + (radius**2 - u**2) / (2 * sigma2)
    density = sp.expand(dv.link.subs(z, zz))
    total = sp.integrate(density, (u, -radius, radius))
    roots = [r for r in sp.solve(sp.Eq(total, 1), radius) if r.is_positive is not False and not r.has(sp.I)]
    if not roots:
        raise DerivationError(f"the normalisation of the continuous {reg.name} map has no closed-form radius")
    a = sp.simplify(roots[0])
    return ContinuousDerivation(reg, "compact", density, a, sp.simplify(dv.clip + a**2 / (2 * sigma2)))
