"""Typed maps for the benchmark scripts: user regularizers whose link has no closed form, generated as
``regattn generate --expr`` would and imported."""

import atexit
import importlib
import shutil
import sys
import tempfile
from pathlib import Path

#: typed maps of every kind (issue 46), with the kind each stands for
KINDS = {
    "plogp_cube": ("p*log(p) + p**3", "no closed-form link, dense"),
    "gini_log1p": ("p**2/2 + p*log(1 + p)", "no closed-form link, sparse"),
    "cosh_one": ("cosh(p) - 1", "transcendental link (asinh), sparse"),
    "plogp_gini": ("p*log(p) + p**2/2", "transcendental link (Lambert W), dense"),
    "gini_cubic": ("p**2/2 + p**3/3", "polynomial link (a quadratic's root), sparse"),
    "cube_power": ("p**3", "power link p = sqrt(z), sparse"),
    "burg": ("-log(p)", "rational link -1/z, dense"),
    "gini_quartic": ("p**2/2 + p**4/4", "polynomial link (a cubic's root), sparse"),
}
#: two of them, whose link has no closed form (one dense, one sparse): the typed maps of the scripts that time a few
TYPED = {name: KINDS[name][0] for name in ("plogp_cube", "gini_log1p")}


def typed_modules(maps: dict | None = None) -> dict:
    """The :data:`TYPED` maps (or ``maps``, ``{name: expression}``) generated into a temporary folder (removed at
    exit) and imported: ``{name: module}``."""
    maps = TYPED if maps is None else maps
    from derive import Regularizer, derive_map, generate_module

    folder = tempfile.mkdtemp(prefix="regattn-typed-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # (maps check their module's file when made)
    for name, expr in maps.items():
        Path(folder, f"{name}.py").write_text(generate_module(derive_map(Regularizer.from_string(expr, name=name)), name))
    sys.path.insert(0, folder)
    try:
        return {name: importlib.import_module(name) for name in maps}
    finally:
        sys.path.remove(folder)


def kind_modules(names=None) -> dict:
    """The :data:`KINDS` maps (or those of ``names``, in that order), generated and imported as
    :func:`typed_modules` does: ``{name: module}``."""
    names = list(KINDS) if names is None else list(names)
    unknown = [name for name in names if name not in KINDS]
    if unknown:
        raise ValueError(f"not typed maps of _typed.KINDS: {', '.join(unknown)} (known: {', '.join(KINDS)})")
    return typed_modules({name: KINDS[name][0] for name in names})


def rule(module) -> str:
    """The rule that solves a generated module's threshold (``numeric.cost.rule``'s kind: closed, sort, root or
    KKT) and its link form, ``kind/LINK_FORM`` (``root/general``, ``KKT/general``)."""
    from numeric.cost import rule as cost_rule

    return f"{cost_rule(module).kind}/{module.LINK_FORM}"
