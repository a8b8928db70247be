"""The table of map families every front end reads (:mod:`numeric.families`): :data:`FAMILIES`, :func:`register`,
:func:`family_of`, :func:`functions`."""

from __future__ import annotations

import inspect

from .base import Family

__all__ = ["FAMILIES", "register", "family_of", "functions"]

#: the registered families by name (:func:`numeric.get_map` finds them by it)
FAMILIES: dict = {}


def register(family: Family) -> Family:
    """Adds a family to :data:`FAMILIES` (replacing one of the same name).  The front ends run a family's map over
    the simplex and without gradients in its parameters: a family that declares other sets or
    :attr:`~numeric.families.base.Family.param_gradients` is refused (:class:`NotImplementedError`)."""
    if not isinstance(family, Family):
        raise TypeError(f"a family is a numeric.families.base.Family, got {type(family).__name__}")
    if set(family.sets) != {"simplex"} or family.param_gradients:
        raise NotImplementedError(f"{family!r}: the front ends run a family over the simplex only, without gradients "
                                  f"in its parameters (sets={family.sets!r}, param_gradients={family.param_gradients})")
    if set(family.domains) != set(family.parameters):
        raise ValueError(f"{family!r}: parameters {list(family.parameters)} and domains {list(family.domains)} differ")
    FAMILIES[family.name] = family
    return family


def family_of(mapping, own: type) -> Family | None:
    """The family of ``mapping``: a :class:`~numeric.families.base.Family`, a name of :data:`FAMILIES`, or a map of
    the front end's class ``own`` (its ``family``); ``None`` for anything else (a generated map)."""
    if isinstance(mapping, Family):
        return mapping
    if isinstance(mapping, str):
        return FAMILIES.get(mapping)
    if isinstance(mapping, own):
        return mapping.family
    return None


def functions(get_map, word: str, module: str) -> dict:
    """``{name: function}``: a front end's function of each family of :data:`FAMILIES`, ``name(x, *values,
    word=-1)`` (``values`` the family's parameters, with their defaults) = ``get_map(family, **values)(x, word=...)``,
    as the front end's module ``module`` holds it."""
    out = {}
    for family in FAMILIES.values():
        out[family.name] = _function(family, get_map, word, module)
    return out


def _function(family: Family, get_map, word: str, module: str):
    P = inspect.Parameter
    signature = inspect.Signature([P("x", P.POSITIONAL_OR_KEYWORD),
                                   *(P(n, P.POSITIONAL_OR_KEYWORD, default=v) for n, v in family.parameters.items()),
                                   P(word, P.POSITIONAL_OR_KEYWORD, default=-1)])

    def function(*args, **kwargs):
        given = signature.bind(*args, **kwargs)
        given.apply_defaults()
        values = given.arguments
        return get_map(family, **{n: values[n] for n in family.parameters})(values["x"], **{word: values[word]})

    function.__name__ = function.__qualname__ = family.name
    function.__module__ = module
    function.__signature__ = signature
    args = "".join(f", {n}={n}" for n in family.parameters)
    function.__doc__ = (f"{family.summary}.\n\nThe map along ``{word}``: ``get_map({family.name!r}{args})(x, {word}={word})`` "
                        f"(the family {family.name!r} of :data:`numeric.families.table.FAMILIES`).")
    return function
