"""What a map costs: the rule that solves its threshold, in words, and its time beside entmax15's.

* :func:`describe`: the rule :func:`numeric.core.rules.solve` runs for a map's constants (those a generated
  module carries at its top), as a :class:`Rule`: its ``kind``, one of :data:`KINDS`, and ``how``, in words.
  ``"closed"``, ``"sort"`` and ``"root"`` are the module's ``THRESHOLD``; ``"KKT"`` is a ``"root"`` module
  whose link has no closed form (``LINK_METHOD == "newton"``, ``link = None``), solved by Newton on the KKT
  system in ``p`` and the threshold together (:func:`numeric.core.kkt.kkt_rule`); ``"none"`` a map without the
  sum constraint.
* :func:`rule`: the same for a :class:`~numeric.maps.Map` (its case, for a family; its bound parameters) or a
  generated module and its parameters' values; :func:`is_sparse`: whether its weights can be exactly 0
  (``omega'(0+)``, the module's ``clip``, finite).
* :func:`relative_time`: a map's NumPy forward time over the built-in entmax15's on one standard input, the
  calls interleaved, on one thread: what ``regattn verify`` prints on its ``cost`` line.

>>> import numeric as nm
>>> rule(nm.get_map("softmax")).line()
'closed (one pass: p = B(s) / sum B(s))'
>>> rule(nm.get_map("sparsemax")).kind, is_sparse(nm.get_map("sparsemax"))
('sort', True)
"""

from __future__ import annotations

import math
import numbers
import statistics
import time
from dataclasses import dataclass

import numpy as np

from .core.rules import SUPPORT_STEPS
from .core.screen import CANDIDATES

__all__ = ["KINDS", "Rule", "Timing", "describe", "no_sum", "rule", "is_sparse", "relative_time"]

#: The rules, from the cheapest: a closed threshold, the support rule, a root of the threshold's equation on a
#: link, Newton on the KKT system; and ``"none"``, a map without the sum constraint (``total=None``: ``sigmoid``,
#: ``relu``), which has no threshold (:mod:`numeric.constraints.nosum`).
KINDS = ("closed", "sort", "root", "KKT", "none")

#: What a sparse map's Halley and KKT solves add: each long row on its largest scores first
#: (:func:`numeric.core.screen.screened`).
_SCREEN = f"long rows on their {CANDIDATES + 1} largest scores first"
#: the power form's solve where k < 1 (numeric.core.rules._power_piece_newton, and Halley on rows of more than
#: twice the candidates)
_PIECE = ("Newton in the weight of the smallest score between the two kinks that bracket the threshold (a binary "
          "search over the sorted candidates), safeguarded Halley on longer rows")


@dataclass(frozen=True)
class Rule:
    """The rule that solves a map's threshold: ``kind`` (one of :data:`KINDS`) and ``how`` it runs, in words."""

    kind: str
    how: str

    def line(self) -> str:
        """``kind (how)``, e.g. ``root (safeguarded Halley on the printed link)``."""
        return f"{self.kind} ({self.how})"


def _number(value) -> float | None:
    """``value`` as a float where it is one number (a Python or NumPy scalar, a 0-d or one-element array)."""
    if isinstance(value, numbers.Real):
        return float(value)
    array = np.asarray(value)
    return float(array.reshape(-1)[0]) if array.size == 1 and array.dtype.kind in "fiu" else None


def describe(threshold: str, link_form: str, has_link: bool, exponent=None, sparse: bool | None = None,
             link: str | None = None) -> Rule:
    """The :class:`Rule` :func:`numeric.core.rules.solve` runs for a map's constants.

    ``threshold``: the module's ``THRESHOLD`` (or the one a map forces); ``link_form``: its ``LINK_FORM``;
    ``has_link``: whether its link is printed (``link`` is not ``None``); ``exponent``: the power form's ``k``
    (a number, a text such as ``"1/(alpha - 1)"``, or ``None`` where unknown); ``sparse``: ``omega'(0+)`` finite
    (``None``: unknown); ``link``: the printed link's text, named in the words where given.

    >>> describe("root", "general", False, sparse=False).line()
    'KKT (Newton on p and the threshold together, the KKT system: the link has no closed form)'
    >>> print(describe("root", "power", True, 2.0).line())
    root (Newton from below on the link's power form (a (z - clip))**k, k = 2)
    """
    if threshold not in KINDS[:3]:
        raise ValueError(f"threshold must be one of {KINDS[:3]}, got {threshold!r}")
    k = _number(exponent) if exponent is not None and not isinstance(exponent, str) else None
    k_text = f"{k:.3g}" if k is not None else exponent
    power = link_form == "power"
    screen = f"; {_SCREEN}" if sparse else ""
    if threshold == "closed":
        return Rule("closed", "one pass: p = B(s) / sum B(s)")
    if threshold == "sort":
        steps = "Michelot's steps" if power and k == 1 else "Newton steps on the support"
        return Rule("sort", f"exact tau from sums over the support by {steps}; rows open after {SUPPORT_STEPS} are sorted")
    if power:
        form = "the link's power form (a (z - clip))**k" + (f", k = {k_text}" if k_text is not None else "")
        if k is None:
            return Rule("root", f"Newton from below where k >= 1, {_PIECE} where k < 1, on {form}"
                                f"{'; where k < 1, ' + _SCREEN if sparse else ''}")
        if k >= 1:
            return Rule("root", f"Newton from below on {form}")
        return Rule("root", f"{_PIECE}, on {form}{screen}")
    if has_link:
        printed = f"the printed link g(z) = {link}" if link else "the printed link"
        return Rule("root", f"safeguarded Halley on {printed}{screen}")
    return Rule("KKT", f"Newton on p and the threshold together, the KKT system: the link has no closed form{screen}")


def no_sum(has_link: bool) -> Rule:
    """The rule of a map without the sum constraint (:mod:`numeric.constraints.nosum`): no threshold; ``has_link``:
    its link is printed (else ``omega'(p) = s`` is inverted on each score)."""
    inverse = "" if has_link else ", omega'(p) = s inverted by Newton"
    return Rule("none", f"no sum constraint: p_i = min(u_i, g_+(s_i)), the link on each score alone{inverse}")


def _module_of(m, params: dict):
    """``(module, threshold, parameter values)`` of what solves ``m``: a :class:`~numeric.maps.Map` (a map
    family's inner map, a family module's case), or a generated module and ``params``."""
    from .maps import Map

    if not isinstance(m, Map):
        return m, m.THRESHOLD, tuple(params[name] for name in m.PARAMETERS)
    if params:
        raise TypeError("a Map's parameters are bound: give them to get_map")
    if m.family is not None:  # (a map family: its inner map solves the threshold)
        m = Map(m.module, m.threshold, **m.family.inner_params(*m.params.values()))
    m = m._case()
    threshold = m.module.THRESHOLD if m.threshold == "auto" else m.threshold  # (a family's own routines: "auto")
    return m.module, threshold, tuple(m.params[name] for name in m.module.PARAMETERS)


def is_sparse(m, **params) -> bool | None:
    """Whether the map ``m`` (a :class:`~numeric.maps.Map` or a generated module with ``params``) can give
    weights exactly 0: its ``omega'(0+)`` (``clip``) finite; ``None`` where that is not one number (a value per
    row on both sides of a family's change of kind)."""
    module, _, values = _module_of(m, params)
    clip = _number(module.clip(*values))
    return None if clip is None else math.isfinite(clip)


def rule(m, **params) -> Rule:
    """The :class:`Rule` that solves the map ``m``: a :class:`~numeric.maps.Map` (the rule of its case, for a
    family, at its bound values; the threshold it forces; none where its name binds ``total=None``), or a
    generated module with its parameters' values."""
    module, threshold, values = _module_of(m, params)
    if getattr(m, "keywords", {}).get("total", 1) is None:
        return no_sum(module.link is not None)
    power = module.LINK_FORM == "power" and getattr(module, "link_scale", None) is not None
    exponent = module.link_exponent(*values) if power else None
    return describe(threshold, module.LINK_FORM if power else "general", module.link is not None, exponent,
                    is_sparse(module, **dict(zip(module.PARAMETERS, values))))


@dataclass(frozen=True)
class Timing:
    """A map's time over entmax15's (``ratio``), the medians behind it in seconds, and on what."""

    ratio: float
    seconds: float
    reference_seconds: float
    calls: int
    shape: tuple[int, int]
    dtype: str

    def text(self) -> str:
        """``1.7x entmax15 (NumPy forward, N(0, 1) scores 512 x 256 float32, one thread, median of 9 interleaved calls)``."""
        rows, cols = self.shape
        ratio = f"{self.ratio:.2f}" if self.ratio < 1 else f"{self.ratio:.1f}" if self.ratio < 10 else f"{self.ratio:.0f}"
        return (f"{ratio}x entmax15 (NumPy forward, N(0, 1) scores {rows} x {cols} {self.dtype}, one thread, "
                f"median of {self.calls} interleaved calls)")


def relative_time(m, *, shape: tuple[int, int] = (512, 256), dtype: str = "float32", seed: int = 0,
                  calls: int = 9, budget: float = 0.5) -> Timing:
    """The NumPy forward time of the map ``m`` (a :class:`~numeric.maps.Map`, or anything :func:`numeric.get_map`
    takes) over the built-in entmax15's, on scores drawn from N(0, 1) with ``seed``, of ``shape`` and ``dtype``.

    One untimed round, then ``calls`` rounds of one call of each, interleaved (both see the same machine), on
    one thread (:func:`numeric.set_num_threads`, restored after); rounds stop early, after at least three,
    once ``budget`` seconds have passed.  The ratio is of the medians.  It says how the map's rule compares
    on this machine, not what either map takes elsewhere.
    """
    from . import parallel
    from .maps import get_map

    mapping, reference = get_map(m), get_map("entmax15")
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    saved = parallel._state.threads  # (None: the default, which set_num_threads(None) restores)
    parallel.set_num_threads(1)
    try:
        mapping(x)
        reference(x)
        times: tuple[list[float], list[float]] = ([], [])
        start = time.perf_counter()
        while len(times[0]) < calls and (len(times[0]) < 3 or time.perf_counter() - start < budget):
            for fn, t in zip((mapping, reference), times):
                begin = time.perf_counter()
                fn(x)
                t.append(time.perf_counter() - begin)
    finally:
        parallel.set_num_threads(saved)
    own, ref = statistics.median(times[0]), statistics.median(times[1])
    return Timing(own / ref, own, ref, len(times[0]), tuple(shape), np.dtype(dtype).name)
