"""derive.testing: the hypothesis strategies, check_map on built-in and typed maps (passing) and on wrong maps
(failing with the falsifying example), and ``regattn verify --hypothesis N``.

Sized for CI (the ``ci`` profile): check_map draws ``EXAMPLES`` examples (200 in the thorough profile), NumPy
alone except where a test is about the other backends; JAX compiles one program per map, dtype and derivative,
so it runs on sparsemax only here (and in the command's test)."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import find as _find
from hypothesis import strategies as st

import numeric as nm
from derive.cli import main
from numeric.maps import import_map_module
from derive.testing import (BACKENDS, CHECKS, TOLERANCES, MapCheckError, check_map, derivation_for, distributions,
                            generated_map, parameters, rows, tangents)
from tests.profile import THOROUGH

EXAMPLES = 200 if THOROUGH else 15
INSTALLED = tuple(b for b in BACKENDS if b == "numpy" or importlib.util.find_spec(b) is not None)
TYPED = "p**2/2 + p*log(1 + p)"  # no closed-form link: inverted by safeguarded Newton


@pytest.fixture(scope="module")
def typed():
    with generated_map(TYPED, "gini_log1p_checked") as module:
        yield module


def find(strategy, condition):
    """An example of ``strategy`` meeting ``condition``: the first one drawn (not shrunk, which is slow)."""
    return _find(strategy, condition, settings=settings(max_examples=2000, phases=[Phase.generate], database=None))


def _ties(row) -> bool:
    finite = row[np.isfinite(row)]
    return np.unique(finite).size < finite.size


def _row_in_message(message: str) -> np.ndarray:
    """The falsifying row as the message prints it (NumPy code), rebuilt."""
    line = next(text for text in message.splitlines() if text.strip().startswith("row "))
    return eval(line.split("=", 1)[1], {"np": np})  # (our own message: np.array([...], dtype=np.float64))


# ------------------------------------------------------------------ strategies
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@given(data=st.data())
def test_rows_are_exact_rows_with_a_finite_score(dtype, data):
    x = data.draw(rows(dtype, max_size=12))
    assert x.ndim == 1 and 1 <= x.size <= 12 and x.dtype == np.dtype(dtype)
    assert np.isfinite(x).any() and not np.isnan(x).any() and not (x == np.inf).any()
    v, y = data.draw(tangents(x)), data.draw(distributions(x))
    assert v.dtype == y.dtype == x.dtype and v.shape == y.shape == x.shape and np.abs(v).max() <= 1
    # a target: a distribution on the finite scores, summing to 1 exactly
    assert (y >= 0).all() and (y[~np.isfinite(x)] == 0).all() and math.fsum(y.tolist()) == 1


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_rows_reach_ties_masks_and_extreme_scales(dtype):
    big = 1e30 if dtype == "float64" else float(np.finfo(np.float32).max) / 4
    finite = lambda x: x[np.isfinite(x)]  # noqa: E731
    assert _ties(find(rows(dtype), lambda x: _ties(x) and x.size >= 3))
    assert np.isneginf(find(rows(dtype), lambda x: np.isneginf(x).sum() >= 2)).sum() >= 2
    assert np.abs(finite(find(rows(dtype), lambda x: np.abs(finite(x)).max() >= big))).max() >= big
    assert np.ptp(finite(find(rows(dtype), lambda x: np.ptp(finite(x)) > 1e11))) > 1e11
    tiny = find(rows(dtype), lambda x: finite(x).size >= 2 and 0 < np.ptp(finite(x)) < 1e-8)
    assert 0 < np.ptp(finite(tiny)) < 1e-8
    offset = find(rows(dtype), lambda x: np.abs(finite(x)).min() > 1e5 and np.ptp(finite(x)) < 1)
    assert np.abs(finite(offset)).min() > 1e5


@pytest.mark.parametrize("name", ["entmax", "entmax_sparse", "entmax_dense"])
@given(data=st.data())
def test_parameters_lie_inside_their_declared_domains(name, data):
    module = import_map_module(name)
    values = data.draw(parameters(name))
    assert set(values) == set(module.PARAMETERS)
    for q, v in values.items():
        lo, hi = module.PARAMETER_DOMAINS[q]
        assert lo < v < hi
        nm.get_map(name, **values)  # the map takes them


def test_parameters_reach_every_case_of_a_family_and_declared_domains():
    assert find(parameters("entmax"), lambda v: v["alpha"] == 1.0) == {"alpha": 1.0}  # the point case, softmax
    assert find(parameters("entmax"), lambda v: v["alpha"] < 1)["alpha"] > 0
    assert find(parameters("entmax"), lambda v: v["alpha"] > 2)["alpha"] > 2
    assert find(parameters("softmax"), lambda v: True) == {}
    from derive import Regularizer

    reg = Regularizer.from_string("c*p**2/2 + p**3", name="gini_cube", parameters=[("c", "1/4", "3")])
    with generated_map(reg, "gini_cube_checked") as module:
        for _ in range(3):
            value = find(parameters(module), lambda v: True)["c"]
            assert 0.25 < value < 3
        low = find(parameters(module), lambda v: v["c"] < 0.3)["c"]
        assert 0.25 < low < 0.3


def test_derivation_for_picks_a_family_case():
    assert derivation_for("entmax", alpha=1.0)[0].name == "softmax"
    dv, values = derivation_for("entmax", alpha=0.5)
    assert not dv.sparse and values == {"alpha": 0.5}
    assert derivation_for("entmax", alpha=2.5)[0].sparse
    with pytest.raises(ValueError, match="needs values"):
        derivation_for("entmax_sparse")


# ------------------------------------------------------------------ check_map passes
@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "entmax", "entmax_sparse", "entmax_dense", "sigmoid"])
def test_check_map_passes_on_the_builtins(name):
    result = check_map(name, backends=("numpy",), max_examples=EXAMPLES)
    assert result.name == name and result.ran == ("numpy",) and result.examples >= min(EXAMPLES, 10)
    assert [line.check for line in result.lines] == list(CHECKS)
    for line in result.lines:
        assert line.examples == result.examples and 0 <= line.worst <= 1
        assert set(line.dtypes) <= set(TOLERANCES) and line.dtypes
    assert result.params == ({} if name in ("softmax", "sparsemax", "entmax15", "sigmoid") else None)  # None: drawn


def test_check_map_runs_every_installed_backend():
    result = check_map("sparsemax", max_examples=EXAMPLES)
    assert result.ran == INSTALLED
    assert result.skipped == tuple((b, "not installed") for b in BACKENDS if b not in INSTALLED)
    assert len(result.lines) == len(INSTALLED) * len(CHECKS)
    assert result.report().count("\n") == len(result.lines) + len(result.skipped)


def test_check_map_passes_on_a_typed_map(typed):
    assert typed.LINK_METHOD == "newton"
    backends = tuple(b for b in INSTALLED if b != "jax")
    result = check_map(typed, backends=backends, max_examples=EXAMPLES)
    assert result.ran == backends and result.name == "gini_log1p_checked"
    by_object = check_map(nm.get_map(typed), backends=("numpy",), max_examples=5, dtypes=("float32",))
    assert all(line.dtypes == ("float32",) for line in by_object.lines)


def test_a_map_object_checks_its_own_parameters():
    result = check_map(nm.get_map("entmax", alpha=1.3), backends=("numpy",), max_examples=5)
    assert result.params == {"alpha": 1.3}
    assert check_map("entmax_sparse", backends=("numpy",), params={"alpha": 4.0}, max_examples=5).params == {"alpha": 4.0}


def test_a_backend_not_installed_is_skipped_and_named(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("torch", "jax") else find_spec(name, *a))
    result = check_map("softmax", max_examples=3)
    assert result.ran == ("numpy",) and result.skipped == (("torch", "not installed"), ("jax", "not installed"))
    assert "torch  not checked: not installed (pip install 'regattn[torch]')" in result.report()


def test_check_map_refuses_what_it_cannot_check():
    with pytest.raises(ValueError, match="backends must be some of"):
        check_map("softmax", backends=("cupy",))
    with pytest.raises(ValueError, match="not to both"):
        check_map(nm.get_map("entmax", alpha=1.5), params={"alpha": 2.0})
    with pytest.raises(ValueError, match="one value per parameter"):
        check_map(nm.get_map("entmax", alpha=np.array([[1.5], [2.0]])))
    with pytest.raises(ValueError, match="outside"):
        check_map("entmax_sparse", params={"alpha": 0.5})
    with pytest.raises(TypeError, match="not one generated from a separable regularizer"):
        check_map("normmax")
    with pytest.raises(ValueError, match="no map named"):
        check_map("sparsmax")


# ------------------------------------------------------------------ check_map fails, with the example
class _OffOnTies(nm.Map):
    """A map whose output is 1e-9 too large wherever a row holds tied finite scores (rows along the last axis)."""

    def forward(self, x, axis=-1, **kwargs):
        p, tau = super().forward(x, axis, **kwargs)
        ties = np.array([_ties(row) for row in np.asarray(x).reshape(-1, x.shape[-1])]).reshape(x.shape[:-1] + (1,))
        return np.where(ties, p * (1 + 1e-9), p).astype(p.dtype), tau


class _OffWhenLarge(nm.Map):
    """A map whose JVP is 0.1% off on rows whose scores reach 1e6 in magnitude."""

    def jvp(self, y, dx, axis=-1, **kwargs):
        out = super().jvp(y, dx, axis, **kwargs)
        return out * 1.001 if self.large else out

    def forward(self, x, axis=-1, **kwargs):
        finite = np.abs(x[np.isfinite(x)])
        self.large = bool(finite.size and finite.max() >= 1e6)
        return super().forward(x, axis, **kwargs)


def test_a_map_off_on_ties_fails_with_the_falsifying_row():
    wrong = _OffOnTies(nm.get_map("entmax15").module)
    with pytest.raises(MapCheckError) as info:
        check_map(wrong, backends=("numpy",), max_examples=max(EXAMPLES, 50))
    error = info.value
    assert error.backend == "numpy" and error.check == "values" and error.dtype == "float64"
    assert _ties(error.example.row)
    message = str(error)
    assert message.startswith("check_map('entmax15'): values FAILED on numpy, float64: |p - p*|")
    row = _row_in_message(message)
    np.testing.assert_array_equal(row, error.example.row)
    assert row.dtype == np.float64 and _ties(row)
    assert "  p*      = " in message and "  target  = np.array([" in message


def test_a_map_off_at_large_scores_fails_its_jvp_there():
    wrong = _OffWhenLarge(nm.get_map("softmax").module)
    with pytest.raises(MapCheckError) as info:
        check_map(wrong, backends=("numpy",), max_examples=max(EXAMPLES, 50))
    error = info.value
    assert error.check == "JVP"
    row = _row_in_message(str(error))
    assert np.abs(row[np.isfinite(row)]).max() >= 1e6
    np.testing.assert_array_equal(row, error.example.row)


def test_a_tampered_module_fails_with_its_parameters(monkeypatch):
    from derive import Regularizer

    reg = Regularizer.from_string("c*p**2/2 + p**3", name="gini_cube", parameters=[("c", "0", "oo")])
    with generated_map(reg, "gini_cube_tampered") as module:
        weight = module.weight
        monkeypatch.setattr(module, "weight", lambda p, c: weight(p, c) * (1 + 1e-6))  # the JVP's weight, 1e-6 off
        with pytest.raises(MapCheckError) as info:
            check_map(module, backends=("numpy",), max_examples=max(EXAMPLES, 50))
    error = info.value
    assert error.check == "JVP" and set(error.example.params) == {"c"}
    assert f"  params  = {{'c': {error.example.params['c']!r}}}" in str(error)
    np.testing.assert_array_equal(_row_in_message(str(error)), error.example.row)


# ------------------------------------------------------------------ the optional dependency
def test_import_derive_does_not_import_hypothesis():
    code = "import sys, derive, derive.cli, derive.codegen.pipeline; assert 'hypothesis' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_without_hypothesis_the_import_error_says_what_to_install():
    code = ("import sys; sys.modules['hypothesis'] = None\n"
            "try:\n    import derive.testing\nexcept ImportError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True).stdout
    assert "pip install hypothesis" in out


# ------------------------------------------------------------------ regattn verify --hypothesis
def test_verify_hypothesis_prints_a_line_per_backend_and_check(capsys):
    assert main(["verify", "--expr", "p**3", "--samples", "2", "--points", "3", "--hypothesis", "4"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("hypothesis ")]
    assert len(lines) == len(INSTALLED) * len(CHECKS) + len(BACKENDS) - len(INSTALLED)
    assert all(line.endswith("(ok)") for line in lines if "not checked" not in line)
    assert "hypothesis   numpy  values    4 examples (" in out
    assert out.splitlines()[-1].startswith("verdict      all checks")


def test_verify_hypothesis_fails_with_the_falsifying_example(monkeypatch, capsys):
    jvp = nm.Map.jvp
    monkeypatch.setattr(nm.Map, "jvp", lambda self, y, dx, *a, **k: jvp(self, y, dx, *a, **k) + 1e-9)
    assert main(["verify", "sparsemax", "--samples", "2", "--points", "3", "--hypothesis", "20"]) == 1
    out = capsys.readouterr().out
    assert "hypothesis   numpy JVP FAILED (float64): |Jv - (Jv)*|" in out and "falsifying example (shrunk):" in out
    assert _row_in_message(out).dtype == np.float64
    verdict = out.splitlines()[-1]
    assert verdict.startswith("verdict      FAIL: JVP (float64, numpy) fails a property check")
    assert "the map is within tolerance" in verdict and "do not use the JVP" in verdict


@pytest.mark.parametrize("argv, message", [
    (["verify", "sparsemax", "--hypothesis", "0"], "--hypothesis takes a number of examples >= 1"),
    (["verify", "gini", "--continuous", "--hypothesis", "5"], "--hypothesis applies to discrete maps"),
])
def test_verify_hypothesis_bad_input(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err
