"""The regattn command: derive and verify, good and bad input."""

from __future__ import annotations

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
