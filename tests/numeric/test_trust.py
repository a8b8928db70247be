"""Generated modules are checked before they run: header mark, content hash, nothing else executed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import numeric as nm
from numeric import trust

GENERATED = Path(nm.__file__).parent / "_generated"
# a statement that leaves a trace if the module body ever runs
TRACE = "import builtins; builtins.REGATTN_TRUST_RAN = True\n"


@pytest.fixture
def gen_folder(tmp_path, monkeypatch):
    """A folder on sys.path holding a freshly generated ``cube_t`` (a copy of a generated user map)."""
    text = (GENERATED / "sparsemax.py").read_text(encoding="utf-8")
    (tmp_path / "cube_t.py").write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    import builtins

    monkeypatch.delattr(builtins, "REGATTN_TRUST_RAN", raising=False)
    for name in [m for m in sys.modules if m.startswith("cube_t")]:
        monkeypatch.delitem(sys.modules, name)
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("cube_t")]:
        del sys.modules[name]


def _ran() -> bool:
    import builtins

    return getattr(builtins, "REGATTN_TRUST_RAN", False)


def _edit(path: Path) -> None:
    """Append code to the body, keeping the header (and its now wrong hash)."""
    path.write_text(path.read_text(encoding="utf-8") + TRACE, encoding="utf-8")


def test_get_map_by_name_runs_a_verified_module(gen_folder):
    m = nm.get_map("cube_t")
    np.testing.assert_allclose(m(np.array([-2.0, 0.0, 0.5])), [0.0, 0.25, 0.75])
    assert nm.get_map("cube_t").module is m.module  # imported once, checked once


def test_get_map_refuses_a_hand_edited_module_before_running_it(gen_folder):
    _edit(gen_folder / "cube_t.py")
    with pytest.raises(ValueError, match="edited after `regattn generate` wrote it"):
        nm.get_map("cube_t")
    assert not _ran()
    assert "cube_t" not in sys.modules


def test_get_map_refuses_an_edited_header_hash(gen_folder):
    path = gen_folder / "cube_t.py"
    lines = path.read_text(encoding="utf-8").split("\n")
    lines[3] = "# content-hash: sha256:" + "0" * 64
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(ValueError, match="edited"):
        nm.get_map("cube_t")


def test_get_map_refuses_code_in_the_header(gen_folder):
    path = gen_folder / "cube_t.py"
    lines = path.read_text(encoding="utf-8").split("\n")
    lines.insert(1, TRACE.strip())  # an executable line between the mark and the hash
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(ValueError, match="not a generated map"):
        nm.get_map("cube_t")
    assert not _ran()


@pytest.mark.parametrize("line", [1, 2, 3, 4])
def test_code_after_a_carriage_return_in_a_header_line_is_refused(gen_folder, line):
    # Python ends a line at a lone CR, so text after one in a comment is code outside the hashed body
    path = gen_folder / "cube_t.py"
    lines = path.read_text(encoding="utf-8").split("\n")
    lines[line - 1] += "\r" + TRACE.strip()
    path.write_bytes("\n".join(lines).encode("utf-8"))
    with pytest.raises(ValueError, match="carriage return|not a generated map|malformed"):
        nm.get_map("cube_t")
    assert not _ran()
    assert "cube_t" not in sys.modules
    with pytest.raises(ValueError):
        trust.verified_body(path.read_bytes().decode("utf-8"))


def test_every_byte_python_executes_is_hashed():
    # the header is comment lines only, each one line for Python: tokenizing it alone yields comments and line ends
    import io
    import tokenize

    for path in sorted(GENERATED.glob("*.py")):
        header, _ = trust.split_header(path.read_text(encoding="utf-8"))
        text = "\n".join(header) + "\n"
        kinds = {tok.type for tok in tokenize.generate_tokens(io.StringIO(text).readline)}
        assert kinds <= {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER}, path.name


def test_a_coding_cookie_in_the_header_is_refused(gen_folder):
    path = gen_folder / "cube_t.py"
    lines = path.read_text(encoding="utf-8").split("\n")
    lines.insert(1, "# -*- coding: latin-1 -*-")
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(ValueError, match="encoding declaration"):
        nm.get_map("cube_t")


@pytest.mark.parametrize("name", ["this", "antigravity", "numpy", "json", "site", "os"])
def test_get_map_does_not_run_modules_that_are_not_maps(name):
    code = (
        "import sys, numeric as nm\n"
        f"before = {name!r} in sys.modules\n"
        "try:\n"
        f"    nm.get_map({name!r})\n"
        "except ValueError as exc:\n"
        "    assert 'not a generated map' in str(exc), exc\n"
        "else:\n"
        "    raise SystemExit('accepted')\n"
        f"assert before or {name!r} not in sys.modules, 'imported'\n"
        "print('refused')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "refused\n"  # `this` would have printed the Zen of Python


def test_get_map_refuses_a_module_object_whose_file_was_edited(gen_folder):
    import importlib

    module = importlib.import_module("cube_t")  # the user's own import: it runs, unchecked
    _edit(gen_folder / "cube_t.py")
    with pytest.raises(ValueError, match="edited"):
        nm.get_map(module)


def test_get_map_accepts_a_module_object_of_a_generated_file(gen_folder):
    import importlib

    module = importlib.import_module("cube_t")
    assert nm.get_map(module).module is module
    assert nm.get_map("cube_t").module is module


def test_get_map_refuses_a_module_object_without_source():
    import math
    import types

    with pytest.raises(TypeError, match="not a generated map"):
        nm.get_map(math)
    fake = types.ModuleType("fake")
    fake.__dict__.update(vars(nm.get_map("softmax").module))
    del fake.__file__
    with pytest.raises(TypeError, match="not a generated map"):
        nm.get_map(fake)


def test_windows_line_ends_are_accepted():
    text = (GENERATED / "softmax.py").read_text(encoding="utf-8")
    assert trust.verified_body(text.replace("\n", "\r\n")) == text


@pytest.mark.parametrize("path", sorted(GENERATED.glob("*.py")), ids=lambda p: p.name)
def test_every_committed_generated_file_verifies(path):
    text = path.read_text(encoding="utf-8")
    assert trust.verified_body(text, str(path)) == text


def test_derive_and_numeric_agree_on_the_hash_rule():
    from derive.codegen import HEADER_MARK, content_hash
    from derive.codegen.builtins import builtin_sources

    assert HEADER_MARK == trust.HEADER_MARK
    for fname, text in builtin_sources().items():
        header, body = trust.split_header(text)
        assert header[0] == HEADER_MARK, fname
        assert header[-1] == f"# content-hash: {content_hash(body)}", fname
        assert content_hash(body) == trust.content_hash(body)
        assert trust.verified_body(text, fname) == text
    for body in ("", "x = 1\n", "é = 'ü'\n"):
        assert content_hash(body) == trust.content_hash(body)


def test_load_module_refuses_an_edited_file(tmp_path):
    from derive import DerivationError
    from derive.codegen.files import load_module

    path = tmp_path / "sm.py"
    path.write_text((GENERATED / "sparsemax.py").read_text(encoding="utf-8"), encoding="utf-8")
    assert load_module(path).NAME == "sparsemax"
    _edit(path)
    with pytest.raises(DerivationError, match="edited"):
        load_module(path)
    assert not _ran()
    path.write_text(TRACE, encoding="utf-8")
    with pytest.raises(DerivationError, match="not a generated map"):
        load_module(path)
    assert not _ran()
