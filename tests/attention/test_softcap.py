"""Softcapped scores (``softcap=c``: each score ``c tanh(s / c)`` before the mask, Gemma 2) in attention on every
backend: the outputs equal the map of the capped scores computed directly, the gradients equal central differences,
with masks (boolean and additive), causal rows, a window, a sink and blocks; errors.

Truths: the NumPy map applied to ``c tanh(s / c)`` with the mask, written out here; central differences of NumPy's
attention for the gradients (NumPy's ``attention_backward``, torch's autograd and JAX's transforms alike).
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
CAP = 1.5


def _inputs(seed=0, L=6, S=6):
    return qkv(seed, L, S, scale=2.0)[:3]


def _direct(q, k, v, name, mask=None, causal=False, bias=None):
    s = q @ np.swapaxes(k, -1, -2) * q.shape[-1] ** -0.5
    s = CAP * np.tanh(s / CAP)
    if bias is not None:
        s = s + bias
    keep = np.ones(s.shape, bool) if mask is None else np.broadcast_to(mask, s.shape)
    if causal:
        keep = keep & np.tril(np.ones(s.shape[-2:], bool))
    return nm.get_map(name)(np.where(keep, s, -INF)) @ v


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15"])
@pytest.mark.parametrize("block", [None, 2])
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_outputs_are_the_map_of_the_capped_scores(backend, name, block):
    q, k, v = _inputs()
    rng = np.random.default_rng(1)
    mask = rng.random((6, 6)) > 0.3
    bias = np.where(rng.random((6, 6)) > 0.2, rng.standard_normal((6, 6)), -INF)
    arrays = [backend.array(a) for a in (q, k, v)]
    for causal in (False, True):
        got = backend.attention(*arrays, name, is_causal=causal, mask=backend.array(mask), block=block, softcap=CAP)
        np.testing.assert_allclose(backend.numpy(got), _direct(q, k, v, name, mask, causal), rtol=1e-12, atol=1e-13)
    got = backend.attention(*arrays, name, mask=backend.array(bias), block=block, softcap=CAP)  # (additive: after)
    np.testing.assert_allclose(backend.numpy(got), _direct(q, k, v, name, bias=bias), rtol=1e-12, atol=1e-13)
    # with a window and a sink: the capped scores' map with the band and the sink
    got = backend.attention(*arrays, name, window=2, block=block, softcap=CAP, sink=backend.array(np.array([0.2, -0.4])))
    want = nm.attention(q, k, v, mapping=name, mask=np.tril(np.ones((6, 6), bool)) & ~np.tril(np.ones((6, 6), bool), -2),
                        softcap=CAP, sink=np.array([0.2, -0.4]))
    np.testing.assert_allclose(backend.numpy(got), want, rtol=1e-12, atol=1e-13)


@lru_cache(maxsize=None)
def _central(name: str):
    q, k, v = _inputs(3, L=4, S=5)
    dout = np.random.default_rng(4).standard_normal((2, 2, 4, 3))
    mask = np.random.default_rng(5).random((4, 5)) > 0.25

    def f(q, k, v):
        return float((nm.attention(q, k, v, mapping=name, mask=mask, softcap=CAP) * dout).sum())

    return (q, k, v, dout, mask), central(f, [q, k, v])


@pytest.mark.parametrize("name", ["softmax", "entmax15"])
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_gradients_are_central_differences(backend, name):
    (q, k, v, dout, mask), want = _central(name)
    if backend.name == "numpy":
        got = nm.attention_backward(q, k, v, dout, mapping=name, mask=mask, softcap=CAP, block=2)
    else:
        def f(q, k, v):
            return (backend.attention(q, k, v, name, mask=backend.array(mask), softcap=CAP, block=2)
                    * backend.array(dout)).sum()

        got = backend.grad(f, *(backend.array(a) for a in (q, k, v)))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_a_softcap_must_be_a_positive_number(backend):
    arrays = [backend.array(a) for a in _inputs()]
    for bad in (0.0, -1.0, float("inf"), True, "1"):
        with pytest.raises(ValueError, match="softcap must be a finite number > 0"):
            backend.attention(*arrays, "softmax", softcap=bad)


@pytest.mark.parametrize("backend", backend_params(only=("torch",)), indirect=True)
def test_torch_blocked_backward_gradient_in_an_additive_mask(backend):
    """The blocked backward's chain rule: the mask is added after the cap (its gradient is the capped scores'),
    the queries' gradient goes through the cap; against autograd through the formula written out."""
    torch, rt = backend.torch, backend.rt
    q, k, v = (torch.tensor(a) for a in _inputs(6))
    bias = torch.tensor(np.random.default_rng(7).standard_normal((6, 6)))
    dout = torch.tensor(np.random.default_rng(8).standard_normal((2, 2, 6, 3)))

    def direct(q, bias):
        s = CAP * torch.tanh(q @ k.transpose(-2, -1) * 0.5 / CAP) + bias
        return (rt.entmax15(s, dim=-1) @ v * dout).sum()

    def blocked(q, bias):
        return (rt.attention(q, k, v, bias, mapping="entmax15", block=2, softcap=CAP) * dout).sum()

    want = backend.grad(direct, q, bias)
    got = backend.grad(blocked, q, bias)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-12)
