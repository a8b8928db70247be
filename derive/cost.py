"""What a derived map costs, read off its derivation: the rule :mod:`numeric` runs for it and whether it is sparse.

The rule follows from the constants :func:`derive.codegen.emit.generate_module` writes at the top of the map's
module (``THRESHOLD`` from ``threshold.kind``, ``LINK_FORM`` from the link's form, ``LINK_METHOD`` from how the
link is found), put in words by :func:`numeric.cost.describe`, so that ``regattn derive`` names the rule of the
module ``regattn generate`` would write, before any is written.  ``regattn verify`` reads the same from the
generated module itself (:func:`numeric.cost.rule`) and adds its time beside entmax15's.

>>> from derive import derive_map, gini, shannon
>>> print(summary(derive_map(gini())).strip())
rule: sort (exact tau from sums over the support by Michelot's steps; rows open after 12 are sorted)
sparse: yes (omega'(0+) = 0 is finite: p_i = 0 exactly where s_i - tau <= 0)
>>> print(summary(derive_map(shannon())).splitlines()[2])
sparse: no (omega'(0+) = -oo: every p_i > 0)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy as sp

from numeric import cost

if TYPE_CHECKING:
    from .derivation import Derivation

__all__ = ["rule", "sparsity", "summary", "continuous_rule", "continuous_sparsity", "continuous_summary"]


def rule(dv: Derivation, link: bool = True) -> cost.Rule:
    """The :class:`numeric.cost.Rule` that solves the map of ``dv``, as its generated module's constants give it;
    ``link``: name a printed link's expression in the words."""
    form = dv.inversion.form
    exponent = None
    if form.form == "power" and form.exponent is not None:
        k = sp.sympify(form.exponent)
        exponent = float(k) if k.is_number else sp.sstr(k)
    has_link = dv.inversion.method == "closed"
    text = sp.sstr(dv.link) if link and has_link and dv.link is not None else None
    return cost.describe(dv.threshold.kind, form.form, has_link, exponent, dv.sparse, text)


def sparsity(dv: Derivation) -> str:
    """``yes (omega'(0+) = 0 is finite: ...)`` or ``no (omega'(0+) = -oo: every p_i > 0)``."""
    if dv.sparse:
        clip = sp.sstr(dv.clip)
        return f"yes (omega'(0+) = {clip} is finite: p_i = 0 exactly where s_i - tau <= {clip})"
    return f"no (omega'(0+) = {sp.sstr(dv.clip)}: every p_i > 0)"


def _lines(lines: list[str], latex: bool) -> str:
    """``lines`` as text after a blank line, or as LaTeX comments (``% ...``: the LaTeX around them stays valid)."""
    return "".join(f"% {line}\n" for line in lines) if latex else "\n" + "".join(f"{line}\n" for line in lines)


def summary(dv: Derivation, latex: bool = False, nosum: bool = False) -> str:
    """The lines ``rule: ...`` and ``sparse: ...`` that ``regattn derive`` prints after a derivation (LaTeX
    comments where ``latex``); ``nosum``: the map is named with ``total=None`` (``sigmoid``, ``relu``), whose
    rule without the sum comes first."""
    found = rule(dv)
    text = f"rule: {found.line()}"
    if nosum:
        text = f"rule: {cost.no_sum(dv.inversion.method == 'closed').line()}; on the simplex {found.line()}"
    return _lines([text, f"sparse: {sparsity(dv)}"], latex)


def continuous_rule(cm) -> str:
    """How a continuous map (:class:`~derive.continuous.ContinuousDerivation`) is computed, in words."""
    if cm.closed_context:
        return "closed (the density and its threshold in closed form in theta_1, theta_2: no solve)"
    return "closed threshold (in theta_1, theta_2), but no closed-form expectations: nothing is generated"


def continuous_sparsity(cm) -> str:
    """``yes (compact support |t - mu| < a)`` or ``no (...)``."""
    return "yes (compact support |t - mu| < a)" if cm.family == "compact" else "no (the density is positive on the whole line)"


def continuous_summary(cm, latex: bool = False) -> str:
    """The lines of :func:`summary` for a continuous map."""
    return _lines([f"rule: {continuous_rule(cm)}", f"sparse: {continuous_sparsity(cm)}"], latex)
