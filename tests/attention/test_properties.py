"""Properties of attention on every backend (NumPy, torch, JAX), each written once and drawn by hypothesis: a masked
key is an absent key; permuting the keys with their values changes nothing; the weights lie on the simplex (0 on
the keys a query may not see, a row with no key all 0); a causal query's output ignores the later keys.

NumPy and torch draw the shapes and blocks too; JAX, whose every new shape is a new XLA program, draws the seeds on
fixed shapes (``FIXED``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.backends import backend_params

EVERY = backend_params()
MAPS = ["softmax", "sparsemax", "entmax15", "entmax"]
#: JAX's shapes (queries, keys) and block
FIXED = (3, 5, None)
#: the backend fixture lives as long as the test, across its examples (it holds no state between them)
_fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


def _draw(backend, data, min_keys=1):
    """``(seed, L, S, block)``: drawn, or JAX's fixed shapes with a drawn seed."""
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    if backend.name == "jax":
        return (seed, *FIXED)
    return (seed, data.draw(st.integers(1, 6), label="L"), data.draw(st.integers(min_keys, 7), label="S"),
            data.draw(st.sampled_from([None, 1, 2, 3]), label="block"))


def _map(backend, name):
    """The map ``name`` on ``backend``; alpha-entmax with one alpha per head (of 3) from 1.2 to 1.9."""
    if name == "entmax":
        return backend.get_map("entmax", alpha=backend.array(np.linspace(1.2, 1.9, 3).reshape(3, 1, 1)))
    return backend.get_map(name)


def _qkv(seed, L, S, E=3, Ev=2):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((2, 3, L, E)), rng.standard_normal((2, 3, S, E)), rng.standard_normal((2, 3, S, Ev))


def _attend(backend, q, k, v, m, mask=None, **keywords):
    out = backend.attention(*(backend.array(a) for a in (q, k, v)), m,
                            mask=None if mask is None else backend.array(mask), **keywords)
    return backend.numpy(out)


@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
@_fixture_ok
@given(data=st.data())
def test_a_masked_key_is_an_absent_key(backend, name, data):
    seed, L, S, block = _draw(backend, data, min_keys=2)
    q, k, v = _qkv(seed, L, S)
    j = seed % S
    mask = np.random.default_rng(seed).random((3, L, S)) > 0.2
    mask[..., j] = False
    keep = [i for i in range(S) if i != j]
    m = _map(backend, name)
    got = _attend(backend, q, k, v, m, mask, block=block)
    want = _attend(backend, q, k[..., keep, :], v[..., keep, :], m, mask[..., keep], block=block)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
@_fixture_ok
@given(data=st.data(), masked=st.booleans())
def test_permuting_keys_and_values_changes_nothing(backend, name, data, masked):
    seed, L, S, block = _draw(backend, data)
    q, k, v = _qkv(seed, L, S)
    perm = np.random.default_rng(seed).permutation(S)
    mask = np.random.default_rng(seed + 1).random((L, S)) > 0.3 if masked else None
    m = _map(backend, name)
    got = _attend(backend, q, k[..., perm, :], v[..., perm, :], m, None if mask is None else mask[:, perm], block=block)
    np.testing.assert_allclose(got, _attend(backend, q, k, v, m, mask, block=block), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
@_fixture_ok
@given(data=st.data(), causal=st.booleans())
def test_weights_on_the_simplex(backend, name, data, causal):
    """Values the identity: the output rows are the weights; >= 0, 0 where a key may not be seen, summing to 1 (0
    for a row with no key)."""
    seed, L, S, block = _draw(backend, data)
    q, k, _ = _qkv(seed, L, S)
    mask = np.random.default_rng(seed).random((L, S)) > 0.4
    eye = np.broadcast_to(np.eye(S), (2, 3, S, S))
    w = _attend(backend, q, k, eye, _map(backend, name), mask, is_causal=causal, block=block)
    allowed = mask & np.tril(np.ones((L, S), bool)) if causal else mask
    assert np.all(w >= 0) and np.all(w[..., ~allowed] == 0)
    sums = w.sum(-1)
    live = np.broadcast_to(allowed.any(-1), sums.shape)
    np.testing.assert_allclose(sums[live], 1, rtol=0, atol=1e-13)
    assert np.all(sums[~live] == 0)


@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
@_fixture_ok
@given(data=st.data())
def test_causal_outputs_ignore_the_later_keys(backend, name, data):
    """Self-attention of a sequence and of the same one with every position after ``t`` redrawn: equal up to
    ``t``, bit for bit."""
    seed, L, _, block = _draw(backend, data)
    t = data.draw(st.integers(0, L - 1), label="t")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 3, L, 4))
    y = x.copy()
    y[..., t + 1:, :] = rng.standard_normal(y[..., t + 1:, :].shape)
    m = _map(backend, name)
    a = _attend(backend, x, x, x, m, is_causal=True, block=block)
    b = _attend(backend, y, y, y, m, is_causal=True, block=block)
    np.testing.assert_array_equal(a[..., : t + 1, :], b[..., : t + 1, :])
