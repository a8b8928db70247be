"""numeric.plan: the blocks of an attention call, the keys each may see, and the cuts inside a block, against the
definition of what query i may see: every key (plain), j <= i + offset (causal), and i + offset - window < j
(window)."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from numeric.plan import Block, Plan, dense_rows, rows_within


def visible(plan: Plan, i: int, j: int) -> bool:
    """Whether query row i may see key j, from the definition (not from the plan's arithmetic)."""
    if plan.causal and j > i + plan.offset:
        return False
    if plan.window is not None and j <= i + plan.offset - plan.window:
        return False
    return 0 <= j < plan.S


plans = st.builds(
    lambda L, S, block, causal, offset, window: Plan(L, S, block, causal=causal, offset=offset, window=window),
    st.integers(0, 40), st.integers(0, 40), st.integers(1, 45), st.booleans(), st.integers(-5, 45),
    st.none() | st.integers(1, 12))


@given(plans)
def test_blocks_cover_the_rows_in_order_once(plan):
    rows = [i for b in plan for i in range(b.start, b.stop)]
    assert rows == list(range(plan.L))
    assert len(list(plan)) == len(plan)
    assert all(b.stop - b.start <= plan.block for b in plan)


@given(plans)
def test_a_block_holds_every_key_its_rows_may_see(plan):
    for b in plan:
        assert 0 <= b.lo <= b.hi <= plan.S
        for i in range(b.start, b.stop):
            lo, hi = plan.keys(i)
            seen = [j for j in range(plan.S) if visible(plan, i, j)]
            assert seen == list(range(lo, hi))
            assert b.lo <= lo and hi <= b.hi or lo == hi


@given(plans, st.data())
def test_hide_cuts_exactly_the_keys_a_row_may_not_see(plan, data):
    for b in plan:
        # any window of keys inside the block's own, as the online key blocks take them
        lo = data.draw(st.integers(b.lo, b.hi))
        hi = data.draw(st.integers(lo, b.hi))
        a = np.zeros((2, b.stop - b.start, hi - lo))
        plan.hide(np, a, b, slice(lo, hi))
        want = np.array([[visible(plan, i, j) for j in range(lo, hi)] for i in range(b.start, b.stop)], dtype=bool)
        assert np.array_equal(a[0] == 0, want.reshape(a.shape[1:]))
        assert np.array_equal(a[1], a[0])
        above, below = plan.cuts(b, slice(lo, hi))
        if above is None and below is None:  # (no cut: nothing hidden)
            assert want.all()


@given(plans)
def test_torch_cuts_hide_what_numpy_hides(plan):
    torch = pytest.importorskip("torch")
    from numeric.torch.attention import block_scores

    for b in plan:
        rows, cols = b.stop - b.start, b.hi - b.lo
        q = torch.zeros(1, rows, 1)
        k = torch.zeros(1, cols, 1)
        a = block_scores(q, k, None, plan.cuts(b)).numpy()
        want = plan.hide(np, np.zeros((1, rows, cols)), b)
        assert np.array_equal(a, want)


def test_causal_blocks_skip_the_keys_above_the_diagonal():
    assert [(b.lo, b.hi) for b in Plan(10, 10, 4, causal=True)] == [(0, 4), (0, 8), (0, 10)]
    # context parallelism: a run of rows at position 6 of the gathered keys
    assert [(b.lo, b.hi) for b in Plan(4, 16, 2, causal=True, offset=6)] == [(0, 8), (0, 10)]
    assert [(b.lo, b.hi) for b in Plan(8, 8, 4, window=3)] == [(0, 4), (2, 8)]
    assert Plan(8, 8, 4, window=3).causal


@given(plans, st.integers(1, 9))
def test_key_blocks_cover_a_blocks_keys_in_order(plan, size):
    for b in plan:
        cols = list(plan.key_blocks(b, size))
        assert [j for c in cols for j in range(c.start, c.stop)] == list(range(b.lo, b.hi))
        assert all(0 < c.stop - c.start <= size for c in cols)


def test_the_budget_rules():
    assert rows_within(100, 7) == 14 and rows_within(3, 7) == 1 and rows_within(5, 0) == 5
    assert dense_rows(100, False) == 100 and dense_rows(0, False) == 1
    assert dense_rows(100, True) == 128 and dense_rows(4000, True) == 500


def test_padded_blocks_for_uniform_executors():
    assert Plan(10, 3, 4).padded() == (3, 2)
    assert Plan(8, 3, 4).padded() == (2, 0)


@pytest.mark.parametrize("bad", [dict(block=0), dict(block=1.5), dict(window=0), dict(offset=0.5), dict(block=True)])
def test_bad_plans_are_refused(bad):
    args = dict(block=2, causal=False, offset=0, window=None)
    args.update(bad)
    with pytest.raises(ValueError):
        Plan(4, 4, args.pop("block"), **args)


def test_block_slices():
    b = Block(2, 5, 1, 7)
    assert b.rows == slice(2, 5) and b.keys == slice(1, 7)
