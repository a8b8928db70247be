"""Constrained attention in NumPy: ``attention(..., upper=)`` and ``attention_backward(..., upper=)``.

Truths: the bounded NumPy map applied to the scores directly (itself checked against :mod:`derive.box`), and
central differences of the attention output for the gradients in the queries, the bounds and alpha per head.
"""

from __future__ import annotations

import numpy as np
import pytest

import numeric as nm
from numeric.attention import attention, attention_backward

from .test_box_maps import _fd  # (central differences; of a scalar here)


def _inputs(seed=0, L=6, S=6):
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((2, 2, L, 4)), rng.standard_normal((2, 2, S, 4)), rng.standard_normal((2, 2, S, 3))
    upper = rng.uniform(0.3, 0.8, (2, L, S))  # per head, query and key
    return q, k, v, upper


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "shannon_gini"])
@pytest.mark.parametrize("block", [None, 2])
def test_outputs_are_the_bounded_map_of_the_scores(name, block):
    q, k, v, upper = _inputs()
    mask = np.ones((6, 6), dtype=bool)
    mask[:, 5] = False
    out, w = attention(q, k, v, mapping=name, upper=upper, mask=mask, block=block, return_weights=True)
    s = np.where(mask, q @ np.swapaxes(k, -1, -2) / 2, -np.inf)
    p = nm.get_map(name)(s, upper=np.broadcast_to(upper, s.shape))
    np.testing.assert_allclose(w, p, rtol=0, atol=1e-15)
    np.testing.assert_allclose(out, p @ v, rtol=0, atol=1e-14)
    assert w.max() <= upper.max() and np.all(w <= upper + 1e-15)


def test_causal_rows_with_feasible_bounds():
    q, k, v, _ = _inputs(1)
    upper = np.full((6, 6), 0.5)
    upper[0, 0] = 1.0  # query 0 sees key 0 alone
    out = attention(q, k, v, mapping="entmax15", causal=True, upper=upper, block=2)
    s = q @ np.swapaxes(k, -1, -2) / 2
    s = np.where(np.tril(np.ones((6, 6), dtype=bool)), s, -np.inf)
    np.testing.assert_allclose(out, nm.entmax15(s, upper=upper) @ v, rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="infeasible bounds"):
        attention(q, k, v, mapping="entmax15", causal=True, upper=0.5)


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15"])
def test_backward_is_central_differences(name):
    q, k, v, upper = _inputs(2, L=4, S=5)
    dout = np.random.default_rng(3).standard_normal((2, 2, 4, 3))
    dq, dk, dv, grads = attention_backward(q, k, v, dout, mapping=name, upper=upper, block=2, param_grads=True)

    def loss(**kw):
        args = {"q": q, "k": k, "v": v, "upper": upper, **kw}
        return (attention(args["q"], args["k"], args["v"], mapping=name, upper=args["upper"]) * dout).sum()

    np.testing.assert_allclose(dq, _fd(lambda a: loss(q=a), q), rtol=0, atol=1e-8)
    np.testing.assert_allclose(dk, _fd(lambda a: loss(k=a), k), rtol=0, atol=1e-8)
    np.testing.assert_allclose(dv, _fd(lambda a: loss(v=a), v), rtol=0, atol=1e-8)
    assert grads["upper"].shape == upper.shape
    np.testing.assert_allclose(grads["upper"], _fd(lambda a: loss(upper=a), upper), rtol=0, atol=1e-8)
    assert np.abs(grads["upper"]).max() > 0.1  # some bounds bind


def test_alpha_per_head_across_one_with_bounds():
    q, k, v, upper = _inputs(4, L=4, S=5)
    dout = np.random.default_rng(5).standard_normal((2, 2, 4, 3))
    alpha = np.array([[[0.8]], [[1.4]]])  # per head

    def loss(a):
        return (attention(q, k, v, mapping=nm.get_map("entmax", alpha=a), upper=upper) * dout).sum()

    *_, grads = attention_backward(q, k, v, dout, mapping=nm.get_map("entmax", alpha=alpha), upper=upper,
                                   param_grads=True)
    np.testing.assert_allclose(grads["map"]["alpha"], _fd(loss, alpha), rtol=0, atol=1e-7)
