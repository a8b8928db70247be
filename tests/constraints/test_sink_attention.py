"""Attention with a sink per head (``attention(..., sink=)``) and with no sum (``total=None``) on every backend
(NumPy, torch, JAX): the outputs, the gradients in the queries, keys, values and the sinks, masks, causal rows,
shared key heads, blocks, heads that attend to nothing, errors.

Truths: the NumPy map with the sink (itself checked against the map over the concatenated scores and
:mod:`derive.sink` in test_sink.py) applied to the masked scores directly; central differences of NumPy's
attention for every gradient (NumPy's ``attention_backward``, torch's autograd and JAX's transforms alike).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

import numeric as nm
from tests.backends import backend_params
from tests.constraints.cases import central, qkv

INF = np.inf
EVERY = backend_params()
AUTODIFF = backend_params("autodiff")


def _inputs(seed=0, L=6, S=6):
    """``q, k, v`` in ``(batch, heads, length, dim)`` and a sink per head ``(2,)``."""
    q, k, v, rng = qkv(seed, L, S)
    return q, k, v, rng.standard_normal(2)


def _direct(q, k, v, name, causal=False, mask=None, **keywords):
    """The NumPy map of the masked scores with the set's ``keywords`` (a sink per head as ``(H,)``), times the
    values."""
    s = q @ np.swapaxes(k, -1, -2) * q.shape[-1] ** -0.5
    keep = np.ones(s.shape, bool) if mask is None else np.broadcast_to(mask, s.shape)
    if causal:
        keep = keep & np.tril(np.ones(s.shape[-2:], bool))
    if "sink" in keywords and np.ndim(keywords["sink"]) == 1:
        keywords["sink"] = np.broadcast_to(keywords["sink"].reshape(-1, 1, 1), s.shape[:-1] + (1,))
    return nm.get_map(name)(np.where(keep, s, -INF), **keywords) @ v


def _attend(backend, q, k, v, name, **keywords):
    mask = keywords.pop("mask", None)
    keywords = {n: backend.array(a) if isinstance(a, np.ndarray) else a for n, a in keywords.items()}
    out = backend.attention(backend.array(q), backend.array(k), backend.array(v), name,
                            mask=None if mask is None else backend.array(mask), **keywords)
    return backend.numpy(out)


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "shannon_gini"])
@pytest.mark.parametrize("block", [None, 2])
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_outputs_are_the_map_with_a_sink_of_the_scores(backend, name, block):
    q, k, v, sink = _inputs()
    mask = np.random.default_rng(1).random((6, 6)) > 0.3
    mask[2] = False  # (a row with no key: the sink takes every weight, the output is 0)
    for keywords in ({"sink": sink}, {"sink": 0.5}, {"total": None}):
        for causal in (False, True):
            got = _attend(backend, q, k, v, name, is_causal=causal, mask=mask, block=block, **keywords)
            np.testing.assert_allclose(got, _direct(q, k, v, name, causal, mask, **dict(keywords)), rtol=1e-12,
                                       atol=1e-13)
    # grouped key heads: one key head shared by both query heads
    got = _attend(backend, q, k[:, :1], v[:, :1], name, block=block, sink=sink)
    np.testing.assert_allclose(got, _direct(q, k[:, :1], v[:, :1], name, sink=sink), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_a_sparse_head_attends_to_nothing(backend):
    """A sink far above every score takes all of sparsemax's weight: the head's outputs are exactly 0, the other
    head's are not."""
    q, k, v, _ = _inputs(2)
    out = _attend(backend, q, k, v, "sparsemax", sink=np.array([50.0, -50.0]))
    assert np.all(out[:, 0] == 0) and np.all(np.abs(out[:, 1]).sum(-1) > 0)


@lru_cache(maxsize=None)
def _central(name: str, causal: bool):
    """Central differences of ``sum(dout * attention(q, k, v, sink=))`` (NumPy) in q, k, v and the sink."""
    q, k, v, sink = _inputs(3, L=4, S=5)
    dout = np.random.default_rng(4).standard_normal((2, 2, 4, 3))

    def f(q, k, v, sink):
        return float((nm.attention(q, k, v, mapping=name, causal=causal, sink=sink) * dout).sum())

    return (q, k, v, sink, dout), central(f, [q, k, v, sink])


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_gradients_are_central_differences(backend, name, causal):
    (q, k, v, sink, dout), want = _central(name, causal)
    if backend.name == "numpy":
        dq, dk, dv, own = nm.attention_backward(q, k, v, dout, mapping=name, causal=causal, sink=sink, block=2,
                                                param_grads=True)
        assert own["sink"].shape == sink.shape
        got = (dq, dk, dv, own["sink"])
    else:
        def f(q, k, v, b):
            out = backend.attention(q, k, v, name, is_causal=causal, sink=b)
            return (out * backend.array(dout)).sum()

        got = backend.grad(f, *(backend.array(a) for a in (q, k, v, sink)))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_gradient_check_in_the_queries_and_the_sinks(backend):
    q, k, v, sink = _inputs(5, L=3, S=4)
    kb, vb = backend.array(k), backend.array(v)
    backend.check_grads(lambda q, b: backend.attention(q, kb, vb, "entmax15", is_causal=True, sink=b),
                        backend.array(q), backend.array(sink), order=1)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_errors_name_the_argument(backend):
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match="sink of shape"):
        _attend(backend, q, k, v, "softmax", sink=np.zeros(3))  # (3 heads for 2)
    with pytest.raises(ValueError, match="sets do not combine"):
        _attend(backend, q, k, v, "softmax", sink=0.0, upper=0.5)
