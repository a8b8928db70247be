"""What is torch's own in numeric.torch's maps: the weights attention's backward rebuilds from a threshold, a
parameter that is a tensor in a graph, a parameter on another device, a NumPy array refused.  What every backend
shares is tested in tests/maps/."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from numeric.torch import TorchMap, entmax, softmax  # noqa: E402

def _scores(seed, shape=(12, 9), scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weights_from_the_threshold_at_huge_alpha(dtype):
    """The weights attention's backward rebuilds from the forward's threshold (``TorchMap.at``) are the forward's,
    also on rows whose ``c = p_max**(1/k)`` underflows, which ``tau`` cannot carry (solved again)."""
    x = _scores(15, shape=(6, 346), scale=0.01).to(dtype)
    x[0] = 0.0
    x[1, ::2] = x[1, 1::2]  # ties
    solver = TorchMap("entmax_sparse")._solver
    for alpha in (1.5, 3.0, 1000.0, [[1000.0], [1.3], [1000.0], [4.0], [20.0], [1e6]]):
        params = (torch.tensor(alpha, dtype=dtype),)
        p, t = solver.solve(x, params)
        torch.testing.assert_close(solver.at(x, t, params), p, rtol=0, atol=8 * torch.finfo(dtype).eps)


def test_bound_tensor_parameter_keeps_its_graph():
    logit = torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True)
    alpha = (1 + torch.sigmoid(logit) * 2).reshape(2, 1)
    m = TorchMap("entmax", alpha=alpha)
    x, v = _scores(11, shape=(2, 5), scale=0.3), _scores(12, shape=(2, 5))
    (m(x) * v).sum().backward()
    leaf = alpha.detach().requires_grad_()
    (ga,) = torch.autograd.grad((entmax(x, leaf) * v).sum(), leaf)
    chain = ga.reshape(2) * 2 * torch.sigmoid(logit.detach()) * (1 - torch.sigmoid(logit.detach()))
    assert torch.all(chain != 0)
    torch.testing.assert_close(logit.grad, chain, rtol=1e-12, atol=0)


def test_parameter_on_another_device_is_an_error():
    x = torch.randn(2, 3)
    alpha = torch.full((2, 1), 1.5, device="meta")
    with pytest.raises(ValueError, match="parameter alpha is on meta"):
        entmax(x, alpha)


def test_scores_must_be_a_torch_tensor():
    with pytest.raises(TypeError, match="scores must be a torch tensor, got ndarray"):
        softmax(np.ones(3))
