"""Attention of every framework (``numeric.torch.attention``, ``numeric.jax.attention``) against NumPy's
(``numeric.attention``, itself held to central differences, causality and the textbook formula in
tests/numeric/test_attention.py), each case written once: every map, boolean masks with a fully masked row,
additive masks, causal rows with more queries than keys, blocks of query rows, one alpha per head, and key and value
heads shared by the query heads (JAX's grouped heads; NumPy and torch broadcast them).

What each framework promises of its own (SDPA's and ``jax.nn.dot_product_attention``'s numbers, dropout, memory,
``torch.compile``, ``jit``/``vmap``): tests/torch, tests/jax.  Attention with bounds: tests/constraints; fully
masked and NaN rows: tests/edges.
"""

from __future__ import annotations

import numpy as np
import pytest

import numeric as nm
from tests.backends import backend_params
from tests.numeric.conftest import FRAMEWORK_IDS as IDS
from tests.numeric.conftest import FRAMEWORK_MAPS as MAPS

INF = np.inf
AUTODIFF = backend_params("autodiff")


def _attend(backend, q, k, v, mapping, **keywords):
    """``backend.attention`` with NumPy arrays in and out (a mask as an array of the backend)."""
    if keywords.get("mask") is not None:
        keywords["mask"] = backend.array(keywords["mask"])
    return backend.numpy(backend.attention(*(backend.array(a) for a in (q, k, v)), mapping, **keywords))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_every_map_equals_numpy_attention(backend, name, params, causal):
    """Four query heads sharing one key and value head, a boolean mask per head with a fully masked row (its
    output 0), a scale of 0.7, in one block and in blocks of 4 query rows (the last padded)."""
    rng = np.random.default_rng(5)
    q, k, v = rng.normal(size=(2, 4, 6, 3)), rng.normal(size=(2, 1, 4, 3)), rng.normal(size=(2, 1, 4, 2))
    mask = np.random.default_rng(6).random((2, 4, 6, 4)) > 0.35
    mask[1, 2, 3] = False  # a fully masked row
    want = nm.attention(q, k, v, mapping=nm.get_map(name, **params), mask=mask, causal=causal, scale=0.7)
    m = backend.get_map(name, **params)
    for block in (None, 4):
        got = _attend(backend, q, k, v, m, mask=mask, is_causal=causal, scale=0.7, block=block)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        assert np.all(got[1, 2, 3] == 0)


@pytest.mark.parametrize("block", [None, 2])
@pytest.mark.parametrize("case", ["bool", "float", "causal-long-L"])
@pytest.mark.parametrize("name", ["entmax15", "sparsemax", "entmax"])
@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_masks_causal_rows_and_alpha_per_head(backend, name, case, block):
    """A boolean mask per head with a fully masked row, an additive mask (0 or -inf, and finite values) shared by
    the heads, causal rows with more queries than keys; alpha-entmax with one alpha per head."""
    L, S = (7, 4) if case == "causal-long-L" else (5, 6)
    rng = np.random.default_rng(10)
    q, k, v = rng.normal(size=(2, 3, L, 4)), rng.normal(size=(2, 3, S, 4)), rng.normal(size=(2, 3, S, 3))
    keywords = {}
    if case == "bool":
        mask = np.random.default_rng(11).random((3, L, S)) > 0.3
        mask[:, 1] = False
        keywords["mask"] = mask
    elif case == "float":
        keywords["mask"] = np.where(np.random.default_rng(13).random((L, S)) > 0.7, -INF,
                                    np.random.default_rng(12).normal(size=(L, S)))
    else:
        keywords["is_causal"] = True
    params = {"alpha": np.array([1.25, 1.5, 1.75]).reshape(3, 1, 1)} if name == "entmax" else {}
    want = nm.attention(q, k, v, mapping=nm.get_map(name, **params), mask=keywords.get("mask"),
                        causal=keywords.get("is_causal", False))
    m = backend.get_map(name, **{k: backend.array(a) for k, a in params.items()})
    np.testing.assert_allclose(_attend(backend, q, k, v, m, block=block, **keywords), want, rtol=0, atol=1e-12)
