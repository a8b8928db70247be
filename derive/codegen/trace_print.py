"""The statements of a row trace printed as CUDA C++: pruned, their locals declared, their calls device functions.

:class:`derive.codegen.trace_rows.RowTracer` records a traced function as lines
of C++ (its locals' declarations first, ``T v1 = T(0);``), each call of a
device function as the line ``@index`` of its :attr:`calls` (a :class:`Call`).
This module turns them into the text printed:

* :func:`prune` drops the locals no line reads, then the loops and branches left
  empty; it goes across calls: a function is printed for the results its caller
  reads and takes only the arguments it reads, and a call stays where nothing
  reads its results only if it writes the output row;
* :func:`declare` declares a local at its first assignment where every use of it
  lies in that statement's block (``const`` where it is the only assignment),
  else just before the statement of the innermost block holding every use (a
  value computed in a branch or in a loop's last round stays readable after it);
* :func:`renumber` numbers a function's locals in the order they appear, so its
  text does not depend on what its trace printed and pruning took out;
* :class:`Printer` prints each call as a call of a ``__device__`` function,
  defined once per text: the calls of one Python function that print the same
  text call one device function (``rg_threshold_round``), another text of it is
  another function (``rg_root_rule_2``: a specialisation, e.g. to another kind
  of map);
* :func:`param_name` and :func:`is_local`: the C++ names of a device function's
  parameters, and which row-wide values are locals to pass.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .trace import Value

__all__ = ["Call", "prune", "declare", "renumber", "Printer", "param_name", "is_local"]


@dataclass
class Call:
    """A call of a device function: the Python function traced, its parameters ``(kind, name)`` and the caller's
    value of each, its results ``(kind, name)`` (reference parameters) and the caller's locals receiving them, its
    text (locals' declarations, then statements), and whether it writes the output row."""

    fn: object
    params: list
    passed: list
    rets: list
    outs: list
    lines: list = field(repr=False)
    writes: bool = False


_ASSIGN = re.compile(r"^\s*(?:(?:const )?(?:(?:T|bool) )?(\w+) (?:=|\+=) |rg_add_compensated\((\w+), )")
_NAME = re.compile(r"\b[A-Za-z_]\w*\b")
_MARK = re.compile(r"^\s*@(\d+)$")
_DECL = re.compile(r"^(\s*)(T|bool) (\w+) = (T\(0\)|false);$")


def prune(lines: list[str], keep=("tau",), calls: list[Call] | None = None, callee=None):
    """``lines`` without the locals no other line reads (their declarations and assignments; a trace computes
    values the algorithm does not use here), then without the loops and branches left empty; ``keep``: names kept
    though nothing reads them (the function's results).

    A call (the line ``@index`` of ``calls``) assigns its results' locals and reads its arguments: it goes where
    none of its results is read and it writes no row; ``callee(index, results read)`` prunes the function for the
    results read and gives the caller's locals it still reads.  Returns the lines where ``calls`` is ``None``,
    else ``(lines, {index: the results read})``."""
    keep = set(keep)
    reads: dict[int, set] = {}
    results: dict[int, frozenset] = {}
    while True:
        uses: dict[str, int] = {}
        for text in lines:
            mark = _MARK.match(text)
            if mark:
                index = int(mark.group(1))
                for name in reads.get(index, calls[index].passed):
                    uses[name] = uses.get(name, 0) + 1
                continue
            m = _ASSIGN.match(text)
            own = (m.group(1) or m.group(2)) if m else None
            for name in _NAME.findall(text if m is None else text[m.end():]):
                if name != own:
                    uses[name] = uses.get(name, 0) + 1
        keep_lines, before = [], dict(reads)
        for t in lines:
            mark = _MARK.match(t)
            if mark:
                index = int(mark.group(1))
                call = calls[index]
                used = frozenset(n for (_, n), out in zip(call.rets, call.outs) if out in uses)
                if not used and not call.writes:
                    continue
                results[index] = used
                reads[index] = callee(index, used)
                keep_lines.append(t)
            elif not ((m := _ASSIGN.match(t)) and (m.group(1) or m.group(2)) not in uses and m.group(1) not in keep):
                keep_lines.append(t)
        out: list[str] = []
        for text in keep_lines:
            t = text.strip()
            last = out[-1].split("  //")[0].strip() if out else ""  # (a loop's or branch's line ends in a comment)
            if out and t == "}" and last.endswith("{") and not last.startswith("} else"):
                out.pop()  # an empty loop or branch
            elif out and t == "}" and out[-1].strip() == "} else {":
                out[-1] = out[-1].replace("} else {", "}")
            else:
                out.append(text)
        if out == lines and reads == before:
            if calls is None:
                return out
            return out, {i: results[i] for i in (int(_MARK.match(t).group(1)) for t in out if _MARK.match(t))}
        lines = out


def declare(lines: list[str]) -> list[str]:
    """A function's ``lines`` (the declarations of its locals first, ``T v = T(0);``) with each local declared where
    it is first used: at its first assignment where every use of it lies in the block (the function's body, a loop's,
    a branch's) of that statement (``const`` where it is the only assignment), else just before the statement of the
    innermost block holding every use that holds the first."""
    decls = []
    while len(decls) < len(lines) and _DECL.match(lines[len(decls)]):
        decls.append(_DECL.match(lines[len(decls)]))
    body = lines[len(decls):]
    parent, opened = {0: None}, {0: -1}  # per block: the block holding it, the statement opening it
    block, stack = [], [0]  # per line: the innermost block holding it
    for k, text in enumerate(body):
        code = text.split("  //")[0].strip()
        popped = stack.pop() if code.startswith("}") else None
        block.append(stack[-1])
        if code.endswith("{"):
            parent[len(parent)] = stack[-1]
            opened[len(opened)] = opened[popped] if popped is not None else k  # (an else: its if's statement)
            stack.append(len(parent) - 1)

    def chain(b):
        out = []
        while b is not None:
            out.append(b)
            b = parent[b]
        return out

    mentions: dict[str, list[int]] = {}
    assigned: dict[str, int] = {}
    for k, text in enumerate(body):
        for name in dict.fromkeys(_NAME.findall(text)):
            mentions.setdefault(name, []).append(k)
        m = _ASSIGN.match(text)
        if m:
            assigned[m.group(1) or m.group(2)] = assigned.get(m.group(1) or m.group(2), 0) + 1
        for name in re.findall(r"rg_add_compensated\(\w+, (\w+),", text):
            assigned[name] = assigned.get(name, 0) + 1
    before: dict[int, list[str]] = {}
    body = list(body)
    for d in decls:
        _, kind, name, zero = d.groups()
        if name not in mentions:
            continue
        at = mentions[name]
        k = at[0]
        common = chain(block[k])
        for line in at[1:]:
            held = set(chain(block[line]))
            common = [b for b in common if b in held]
        home = common[0]  # the innermost block holding every use
        m = re.match(rf"^(\s*){name} = (.*);$", body[k])
        if block[k] == home and m:
            const = "const " if assigned.get(name) == 1 and re.match(r"^[vb]\d+$", name) else ""
            body[k] = f"{m.group(1)}{const}{kind} {name} = {m.group(2)};"
            continue
        s = k  # the statement of ``home`` holding the first use
        for b in chain(block[k]):
            if b == home:
                break
            s = opened[b]
        indent = body[s][:len(body[s]) - len(body[s].lstrip())]
        before.setdefault(s, []).append(f"{indent}{kind} {name} = {zero};")
    out = []
    for k, text in enumerate(body):
        out.extend(before.get(k, []))
        out.append(text)
    return out


_NUMBERED = re.compile(r"\b(v|b|e|s|i|go|ran|acc)(\d+)(?=\b|_)")


def renumber(lines: list[str]) -> list[str]:
    """``lines`` with the locals numbered in the order they appear (a function's text does not depend on the
    locals its trace printed and pruning took out)."""
    numbers: dict[str, int] = {}

    def number(m):
        return f"{m.group(1)}{numbers.setdefault(m.group(2), len(numbers) + 1)}"

    return [_NUMBERED.sub(number, t) for t in lines]


#: The row pointers and sizes a device function may take, in the order of its parameters.
_POINTERS = (("map", "const M& map"), ("sr", "const T* sr"), ("pr", "T* pr"), ("cols", "long long cols"),
             ("shared", "T* shared"))


class Printer:
    """The device functions of the traces printed so far (:attr:`functions`, each before its callers), each text
    once: the calls of one Python function that print the same text call one device function, named after it
    (``rg_threshold_round``; ``rg_root_rule_2`` for another text of the same function)."""

    def __init__(self):
        self.functions: list[str] = []
        self.names: dict[tuple, str] = {}
        self.taken: set[str] = set()

    def body(self, tracer, lines: list[str], keep=()) -> list[str]:
        """The statements of a traced function ``lines`` (its locals' declarations first), pruned, with each call
        of a device function printed as a call (defining the function where its text is new); ``tracer``: the
        :class:`derive.codegen.trace_rows.RowTracer` whose :attr:`calls` the lines ``@index`` name."""
        calls, pruned = tracer.calls, {}

        def callee(index, used):
            if (index, used) not in pruned:
                call = calls[index]
                lines, results = pruned[index, used] = prune(call.lines, used, calls, callee)
                read = set(_NAME.findall("\n".join(lines)))
                for inner, inner_used in results.items():  # (what the calls it makes read)
                    read |= callee(inner, inner_used)
                pruned[index, used] += ({p for (_, n), p in zip(call.params, call.passed) if n in read},)
            return pruned[index, used][2]

        lines, results = prune(lines, keep, calls, callee)
        return self._print(lines, results, calls, pruned)

    def _print(self, lines, results, calls, pruned) -> list[str]:
        out = []
        for text in lines:
            mark = _MARK.match(text)
            if mark is None:
                out.append(text)
                continue
            index = int(mark.group(1))
            call, used = calls[index], results[index]
            inner, inner_results, _ = pruned[index, used]
            rets = [(k, f"ret{i}", n, o) for i, (k, n, o) in enumerate(
                (k, n, o) for (k, n), o in zip(call.rets, call.outs) if n in used)]
            names = {old: new for _, new, old, _ in rets}
            inner = [re.sub(r"\bret\d+\b", lambda m: names[m.group(0)], t) for t in inner]
            body = renumber(declare(self._print(inner, inner_results, calls, pruned)))
            read = set(_NAME.findall("\n".join(body)))
            pointers = [(n, decl) for n, decl in _POINTERS if n in read]
            params = [(k, n, p) for (k, n), p in zip(call.params, call.passed) if n in read]
            rets = [(k, n, o) for k, n, _, o in rets]
            signature = ", ".join([d for _, d in pointers] + [f"{k} {n}" for k, n, _ in params]
                                  + [f"{k}& {n}" for k, n, _ in rets])
            template = "M, T" if any(n == "map" for n, _ in pointers) else "T"
            key = (call.fn.__module__, call.fn.__qualname__, template, signature, tuple(body))
            if key not in self.names:
                base = f"rg_{call.fn.__name__.lstrip('_')}"
                name, n = base, 1
                while name in self.taken:
                    n += 1
                    name = f"{base}_{n}"
                self.taken.add(name)
                self.names[key] = name
                self.functions.append("\n".join([
                    f"// {call.fn.__module__}.{call.fn.__qualname__}",
                    "template <class M, typename T>" if template == "M, T" else "template <typename T>",
                    f"__device__ void {name}({signature}) {{", *body, "}"]))
            indent = text[:len(text) - len(text.lstrip())]
            args = [n for n, _ in pointers] + [p for _, _, p in params] + [o for _, _, o in rets]
            out.append(f"{indent}{self.names[key]}<{template}>({', '.join(args)});")
        return out


_LOCAL = re.compile(r"^[A-Za-z_]\w*$")
_RESERVED = {"map", "sr", "pr", "vr", "out", "cols", "shared", "tau", "j", "T", "M", "true", "false", "new",
             "delete", "int", "float", "double", "char", "long", "short", "bool", "this", "default", "case",
             "for", "if", "else", "do", "while", "return", "switch", "const", "static", "auto", "void", "and",
             "or", "not", "xor", "template", "typename", "class", "struct", "union", "enum", "operator"}


def is_local(v: Value) -> bool:
    """Whether ``v`` is a local of the function printed (not a literal or an expression of constants)."""
    return bool(_LOCAL.match(v.text)) and v.text not in ("true", "false")


def param_name(name: str, taken: set) -> str:
    """A C++ name for a parameter from the Python one, distinct from the locals' names (``v12``, ``s3_1``...)."""
    if name in _RESERVED or re.match(r"^(v|b|e|s|i|go|ran|acc|ret)\d", name) or name.startswith("_"):
        name = f"{name.lstrip('_')}_"
    while name in taken:
        name = f"{name}_"
    return name
