"""NumPy's own forms of whole steps (numeric.numpy.steps) against the shared rules they replace (numeric.core.rules).

The thresholds of a sort map agree bit for bit (the same operations on the same values, in another order of
rows); the closed maps' unshifted rows agree to rounding; rows whose maximum is not finite get the shared text's
values.  A map with a parameter of one value per row is solved here too (its rows gathered with their values).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import numeric as nm
from derive import Regularizer, derive_map, generate_module
from derive.codegen.files import load_module
from numeric.core import rules
from numeric.numpy import steps
from numeric.numpy.ops import ops_for

from .conftest import numpy_routines

values = st.one_of(
    st.floats(-30, 30),
    st.floats(-1e-6, 1e-6),
    st.integers(-3, 3).map(float),  # ties
    st.sampled_from([0.0, 0.25, -0.5]),  # ties at a threshold
)


@st.composite
def shifted_rows(draw, min_len=1, max_len=40, max_rows=12):
    """``(rows, n)`` float64 scores less their row maxima; masked scores (-inf) anywhere but at the maximum."""
    n = draw(st.integers(min_len, max_len))
    r = draw(st.integers(1, max_rows))
    x = np.array(draw(st.lists(st.lists(values, min_size=n, max_size=n), min_size=r, max_size=r)))
    masked = np.array(draw(st.lists(st.lists(st.booleans(), min_size=n, max_size=n), min_size=r, max_size=r)))
    masked[np.arange(r), x.argmax(-1)] = False
    x[masked] = -np.inf
    return x - x.max(-1, keepdims=True)


@pytest.fixture(scope="module")
def scaled_gini(tmp_path_factory):
    """``c p**2 / 2``: a sort map of degree 1 with a parameter (the link ``(z / c)_+``)."""
    path = tmp_path_factory.mktemp("steps") / "scaled_gini.py"
    reg = Regularizer.from_string("c*p**2/2", name="scaled_gini", parameters=("c in (0, oo)",))
    path.write_text(generate_module(derive_map(reg), "scaled_gini"))
    module = load_module(path)
    assert module.THRESHOLD == "sort" and module.THRESHOLD_DEGREE == 1
    return module


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@given(y=shifted_rows(), steps_=st.sampled_from([rules.SUPPORT_STEPS, 1, 0]))
def test_support_rounds_are_the_support_rule_bit_for_bit(dtype, y, steps_):
    """Michelot's rounds over one buffer give the shared support rule's thresholds exactly, also with a budget of
    rounds so small that rows are left to the sort rule."""
    y = y.astype(dtype)
    ops = ops_for(dtype)
    r = numpy_routines(importlib.import_module("numeric._generated.sparsemax"))
    with np.errstate(all="ignore"):
        want = rules.support_rule(ops, r, y, steps=steps_)
        got = steps.support_rounds(ops, r, y, steps=steps_)
    assert got.shape == want.shape == (y.shape[0], 1)
    np.testing.assert_array_equal(got, want)


@given(y=shifted_rows(), data=st.data())
def test_support_rounds_with_a_value_per_row(scaled_gini, y, data):
    """A parameter of one value per row, shape (rows, 1), follows its rows as they are gathered; with a
    value for all rows (shape ()) too."""
    c = np.array(data.draw(st.lists(st.floats(0.05, 20), min_size=y.shape[0], max_size=y.shape[0])))[:, None]
    ops = ops_for(np.float64)
    for value in (c, np.float64(c[0, 0])):
        r = numpy_routines(scaled_gini, params=(value,))
        with np.errstate(all="ignore"):
            want = rules.support_rule(ops, r, y)
            got = steps.support_rounds(ops, r, y)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@given(n=st.integers(9, 700), scale=st.sampled_from([1e-3, 0.1, 1.0, 30.0]), seed=st.integers(0, 2**16))
def test_largest_threshold_is_the_full_sort_bit_for_bit(name, n, scale, seed):
    """The sort rule on each row's largest scores (then 4 times as many where the support fills them) equals it on
    the whole sorted rows bit for bit: prefix sums of the sorted scores are sequential."""
    mod = importlib.import_module(f"numeric._generated.{name}")
    x = np.random.default_rng(seed).standard_normal((3, n)) * scale
    x[1, ::3] = -np.inf
    y = x - x.max(axis=-1, keepdims=True)
    ops = ops_for(np.float64)
    r = numpy_routines(mod)
    k = min(64, max(8, n // 4))
    with np.errstate(all="ignore"):
        full = rules.sort_rule(ops, r, y)
        partial = steps.largest_threshold(ops, r, y, min(k, n - 1))
    np.testing.assert_array_equal(full, partial)


@pytest.fixture(scope="module")
def plogp_cube(tmp_path_factory):
    """``p log p + p**3``: a typed map whose link has no closed form (the KKT solve)."""
    path = tmp_path_factory.mktemp("steps") / "plogp_cube.py"
    path.write_text(generate_module(derive_map(Regularizer.from_string("p*log(p) + p**3", name="plogp_cube")),
                                    "plogp_cube"))
    return load_module(path)


def _bad_rows(x):
    """``x`` with a NaN row, a fully masked row and a row holding +inf (where it has rows enough)."""
    x = x.copy()
    if x.shape[0] >= 4:
        x[0, -1] = np.nan
        x[1] = -np.inf
        x[2, 0] = np.inf
    return x


@pytest.mark.parametrize("name, params", [("softmax", ()), ("sparsemax", ()), ("entmax15", ()), ("entmax", (1.3,)),
                                          ("scaled_gini", (0.7,)), ("plogp_cube", ())])
@pytest.mark.parametrize("relative", [False, True])
@given(x=shifted_rows(), shift=st.sampled_from([0.0, 3.0, -40.0, 1e4]), bad=st.booleans())
def test_solve_is_the_shared_solve(scaled_gini, plogp_cube, name, params, relative, x, shift, bad):
    """NumPy's solve gives the shared solve's ``(p, tau)``: bit for bit for a sort map of degree 1, to rounding for
    a closed one (solved unshifted) and for degree 2 (NumPy sorts short rows where the shared text iterates); rows whose maximum is not finite (NaN, fully masked, +inf) get the shared text's values;
    ``out`` holds ``p``, also where it is ``x`` itself."""
    typed = {"scaled_gini": scaled_gini, "plogp_cube": plogp_cube}
    module = typed[name] if name in typed else importlib.import_module(f"numeric._generated.{name}")
    r = numpy_routines(module, params=tuple(np.float64(v) for v in params))
    x = x + shift
    if bad:
        x = _bad_rows(x)
    ops = ops_for(np.float64)
    with np.errstate(all="ignore"):
        p_want, t_want = rules.solve(ops, r, x, relative=relative)
        out = x.copy()
        p, t = steps.solve(ops, r, out, relative=relative, out=out)
    assert p is out
    if module.THRESHOLD == "sort" and module.THRESHOLD_DEGREE == 1:  # the same rule, Michelot's
        np.testing.assert_array_equal(p, p_want)
        np.testing.assert_array_equal(t, t_want)
    else:  # closed maps unshifted; degree 2 by the sort rule (the shared text: the support rule)
        tol = 8 * x.shape[-1] * np.finfo(np.float64).eps
        np.testing.assert_allclose(p, p_want, rtol=tol, atol=tol)
        np.testing.assert_allclose(t, t_want, rtol=tol, atol=tol * max(1.0, abs(shift)))


def test_the_backend_takes_the_steps(monkeypatch):
    """The NumPy backend's sparsemax runs NumPy's support rounds (no repeat_rows of the shared rule) and its
    softmax the unshifted closed rule; both give the shared text's values."""
    calls = []
    for name in ("support_rounds", "closed_unshifted"):
        original = getattr(steps, name)
        monkeypatch.setattr(steps, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    x = np.random.default_rng(0).standard_normal((64, 48))
    for m, name in ((nm.sparsemax, "support_rounds"), (nm.softmax, "closed_unshifted")):
        calls.clear()
        p = m(x)
        assert calls == [name]
        r = numpy_routines(importlib.import_module(f"numeric._generated.{m.__name__}"))
        np.testing.assert_allclose(p, rules.solve(ops_for(np.float64), r, x)[0], rtol=1e-14, atol=1e-300)
