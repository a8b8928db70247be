"""Family modules: one map whose kind changes with a parameter, run as the map of each value's case.

A family module (``regattn generate`` of a regularizer that :func:`derive.family.derive_family` splits, such as
the built-in ``entmax``, Tsallis on ``alpha > 0``) holds ``CASES``: ``(lower, upper, module name)`` in increasing
order of its ``FAMILY_PARAMETER``, an open interval or a point (``lower == upper``), each case a generated module
of its own in the same package.  A point case's module lacks the parameter (softmax is Tsallis at
``alpha = 1``); the family module gives the limits of ``d omega'/dq`` and ``d omega/dq`` there
(``omega_prime_d_<q>_case<i>``, ``omega_d_<q>_case<i>``).

* :func:`complete`, called by the family module as it is imported, imports the case modules (on the importing
  thread, once) and defines the contract's routines (:mod:`numeric.contract`) on NumPy arrays.
* :func:`table_on` gives those routines on any array namespace (torch, JAX): a routine called with a number for
  the parameter is its case's routine; with an array, each case's routine runs with the parameter's values
  outside the case replaced by one inside it (so no branch computes at a pole), and ``where`` picks each value's
  case.  At a point ``omega`` and ``omega'`` gain their first-order term ``(q - point) * limit``, which is 0 in
  value and gives autograd the derivative in ``q`` that the open cases tend to: the map and its gradient in
  ``q`` are continuous through the point.
* :func:`resolve` gives the case module where every value of the parameter lies in one open case: a map runs
  that module's own rules and kernels (the power-form entmax rules, a closed softmax threshold, CUDA, Triton),
  and the family's routines serve the rest (values in several cases, a point, values a trace cannot read).

The family's constants say what its combined routines need: the root threshold, a general link.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys
from types import ModuleType

import numpy as np

from . import contract, trust

__all__ = ["is_family", "complete", "table_on", "case_modules", "case_index", "resolve"]


def is_family(module) -> bool:
    """Whether ``module`` is a family module (it has ``CASES``)."""
    return getattr(module, "CASES", None) is not None


def case_modules(module) -> tuple[ModuleType, ...]:
    """The case modules of a family module, in the order of ``CASES`` (imported by :func:`complete`)."""
    return module.CASE_MODULES


def complete(scope: dict) -> None:
    """Import the case modules of the family module whose globals are ``scope`` (each checked by
    :func:`numeric.trust.import_generated`, from the family's package) and define its routines on NumPy arrays."""
    package = scope.get("__package__") or ""
    modules = tuple(trust.import_generated(f"{package}.{name}" if package else name) for _, _, name in scope["CASES"])
    scope["CASE_MODULES"] = modules
    # (contract.routines_on calls this: numeric.contract does not import numeric.family, which imports it)
    scope["TABLE_ON"] = lambda namespace, rebind: table_on(sys.modules[scope["__name__"]], namespace, rebind)
    table = _combined(scope, [contract.module_routines(m) for m in modules], dict(scope), np)
    scope.update(table)


def table_on(module, namespace, rebind) -> dict:
    """The family's routines on ``namespace`` (``{name: function or None}``, :func:`numeric.contract.routine_names`),
    built from the case modules' routines rebound by ``rebind(module) -> table`` and the family's own limits."""
    cases = [rebind(m) for m in module.CASE_MODULES]
    return _combined(vars(module), cases, rebind(module, own=True), namespace)


def case_index(cases, value: float) -> int | None:
    """The index of the case of ``CASES`` holding the number ``value`` (``None`` outside them all)."""
    for i, (lo, hi, _) in enumerate(cases):
        if (value == lo) if lo == hi else (lo < value < hi):
            return i
    return None


def resolve(module, values: dict, readable=None) -> ModuleType:
    """The module to run for these parameter values: a family's case module where every value of its parameter
    lies in one open case (that module has the family's parameters), else the family itself (and any other
    module as it is).

    ``readable(array)``: its values as an array with ``min`` and ``max``, or ``None`` where they cannot be read (a
    traced value): :meth:`numeric.front.Arrays.readable`.
    """
    if not is_family(module):
        return module
    value = values[module.FAMILY_PARAMETER]
    if not _is_number(value):
        value = value if readable is None else readable(value)
        if value is None:
            return module
    lo, hi = (float(value), float(value)) if _is_number(value) else (float(value.min()), float(value.max()))
    i, j = case_index(module.CASES, lo), case_index(module.CASES, hi)
    if i is None or i != j or module.CASES[i][0] == module.CASES[i][1]:
        return module
    case = module.CASE_MODULES[i]
    if _steep_power(case, (lo, hi), len(module.PARAMETERS)):
        return module
    return case


#: The largest exponent ``k`` of a power-form link ``(a (z - clip))**k`` a case is resolved to: beyond it (entmax
#: within 1e-4 of 1, ``k = 1/(alpha - 1)``) the power-form rules of :mod:`numeric.core` round ``a (z -
#: clip)``, close to 1, to a relative error that ``k`` multiplies; the family's routines (the printed link,
#: ``exp(log1p(...) / (alpha - 1))``) do not.
POWER_LARGE_K = 1e4


def _steep_power(case, bounds, n_params: int) -> bool:
    """Whether the power-form link of ``case`` has ``|k| > POWER_LARGE_K`` at either end of the values (a case of a
    family of one parameter; ``False`` otherwise)."""
    if getattr(case, "link_exponent", None) is None or n_params != 1:
        return False
    return any(abs(float(case.link_exponent(b))) > POWER_LARGE_K for b in bounds)


def _combined(scope: dict, cases: list[dict], own: dict, ns) -> dict:
    """The family's routines from the cases' tables ``cases`` and the family's own functions ``own`` (its limits),
    on the namespace ``ns`` (its ``where``)."""
    q = scope["FAMILY_PARAMETER"]
    names = tuple(scope["PARAMETERS"])
    at = names.index(q)
    bounds = scope["CASES"]
    out = {}
    for name in contract.routine_names(names):
        fns = [table.get(name) for table in cases]
        point_first = {}
        for i, (lo, hi, _) in enumerate(bounds):
            if lo != hi:
                continue
            if name == f"omega_prime_d_{q}":  # the point's module has no parameter q: the limit is the routine
                fns[i] = own[f"omega_prime_d_{q}_case{i}"]
            elif name in ("omega", "omega_prime"):
                point_first[i] = own[f"{name}_d_{q}_case{i}"]
        out[name] = None if any(f is None for f in fns) else _routine(name, fns, point_first, bounds, names, at, ns)
    return out


def _inside(lo: float, hi: float) -> float:
    """A value inside the case ``(lo, hi)`` (the point where ``lo == hi``): a pole of no case's formula."""
    if lo == hi:
        return lo
    if math.isinf(hi):
        return lo + 1.0
    if math.isinf(lo):
        return hi - 1.0
    return (lo + hi) / 2


def _routine(name: str, fns: list, point_first: dict, bounds, parameters: tuple, at: int, ns):
    """One routine of the family: ``fns[i]`` is case ``i``'s (a point case's takes the parameters but ``q``)."""
    arguments = next((r.args for r in contract.ROUTINES if r.name == name), ("p",))  # (p: omega_prime_d_<q>)
    arity = len(arguments)
    # (where, not the namespace: under torch.compile a namespace held here and also read as the global numpy of the
    # cases' rebound routines gets a guard that fails where it is made)
    where, quiet = ns.where, ns is np
    inside = [_inside(lo, hi) for lo, hi, _ in bounds]

    def call(i, own, params):
        lo, hi, _ = bounds[i]
        if lo != hi:
            return fns[i](*own, *params)
        rest = params[:at] + params[at + 1:]
        value = fns[i](*own, *rest)
        if i in point_first and not _is_number(params[at]):
            value = value + (params[at] - lo) * point_first[i](*own, *rest)
        return value

    def routine(*args):
        own, params = args[:arity], args[arity:]
        q = params[at]
        if _is_number(q):
            i = case_index(bounds, float(q))
            if i is None:
                return math.nan
            return call(i, own, params)
        result = None
        with np.errstate(all="ignore") if quiet else contextlib.nullcontext():  # (torch.compile: no errstate)
            for i in reversed(range(len(bounds))):
                lo, hi, _ = bounds[i]
                here = (q == lo) if lo == hi else (q > lo) & (q < hi)
                safe = where(here, q, inside[i])
                value = call(i, own, params[:at] + (safe,) + params[at + 1:])
                result = value if result is None else where(here, value, result)
        return result

    routine.__name__ = name
    routine.__signature__ = inspect.Signature(
        [inspect.Parameter(a, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in (*arguments, *parameters)])
    return routine


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) or (isinstance(value, np.ndarray) and value.ndim == 0)
