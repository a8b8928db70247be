"""The regattn command: derive and verify, good and bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import sympy as sp

from derive.cli import main


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["derive", "shannon"], "Threshold (closed)"),
        (["derive", "gini"], "Threshold (sort)"),
        (["derive", "tsallis", "--alpha", "3/2"], "tsallis(alpha=3/2)"),
        (["derive", "tsallis", "--alpha", "1.5"], "tsallis(alpha=3/2)"),
        (["derive", "tsallis"], "alpha in (1, oo)"),
        (["derive", "--expr", "p*log(p) + p**2/2"], "LambertW"),
        (["derive", "--expr", "p**2/2 + p**4/4", "--name", "quartic"], "Derivation of the quartic map"),
    ],
)
def test_derive_prints_text(argv, expect, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert expect in out
    assert "Link" in out and "Threshold" in out


def test_derive_latex(capsys):
    assert main(["derive", "tsallis", "--alpha", "3/2", "--latex"]) == 0
    out = capsys.readouterr().out
    assert r"\begin{align*}" in out
    assert sp.latex(sp.sqrt(sp.Symbol("p", positive=True))) in out  # the weight sqrt(p)


def test_verify_reports_small_residual(capsys):
    assert main(["verify", "--expr", "p**3", "--samples", "5"]) == 0
    out = capsys.readouterr().out
    assert "max KKT residual" in out and "(ok" in out
    for line in ("numpy", "device (g++) double", "device (g++) float", "numeric map", "nvrtc"):
        assert line in out
    assert "verdict      all checks passed" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["derive", "--expr", "__import__('os').system('echo hacked')"], "not allowed"),
        (["derive", "--expr", "p"], "not strictly convex"),
        (["derive", "--expr", "p*q"], "unknown name 'q'"),
        (["derive", "tsallis", "--alpha", "1"], "Shannon limit"),
        (["derive", "tsallis", "--alpha", "x"], "--alpha must be a number"),
        (["derive", "gini", "--alpha", "2"], "tsallis only"),
        (["derive"], "exactly one"),
        (["derive", "gini", "--expr", "p**2"], "exactly one"),
    ],
)
def test_bad_input_exits_nonzero_with_message(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("regattn: error:") and message in err
    assert "Traceback" not in err


def test_console_entry_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "derive.cli", "derive", "--expr", "abs(p)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "'abs' is not allowed" in proc.stderr
    assert "hacked" not in proc.stdout


# ---------------------------------------------------------------- generate
def test_generate_writes_and_checks_a_folder_and_the_committed_files_are_current(tmp_path, capsys):
    """``regattn generate --out`` writes every built-in file; they are the committed ones byte for byte (what
    ``regattn generate --check`` checks of numeric/_generated: CI's check that the committed files are current);
    ``--check --out`` passes on the folder and fails on a hand edit and a stray file."""
    from pathlib import Path

    import numeric._generated as committed
    from numeric._generated import rows_solve  # (the row solves' parts it names: rows_solve_01.py...)

    assert main(["generate", "--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["__init__.py", "continuous_entmax15.py", "continuous_softmax.py", "continuous_sparsemax.py",
                     "entmax.py", "entmax15.py", "entmax_dense.py", "entmax_sparse.py", "newton_link.py", "newton_link_triton.py", "rows_solve.py",
                     *(f"{part}.py" for part in rows_solve.PARTS), "sigmoid.py", "softmax.py", "sparsemax.py"]
    folder = Path(committed.__file__).parent
    assert sorted(p.name for p in folder.glob("*.py")) == names  # (no stray module among the committed ones)
    stale = [name for name in names if (folder / name).read_bytes() != (tmp_path / name).read_bytes()]
    assert stale == [], f"run `regattn generate`: stale committed files {stale}"
    assert main(["generate", "--check", "--out", str(tmp_path)]) == 0
    assert "current" in capsys.readouterr().out
    # a hand edit makes --check fail with a diff naming the file
    target = tmp_path / "sparsemax.py"
    target.write_text(target.read_text().replace("return (S_1 - 1)/k", "return (S_1 - 2)/k"))
    (tmp_path / "stray.py").write_text("x = 1\n")
    capsys.readouterr()
    assert main(["generate", "--check", "--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "sparsemax.py" in captured.out and "-    return (S_1 - 2)/k" in captured.out
    assert "stray.py" in captured.out and "stale" in captured.err


def test_generate_user_map_imports_with_plain_python(tmp_path, capsys):
    assert main(["generate", "--expr", "p*log(p) + p**2/2", "--name", "mixed", "--out", str(tmp_path)]) == 0
    path = tmp_path / "mixed.py"
    assert path.exists() and str(path) in capsys.readouterr().out
    proc = subprocess.run(
        [sys.executable, "-c", "import mixed; print(mixed.NAME, mixed.LINK_METHOD, mixed.THRESHOLD, mixed.weight(0.5))"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    name, method, kind, w = proc.stdout.split()
    assert (name, method, kind) == ("mixed", "newton", "root") and float(w) == pytest.approx(0.5 / 1.5)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--expr", "p**3", "--name", "not-valid", "--out", "."], "not a Python identifier"),
        (["generate", "--expr", "p**3", "--name", "class", "--out", "."], "not a Python identifier"),
        (["generate", "--expr", "p**3", "--name", "cube"], "needs all of"),
        (["generate", "--expr", "p**3", "--name", "cube", "--out", "/dev/null/dir"], "/dev/null is not a directory"),
        (["generate", "--check", "--expr", "p**3", "--name", "cube", "--out", "."], "built-ins only"),
        (["generate", "--expr", "p", "--name", "lin", "--out", "."], "not strictly convex"),
    ],
)
def test_generate_bad_input(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_generate_unwritable_folder_leaves_nothing(tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root can write into read-only folders")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        assert main(["generate", "--expr", "p**3", "--name", "cube", "--out", str(folder)]) == 2
        assert "not writable" in capsys.readouterr().err
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o700)


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    from derive.codegen import files

    target = tmp_path / "m.py"
    target.write_text("old\n")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", boom)
    with pytest.raises(OSError):
        files.write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.py"]


def test_derive_continuous(capsys):
    assert main(["derive", "gini", "--continuous"]) == 0
    out = capsys.readouterr().out
    assert "compact" in out and "radius" in out and "erf" in out
    assert main(["derive", "shannon", "--continuous", "--latex"]) == 0
    out = capsys.readouterr().out
    assert r"\text{density (Gaussian, full support):}" in out and r"\operatorname{erf}" not in out


def test_verify_continuous(capsys):
    assert main(["verify", "gini", "--continuous", "--samples", "3", "--points", "5"]) == 0
    out = capsys.readouterr().out
    assert "compact density" in out and "verdict      all checks passed" in out
    # no rows of scores to time: the cost line names the rule and says why there is no time
    assert "\ncost         closed (" in out and ", sparse; time not measured: a continuous map has no rows" in out
    for line in ("density ", "numpy        double", "device (g++) double", "device (g++) float"):
        assert line in out and "FAILED" not in out
    assert main(["verify", "--expr", "p**3", "--continuous", "--samples", "1"]) == 2
    assert "not a polynomial" in capsys.readouterr().err


def test_verify_verdict_names_what_did_not_run(monkeypatch, capsys):
    """Without torch, JAX and NVRTC (their probes simulated as missing) the verdict says what was not checked."""
    from derive.codegen import compilers

    for target in ("torch", "jax"):
        monkeypatch.setitem(sys.modules, f"numeric.{target}.maps", None)  # importing it raises ImportError
    monkeypatch.setattr(compilers, "nvrtc_available", lambda: False)
    assert main(["verify", "--expr", "p**3", "--samples", "2", "--points", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("torch        not installed") for line in lines)
    assert lines[-1] == "verdict      all checks that ran passed; not checked: torch, jax, NVRTC (not installed)"


def test_generate_creates_a_missing_out_folder(tmp_path, capsys):
    user = tmp_path / "a" / "b"
    assert main(["generate", "--expr", "p**3", "--name", "cube", "--out", str(user)]) == 0
    assert (user / "cube.py").is_file()
    built = tmp_path / "c" / "d"
    assert main(["generate", "--out", str(built)]) == 0
    assert (built / "sparsemax.py").is_file()
    # bad input creates no folder
    assert main(["generate", "--expr", "p", "--name", "lin", "--out", str(tmp_path / "e" / "f")]) == 2
    assert not (tmp_path / "e").exists()


def test_unknown_name_is_one_line_naming_the_closest(capsys):
    assert main(["derive", "sparsmax"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("regattn: error: ") and "usage" not in err
    assert "did you mean 'sparsemax'?" in err and "shannon, gini, tsallis, binary_entropy, softmax, sparsemax" in err


def test_derive_continuous_prints_readable_symbols(capsys):
    assert main(["derive", "gini", "--continuous"]) == 0
    out = capsys.readouterr().out
    assert "s__2" not in out and r"\mathcal" not in out
    assert "E_p[N(t; c, s²)]" in out
