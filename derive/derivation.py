"""The record of a derivation: what :func:`~derive.argmax.derive_map` found for one regularizer.

:class:`Derivation` holds the regularizer, its derivatives, the link and how it
is computed (:class:`Inversion`), the clip, the weight, the threshold rule
(:class:`Threshold`), the conjugate and the Fenchel-Young loss, all as SymPy
expressions in the symbols of :mod:`derive.symbols` and :mod:`derive.regularizers`.
Every consumer reads it: the reference (:mod:`derive.reference`), the renderer
(:mod:`derive._render`), code generation (:mod:`derive.codegen`) and the checks.
Its methods are views through the first two: :meth:`Derivation.evaluate` is
:func:`derive.reference.evaluate`, :meth:`Derivation.latex`, :meth:`Derivation.markdown`
and :meth:`Derivation.pretty` the renderer's texts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mpmath
import sympy as sp

from ._linkform import GENERAL, LinkForm
from ._render import render_latex, render_markdown, render_text
from .reference import evaluate
from .regularizers import Regularizer
from .symbols import score

__all__ = ["Derivation", "Inversion", "Threshold"]


@dataclass(frozen=True)
class Inversion:
    """How the link ``g = (omega')^{-1}`` is computed.

    Attributes
    ----------
    method:
        ``"closed"``: :attr:`closed_form` is elementary and numerically safe,
        the numeric side prints it.  ``"newton"``: the numeric side solves
        ``omega'(p) = z`` for ``p`` in ``(0, 1]`` by Newton's method with a
        bisection safeguard (:attr:`newton_step` is one step).
    closed_form:
        ``g(z)`` as SymPy found it, also when it is not used numerically
        (a LambertW, Cardano's formula), else ``None`` (also where ``omega'``
        is a polynomial of degree 4 or more in a root of ``p``, not a shifted
        power, whose roots are not asked for).
    special:
        Names of non-elementary functions in :attr:`closed_form`.
    newton_step:
        ``p - (omega'(p) - z) / omega''(p)``.
    bracket:
        Interval of ``p`` that holds the root for every ``z`` in the
        threshold bracket: ``(0, 1)``.
    reason:
        One sentence on why this method was chosen.
    form:
        The link's shape (:class:`~derive._linkform.LinkForm`): ``"exp"``
        (``C exp(a z)``), ``"power"`` (``(a (z - omega'(0+)))**k``) or
        ``"general"``, read off :attr:`closed_form`; the numeric backends
        dispatch on it.
    """

    method: str
    closed_form: sp.Expr | None
    special: tuple[str, ...]
    newton_step: sp.Expr
    bracket: tuple[sp.Expr, sp.Expr]
    reason: str
    form: LinkForm = GENERAL


@dataclass(frozen=True)
class Threshold:
    """The threshold ``tau``: its equation, its bracket and how to solve it.

    Attributes
    ----------
    kind:
        ``"closed"`` (``tau = solution(S)`` with ``S = sum_i term(s_i)``),
        ``"sort"`` (the support rule on sorted scores: ``tau_k = candidate`` in
        ``k, S_1, S_2`` and the largest ``k`` with ``condition``) or ``"root"``
        (a bracketed root of :attr:`equation`, by Halley's method).
    equation:
        ``sum_i g_+(s_i - tau) = 1`` with ``g_+`` the clipped link.
    bracket:
        ``(max(s) - omega'(1), max(s) - omega'(1/d))`` in :data:`s_max`, :data:`d`.
    term, solution, explicit:
        Closed kind: ``B(s)``, ``tau`` as a function of :data:`S`, and ``tau``
        with ``S`` written out as ``Sum(B(s[i]), (i, 1, d))``.
    degree, candidate, discriminant, condition:
        Sort kind: degree of the link in ``tau``, ``tau_k``, the quantity that
        must be ``>= 0`` for ``tau_k`` to be real (``None`` for degree 1), and
        ``s_(k) - tau_k > omega'(0+)``.
    dlink, d2link:
        ``g'(z)`` and ``g''(z)`` written in ``p = g(z)``: ``w(p)`` and
        ``w'(p) w(p)``; the derivatives of ``g(s - tau)`` in ``tau`` are
        ``-g'`` and ``g''`` (what Halley's method needs).
    dlink_z, d2link_z:
        The same in ``z`` when the link has a closed form, else ``None``.
    """

    kind: str
    equation: sp.Eq
    bracket: tuple[sp.Expr, sp.Expr]
    dlink: sp.Expr
    d2link: sp.Expr
    dlink_z: sp.Expr | None = None
    d2link_z: sp.Expr | None = None
    term: sp.Expr | None = None
    solution: sp.Expr | None = None
    explicit: sp.Expr | None = None
    degree: int | None = None
    candidate: sp.Expr | None = None
    discriminant: sp.Expr | None = None
    condition: sp.Expr | None = None

    @property
    def term_is_exp(self) -> bool:
        """Whether the closed kind's ``B(s)`` is ``exp(s)`` itself, so that its printed routine is the array module's ``exp``."""
        return self.kind == "closed" and self.term == sp.exp(score)


@dataclass(frozen=True, eq=False)
class Derivation:
    """Everything :func:`derive_map` found for one regularizer.

    Attributes
    ----------
    regularizer:
        The :class:`~derive.regularizers.Regularizer` it came from.
    omega, omega_prime, omega_second:
        ``omega(p)``, ``omega'(p)``, ``omega''(p)``.
    link:
        The link ``g(z)``, ``z = s - tau``, unclipped branch, as SymPy found it
        (possibly with LambertW or nested radicals); ``None`` when there is no
        closed form.  :attr:`inversion` says how the numeric side computes it.
    inversion:
        :class:`Inversion`: closed form or Newton solve.
    clip:
        ``omega'(0+)``: ``p_i = 0`` where ``s_i - tau <= clip``; ``-oo`` when dense.
    sparse:
        Whether ``clip`` is finite.
    omega_zero:
        ``omega(0+)``, the value of a coordinate outside the support.
    weight:
        ``w(p) = 1/omega''(p)``; Jacobian ``diag(w) - w w^T / sum(w)`` on the support.
    threshold:
        :class:`Threshold`.
    scalar_conjugate:
        ``omega*(z) = z g(z) - omega(g(z))`` (unclipped), or ``None``.
    conjugate:
        ``Omega*(s)``: explicit in ``s[i]`` for a closed threshold, otherwise in
        ``s[i]`` and ``tau`` (``tau`` being the threshold); ``None`` when the
        link has no closed form.
    loss:
        Fenchel-Young loss ``Omega*(s) + sum_i omega(y_i) - sum_i s_i y_i`` or ``None``.
    loss_gradient:
        ``p*_i(s) - y_i`` (Danskin), with ``p[i]`` standing for ``p*(s)_i``.
    convexity:
        How strict convexity was established.
    omega_one:
        ``omega(1-)`` where omega's domain ends at 1 (``omega'(1-) = +oo``, the binary entropy), the value of a
        coordinate at 1 that the formula leaves undefined; ``None`` where ``omega(1)`` is the formula's own value.
    """

    regularizer: Regularizer
    omega: sp.Expr
    omega_prime: sp.Expr
    omega_second: sp.Expr
    link: sp.Expr | None
    inversion: Inversion
    clip: sp.Expr
    sparse: bool
    omega_zero: sp.Expr
    weight: sp.Expr
    threshold: Threshold
    scalar_conjugate: sp.Expr | None
    conjugate: sp.Expr | None
    loss: sp.Expr | None
    loss_gradient: sp.Expr
    convexity: str
    omega_one: sp.Expr | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.regularizer.name

    @property
    def parameters(self) -> tuple:
        return self.regularizer.parameters

    def evaluate(self, scores: Any, digits: int = 50, **params: Any) -> list[mpmath.mpf]:
        """``p*(s)`` at ``digits`` significant digits with mpmath, from the KKT conditions; the values print at
        mpmath's global precision (15 digits by default), ``mpmath.nstr(v, digits)`` shows them in full.

        See :func:`derive.reference.evaluate`.
        """
        return evaluate(self, scores, digits=digits, **params)

    def latex(self) -> str:
        """The derivation, step by step, as LaTeX (an ``align*``-free fragment)."""
        return render_latex(self)

    def markdown(self) -> str:
        """The derivation, step by step, as Markdown with display math (for MyST/MathJax)."""
        return render_markdown(self)

    def pretty(self) -> str:
        """The derivation, step by step, as plain Unicode text."""
        return render_text(self)

    def __str__(self) -> str:
        return self.pretty()
