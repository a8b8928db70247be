"""Regularized argmax on the simplex, derived from the KKT conditions.

For scores ``s`` in R^d and a separable strictly convex regularizer
``Omega(p) = sum_i omega(p_i)`` (a :class:`~derive.regularizers.Regularizer`),

    p*(s) = argmax_{p in simplex} <p, s> - Omega(p).

The Lagrangian ``<p, s> - Omega(p) - tau (1^T p - 1) + mu^T p`` gives

* stationarity ``omega'(p_i) = s_i - tau + mu_i`` with ``mu_i >= 0`` and
  complementary slackness ``mu_i p_i = 0``;
* on the support, ``p_i = g(s_i - tau)`` with the link ``g = (omega')^{-1}``;
  off it, ``s_i - tau <= omega'(0+)``, so ``p_i = 0``.  The map is sparse
  exactly when ``omega'(0+)`` is finite;
* the threshold ``tau`` is the root of ``sum_i g_+(s_i - tau) = 1``, bracketed
  by ``[max(s) - omega'(1), max(s) - omega'(1/d)]``;
* differentiating the KKT system, the Jacobian on the support is
  ``J = diag(w) - w w^T / sum(w)`` with ``w_i = g'(z_i) = 1/omega''(p_i)``;
* the convex conjugate is ``Omega*(s) = tau + sum_i omega*_+(s_i - tau)``
  with the scalar conjugate ``omega*(z) = z g(z) - omega(g(z))``, and the
  Fenchel-Young loss ``Omega*(s) + Omega(y) - <s, y>`` has gradient
  ``p*(s) - y``.

:func:`derive_map` carries out these steps with SymPy (``solve`` for the link,
``limit`` for ``omega'(0+)``, polynomial algebra for the sort-based threshold)
and returns a :class:`~derive.derivation.Derivation`.
"""

from __future__ import annotations

import math
import threading
from dataclasses import replace
from typing import Any

import mpmath
import sympy as sp

from ._linkform import classify_link
from ._timelimit import TimeLimit
from .derivation import Derivation, Inversion, Threshold
from .errors import DerivationError, DerivationTimeout
from .family import stated_cases
from .regularizers import Regularizer, describe, p, sympy_failure, to_mpf, z
from .symbols import S, S1, S2, d, i, k, s, s_k, s_max, s_min, score, tau, y

__all__ = [
    "derive_map",
    "s",
    "y",
    "tau",
    "i",
    "d",
    "k",
    "s_max",
    "s_min",
    "S",
    "S1",
    "S2",
]

_ELEMENTARY = (sp.exp, sp.log)
# seconds one SymPy solve or limit may take before the derivation falls back or gives up;
# the whole derivation is bounded separately (the timeout of derive_map)
_SOLVE_SECONDS = 20.0


# ------------------------------------------------------------- utilities
def _mp_function(expr: sp.Expr, args: list[sp.Symbol]):
    return sp.lambdify(args, expr, modules="mpmath")


def _close(a: Any, b: Any, rel: float = 1e-12) -> bool:
    try:
        return abs(a - b) <= rel * max(1, abs(b))
    except TypeError:
        return False


def _is_infinite(expr: sp.Expr) -> bool:
    return expr in (sp.oo, -sp.oo, sp.zoo) or expr.has(sp.oo, -sp.oo, sp.zoo)


def _nested_radical(expr: sp.Expr) -> bool:
    """True if a fractional power has a base holding another fractional power (Cardano-like)."""
    for node in sp.preorder_traversal(expr):
        if isinstance(node, sp.Pow) and not node.exp.is_integer:
            for inner in sp.preorder_traversal(node.base):
                if inner is not node and isinstance(inner, sp.Pow) and not inner.exp.is_integer and inner.base.has(z):
                    return True
    return False


def _param_args(reg: Regularizer, values: dict) -> list:
    return [to_mpf(values[q.symbol]) for q in reg.parameters]


def _limit_at_zero(reg: Regularizer, expr: sp.Expr, what: str) -> sp.Expr:
    assumed, back = reg.assumed(expr)
    try:
        value = TimeLimit(_SOLVE_SECONDS, f"finding {what}").run(sp.limit, assumed, p, 0, "+")
    except DerivationTimeout:
        raise DerivationError(
            f"cannot find {what} = lim_(p->0+) of {describe(expr)}: SymPy's limit took longer than {_SOLVE_SECONDS:g} s"
        ) from None
    except (NotImplementedError, ValueError, TypeError) as exc:
        raise DerivationError(f"cannot find {what} = lim_(p->0+) of {describe(expr)}: {type(exc).__name__}") from None
    if value.has(sp.Limit, sp.sign, sp.AccumBounds):
        raise DerivationError(f"cannot decide {what} = lim_(p->0+) of {describe(expr)}: SymPy returned {describe(value)}")
    return sp.simplify(value.subs(back))


def _limit_at_one(reg: Regularizer, expr: sp.Expr) -> sp.Expr:
    """``expr``'s limit as ``p -> 1-`` (the regularizer's checks found it finite for ``omega``)."""
    assumed, back = reg.assumed(expr)
    return sp.simplify(TimeLimit(_SOLVE_SECONDS, "finding omega(1-)").run(sp.limit, assumed, p, 1, "-").subs(back))


# -------------------------------------------------------------- the steps
def _invert(reg: Regularizer, d1: sp.Expr, d2: sp.Expr) -> Inversion:
    newton_step = sp.simplify(p - (d1 - z) / d2)
    bracket = (sp.Integer(0), sp.Integer(1))
    # omega' a polynomial of which no root is a closed form worth printing: decided from its coefficients, before
    # SymPy's solve spends seconds (a cubic with parameters) or its whole time limit (a quartic in sqrt(p)) writing
    # Cardano's or Ferrari's radicals only for them to be refused below
    cubic = _monotone_cubic_root(reg, d1)
    if cubic is not None and _verify_branch(reg, d1, cubic):
        return Inversion("closed", cubic, (), newton_step, bracket, _HYPERBOLIC)
    nested = _nested_polynomial_root(d1)
    if nested is not None:
        return Inversion("newton", None, (), newton_step, bracket, nested)
    candidates: list[sp.Expr] = []
    failure = ""
    try:
        candidates = list(TimeLimit(_SOLVE_SECONDS, "inverting omega'").run(sp.solve, sp.Eq(d1, z), p))
    except DerivationTimeout:
        failure = f"SymPy's solve took longer than {_SOLVE_SECONDS:.0f} s"
    except (NotImplementedError, ValueError, TypeError) as exc:
        failure = f"SymPy's solve cannot invert omega'(p) = z ({type(exc).__name__})"
    chosen = None
    for cand in candidates:
        if _verify_branch(reg, d1, cand):
            chosen = cand
            break
    if chosen is None:
        reason = failure or (
            "SymPy finds no closed-form inverse of omega'(p) = z that holds on (0, 1]"
            if not candidates
            else f"none of SymPy's {len(candidates)} solutions of omega'(p) = z is the real branch on (0, 1]"
        )
        return Inversion("newton", None, (), newton_step, bracket, reason + "; the numeric side solves omega'(p) = z by safeguarded Newton")
    special = tuple(
        sorted(
            {type(f).__name__ for f in chosen.atoms(sp.Function) if not isinstance(f, _ELEMENTARY)}
        )
    )
    if special:
        reason = (
            f"the inverse needs {', '.join(special)}, which C99 and NumPy lack; "
            "the numeric side solves omega'(p) = z by safeguarded Newton"
        )
        return Inversion("newton", chosen, special, newton_step, bracket, reason)
    if chosen.has(sp.I) or _nested_radical(chosen):
        reason = (
            "the inverse is a root of a polynomial of degree >= 3 (nested radicals, "
            "Cardano-like), which cancels catastrophically in floating point; "
            "the numeric side solves omega'(p) = z by safeguarded Newton"
        )
        return Inversion("newton", chosen, (), newton_step, bracket, reason)
    return Inversion("closed", chosen, (), newton_step, bracket, "SymPy's solve gives an elementary inverse")


_HYPERBOLIC = ("omega' is a cubic without a square term, increasing everywhere: its one real root in the hyperbolic "
               "form, which has no cancellation (Cardano's nested radicals have)")


def _nested_polynomial_root(d1: sp.Expr) -> str | None:
    """Why the link is left to Newton, where ``omega'`` is a polynomial of degree ``n >= 4`` in ``t = p**(1/q)``
    (``q`` the least common denominator of ``p``'s rational exponents) that is not ``a (t + b)**n + c``; else
    ``None``.  Such a root is Ferrari's nested radicals (``n = 4``) or no radicals at all (``n >= 5``, where SymPy
    gives ``CRootOf``): only the shifted power's root ``t = ((z - c)/a)**(1/n) - b`` nests no radical, and a
    composition of smaller polynomials nests one root in another.  A coefficient that may vanish for some value of
    a parameter leaves the question to SymPy's solve (``None``)."""
    exponents = [power.exp for power in d1.atoms(sp.Pow) if power.base == p]
    if not all(e.is_Rational for e in exponents):
        return None
    q = math.lcm(1, *(int(sp.Rational(e).q) for e in exponents))
    t = sp.Dummy("t", positive=True)
    try:
        poly = sp.Poly(sp.expand(d1.subs(p, t**q)), t)
    except sp.PolynomialError:
        return None
    n = poly.degree()
    if n < 4 or poly.free_symbols_in_domain & {z}:
        return None
    coeffs = poly.all_coeffs()
    shift = coeffs[1] / (n * coeffs[0])
    rest = sp.Poly(sp.expand(poly.as_expr() - coeffs[0] * (t + shift) ** n), t)
    if not any(sp.simplify(c).is_zero is False for c in rest.all_coeffs()[:-1] if rest.degree() > 0):
        return None
    root = "p" if q == 1 else f"p**(1/{q})"
    return (f"the inverse is a root of a polynomial of degree {n} in {root} that is not a shifted power "
            f"({'nested radicals' if n == 4 else 'no radicals'}), which cancels catastrophically in floating point; "
            "the numeric side solves omega'(p) = z by safeguarded Newton")


def _monotone_cubic_root(reg: Regularizer, d1: sp.Expr) -> sp.Expr | None:
    """The inverse of ``omega'(p) = a p**3 + c p + e`` with ``a > 0`` and ``c > 0`` (for every parameter value), in
    the hyperbolic form of the one real root of ``p**3 + P p = q`` (``P = c/a``, ``q = (z - e)/a``):

        ``p = 2 sqrt(P/3) sinh(asinh(3 q sqrt(3/P) / (2 P)) / 3)``

    (``sinh(3u) = 3 sinh(u) + 4 sinh(u)**3``).  Each function keeps its relative accuracy, near ``p = 0`` too, where
    Cardano's two cube roots cancel.  ``None`` for any other ``omega'``: a square term would shift ``p`` by
    ``b / (3a)``, which cancels near 0 again, and a cubic that turns has three real roots for some ``z``.
    """
    try:
        poly = sp.Poly(d1, p)
    except sp.PolynomialError:
        return None
    if poly.degree() != 3 or poly.free_symbols_in_domain & {z}:
        return None
    a, b, c, e = poly.all_coeffs()
    if not sp.simplify(b).is_zero:
        return None
    for coefficient in (a, c):
        if reg.assumed(coefficient)[0].is_positive is not True:
            return None
    scale = c / a
    q = (z - e) / a
    return 2 * sp.sqrt(scale / 3) * sp.sinh(sp.asinh(3 * q * sp.sqrt(3 / scale) / (2 * scale)) / 3)


def _verify_branch(reg: Regularizer, d1: sp.Expr, cand: sp.Expr) -> bool:
    """Check ``cand(omega'(p0)) == p0`` at points of (0, 1] for every parameter sample."""
    symbols = [p] + [q.symbol for q in reg.parameters]
    f1 = _mp_function(d1, symbols)
    g = _mp_function(cand, [z] + symbols[1:])
    with mpmath.workdps(120):
        for values in reg.parameter_samples():
            args = _param_args(reg, values)
            for p0 in ("1e-6", "0.001", "0.05", "0.2", "0.5", "0.8", "0.999" if reg.ends_at_one else "1"):
                p0 = mpmath.mpf(p0)
                try:
                    value = g(f1(p0, *args), *args)
                except (ZeroDivisionError, ValueError, OverflowError, TypeError):
                    return False
                if not _close(value, p0, 1e-20):
                    return False
    return True


def _clip_and_sparsity(reg: Regularizer, d1: sp.Expr) -> tuple[sp.Expr, bool]:
    clip = _limit_at_zero(reg, d1, "omega'(0+)")
    if clip == sp.oo:
        raise DerivationError(f"omega'(0+) = +oo for omega'(p) = {d1}: omega is not convex near 0")
    sparse = not _is_infinite(clip)
    return clip, sparse


def _threshold(reg: Regularizer, d1, inversion: Inversion, clip, sparse, w) -> Threshold:
    link = inversion.closed_form
    gplus = sp.Function("g_+")
    equation = sp.Eq(sp.Sum(gplus(s[i] - tau), (i, 1, d)), 1)
    at_uniform = sp.simplify(d1.subs(p, 1 / d))
    if reg.ends_at_one:
        # omega'(1) = +oo: each g(s_i - tau) >= 1/d at tau = min(s) - omega'(1/d)
        bracket = (s_min - at_uniform, s_max - at_uniform)
    else:
        one = sp.simplify(d1.subs(p, 1))
        if _is_infinite(one):
            raise DerivationError(f"omega'(1) = {one} is not finite: the threshold bracket does not exist")
        bracket = (s_max - one, s_max - at_uniform)
    dlink = w
    d2link = sp.simplify(sp.diff(w, p) * w)
    common = dict(equation=equation, bracket=bracket, dlink=dlink, d2link=d2link)
    if link is not None:
        common["dlink_z"] = sp.simplify(sp.diff(link, z))
        common["d2link_z"] = sp.simplify(sp.diff(link, z, 2))

    if link is not None and not sparse:
        closed = _closed_threshold(reg, link)
        if closed is not None:
            term, solution = closed
            explicit = solution.subs(S, sp.Sum(term.subs(score, s[i]), (i, 1, d)))
            return Threshold("closed", term=term, solution=solution, explicit=explicit, **common)

    if link is not None and sparse:
        try:
            poly = sp.Poly(link, z)
        except sp.PolynomialError:
            poly = None
        if poly is not None and poly.degree() in (1, 2):
            return _sort_threshold(reg, link, poly.degree(), clip, d1, common)

    return Threshold("root", **common)


def _closed_threshold(reg: Regularizer, link: sp.Expr):
    """``g(s - tau) = A(tau) B(s)``: then ``tau`` solves ``A(tau) S = 1`` with ``S = sum B(s_i)``."""
    at_zero = sp.expand(link.subs(z, score), power_exp=True, mul=True, log=False)
    _, term = at_zero.as_independent(score, as_Add=False)
    if not term.has(score):
        return None
    factor = sp.simplify(sp.powsimp(link.subs(z, score - tau) / term, force=True))
    if factor.has(score):
        return None
    try:
        roots = TimeLimit(_SOLVE_SECONDS, "solving for the threshold").run(sp.solve, sp.Eq(factor * S, 1), tau)
    except (DerivationTimeout, NotImplementedError, ValueError, TypeError):
        return None
    # keep the real root that satisfies A(tau) S = 1 at sample values of S
    for root in roots:
        ok = True
        for values in reg.parameter_samples():
            for s_value in (sp.Rational(1, 3), 2, 17):
                sub = {S: s_value, **values}
                check = (factor.subs(tau, root.subs(sub)).subs(values) * s_value).evalf(30)
                if not (check.is_real and abs(check - 1) < 1e-20):
                    ok = False
        if ok:
            return sp.simplify(term), sp.simplify(root)
    return None


def _sort_threshold(reg, link, degree, clip, d1, common) -> Threshold:
    """Sum of the link over the ``k`` largest scores as a polynomial in ``tau``."""
    expanded = sp.Poly(sp.expand(link.subs(z, score - tau)), score)
    power_sums = {0: k, 1: S1, 2: S2}
    total = sp.expand(sum(c * power_sums[m] for (m,), c in expanded.terms()))
    roots = sp.solve(sp.Eq(total, 1), tau)
    discriminant = None
    if degree == 2:
        poly = sp.Poly(total - 1, tau)
        a2, a1, a0 = poly.all_coeffs()
        discriminant = sp.factor(sp.expand((a1**2 - 4 * a2 * a0) / k**2))
    # with two equal scores 0, 0 the threshold is tau = -omega'(1/2)
    chosen = None
    for root in roots:
        good = True
        for values in reg.parameter_samples():
            got = root.subs({k: 2, S1: 0, S2: 0}).subs(values).evalf(30)
            want = (-d1.subs(p, sp.Rational(1, 2))).subs(values).evalf(30)
            if not (got.is_real and abs(got - want) < 1e-20):
                good = False
        if good:
            chosen = sp.simplify(root)
            break
    if chosen is None:
        raise DerivationError(f"no root of sum g(s_j - tau) = 1 for link {link} is the decreasing branch")
    condition = sp.StrictGreaterThan(s_k - tau, clip)
    return Threshold(
        "sort", degree=degree, candidate=chosen, discriminant=discriminant, condition=condition, **common
    )


def _on_domain(reg: Regularizer, expr: sp.Expr, clip: sp.Expr, sparse: bool) -> sp.Expr:
    """Simplify ``expr(z)`` knowing ``z`` lies where the link is used.

    On the support of a sparse map ``z > omega'(0+)``; for a dense map
    ``z <= omega'(1)`` (anywhere where omega's domain ends at 1).  Writing ``z`` as ``clip + v`` or ``omega'(1) - v`` with
    ``v > 0`` lets SymPy drop the ``Abs`` that powers of the link produce.
    """
    if not sparse and reg.ends_at_one:  # (z ranges over the whole line)
        assumed, back = reg.assumed(expr)
        return sp.simplify(sp.simplify(assumed).subs(back))
    v = sp.Dummy("v", positive=True)
    edge = clip if sparse else reg.first_derivative.subs(p, 1)
    shifted = edge + v if sparse else edge - v
    assumed, back = reg.assumed(expr.subs(z, shifted))
    simple = sp.simplify(sp.powdenest(sp.simplify(assumed), force=False))
    edge_assumed, _ = reg.assumed(edge)
    return sp.simplify(simple.subs(v, (z - edge_assumed) if sparse else (edge_assumed - z)).subs(back))


def _conjugates(reg: Regularizer, inversion: Inversion, threshold: Threshold, clip, sparse, omega0):
    g = inversion.closed_form
    if g is None or g.has(sp.I) or _nested_radical(g):
        return None, None, None
    scalar = _on_domain(reg, z * g - reg.omega.subs(p, g), clip, sparse)
    zi = s[i] - tau
    if sparse:
        term = sp.Piecewise((scalar.subs(z, zi), zi > clip), (-omega0, True))
    else:
        term = scalar.subs(z, zi)
    conjugate = tau + sp.Sum(term, (i, 1, d))
    if threshold.kind == "closed":
        # Omega* = tau + sum_i omega*(z_i); when omega* = c g the sum is c (sum_i g = 1)
        ratio = sp.simplify(scalar / g)
        sum_expr = sp.Sum(threshold.term.subs(score, s[i]), (i, 1, d))
        if not ratio.has(z):
            conjugate = sp.simplify(threshold.solution + ratio).subs(S, sum_expr)
        else:
            conjugate = conjugate.subs(tau, threshold.solution).subs(S, sum_expr)
    loss = conjugate + sp.Sum(reg.omega.subs(p, y[i]), (i, 1, d)) - sp.Sum(s[i] * y[i], (i, 1, d))
    return scalar, conjugate, loss


def derive_map(reg: Regularizer, *, timeout: float | None = None) -> Derivation:
    """Derive the regularized-argmax map of ``reg`` from the KKT conditions.

    The derivations of the last 64 regularizers are kept: deriving an equal
    regularizer again returns the same derivation, on the caller's
    regularizer (``derive.argmax.forget_derivations()`` empties them).

    Parameters
    ----------
    reg:
        A :class:`~derive.regularizers.Regularizer` (its constructor has
        already checked strict convexity and the symbols it uses).
    timeout:
        Seconds allowed for the whole derivation: ``None`` (the default) reads
        the environment variable ``REGATTN_TIMEOUT``, else 60 s
        (:data:`derive.DEFAULT_TIMEOUT`); ``math.inf`` means no limit.  Single
        SymPy ``solve`` calls get at most 20 s of it, after which the link or
        the threshold falls back to a numeric method.

    Returns
    -------
    Derivation
        Link, inversion method, clipping rule, weight, threshold, conjugate
        and Fenchel-Young loss; :meth:`Derivation.evaluate` computes ``p*(s)``
        at high precision and :meth:`Derivation.latex` prints the steps.

    Raises
    ------
    DerivationError
        If ``omega'(0+)`` or ``omega'(1)`` cannot be decided or is not usable
        (``omega'(1)`` must be finite for the threshold bracket), or SymPy
        fails on the expression; the message is one line.
    DerivationTimeout
        (a :class:`DerivationError`) if the derivation takes longer than
        ``timeout``.

    Examples
    --------
    >>> from derive import derive_map, gini
    >>> dv = derive_map(gini())
    >>> dv.link, dv.weight, dv.sparse, dv.threshold.kind
    (z, 1, True, 'sort')
    """
    if not isinstance(reg, Regularizer):
        raise DerivationError(f"derive_map expects a Regularizer, got {type(reg).__name__}")
    with _DERIVED_LOCK:
        known = _DERIVED.pop(reg, None)
        if known is not None:
            _DERIVED[reg] = known  # (the most recent last)
    if known is None:
        limit = TimeLimit(timeout, f"deriving the map of omega(p) = {describe(reg.omega)}")
        # in a child process killed at the deadline (a single SymPy call into C can outlast it by minutes)
        known = limit.run_isolated(_derive, reg)
        with _DERIVED_LOCK:
            _DERIVED[reg] = known
            while len(_DERIVED) > _KEPT:
                del _DERIVED[next(iter(_DERIVED))]
    # (the child's copy of reg, or an equal one derived before: the caller's own object)
    return known if known.regularizer is reg else replace(known, regularizer=reg)


#: the derivations of the last :data:`_KEPT` regularizers, by regularizer (equal ones are the same work: the same
#: omega, name and parameters), the most recently used last: the same regularizer is derived once in a process
#: (a family's cases, a generated module checked after it is written, a notebook's cell run again)
_DERIVED: dict[Regularizer, Derivation] = {}
_KEPT = 64
_DERIVED_LOCK = threading.Lock()


def forget_derivations() -> None:
    """Derive every regularizer afresh from now on (:func:`derive_map` keeps the last derivations)."""
    with _DERIVED_LOCK:
        _DERIVED.clear()


def _derive(reg: Regularizer) -> Derivation:
    try:
        return _derive_steps(reg)
    except DerivationError:
        raise
    except Exception as exc:
        # SymPy raises TypeError, ValueError, RecursionError, ... on expressions it cannot handle
        raise DerivationError(
            f"cannot derive the map of omega(p) = {describe(reg.omega)}: {sympy_failure(exc)}"
        ) from exc


def _derive_steps(reg: Regularizer) -> Derivation:
    cases = stated_cases(reg)
    if cases:
        raise DerivationError(cases)
    d1, d2 = reg.first_derivative, reg.second_derivative
    clip, sparse = _clip_and_sparsity(reg, d1)
    omega0 = _limit_at_zero(reg, reg.omega, "omega(0+)")
    omega1 = _limit_at_one(reg, reg.omega) if reg.ends_at_one else None
    weight = sp.powsimp(sp.simplify(1 / d2), force=True)
    inversion = _invert(reg, d1, d2)
    if inversion.method == "closed":
        inversion = replace(inversion, form=classify_link(reg, inversion.closed_form, clip, sparse))
    threshold = _threshold(reg, d1, inversion, clip, sparse, weight)
    scalar, conjugate, loss = _conjugates(reg, inversion, threshold, clip, sparse, omega0)
    return Derivation(
        regularizer=reg,
        omega=reg.omega,
        omega_prime=d1,
        omega_second=d2,
        link=inversion.closed_form,
        inversion=inversion,
        clip=clip,
        sparse=sparse,
        omega_zero=omega0,
        weight=weight,
        threshold=threshold,
        scalar_conjugate=scalar,
        conjugate=conjugate,
        loss=loss,
        loss_gradient=sp.IndexedBase("p")[i] - y[i],
        convexity=reg.convexity,
        omega_one=omega1,
    )
