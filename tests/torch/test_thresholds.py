"""A map's weights from the threshold it solved before (``rules.at_threshold``): the solved weights to rounding,
the same gradients, and attention's backward pass recomputing its weights without a solve."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from numeric.core import rules  # noqa: E402
from numeric.torch.attention import attention  # noqa: E402
from numeric.torch.maps import get_map  # noqa: E402

from .conftest import IDS, MAPS  # noqa: E402
from tests.numeric.conftest import IDS as ALL_IDS  # noqa: E402
from tests.numeric.conftest import MAPS as ALL_MAPS  # noqa: E402
from tests.numeric.conftest import hard_rows  # noqa: E402

INF = math.inf
F64 = torch.float64


def _hard_rows(seed=0, n=9):
    return hard_rows(torch.randn(10, n, generator=torch.Generator().manual_seed(seed), dtype=F64) * 3)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("dim", [-1, 0])
def test_weights_from_the_threshold_equal_the_solved_weights(name, params, dim):
    m = get_map(name, **params)
    x = _hard_rows()
    x = x if dim == -1 else x.T.contiguous()
    p, tau = m.run(x, dim, {}, keep_tau=True)
    torch.testing.assert_close(p, m(x, dim=dim), rtol=0, atol=0, equal_nan=True)
    # torch.softmax, a root rule across a kink (shannon_gini), a link with no closed form (a typed map: p from
    # tau would invert the link per score): nothing to keep
    solver = m.solver_for(m.params)  # (a family's: its case's)
    if name == "softmax" or not rules.recomputable(solver.routines({})):
        assert name in ("softmax", "shannon_gini", "gini_log1p") or solver.module.NAME == "entmax_dense", name
        assert tau is None
        return
    assert tau.shape == tuple(1 if i == dim % x.dim() else s for i, s in enumerate(x.shape))
    again = m.run(x, dim, {}, tau=tau)
    # (the solvers stop within a few ulps of the threshold: Newton's and Halley's p differ from g(x - tau) / sum
    # by that much, and a link's power k = 1 / (alpha - 1) multiplies the relative rounding of its base)
    torch.testing.assert_close(again, p, rtol=0, atol=1e-14, equal_nan=True)
    dead = (2, slice(None)) if dim == -1 else (slice(None), 2)
    assert bool((again[dead] == 0).all())  # a fully masked row stays 0 (tau = inf)
    nan = (3, slice(None)) if dim == -1 else (slice(None), 3)
    assert bool(again[nan].isnan().all())


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_from_the_threshold_in_lower_precision(name, dtype):
    """The threshold is kept in the precision the map computes in (float32 for half formats)."""
    params = {"alpha": 1.3} if name == "entmax" else {}
    m = get_map(name, **params)
    x = _hard_rows(1).to(dtype)
    p, tau = m.run(x, -1, {}, keep_tau=True)
    assert tau.dtype == torch.float32
    again = m.run(x, -1, {}, tau=tau)
    assert again.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(again.double(), p.double(), rtol=0, atol=4 * eps, equal_nan=True)


@pytest.mark.parametrize(("name", "params"), MAPS[1:], ids=IDS[1:])
def test_gradients_through_the_threshold_path(name, params):
    m = get_map(name, **params)
    x = _hard_rows(2)
    x[3, 0] = 0.0  # (no NaN row: gradients compared)
    live = x.clone().requires_grad_()
    _, tau = m.run(x, -1, {}, keep_tau=True)
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    (g_solve,) = torch.autograd.grad((m(live) * v).sum(), live)
    (g_tau,) = torch.autograd.grad((m.run(live, -1, {}, tau=tau) * v).sum(), live)
    # (alpha > 2: the JVP's weight p**(2 - alpha) is infinite at 0, so a tiny p's gradient is large and
    # carries p's relative rounding)
    torch.testing.assert_close(g_tau, g_solve, rtol=1e-10, atol=1e-13)


def test_which_maps_keep_a_threshold():
    """The power-form, sort and closed maps recompute from tau; a root rule across a kink does not (every map, the
    ends of alpha's range too: a question of the solver chosen, no solve runs)."""
    kept = {ALL_IDS[i]: rules.recomputable(get_map(n, **p).solver_for(p).routines(
        tuple(torch.tensor([[v]], dtype=F64) for v in p.values()))) for i, (n, p) in enumerate(ALL_MAPS)}
    for name in ("sparsemax", "entmax15", "entmax-alpha1.3", "entmax-alpha1.01", "entmax-alpha5.0"):
        assert kept[name], name
    assert not kept["shannon_gini"]


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax"])
def test_attention_backward_solves_nothing(name, monkeypatch):
    """The blocked backward takes each row's weights from the threshold of the forward pass: no solve, same
    gradients as the unblocked graph."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 6, 4, generator=g, dtype=F64).requires_grad_() for _ in range(3))
    alpha = torch.tensor([1.2, 1.5, 1.9], dtype=F64).reshape(3, 1, 1).requires_grad_()
    mapping = get_map("entmax", alpha=alpha) if name == "entmax" else name
    mask = torch.rand(6, 6, generator=g) > 0.3
    mask[2] = False  # a fully masked row
    inputs = [q, k, v] + ([alpha] if name == "entmax" else [])
    w = torch.randn(2, 3, 6, 4, generator=g, dtype=F64)
    want = torch.autograd.grad((attention(q, k, v, attn_mask=mask, is_causal=True, mapping=mapping) * w).sum(), inputs)
    out = attention(q, k, v, attn_mask=mask, is_causal=True, mapping=mapping, block=2)
    calls = []
    solve = rules.solve
    monkeypatch.setattr(rules, "solve", lambda *a, **kw: calls.append(1) or solve(*a, **kw))
    got = torch.autograd.grad((out * w).sum(), inputs)
    assert calls == []
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


@pytest.mark.parametrize("alpha", [3.0, 6.0])
def test_a_single_alpha_is_a_number_to_the_rule(alpha, monkeypatch):
    """alpha-entmax with one alpha (a 0-d tensor) on the CPU in eager torch: the rule reads it as a number
    (TorchOps.number), as NumPy's does, and solves each row's candidates on the root's piece between two kinks
    (before, a per-row k took Halley on whole rows); the weights are NumPy's to rounding, a learnt alpha's too, whose
    gradient is finite."""
    import numpy as np

    import numeric as nm

    x = torch.randn(64, 200, generator=torch.Generator().manual_seed(5), dtype=F64)
    ks = []
    piece = rules._power_piece_newton
    monkeypatch.setattr(rules, "_power_piece_newton", lambda ops, a, k, *rest: ks.append(k) or piece(ops, a, k, *rest))
    want = nm.entmax(x.numpy(), alpha)
    for value in (alpha, torch.tensor(alpha, dtype=F64, requires_grad=True)):
        ks.clear()
        p = get_map("entmax", alpha=value)(x)
        assert ks and all(isinstance(k, float) and 0 < k < 1 for k in ks), ks
        np.testing.assert_allclose(p.detach().numpy(), want, rtol=0, atol=1e-14)
    (g,) = torch.autograd.grad((p * torch.linspace(-1, 1, 200, dtype=F64)).sum(), value)
    assert torch.isfinite(g)
