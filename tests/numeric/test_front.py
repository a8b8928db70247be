"""One front end: NumPy, torch and JAX maps and losses take the same keywords and refuse the same arguments with
the same errors (numeric.front), the map's axis keyword aside (``dim`` in torch, ``axis`` elsewhere).

Each case is run on every backend installed; the errors' types and texts must agree with NumPy's, with ``dim``
read as ``axis`` and torch's dtype names read as NumPy's.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import numeric as nm
from tests.backends import BACKENDS as ALL_BACKENDS


class _Calls:
    """A backend of :mod:`tests.backends` as the cases call it: ``b["map"]``, ``b["call"]``, ... (errors are compared
    as each front end raises them)."""

    def __init__(self, backend):
        self.b = backend

    def __getitem__(self, key):
        b = self.b
        return {"context": b.context, "array": b.array,
                "map": lambda name, threshold="auto", **params: b.get_map(name, threshold=threshold, **params),
                "call": lambda m, x, axis=-1: b.call(m, x, axis=axis),
                "loss": lambda m, x, target, axis=-1, reduction="mean": b.loss(m, x, target, axis=axis,
                                                                              reduction=reduction)}[key]


BACKENDS = {name: (lambda cls=cls: _Calls(cls())) for name, cls in ALL_BACKENDS.items()}
_numpy = BACKENDS["numpy"]


def _outcome(fn):
    """``(type, text)`` of the error ``fn()`` raises, its text with the backends' spellings read as NumPy's."""
    try:
        fn()
    except (ValueError, TypeError) as exc:
        text = re.sub(r"\bdim\b", "axis", str(exc))
        text = re.sub(r"\btorch\.(?=[a-z]+\d*\b)", "", text)  # torch.float64 -> float64
        return type(exc), text
    return None, None


X = np.array([[1.0, 0.5, -1.0], [0.0, 0.2, 0.1]])
ALPHAS = np.array([[1.5], [2.0]])
#: (case, what to run given a backend's dict): every one must raise
CASES = {
    "threshold name": lambda b: b["map"]("softmax", threshold="fastest"),
    "sort on a closed map": lambda b: b["map"]("softmax", threshold="sort"),
    "closed on a sort map": lambda b: b["map"]("entmax15", threshold="closed"),
    "unknown parameter": lambda b: b["map"]("entmax", beta=1.5),
    "missing parameter": lambda b: b["call"](b["map"]("entmax"), b["array"](X)),
    "number outside the domain": lambda b: b["call"](b["map"]("entmax", alpha=-0.5), b["array"](X)),
    "array outside the domain": lambda b: b["call"](b["map"]("entmax", alpha=b["array"](np.array([[1.5], [-0.75]]))),
                                                    b["array"](X)),
    "NaN parameter": lambda b: b["map"]("entmax", alpha=float("nan")),
    "bool parameter": lambda b: b["map"]("entmax", alpha=True),
    "text parameter": lambda b: b["map"]("entmax", alpha="1.5"),
    "complex parameter": lambda b: b["map"]("entmax", alpha=b["array"](np.array([1.5 + 0j]))),
    "empty parameter": lambda b: b["map"]("entmax", alpha=b["array"](np.zeros((0, 1)))),
    "parameter with more dimensions": lambda b: b["call"](b["map"]("entmax", alpha=b["array"](np.full((1, 2, 1), 1.5))),
                                                          b["array"](X)),
    "parameter along the axis": lambda b: b["call"](b["map"]("entmax", alpha=b["array"](np.full((1, 3), 1.5))),
                                                    b["array"](X)),
    "parameter not broadcasting": lambda b: b["call"](b["map"]("entmax", alpha=b["array"](np.full((3, 1), 1.5))),
                                                      b["array"](X)),
    "axis out of range": lambda b: b["call"](b["map"]("sparsemax"), b["array"](X), axis=2),
    "axis not an int": lambda b: b["call"](b["map"]("sparsemax"), b["array"](X), axis=1.0),
    "0-d scores": lambda b: b["call"](b["map"]("sparsemax"), b["array"](np.float64(1.0))),
    "empty axis": lambda b: b["call"](b["map"]("sparsemax"), b["array"](np.zeros((2, 0)))),
    "reduction": lambda b: b["loss"](b["map"]("sparsemax"), b["array"](X), b["array"](np.array([0, 1])), reduction="avg"),
    "label shape": lambda b: b["loss"](b["map"]("sparsemax"), b["array"](X), b["array"](np.array([0, 1, 2]))),
    "label range": lambda b: b["loss"](b["map"]("sparsemax"), b["array"](X), b["array"](np.array([0, 3]))),
    "target sum": lambda b: b["loss"](b["map"]("sparsemax"), b["array"](X), b["array"](np.full((2, 3), 0.5))),
    "negative target": lambda b: b["loss"](b["map"]("sparsemax"), b["array"](X),
                                           b["array"](np.array([[1.5, -0.5, 0.0], [1.0, 0.0, 0.0]]))),
    "target shape": lambda b: b["loss"](b["map"]("sparsemax"), b["array"](X), b["array"](np.full((2, 2), 0.5))),
    "complex target": lambda b: b["loss"](b["map"]("sparsemax"), b["array"](X), b["array"](np.eye(2, 3) + 0j)),
    "loss of an unbound map": lambda b: b["loss"](b["map"]("entmax"), b["array"](X), b["array"](np.array([0, 1]))),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_errors_are_numpys(case, backend):
    want = _outcome(lambda: CASES[case](_numpy()))
    assert want[0] is not None, f"NumPy accepts the case {case!r}"
    b = BACKENDS[backend]()
    with b["context"]():
        assert _outcome(lambda: CASES[case](b)) == want


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_the_same_keywords_give_the_same_values(backend):
    """Every threshold name a map's module allows, parameters per row, and the loss's reductions: the values are
    NumPy's (float64)."""
    b = BACKENDS[backend]()
    with b["context"]():
        _same_values(b)


def _same_values(b):
    x = np.random.default_rng(0).standard_normal((4, 2, 7))
    for name, thresholds, params in (("softmax", ("auto", "closed", "root"), {}),
                                     ("sparsemax", ("auto", "sort", "root"), {}),
                                     ("entmax", ("auto", "root"), {"alpha": np.array([[[1.25]], [[1.5]], [[2.0]], [[3.0]]])})):
        for threshold in thresholds:
            for axis in (-1, 1):
                m = b["map"](name, threshold=threshold, **{k: b["array"](v) for k, v in params.items()})
                want = nm.get_map(name, **params)(x, axis=axis)
                got = np.asarray(b["call"](m, b["array"](x), axis=axis))
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-12, err_msg=f"{name} {threshold} axis {axis}")
        labels = np.array([[0, 6], [3, 2], [1, 1], [5, 0]])
        for reduction in ("none", "sum", "mean"):
            want = nm.get_map(name, **params).loss(x, labels, reduction=reduction)
            m = b["map"](name, **{k: b["array"](v) for k, v in params.items()})
            got = np.asarray(b["loss"](m, b["array"](x), b["array"](labels), reduction=reduction))
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=f"{name} loss {reduction}")


def test_learned_ranges_for_every_kind_of_domain():
    """numeric.front.learned_range: the range a parameter learned per head is kept in, on the four kinds of declared
    domain, and the logit that gives back the start (``lo + (hi - lo) sigmoid(logit) = start``)."""
    import math
    from types import SimpleNamespace

    from numeric import front

    def module(lo, hi):
        return SimpleNamespace(NAME="m", PARAMETERS=("c",), PARAMETER_DOMAINS={"c": (lo, hi)})

    cases = [((0.0, 1.0), 0.25, (0.0, 1.0)), ((1.0, math.inf), 1.3, (1.0, 2.0)), ((-math.inf, 2.0), 1.5, (1.0, 2.0)),
             ((-math.inf, math.inf), 5.0, (4.0, 6.0)), ((-math.inf, math.inf), None, (-1.0, 1.0)), ((0.0, 1.0), None, (0.0, 1.0))]
    for domain, start, want in cases:
        lo, hi, logit = front.learned_range(module(*domain), "c", start)
        assert (lo, hi) == want, (domain, start)
        value = lo + (hi - lo) / (1 + math.exp(-logit))
        assert math.isclose(value, (lo + hi) / 2 if start is None else start, rel_tol=1e-14), (domain, start)
    with pytest.raises(ValueError, match="inside its domain"):
        front.learned_range(module(0.0, 1.0), "c", 0.5, given=(-1.0, 1.0))
    with pytest.raises(ValueError, match="must be finite"):
        front.learned_range(module(0.0, math.inf), "c", 0.5, given=(0.0, math.inf))
    with pytest.raises(ValueError, match="a pair of numbers"):
        front.learned_range(module(0.0, 1.0), "c", 0.5, given="wide")
    with pytest.raises(ValueError, match="one number inside the range"):
        front.learned_range(module(0.0, 1.0), "c", np.array([0.5]))
