"""The verify pipeline as a library call: the steps, their failures and scopes, and the verdict."""

from __future__ import annotations

import importlib.util
import re

import pytest

from derive import DerivationError, Regularizer, derive_map, gini
from derive.codegen.pipeline import Step, Verification, verdict, verify_continuous_map, verify_map
from derive.continuous import derive_continuous
from numeric import contract


def test_verify_map_runs_every_check_and_passes():
    seen = []
    result = verify_map(derive_map(gini()), "sparsemax", samples=3, points=5, on_step=seen.append)
    labels = [step.label for step in result.steps]
    # each framework: its routines in double and in float, or one line saying it is not installed
    sections = [label for t in contract.FRAMEWORKS for label in ([t, t] if _installed(t) else [t])]
    assert labels == ["regularizer", "derived", "reference", "generated", "numpy", "device (g++)", "device (g++)",
                      *sections, "numeric map", "cost", "nvrtc", "example"]
    for step in result.steps:
        if step.label in contract.FRAMEWORKS and not _installed(step.label):
            assert "not installed" in step.text
    assert seen == result.steps  # each step reported as it completed, in order
    assert result.ok and result.verdict() == "all checks passed"
    assert "link closed (power)" in result.steps[1].text
    assert result.report().splitlines()[-1] == "verdict      all checks passed"


def test_a_failure_is_scoped_and_named():
    """omega = p**100: its float device functions meet subnormal intermediates (scope "float")."""
    result = verify_map(derive_map(Regularizer.from_string("p**100")), "power100", samples=3, points=40)
    assert not result.ok
    scopes = {scope for _, scope in result.failures}
    # the frameworks' float32 meets the same subnormals (flushed to zero by XLA on CPU)
    frameworks = [t for t in contract.FRAMEWORKS if _installed(t)]
    assert scopes == {"float", *(f"{t} float" for t in frameworks)}, result.failures
    failed = [step for step in result.steps if not step.ok]
    assert [step.label for step in failed] == ["device (g++)", *frameworks] and "FAILED: " in failed[0].text
    assert all(step.text.startswith("float ") for step in failed)
    tail = f", with {' and '.join(frameworks)} in float64 only" if frameworks else ""
    # the map's own routines decide where it is usable; the weight (the JVP) is named apart, in float32
    assert "; the map is usable in NumPy, and with CuPy on a GPU in float64 only" + tail + "; " in result.verdict()
    if frameworks:
        assert re.search(rf"; the JVP \(weight\) loses all its digits in float32 near p = \S+ \({', '.join(frameworks)}\): "
                         f"compute the JVP in float64 with {' and '.join(frameworks)}$", result.verdict()), result.verdict()


def _installed(target: str) -> bool:
    return importlib.util.find_spec(target) is not None


def test_verdict_orders_scopes():
    assert verdict([("x", "float"), ("y", "all")]).endswith("; do not use the map")
    assert verdict([("x", "torch"), ("y", "jax float")]).endswith(
        "usable in NumPy and with CuPy on a GPU, not with torch, with jax in float64 only")
    assert verdict([("x", "torch"), ("y", "all")]).endswith("; do not use the map")
    assert Verification([Step("a", "b", (("x", "device"),))]).verdict().endswith("usable in NumPy only (not with CuPy on a GPU)")


def test_verify_continuous_map():
    result = verify_continuous_map(derive_continuous(gini()), "continuous_sparsemax", samples=2, points=5)
    assert result.ok, result.report()
    assert [step.label for step in result.steps][:4] == ["regularizer", "derived", "density", "generated"]


def test_verify_continuous_map_refuses_a_family_without_closed_context():
    with pytest.raises(DerivationError, match="closed"):
        verify_continuous_map(derive_continuous(Regularizer.from_string("p**3")), "cube", samples=1)


def test_verdict_names_what_did_not_run():
    skipped = [("torch", "not installed"), ("jax", "not installed")]
    assert verdict([], skipped) == "all checks that ran passed; not checked: torch, jax (not installed)"
    assert verdict([("x", "device")], skipped).endswith(
        "usable in NumPy only (not with CuPy on a GPU); not checked: torch, jax (not installed)")
    result = Verification([Step("nvrtc", "not installed", unchecked=("NVRTC", "not installed"))])
    assert result.ok and result.verdict() == "all checks that ran passed; not checked: NVRTC (not installed)"
