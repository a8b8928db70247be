"""The values per score of a row trace (:mod:`derive.codegen.trace_rows`), and the walks over them.

A row-wide value (a maximum, a threshold, a flag) is a
:class:`derive.codegen.trace.Value`, a local every thread of the block holds
alike.  A value per score is an :class:`Elem`: an expression over the row's
scores ``sr[j]`` and row-wide values, which the tracer evaluates lazily, in the
loop over the thread's scores of the reduction or store that reads it.  A
:class:`Pair` is two values side by side (``TensorOps.cat``).
"""
from __future__ import annotations

from .trace import Operators, Value

__all__ = ["Elem", "Pair", "walk", "leaves", "rebuild", "map_values"]


class Elem(Operators):
    """A value per score of the row: an expression ``op`` (``str.format`` over ``args``, Elem or Value) of kind
    ``"T"`` or ``"bool"``; a leaf has no ``args`` (``sr[j]``, a constant); ``buffer``: ``(name, version)`` of a
    row of memory the leaf reads; ``tracer``: the :class:`derive.codegen.trace_rows.RowTracer` tracing it."""

    elementwise = True

    def __init__(self, tracer, op: str, args: tuple = (), kind: str = "T", buffer=None):
        self.tracer, self.op, self.args, self.kind, self.buffer = tracer, op, args, kind, buffer

    @property
    def shape(self):
        return (None, self.tracer.cols)

    def __getitem__(self, key):
        # (y[..., :1]: a row-wide value of the row's shape, which the rules pass to ``full`` as ``like``)
        return self.tracer.value(0.0)

    def _bin(self, op, other, kind="T", swap=False):
        o = other if isinstance(other, Elem) else self.tracer.value(other)
        a, b = (o, self) if swap else (self, o)
        return Elem(self.tracer, f"{{0}} {op} {{1}}", (a, b), kind)

    def __neg__(self): return Elem(self.tracer, "-{0}", (self,))
    def __abs__(self): return Elem(self.tracer, "rg_fabs({0})", (self,))


class Pair:
    """Two values side by side (``TensorOps.cat``): ``both[..., :n]`` is the first, ``both[..., n:]`` the second."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __getitem__(self, key):
        part = key[-1]
        return self.a if part.stop is not None else self.b


def walk(values):
    """Every Elem and Value the expressions ``values`` read (each once)."""
    seen, stack, out = set(), list(values), []
    while stack:
        v = stack.pop()
        if id(v) in seen or not isinstance(v, (Elem, Value)):
            continue
        seen.add(id(v))
        out.append(v)
        if isinstance(v, Elem):
            stack.extend(v.args)
    return out


def leaves(values):
    """Every value in ``values``, looking into tuples, lists and pairs."""
    out, stack = [], list(values)
    while stack:
        x = stack.pop()
        if isinstance(x, (tuple, list)):
            stack.extend(x)
        elif isinstance(x, Pair):
            stack.extend((x.a, x.b))
        else:
            out.append(x)
    return out


def rebuild(e: Elem, fn, memo: dict) -> Elem:
    """``e`` with each row-wide value ``v`` it reads replaced by ``fn(v)`` (``memo``: id -> new node, so that shared
    nodes stay shared)."""
    if id(e) in memo:
        return memo[id(e)]
    if not e.args:
        new = e
    else:
        args = tuple(rebuild(a, fn, memo) if isinstance(a, Elem) else fn(a) for a in e.args)
        new = Elem(e.tracer, e.op, args, e.kind, e.buffer)
    memo[id(e)] = new
    return new


def map_values(x, fn, memo: dict | None = None):
    """``x`` (a value, a value per score, or tuples, lists and pairs of them) with every row-wide value ``v`` replaced
    by ``fn(v)``."""
    memo = {} if memo is None else memo
    if isinstance(x, Value):
        return fn(x)
    if isinstance(x, Elem):
        return rebuild(x, fn, memo)
    if isinstance(x, Pair):
        return Pair(map_values(x.a, fn, memo), map_values(x.b, fn, memo))
    if isinstance(x, (tuple, list)):
        return type(x)(map_values(e, fn, memo) for e in x)
    return x
