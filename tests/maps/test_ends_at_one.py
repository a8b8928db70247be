"""Regularizers whose domain ends at ``p = 1`` (``omega'(1-) = +oo``): the binary entropy, whose map without a sum is
the built-in ``sigmoid``, and a typed one whose link has no closed form (``BINARY_SQUARE``), on the simplex and with
no sum; the names ``sigmoid`` and ``relu``.

Truths: the KKT conditions at high precision (``omega'(p_i) - s_i`` the same on every live score, ``sum p = 1``);
the logistic function and the logistic loss in closed form (mpmath); ``max(s, 0)`` and its loss; the mpmath
references (:mod:`derive.reference`, :mod:`derive.nosum`); central differences.
"""

from __future__ import annotations

import math
import subprocess
import sys

import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import numeric as nm
from derive import Regularizer, binary_entropy, derive_map, shannon
from derive import reference as ref
from derive.errors import DerivationError
from derive.nosum import solve_nosum
from derive.testing import check_map, generated_map
from tests.backends import backend_params

INF = math.inf
EVERY = backend_params()
AUTODIFF = backend_params("autodiff")
BINARY_SQUARE = "p*log(p) + (1 - p)*log(1 - p) + p**2/2"


@pytest.fixture(scope="module")
def binary():
    return derive_map(binary_entropy())


@pytest.fixture(scope="module")
def square(tmp_path_factory):
    """The typed map of :data:`BINARY_SQUARE`, generated and importable: ``(derivation, module)``."""
    reg = Regularizer.from_string(BINARY_SQUARE, name="binary_square")
    with generated_map(reg, "binary_square", tmp_path_factory.mktemp("ends")) as module:
        yield derive_map(reg), module


def _logistic(s) -> mpmath.mpf:
    return 1 / (1 + mpmath.exp(-mpmath.mpf(s)))


def _entropy(q) -> mpmath.mpf:
    """``q log q + (1 - q) log(1 - q)`` with ``0 log 0 = 0``."""
    q = mpmath.mpf(q)
    return sum((v * mpmath.log(v) for v in (q, 1 - q) if v > 0), mpmath.mpf(0))


# ------------------------------------------------------------------------------------------------ derive
def test_the_binary_entropy_ends_at_one_and_derives():
    reg = binary_entropy()
    assert reg.ends_at_one and reg.domain == "(0, 1)" and "(0, 1)" in reg.convexity
    assert not shannon().ends_at_one
    dv = derive_map(reg)
    assert dv.omega_one == 0 and not dv.sparse and dv.inversion.method == "closed"
    with mpmath.workdps(40):
        for zz in (-30, -1.5, 0, 0.7, 25):
            link = sp_eval(dv.link, zz)
            assert abs(link - _logistic(zz)) < mpmath.mpf(10) ** -35
            # omega*(z) = log(1 + e^z), the logistic loss's log-partition
            assert abs(sp_eval(dv.scalar_conjugate, zz) - mpmath.log1p(mpmath.exp(zz))) < mpmath.mpf(10) ** -30
    # the threshold's bracket starts at the smallest score: omega'(1) = +oo
    assert "s_min" in str(dv.threshold.bracket[0]) and "omega(1-)" in dv.pretty()


def sp_eval(expr, zz):
    (symbol,) = expr.free_symbols
    return mpmath.mpf(expr.subs(symbol, sp.Rational(zz)).evalf(50))


def test_a_domain_that_ends_elsewhere_or_at_an_infinite_value_is_refused():
    with pytest.raises(DerivationError, match=r"omega\(1-\) = oo is not finite"):
        Regularizer.from_string("p*log(p) - log(1 - p)")
    with pytest.raises(DerivationError, match="undefined at p = 1/2"):
        Regularizer.from_string("p*log(p) + (1/2 - p)*log(1/2 - p)")


@settings(deadline=None)
@given(st.lists(st.one_of(st.floats(-30, 30), st.just(-INF)), min_size=1, max_size=7).filter(
    lambda r: any(v > -INF for v in r)))
def test_the_reference_meets_the_kkt_conditions(binary, row):
    """``logit(p_i) - s_i`` is one value (``-tau``) on every live score and ``sum p = 1``; one live score: ``p = 1``."""
    with mpmath.workdps(60):
        p = ref.evaluate(binary, row, digits=40)
        live = [i for i, v in enumerate(row) if v > -INF]
        assert all(p[i] == 0 for i in range(len(row)) if i not in live)
        assert abs(mpmath.fsum(p) - 1) < mpmath.mpf(10) ** -38
        if len(live) == 1:
            assert p[live[0]] == 1
            return
        gaps = [mpmath.log(p[i]) - mpmath.log1p(-p[i]) - row[i] for i in live]
        assert max(gaps) - min(gaps) < mpmath.mpf(10) ** -30 * (1 + max(abs(g) for g in gaps))


def test_the_reference_loss_of_a_one_hot_target(binary):
    """``L = <p, s> - Omega(p) + Omega(y) - <s, y>`` with ``omega(1) = omega(0) = 0``."""
    s = [0.3, -1.2, 2.0, 0.0]
    with mpmath.workdps(60):
        p = ref.evaluate(binary, s, digits=40)
        want = mpmath.fsum(q * v - _entropy(q) for q, v in zip(p, s)) - s[2]
        assert abs(ref.loss(binary, s, [0, 0, 1, 0], digits=40) - want) < mpmath.mpf(10) ** -35


# -------------------------------------------------------------------------------------- the simplex
def _rows():
    """Rows with a masked score, one live score, scores far apart and one far below the rest."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 6)) * 3
    x[0, 2] = -INF
    x[1, 1:] = -INF
    x[2] = [0.0, -60.0, -90.0, 5.0, -1e3, 1.0]
    x[3] = [0.0, 5.0, -1e30, 2.0, 2.0, -0.5]
    return x


@pytest.mark.parametrize("which", ["sigmoid", "typed"])
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_the_simplex_map_matches_the_reference(backend, binary, square, which):
    dv, mapping = (binary, "sigmoid") if which == "sigmoid" else square
    x = _rows()
    p = backend.numpy(backend.call(backend.get_map(mapping), backend.array(x), -1, total=1))
    want = np.array([[float(v) for v in ref.evaluate(dv, row.tolist(), digits=30)] for row in x])
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-13)
    assert p[1, 0] == 1 and np.all(p[1, 1:] == 0)


@pytest.mark.parametrize("which", ["sigmoid", "typed"])
def test_the_simplex_map_in_float32(binary, square, which):
    """Within float32's rounding of the entries near 1 (a few ulps)."""
    dv, mapping = (binary, "sigmoid") if which == "sigmoid" else square
    x = _rows()
    p = nm.get_map(mapping)(x.astype(np.float32), total=1)
    want = np.array([[float(v) for v in ref.evaluate(dv, row.tolist(), digits=30)] for row in x])
    assert p.dtype == np.float32
    np.testing.assert_allclose(p, want, rtol=0, atol=16 * np.finfo(np.float32).eps)


@pytest.mark.parametrize("which", ["sigmoid", "typed"])
def test_the_simplex_jacobian_matches_the_reference(binary, square, which):
    dv, mapping = (binary, "sigmoid") if which == "sigmoid" else square
    m = nm.get_map(mapping)
    x = _rows()[[0, 1, 3]]
    dy = np.random.default_rng(8).standard_normal(x.shape)
    p = m(x, total=1)
    got = m.vjp(p, dy, total=1)
    for row, d, g in zip(x, dy, got):
        jac = np.array([[float(v) for v in r] for r in ref.jacobian(dv, row.tolist(), digits=30)])
        np.testing.assert_allclose(g, jac @ d, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_simplex_gradient_checks(backend, square):
    x = np.array([[0.9, 0.3, -0.2, 1.4], [0.1, 2.0, 0.6, -0.5]])
    for mapping in ("sigmoid", square[1]):
        m = backend.get_map(mapping)
        backend.check_grads(lambda x: backend.call(m, x, -1, total=1), backend.array(x))


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_the_simplex_loss_of_labels(backend, binary):
    x = _rows()[[0, 3]]
    labels = np.array([1, 3])
    m = backend.get_map("sigmoid")
    got = backend.numpy(backend.loss(m, backend.array(x), backend.array(labels, dtype=np.int64), reduction="none",
                                     total=1))
    want = [float(ref.loss(binary, row.tolist(), np.eye(6)[k].tolist(), digits=30)) for row, k in zip(x, labels)]
    np.testing.assert_allclose(got, want, rtol=1e-12)


# -------------------------------------------------------------------------------------------- no sum
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_sigmoid_is_the_logistic_function_and_loss(backend):
    """Far out too: no overflow at scores of +-800 (where exp overflows in float64)."""
    x = np.array([[-800.0, -40.0, -1.5, 0.0, 0.25, 3.0, 40.0, 800.0]])
    y = np.array([[0.0, 1.0, 0.3, 0.5, 1.0, 0.0, 1.0, 1.0]])
    m = backend.get_map("sigmoid")
    p = backend.numpy(backend.call(m, backend.array(x)))
    with mpmath.workdps(40):
        want = [float(_logistic(v)) for v in x[0]]
        loss = mpmath.fsum(mpmath.log1p(mpmath.exp(v)) - v * t + _entropy(t) for v, t in zip(x[0], y[0]))
    np.testing.assert_allclose(p[0], want, rtol=1e-15, atol=0)
    assert p[0, -1] == 1 and 0 < p[0, 1] < 1e-17
    edge = backend.numpy(backend.call(m, backend.array(np.array([[INF, -INF, np.nan, 0.5]]))))
    assert edge[0, 0] == 1 and edge[0, 1] == 0 and np.isnan(edge[0, 2])  # (+inf: the link's top, 1, not inf)
    value = backend.numpy(backend.loss(m, backend.array(x), backend.array(y), reduction="sum"))
    assert float(value) == pytest.approx(float(loss), rel=1e-13)
    if backend.name != "numpy":
        grad = backend.grad(lambda s: backend.loss(m, s, backend.array(y), reduction="sum"), backend.array(x))
        np.testing.assert_allclose(grad, p - y, rtol=0, atol=1e-15)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_relu_is_max_zero_and_its_loss(backend):
    x = np.array([[-2.0, -0.1, 0.0, 0.4, 3.0]])
    y = np.array([[0.0, 0.5, 1.0, 0.2, 2.0]])
    m = backend.get_map("relu")
    np.testing.assert_array_equal(backend.numpy(backend.call(m, backend.array(x))), np.maximum(x, 0))
    # sum max(s, 0)^2/2 + y^2/2 - s y
    want = float(np.sum(np.maximum(x, 0) ** 2 / 2 + y ** 2 / 2 - x * y))
    value = backend.numpy(backend.loss(m, backend.array(x), backend.array(y), reduction="sum"))
    assert float(value) == pytest.approx(want, rel=1e-14)


def test_the_typed_map_without_a_sum_matches_the_reference(square):
    dv, module = square
    x = _rows()
    p = nm.get_map(module)(x, total=None)
    want = np.array([[float(v) for v in solve_nosum(dv, row.tolist(), digits=30)] for row in x])
    np.testing.assert_allclose(p, want, rtol=1e-13, atol=1e-300)


# ------------------------------------------------------------------------------------------------ names
def test_the_names_bind_no_sum_and_a_call_may_leave_it():
    x = np.array([[0.5, -1.0, 2.0, -3.0]])
    relu, sigmoid = nm.get_map("relu"), nm.get_map("sigmoid")
    assert relu.name == "relu" and relu.module is nm.get_map("sparsemax").module and sigmoid.name == "sigmoid"
    np.testing.assert_array_equal(relu(x, total=1), nm.sparsemax(x))
    np.testing.assert_array_equal(relu(x, upper=1.0), np.clip(x, 0, 1))
    np.testing.assert_allclose(sigmoid(x, total=1).sum(), 1, rtol=1e-15)
    np.testing.assert_array_equal(nm.get_map(sigmoid)(x), sigmoid(x))  # (a map passed on keeps its keywords)
    with pytest.raises(ValueError, match=r"sigmoid binds total=None.*total=1 is the simplex"):
        sigmoid(x, sink=0.0)
    with pytest.raises(ValueError, match="did you mean 'relu'"):
        nm.get_map("reLu")


def test_regattn_derive_prints_the_map_without_a_sum():
    out = subprocess.run([sys.executable, "-m", "derive.cli", "derive", "sigmoid"], capture_output=True, text=True,
                         check=True).stdout
    assert "Without a sum (total=None)" in out and "omega*(s) = log(exp(s) + 1)" in out and "w(p) = p*(1 - p)" in out


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_sigmoid_attention_weighs_each_key_on_its_own(backend):
    """Causal sigmoid attention: ``out = sigmoid(q k^T / sqrt(d)) v`` over the keys up to each query; on the
    simplex (``total=1``) a query that sees one key gives it weight 1."""
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((1, 2, 5, 4)) for _ in range(3))
    scores = q @ np.swapaxes(k, -1, -2) / 2
    keep = np.tril(np.ones((5, 5), dtype=bool))
    weights = np.where(keep, 1 / (1 + np.exp(-scores)), 0)
    out = backend.numpy(backend.attention(backend.array(q), backend.array(k), backend.array(v), "sigmoid",
                                          is_causal=True))
    np.testing.assert_allclose(out, weights @ v, rtol=1e-12, atol=1e-13)
    simplex = backend.numpy(backend.attention(backend.array(q), backend.array(k), backend.array(v), "sigmoid",
                                              is_causal=True, total=1))
    rows = nm.get_map("sigmoid")(np.where(keep, scores, -INF), total=1)
    np.testing.assert_allclose(simplex, rows @ v, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(simplex[..., 0, :], v[..., 0, :], rtol=0, atol=1e-15)


def test_the_fused_kernels_decline_a_simplex_map_whose_domain_ends_at_one():
    pytest.importorskip("torch")
    from numeric.torch import fused

    assert "ends at p = 1" in fused.steep_at_clip(nm.get_map("sigmoid").module, {})


def test_check_map_passes_on_the_typed_map(square):
    result = check_map(square[1], backends=("numpy", "torch"), max_examples=12)
    assert result.examples >= 10 and all(0 <= line.worst <= 1 for line in result.lines)
