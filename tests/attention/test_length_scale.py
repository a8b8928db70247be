"""Length-scaled scores (``length_scale=``: each query's scores times a factor of its position or of the number of
keys it sees; Scalable-Softmax's ``s log n``, Llama 4's ``1 + a log(1 + floor((i + 1) / floor))``) in attention on
every backend: the outputs equal the map of the scaled scores written out from the papers' formulas, with causal
rows, a window, a softcap, a sink and blocks; a decoding step equals its row of the whole sequence; the gradients in
the queries, keys, values and the coefficient equal central differences; errors.

Truths: the formulas written out here (the keys a row sees counted from its band mask, the positions from 0);
Scalable-Softmax's known weight ``n^s / (n^s + n - 1)`` of a key one above ``n - 1`` equal ones; central
differences of NumPy's attention for the gradients.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

import numeric as nm
from numeric.modifiers import LengthScale, llama4, ssmax
from tests.backends import backend_params
from tests.constraints.cases import central, qkv

INF = np.inf
EVERY = backend_params()
S_HEADS = np.array([0.7, 1.3])  # Scalable-Softmax's s, one per head


def _band(L, S, causal, window):
    keep = np.ones((L, S), bool)
    if causal:
        keep &= np.tril(keep)
    if window is not None:
        keep &= ~np.tril(np.ones((L, S), bool), -window)
    return keep


def _factor(kind, keep):
    """The factor per head and query row ``(2, L, 1)``, from the formulas."""
    L = keep.shape[0]
    if kind == "ssmax":
        n = keep.sum(axis=1)  # the keys each row sees
        return S_HEADS[:, None, None] * np.log(n)[None, :, None]
    i = np.arange(L)
    return np.broadcast_to(1 + 0.3 * np.log(1 + np.floor((i + 1) / 2))[None, :, None], (2, L, 1))


def _modifier(kind, backend):
    return ssmax(backend.array(S_HEADS)) if kind == "ssmax" else llama4(0.3, floor=2)


def _direct(q, k, v, name, kind, causal=False, window=None, cap=None, sink=None):
    keep = _band(q.shape[-2], k.shape[-2], causal, window)
    s = (q @ np.swapaxes(k, -1, -2)) * q.shape[-1] ** -0.5 * _factor(kind, keep)
    if cap is not None:
        s = cap * np.tanh(s / cap)
    keywords = {} if sink is None else {"sink": sink[:, None, None]}
    return nm.get_map(name)(np.where(keep, s, -INF), **keywords) @ v


@pytest.mark.parametrize("name", ["softmax", "entmax15", "sigmoid"])
@pytest.mark.parametrize("kind", ["ssmax", "llama4"])
@pytest.mark.parametrize("block", [None, 2])
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_outputs_are_the_map_of_the_scaled_scores(backend, name, kind, block):
    q, k, v = qkv(0, 6, 6, scale=1.5)[:3]
    arrays = [backend.array(a) for a in (q, k, v)]
    for causal, window, cap in ((False, None, None), (True, None, None), (True, 3, None), (True, None, 2.0)):
        got = backend.attention(*arrays, name, is_causal=causal, window=window, block=block, softcap=cap,
                                length_scale=_modifier(kind, backend))
        want = _direct(q, k, v, name, kind, causal, window, cap)
        np.testing.assert_allclose(backend.numpy(got), want, rtol=1e-12, atol=1e-13)
    if name != "sigmoid":  # (a sink per head, on the simplex)
        sink = np.array([0.4, -0.3])
        got = backend.attention(*arrays, name, is_causal=True, block=block, length_scale=_modifier(kind, backend),
                                sink=backend.array(sink))
        np.testing.assert_allclose(backend.numpy(got), _direct(q, k, v, name, kind, True, sink=sink), rtol=1e-12,
                                   atol=1e-13)


def test_ssmax_keeps_a_key_above_equal_ones_at_n_to_the_s():
    """Scalable-Softmax's point: with one key one above ``n - 1`` equal ones, its weight is ``n^s / (n^s + n - 1)``
    (softmax's ``e / (e + n - 1)`` fades as ``n`` grows); each causal row ``i`` sees ``n = i + 1`` keys."""
    L, s = 40, 1.0
    q = np.ones((1, L, 1))
    k = np.zeros((1, L, 1))
    k[0, 0, 0] = 1.0  # key 0 scores 1, the others 0, for every query
    _, w = nm.attention(q, k, np.zeros((1, L, 1)), causal=True, scale=1.0, length_scale=ssmax(s), return_weights=True)
    n = np.arange(1, L + 1)
    np.testing.assert_allclose(w[0, :, 0], n ** s / (n ** s + n - 1), rtol=1e-13)
    assert w[0, -1, 0] > 0.49  # (softmax alone: e / (e + 39) < 0.07)


@pytest.mark.parametrize("kind", ["ssmax", "llama4"])
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_a_decoding_step_is_its_row_of_the_whole_sequence(backend, kind):
    """One query against the cache of ``S`` keys (not causal: it sees them all, ``n = S``; Llama 4's position from
    ``start = S - 1``) gives the last row of causal attention over the whole sequence."""
    q, k, v = qkv(1, 7, 7, scale=1.5)[:3]
    arrays = [backend.array(a) for a in (q, k, v)]
    whole = backend.attention(*arrays, "entmax15", is_causal=True, length_scale=_modifier(kind, backend))
    step = ssmax(backend.array(S_HEADS)) if kind == "ssmax" else llama4(0.3, floor=2, start=6)
    last = backend.attention(backend.array(q[..., 6:, :]), *arrays[1:], "entmax15", length_scale=step)
    np.testing.assert_allclose(backend.numpy(last), backend.numpy(whole)[..., 6:, :], rtol=1e-12, atol=1e-13)


@lru_cache(maxsize=None)
def _central(kind: str):
    q, k, v = qkv(3, 4, 5)[:3]
    dout = np.random.default_rng(4).standard_normal((2, 2, 4, 3))
    coef = S_HEADS if kind == "ssmax" else np.array([0.3, 0.8])

    def f(q, k, v, coef):
        ls = ssmax(coef) if kind == "ssmax" else llama4(coef, floor=1)
        return float((nm.attention(q, k, v, mapping="entmax15", causal=True, softcap=1.5, length_scale=ls)
                      * dout).sum())

    return (q, k, v, coef, dout), central(f, [q, k, v, coef])


@pytest.mark.parametrize("kind", ["ssmax", "llama4"])
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_gradients_in_the_coefficient_are_central_differences(backend, kind):
    (q, k, v, coef, dout), want = _central(kind)

    def scale(c):
        return ssmax(c) if kind == "ssmax" else llama4(c, floor=1)

    if backend.name == "numpy":
        *got, grads = nm.attention_backward(q, k, v, dout, mapping="entmax15", causal=True, softcap=1.5, block=2,
                                            length_scale=scale(coef), param_grads=True)
        got.append(grads["length_scale"])
    else:
        def f(q, k, v, c):
            return (backend.attention(q, k, v, "entmax15", is_causal=True, softcap=1.5, block=2,
                                      length_scale=scale(c)) * backend.array(dout)).sum()

        got = backend.grad(f, *(backend.array(a) for a in (q, k, v, coef)))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_errors(backend):
    arrays = [backend.array(a) for a in qkv(0, 4, 4)[:3]]
    with pytest.raises(TypeError, match="length_scale must be made by numeric.modifiers.ssmax"):
        backend.attention(*arrays, "softmax", length_scale=0.5)
    with pytest.raises(ValueError, match="size 1 along the keys"):
        backend.attention(*arrays, "softmax", length_scale=ssmax(backend.array(np.ones((2, 1, 4)))))
    with pytest.raises(ValueError, match="must broadcast to the scores"):
        backend.attention(*arrays, "softmax", length_scale=ssmax(backend.array(np.ones(3))))
    for bad in (lambda: ssmax(float("nan")), lambda: ssmax(True), lambda: llama4(0.1, floor=0),
                lambda: llama4(0.1, start=-1)):
        with pytest.raises(ValueError):
            bad()


def test_a_score_function_is_refused_and_the_factors_follow_the_plan():
    q, k, v = qkv(0, 4, 4)[:3]
    with pytest.raises(ValueError, match="length_scale scales the queries of the dot product"):
        nm.attention(q, k, v, scores=nm.summaries.Additive(np.ones((3, 4)), np.ones((3, 4)), np.ones(3)),
                     length_scale=ssmax(1.0))
    from numeric.plan import Plan

    plan = Plan(6, 4, causal=True, offset=1, window=3)
    np.testing.assert_array_equal(plan.seen(), [plan.keys(i)[1] - plan.keys(i)[0] for i in range(6)])
    np.testing.assert_allclose(ssmax(2.0).logs(plan)[:, 0], np.log([2, 3, 3, 2, 1, 1]))  # (a row that sees none: x = 1)
    np.testing.assert_allclose(llama4(0.1, floor=3, start=4).logs(plan)[:, 0],
                               np.log1p(np.floor((np.arange(6) + 1 + 4 + 1) / 3)))
    assert repr(ssmax(0.5)) == "ssmax(0.5)" and isinstance(llama4(), LengthScale)


@pytest.mark.parametrize("backend", backend_params(only=("numpy", "torch")), indirect=True)
def test_a_typed_map_with_a_length_scale(backend):
    """A typed map whose link has no closed form (``gini_log1p``, the KKT rule) under Scalable-Softmax's scale, causal
    and windowed: the map of the scaled scores written out."""
    q, k, v = qkv(2, 6, 6, scale=1.5)[:3]
    arrays = [backend.array(a) for a in (q, k, v)]
    for window in (None, 3):
        got = backend.attention(*arrays, "gini_log1p", is_causal=True, window=window,
                                length_scale=_modifier("ssmax", backend))
        np.testing.assert_allclose(backend.numpy(got), _direct(q, k, v, "gini_log1p", "ssmax", True, window),
                                   rtol=1e-12, atol=1e-13)
