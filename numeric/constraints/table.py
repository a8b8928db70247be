"""The table of constraint sets every front end reads (:mod:`numeric.constraints`): :data:`SETS`, :data:`KEYWORDS`,
:func:`register`, :func:`split`, :func:`choose`, :func:`simplex_only`."""

from __future__ import annotations

from .base import ConstraintSet, left_out
from .simplex import SIMPLEX

__all__ = ["SETS", "KEYWORDS", "register", "split", "choose", "simplex_only"]

#: the constraint sets other than the simplex, in the order :func:`choose` asks them (the simplex takes a call whose
#: keywords all leave every set out)
SETS: list = []
#: every set's keywords, ``{keyword: the value that leaves the set out}``
KEYWORDS: dict = {}


def register(cset: ConstraintSet) -> ConstraintSet:
    """Adds a set to :data:`SETS` (asked before those registered earlier) and its keywords to
    :data:`KEYWORDS`; a keyword two sets share must leave both out at the same value."""
    for name, value in cset.keywords.items():
        if name in KEYWORDS and KEYWORDS[name] != value:
            raise ValueError(f"keyword {name!r} of {cset!r} is left out at {value!r}, at {KEYWORDS[name]!r} by another set")
        KEYWORDS.setdefault(name, value)
    SETS.insert(0, cset)
    return cset


def split(kwargs: dict) -> tuple[dict, dict]:
    """``(constraints, others)``: a call's keyword arguments that are constraint keywords (:data:`KEYWORDS`), and
    the rest (a map's parameters)."""
    return ({k: v for k, v in kwargs.items() if k in KEYWORDS},
            {k: v for k, v in kwargs.items() if k not in KEYWORDS})


def choose(constraints: dict) -> tuple[ConstraintSet, dict]:
    """``(set, values)``: the set a call's constraint keywords select and its keywords' values (with the marks that
    selected it, :attr:`~numeric.constraints.base.ConstraintSet.marks`): the simplex (no values) where every keyword
    leaves its set out, else the first of :data:`SETS` that
    :meth:`~numeric.constraints.base.ConstraintSet.asks` for them; a keyword no set has is a :class:`TypeError`,
    values no set takes (or keywords of two sets) a :class:`ValueError`."""
    unknown = [k for k in constraints if k not in KEYWORDS]
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r} (constraint keywords: {', '.join(KEYWORDS)})")
    values = {**KEYWORDS, **constraints}
    if all(left_out(v, KEYWORDS[k]) for k, v in constraints.items()):
        return SIMPLEX, {}
    for cset in SETS:
        if cset.asks(values):
            stray = [k for k, v in constraints.items() if k not in cset.keywords and not left_out(v, KEYWORDS[k])
                     and not (k in cset.marks and v is cset.marks[k])]
            if stray:
                raise ValueError(f"the {cset.name} set takes {', '.join(cset.keywords) or 'no keywords'}; "
                                 f"{stray[0]}= belongs to another set (sets do not combine)")
            return cset, {**{k: values[k] for k in cset.keywords}, **cset.marks}
    given = ", ".join(f"{k}={v!r}" for k, v in constraints.items())
    raise ValueError(f"no constraint set takes {given}")


def simplex_only(constraints: dict, name: str) -> None:
    """Refuses constraint keywords for a map that runs on the simplex only (:class:`ValueError`); checks them first
    (:func:`choose`)."""
    cset, _ = choose(constraints)
    if cset is not SIMPLEX:
        raise ValueError(f"{name} takes no box constraints or other constraint sets ({', '.join(constraints)}=): its "
                         f"regularizer is not separable")
