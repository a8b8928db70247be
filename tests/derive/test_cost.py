"""What a map costs, as ``regattn derive`` and ``regattn verify`` say it: the rule that solves its threshold, sparse
or dense, and (verify) its time beside entmax15's; each against the generated module's own constants."""

from __future__ import annotations

import contextlib
import importlib
import math
import re

import pytest

import numeric as nm
from derive import Regularizer, derive_map, gini, tsallis
from derive import cost as derive_cost
from derive.cli import main
from derive.codegen import pipeline
from derive.testing import generated_map
from numeric import cost

#: (what verify is given, the rule's kind, sparse): a sort, a printed link, no closed form, a closed threshold
CASES = [
    (["sparsemax"], "sort", True),
    (["--expr", "cosh(p) - 1"], "root", True),
    (["--expr", "p*log(p) + p**3"], "KKT", False),
    (["softmax"], "closed", False),
]

_COST = re.compile(r"^cost {9}(\S+) \((.*)\), (sparse|dense); (\S+)x entmax15 "
                   r"\(NumPy forward, N\(0, 1\) scores 512 x 256 float32, one thread, median of (\d+) interleaved calls\)$")


@contextlib.contextmanager
def _module(argv, name):
    """The module verify generates for ``argv``: a built-in's committed module, or the ``--expr`` generated."""
    if argv[0] == "--expr":
        with generated_map(argv[1], name) as module:
            yield module
    else:
        yield importlib.import_module(f"numeric._generated.{argv[0]}")


def _matches_module(kind: str, module) -> bool:
    """A rule's kind is its module's ``THRESHOLD``, or ``"KKT"`` for a ``"root"`` module without a printed link."""
    if kind == "KKT":
        return module.THRESHOLD == "root" and module.LINK_METHOD == "newton" and module.link is None
    return kind == module.THRESHOLD


@pytest.mark.parametrize("argv, kind, sparse", CASES)
def test_verify_prints_the_generated_modules_rule_and_a_time(argv, kind, sparse, capsys):
    assert main(["verify", *argv, "--samples", "2", "--points", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if line.startswith("cost ")]
    assert len(lines) == 1, out
    match = _COST.match(lines[0])
    assert match, lines[0]
    printed, how, word, ratio, calls = match.groups()
    assert out.index(lines[0]) == [line.split()[0] for line in out].index("numeric") + 1  # after the numeric map
    with _module(argv, f"cost_check_{len(argv)}_{kind.lower()}") as module:
        assert _matches_module(printed, module), (printed, module.THRESHOLD, module.LINK_METHOD)
        assert (word == "sparse") == module.SPARSE
        assert f"{printed} ({how})" == cost.rule(nm.get_map(module)).line()
    assert (printed, word == "sparse") == (kind, sparse)
    assert 0 < float(ratio) < math.inf and 3 <= int(calls) <= 9
    assert out[-1].startswith("verdict      all checks")


@pytest.mark.parametrize("argv, kind, sparse", CASES)
def test_derive_ends_with_the_rule_and_sparsity(argv, kind, sparse, capsys):
    assert main(["derive", *argv]) == 0
    lines = capsys.readouterr().out.rstrip("\n").splitlines()
    assert lines[-3] == "" and lines[-2].startswith(f"rule: {kind} (")
    assert lines[-1].startswith("sparse: yes (omega'(0+) = " if sparse else "sparse: no (omega'(0+) = -oo")
    with _module(argv, f"cost_derive_{len(argv)}_{kind.lower()}") as module:
        assert _matches_module(kind, module)


def test_derive_latex_keeps_the_rule_in_comments(capsys):
    """With --latex the derivation is as before, and the rule and sparsity follow as LaTeX comments."""
    assert main(["derive", "sparsemax", "--latex"]) == 0
    out = capsys.readouterr().out
    body, comments = out[:out.index("% rule: ")], out[out.index("% rule: "):].splitlines()
    assert body == derive_map(gini()).latex() + "\n"
    assert len(comments) == 2 and comments[0].startswith("% rule: sort (") and comments[1].startswith("% sparse: yes")
    assert "sort" == importlib.import_module("numeric._generated.sparsemax").THRESHOLD


def test_derive_names_the_rule_of_each_case_and_without_the_sum(capsys):
    assert main(["derive", "relu"]) == 0
    rules = [line for line in capsys.readouterr().out.splitlines() if line.startswith("rule: ")]
    assert rules == [rules[0]] and rules[0].startswith("rule: none (no sum constraint") and "on the simplex sort (" in rules[0]
    assert main(["derive", "gini", "--continuous"]) == 0
    lines = capsys.readouterr().out.rstrip("\n").splitlines()
    assert lines[-2].startswith("rule: closed (") and lines[-1].startswith("sparse: yes (compact support")


@pytest.mark.parametrize("text", ["p**2/2", "p*log(p)", "cosh(p) - 1", "p*log(p) + p**3", "p**2/2 + p*log(1 + p)",
                                  "-log(p)", "p**3", "p**2/2 + p**3/3", "p**4/4 + p**2/2"])
def test_the_derivations_rule_is_the_generated_modules(text):
    """``regattn derive`` reads the rule off the derivation, ``verify`` off the module: the same words."""
    name = "cost_same_" + re.sub(r"\W", "_", text).strip("_")
    reg = Regularizer.from_string(text, name=name)
    dv = derive_map(reg)
    with generated_map(reg, name) as module:
        assert derive_cost.rule(dv, link=False) == cost.rule(module)
        assert dv.sparse == cost.is_sparse(module) == module.SPARSE


@pytest.mark.parametrize("alpha, kind", [("3/2", "sort"), ("4/3", "root"), ("3", "root")])
def test_tsallis_rule_is_the_modules(alpha, kind):
    import sympy as sp

    dv = derive_map(tsallis(sp.Rational(alpha)))
    with generated_map(tsallis(sp.Rational(alpha)), f"cost_tsallis_{alpha.replace('/', '_')}") as module:
        found = cost.rule(module)
        assert found.kind == kind == module.THRESHOLD and derive_cost.rule(dv, link=False) == found
    assert ("Newton from below" in found.how) == (alpha == "4/3")  # k = 3 >= 1: Newton from below
    assert ("between the two kinks" in found.how) == (alpha == "3")  # k = 1/2: Newton on the root's piece


def test_cost_step_judges_nothing(monkeypatch):
    """The cost line never changes the verdict: a map that cannot be timed says so and still passes."""
    result = pipeline.verify_map(derive_map(gini()), "cost_gini", samples=2, points=3, timing=False)
    step = next(s for s in result.steps if s.label == "cost")
    assert step.ok and step.unchecked is None and step.text.endswith(", sparse") and "entmax15" not in step.text

    def fail(*args, **kwargs):
        raise FloatingPointError("overflow in float32")

    monkeypatch.setattr(cost, "relative_time", fail)
    step = pipeline.cost_step(nm.get_map("sparsemax"))
    assert step.ok and step.text.endswith("; time not measured: FloatingPointError: overflow in float32")
    assert pipeline.Verification([step]).verdict() == "all checks passed"
