"""Attention with any score function (``scores=``) and maps with a parameter value per row.

Truths: the definitions (``map(f(q, k) + mask) v`` written out densely, a map
with one value per row equals the same map with that value alone, row by
row), central differences for every gradient (inputs, score-function
parameters, map parameters), and identical bits for every thread count.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numeric as nm
from numeric import summaries as sm

from .test_attention import _fd

A = importlib.import_module("numeric.attention")  # the package exports a function of that name
SEEDS = st.integers(0, 2**16)


def _dense(q, k, v, mapping, f, mask=None, causal=False):
    """``map(f(q, k) + mask) v`` from the definition, with a boolean mask and the causal triangle as -inf."""
    s = f(q, k)
    L, S = s.shape[-2:]
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    if causal:
        s = np.where(np.arange(S)[None, :] > np.arange(L)[:, None], -np.inf, s)
    p = nm.get_map(mapping)(s) if not isinstance(mapping, nm.Map) else mapping(s)
    return p @ v, p


def _score_functions(rng, eq, ek):
    return {
        "additive": sm.Additive(rng.standard_normal((5, eq)), rng.standard_normal((5, ek)), rng.standard_normal(5)),
        "bilinear": sm.Bilinear(rng.standard_normal((eq, ek)) / 2),
    }


@given(seed=SEEDS, kind=st.sampled_from(["additive", "bilinear"]), mapping=st.sampled_from(["softmax", "sparsemax", "entmax15"]),
       causal=st.booleans(), block=st.sampled_from([None, 2, 3]))
def test_attention_with_a_score_function_is_the_map_of_its_scores(seed, kind, mapping, causal, block):
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 6, 2))
    mask = rng.random((5, 6)) > 0.3
    f = _score_functions(rng, 3, 4)[kind]
    out, w = nm.attention(q, k, v, mapping=mapping, scores=f, mask=mask, causal=causal, return_weights=True)
    want_out, want_w = _dense(q, k, v, mapping, f, mask, causal)
    np.testing.assert_allclose(w, want_w, atol=1e-14)
    np.testing.assert_allclose(out, want_out, atol=1e-13)
    np.testing.assert_allclose(nm.attention(q, k, v, mapping=mapping, scores=f, mask=mask, causal=causal, block=block),
                               want_out, atol=1e-13)


def test_basis_function_summaries_with_entmax_are_one_call():
    """theta (data-dependent weights) against a Gaussian basis of the positions, as the keys."""
    rng = np.random.default_rng(3)
    theta, values = rng.standard_normal((4, 3)), rng.standard_normal((10, 2))
    psi = sm.gaussian_basis(10, centers=[0.0, 4.5, 9.0], width=2.0)
    out, w = nm.attention(theta, psi, values, mapping="entmax15", scores="dot", return_weights=True)
    np.testing.assert_allclose(w, nm.entmax15(sm.basis_scores(theta, psi)), atol=1e-15)
    np.testing.assert_allclose(out, w @ values, atol=1e-14)


def test_the_scaled_dot_product_fast_path_is_unchanged():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((3, 7, 4)) for _ in range(3))
    base = nm.attention(q, k, v, mapping="entmax15")
    np.testing.assert_array_equal(nm.attention(q, k, v, mapping="entmax15", scores="scaled_dot"), base)
    np.testing.assert_array_equal(nm.attention(q, k, v, mapping="entmax15", scores=sm.ScaledDot()), base)
    np.testing.assert_array_equal(nm.attention(q, k, v, mapping="entmax15", scores=sm.ScaledDot(0.3)),
                                  nm.attention(q, k, v, mapping="entmax15", scale=0.3))
    np.testing.assert_array_equal(nm.attention(q, k, v, mapping="entmax15", scores="dot"),
                                  nm.attention(q, k, v, mapping="entmax15", scale=1.0))
    with pytest.raises(ValueError, match="carries its own"):
        nm.attention(q, k, v, scores=sm.Bilinear(np.eye(4)), scale=0.5)
    with pytest.raises(ValueError, match="contradicts"):
        nm.attention(q, k, v, scores=sm.ScaledDot(0.3), scale=0.5)
    with pytest.raises(ValueError, match="scores must be one of"):
        nm.attention(q, k, v, scores="cosine")
    with pytest.raises(ValueError, match="bilinear weight"):
        nm.attention(q, k, v, scores=sm.Bilinear(np.eye(3)))


@settings(max_examples=6)
@given(seed=SEEDS, kind=st.sampled_from(["additive", "bilinear"]), mapping=st.sampled_from(["softmax", "entmax15"]),
       causal=st.booleans())
def test_score_function_gradients_by_finite_differences(seed, kind, mapping, causal):
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 2))
    dout = rng.standard_normal((2, 4, 2))
    f = _score_functions(rng, 3, 4)[kind]
    kw = dict(mapping=mapping, scores=f, causal=causal, block=2)
    dq, dk, dv, grads = nm.attention_backward(q, k, v, dout, param_grads=True, **kw)
    assert grads["map"] == {}

    def loss(q=q, k=k, v=v, f=f):
        return float((nm.attention(q, k, v, **{**kw, "scores": f}) * dout).sum())

    np.testing.assert_allclose(dq, _fd(lambda a: loss(q=a), q), atol=2e-7)
    np.testing.assert_allclose(dk, _fd(lambda a: loss(k=a), k), atol=2e-7)
    np.testing.assert_allclose(dv, _fd(lambda a: loss(v=a), v), atol=2e-7)
    assert set(grads["scores"]) == set(f.params)
    for name, value in f.params.items():
        want = _fd(lambda a, name=name: loss(f=f.replace(**{name: a})), value)
        np.testing.assert_allclose(grads["scores"][name], want, atol=2e-7)


def test_absent_keys_with_nonfinite_rows_leave_score_function_gradients_alone():
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((3, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 2))
    f = sm.Additive(rng.standard_normal((3, 2)), rng.standard_normal((3, 2)), rng.standard_normal(3))
    mask = np.array([True, True, False, True])
    dout = rng.standard_normal((3, 2))
    clean = nm.attention_backward(q, k, v, dout, scores=f, mapping="sparsemax", mask=mask, param_grads=True)
    k_bad, v_bad = k.copy(), v.copy()
    k_bad[2], v_bad[2] = np.nan, np.inf
    dirty = nm.attention_backward(q, k_bad, v_bad, dout, scores=f, mapping="sparsemax", mask=mask, param_grads=True)
    for a, b in zip(clean[:3], dirty[:3]):
        np.testing.assert_array_equal(np.delete(a, 2, axis=0) if a.shape[0] == 4 else a,
                                      np.delete(b, 2, axis=0) if b.shape[0] == 4 else b)
    for name in f.params:
        np.testing.assert_array_equal(clean[3]["scores"][name], dirty[3]["scores"][name])


# --------------------------------------------------------------- per-row map parameters

ALPHAS = st.lists(st.floats(1.05, 3.0), min_size=3, max_size=3)


@given(seed=SEEDS, alphas=ALPHAS, axis=st.sampled_from([-1, 0]))
def test_a_map_with_one_value_per_row_is_that_map_row_by_row(seed, alphas, axis):
    rng = np.random.default_rng(seed)
    # the rows run along axis 1 of (6, 3, 4) for axis = 0 and along axis 0 of (3, 4, 6) for axis = -1
    x = rng.standard_normal((3, 4, 6) if axis == -1 else (6, 3, 4)) * 2
    x[(1, 2, slice(0, 3)) if axis == -1 else (slice(0, 3), 1, 2)] = -np.inf
    alpha = np.array(alphas)[:, None, None] if axis == -1 else np.array(alphas)[None, :, None]
    m = nm.get_map("entmax", alpha=alpha)
    p, tau = m.forward(x, axis=axis)
    dx = rng.standard_normal(x.shape)
    jvp = m.jvp(p, dx, axis=axis)
    for i, a in enumerate(alphas):
        one = nm.get_map("entmax", alpha=a)
        index = (i,) if axis == -1 else (slice(None), i)
        want_p, want_tau = one.forward(x[index], axis=axis)
        np.testing.assert_array_equal(p[index], want_p)
        np.testing.assert_array_equal(tau[i], want_tau)
        np.testing.assert_array_equal(jvp[index], one.jvp(want_p, dx[index], axis=axis))


@given(seed=SEEDS, alphas=ALPHAS)
def test_loss_with_one_value_per_row_is_the_loss_row_by_row(seed, alphas):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 5, 6))
    labels = rng.integers(0, 6, (3, 5))
    m = nm.get_map("entmax", alpha=np.array(alphas)[:, None, None])
    value, grad = m.loss_and_grad(x, labels, reduction="none")
    for i, a in enumerate(alphas):
        want_value, want_grad = nm.get_map("entmax", alpha=a).loss_and_grad(x[i], labels[i], reduction="none")
        np.testing.assert_allclose(value[i], want_value, rtol=1e-15, atol=0)
        np.testing.assert_array_equal(grad[i], want_grad)


@settings(max_examples=8)
@given(seed=SEEDS, alphas=ALPHAS)
def test_per_row_parameter_gradient_by_finite_differences(seed, alphas):
    rng = np.random.default_rng(seed)
    x, dy = rng.standard_normal((3, 2, 7)), rng.standard_normal((3, 2, 7))
    alpha = np.array(alphas)[:, None, None]
    p = nm.entmax(x, alpha=alpha)
    g = nm.get_map("entmax", alpha=alpha).vjp_params(p, dy, reduce=True)["alpha"]
    assert g.shape == alpha.shape
    want = _fd(lambda a: float((nm.entmax(x, alpha=a) * dy).sum()), alpha, h=1e-7)
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-7)
    scalar = nm.get_map("entmax", alpha=alphas[0]).vjp_params(p[0], dy[0], reduce=True)["alpha"]
    assert isinstance(scalar, float)
    np.testing.assert_allclose(scalar, g[0, 0, 0], rtol=1e-12)


def test_per_row_parameters_are_checked():
    x = np.zeros((3, 5))
    with pytest.raises(ValueError, match="must have size 1 along axis"):
        nm.get_map("entmax", alpha=np.full(5, 1.5))(x)
    with pytest.raises(ValueError, match="does not broadcast"):
        nm.get_map("entmax", alpha=np.full((4, 1), 1.5))(x)
    with pytest.raises(ValueError, match="outside"):
        nm.get_map("entmax", alpha=np.array([[1.5], [0.0], [2.0]]))
    with pytest.raises(ValueError, match=r"alpha = 1.0 is outside \(1.0, inf\)"):  # the family's sparse case alone
        nm.get_map("entmax_sparse", alpha=np.array([[1.5], [1.0], [2.0]]))
    with pytest.raises(ValueError, match="outside"):
        nm.get_map("entmax", alpha=np.array([[np.nan]]))
    with pytest.raises(TypeError, match="real"):
        nm.get_map("entmax", alpha=np.array([["a"]]))
    assert "array (3, 1)" in repr(nm.get_map("entmax", alpha=np.full((3, 1), 1.5)))


@settings(max_examples=6)
@given(seed=SEEDS, alphas=ALPHAS, causal=st.booleans(), block=st.sampled_from([None, 2]))
def test_attention_with_one_alpha_per_head(seed, alphas, causal, block):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((2, 3, 5, 4)) for _ in range(3))
    dout = rng.standard_normal((2, 3, 5, 4))
    alpha = np.array(alphas)[:, None, None]
    m = nm.get_map("entmax", alpha=alpha)
    out = nm.attention(q, k, v, mapping=m, causal=causal, block=block)
    for h, a in enumerate(alphas):
        one = nm.get_map("entmax", alpha=a)
        np.testing.assert_array_equal(out[:, h], nm.attention(q[:, h], k[:, h], v[:, h], mapping=one, causal=causal,
                                                              block=block))
    dq, dk, dv, grads = nm.attention_backward(q, k, v, dout, mapping=m, causal=causal, block=block, param_grads=True)
    assert set(grads["map"]) == {"alpha"} and grads["scores"] == {}

    def loss(a):
        return float((nm.attention(q, k, v, mapping=nm.get_map("entmax", alpha=a), causal=causal) * dout).sum())

    np.testing.assert_allclose(grads["map"]["alpha"], _fd(loss, alpha, h=1e-7), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dq, _fd(lambda a: float((nm.attention(a, k, v, mapping=m, causal=causal) * dout).sum()), q),
                               atol=1e-6)
    # a scalar parameter gets one number: the sum of the per-head ones at equal alphas
    same = nm.attention_backward(q, k, v, dout, mapping=nm.get_map("entmax", alpha=alphas[0]), causal=causal,
                                 param_grads=True)[3]["map"]["alpha"]
    tiled = nm.attention_backward(q, k, v, dout, mapping=nm.get_map("entmax", alpha=np.full((3, 1, 1), alphas[0])),
                                  causal=causal, param_grads=True)[3]["map"]["alpha"]
    assert isinstance(same, float)
    np.testing.assert_allclose(same, tiled.sum(), rtol=1e-12)


def test_per_head_alpha_that_does_not_fit_the_scores_is_refused():
    q = np.zeros((2, 3, 4, 5))
    with pytest.raises(ValueError, match="does not broadcast"):
        nm.attention(q, q, q, mapping=nm.get_map("entmax", alpha=np.full((4, 1, 1), 1.5)))


def test_parameter_gradients_are_the_same_bits_for_every_thread_count(monkeypatch):
    monkeypatch.setattr(A, "PARALLEL_FROM", 1)
    monkeypatch.setattr(A, "TASK_WORK", 24 * 24)  # one task per head
    rng = np.random.default_rng(6)
    q, k, v, dout = (rng.standard_normal((2, 4, 24, 6)) for _ in range(4))
    m = nm.get_map("entmax", alpha=np.array([1.2, 1.5, 1.8, 2.4])[:, None, None])
    f = sm.Bilinear(rng.standard_normal((6, 6)) / 3)
    results = {}
    try:
        for threads in (1, 2):
            nm.set_num_threads(threads)
            dq, dk, dv, g = nm.attention_backward(q, k, v, dout, mapping=m, scores=f, causal=True, param_grads=True)
            results[threads] = [dq, dk, dv, g["map"]["alpha"], g["scores"]["w"]]
    finally:
        nm.set_num_threads(None)
    for a, b in zip(results[1], results[2]):
        np.testing.assert_array_equal(a, b)


def test_an_absent_key_whose_value_row_sums_inf_minus_inf_raises_no_warning():
    """dout . v_j = inf - inf for an absent key j: its column of dP is discarded, so no 'invalid value' warning.

    (The suite turns warnings into errors: this failed with a RuntimeWarning from the matrix product.)
    """
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((3, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 2))
    mask = np.array([True, True, False, True])
    v[2] = np.inf
    dout = np.array([[1.0, -1.0]] * 3)
    dq, dk, dv = nm.attention_backward(q, k, v, dout, mask=mask)
    keep = [0, 1, 3]
    want = nm.attention_backward(q, k[keep], v[keep], dout, mask=mask[keep])
    np.testing.assert_allclose(dq, want[0], atol=1e-15)
    np.testing.assert_allclose(dk[keep], want[1], atol=1e-15)
    np.testing.assert_allclose(dv[keep], want[2], atol=1e-15)
