"""Device code traced from the algorithms of :mod:`numeric` written against an operations interface.

:func:`numeric.newton.invert_link` (the inversion of a link with no closed form)
is written once, against :class:`numeric.newton.Ops`.  A :class:`Tracer` is such
an ``Ops`` whose values are expressions of a device language: every operation
appends one statement to :attr:`Tracer.lines` and returns the name it assigned,
so running the algorithm on a tracer prints it.  :class:`CudaTracer` prints
CUDA C++ (type-generic in ``T``), :class:`TritonTracer` the body of a
``@triton.jit`` function working on blocks (``tl.where`` for every update, a
``while`` loop that runs while any entry of the block is going).

The trace is map-independent: it calls ``omega'`` and ``omega''`` through two
function arguments.  :func:`newton_link_sources` prints it once for each
language, into package code that ``regattn generate`` writes
(``numeric/_generated/newton_link.py``: the CUDA template ``rg_newton_link``;
``numeric/_generated/newton_link_triton.py``: the Triton function
``newton_link``); a map without a closed-form link calls it with its own
derivatives.
"""

from __future__ import annotations

import numpy as np

from numeric.constraints.box import box_high, box_lowest, box_round, box_sums
from numeric.core import halley
from numeric.core.ops import TensorOps
from numeric.newton import Ops, invert_link, safeguarded_point

__all__ = ["Operators", "Value", "Tracer", "CudaTracer", "TritonTracer", "TritonRowsTracer", "newton_link_sources",
           "safeguard_source", "kept_threshold_source", "box_source"]


class Operators:
    """The arithmetic, comparisons and boolean ``&``, ``|`` of a traced value, each ``_bin(op, other, kind, swap)``
    (``&`` and ``|`` in the tracer's spelling, ``AND`` and ``OR``)."""

    tracer: Tracer

    def _bin(self, op, other, kind="T", swap=False):  # pragma: no cover - interface
        raise NotImplementedError

    def __add__(self, o): return self._bin("+", o)
    def __radd__(self, o): return self._bin("+", o, swap=True)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, swap=True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, swap=True)
    def __truediv__(self, o): return self._bin("/", o)
    def __rtruediv__(self, o): return self._bin("/", o, swap=True)
    def __lt__(self, o): return self._bin("<", o, "bool")
    def __le__(self, o): return self._bin("<=", o, "bool")
    def __gt__(self, o): return self._bin(">", o, "bool")
    def __ge__(self, o): return self._bin(">=", o, "bool")
    def __eq__(self, o): return self._bin("==", o, "bool")  # type: ignore[override]
    def __ne__(self, o): return self._bin("!=", o, "bool")  # type: ignore[override]
    def __and__(self, o): return self._bin(self.tracer.AND, o, "bool")
    def __rand__(self, o): return self._bin(self.tracer.AND, o, "bool", swap=True)
    def __or__(self, o): return self._bin(self.tracer.OR, o, "bool")
    def __ror__(self, o): return self._bin(self.tracer.OR, o, "bool", swap=True)

    __hash__ = None  # type: ignore[assignment]


class Value(Operators):
    """A value of a trace: the name of a local (or a literal) and its kind, ``"T"`` (a number) or ``"bool"``."""

    def __init__(self, tracer: Tracer, text: str, kind: str = "T"):
        self.tracer, self.text, self.kind = tracer, text, kind

    def _bin(self, op, other, kind="T", swap=False):
        if getattr(other, "elementwise", False):  # a value per score (derive.codegen.trace_rows.Elem) takes it
            return NotImplemented
        a, b = self.text, self.tracer.value(other).text
        return self.tracer.let(f"{b} {op} {a}" if swap else f"{a} {op} {b}", kind)

    def __neg__(self): return self.tracer.let(f"-{self.text}")
    def __abs__(self): return self.tracer.call(self.tracer.ABS, self)


class Tracer(Ops):
    """:class:`numeric.newton.Ops` whose values are a language's expressions; a language sets the spelling of
    its operators (``AND``, ``ABS``, ``EXP``), :meth:`literal`, :meth:`declare`, :meth:`where`, :meth:`not_`,
    :meth:`full` and :meth:`repeat`."""

    AND = "&"
    OR = "|"
    ABS = "abs"
    EXP = "exp"
    END = ""  # the end of a statement

    def __init__(self, indent: str = "    "):
        self.lines: list[str] = []
        self.indent = indent
        self.count = 0

    def literal(self, x) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    def declare(self, name: str, kind: str, expr: str, const: bool = True) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    def value(self, x) -> Value:
        if isinstance(x, Value):
            return x
        return Value(self, self.literal(x), "bool" if isinstance(x, (bool, np.bool_)) else "T")

    def let(self, expr: str, kind: str = "T") -> Value:
        self.count += 1
        name = f"{'b' if kind == 'bool' else 'v'}{self.count}"
        self.lines.append(self.indent + self.declare(name, kind, expr))
        return Value(self, name, kind)

    def call(self, fname: str, *args) -> Value:
        return self.let(f"{fname}({', '.join(self.value(a).text for a in args)})")

    def exp(self, x):
        return self.call(self.EXP, x)

    def _loop_state(self, state) -> tuple[int, list[str], list[str]]:
        """Declares the loop's state variables (mutable): ``(tag, names, kinds)``."""
        self.count += 1
        tag = self.count
        names = [f"s{tag}_{i}" for i in range(len(state))]
        kinds = [self.value(v).kind for v in state]
        for nm, v in zip(names, state):
            v = self.value(v)
            self.lines.append(self.indent + self.declare(nm, v.kind, v.text, const=False))
        return tag, names, kinds

    def _body(self, body, names, kinds) -> tuple[list[Value], Value]:
        """The loop's body, indented one level, with the new state assigned back: ``(new state, going)``."""
        new, going = body(tuple(Value(self, nm, kd) for nm, kd in zip(names, kinds)))
        for nm, v in zip(names, new):
            self.lines.append(f"{self.indent}{nm} = {self.value(v).text}{self.END}")
        return new, self.value(going)


class CudaTracer(Tracer):
    """CUDA C++, type-generic in ``T``: one entry per thread."""

    AND = "&&"
    OR = "||"
    ABS = "rg_fabs"
    EXP = "rg_exp"
    END = ";"

    def __init__(self, indent: str = "    "):
        super().__init__(indent)
        self.log_tiny = Value(self, "rg_log_tiny<T>()")
        self.eps = Value(self, "rg_eps<T>()")

    def literal(self, x) -> str:
        if isinstance(x, (bool, np.bool_)):
            return "true" if x else "false"
        return f"T({x!r})"

    def declare(self, name, kind, expr, const=True):
        return f"{'const ' if const else ''}{kind} {name} = {expr};"

    def full(self, like, value):
        return self.value(value)

    def where(self, cond, a, b):
        a, b = self.value(a), self.value(b)
        return self.let(f"{self.value(cond).text} ? {a.text} : {b.text}", a.kind)

    def not_(self, b):
        return self.let(f"!{self.value(b).text}", "bool")

    def repeat(self, n, body, state, going):
        tag, names, kinds = self._loop_state(state)
        self.lines.append(f"{self.indent}bool go{tag} = {self.value(going).text};")
        self.lines.append(f"{self.indent}for (int i{tag} = 0; i{tag} < {n} && go{tag}; ++i{tag}) {{")
        outer, self.indent = self.indent, self.indent + "    "
        _, cont = self._body(body, names, kinds)
        self.lines.append(f"{self.indent}go{tag} = {cont.text};")
        self.indent = outer
        self.lines.append(f"{self.indent}}}")
        return tuple(Value(self, nm, kd) for nm, kd in zip(names, kinds))


class TritonTracer(Tracer):
    """The body of a ``@triton.jit`` function on a block of float32 entries: every value has the block's shape
    (:meth:`full` broadcasts a constant to it), and a loop runs while any entry is going."""

    ABS = "tl.abs"
    EXP = "tl.exp"

    def __init__(self, indent: str = "    "):
        super().__init__(indent)
        self.log_tiny = self.value(float(np.log(np.finfo(np.float32).tiny)))
        self.eps = self.value(float(np.finfo(np.float32).eps))

    def literal(self, x) -> str:
        if isinstance(x, (bool, np.bool_)):
            return "True" if x else "False"
        return repr(float(x)) if np.isfinite(x) else f"float({str(float(x))!r})"

    def declare(self, name, kind, expr, const=True):
        return f"{name} = {expr}"

    def call_many(self, fname: str, n: int, *args) -> tuple[Value, ...]:
        """``fname(*args)`` returning a tuple of ``n`` numbers."""
        names = []
        for _ in range(n):
            self.count += 1
            names.append(f"v{self.count}")
        self.lines.append(f"{self.indent}{', '.join(names)} = {fname}({', '.join(self.value(a).text for a in args)})")
        return tuple(Value(self, nm) for nm in names)

    def full(self, like, value):
        zero = f"tl.zeros_like({self.value(like).text})"
        if isinstance(value, (bool, np.bool_)):
            return self.let(f"{zero} {'==' if value else '!='} 0.0", "bool")
        return self.let(f"{zero} + {self.value(value).text}")

    def where(self, cond, a, b):
        a, b = self.value(a), self.value(b)
        return self.let(f"tl.where({self.value(cond).text}, {a.text}, {b.text})", a.kind)

    def not_(self, b):
        return self.let(f"{self.value(b).text} == 0", "bool")

    def _any(self, going: Value) -> str:
        return f"tl.max({going.text}.to(tl.int32)) > 0"

    def repeat(self, n, body, state, going):
        tag, names, kinds = self._loop_state(state)
        self.lines.append(f"{self.indent}go{tag} = {self._any(self.value(going))}")
        self.lines.append(f"{self.indent}i{tag} = tl.zeros([], tl.int32)")
        self.lines.append(f"{self.indent}while go{tag} & (i{tag} < {n}):")
        outer, self.indent = self.indent, self.indent + "    "
        _, cont = self._body(body, names, kinds)
        self.lines.append(f"{self.indent}go{tag} = {self._any(cont)}")
        self.lines.append(f"{self.indent}i{tag} += 1")
        self.indent = outer
        return tuple(Value(self, nm, kd) for nm, kd in zip(names, kinds))


_COMMENT = "omega'(p) = z for p: numeric.newton.invert_link (safeguarded Newton on u = log p, then in p)"


def _traced(tracer: Tracer, params: list[Value]) -> Value:
    """:func:`numeric.newton.invert_link` on ``tracer`` for ``z``, calling the functions named ``omega_prime`` and
    ``omega_second`` as ``f(p, *params)``; returns the result's value."""
    return invert_link(tracer, Value(tracer, "z"), lambda q: tracer.call("omega_prime", q, *params),
                       lambda q: tracer.call("omega_second", q, *params))


def newton_link_sources() -> tuple[str, str]:
    """``(cuda, triton)``: the inversion of a link with no closed form, traced once per language.

    * CUDA: ``template <typename T, typename D1, typename D2> T rg_newton_link(T z, D1 omega_prime, D2
      omega_second)``, the derivatives any callables of one ``T`` (a map passes lambdas over its parameters);
    * Triton: ``@triton.jit def newton_link(z, params, omega_prime, omega_second)`` on a block, the derivatives
      ``@triton.jit`` functions taking ``params`` last (Triton passes a function argument as a constant).
    """
    cu = CudaTracer()
    p = _traced(cu, [])
    cuda = "\n".join([
        "#ifndef REGATTN_NEWTON_LINK",
        "#define REGATTN_NEWTON_LINK",
        "template <typename T, typename D1, typename D2>",
        "__device__ __forceinline__ T rg_newton_link(T z, D1 omega_prime, D2 omega_second) {",
        f"    // {_COMMENT}", *cu.lines, f"    return {p.text};", "}", "#endif"])
    tr = TritonTracer()
    p = _traced(tr, [Value(tr, "params")])
    triton = "\n".join(["@triton.jit", "def newton_link(z, params, omega_prime, omega_second):",
                         f"    # {_COMMENT}", *tr.lines, f"    return {p.text}"])
    return cuda, triton


def _triton_function(name: str, fn, args: str, comment: str, tracer=None) -> str:
    """``@triton.jit def name(args)``: ``fn(tracer, *values)`` traced into Triton on blocks, for the comma-separated
    ``args`` (a name ending in ``?`` is a boolean, written without it); returns its values.  ``tracer``: the
    :class:`TritonTracer` to trace with (a new one where ``None``)."""
    tr = TritonTracer() if tracer is None else tracer
    names = [a.strip() for a in args.split(",")]
    out = fn(tr, *(Value(tr, a.rstrip("?"), "bool" if a.endswith("?") else "T") for a in names))
    out = out if isinstance(out, tuple) else (out,)
    return "\n".join(["@triton.jit", f"def {name}({', '.join(a.rstrip('?') for a in names)}):", f"    # {comment}",
                      *tr.lines, f"    return {', '.join(tr.value(v).text for v in out)}"])


def safeguard_source() -> str:
    """The bracketed Newton solves' safeguard and the rounds of a threshold's solve traced into Triton, on blocks:

    * ``safeguarded_point(x, lo, hi, step_old, newton, usable, free)`` returning ``(x_new, took)``
      (:func:`numeric.newton.safeguarded_point`);
    * ``narrow_bracket(t, lo, hi, active, f)`` and ``threshold_round(t, lo, hi, step, step_old, active, f,
      slope, point, usable, scale, free)`` (:func:`numeric.core.halley.narrow_bracket`,
      :func:`numeric.core.halley.threshold_round`): the fused attention's passes over the keys.

    (The CUDA row kernels' solves call them as device functions of their own, ``rg_safeguarded_point``,
    ``rg_narrow_bracket``, ``rg_threshold_round``: :mod:`derive.codegen.trace_rows`.)"""
    return "\n\n\n".join([
        _triton_function("safeguarded_point", safeguarded_point, "x, lo, hi, step_old, newton, usable?, free?",
                         "the next point of a bracketed Newton solve: numeric.newton.safeguarded_point (rtsafe's "
                         "safeguard)"),
        _triton_function("narrow_bracket", halley.narrow_bracket, "t, lo, hi, active?, f",
                         "a threshold's bracket moved to t by the sign of F - 1: numeric.core.halley.narrow_bracket"),
        _triton_function("threshold_round", halley.threshold_round,
                         "t, lo, hi, step, step_old, active?, f, slope, point, usable?, scale, free?",
                         "one round of a threshold's bracketed solve: numeric.core.halley.threshold_round"),
    ])


class TritonRowsTracer(TritonTracer, TensorOps):
    """:class:`numeric.core.ops.TensorOps` on a block of rows in a ``@triton.jit`` function: a value per
    score has the block's shape ``[ROWS, N]``, a row-wide one ``[ROWS, 1]``, and Triton broadcasts them as
    NumPy does; a reduction along the rows keeps its axis.  What device code cannot do (a sort, a branch
    that skips work) is not provided: tracing a rule that needs it fails."""

    sorts = False

    def __init__(self, indent: str = "    "):
        super().__init__(indent)
        self.tiny = self.value(float(np.finfo(np.float32).tiny))

    def float_(self, b):
        return self.let(f"{self.value(b).text}.to(tl.float32)")

    def log(self, x):
        return self.call("tl.log", x)

    def isfinite(self, x):
        return self.let(f"tl.abs({self.value(x).text}) < float('inf')", "bool")

    def isnan(self, x):
        return self.let(f"{self.value(x).text} != {self.value(x).text}", "bool")

    def row_sum(self, x):
        return self.let(f"tl.sum({self.value(x).text}, 1, keep_dims=True)")

    def row_max(self, x):
        return self.let(f"tl.max({self.value(x).text}, 1, keep_dims=True)")


class _MapCalls:
    """A map's routines in a traced kernel (as :class:`numeric.core.ops.Routines`): ``r.name(x)`` prints
    ``MAP.name(x, params)``, ``r.clip()`` ``MAP.clip(params)``; a map's Triton functions have every routine."""

    def __init__(self, tracer: Tracer):
        self.tracer = tracer

    #: (the parameters are the kernel's own, one for every row)
    params = ()

    def has(self, name: str) -> bool:
        return True

    def bound(self, params: tuple) -> "_MapCalls":
        return self

    def clip(self):
        return self.tracer.let("MAP.clip(params)")

    def __getattr__(self, name: str):
        return lambda x: self.tracer.call(f"MAP.{name}", x, Value(self.tracer, "params"))


_KEPT = ("the threshold of each row of the scores y in [lo, hi] from start (the rows not going keep it), with F\n"
         "    # the sum over y plus rest(t, rest_args) (value, first and second derivative of the row's other scores):\n"
         "    # numeric.core.halley.halley_threshold, the host's safeguarded Halley, traced")


def kept_threshold_source() -> str:
    """:func:`numeric.core.halley.halley_threshold` traced into Triton: ``@triton.jit def kept_threshold(y,
    start, lo, hi, going, peak, MAP, params, rest, rest_args)`` on a block of rows (``y``: ``[ROWS, N]``, the
    rest ``[ROWS, 1]``, ``peak`` the rows' largest scores), returning ``t`` (``[ROWS, 1]``).  The fused
    attention's forward solves each query block's kept scores with it, ``rest`` modelling the scores left out."""
    tr = TritonRowsTracer()
    y, start, lo, hi, peak = (Value(tr, name) for name in ("y", "start", "lo", "hi", "peak"))
    rest_args = Value(tr, "rest_args")
    t, *_ = halley.halley_threshold(tr, _MapCalls(tr), y, lo, hi, start=start, going=Value(tr, "going", "bool"),
                                rest=lambda t: tr.call_many("rest", 3, t, rest_args), peak=peak)
    return "\n".join(["@triton.jit", "def kept_threshold(y, start, lo, hi, going, peak, MAP: tl.constexpr, params, rest, "
                       "rest_args):", f"    # {_KEPT}", *tr.lines, f"    return {t.text}"])


def _rows_function(name: str, fn, args: str, comment: str) -> str:
    """``@triton.jit def name(args, MAP: tl.constexpr, params)``: ``fn(tracer, map_calls, *values)`` traced into
    Triton on a block of rows (:class:`TritonRowsTracer`; the map's routines through ``MAP``), for the
    comma-separated ``args`` (a name ending in ``?`` is a boolean); returns its values."""
    tr = TritonRowsTracer()
    names = [a.strip() for a in args.split(",")]
    out = fn(tr, _MapCalls(tr), *(Value(tr, a.rstrip("?"), "bool" if a.endswith("?") else "T") for a in names))
    out = out if isinstance(out, tuple) else (out,)
    signature = ", ".join([*(a.rstrip("?") for a in names), "MAP: tl.constexpr", "params"])
    return "\n".join(["@triton.jit", f"def {name}({signature}):", f"    # {comment}", *tr.lines,
                      f"    return {', '.join(tr.value(v).text for v in out)}"])


def box_source() -> str:
    """The bounded threshold's solve (:func:`numeric.constraints.box.box_solve`) traced into Triton, in the pieces
    the fused attention's passes over the keys take block by block: ``box_high``, ``box_lowest`` (the bracket's left end,
    a minimum over the blocks), ``box_sums`` (``p``, ``F``, ``-F'``, the free and the saturated
    entries of a block at a threshold; its row sums add up over the blocks) and ``box_round`` (one Newton
    round on the rows' sums)."""
    return "\n\n\n".join([
        _rows_function("box_high", box_high, "total, count",
                       "the bounded threshold's bracket's right end, -omega'(total / n): numeric.constraints.box.box_high"),
        _rows_function("box_lowest", box_lowest, "y, upper, total, live?",
                       "the least y - omega'(min(u, total)) over the live entries of a block of rows (inf where "
                       "none): numeric.constraints.box.box_lowest"),
        _rows_function("box_sums", box_sums, "y, t, upper, live?, clip, ceiling, peak",
                       "p = min(u, g_+(y - t)) on a block of rows, its row sums, those of w over the free entries, "
                       "the free and the saturated entries: numeric.constraints.box.box_sums"),
        _triton_function("box_round", lambda ops, *a: box_round(ops, *a)[0],
                         "t, lo, hi, step, step_old, active?, f, slope, total, scale",
                         "one Newton round of the bounded threshold: numeric.constraints.box.box_round",
                         TritonRowsTracer()),
    ])
