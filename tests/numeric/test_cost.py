"""numeric.cost: the rule that solves a map's threshold, read off its module as numeric.core.rules.solve reads it,
whether the map is sparse, and its time beside entmax15's."""

from __future__ import annotations

import math

import pytest

import numeric as nm
from numeric import cost


@pytest.mark.parametrize("name, params, kind, words", [
    ("softmax", {}, "closed", "one pass"),
    ("sparsemax", {}, "sort", "Michelot's steps"),
    ("entmax15", {}, "sort", "Newton steps on the support"),
    ("entmax", {"alpha": 1.25}, "root", "Newton from below"),  # k = 4
    ("entmax", {"alpha": 3.0}, "root", "Newton in the weight of the smallest score between the two kinks"),  # k = 1/2
    ("entmax", {"alpha": 0.5}, "root", "safeguarded Halley on the printed link"),  # the dense case
    ("relu", {}, "none", "no sum constraint"),
])
def test_rule_of_a_map(name, params, kind, words):
    m = nm.get_map(name, **params)
    found = cost.rule(m)
    assert found.kind == kind and words in found.how, found
    solving = m._case()
    if kind != "none":
        assert found.kind == solving.module.THRESHOLD
    assert cost.is_sparse(m) == solving.module.SPARSE
    assert ("largest scores first" in found.how) == (name == "entmax" and params["alpha"] == 3.0)


def test_forced_threshold_and_map_family():
    assert cost.rule(nm.get_map("sparsemax", threshold="root")).how.startswith("Newton from below")
    assert cost.rule(nm.get_map("normmax")).kind == "root"  # its inner map, the entmax family
    with pytest.raises(TypeError, match="bound"):
        cost.rule(nm.get_map("softmax"), alpha=2.0)


def test_describe_names_every_kind():
    assert cost.describe("root", "general", False, sparse=True).kind == "KKT"
    assert cost.describe("root", "general", True, link="-1/z").how == "safeguarded Halley on the printed link g(z) = -1/z"
    assert "where k < 1" in cost.describe("root", "power", True, "1/(alpha - 1)").how
    with pytest.raises(ValueError, match="threshold"):
        cost.describe("auto", "power", True)


def test_relative_time_is_a_positive_ratio_on_one_thread():
    nm.set_num_threads(2)
    try:
        timing = cost.relative_time(nm.get_map("sparsemax"), shape=(64, 32), calls=5)
        assert nm.get_num_threads() == 2  # restored
    finally:
        nm.set_num_threads(None)
    assert 0 < timing.ratio < math.inf and timing.seconds > 0 and timing.reference_seconds > 0
    assert 3 <= timing.calls <= 5 and timing.shape == (64, 32) and timing.dtype == "float32"
    assert timing.text().endswith("x entmax15 (NumPy forward, N(0, 1) scores 64 x 32 float32, one thread, "
                                  f"median of {timing.calls} interleaved calls)")
