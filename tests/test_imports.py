"""The import graph of ``derive`` and ``numeric``: no cycles, and ``numeric`` depends on neither SymPy nor ``derive``.

Every ``import`` statement counts, at module level or inside a function (a lazy
import is still a dependency), except those under ``if TYPE_CHECKING:``, which
never run.  ``from package import name`` is an edge to the submodule
``package.name`` where that is a module, else to the package itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("derive", "numeric")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, path: Path) -> set[str]:
    """Names of the modules ``name`` imports (anywhere but under TYPE_CHECKING)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in MODULES else source)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return found


GRAPH = {name: {m for m in _imports(name, path) if m in MODULES and m != name} for name, path in MODULES.items()}
EXTERNAL = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return out


def test_the_graph_is_read():
    assert "derive.reference" in GRAPH["derive.argmax"]  # a lazy import counts
    assert "derive.symbols" in GRAPH["derive.reference"]
    assert "derive.argmax" not in GRAPH["derive.reference"]  # only under TYPE_CHECKING
    assert "numeric.trust" in GRAPH["derive.codegen.emit"]


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def test_a_cycle_would_be_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.split(".")[0] == "numeric"))
def test_numeric_imports_neither_sympy_nor_derive(name):
    bad = {m for m in EXTERNAL[name] if m.split(".")[0] in ("sympy", "mpmath", "derive")}
    assert not bad, f"{name} imports {sorted(bad)}"


FRAMEWORKS = {"torch": "numeric.torch", "jax": "numeric.jax"}


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.split(".")[0] == "numeric"))
def test_only_the_framework_packages_import_their_framework(name):
    """torch is imported by numeric.torch alone and jax by numeric.jax (and the generated sections, when called)."""
    for framework, home in FRAMEWORKS.items():
        if name == home or name.startswith(home + ".") or name.startswith("numeric._generated."):
            continue
        bad = {m for m in EXTERNAL[name] if m.split(".")[0] == framework}
        assert not bad, f"{name} imports {sorted(bad)}"


def test_importing_numeric_loads_no_framework():
    import subprocess
    import sys

    code = "import sys, numeric, numeric.maps, numeric.attention; print(sorted({'torch', 'jax'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
