"""The shape of a derived link: exponential, a power of an affine function, or general.

The numeric backends solve the threshold fastest and most accurately when they
know the link's shape:

* ``"exp"``: ``g(z) = C exp(a z)``, ``a > 0`` (softmax and its temperatures);
* ``"power"``: ``g(z) = (a (z - z0))**k`` on ``z > z0 = omega'(0+)``, ``a > 0``,
  ``k > 0`` (sparsemax ``k = 1``, alpha-entmax ``a = alpha - 1``, ``k = 1/(alpha - 1)``,
  ``omega = p**n``: ``a = 1/n``, ``k = 1/(n - 1)``).  In the variable
  ``c = -a t`` with ``t = tau - max(s) + z0``, the largest score's base is ``c``
  itself, so nothing cancels when ``c`` is small (wide supports, steep links);
* ``"general"``: anything else.

The shape is read off the derivation: ``d log g / dz`` is ``a`` (exponential) or
``k / (z - z0)`` (power), and the candidate form is then checked against the
link at 40 digits for every parameter sample.
"""

from __future__ import annotations

import sympy as sp

from .regularizers import Regularizer, z

__all__ = ["LinkForm", "classify_link", "FORMS"]

#: The shapes, in the order they are tried.
FORMS = ("exp", "power", "general")

# points z - z0 (power) or z (exp) where the candidate form is checked
_OFFSETS = tuple(sp.Rational(v) for v in ("1e-30", "1e-6", "0.01", "0.3", "1", "2.5", "7"))


class LinkForm:
    """``form`` (one of :data:`FORMS`) and, for ``"power"``, ``scale`` ``a`` and ``exponent`` ``k``;
    for ``"exp"``, ``scale`` is the rate ``a``.  The coefficients are SymPy expressions in the parameters."""

    __slots__ = ("form", "scale", "exponent")

    def __init__(self, form: str, scale: sp.Expr | None = None, exponent: sp.Expr | None = None):
        if form not in FORMS:
            raise ValueError(f"link form must be one of {FORMS}, got {form!r}")
        self.form, self.scale, self.exponent = form, scale, exponent

    def __repr__(self) -> str:
        return f"LinkForm({self.form!r}, scale={self.scale}, exponent={self.exponent})"

    def __eq__(self, other) -> bool:
        return isinstance(other, LinkForm) and (self.form, self.scale, self.exponent) == (other.form, other.scale, other.exponent)

    def __hash__(self) -> int:
        return hash((self.form, self.scale, self.exponent))


GENERAL = LinkForm("general")


def _simplify(reg: Regularizer, expr: sp.Expr) -> sp.Expr:
    """``expr`` simplified with the parameters' domains assumed."""
    assumed, back = reg.assumed(expr)
    return sp.simplify(sp.powsimp(sp.simplify(assumed), force=True)).subs(back)


def _holds(reg: Regularizer, link: sp.Expr, candidate: sp.Expr, points) -> bool:
    """Whether ``candidate`` equals ``link`` to 30 digits at the exact points ``points(values)`` for every
    parameter sample (substituted exactly and evaluated by SymPy to 40 digits: near ``z0`` a
    printed link such as ``(3 z + 4)**2 / 36`` cancels at any fixed working precision)."""
    for values in reg.parameter_samples():
        for at in points(values):
            sub = {z: at, **values}
            try:
                want, got = sp.N(link.subs(sub), 40), sp.N(candidate.subs(sub), 40)
            except (ZeroDivisionError, ValueError, OverflowError, TypeError):
                return False
            if not (want.is_real and got.is_real and want.is_finite and got.is_finite):
                return False
            if not abs(got - want) <= sp.Float(10, 40) ** -30 * abs(want):
                return False
    return True


def _positive(reg: Regularizer, expr: sp.Expr) -> bool:
    for values in reg.parameter_samples():
        value = sp.N(expr.subs(values), 30)
        if not (value.is_real and value > 0):
            return False
    return True


def classify_link(reg: Regularizer, link: sp.Expr | None, clip: sp.Expr, sparse: bool) -> LinkForm:
    """The :class:`LinkForm` of ``link`` (``g(z)``, unclipped) for a map with ``omega'(0+) = clip``."""
    if link is None or link.has(sp.I):
        return GENERAL
    try:
        dlog = _simplify(reg, sp.diff(sp.log(link), z))
    except (TypeError, ValueError, NotImplementedError, RecursionError):
        return GENERAL
    if dlog == 0:
        return GENERAL
    if not dlog.has(z):
        # g = C exp(a z): check g(z) exp(a (z1 - z)) = g(z1) at z1 = 0
        rate = dlog
        candidate = link.subs(z, 0) * sp.exp(rate * z)
        points = lambda _values: _OFFSETS + tuple(-v for v in _OFFSETS)  # noqa: E731
        if _positive(reg, rate) and _holds(reg, link, candidate, points):
            return LinkForm("exp", scale=rate)
        return GENERAL
    if not sparse:
        return GENERAL
    # g = (a (z - z0))**k: 1 / (d log g / dz) = (z - z0) / k is affine in z with root z0 = omega'(0+)
    try:
        poly = sp.Poly(sp.cancel(sp.together(1 / dlog)), z)
    except (sp.PolynomialError, sp.GeneratorsNeeded):
        return GENERAL
    if poly.degree() != 1:
        return GENERAL
    c1, c0 = poly.all_coeffs()
    exponent = _simplify(reg, 1 / c1)
    z0 = _simplify(reg, -c0 / c1)
    if _simplify(reg, z0 - clip) != 0:
        return GENERAL
    scale = _simplify(reg, link.subs(z, clip + 1) ** (1 / exponent))  # g(z0 + 1) = a**k
    if scale.has(z) or not (_positive(reg, scale) and _positive(reg, exponent)):
        return GENERAL
    candidate = (scale * (z - clip)) ** exponent

    def points(values):
        return [clip.subs(values) + v for v in _OFFSETS]

    if _holds(reg, link, candidate, points):
        return LinkForm("power", scale=scale, exponent=exponent)
    return GENERAL
