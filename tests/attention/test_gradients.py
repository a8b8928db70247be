"""Attention's derivatives against finite differences on every framework (torch's gradcheck and gradgradcheck,
``jax.test_util.check_grads``), each case written once: in the queries, keys and values, in an additive mask, in
alpha per head; with boolean and additive masks, causal rows, more keys than queries and more queries than keys,
fully masked rows (their output 0, no gradient through them), query heads sharing key and value heads, in one block
and in blocks of 2 query rows.

torch runs every case; JAX, whose every case is several XLA programs, runs ``"all"``, which puts the others together
(an additive mask with masked entries and a fully masked row, causal, more queries than keys, shared heads).  The
``"all"`` case is also checked to second order in one block.  The CI profile takes a selection (``_grid``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.backends import backend_params
from tests.profile import crossed

INF = np.inf
MAPPINGS = ["softmax", "sparsemax", "entmax15", "entmax"]
#: the cases (torch's list); JAX runs the last
CASES = ["bool", "float", "causal", "L<S", "L>S-causal", "dead-rows", "all"]
#: (queries, keys) of each case
SHAPES = {"L<S": (3, 5), "L>S-causal": (5, 3), "all": (5, 3)}
DEAD = 1


def _case(case, seed=20):
    """``(q, k, v, mask, causal)`` for ``case``: four query heads sharing one key and value head (NumPy arrays; a
    float mask is additive, its masked entries ``-inf``)."""
    L, S = SHAPES.get(case, (4, 4))
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(1, 4, L, 2)), rng.normal(size=(1, 1, S, 2)), rng.normal(size=(1, 1, S, 2))
    mask, causal = None, case in ("causal", "L>S-causal", "all")
    if case == "bool":
        mask = rng.random((L, S)) > 0.3
    elif case == "dead-rows":
        mask = rng.random((4, L, S)) > 0.3
        mask[:, DEAD] = False
    elif case in ("float", "all"):
        mask = rng.normal(size=(4, L, S))
        mask[1, 0, 2] = -INF
        if case == "all":
            mask[0, DEAD] = -INF
    return q, k, v, mask, causal


def _grid():
    """(backend, case, name, block): torch every case, JAX the 'all' case, which puts the others together (each case
    is an XLA compile of the forward and its reverse).  The CI profile runs torch's 'all' case with every map and
    block, and each of its other cases with two (map, block) pairs, each pair on one; JAX's 'all' case with each map
    in one of the blocks.  The thorough profile runs every combination."""
    grid = []
    for p in backend_params("autodiff"):
        backend = p.values[0]
        if backend == "jax":
            runs = [("all", name, block) for name, block in crossed(MAPPINGS, [None, 2])]
        else:
            runs = [("all", name, block) for name in MAPPINGS for block in (None, 2)]
            runs += [(case, *pair) for pair, case in crossed(itertools.product(MAPPINGS, [None, 2]), CASES[:-1])]
        grid += [pytest.param(backend, case, name, block, marks=p.marks, id=f"{backend}-{case}-{name}-{block}")
                 for case, name, block in runs]
    return grid


@pytest.mark.parametrize(("backend", "case", "name", "block"), _grid(), indirect=["backend"])
def test_gradient_checks(backend, name, case, block):
    q, k, v, mask, causal = _case(case)
    additive = mask is not None and mask.dtype != bool
    inputs = [backend.array(a) for a in (q, k, v)]
    if additive:
        inputs.append(backend.array(mask))
    if name == "entmax":
        inputs.append(backend.array(np.linspace(1.2, 1.9, 4).reshape(4, 1, 1)))  # one alpha per head
    fixed = None if mask is None or additive else backend.array(mask)

    def f(q, k, v, *rest):
        m = rest[0] if additive else fixed
        mapping = backend.get_map("entmax", alpha=rest[-1]) if name == "entmax" else name
        return backend.attention(q, k, v, mapping, is_causal=causal, mask=m, block=block)

    backend.check_grads(f, *inputs, order=1)
    if case == "all" and block is None:
        backend.check_grads(f, *inputs, order=2, reverse_only=True)
    if case in ("dead-rows", "all"):  # the fully masked rows: output 0, no gradient through them, nothing NaN
        heads = slice(None) if case == "dead-rows" else 0
        assert np.all(backend.numpy(f(*inputs))[0, heads, DEAD] == 0)
        grads = backend.grad(lambda *a: (f(*a) ** 2).sum(), *inputs)
        assert np.all(grads[0][0, heads, DEAD] == 0) and all(np.isfinite(g).all() for g in grads[:3])
