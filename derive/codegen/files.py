"""Generated modules on disk: where the built-ins live, writing them safely, checking them, loading them.

The registry of built-in maps and the texts they generate are in
:mod:`derive.codegen.builtins`.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util
import os
import site
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

from numeric import trust

from ..argmax import derive_map
from ..errors import DerivationError
from ..family import derive_family, stated_cases
from ..regularizers import Regularizer
from .builtins import builtin_sources
from .emit import HEADER_MARK, check_name, family_case_name, generate_family_module, generate_module

__all__ = [
    "check_module_name",
    "inside_site_packages",
    "generated_dir",
    "load_module",
    "write_atomic",
    "write_builtins",
    "stale_builtins",
    "write_user_module",
]


def generated_dir() -> Path:
    """``numeric/_generated`` of the installed (or checked-out) ``numeric`` package, found without importing it."""
    spec = importlib.util.find_spec("numeric")
    if spec is None or not spec.submodule_search_locations:
        raise DerivationError("the numeric package is not importable; install regattn first")
    return Path(list(spec.submodule_search_locations)[0]) / "_generated"


def load_module(path: Path, prefix: str = "_regattn_") -> ModuleType:
    """Import a generated module from its file, under the name ``prefix + stem`` (not put in sys.modules).

    The file's header is checked first (:mod:`numeric.trust`): a file that
    ``regattn generate`` did not write, or whose body was edited since, raises
    :class:`DerivationError` without running; the text checked is the text run.
    """
    path = Path(path)
    spec = importlib.util.spec_from_file_location(prefix + path.stem, path)
    if spec is None or spec.loader is None:
        raise DerivationError(f"cannot import {path}")
    try:
        text = trust.read_verified(str(path))
    except trust.UntrustedModuleError as exc:
        raise DerivationError(str(exc)) from None
    module = importlib.util.module_from_spec(spec)
    exec(compile(text, str(path), "exec", dont_inherit=True), module.__dict__)
    return module


#: names a generated module may never take, besides the standard library and installed packages
_RESERVED = frozenset({"cupy", "cupyx", "torch", "jax", "triton", "scipy"})


def check_module_name(name: str) -> str:
    """``name`` if a module ``name.py`` would shadow nothing: no standard-library module, no installed
    top-level package or module (NumPy, SymPy, mpmath, regattn's own packages...), nothing else importable
    now that ``regattn generate`` did not write."""
    check_name(name)
    stdlib = set(getattr(sys, "stdlib_module_names", ())) | set(sys.builtin_module_names)
    if name in stdlib:
        raise DerivationError(f"map name {name!r} would shadow the standard-library module {name!r}; choose another name")
    if name in ("derive", "numeric", "regattn"):
        raise DerivationError(f"map name {name!r} is one of regattn's own packages; choose another name")
    if name in _RESERVED or name in importlib.metadata.packages_distributions():
        raise DerivationError(f"map name {name!r} would shadow the installed package {name!r}; choose another name")
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and not _is_generated(spec.origin):
        where = spec.origin or (list(spec.submodule_search_locations or []) or ["?"])[0]
        raise DerivationError(f"map name {name!r} would shadow the importable module {name!r} ({where}); choose another name")
    return name


def _is_generated(path) -> bool:
    """Whether the file at ``path`` starts with regattn's header (it may be stale; it is ours to rewrite)."""
    if not path or not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as fh:
            return fh.read(len(HEADER_MARK) + 1) == (HEADER_MARK + "\n").encode()
    except OSError:
        return False


def _check_overwrite(path: Path, force: bool) -> None:
    """Refuse to replace an existing file regattn did not write, unless ``force``."""
    if not force and (path.exists() or path.is_symlink()) and not _is_generated(path):
        raise DerivationError(f"{path} exists and was not written by regattn generate; "
                              "remove it, choose another name or folder, or pass --force")


def _identity(text: str) -> tuple[str, ...]:
    """What a generated module is the map of: its header lines but the format and the content hash (which change
    with regattn), and its ``PARAMETER_DOMAINS`` line (the same ``omega`` on other domains is another map)."""
    head = [line for line in text.splitlines()[1:8] if line.startswith("# ")]
    head = [line for line in head if not line.startswith(("# format:", "# content-hash:"))]
    return tuple(head + [line for line in text.splitlines() if line.startswith("PARAMETER_DOMAINS = ")][:1])


def _check_same_map(path: Path, text: str, force: bool) -> None:
    """Refuse to replace ``path``, a module regattn generated, with ``text`` if that is the map of another
    regularizer (or of other parameter domains), unless ``force``: regenerating the same map is allowed."""
    if force or not _is_generated(path):  # (a file regattn did not write was refused before deriving)
        return
    try:
        old = _identity(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return
    if old != _identity(text):
        was = next((line[2:] for line in old if line.startswith("# regularizer:")), "an unknown regularizer")
        raise DerivationError(f"{path} holds the map of another regularizer ({was}); "
                              "remove it, choose another name or folder, or pass --force to replace it")


def inside_site_packages(path: Path) -> bool:
    """Whether ``path`` lies in an installation folder (site-packages): an installed, not editable, regattn."""
    roots = {sysconfig.get_paths().get(key) for key in ("purelib", "platlib")}
    roots.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    roots.add(site.getusersitepackages())
    path = Path(path).resolve()
    for root in filter(None, roots):
        try:
            path.relative_to(Path(root).resolve())
        except ValueError:
            continue
        return True
    return False


def _out_folder(out: Path) -> Path:
    """``out`` (``--out``) as a :class:`Path`, refused unless it can be written: an existing directory, or a path
    whose nearest existing folder is a directory (:func:`_make_folder` creates the rest just before writing, so
    that input refused on the way leaves no folder behind).  Both must be writable."""
    out = Path(out)
    existing = next((folder for folder in (out, *out.parents) if folder.exists()), None)
    if existing is None or not existing.is_dir():
        raise DerivationError(f"--out {out}: {existing or out} is not a directory")
    if not os.access(existing, os.W_OK):
        raise DerivationError(f"--out {out} is not writable" if existing == out
                              else f"--out {out} cannot be created: {existing} is not writable")
    return out


def _make_folder(out: Path) -> None:
    """Create ``out`` and its missing parents (checked first by :func:`_out_folder`)."""
    Path(out).mkdir(parents=True, exist_ok=True)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``: never half-written."""
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise DerivationError(f"cannot write {path}: {folder} is not a directory")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise DerivationError(f"cannot write to {folder}: {exc.strerror}") from None
    try:
        try:
            fh = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        except BaseException:
            try:
                os.close(fd)
            except OSError:  # fdopen closed it already
                pass
            raise
        with fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_builtins(folder: Path | None = None, force: bool = False) -> list[Path]:
    """Generate every built-in into ``folder`` (default :func:`generated_dir`); returns the paths written.

    Files already there are replaced only if regattn wrote them (or ``force``).
    A ``folder`` that does not exist is created, parents too.  The default
    folder is refused when it lies in site-packages: an installed regattn is
    not rewritten in place; give a folder.
    """
    if folder is None:
        folder = generated_dir()
        if inside_site_packages(folder):
            raise DerivationError(f"{folder} belongs to an installed regattn; "
                                  "write the modules elsewhere with --out DIR (or use an editable install)")
    folder = _out_folder(folder)
    sources = builtin_sources()
    for fname in sources:
        _check_overwrite(folder / fname, force)
    _make_folder(folder)
    written = []
    for fname, text in sources.items():
        write_atomic(folder / fname, text)
        written.append(folder / fname)
    return written


def stale_builtins(folder: Path | None = None) -> list[str]:
    """Unified diffs for every generated file that differs from what ``regattn generate`` writes now."""
    folder = Path(folder) if folder is not None else generated_dir()
    diffs = []
    expected = builtin_sources()
    for fname, text in expected.items():
        path = folder / fname
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            diffs.append(
                "".join(
                    difflib.unified_diff(
                        current.splitlines(keepends=True),
                        text.splitlines(keepends=True),
                        fromfile=f"{path} (committed)" if path.exists() else f"{path} (missing)",
                        tofile=f"{path} (regattn generate)",
                    )
                )
            )
    for path in sorted(folder.glob("*.py")):
        if path.name not in expected:
            diffs.append(f"{path}: not produced by regattn generate (remove it)\n")
    return diffs


def write_user_module(expr: str | Regularizer, name: str, out: Path, force: bool = False) -> Path:
    """Derive ``expr`` (text or a :class:`Regularizer`) and write ``out/name.py`` atomically.

    ``name`` must not shadow another module (:func:`check_module_name`), and an
    existing ``out/name.py`` is replaced only if regattn wrote it from the same
    regularizer, parameters and domains (or ``force``).
    An ``out`` that does not exist is created, parents too, once the module is
    derived (input refused before that creates nothing).
    """
    check_module_name(name)
    out = _out_folder(out)
    path = out / f"{name}.py"
    _check_overwrite(path, force)
    reg = expr if isinstance(expr, Regularizer) else Regularizer.from_string(expr, name=name)
    if stated_cases(reg) is None:
        text = generate_module(derive_map(reg), name)
        _check_same_map(path, text, force)
        _make_folder(out)
        write_atomic(path, text)
        return path
    # a family (derive.family): a module per case, name_case0, ..., then the family module that imports them
    fam = derive_family(reg)
    names = tuple(family_case_name(name, i) for i in range(len(fam.cases)))
    texts = {}
    derivations = []
    for case_name, case in zip(names, fam.cases):
        check_module_name(case_name)
        _check_overwrite(out / f"{case_name}.py", force)
        dv = derive_map(case.regularizer)
        derivations.append(dv)
        texts[case_name] = generate_module(dv, case_name)
    texts[name] = generate_family_module(fam, name, names, tuple(derivations))
    for module_name, text in texts.items():
        _check_same_map(out / f"{module_name}.py", text, force)
    _make_folder(out)
    for module_name, text in texts.items():
        write_atomic(out / f"{module_name}.py", text)
    return path
