"""The rewriting of generated code's expressions before they are printed: SymPy expressions to SymPy expressions.

Three passes, each an identity on the reals, which the printers of
:mod:`derive.codegen.printers` run in this order (:func:`~derive.codegen.printers.print_block`):

* :func:`stable_form` rewrites differences that cancel in floating point into
  equivalent forms that do not (see its docstring): ``log(A + sqrt(A**2 + c))``
  becomes ``asinh``, ``A + sqrt(B)`` whose square terms cancel becomes a sign
  select between ``|A| + sqrt(B)`` and its conjugate ``(B - A**2)/(|A| + sqrt(B))``,
  ``log(1 + x)`` becomes ``log1p`` and ``exp(x) - 1`` becomes ``expm1``; a sum
  that cancels near a point where the function is evaluated (``p`` near 0 or 1,
  ``z`` near ``omega'(0+)``) is found by its series there
  (:func:`cancelling_points`) and rewritten by an identity (``cosh(u) - 1 = 2
  sinh(u/2)**2``) or, where none applies, by a series switch
  ``Select(r - |h|, P(h), sum)`` (:func:`series_switch`, :class:`Select`) that
  every printer prints;
* :func:`fold_constants` writes numeric subexpressions (``exp(3)``, ``log(10)``)
  as their values;
* :func:`blocks` eliminates common subexpressions (``sympy.cse`` with numbered
  temporaries ``t0, t1, ...``) and lifts the base of every small integer or
  half-integer power into a temporary of its own, so that a power prints as a
  product of a name with itself (``t2*t2*t2``) or as ``t2*sqrt(t2)``, never
  re-evaluating the base.

Nothing here prints: the node it adds, :class:`Select`, each printer prints in
its own ``_print_Select``.
"""

from __future__ import annotations

from functools import lru_cache

import mpmath
import sympy as sp
from sympy.codegen.cfunctions import expm1, log1p

from ..regularizers import p as _p, singular_points
from ..regularizers import z as _z

__all__ = ["stable_form", "overflow_form", "cancelling_points", "series_switch", "Select", "fold_constants", "blocks", "MAX_PRODUCT",
           "POINTS", "POSITIVE"]

#: Largest integer power written as a product: :func:`blocks` lifts the base of such a power (and of a
#: half-integer power up to ``MAX_PRODUCT + 1/2``) into a temporary, which the printers multiply by itself.
MAX_PRODUCT = 8


class Select(sp.Function):
    """``Select(x, a, b)``: ``a`` where ``x >= 0``, else ``b`` (NumPy evaluates both, C one)."""

    nargs = 3

    def _eval_is_real(self):
        return self.args[1].is_real and self.args[2].is_real


@lru_cache(maxsize=1 << 16)
def _has_root(expr: sp.Expr) -> bool:
    """Whether ``expr`` holds a square root of an expression in symbols."""
    if isinstance(expr, sp.Pow) and expr.exp == sp.S.Half and expr.base.free_symbols:
        return True
    return any(_has_root(a) for a in expr.args)


def _sqrt_split(expr: sp.Add):
    """``expr = A + T`` with ``T`` the one term holding a square root of an expression in symbols, or ``None``."""
    rooted = [t for t in expr.args if _has_root(t)]
    if len(rooted) != 1:
        return None
    (term,) = rooted
    rest = expr - term
    square = sp.expand(term**2)
    if rest == 0 or not rest.free_symbols or _has_root(rest) or _has_root(square):
        return None
    coeff, factors = term.as_coeff_Mul()
    others = [f for f in sp.Mul.make_args(factors) if not (isinstance(f, sp.Pow) and f.exp == sp.S.Half)]
    if not sp.Mul(*others).is_positive:  # the sign of T must be that of its numeric coefficient
        return None
    return rest, term, (1 if coeff > 0 else -1), square


def _total_degree(expr: sp.Expr, symbols) -> int | None:
    try:
        return sp.Poly(expr, *symbols).total_degree()
    except sp.PolynomialError:
        return None


def _conjugate(expr: sp.Add) -> tuple[sp.Expr, sp.Expr, int, sp.Expr] | None:
    """``(A, T, sign, c)`` for ``expr = A + T``, ``T = sign sqrt(...)``, where ``c = T**2 - A**2`` cancels symbolically.

    Cancelling means ``c`` is free of the symbols of ``A`` or, in them, of lower
    total degree than ``A**2`` and ``T**2``: then ``c`` is computed without the
    cancellation that ``A + T`` suffers when ``A`` and ``T`` have opposite signs.
    """
    split = _sqrt_split(expr)
    if split is None:
        return None
    rest, term, sign, square = split
    rest2 = sp.expand(rest**2)
    c = sp.cancel(sp.expand(square - rest2))
    if c.free_symbols & rest.free_symbols:
        symbols = sorted(rest.free_symbols, key=sp.default_sort_key)
        degrees = [_total_degree(e, symbols) for e in (c, rest2, square)]
        if None in degrees or degrees[0] >= max(degrees[1:]):
            return None
    return rest, term, sign, c


def _stable_log(arg: sp.Expr, points=()) -> sp.Expr | None:
    """``log(arg)`` without cancellation: ``asinh`` for ``A + sqrt(A**2 + c)``, ``log1p`` for ``1 + x``, and
    ``log1p(arg - 1)`` where ``arg`` is 1 at one of ``points`` and ``arg - 1`` cancels there (``log(cosh(u))``:
    :func:`_stable` writes ``cosh(u) - 1`` as ``2 sinh(u/2)**2``)."""
    if not arg.is_Add:
        if arg.free_symbols and cancelling_points(sp.expand(arg - 1), points):
            return log1p(arg - 1)
        return None
    conj = _conjugate(arg)
    if conj is not None:
        rest, _, sign, c = conj
        if sign > 0 and c.is_positive:
            # A + sqrt(A^2 + c) = sqrt(c) (u + sqrt(u^2 + 1)) with u = A/sqrt(c)
            return sp.log(c) / 2 + sp.asinh(rest / sp.sqrt(c))
    if sp.S.One in arg.args:
        return log1p(arg - 1)
    return None


def _stable_add(expr: sp.Add) -> sp.Expr:
    """``expm1`` for ``a exp(x) - a``; the sign select of the conjugate for ``A + sqrt(B)``."""
    const = expr.as_coeff_Add()[0]
    if const != 0:
        for term in expr.args:
            coeff, rest = term.as_coeff_Mul()
            if isinstance(rest, sp.exp) and coeff == -const:
                return _stable_add_or_same(expr - term - const + coeff * expm1(rest.args[0]))
    conj = _conjugate(expr)
    if conj is None:
        return expr
    rest, term, sign, c = conj
    # A + T = sign (a + |T|) with a = sign A: |a| + |T| where a >= 0, else (T^2 - A^2)/(|a| + |T|)
    total = sp.Abs(rest) + sign * term
    cond = sign * rest
    factor, unscaled = cond.as_coeff_Mul()
    if factor > 0:
        cond = unscaled  # only the sign of a matters
    return sign * Select(cond, total, c / total)


class _expm1_of_logs(expm1):
    """``expm1`` that stays one: SymPy's own evaluates ``expm1(log(a) + x)`` to ``a exp(x) - 1``
    (``exp`` pulls logarithms out of its argument), the cancellation it is there to avoid.
    Printed as ``expm1`` (the printers look its name up along the class hierarchy)."""

    @classmethod
    def eval(cls, arg):
        return None


_expm1_of_logs.__name__ = "expm1"  # the printers' tables are keyed by the function's name


def _power_difference(expr: sp.Add, positive=frozenset()) -> sp.Expr | None:
    """``-T2 expm1(log r)`` for ``T1 + T2`` with ``r = -T1/T2 > 0`` a product of powers with a symbolic exponent
    (``positive``: symbols known to be positive, parameters declared so).

    ``p**alpha - p = p expm1((alpha - 1) log p)`` and ``alpha p**alpha - p =
    p expm1(log(alpha) + (alpha - 1) log p)``: near ``alpha = 1`` the two terms agree
    to many digits, the logarithm of their ratio does not cancel.
    """
    if len(expr.args) != 2:
        return None
    # T2: a term without a power of symbolic exponent where there is one (r = alpha p**(alpha - 1))
    t1, t2 = sorted(expr.args, key=lambda t: not any(isinstance(f, sp.Pow) and f.exp.free_symbols for f in sp.Mul.make_args(t)))
    r = sp.powsimp(-t1 / t2, force=True)
    symbolic = any(isinstance(f, sp.Pow) and f.exp.free_symbols for f in sp.Mul.make_args(r))
    signs = {x: sp.Dummy(x.name, positive=True) for x in positive}
    if not symbolic or r.xreplace(signs).is_positive is not True:
        return None
    return -t2 * _expm1_of_logs(sp.expand_log(sp.log(r), force=True))


# --------------------------------------------------- sums that cancel where they are evaluated

#: The points where generated functions are evaluated, ``(symbol, points)`` pairs: probabilities ``p`` near 0
#: and near 1, link arguments ``z`` near ``omega'(0+)`` (0 here; the emitter passes the map's own clip).  A sum
#: that vanishes at one of them to a higher order than its terms cancels there (:func:`cancelling_points`).
POINTS = ((_p, (0, 1)), (_z, (0,)))
#: In place of a symbol's points: the symbol is a parameter declared positive, whose sign the rewrites may use
#: (``a p**a - p = p expm1(log(a) + (a - 1) log p)`` needs ``a > 0``).
POSITIVE = "positive"
#: Radii tried for the series switch, and the largest factor by which the direct form may amplify rounding
#: where the series hands over to it: ``SWITCH_GOOD`` is preferred (the fewest terms among those radii),
#: ``SWITCH_LIMIT`` accepted when nothing better converges; at most ``SWITCH_TERMS`` terms.
SWITCH_RADII = tuple(sp.Rational(2) ** k for k in range(-4, 2))
SWITCH_GOOD, SWITCH_LIMIT, SWITCH_TERMS = 5, 16, 30
#: Relative truncation error of the switch's series at its radius: an eighth of float64's unit roundoff.
SWITCH_TRUNCATION = 2.0**-56

_H = sp.Dummy("h", positive=True)
_U = sp.Dummy("u", real=True)


def _plain(expr: sp.Expr) -> sp.Expr:
    """``expr`` in SymPy's own functions (``expm1``, ``log1p`` written out; a :class:`Select` as its second
    branch, which every rewrite makes equal to the first), for series and for mpmath."""
    return expr.replace(lambda e: isinstance(e, Select), lambda e: e.args[2]).replace(
        lambda e: isinstance(e, expm1), lambda e: sp.exp(e.args[0]) - 1).replace(
        lambda e: isinstance(e, log1p), lambda e: sp.log(1 + e.args[0]))


@lru_cache(maxsize=1 << 14)
def _order(expr: sp.Expr, x: sp.Symbol, x0) -> sp.Expr | None:
    """The exponent ``m`` of the leading term ``c h**m`` (``h = x - x0 -> 0+``, powers of ``log h`` aside) of
    ``expr``; ``oo`` for 0, ``None`` where SymPy cannot tell or the exponent is not a number."""
    e = _plain(expr).subs(x, x0 + _H)
    if e == 0:
        return sp.oo
    try:
        lead = e.as_leading_term(_H)
    except Exception:  # noqa: BLE001 - SymPy raises many kinds here: no leading term means no rewrite
        return None
    order = sp.S.Zero
    for factor in sp.Mul.make_args(lead):
        if not factor.has(_H):
            continue
        base, exponent = factor.as_base_exp()
        if base == _H and exponent.is_Rational:
            order += exponent
        elif not (base == sp.log(_H) and exponent.is_number):
            return None
    return order


def cancelling_points(expr: sp.Expr, points=POINTS) -> list[tuple[sp.Symbol, sp.Expr]]:
    """The points ``(x, x0)`` of ``points`` where the sum ``expr`` cancels in floating point.

    The sum cancels at ``x0`` when it vanishes there to a higher order ``m`` than its largest term (read off
    their series in ``h = x - x0``): its terms agree to more digits the closer ``x`` is to ``x0``.  At
    ``x0 = 0`` any such sum loses digits its condition number does not explain (the condition number of
    ``c x**m`` is ``m``); away from 0 a simple zero is as ill-conditioned as the cancellation it causes
    (the condition number grows like ``x0/h``), so only ``m >= 2`` counts there.
    """
    if not expr.is_Add:
        return []
    out = []
    for x, xs in points:
        if x not in expr.free_symbols:
            continue
        for x0 in xs:
            total = _order(expr, x, x0)
            orders = [_order(t, x, x0) for t in expr.args]
            if total is None or None in orders or total is sp.oo:
                continue
            if total > min(orders) and (x0 == 0 or total >= 2):
                out.append((x, sp.sympify(x0)))
    return out


def _mp(expr: sp.Expr, x: sp.Symbol):
    return sp.lambdify([x], _plain(expr), "mpmath")


def _at(f, v):
    """``f(v)`` at mpmath's precision, or ``None`` where it is not a finite real number."""
    try:
        value = f(v)
        if isinstance(value, mpmath.mpc):
            if abs(value.imag) > mpmath.mpf(10) ** -40 * (1 + abs(value.real)):
                return None
            value = value.real
        value = mpmath.mpf(value)
    except (ZeroDivisionError, OverflowError, ValueError, TypeError):
        return None
    return value if mpmath.isfinite(value) else None


@lru_cache(maxsize=256)
def series_switch(expr: sp.Expr, x: sp.Symbol, x0=0) -> tuple[sp.Expr, sp.Expr, float] | None:
    """``(r, P, F)`` for the sum ``expr`` that cancels at ``x = x0``: the Taylor polynomial ``P(h)`` of
    ``expr`` in ``h = x - x0`` (Horner form, in a dummy symbol ``h``) to use for ``|h| <= r``, and the factor ``F``
    by which ``expr`` as written amplifies rounding at ``|h| = r``, where it takes over; ``None`` when no
    radius of :data:`SWITCH_RADII` has both (a polynomial of at most :data:`SWITCH_TERMS` terms within
    :data:`SWITCH_TRUNCATION` relative, and ``F <= SWITCH_LIMIT``).

    Written once for every target: ``Select(r - |h|, P(h), expr)`` prints in NumPy, CUDA C, torch, JAX and
    Triton alike.
    """
    plain = _plain(expr)
    try:
        series = sp.series(plain, x, x0, SWITCH_TERMS + 1).removeO()
    except Exception:  # noqa: BLE001 - no series (a branch point at x0): no switch
        return None
    poly = sp.expand(series.subs(x, x0 + _H))
    if not poly.is_polynomial(_H) or poly == 0:
        return None
    coeffs = [poly.coeff(_H, k) for k in range(SWITCH_TERMS + 1)]
    if not all(c.is_number and c.is_real for c in coeffs):
        return None
    low = next(k for k, c in enumerate(coeffs) if c != 0)
    whole, terms = _mp(expr, x), [_mp(t, x) for t in sp.Add.make_args(expr)]
    found = []
    with mpmath.workdps(40):
        cs = [mpmath.mpf(sp.Float(c, 45)) for c in coeffs]
        for r in SWITCH_RADII:
            sides = []
            for h in (mpmath.mpf(r), -mpmath.mpf(r)):
                value = _at(whole, x0 + h)
                parts = [_at(t, x0 + h) for t in terms]
                if value is None or value == 0 or None in parts:
                    continue
                sides.append((h, value, mpmath.fsum(abs(v) for v in parts) / abs(value)))
            if not sides:
                continue
            amplification = max(a for _, _, a in sides)
            for n in range(low, SWITCH_TERMS + 1):
                good = True
                for h, value, _ in sides:
                    parts = [c * h**k for k, c in enumerate(cs[: n + 1])]
                    approx = mpmath.fsum(parts)
                    if abs(approx - value) > SWITCH_TRUNCATION * abs(value) or \
                            mpmath.fsum(abs(v) for v in parts) > SWITCH_LIMIT * abs(approx):
                        good = False
                        break
                if good:
                    found.append((r, amplification, n))
                    break
    usable = [f for f in found if f[1] <= SWITCH_LIMIT]
    if not usable:
        return None
    preferred = [f for f in usable if f[1] <= SWITCH_GOOD]
    r, amplification, n = preferred[0] if preferred else min(usable, key=lambda f: f[1])
    poly = sp.Add(*[c * _H**k for k, c in enumerate(coeffs[: n + 1])])
    return r, sp.horner(poly, wrt=_H), float(amplification)


def _switch(h: sp.Expr, switch, direct: sp.Expr) -> sp.Expr:
    """``Select(r - |h|, P(h), direct)`` for ``series_switch``'s ``(r, P, F)``."""
    r, poly, _ = switch
    return Select(r - sp.Abs(h), poly.subs(_H, h), direct)


@lru_cache(maxsize=1)
def _phi_switch():
    """The switch of ``phi(u) = expm1(u) - u = u**2/2 + u**3/6 + ...``, which no identity writes without a
    difference: ``exp(u) - 1 - u`` and, through ``u - log1p(u) = phi(log1p(u))``, ``u - log(1 + u)``."""
    return series_switch(expm1(_U) - _U, _U, 0)


def _phi(u: sp.Expr, direct: sp.Expr) -> sp.Expr:
    return _switch(u, _phi_switch(), direct)


def _matching(terms: list[sp.Expr], wanted: sp.Expr) -> list[int] | None:
    """Indices of ``terms`` whose sum is ``wanted`` term by term (each term of ``expand(wanted)`` once)."""
    out = []
    for part in sp.Add.make_args(sp.expand(wanted)):
        hit = next((i for i, t in enumerate(terms) if i not in out and sp.expand(t) == part), None)
        if hit is None:
            return None
        out.append(hit)
    return out


def _pair_identities(expr: sp.Add) -> sp.Expr:
    """``expr`` with each pair of terms rewritten by an identity of the table below (scaled by any ``c``):

    * ``c cosh(u) - c`` -> ``2 c sinh(u/2)**2``;  ``c cos(u) - c`` -> ``-2 c sin(u/2)**2``;
    * ``c expm1(u) - c u`` -> ``c phi(u)`` (``exp(u) - 1 - u``, once ``expm1`` is in);
    * ``c log1p(u) - c u`` -> ``-c phi(log1p(u))`` (``u - log(1 + u) = expm1(w) - w``, ``w = log1p(u)``),

    where ``phi`` is :func:`_phi_switch`'s series switch.
    """
    terms = sorted(expr.args, key=sp.default_sort_key)
    changed = True
    while changed:
        changed = False
        for i, term in enumerate(terms):
            for f in sorted(sp.Mul.make_args(term), key=sp.default_sort_key):
                if not isinstance(f, (sp.cosh, sp.cos, expm1, log1p)):
                    continue
                c, u = term / f, f.args[0]
                partner = -c if isinstance(f, (sp.cosh, sp.cos)) else -c * u
                others = terms[:i] + terms[i + 1:]
                hits = _matching(others, partner)
                if hits is None:
                    continue
                if isinstance(f, sp.cosh):
                    new = 2 * c * sp.sinh(u / 2) ** 2
                elif isinstance(f, sp.cos):
                    new = -2 * c * sp.sin(u / 2) ** 2
                elif isinstance(f, expm1):
                    if _phi_switch() is None:
                        continue
                    new = c * _phi(u, f - u)
                else:
                    if _phi_switch() is None:
                        continue
                    new = -c * _phi(f, u - f)
                terms = [t for k, t in enumerate(others) if k not in hits] + [new]
                changed = True
                break
            if changed:
                break
    return sp.Add(*terms)


def _constant_conjugate(expr: sp.Add, points) -> sp.Expr | None:
    """``A + T`` with ``T`` the one term holding a square root -> ``(T**2 - A**2)/(T - A)``, the numerator
    expanded: ``sqrt(1 + u) - 1`` -> ``u/(sqrt(1 + u) + 1)`` (where ``A + T`` cancels, ``T`` and ``-A``
    have one sign, so the denominator does not cancel)."""
    rooted = [t for t in expr.args if _has_root(t)]
    if len(rooted) != 1:
        return None
    (term,) = rooted
    rest = expr - term
    numerator = sp.expand(term**2 - rest**2)
    if _has_root(numerator) or cancelling_points(numerator, points):
        return None
    denominator = term - rest
    if denominator.could_extract_minus_sign():
        numerator, denominator = -numerator, -denominator
    return numerator / denominator


def _rational_sum(expr: sp.Add, points) -> sp.Expr | None:
    """A rational function as one fraction of factored polynomials: ``1 - 1/(1 + p)`` -> ``p/(p + 1)``."""
    symbols = sorted(expr.free_symbols, key=sp.default_sort_key)
    if not symbols or not expr.is_rational_function(*symbols):
        return None
    better = sp.factor(sp.cancel(sp.together(expr)))
    if better == expr or _cancels(better, points):
        return None
    return better


def _cancels(expr: sp.Expr, points) -> bool:
    """Whether a sum in ``expr`` cancels at one of ``points`` (a series switch's direct branch aside: it is used
    away from the point)."""
    if isinstance(expr, Select):
        return _cancels(expr.args[1], points)
    if expr.is_Add and cancelling_points(expr, points):
        return True
    return any(_cancels(a, points) for a in expr.args)


def _one_fraction(expr: sp.Add, points) -> sp.Expr | None:
    """A sum with denominators as one fraction whose numerator is made stable: ``1 - 1/sqrt(1 + 2p)`` ->
    ``(sqrt(1 + 2p) - 1)/sqrt(1 + 2p)`` -> ``2p/((sqrt(1 + 2p) + 1) sqrt(1 + 2p))``."""
    numerator, denominator = sp.fraction(sp.together(expr))
    if denominator == 1 or not numerator.is_Add:
        return None
    better = _stable(numerator, points)
    if _cancels(better, points):
        return None
    return better / denominator


def _cancelling_sum(expr: sp.Add, points) -> sp.Expr:
    """``expr`` rewritten where it cancels at a point of evaluation (see :func:`stable_form`)."""
    if not cancelling_points(expr, points):
        return expr
    new = _pair_identities(expr)
    if not new.is_Add:
        return new
    where = cancelling_points(new, points)
    if not where:
        return new
    for rule in (_constant_conjugate, _rational_sum, _one_fraction):
        better = rule(new, points)
        if better is not None:
            return better
    for x, x0 in where:
        better = _series_fallback(new, x, x0, points)
        if better is not None:
            return better
    return new


_W = sp.Dummy("w", real=True)


def _series_fallback(expr: sp.Add, x: sp.Symbol, x0, points) -> sp.Expr | None:
    """The series switch of a sum in ``x`` alone that cancels at ``x0``: in ``h = x - x0`` or, where the sum
    holds ``log(a x + b)``, in ``w = log(a x + b)`` about ``log(a x0 + b)`` (the sum as a function of ``w`` has no
    logarithm, and often a series that converges everywhere: ``p log p - p + 1 = w e^w - e^w + 1``)."""
    if expr.free_symbols != {x}:
        return None
    plain = _plain(expr)
    candidates = [(x - x0, expr, x, x0)]
    for lg in sorted(plain.atoms(sp.log), key=sp.default_sort_key):
        arg = lg.args[0]
        if not arg.is_polynomial(x) or sp.degree(arg, x) != 1:
            continue
        a, b = sp.Poly(arg, x).all_coeffs()
        if not (a * x0 + b).is_positive:
            continue
        in_w = plain.subs(x, (sp.exp(_W) - b) / a)
        if in_w.has(sp.log) or in_w.free_symbols != {_W}:
            continue
        w0 = sp.log(a * x0 + b)
        candidates.append((_stable(lg, points) - w0, in_w, _W, w0))
    for h, e, var, at in candidates:
        switch = series_switch(e, var, at)
        if switch is not None:
            return _switch(h, switch, expr)
    return None


def _stable_add_or_same(expr: sp.Expr) -> sp.Expr:
    return _stable_add(expr) if expr.is_Add else expr


def stable_form(expr: sp.Expr, points=POINTS) -> sp.Expr:
    """``expr`` rewritten so that no subtraction of nearly equal values is left in it.

    SymPy's closed forms often hold differences that cancel in floating point
    where the exact value is small: the root ``z/2 + sqrt(z**2 + c)/2`` of a
    quadratic for ``z`` very negative, ``log(z + sqrt(z**2 + 1))`` near 0 and
    for ``z`` very negative, ``exp(z) - 1`` and ``log(1 + z)`` near ``z = 0``.
    The rewrites, each an identity on the reals:

    * ``log(A + sqrt(A**2 + c))`` (``c > 0`` free of ``A``'s symbols) ->
      ``log(c)/2 + asinh(A/sqrt(c))``; ``log(1 + x)`` -> ``log1p(x)``, and
      ``log(A)`` with ``A - 1`` cancelling at one of ``points`` ->
      ``log1p(A - 1)`` (``log(cosh(u))`` -> ``log1p(2 sinh(u/2)**2)``);
    * ``a exp(x) - a`` -> ``a expm1(x)``;
    * a rational function of ``exp(u)`` bounded as ``u -> +oo`` (``exp(u)/(exp(u) + 1)``) -> a sign select
      between it and the same function of ``exp(-u)`` (an overflow, not a cancellation: :func:`_logistic`);
    * ``T1 + T2`` with ``r = -T1/T2 > 0`` a product of powers with a symbolic
      exponent (``p**alpha - p``) -> ``-T2 expm1(log r)``, ``log r`` expanded;
    * ``A + sqrt(B)`` where ``c = B - A**2`` cancels symbolically (it is free
      of ``A``'s symbols or of lower degree) -> ``Select(A, t, c/t)`` with
      ``t = |A| + sqrt(B)``: no cancellation for either sign of ``A``
      (``A - sqrt(B)`` likewise, with the signs flipped).

    Then every sum that cancels at one of ``points`` (``(symbol, values)``
    pairs, :data:`POINTS` by default: ``p`` near 0 and 1, ``z`` near 0; the
    emitter gives ``z`` the map's ``omega'(0+)``), that is, vanishes there to
    a higher order than its largest term (:func:`cancelling_points`), is
    rewritten by the first of these that applies:

    * pairs of terms, by identities (``c`` any factor):
      ``c cosh(u) - c`` -> ``2 c sinh(u/2)**2``, ``c - c cos(u)`` ->
      ``2 c sin(u/2)**2``, ``c expm1(u) - c u`` (``exp(u) - 1 - u``) ->
      ``c phi(u)`` and ``c u - c log1p(u)`` (``u - log(1 + u)``) ->
      ``c phi(log1p(u))``, ``phi`` the series switch of ``expm1(w) - w``;
    * ``A + T`` with ``T`` a square root and ``A`` free of roots ->
      ``(T**2 - A**2)/(T - A)``: ``sqrt(1 + u) - 1`` -> ``u/(sqrt(1 + u) + 1)``;
    * a rational function -> one fraction of factored polynomials:
      ``1 - 1/(1 + p)`` -> ``p/(p + 1)``;
    * a sum with denominators -> one fraction whose numerator goes through
      these rules: ``1 - 1/sqrt(1 + 2p)`` -> ``2p/((sqrt(1 + 2p) + 1) sqrt(1 + 2p))``;
    * a sum in one symbol ``x``: the series switch (:func:`series_switch`)
      ``Select(r - |h|, P(h), sum)``, ``P`` its Taylor polynomial in
      ``h = x - x0`` or, where it holds ``log(a x + b)``, in
      ``h = log(a x + b) - log(a x0 + b)`` (``p log p - p + 1`` near 1,
      ``(1 + p) log(1 + p) - p`` near 0).

    A sum none of these fixes (``tanh(p) - p``, whose series converges too
    slowly where the sum stops cancelling) is left as it is.  Other
    expressions come back unchanged, so an already stable form prints as
    before.
    """
    positive = frozenset(x for x, xs in points if xs == POSITIVE)
    return _stable(expr, tuple((x, tuple(xs)) for x, xs in points if xs != POSITIVE), positive)


@lru_cache(maxsize=1 << 16)
def _stable(expr: sp.Expr, points, positive=frozenset(), logistic: bool = True) -> sp.Expr:
    if expr.is_Atom or isinstance(expr, Select):  # a Select is a stable form already
        return expr
    if isinstance(expr, sp.log):
        better = _stable_log(expr.args[0], points)
        if better is not None:
            return _stable(better, points, positive)
    if expr.is_Pow:
        better = _power_near_one(expr)
        if better is not None:
            return _stable(better, points, positive)
    if logistic and (expr.is_Mul or expr.is_Pow):
        better = _logistic(expr)
        if better is not None:  # (each branch made stable in its turn: e^z (1 - e^z) near 0 takes expm1)
            cond, small, large = better.args
            return Select(cond, _stable(small, points, positive), _stable(large, points, positive, False))
    args = tuple(_stable(a, points, positive, logistic) for a in expr.args)
    new = expr.func(*args) if args != expr.args else expr
    if new.is_Add:
        better = _power_difference(new, positive)
        if better is not None:
            return _stable(better, points, positive)
    if new.is_Add and (_has_root(new) or new.has(sp.exp)):
        new = _stable_add(new)
    if new.is_Add:
        new = _cancelling_sum(new, points)
    return new


def _logistic(expr: sp.Expr) -> sp.Expr | None:
    """A rational function ``R(e^u)`` bounded as ``u -> +oo`` (its numerator's degree in ``e^u`` at most its
    denominator's, which is at least 1), as ``Select(u, R(1/v)|_{v = e^-u}, R(e^u))``; else ``None``.

    Not a cancellation but an overflow: at ``u`` past ``log`` of the largest float both ``e^u`` and the
    denominator are infinite and ``R`` NaN (the binary entropy's link, the sigmoid ``e^z/(e^z + 1)``, and its
    derivatives at ``z > 88`` in float32).  Each branch is taken where its exponentials are at most 1, and both are
    written in ``e^{-|u|}`` (``e^{-u}`` on one side of 0, ``e^u`` on the other): one exponential where the printed
    code evaluates both branches.
    """
    powers = [e for e in expr.atoms(sp.exp)]
    if not powers:
        return None
    coefficients = [e.args[0].as_coeff_Mul() for e in powers]
    u = coefficients[0][1]
    if not u.free_symbols or any(rest != u or not c.is_Integer or c < 1 for c, rest in coefficients):
        return None
    w, v = sp.Dummy("w", positive=True), sp.Dummy("v", positive=True)
    rational = expr.subs({e: w ** int(c) for e, (c, _) in zip(powers, coefficients)})
    if rational.free_symbols & u.free_symbols or not rational.is_rational_function(w):
        return None
    num, den = sp.fraction(sp.cancel(rational))
    if sp.degree(den, w) < 1 or sp.degree(num, w) > sp.degree(den, w):
        return None
    # (each branch's exponential is e^{-|u|} on its side of 0: one exponential for both)
    t = sp.exp(-sp.Abs(u))
    small = sp.factor(sp.cancel(rational.subs(w, 1 / v))).subs(v, t)
    return Select(u, small, sp.factor(sp.cancel(rational)).subs(w, t))


def overflow_form(expr: sp.Expr) -> sp.Expr:
    """``expr`` with :func:`_logistic`'s rewrite alone (where :func:`stable_form` finds no more than that, the
    expression overflows but does not cancel: its derivatives are printed in ``z`` too)."""
    better = _logistic(expr)
    if better is not None:
        return better
    args = tuple(overflow_form(a) for a in expr.args) if not expr.is_Atom else ()
    return expr.func(*args) if args and args != expr.args else expr


def _power_near_one(expr: sp.Pow) -> sp.Expr | None:
    """``b**e`` as ``exp(e log1p(b - 1))`` where ``e`` has a pole at a parameter's value at which ``b = 1``, with
    ``b - 1`` factored; else ``None``.

    Tsallis' link ``(alpha z - z + 1/alpha)**(1/(alpha - 1))`` near ``alpha = 1``: ``b`` rounds to a relative
    error ``eps``, which the power multiplies by ``e = 1/(alpha - 1)``; ``b - 1 = (alpha - 1)(z - 1/alpha)``
    computed as that product has no such error, and ``log1p`` keeps it, so the value is as accurate as
    ``exp(z - 1)`` at ``alpha = 1``.  (An identity for ``b >= 0``; for ``b < 0`` both forms are NaN.)  Only within
    1/8 of the pole (``Select``): elsewhere the power is as accurate, and XLA's CPU ``log1p`` is not (120 ulps
    in float64, against NumPy's 1).
    """
    base, exponent = expr.base, expr.exp
    if exponent.is_number or base.is_number:
        return None
    for q in sorted(exponent.free_symbols - {_p, _z}, key=str):
        for point in singular_points(exponent, q):
            if sp.simplify(base.subs(q, point) - 1) == 0:
                near = sp.exp(exponent * log1p(sp.factor(sp.simplify(base - 1))))
                return Select(sp.Rational(1, 8) - sp.Abs(q - point), near, expr)
    return None


def fold_constants(expr: sp.Expr) -> sp.Expr:
    """Functions of numbers (``exp(3)``, ``log(10)``) as their values, 30-digit Floats.

    C cannot call the ``rg_*`` overloads on an integer (the call is ambiguous),
    and the value is a constant anyway.
    """
    if expr.is_Atom:
        return expr
    if isinstance(expr, sp.Function) and expr.is_number and expr.is_extended_real:
        return sp.Float(expr.evalf(30), 30)
    args = tuple(fold_constants(a) for a in expr.args)
    return expr.func(*args) if args != expr.args else expr


def _liftable(expr: sp.Expr) -> bool:
    # a constant base (pi) is not lifted: its power prints as its value (sqrt(pi) -> 1.7724538509055159), where
    # a temporary holding pi would be a Python float that torch.sqrt and Triton refuse
    if not isinstance(expr, sp.Pow) or expr.base.is_Symbol or expr.base.is_number:
        return False
    e = expr.exp
    return (e.is_Integer and 1 < abs(e) <= MAX_PRODUCT) or (e.is_Rational and e.q == 2 and abs(e.p) <= 2 * MAX_PRODUCT + 1)


def blocks(exprs: list[sp.Expr], prefix: str = "t", counter=None) -> tuple[list[tuple[sp.Symbol, sp.Expr]], list[sp.Expr]]:
    """CSE ``exprs`` and lift bases of small powers into temporaries.

    Returns ``(assignments, results)``: ``assignments`` in evaluation order.
    ``counter`` (an iterator of symbols) continues the numbering of an earlier block.
    """
    if counter is None:
        counter = sp.numbered_symbols(prefix, real=True)
    repl, reduced = sp.cse(list(exprs), symbols=counter, order="canonical")
    lifted: dict[sp.Expr, sp.Symbol] = {}
    out: list[tuple[sp.Symbol, sp.Expr]] = []

    def lift(node: sp.Expr) -> sp.Expr:
        if node.is_Atom:
            return node
        args = tuple(lift(a) for a in node.args)
        new = node.func(*args) if args != node.args else node
        if _liftable(new):
            if new.base not in lifted:
                lifted[new.base] = next(counter)
                out.append((lifted[new.base], new.base))
            return sp.Pow(lifted[new.base], new.exp)
        return new

    for sym, value in repl:
        value = lift(value)
        out.append((sym, value))
    results = [lift(r) for r in reduced]
    return out, results
