"""A sliding window (``window=w``: query ``i`` sees the keys ``i - w < j <= i``) in attention on every backend:
the outputs and the gradients equal those with the window given as a boolean mask, with blocks, other masks, a sink
and every map; the blocks of keys before a window are skipped.

Truths: the same backend's attention with the band as an explicit ``L x S`` mask (itself checked against the maps in
tests/attention); the NumPy output for the other backends; the plan's blocks for the keys a block computes.
"""

from __future__ import annotations

import numpy as np
import pytest

import numeric as nm
from numeric.plan import Plan
from tests.backends import backend_params

EVERY = backend_params()


def _band(L, S, w):
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    return (j <= i) & (i - j < w)


def _inputs(seed=0, L=7, S=7):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((2, 2, L, 4)), rng.standard_normal((2, 2, S, 4)), rng.standard_normal((2, 2, S, 3))


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15"])
@pytest.mark.parametrize("block", [None, 2])
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_a_window_is_its_band_mask(backend, name, block):
    q, k, v = _inputs()
    mask = np.random.default_rng(1).random((7, 7)) > 0.2
    for w, keywords in ((3, {}), (1, {}), (10, {}), (2, {"sink": np.array([0.3, -0.2])})):
        kw = {n: backend.array(a) for n, a in keywords.items()}
        arrays = [backend.array(a) for a in (q, k, v)]
        got = backend.numpy(backend.attention(*arrays, name, block=block, window=w, **kw))
        want = backend.numpy(backend.attention(*arrays, name, block=block, mask=backend.array(_band(7, 7, w)), **kw))
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)
        both = backend.numpy(backend.attention(*arrays, name, block=block, window=w, is_causal=True,
                                               mask=backend.array(mask), **kw))
        want = backend.numpy(backend.attention(*arrays, name, block=block, mask=backend.array(_band(7, 7, w) & mask),
                                               **kw))
        np.testing.assert_allclose(both, want, rtol=1e-13, atol=1e-14)
        if backend.name != "numpy":
            np.testing.assert_allclose(got, nm.attention(q, k, v, mapping=name, window=w, **keywords), rtol=1e-12,
                                       atol=1e-13)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_gradients_equal_the_band_masks(backend):
    q, k, v = _inputs(2, L=5, S=5)
    dout = np.random.default_rng(3).standard_normal((2, 2, 5, 3))
    band = _band(5, 5, 2)
    if backend.name == "numpy":
        got = nm.attention_backward(q, k, v, dout, mapping="entmax15", window=2, block=2)
        want = nm.attention_backward(q, k, v, dout, mapping="entmax15", mask=band, block=2)
    else:
        def f(mask, window):
            return lambda q, k, v: (backend.attention(q, k, v, "entmax15", mask=mask, window=window, block=2)
                                    * backend.array(dout)).sum()

        arrays = [backend.array(a) for a in (q, k, v)]
        got = backend.grad(f(None, 2), *arrays)
        want = backend.grad(f(backend.array(band), None), *arrays)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-13)


def test_the_plan_skips_the_key_blocks_before_a_window():
    """With blocks of 4 rows and a window of 3, each block computes at most 4 + 2 keys, not all before it."""
    plan = Plan(16, 16, 4, window=3)
    assert [(b.lo, b.hi) for b in plan] == [(0, 4), (2, 8), (6, 12), (10, 16)]


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_a_window_must_be_a_positive_integer(backend):
    arrays = [backend.array(a) for a in _inputs()]
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="window must be an integer >= 1"):
            backend.attention(*arrays, "softmax", window=bad)
