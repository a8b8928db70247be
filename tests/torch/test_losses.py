"""numeric.torch's Fenchel-Young loss against numeric.Map.loss_and_grad, and its gradients (scores, alpha) by gradcheck."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import numeric as nm  # noqa: E402
from numeric.torch import FenchelYoungLoss, TorchMap, fenchel_young_loss  # noqa: E402

from .conftest import IDS, MAPS  # noqa: E402

INF = math.inf


def _scores(seed, shape=(6, 7), scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_loss_and_gradient_match_numpy(name, params, reduction):
    x = _scores(0)
    x[1, 2] = -INF
    x[2] = -INF  # fully masked: loss 0, gradient 0
    x[3, 1] = math.nan  # NaN row
    labels = torch.tensor([0, 3, 4, 6, 2, 5])
    dist = torch.softmax(_scores(1), -1)
    for target in (labels, dist):
        xg = x.clone().requires_grad_()
        value = fenchel_young_loss(xg, target, TorchMap(name, **params), reduction=reduction)
        ref_value, ref_grad = nm.get_map(name, **params).loss_and_grad(x.numpy(), target.numpy(), reduction=reduction)
        np.testing.assert_allclose(value.detach().numpy(), ref_value, rtol=1e-12, atol=1e-12, equal_nan=True)
        value.sum().backward() if reduction == "none" else value.backward()
        np.testing.assert_allclose(xg.grad.numpy(), ref_grad, rtol=0, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_gradcheck_scores(name, params):
    m = TorchMap(name, **params)
    x = _scores(2, shape=(3, 5), scale=1.0).requires_grad_()
    y = torch.tensor([1, 4, 0])
    assert torch.autograd.gradcheck(lambda x: fenchel_young_loss(x, y, m, reduction="sum"), (x,))
    # the Hessian in the scores is the map's Jacobian
    assert torch.autograd.gradgradcheck(lambda x: fenchel_young_loss(x, y, m, reduction="sum"), (x,))


def test_alpha_gradient_by_gradcheck_scalar_and_per_row():
    x = _scores(3, shape=(4, 6), scale=1.0)
    y = torch.softmax(_scores(4, shape=(4, 6)), -1)
    for alpha in (torch.tensor(1.7, dtype=torch.float64), torch.tensor([[1.2], [1.6], [2.4], [4.0]], dtype=torch.float64)):
        a = alpha.clone().requires_grad_()
        assert torch.autograd.gradcheck(
            lambda x, a: fenchel_young_loss(x, y, TorchMap("entmax", alpha=a), reduction="sum"), (x.clone().requires_grad_(), a))


def test_alpha_gradient_is_the_envelope_theorem():
    # d/dalpha of the loss at fixed p: finite differences of the loss in alpha
    x = _scores(5, shape=(2, 5), scale=1.0)
    y = torch.tensor([0, 3])
    a = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    fenchel_young_loss(x, y, TorchMap("entmax", alpha=a), reduction="sum").backward()
    h = 1e-6
    fd = (fenchel_young_loss(x, y, TorchMap("entmax", alpha=1.5 + h), reduction="sum")
          - fenchel_young_loss(x, y, TorchMap("entmax", alpha=1.5 - h), reduction="sum")) / (2 * h)
    assert abs(float(a.grad) - float(fd.detach())) < 1e-7


def test_module_and_errors():
    loss = FenchelYoungLoss("sparsemax", reduction="sum")
    x = torch.tensor([[1.0, 0.5, -1.0]])
    assert float(loss(x, torch.tensor([0]))) == pytest.approx(0.0625)
    with pytest.raises(ValueError, match="reduction"):
        FenchelYoungLoss("softmax", reduction="avg")
    with pytest.raises(ValueError, match="labels must lie in"):
        loss(x, torch.tensor([3]))
    with pytest.raises(ValueError, match="integer labels must have shape"):
        loss(x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="target must be a distribution"):
        loss(x, torch.tensor([[0.5, 0.6, 0.0]]))
    with pytest.raises(ValueError, match="does not match scores"):
        loss(x, torch.tensor([[0.5, 0.5]]))
    with pytest.raises(ValueError, match="needs a value for alpha"):
        fenchel_young_loss(x, torch.tensor([0]), "entmax")


def test_half_precision_loss():
    x = _scores(6).to(torch.bfloat16).requires_grad_()
    value = fenchel_young_loss(x, torch.tensor([0, 1, 2, 3, 4, 5]), "entmax15")
    assert value.dtype == torch.bfloat16
    value.backward()
    assert x.grad.dtype == torch.bfloat16
    ref, _ = nm.get_map("entmax15").loss_and_grad(x.detach().double().numpy(), np.arange(6))
    assert abs(float(value.detach()) - float(ref)) < 1e-2 * max(1.0, abs(float(ref)))
