"""The verify pipeline as a library call: the steps, their failures and scopes, and the verdict."""

from __future__ import annotations

import pytest

from derive import DerivationError, Regularizer, derive_map, gini
from derive.codegen.pipeline import Step, Verification, verdict, verify_continuous_map, verify_map
from derive.continuous import derive_continuous


def test_verify_map_runs_every_check_and_passes():
    seen = []
    result = verify_map(derive_map(gini()), "sparsemax", samples=3, points=5, on_step=seen.append)
    labels = [step.label for step in result.steps]
    assert labels == ["regularizer", "derived", "reference", "generated", "numpy", "device (g++)", "device (g++)",
                      "numeric map", "nvrtc", "example"]
    assert seen == result.steps  # each step reported as it completed, in order
    assert result.ok and result.verdict() == "all checks passed"
    assert "link closed (power)" in result.steps[1].text
    assert result.report().splitlines()[-1] == "verdict      all checks passed"


def test_a_failure_is_scoped_and_named():
    """omega = p**100: its float device functions meet subnormal intermediates (scope "float")."""
    result = verify_map(derive_map(Regularizer.from_string("p**100")), "power100", samples=3, points=40)
    assert not result.ok
    scopes = {scope for _, scope in result.failures}
    assert scopes == {"float"}, result.failures
    failed = [step for step in result.steps if not step.ok]
    assert [step.label for step in failed] == ["device (g++)"] and "FAILED: " in failed[0].text
    assert result.verdict().endswith("usable in NumPy, and with CuPy on a GPU in float64 only")


def test_verdict_orders_scopes():
    assert verdict([("x", "float"), ("y", "all")]).endswith("; do not use the map")
    assert Verification([Step("a", "b", (("x", "device"),))]).verdict().endswith("usable in NumPy only (not with CuPy on a GPU)")


def test_verify_continuous_map():
    result = verify_continuous_map(derive_continuous(gini()), "continuous_sparsemax", samples=2, points=5)
    assert result.ok, result.report()
    assert [step.label for step in result.steps][:4] == ["regularizer", "derived", "density", "generated"]


def test_verify_continuous_map_refuses_a_family_without_closed_context():
    with pytest.raises(DerivationError, match="closed"):
        verify_continuous_map(derive_continuous(Regularizer.from_string("p**3")), "cube", samples=1)
