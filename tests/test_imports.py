"""The import graph of ``derive`` and ``numeric``: no cycles, and ``numeric`` depends on neither SymPy nor ``derive``;
and no hand-written module of theirs is longer than :data:`MAX_LINES` lines.  In a fresh interpreter, importing and
running ``numeric`` loads no SymPy, and importing ``derive`` loads no CuPy.

Every ``import`` statement counts, at module level or inside a function (a lazy
import is still a dependency), except those under ``if TYPE_CHECKING:``, which
never run.  ``from package import name`` is an edge to the submodule
``package.name`` where that is a module, else to the package itself.
"""

from __future__ import annotations

import ast
import subprocess
import sys
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


def _imports(name: str, path: Path, type_checking: bool = False) -> set[str]:
    """Names of the modules ``name`` imports (anywhere but under TYPE_CHECKING, unless ``type_checking``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node):
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
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
#: The same with the imports under TYPE_CHECKING: the modules that name each other in their types.
TYPED_GRAPH = {name: {m for m in _imports(name, path, type_checking=True) if m in MODULES and m != name}
               for name, path in MODULES.items()}
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
    assert "derive.continuous" in GRAPH["derive.cli"]  # a lazy import counts
    assert "derive.symbols" in GRAPH["derive.reference"]
    assert "derive.derivation" not in GRAPH["derive.box"]  # only under TYPE_CHECKING
    assert "derive.derivation" in TYPED_GRAPH["derive.box"]
    assert "numeric.trust" in GRAPH["derive.codegen.emit"]


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def test_no_cycles_in_derive_even_through_types():
    """The derivation record sits below what reads it (derive.reference, derive._render): their types do not
    name a module that imports them back."""
    derive = {name: {m for m in ms if m.split(".")[0] == "derive"} for name, ms in TYPED_GRAPH.items()
              if name.split(".")[0] == "derive"}
    assert _cycles(derive) == []


def _private_imports(path: Path) -> list[str]:
    """``from module import _name`` in ``path``: a private name of one module used by another (a private submodule
    of a package, ``from . import _generated``, is a module of the package and not counted)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            base = path.parent
            for _ in range(max(0, node.level - 1)):
                base = base.parent
            if node.level and node.module:
                base = base.joinpath(*node.module.split("."))
            out += [f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name} from {'.' * node.level}{node.module or ''}"
                    for a in node.names if a.name.startswith("_") and not a.name.startswith("__")
                    and not (node.level and ((base / a.name).is_dir() or (base / f"{a.name}.py").is_file()))]
    return out


@pytest.mark.parametrize("package", ["derive", "numeric"])
def test_no_private_name_imported_across_modules(package):
    found = [line for name, path in sorted(MODULES.items()) if name.split(".")[0] == package
             for line in _private_imports(path)]
    assert found == []


def test_a_private_name_imported_would_be_found(tmp_path):
    (tmp_path / "a.py").write_text("from .b import _helper, public\nfrom . import _sub\n")
    (tmp_path / "_sub.py").write_text("")
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        assert _private_imports(tmp_path / "a.py") == ["a.py:1 imports _helper from .b"]
    finally:
        ROOT = root


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


#: The most lines a hand-written module of ``derive`` or ``numeric`` may have (``numeric/_generated`` is exempt).
MAX_LINES = 800
#: Hand-written modules known to be longer, each until it is split (none now).
LONG_MODULES: set[str] = set()


def test_no_hand_written_module_is_over_800_lines():
    lengths = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
               for name, path in MODULES.items() if not name.startswith("numeric._generated")}
    assert len(lengths) > 50 and "derive/codegen/trace_rows.py" in lengths  # (the walk found them)
    over = {path: n for path, n in sorted(lengths.items()) if n > MAX_LINES and path not in LONG_MODULES}
    assert not over, f"over {MAX_LINES} lines: " + ", ".join(f"{path} ({n})" for path, n in over.items())


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def _namings(path: Path, word: str) -> int:
    """How often ``path``'s code names ``word`` (case-insensitive): identifiers, attribute and keyword names, names
    of functions, classes, arguments and imports, and string constants that are not docstrings (comments and
    docstrings do not count)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = _docstrings(tree)
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.keyword, ast.arg)):
            names = [node.arg or ""]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.alias):
            names = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names = [node.value]
        else:
            continue
        count += sum(word in name.lower() for name in names)
    return count


def _files_naming(word: str) -> dict[str, int]:
    """``{path: count}`` for the hand-written modules of ``numeric`` (``numeric/_generated`` aside) naming ``word``."""
    counts = {path.relative_to(ROOT).as_posix(): _namings(path, word) for name, path in sorted(MODULES.items())
              if name.split(".")[0] == "numeric" and not name.startswith("numeric._generated")}
    return {path: n for path, n in counts.items() if n}


#: The most modules of ``numeric`` that may name a map family (issue 44, "map families, one axis"): its own module
#: (numeric/families/normmax.py), the package's import of it (numeric/families/__init__.py), and the fused attention's
#: check (numeric/torch/fused.py), which reads the family's ``fused`` hook once that check names no family.
MAX_FAMILY_FILES = 3


def test_a_map_family_is_named_in_its_own_module_alone():
    """No front end names normmax: the maps, losses and functions of every front end reach it through the table of
    families (numeric.families), as they reach the constraint sets through theirs; and it has one class."""
    files = _files_naming("normmax")
    assert "numeric/families/normmax.py" in files  # (the walk found it)
    assert len(files) <= MAX_FAMILY_FILES, files
    classes = [f"{path.relative_to(ROOT).as_posix()}:{node.name}" for name, path in sorted(MODULES.items())
               if name.split(".")[0] == "numeric" for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ClassDef) and "normmax" in node.name.lower()]
    assert classes == ["numeric/families/normmax.py:Normmax"]


#: The most modules of ``numeric`` that may name a constraint set's keyword (issue 44, "constraint sets, one axis"):
#: today the box's ``upper`` is named by its set (numeric/constraints/box.py) and by the fused Triton kernels, which
#: take the set as a compile-time hook (numeric/kernels/triton_attention.py, triton_box.py, numeric/torch/fused.py)
MAX_SET_FILES = 6


@pytest.mark.parametrize(("word", "home"), [("upper", "numeric/constraints/box.py"),
                                           ("sink", "numeric/constraints/sink.py")])
def test_a_constraint_sets_keyword_is_named_in_few_modules(word, home):
    """The front ends, losses, attention, layers and context parallelism take a set's keywords through the table of
    sets (numeric.constraints), not by name (issue 45 bounds the sink's files at 6 too: its set, the table, the two
    layers that learn one per head, HuggingFace's s_aux)."""
    files = _files_naming(word)
    assert home in files  # (the walk found it)
    assert len(files) <= MAX_SET_FILES, files


def test_a_naming_in_code_would_be_counted(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""normmax in a docstring."""\n# normmax in a comment\nimport numeric.normmax as nx\n'
                    'def f(normmax_alpha=2):\n    """normmax."""\n    return g(name="normmax", x=nx.normmax_from)\n')
    assert _namings(path, "normmax") == 4  # the import, the argument, the string constant, the attribute


def test_numeric_never_imports_sympy():
    code = (
        "import sys, numpy as np, numeric as nm, numeric.core.rules, numeric.constraints.box, numeric.families.normmax, numeric.numpy.ops, numeric.backend;"
        "import numeric._generated.softmax, numeric._generated.sparsemax, numeric._generated.entmax15, numeric._generated.entmax;"
        "nm.entmax(np.arange(5.0), 1.3); assert 'sympy' not in sys.modules, 'sympy imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_derive_never_imports_cupy():
    code = (
        "import sys, derive, derive.cli, derive.codegen, derive.codegen.compilers, derive.codegen.verify;"
        "assert not any(m.split('.')[0] == 'cupy' for m in sys.modules), 'cupy imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
