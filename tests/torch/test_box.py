"""Box constraints on the torch maps and loss: ``m(x, dim, upper=, total=)``, ``fenchel_young_loss(..., upper=,
total=)``.

Truths: the NumPy bounded map and loss (checked against the mpmath reference :mod:`derive.box` in
tests/numeric/test_box_maps.py) for values; ``torch.autograd.gradcheck`` (central differences) for the gradients in
the scores, the bounds, the total and alpha per row across 1; the plain map where nothing binds.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import numeric as nm  # noqa: E402
import numeric.torch as rt  # noqa: E402

BOX_MAPS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 0.6}),
            ("entmax", {"alpha": 1.3}), ("shannon_gini", {})]
BOX_IDS = [name + "".join(f"-{k}{v}" for k, v in params.items()) for name, params in BOX_MAPS]


def _case():
    """Scores along dim 1 (of 3) with a masked entry; bounds per entry, some none; totals per row."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 6, 3)) * 1.5
    x[1, 4, 2] = -np.inf
    upper = rng.choice([0.15, 0.3, 0.6, np.inf], size=x.shape)
    upper[:, :2] = 0.5
    total = np.array([[[0.8, 1.0, 0.6]], [[0.9, 0.7, 1.0]]])
    return x, upper, total


@pytest.mark.parametrize(("name", "params"), BOX_MAPS, ids=BOX_IDS)
def test_values_match_the_numpy_map(name, params):
    x, upper, total = _case()
    want = nm.get_map(name, **params)(x, axis=1, upper=upper, total=total)
    m = rt.get_map(name, **params)
    got = m(torch.from_numpy(x), dim=1, upper=torch.from_numpy(upper), total=torch.from_numpy(total))
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-13)
    got = m(torch.from_numpy(x).float(), dim=1, upper=torch.from_numpy(upper), total=torch.from_numpy(total))
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=3e-6)
    half = m(torch.from_numpy(x).to(torch.bfloat16), dim=1, upper=torch.from_numpy(upper), total=torch.from_numpy(total))
    assert half.dtype == torch.bfloat16


def test_no_binding_bound_is_the_plain_map():
    x = torch.randn(4, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for name in ("softmax", "sparsemax", "entmax15"):
        m = rt.get_map(name)
        torch.testing.assert_close(m(x, upper=2.0), m(x), rtol=0, atol=1e-14)


def test_budget_sparsemax():
    x = torch.tensor([[3.0, 2.9, 0.1, 0.0], [0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    p = rt.sparsemax(x, upper=1, total=2)
    torch.testing.assert_close(p[0], torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64), rtol=0, atol=1e-15)
    torch.testing.assert_close(p[1], x[1] - (x[1].sum() - 2) / 4, rtol=0, atol=1e-15)


def _gradcheck_case():
    """Rows away from kinks: entry 0 saturated in each row, no entry at a bound or at 0 by accident."""
    x = torch.tensor([[2.0, 0.3, 0.2, -0.4, 0.1], [1.5, 0.4, 0.45, -1.0, 0.0], [2.5, 0.1, 0.5, 0.2, -0.3]],
                     dtype=torch.float64)
    upper = torch.tensor([[0.35, 0.3, 1.0, 1.0, 4.0], [0.3, 0.25, 0.3, 1.0, 0.3], [0.3, 1.0, 1.0, 0.9, 0.8]],
                         dtype=torch.float64)
    total = torch.tensor([[0.9], [1.0], [0.95]], dtype=torch.float64)
    return x, upper, total


@pytest.mark.parametrize(("name", "params"), BOX_MAPS, ids=BOX_IDS)
def test_gradcheck_in_the_scores_the_bounds_and_the_total(name, params):
    x, upper, total = (a.requires_grad_() for a in _gradcheck_case())
    m = rt.get_map(name, **params)
    assert torch.autograd.gradcheck(lambda x, u, c: m(x, upper=u, total=c), (x, upper, total))
    # entry 0 saturates: its bound has a gradient
    p = m(x, upper=upper, total=total)
    (gu,) = torch.autograd.grad((p * torch.arange(5.0, dtype=p.dtype)).sum(), upper)
    assert torch.all(gu[:, 0] != 0)


def test_gradcheck_alpha_per_row_across_one_with_bounds():
    x, upper, total = (a.requires_grad_() for a in _gradcheck_case())
    alpha = torch.tensor([[0.8], [1.3], [1.0]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, u, c, a: rt.entmax(x, a, upper=u, total=c), (x, upper, total, alpha))
    # float32: the gradient in alpha is computed in float64 (as the plain map's)
    a32 = alpha.detach().float().requires_grad_()
    rt.entmax(x.detach().float(), a32, upper=upper.detach().float(), total=total.detach().float())[:, 1].sum().backward()
    (a64,) = torch.autograd.grad(rt.entmax(x, alpha, upper=upper, total=total)[:, 1].sum(), alpha)
    torch.testing.assert_close(a32.grad.double(), a64, rtol=1e-4, atol=1e-5)


def test_double_backward_with_bounds():
    x, upper, total = _gradcheck_case()
    x.requires_grad_()
    m = rt.get_map("entmax15")
    assert torch.autograd.gradgradcheck(lambda x: m(x, upper=upper, total=total), (x,))


@pytest.mark.parametrize(("name", "params"), BOX_MAPS, ids=BOX_IDS)
def test_loss_matches_the_numpy_loss(name, params):
    x = torch.tensor([[2.0, 0.3, 0.2, -0.4, 0.1], [1.5, 0.4, 0.45, -1.0, 0.0]], dtype=torch.float64,
                     requires_grad=True)
    upper = torch.tensor([[0.35, 0.3, 1.0, 1.0, np.inf], [0.3, 0.25, 0.3, 1.0, 0.3]], dtype=torch.float64,
                         requires_grad=True)
    total = torch.tensor([[0.875], [1.0]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([[0.25, 0.25, 0.125, 0.125, 0.125], [0.25, 0.125, 0.25, 0.25, 0.125]], dtype=torch.float64)
    value = rt.fenchel_young_loss(x, y, rt.get_map(name, **params), reduction="sum", upper=upper, total=total)
    gx, gu, gc = torch.autograd.grad(value, (x, upper, total))
    want, wx, wb = nm.get_map(name, **params).loss_and_grad(x.detach().numpy(), y.numpy(), reduction="sum",
                                                            upper=upper.detach().numpy(),
                                                            total=total.detach().numpy(), bounds=True)
    assert value.item() == pytest.approx(want, abs=1e-13)
    np.testing.assert_allclose(gx.numpy(), wx, rtol=0, atol=1e-13)
    np.testing.assert_allclose(gu.numpy(), wb["upper"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(gc.numpy()[:, 0], wb["total"], rtol=0, atol=1e-12)
    assert torch.all(gu[:, 0] > 0)


def test_loss_gradcheck_in_the_bounds_and_alpha():
    """The loss's gradients in finite bounds and alpha per row (across 1) by central differences (the target
    fixed inside the box)."""
    x = torch.tensor([[2.0, 0.3, 0.2, -0.4, 0.1], [1.5, 0.4, 0.45, -1.0, 0.0]], dtype=torch.float64,
                     requires_grad=True)
    upper = torch.tensor([[0.35, 0.3, 1.0, 1.0, 2.0], [0.3, 0.25, 0.3, 1.0, 0.3]], dtype=torch.float64,
                         requires_grad=True)
    y = torch.tensor([[0.25, 0.25, 0.2, 0.15, 0.15], [0.25, 0.125, 0.25, 0.25, 0.125]], dtype=torch.float64)
    alpha = torch.tensor([[0.7], [1.4]], dtype=torch.float64, requires_grad=True)

    def loss(x, u, a):
        return rt.fenchel_young_loss(x, y, rt.get_map("entmax", alpha=a), reduction="none", upper=u)

    assert torch.autograd.gradcheck(loss, (x, upper, alpha))


def test_errors_by_name():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"infeasible bounds: in row 1 .* sum to 0.9 < total = 1"):
        rt.sparsemax(x, upper=torch.tensor([[0.5], [0.3]]))
    with pytest.raises(ValueError, match=">= 0"):
        rt.softmax(x, upper=torch.tensor([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="total must be finite and > 0, got -0.5"):
        rt.entmax15(x, total=-0.5)
    with pytest.raises(ValueError, match="total must be finite and > 0, got 0.0"):  # (the budget 0 too)
        rt.sparsemax(x, upper=1.0, total=0.0)
    with pytest.raises(ValueError, match="upper of shape .* does not broadcast"):
        rt.sparsemax(x, upper=torch.ones(4))
    with pytest.raises(ValueError, match="must have size 1 along dim"):
        rt.sparsemax(x, total=torch.ones(2, 3))
    with pytest.raises(ValueError, match="within the upper bounds"):
        rt.fenchel_young_loss(x, torch.tensor([0, 1]), "softmax", upper=0.5)


def _attention_inputs(L=6, S=6):
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(2, 2, L, 4, generator=g, dtype=torch.float64), torch.randn(2, 2, S, 4, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, S, 3, generator=g, dtype=torch.float64)
    upper = torch.rand(2, L, S, generator=g, dtype=torch.float64) * 0.5 + 0.3
    return q, k, v, upper


@pytest.mark.parametrize("block", [None, 2])
@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15"])
def test_attention_with_bounds_is_numpys(name, block):
    from numeric.attention import attention as np_attention

    q, k, v, upper = _attention_inputs()
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[:, 5] = False
    got = rt.attention(q, k, v, mask, mapping=name, upper=upper, block=block)
    want = np_attention(q.numpy(), k.numpy(), v.numpy(), mapping=name, mask=mask.numpy(), upper=upper.numpy())
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-14)


def test_attention_gradcheck_in_the_bounds():
    """Blocked (the Function recomputing each block) and in one block, with the bounds, queries and alpha per head."""
    q, k, v, upper = _attention_inputs(L=3, S=4)
    q, k, v, upper = q[:1].requires_grad_(), k[:1], v[:1], upper.requires_grad_()
    alpha = torch.tensor([[[0.8]], [[1.4]]], dtype=torch.float64, requires_grad=True)
    for block in (None, 2):
        def f(q, u, a):
            return rt.attention(q, k, v, mapping=rt.get_map("entmax", alpha=a), upper=u, block=block)

        assert torch.autograd.gradcheck(f, (q, upper, alpha))


def test_attention_upper_errors():
    q, k, v, upper = _attention_inputs()
    with pytest.raises(ValueError, match="upper of shape .* must broadcast to the scores"):
        rt.attention(q, k, v, upper=torch.ones(3, 6, 6, dtype=torch.float64))
    with pytest.raises(TypeError, match="upper= needs a regattn map"):
        rt.attention(q, k, v, mapping=lambda s, dim: torch.softmax(s, dim), upper=upper)
    with pytest.raises(ValueError, match="infeasible bounds"):
        rt.attention(q, k, v, is_causal=True, upper=0.5)


def test_layer_takes_bounds():
    """``MultiheadAttention(..., mapping=...)(x, x, x, upper=)``: the weights it returns lie in the box and are the
    bounded map of the layer's scores; the output agrees with and without the weights; the bounds get gradients."""
    from numeric.torch.layers import MultiheadAttention

    torch.manual_seed(0)
    layer = MultiheadAttention(8, 2, mapping="sparsemax", batch_first=True, bias=False).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    upper = torch.full((5, 5), 0.4, dtype=torch.float64, requires_grad=True)
    out, w = layer(x, x, x, upper=upper, average_attn_weights=False)
    again, _ = layer(x, x, x, upper=upper, need_weights=False)
    torch.testing.assert_close(out, again, rtol=0, atol=1e-14)
    assert torch.all(w <= 0.4 + 1e-15)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 2, 5, dtype=torch.float64), rtol=0, atol=1e-14)
    qw, kw, _ = layer.in_proj_weight.chunk(3)
    heads = lambda a: a.reshape(3, 5, 2, 4).transpose(1, 2)  # noqa: E731
    s = heads(x @ qw.T) @ heads(x @ kw.T).transpose(-1, -2) / 2
    torch.testing.assert_close(w, rt.sparsemax(s, upper=upper), rtol=0, atol=1e-14)
    (g,) = torch.autograd.grad(again.square().sum(), upper)
    assert g.abs().max() > 0
    per_head = torch.full((3 * 2, 5, 5), 0.4, dtype=torch.float64)
    torch.testing.assert_close(layer(x, x, x, upper=per_head, need_weights=False)[0], again, rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="upper must have shape"):
        layer(x, x, x, upper=torch.ones(4, 5, 5, dtype=torch.float64))
