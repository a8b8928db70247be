"""TorchOps' row-wise loop and selection: the same rows as the plain forms of numeric.core.ops.TensorOps.

``repeat_rows`` gathers the rows still going once they are at most half of a round's,
and ``on_rows`` evaluates its function on the masked rows only; a row's result must
not depend on which other rows are computed with it.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import numeric as nm  # noqa: E402
from numeric.core.array_ops import gather_above  # noqa: E402
from numeric.core import rules  # noqa: E402
from numeric.core.ops import TensorOps  # noqa: E402
from numeric.torch import TorchMap  # noqa: E402
from numeric.torch._ops import ops_for  # noqa: E402


def _newton_sqrt(ops):
    """Newton for sqrt(c) row by row; rows stop after different numbers of rounds."""
    def body(state, rows):
        x, rounds = state
        c, shift = rows
        new = 0.5 * (x + c / x) + 0 * shift
        going = (new - x).abs() > 1e-15 * new
        return (torch.where(going, new, x), rounds + going.to(rounds.dtype)), going
    return body


@pytest.mark.parametrize("steps", [3, 60])
def test_repeat_rows_matches_the_plain_loop(steps):
    ops = ops_for(torch.float64)
    c = torch.logspace(-30, 30, 41, dtype=torch.float64).reshape(-1, 1)
    state = (torch.ones_like(c), torch.zeros_like(c))
    going = torch.ones_like(c, dtype=torch.bool)
    rows = (c, torch.tensor(0.0, dtype=torch.float64))
    got = ops.repeat_rows(steps, _newton_sqrt(ops), state, going, rows)
    want = TensorOps.repeat_rows(ops, steps, _newton_sqrt(ops), state, going, rows)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    rounds = want[1].reshape(-1)
    assert rounds.min() < rounds.max()  # (rows did stop at different rounds: the gather ran)
    if steps == 60:
        np.testing.assert_allclose(got[0].numpy(), np.sqrt(c.numpy()), rtol=1e-15)


def test_on_rows_computes_the_masked_rows_only():
    ops = ops_for(torch.float64)
    y = torch.randn(10, 5, dtype=torch.float64)
    scale = torch.arange(1.0, 11.0, dtype=torch.float64).reshape(-1, 1)
    mask = torch.tensor([0, 1, 1, 0, 0, 0, 1, 0, 0, 1], dtype=torch.bool).reshape(-1, 1)
    otherwise = torch.full((10, 1), -7.0, dtype=torch.float64)
    seen = []

    def fn(y, scale):
        seen.append(y.shape[0])
        return (y * scale).sum(-1, keepdim=True)

    got = ops.on_rows(mask, fn, (y, scale), otherwise)
    assert seen == [4]
    torch.testing.assert_close(got, torch.where(mask, (y * scale).sum(-1, keepdim=True), otherwise), rtol=0, atol=0)
    assert ops.on_rows(torch.zeros_like(mask), fn, (y, scale), otherwise) is otherwise and seen == [4]


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_support_rule_sorts_only_its_open_rows(monkeypatch, name):
    """With one Newton round, the rows it leaves open (and only those) take the sort rule; values equal NumPy's."""
    x = torch.randn(64, 300, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 3
    x[::7] *= 0.001  # rows whose support rule stops at once (all of the scores in the support)
    sorted_rows = []
    sort_desc = type(ops_for(torch.float64)).sort_desc

    def spy(y):
        sorted_rows.append(y.shape[0])
        return sort_desc(y)

    monkeypatch.setattr(type(ops_for(torch.float64)), "sort_desc", staticmethod(spy))
    m = TorchMap(name)
    y = x - x.amax(-1, keepdim=True)
    r = m._solver.routines(())
    t = rules.support_rule(ops_for(torch.float64), r, y, steps=1)
    assert len(sorted_rows) == 1 and 0 < sorted_rows[0] < x.shape[0]
    full = rules.sort_rule(ops_for(torch.float64), r, y)
    torch.testing.assert_close(t, full, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m(x).numpy(), nm.get_map(name)(x.numpy()), rtol=0, atol=1e-12)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # (inductor's import)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_above_gathers_the_first_k_entries_above_the_cut(compiled):
    """TorchOps.above (the slots by arithmetic on the float mask) equals NumPy's gather: rows with none, fewer than
    k, exactly k and more than k entries above their cut, and masked (-inf) entries."""
    k = 16
    x = torch.randn(40, 64, dtype=torch.float32, generator=torch.Generator().manual_seed(5))
    x[3, ::2] = -torch.inf
    x[4] = -torch.inf
    ranks = torch.arange(40) % 24  # the cut at each row's (rank + 1)-th largest: rank entries above it
    cut = x.sort(dim=-1, descending=True).values.gather(-1, ranks[:, None])
    cut[5] = torch.inf  # none above
    cut[6] = -torch.inf  # every entry above: more than k
    above = type(ops_for(torch.float32)).above
    fn = torch.compile(lambda x, c: above(x, c, k), fullgraph=True) if compiled else (lambda x, c: above(x, c, k))
    values, index = fn(x, cut)
    counts = (x > cut).sum(-1)
    assert {0, 64}.issubset(set(counts.tolist())) and ((counts > 0) & (counts < k)).any() and (counts > k).any()
    want_values, want_index = gather_above(np, x.numpy(), cut.numpy(), k)
    np.testing.assert_array_equal(values.numpy(), want_values)
    np.testing.assert_array_equal(index.numpy(), want_index)
