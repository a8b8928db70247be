"""alpha-entmax for every alpha > 0 on torch: values equal NumPy's, gradients in the scores and in alpha (one value
per row, on both sides of 1 and at 1 itself) pass gradcheck, the loss's too, attention and a layer whose
learned alpha crosses 1."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import numeric as nm  # noqa: E402
import numeric.torch as rt  # noqa: E402
from numeric.torch.layers import MultiheadAttention  # noqa: E402

F64 = torch.float64
ALPHAS = [0.4, 0.9, 1.0, 1.0 + 1e-6, 1.3, 2.5]


def test_values_equal_numpy_per_row_across_one():
    x = torch.randn(len(ALPHAS), 7, dtype=F64, generator=torch.Generator().manual_seed(0)) * 3
    a = torch.tensor(ALPHAS, dtype=F64)[:, None]
    want = nm.get_map("entmax", alpha=a.numpy())(x.numpy())
    torch.testing.assert_close(rt.entmax(x, a), torch.from_numpy(want), rtol=0, atol=1e-15)
    for i, v in enumerate(ALPHAS):  # a number: the case's own rules
        torch.testing.assert_close(rt.entmax(x[i], v), torch.from_numpy(want[i]), rtol=0, atol=1e-15)


def test_gradcheck_in_scores_and_alpha_across_one():
    x = torch.randn(len(ALPHAS), 5, dtype=F64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    a = torch.tensor(ALPHAS, dtype=F64)[:, None].requires_grad_()
    assert torch.autograd.gradcheck(lambda s, al: rt.entmax(s, al), (x, a), atol=1e-7)


def test_loss_gradcheck_in_alpha_across_one():
    x = torch.randn(len(ALPHAS), 5, dtype=F64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    a = torch.tensor(ALPHAS, dtype=F64)[:, None].requires_grad_()
    labels = torch.tensor([0, 1, 2, 3, 4, 0])
    f = lambda s, al: rt.fenchel_young_loss(s, labels, rt.get_map("entmax", alpha=al), reduction="none")  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, a), atol=1e-7)
    # the value equals NumPy's, row by row
    want = nm.get_map("entmax", alpha=a.detach().numpy()).loss(x.detach().numpy(), labels.numpy(), reduction="none")
    torch.testing.assert_close(f(x, a).detach(), torch.from_numpy(want), rtol=1e-13, atol=1e-15)


def test_attention_with_one_alpha_per_head_across_one():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 6, 4, dtype=F64, generator=g) for _ in range(3))
    a = torch.tensor([0.6, 1.0, 1.8], dtype=F64).reshape(3, 1, 1)
    out = rt.attention(q, k, v, mapping=rt.get_map("entmax", alpha=a), is_causal=True)
    for h in range(3):
        one = rt.attention(q[:, h], k[:, h], v[:, h], mapping=rt.get_map("entmax", alpha=float(a[h])), is_causal=True)
        torch.testing.assert_close(out[:, h], one, rtol=0, atol=1e-14)


def test_a_learned_alpha_crosses_one():
    """The family's range from 1.5 is (0, 3): logits put the heads below, at and above 1; the layer's weights are
    the map's with those alphas, and its gradient in the logits passes gradcheck."""
    torch.manual_seed(4)
    layer = MultiheadAttention(6, 3, dtype=F64, mapping=rt.get_map("entmax", alpha=1.5), learn=("alpha",),
                               batch_first=True)
    assert layer.ranges == {"alpha": (0.0, 3.0)}
    logits = torch.tensor([-1.0, 0.0, 1.0], dtype=F64)  # alpha = 3 sigmoid(logit): 0.807, 1.5, 2.19
    with torch.no_grad():
        layer.alpha_logit.copy_(torch.log(torch.tensor([1 / 2, 1.0, 2.0], dtype=F64)))  # alpha = 1, 1.5, 2
    torch.testing.assert_close(layer.learned["alpha"].detach(), torch.tensor([1.0, 1.5, 2.0], dtype=F64))
    x = torch.randn(2, 4, 6, dtype=F64)
    params = dict(layer.named_parameters())

    def f(x, logit):
        out, w = torch.func.functional_call(layer, {**params, "alpha_logit": logit}, (x, x, x),
                                            dict(need_weights=True, average_attn_weights=False))
        return out, w

    assert torch.autograd.gradcheck(f, (x.requires_grad_(), logits.clone().requires_grad_()))
    # a step that takes a head across 1 leaves everything finite
    out, _ = f(x, torch.tensor([-8.0, 0.0, 8.0], dtype=F64))
    assert torch.isfinite(out).all()


def test_under_compile_with_alpha_across_one():
    """Traced alpha (values the trace cannot read) runs the family's routines."""
    x = torch.randn(4, 6, dtype=F64, generator=torch.Generator().manual_seed(5))
    a = torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=F64)[:, None]
    compiled = torch.compile(lambda s, al: rt.entmax(s, al), backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, a), rt.entmax(x, a), rtol=0, atol=1e-15)


def test_numpy_array_alpha_and_errors():
    with pytest.raises(ValueError, match="outside"):
        rt.entmax(torch.zeros(3, dtype=F64), -0.5)
    assert np.isfinite(rt.entmax(torch.randn(3, 40, dtype=F64), 0.01).numpy()).all()
