"""The threshold solver of :mod:`numeric.core` traced into CUDA: the row kernels' forward pass.

:func:`numeric.core.rules.solve` is written once against
:class:`numeric.core.ops.TensorOps` on 2-D arrays of rows.  :class:`RowTracer`
is such a target whose "arrays" are one row of a CUDA block (one block per
row), so running ``solve`` on it prints the solve as CUDA C++:

* a row-wide value (shape ``(rows, 1)`` on the host: a maximum, a threshold, a
  flag) is a :class:`derive.codegen.trace.Value`, a local every thread of the
  block holds alike;
* a value per score (shape ``(rows, n)``) is a
  :class:`derive.codegen.trace_values.Elem`, an expression over the row's
  scores ``sr[j]`` and row-wide values, evaluated lazily: a
  reduction (``row_sum``, ``row_max``) prints a loop over the thread's scores
  ``j`` computing the expressions it needs, then the block reduction; the
  reductions that come one after another in a function share one loop;
* ``repeat`` prints a ``for`` loop, ``branch`` an ``if`` (its results are
  selected afterwards, ``pred ? a : b``), ``rare`` takes its first function (as
  JAX under ``jit`` does);
* a per-score value that a loop carries from round to round and reads (the KKT
  solve's ``p``) is stored in the output row ``pr`` between rounds; one that the
  loop only writes (the power Newton's last ``p``) stays an expression.  A read of
  the row after it was written over is an error of the trace (:class:`TraceError`),
  as is an operation device code cannot run (a sort).

Device functions.  While ``solve`` is traced, every function of
:data:`TRACED_MODULES` (``numeric.core``'s rules, halley, kkt, derivatives and
ops, and ``numeric.newton``) that the trace meets is printed as a ``__device__``
function of its own and called (:meth:`RowTracer.device_call`), so the CUDA
mirrors the functions of ``numeric.core`` and their calls:

* a row-wide argument is a parameter, named after the Python one; a per-score
  argument (an expression) is passed as the row-wide values it reads
  (``y_0``, ``y_1``...), and the function evaluates it over the row itself (it
  takes the row pointers ``sr``, ``pr``, ``cols``, ``shared`` and the map where
  its text uses them); Python values (numbers, flags, the map's routines) are
  part of its text;
* a row-wide result is a reference parameter (``ret0``...); a per-score result
  stays an expression, which the caller evaluates where it reads it, from the
  row-wide values it reads (results too);
* a function that takes or returns a Python function (a closure over its
  caller's values: ``halley_threshold``'s ``weights``), or prints fewer than
  three statements, is printed inline, as are nested functions (closures);
* the rows' versions are the trace's, not a function's: a read of a row
  written over is found across calls, and a call that writes the output row
  stays where nothing reads its results; a function that reads a per-score value
  a loop of its caller carries makes that loop keep it in ``pr`` (as a read
  in the loop's own text does);
* a call ends the queue of reductions before it (a reduction does not share a
  loop with one on the other side of a call; each has its own accumulator, so
  the numbers do not change);
* :mod:`derive.codegen.trace_print` prints what the trace recorded: pruned
  across calls (a function is printed for the results its caller reads and
  takes only the arguments it reads), locals declared where first used, and
  one device function per text of a Python function (``rg_threshold_round``;
  another text of it, e.g. for another kind of map: ``rg_root_rule_2``).

The trace is map-independent: it calls the map's routines as methods of the
map's struct (``map.omega_prime(p)``, see ``numeric/kernels/rows.cuh``).  The
choices ``solve`` makes in Python from a module's constants (the threshold
kind, the link's form, whether a routine exists, whether ``omega'(0+)`` is
``-inf``) make one trace per kind of map, a :class:`Solver` of :data:`SOLVERS`;
:func:`rows_solve_parts` prints them all with their device functions, in parts of
at most :data:`PART_LINES` lines, and the function ``rg_solve_row<M, T>`` that picks
the one the struct names (``M::solver``).  ``regattn generate`` writes them to
``numeric/_generated/rows_solve.py`` and the parts it names (``rows_solve_01.py``...).
"""
from __future__ import annotations

import functools
import inspect
import math
import re
import sys
from dataclasses import dataclass

import numpy as np

from numeric import newton
from numeric.core import derivatives, halley, kkt, rules
from numeric.core import ops as core_ops
from numeric.core.ops import Routines, TensorOps

from .trace import CudaTracer, Value
from .trace_print import Call, Printer, declare, is_local, param_name, prune
from .trace_values import Elem, Pair, leaves, map_values, rebuild, walk

__all__ = ["TraceError", "Elem", "Pair", "RowTracer", "Solver", "SOLVERS", "solver_for", "trace_solver",
           "JVP_FORMS", "jvp_form", "trace_jvp", "solver_enum_source", "rows_solve_parts", "rows_solve_source",
           "PART_LINES", "TRACED_MODULES"]


class TraceError(Exception):
    """An algorithm did something the row trace cannot print (a sort, a read of a row written over)."""


class RowTracer(CudaTracer, TensorOps):
    """:class:`numeric.core.ops.TensorOps` printing CUDA for one row of a block (see the module's text).

    The printed code reads the row's scores from ``sr`` (:attr:`scores`; other input rows: :meth:`row`), its
    length from ``cols``, writes into the row ``out`` (``pr``) and reduces through ``shared``
    (``rg_block_sum``, ``rg_block_max``).
    """

    sorts = False
    candidates_from = math.inf

    def __init__(self, indent: str = "    ", out: str = "pr"):
        super().__init__(indent)
        self.decls: list[str] = []
        self.pending: list[tuple[str, str, Elem]] = []  # (sum | max | store, accumulator or row, expression)
        self.out = out
        self.versions = {out: 0}
        self.calls: list[Call] = []  # the device functions' calls, each printed as the line ``@index``
        self.loops = 0  # (the loops traced, over every function: a loop's state placeholders are named after it)
        self.cols = Value(self, "T(cols)")
        self.tiny = Value(self, "rg_tiny<T>()")
        self.scores = self.row("sr")

    def row(self, name: str) -> Elem:
        """The input row ``name`` (a pointer of the printed function), a value per score."""
        return Elem(self, f"{name}[j]")

    # ------------------------------------------------------------ statements
    def literal(self, x) -> str:
        if isinstance(x, (bool, np.bool_)):
            return "true" if x else "false"
        x = float(x)
        if math.isnan(x):
            return "rg_nan<T>()"
        if math.isinf(x):
            return "rg_inf<T>()" if x > 0 else "(-rg_inf<T>())"
        return f"T({x!r})"

    def value(self, x) -> Value:
        if isinstance(x, Elem):
            raise TraceError("a value per score where a row-wide one is needed")
        return super().value(x)

    def _name(self, kind: str, prefix: str | None = None) -> str:
        self.count += 1
        name = f"{prefix or ('b' if kind == 'bool' else 'v')}{self.count}"
        self.decls.append(f"{kind} {name} = {'false' if kind == 'bool' else 'T(0)'};")
        return name

    def line(self, text: str) -> None:
        self.flush()
        self.lines.append(self.indent + text)

    def let(self, expr: str, kind: str = "T") -> Value:
        self.flush()
        name = self._name(kind)
        self.lines.append(f"{self.indent}{name} = {expr};")
        return Value(self, name, kind)

    def call(self, fname: str, *args):
        if any(isinstance(a, Elem) for a in args):
            return Elem(self, f"{fname}({', '.join('{%d}' % i for i in range(len(args)))})",
                        tuple(a if isinstance(a, Elem) else self.value(a) for a in args))
        return super().call(fname, *args)

    def _elementwise(self, template: str, *args, kind: str = "T"):
        """``template`` (over ``{0}``, ``{1}``...) of ``args``: per score where one is, else row-wide."""
        if any(isinstance(a, Elem) for a in args):
            return Elem(self, template, tuple(a if isinstance(a, Elem) else self.value(a) for a in args), kind)
        return self.let(template.format(*(self.value(a).text for a in args)), kind)

    # ------------------------------------------------------------ reductions and stores
    def _pend(self, what: str, target: str, e: Elem) -> None:
        """Queues a reduction or a store of ``e``; a loop over the row prints the queue (:meth:`flush`)."""
        nodes = walk([e])
        for v in nodes:
            if isinstance(v, Elem) and v.buffer is not None and v.buffer[1] != self.versions[v.buffer[0]]:
                raise TraceError(f"the row {v.buffer[0]} is read after it was written over")
        queued = {t for _, t, _ in self.pending}
        if any(isinstance(v, Value) and v.text in queued for v in nodes):
            self.flush()  # (it reads a reduction still queued)
        self.pending.append((what, target, e))

    def _reduce(self, what: str, x):
        if not isinstance(x, Elem):
            raise TraceError(f"row_{what} of a row-wide value")
        name = self._name("T", "acc")
        if what == "sum":  # (the thread's sum is compensated: ``acc`` less its carry ``acc_c``)
            self.decls.append(f"T {name}_c = T(0);")
        self._pend(what, name, x)
        return Value(self, name)

    def row_sum(self, x):
        return self._reduce("sum", x)

    def row_max(self, x):
        return self._reduce("max", x)

    def store(self, e) -> Elem:
        """``e`` written into the output row; the leaf that reads it back."""
        if not isinstance(e, Elem):
            e = Elem(self, self.value(e).text, (), self.value(e).kind)
        self._pend("store", self.out, e)
        self.flush()
        self.versions[self.out] += 1
        return Elem(self, f"{self.out}[j]", (), e.kind, (self.out, self.versions[self.out]))

    def flush(self) -> None:
        """Prints the queued reductions and stores: one loop over the thread's scores, then the block reductions."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        ind = self.indent
        for what, target, _ in pending:
            if what == "sum":
                self.lines.append(f"{ind}{target} = T(0);")
                self.lines.append(f"{ind}{target}_c = T(0);")
            elif what == "max":
                self.lines.append(f"{ind}{target} = -rg_inf<T>();")
        self.lines.append(f"{ind}for (long long j = threadIdx.x; j < cols; j += blockDim.x) {{")
        memo: dict = {}  # id(Elem) and expression text -> its local
        body: list[str] = []
        writes = []
        for what, target, e in pending:
            text = self._emit(e, memo, body)
            if what == "sum":
                body.append(f"rg_add_compensated({target}, {target}_c, {text});")
            elif what == "max":
                body.append(f"{target} = ({text} > {target} || {text} != {text}) ? {text} : {target};")
            else:
                writes.append(f"{target}[j] = {text};")
        self.lines.extend(f"{ind}    {b}" for b in body + writes)
        self.lines.append(f"{ind}}}")
        for what, target, _ in pending:
            if what == "sum":
                self.lines.append(f"{ind}{target} = rg_block_sum({target} - {target}_c, shared);")
            elif what == "max":
                self.lines.append(f"{ind}{target} = rg_block_max({target}, shared);")

    def _emit(self, e, memo: dict, out: list) -> str:
        """The text of ``e`` inside the loop over scores, its nodes declared into ``out`` once each."""
        if isinstance(e, Value):
            return e.text
        if id(e) in memo:
            return memo[id(e)]
        if not e.args:
            return e.op
        args = [self._emit(a, memo, out) for a in e.args]
        text = e.op.format(*args)
        if text in memo:  # (the same expression built twice)
            memo[id(e)] = memo[text]
            return memo[text]
        self.count += 1
        name = f"e{self.count}"
        out.append(f"const {e.kind} {name} = {text};")
        memo[id(e)] = memo[text] = name
        return name

    # ------------------------------------------------------------ TensorOps
    def full(self, like, value):
        if isinstance(like, Elem):
            v = self.value(value)
            return Elem(self, v.text, (), v.kind)
        return self.value(value)

    def exp(self, x):
        return self.call("rg_exp", x)

    def log(self, x):
        return self.call("rg_log", x)

    def where(self, cond, a, b):
        if isinstance(a, Pair) or isinstance(b, Pair):
            if not (isinstance(a, Pair) and isinstance(b, Pair)):
                raise TraceError("a pair selected against a single value")
            return Pair(self.where(cond, a[..., :1], b[..., :1]), self.where(cond, a[..., 1:], b[..., 1:]))
        if isinstance(cond, bool):
            return a if cond else b
        if a is b:
            return a
        if any(isinstance(v, Elem) for v in (cond, a, b)):
            args = tuple(v if isinstance(v, Elem) else self.value(v) for v in (cond, a, b))
            return Elem(self, "{0} ? {1} : {2}", args, args[1].kind)
        return super().where(cond, a, b)

    def not_(self, b):
        if isinstance(b, bool):
            return not b
        return self._elementwise("!{0}", b, kind="bool")

    def float_(self, b):
        return self.where(b, 1.0, 0.0)

    def pos_part(self, x):  # (NaN stays NaN, -inf to 0)
        return self._elementwise("({0} < T(0) ? T(0) : {0})", x)

    def support(self, u):  # (1 where u > 0, 0 where u == 0, NaN stays NaN)
        return self._elementwise("({0} > T(0) ? T(1) : ({0} == T(0) ? T(0) : {0}))", u)

    def clamp_min(self, x, v):
        return self._elementwise("({0} < {1} ? {1} : {0})", x, v)

    def isfinite(self, x):
        return self._elementwise("(rg_fabs({0}) < rg_inf<T>())", x, kind="bool")

    def isnan(self, x):
        return self._elementwise("({0} != {0})", x, kind="bool")

    def cat(self, a, b):
        return Pair(a, b)

    def int_max(self, x):
        return None

    def _no_sort(self, *args):
        raise TraceError("device code does not sort a row")

    sort_desc = cumsum = top = put = _no_sort

    def invert_link(self, z, omega_prime, omega_second):
        # the map's own link: for a link with no closed form, numeric.newton.invert_link traced (rg_newton_link)
        return self.call("map.link", z)

    def rare(self, pred, fn, otherwise):
        return fn()

    def branch(self, pred, fn, otherwise):
        """``fn()`` under ``if (pred)``, ``otherwise()`` under ``else``, each value ``pred ? a : b`` after them (a
        per-score ``pred``: ``fn()``)."""
        if isinstance(pred, bool):
            return fn() if pred else otherwise()
        if isinstance(pred, Elem):
            return fn()
        pred = self.value(pred)
        self.flush()
        start, versions = len(self.lines), dict(self.versions)
        self.lines.append(f"{self.indent}if ({pred.text}) {{{_origin()}")
        outer, self.indent = self.indent, self.indent + "    "
        a = fn()
        self.flush()
        self.indent = outer
        self.lines.append(f"{self.indent}}} else {{")
        self.indent = outer + "    "
        b = otherwise()
        self.flush()
        self.indent = outer
        self.lines.append(f"{self.indent}}}")
        if self.versions != versions:
            raise TraceError("a branch writes the row")
        if len(self.lines) == start + 3:  # neither side printed anything
            del self.lines[start:]
        return self._select(pred, a, b)

    def _select(self, pred, a, b):
        if isinstance(a, tuple):
            return tuple(self._select(pred, x, y) for x, y in zip(a, b, strict=True))
        return self.where(pred, a, b)

    def repeat(self, n, body, state, going):
        """A ``for`` loop of at most ``n`` rounds while ``going`` (row-wide)."""
        state = tuple(state)
        if isinstance(going, Elem):
            raise TraceError("a loop per score")
        self.flush()
        mark, count, decls, versions = len(self.lines), self.count, len(self.decls), dict(self.versions)
        indent, calls = self.indent, len(self.calls)
        self.loops += 1
        loop = self.loops
        try:
            return self._loop(n, body, state, going, store=False, loop=loop)
        except _ReadsState as e:
            if loop not in e.loops:
                raise
            del self.lines[mark:], self.decls[decls:], self.calls[calls:]
            self.count, self.versions, self.pending, self.indent = count, versions, [], indent
            return self._loop(n, body, state, going, store=True, loop=loop)

    def _loop(self, n, body, state, going, store: bool, loop: int):
        self.count += 1
        tag = self.count
        per_score = [isinstance(v, Elem) for v in state]
        if sum(per_score) > 1 and store:
            raise TraceError("a loop carries more than one value per score")
        names = {}
        for i, v in enumerate(state):
            if not per_score[i]:
                v = self.value(v)
                names[i] = f"s{tag}_{i}"
                self.decls.append(f"{v.kind} {names[i]} = {'false' if v.kind == 'bool' else 'T(0)'};")
                self.lines.append(f"{self.indent}{names[i]} = {v.text};")
        marks = {}
        for i, v in enumerate(state):
            if per_score[i]:
                if store:
                    marks[i] = self.store(v)
                else:
                    marks[i] = Elem(self, f"STATE{loop}_{i}", (), v.kind)
        ran = self._name("bool", "ran")
        self.line(f"{ran} = false;")
        go = self._name("bool", "go")
        self.line(f"{go} = {self.value(going).text};")
        self.line(f"for (int i{tag} = 0; i{tag} < {n} && {go}; ++i{tag}) {{{_origin()}")
        outer, self.indent = self.indent, self.indent + "    "
        start = len(self.lines)
        current = tuple(marks[i] if per_score[i] else self.let(names[i], self.value(state[i]).kind)
                        for i in range(len(state)))
        new, cont = body(current)
        new = tuple(new)
        if not store:
            reads = any(isinstance(v, Elem) and v.op.startswith(f"STATE{loop}_") for v in walk(
                [x for x in new if isinstance(x, Elem)] + [e for _, _, e in self.pending]))
            if reads or any(f"STATE{loop}_" in text for text in self.lines[start:]):
                raise _ReadsState({loop})
        for i, v in enumerate(new):
            if per_score[i] and store:
                self.store(v)
        cont = self.value(cont)
        for i, v in enumerate(new):
            if not per_score[i]:
                if isinstance(v, Elem):
                    raise TraceError("a loop's row-wide value becomes a value per score")
                self.line(f"{names[i]} = {self.value(v).text};")
        self.line(f"{ran} = true;")
        self.line(f"{go} = {cont.text};")
        self.indent = outer
        self.line("}")
        out = []
        for i, v in enumerate(state):
            if not per_score[i]:
                out.append(Value(self, names[i], self.value(v).kind))
            elif store:
                out.append(Elem(self, f"{self.out}[j]", (), v.kind, (self.out, self.versions[self.out])))
            else:
                out.append(self.where(Value(self, ran, "bool"), new[i], v))
        return tuple(out)

    # ------------------------------------------------------------ device functions
    def _enter(self):
        """A new function's text (its own lines, locals and queue); returns the caller's, for :meth:`_leave`."""
        saved = (self.lines, self.decls, self.pending, self.indent, self.count)
        self.lines, self.decls, self.pending, self.indent, self.count = [], [], [], "    ", 0
        return saved

    def _leave(self, saved) -> None:
        self.lines, self.decls, self.pending, self.indent, self.count = saved

    def device_call(self, fn, args: tuple, kwargs: dict):
        """``fn(*args, **kwargs)``, a function of :mod:`numeric` met by the trace, printed as a device function of
        its own and called (see the module's text); inline where it takes or returns a Python function, or prints
        fewer than :data:`_SMALL` statements."""
        bound = inspect.signature(fn).bind(*args, **kwargs)
        if any(_opaque(x) for x in leaves(bound.arguments.values())):
            return fn(*args, **kwargs)
        versions, calls = dict(self.versions), len(self.calls)
        params: list[tuple[str, str]] = []  # (kind, name) in the function
        passed: list[str] = []  # the caller's value of each
        inward: dict[str, Value] = {}  # the caller's local -> the parameter
        outward: dict[str, Value] = {}  # the parameter -> the caller's value
        memo: dict[int, Elem] = {}

        def param(v: Value, name) -> Value:
            if not is_local(v):
                return v
            if v.text not in inward:
                name = param_name(name if isinstance(name, str) else name(), {n for _, n in params})
                inward[v.text] = Value(self, name, v.kind)
                outward[name] = v
                params.append((v.kind, name))
                passed.append(v.text)
            return inward[v.text]

        def into(x, name: str):
            if isinstance(x, Value):
                return param(x, name)
            if isinstance(x, Elem):  # (its row-wide values: name_0, name_1...)
                numbers = iter(range(1 << 30))
                return rebuild(x, lambda v: param(v, lambda: f"{name}_{next(numbers)}"), memo)
            if isinstance(x, Pair):
                return Pair(into(x.a, f"{name}_0"), into(x.b, f"{name}_1"))
            if isinstance(x, (tuple, list)):
                return type(x)(into(e, f"{name}_{i}") for i, e in enumerate(x))
            return x

        for name, value in list(bound.arguments.items()):
            bound.arguments[name] = into(value, name)
        saved = self._enter()
        try:
            result = fn(*bound.args, **bound.kwargs)
            self.flush()
        except BaseException:
            self._leave(saved)
            del self.calls[calls:]
            raise
        lines, decls = self.lines, self.decls
        self._leave(saved)
        if len(lines) < _SMALL or any(_opaque(x) for x in leaves([result])):
            self.versions = versions
            del self.calls[calls:]
            return fn(*args, **kwargs)
        read = {int(k) for k in re.findall(r"STATE(\d+)_", "\n".join(lines))}
        if read:  # (it reads a value per score that a loop of its caller carries)
            del self.calls[calls:]
            raise _ReadsState(read)
        rets: list[tuple[str, str]] = []
        back: dict[str, Value] = dict(outward)  # the function's value -> the caller's

        def ret(v: Value) -> Value:
            if not is_local(v):
                return v
            if v.text not in back:
                rets.append((v.kind, f"ret{len(rets)}"))
                lines.append(f"    ret{len(rets) - 1} = {v.text};")
                back[v.text] = None  # (the caller's local: below)
                order.append(v.text)
            return v

        order: list[str] = []
        map_values(result, ret)
        outs = []
        for text, (kind, _) in zip(order, rets):
            back[text] = Value(self, self._name(kind), kind)
            outs.append(back[text].text)
        self.calls.append(Call(fn, params, passed, rets, outs, ["    " + d for d in decls] + lines,
                                self.versions != versions))
        self.line(f"@{len(self.calls) - 1}")
        return map_values(result, lambda v: back.get(v.text, v) if is_local(v) else v, {})


def _origin() -> str:
    """``  // module.function``: the function of :mod:`numeric` whose loop or branch is being printed (the nearest
    caller outside the operations), as a comment that ties the printed code to its text."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        module = frame.f_globals.get("__name__", "")
        if module.startswith("numeric.") and not hasattr(TensorOps, code.co_name) and code.co_name != "<lambda>":
            return f"  // {module.rsplit('.', 1)[-1]}.{code.co_name}"
        frame = frame.f_back
    return ""


class _ReadsState(Exception):
    """A loop's body reads the value per score it carries: it is traced again with that value in memory
    (``loops``: the loops whose values were read, by number)."""

    def __init__(self, loops):
        super().__init__(loops)
        self.loops = set(loops)


#: A function whose trace prints fewer statements than this is printed inline.
_SMALL = 3


def _opaque(x) -> bool:
    """A value a device function cannot take or return: a Python function (a closure over the caller's values)."""
    return callable(x) and not isinstance(x, (RowTracer, Routines, type))


#: The modules whose functions the trace prints as device functions (the solve's, and the safeguard it calls).
TRACED_MODULES = (rules, halley, kkt, derivatives, core_ops, newton)


class _DeviceFunctions:
    """While active, every function of :data:`TRACED_MODULES` called from those modules goes through
    :meth:`RowTracer.device_call` of ``tracer`` (the modules' names are bound to wrappers, then restored)."""

    def __init__(self, tracer: RowTracer):
        self.tracer = tracer
        self.saved: list[tuple[object, str, object]] = []

    def __enter__(self):
        names = {m.__name__ for m in TRACED_MODULES}
        wrapped: dict[int, object] = {}
        for module in TRACED_MODULES:
            for name, fn in list(vars(module).items()):
                if inspect.isfunction(fn) and fn.__module__ in names:
                    if id(fn) not in wrapped:
                        wrapped[id(fn)] = self._wrap(fn)
                    self.saved.append((module, name, fn))
                    setattr(module, name, wrapped[id(fn)])
        return self

    def __exit__(self, *exc):
        for module, name, fn in reversed(self.saved):
            setattr(module, name, fn)
        self.saved.clear()

    def _wrap(self, fn):
        tracer = self.tracer

        @functools.wraps(fn)
        def device(*args, **kwargs):
            return tracer.device_call(fn, args, kwargs)

        return device

@dataclass(frozen=True)
class Solver:
    """One trace of :func:`numeric.core.rules.solve`: the module constants and routines its choices read.

    ``routines``: those the map has (besides ``omega``, its derivatives, ``weight``, ``weight_d2`` and
    ``clip``); ``exponent``: the power form's ``k`` where it is a number the rules branch on; ``dense``:
    ``omega'(0+) = -inf`` (the KKT solve's start and steps differ)."""

    name: str
    threshold: str
    link_form: str
    routines: tuple[str, ...]
    exponent: float | None = None
    dense: bool = False
    doc: str = ""

    @property
    def enum(self) -> str:
        return f"RG_SOLVE_{self.name.upper()}"


_COMMON = ("omega", "omega_prime", "omega_second", "omega_third", "weight", "weight_d2", "clip")

#: The kinds of map the row kernels solve, each a trace of ``solve`` (:func:`solver_for` picks one).
SOLVERS: tuple[Solver, ...] = (
    Solver("closed", "closed", "exp", ("term", "tau_from_sum"), doc="a closed threshold: p = B(y) / sum B(y)"),
    Solver("sort_linear", "sort", "power", ("link", "link_scale", "link_exponent", "tau_candidate"), 1.0,
           doc="a sort threshold, link (a (z - clip))_+: support rule (Michelot)"),
    Solver("sort_square", "sort", "power", ("link", "link_scale", "link_exponent", "tau_candidate", "discriminant"),
           2.0, doc="a sort threshold, link (a (z - clip))_+**2: support rule with Newton steps"),
    Solver("sort_link", "sort", "other", ("link", "link_dtau", "tau_candidate"),
           doc="a sort threshold of degree 1, another link: support rule with Newton steps"),
    Solver("sort_link_quadratic", "sort", "other", ("link", "link_dtau", "tau_candidate", "discriminant"),
           doc="a sort threshold of degree 2, another link: support rule with Newton steps"),
    Solver("root_power", "root", "power", ("link", "link_scale", "link_exponent"),
           doc="a root threshold, link (a (z - clip))_+**k: Newton on F**(1/k), safeguarded Halley for k < 1"),
    Solver("root_link", "root", "other", ("link",), doc="a root threshold, a printed link: safeguarded Halley"),
    Solver("kkt", "root", "other", (), doc="a link with no closed form, omega'(0+) finite: Newton on the KKT system"),
    Solver("kkt_dense", "root", "other", (), dense=True,
           doc="a link with no closed form, omega'(0+) = -inf: Newton on the KKT system"),
)


def solver_for(threshold: str, degree, link_method: str, link_form: str, exponent, dense: bool) -> Solver:
    """The :class:`Solver` of a map: its threshold kind and degree, how its link is found (``"closed"``,
    ``"newton"``), the link's form and its exponent (a number or ``None``), and whether ``omega'(0+) = -inf``."""
    by = {s.name: s for s in SOLVERS}
    if threshold == "closed":
        return by["closed"]
    if threshold == "sort":
        if link_form == "power" and exponent in (1, 2):
            return by["sort_linear" if exponent == 1 else "sort_square"]
        return by["sort_link_quadratic" if degree == 2 else "sort_link"]
    if link_method != "closed":
        return by["kkt_dense" if dense else "kkt"]
    return by["root_power" if link_form == "power" else "root_link"]


class _Module:
    """The constants of a map module that :func:`numeric.core.rules.solve` reads."""

    def __init__(self, solver: Solver):
        self.THRESHOLD = solver.threshold
        self.LINK_FORM = solver.link_form
        self.TERM_IS_EXP = False
        # (a printed link's kernels serve sparse and dense maps alike, their clip a value: unknown, None)
        self.SPARSE = False if solver.dense else None


def _routines(tracer: RowTracer, solver: Solver) -> Routines:
    """The map's routines as calls of its struct's methods (``clip``: ``-inf`` where dense; ``link_exponent``:
    the number a sort map's power form has)."""
    table = {}
    for name in (*_COMMON, "term", "tau_from_sum", "link", "link_dtau", "link_scale", "link_exponent",
                 "tau_candidate", "discriminant"):
        if name in _COMMON or name in solver.routines:
            table[name] = (lambda *args, name=name: tracer.call(f"map.{name}", *args))
        else:
            table[name] = None
    if solver.dense:
        table["clip"] = lambda: -math.inf
    if solver.exponent is not None:
        table["link_exponent"] = lambda: solver.exponent
    return Routines(_Module(solver), table)


def trace_solver(solver: Solver, printer: Printer | None = None) -> str:
    """``template <class M, typename T> __device__ void rg_solve_NAME(const M& map, const T* sr, T* pr, long long
    cols, T* shared, T& tau)``: :func:`numeric.core.rules.solve` of one row, traced; the device functions it calls
    are added to ``printer`` (where ``None``, printed before it)."""
    own = printer is None
    printer = Printer() if own else printer
    tr = RowTracer()
    solve = rules.solve
    with _DeviceFunctions(tr):
        p, tau = solve(tr, _routines(tr, solver), tr.scores)
        tr.store(p)
        tau = tr.value(tau)
    body = declare(printer.body(tr, [tr.indent + d for d in tr.decls] + tr.lines + [f"    tau = {tau.text};"],
                                 keep=("tau",)))
    return "\n".join([
        *(printer.functions if own else []),
        f"// {solver.doc}",
        "template <class M, typename T>",
        f"__device__ void rg_solve_{solver.name}(const M& map, const T* sr, T* pr, long long cols, T* shared, T& tau) {{",
        *body, "}"])


def solver_enum_source() -> str:
    """The enum ``rg_solver`` naming every :class:`Solver` (a map's struct names one: it comes before the maps'
    device functions)."""
    return "\n".join(["#ifndef REGATTN_SOLVER_ENUM", "#define REGATTN_SOLVER_ENUM",
                      f"enum rg_solver {{ {', '.join(s.enum for s in SOLVERS)} }};", "#endif"])


#: The JVP's two forms (:func:`numeric.core.derivatives.weights`): a link of the power form takes its weight as
#: ``a k exp((1 - 1/k) log p)``, another the map's ``weight``.
JVP_FORMS = ("power", "general")


def jvp_form(solver: Solver) -> str:
    return "power" if solver.link_form == "power" else "general"


def trace_jvp(form: str) -> str:
    """``template <class M, typename T> __device__ void rg_jvp_FORM(const M& map, const T* pr, const T* vr, T* out,
    long long cols, T* shared)``: :func:`numeric.core.derivatives.jvp` of one row (``J v`` at ``p``), traced."""
    tr = RowTracer(out="out")
    solver = next(s for s in SOLVERS if s.threshold == "root" and s.link_form == ("power" if form == "power" else "other"))
    r = _routines(tr, solver)
    tr.store(derivatives.jvp(tr, r, tr.row("pr"), tr.row("vr")))
    body = declare(prune([tr.indent + d for d in tr.decls] + tr.lines))
    return "\n".join([
        f"// J v = w*v - w (w.v) / sum(w) at p, w = weight(p) on the support ({form} link)",
        "template <class M, typename T>",
        f"__device__ void rg_jvp_{form}(const M& map, const T* pr, const T* vr, T* out, long long cols, T* shared) {{",
        *body, "}"])


#: The most lines of CUDA in one generated file of the row solves (:func:`rows_solve_parts`).
PART_LINES = 640


def rows_solve_parts(limit: int = PART_LINES) -> tuple[list[str], str]:
    """``(parts, main)``: the CUDA text of every :class:`Solver`'s trace, its device functions each once and
    before their callers, in ``parts`` of at most ``limit`` lines (in order: each part may call the functions of
    those before it); ``main``: the JVP's traces (:data:`JVP_FORMS`), ``rg_solve_row<M, T>(map, sr, pr, cols,
    shared, tau)``, which calls the solve ``M::solver`` names, and ``rg_jvp_row``."""
    printer = Printer()
    texts = []
    for s in SOLVERS:
        start = len(printer.functions)
        solver = trace_solver(s, printer)
        texts.extend(printer.functions[start:])
        texts.append(solver)
    parts: list[list[str]] = [[]]
    for text in texts:
        size = text.count("\n") + 1
        if size + 3 > limit:
            raise TraceError(f"a traced function of {size} lines does not fit in a part of {limit}")
        if sum(t.count("\n") + 1 for t in parts[-1]) + size + 3 > limit:
            parts.append([])
        parts[-1].append(text)
    pick = []
    for i, s in enumerate(SOLVERS):
        head = "if constexpr" if i == 0 else "} else if constexpr"
        pick.append(f"    {head} (M::solver == {s.enum}) {{")
        pick.append(f"        rg_solve_{s.name}(map, sr, pr, cols, shared, tau);")
    pick.append("    }")
    power = " || ".join(f"M::solver == {s.enum}" for s in SOLVERS if jvp_form(s) == "power")
    main = "\n".join([
        "#ifndef REGATTN_ROWS_SOLVE",
        "#define REGATTN_ROWS_SOLVE",
        *[trace_jvp(form) for form in JVP_FORMS],
        "// the solve of the kind of map M::solver names",
        "template <class M, typename T>",
        "__device__ void rg_solve_row(const M& map, const T* sr, T* pr, long long cols, T* shared, T& tau) {",
        *pick, "}",
        "// the JVP of the form of M's link",
        "template <class M, typename T>",
        "__device__ void rg_jvp_row(const M& map, const T* pr, const T* vr, T* out, long long cols, T* shared) {",
        f"    if constexpr ({power}) {{",
        "        rg_jvp_power(map, pr, vr, out, cols, shared);",
        "    } else {",
        "        rg_jvp_general(map, pr, vr, out, cols, shared);",
        "    }",
        "}", "#endif"])
    return [_guarded(f"REGATTN_ROWS_SOLVE_{k + 1}", part) for k, part in enumerate(parts)], main


def _guarded(guard: str, texts: list[str]) -> str:
    return "\n".join([f"#ifndef {guard}", f"#define {guard}", *texts, "#endif"])


def rows_solve_source() -> str:
    """The whole CUDA text of the row solves: :func:`rows_solve_parts`' parts, then its main text."""
    parts, main = rows_solve_parts()
    return "\n".join([*parts, main])
