"""Dispatch on derived facts, not on probes: the closed threshold's exp fast path (``TERM_IS_EXP``) and
continuous maps through the backend seam."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import numeric as nm
import numeric.backends as B
import numeric.continuous as nc
from derive import Regularizer, derive_map, generate_module
from derive.codegen.files import load_module
from numeric.core import rules
from numeric.numpy.backend import NumpyBackend
from numeric.numpy import steps
from numeric.numpy.ops import ops_for

from .conftest import USER, numpy_routines

BUILTINS = ["softmax", "sparsemax", "entmax15", "entmax"]
#: closed thresholds beside softmax: B(s) = exp(s / 2), exp(2 s) (scaled exps) and exp(s) (a link exp(z))
CLOSED = {"hot": "2*p*log(p)", "cool": "p*log(p)/2", "plain": "p*log(p) - p"}


@pytest.fixture(scope="module")
def closed_maps(tmp_path_factory):
    folder = tmp_path_factory.mktemp("closed")
    mods = {}
    for name, expr in CLOSED.items():
        path = folder / f"{name}.py"
        path.write_text(generate_module(derive_map(Regularizer.from_string(expr, name=name)), name))
        mods[name] = load_module(path)
        assert mods[name].THRESHOLD == "closed" and mods[name].LINK_FORM == "exp"
    return mods


def _modules(closed_maps):
    mods = {name: importlib.import_module(f"numeric._generated.{name}") for name in BUILTINS}
    mods.update({name: importlib.import_module(name) for name in USER})  # conftest's user maps
    mods.update(closed_maps)
    return mods


def test_term_is_exp_is_the_derived_fact(closed_maps):
    mods = _modules(closed_maps)
    assert {name for name, mod in mods.items() if mod.TERM_IS_EXP} == {"softmax", "plain"}
    x = np.concatenate([np.linspace(-800, 800, 4001), [-np.inf, np.inf, 0.0, -0.0, 1e-300]])
    for name, mod in mods.items():
        if mod.TERM_IS_EXP:  # then term is exp itself, bit for bit, in both dtypes
            for dtype in (np.float64, np.float32):
                with np.errstate(over="ignore", under="ignore"):
                    np.testing.assert_array_equal(mod.term(x.astype(dtype)), np.exp(x.astype(dtype)), err_msg=name)
        elif mod.THRESHOLD == "closed":
            probe = np.array([1.0, -2.5, 0.5])
            assert not np.array_equal(mod.term(probe), np.exp(probe)), name


def _counting_term(monkeypatch, mod):
    calls = []
    term = mod.term

    def counted(*args):
        calls.append(args[0].shape)
        return term(*args)

    monkeypatch.setattr(mod, "term", counted)
    return calls


def _counting_shifted(monkeypatch):
    """The rows each shifted solve of numeric.core receives (those a closed map cannot take unshifted)."""
    rows = []
    shifted = rules._solve_shifted

    def counted(ops, r, x, *args, **kwargs):
        rows.append(x.shape[0])
        return shifted(ops, r, x, *args, **kwargs)

    monkeypatch.setattr(rules, "_solve_shifted", counted)
    return rows


def test_softmax_takes_the_exp_fast_path(monkeypatch):
    """Every row qualifies for the unshifted solve (a score of 1 makes the sum at least e), and with
    ``out`` apart from ``x`` softmax writes exp into it: its ``term`` is never called."""
    mod = importlib.import_module("numeric._generated.softmax")
    calls = _counting_term(monkeypatch, mod)
    x = np.random.default_rng(0).standard_normal((40, 16))
    x[:, 0] = 1.0
    p = nm.softmax(x)
    assert calls == []
    e = np.exp(x)
    np.testing.assert_allclose(p, e / e.sum(-1, keepdims=True), rtol=1e-15, atol=0)
    shifted = _counting_shifted(monkeypatch)
    out = np.empty_like(x)
    got, _ = steps.closed_unshifted(ops_for(x.dtype), numpy_routines(mod), x, out)
    assert shifted == [] and calls == []  # every row solved unshifted, by exp
    assert got is out
    np.testing.assert_array_equal(out, p)


@pytest.mark.parametrize("name, rate", [("hot", 0.5), ("cool", 2.0)])
def test_a_scaled_exp_term_takes_the_general_path(monkeypatch, closed_maps, name, rate):
    """``B(s) = exp(rate s)``: the solver calls ``term``, and the probabilities are those of
    ``rate * x`` (exp straight into the output would give softmax(x) instead)."""
    mod = closed_maps[name]
    calls = _counting_term(monkeypatch, mod)
    x = np.random.default_rng(1).standard_normal((40, 16))
    x[:, 0] = 1.0
    p = nm.get_map(mod)(x)
    assert calls
    e = np.exp(rate * x)
    np.testing.assert_allclose(p, e / e.sum(-1, keepdims=True), rtol=1e-14, atol=0)
    assert not np.allclose(p, nm.softmax(x))
    calls.clear()
    shifted = _counting_shifted(monkeypatch)
    out = np.empty_like(x)
    got, _ = steps.closed_unshifted(ops_for(x.dtype), numpy_routines(mod), x, out)
    assert shifted == [] and calls == [x.shape]
    assert got is out
    np.testing.assert_array_equal(out, p)


class _Tagged(np.ndarray):
    """A NumPy array of a type of its own, owned by the recording backend below."""


class _Recording(NumpyBackend):
    name = "recording"

    def __init__(self):
        self.calls = []

    def owns(self, array):
        return isinstance(array, _Tagged)

    def rbf_expectation(self, cmap, mu, sigma2, basis, grad):
        self.calls.append((cmap.name, mu.shape, grad))
        return super().rbf_expectation(cmap, mu, sigma2, basis, grad)


def test_continuous_expectations_go_through_the_backend(monkeypatch):
    """ContinuousMap asks the backend of its arrays (numeric.backends.backend_for) for the expectations."""
    monkeypatch.setattr(B, "_registry", list(B.backends()))  # both restored after the test
    monkeypatch.setattr(B, "_defaults_only", B._defaults_only)
    backend = B.register_backend(_Recording())
    cmap = nc.get_continuous_map("sparsemax")
    basis = nc.GaussianBasis.uniform(8)
    mu, var = np.array([0.3, 0.6]), np.array([1e-6, 0.05])  # the first through quadrature
    want = cmap.expectation_grad(mu, var, basis)
    assert backend.calls == []
    got = cmap.expectation_grad(mu.view(_Tagged), var.view(_Tagged), basis)
    assert backend.calls == [("continuous_sparsemax", (2,), True)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    with pytest.raises(NotImplementedError, match="no continuous maps"):
        B.Backend.rbf_expectation(backend, cmap, mu, var, basis, False)
