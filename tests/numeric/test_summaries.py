"""Summary functions: values from their definitions, gradients by central differences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import numeric as nm
from numeric import summaries as sm

from .test_attention import _fd


@given(seed=st.integers(0, 2**16))
def test_dot_family(seed):
    rng = np.random.default_rng(seed)
    q, k, ds = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 3, 5))
    np.testing.assert_allclose(sm.dot_scores(q, k), np.einsum("bie,bje->bij", q, k), atol=1e-13)
    np.testing.assert_allclose(sm.scaled_dot_scores(q, k), np.einsum("bie,bje->bij", q, k) / 2, atol=1e-13)
    for fwd, bwd in ((sm.dot_scores, sm.dot_backward), (sm.scaled_dot_scores, sm.scaled_dot_backward)):
        dq, dk = bwd(q, k, ds)
        np.testing.assert_allclose(dq, _fd(lambda a: float((fwd(a, k) * ds).sum()), q), atol=1e-7)
        np.testing.assert_allclose(dk, _fd(lambda a: float((fwd(q, a) * ds).sum()), k), atol=1e-7)


@given(seed=st.integers(0, 2**16))
def test_bilinear(seed):
    rng = np.random.default_rng(seed)
    q, k, w = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 6)), rng.standard_normal((4, 6))
    ds = rng.standard_normal((2, 3, 5))
    np.testing.assert_allclose(sm.bilinear_scores(q, k, w), np.einsum("bia,ac,bjc->bij", q, w, k), atol=1e-12)
    grads = sm.bilinear_backward(q, k, w, ds)
    args = [q, k, w]
    for n, g in enumerate(grads):
        def f(a, n=n):
            new = list(args)
            new[n] = a
            return float((sm.bilinear_scores(*new) * ds).sum())
        np.testing.assert_allclose(g, _fd(f, args[n]), atol=1e-7)


@given(seed=st.integers(0, 2**16))
def test_additive(seed):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 2))
    wq, wk, u = rng.standard_normal((6, 4)), rng.standard_normal((6, 2)), rng.standard_normal(6)
    ds = rng.standard_normal((2, 3, 5))
    want = np.array([[[u @ np.tanh(wq @ q[b, i] + wk @ k[b, j]) for j in range(5)] for i in range(3)] for b in range(2)])
    np.testing.assert_allclose(sm.additive_scores(q, k, wq, wk, u), want, atol=1e-12)
    args = [q, k, wq, wk, u]
    for n, g in enumerate(sm.additive_backward(*args, ds)):
        def f(a, n=n):
            new = list(args)
            new[n] = a
            return float((sm.additive_scores(*new) * ds).sum())
        np.testing.assert_allclose(g, _fd(f, args[n]), atol=1e-7)


@given(seed=st.integers(0, 2**16))
def test_basis_summaries(seed):
    rng = np.random.default_rng(seed)
    S = 6
    theta = rng.standard_normal((3, S))
    # the canonical basis is plain discrete attention: the scores are the weights themselves
    np.testing.assert_allclose(sm.basis_scores(theta, sm.canonical_basis(S)), theta)
    decay = sm.exponential_decay_basis(S, [0.0, 0.5, 2.0])
    assert np.allclose(decay[-1], 1) and np.all(np.diff(decay[:, 1]) > 0)  # recent positions weigh more
    smooth = sm.gaussian_basis(S, [0.0, 2.5, 5.0], width=1.5)
    assert np.argmax(smooth[:, 1]) in (2, 3) and np.allclose(smooth[[0, 5], [0, 2]], 1)
    for psi in (decay, smooth):
        th = rng.standard_normal((2, 3, psi.shape[1]))
        ds = rng.standard_normal((2, 3, S))
        np.testing.assert_allclose(sm.basis_scores(th, psi), np.einsum("bij,tj->bit", th, psi), atol=1e-13)
        dth, dpsi = sm.basis_backward(th, psi, ds)
        np.testing.assert_allclose(dth, _fd(lambda a: float((sm.basis_scores(a, psi) * ds).sum()), th), atol=1e-7)
        np.testing.assert_allclose(dpsi, _fd(lambda a: float((sm.basis_scores(th, a) * ds).sum()), psi), atol=1e-7)
        # any map turns these summaries into attention weights on the simplex
        p = nm.sparsemax(sm.basis_scores(th, psi))
        np.testing.assert_allclose(p.sum(-1), 1, atol=1e-12)


def test_summary_errors():
    with pytest.raises(ValueError, match="equal feature sizes"):
        sm.dot_scores(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="bilinear weight"):
        sm.bilinear_scores(np.zeros((2, 3)), np.zeros((2, 4)), np.zeros((4, 3)))
    with pytest.raises(ValueError, match="additive weights"):
        sm.additive_scores(np.zeros((2, 3)), np.zeros((2, 4)), np.zeros((5, 3)), np.zeros((5, 3)), np.zeros(5))
    with pytest.raises(ValueError, match="does not fit"):
        sm.basis_scores(np.zeros((2, 3)), np.zeros((4, 2)))
    with pytest.raises(ValueError, match="rates"):
        sm.exponential_decay_basis(4, [-1.0])
    with pytest.raises(ValueError, match="width"):
        sm.gaussian_basis(4, [1.0], 0.0)
