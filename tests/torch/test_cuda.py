"""numeric.torch on CUDA tensors: the same generated torch operations give the CPU's values and gradients, the outputs
stay on the scores' device, and nothing is moved between devices.  Run where a CUDA device exists; skipped (and
counted) elsewhere."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from numeric.torch import MultiheadAttention, TorchMap, attention, fenchel_young_loss, get_map  # noqa: E402

from .conftest import IDS, MAPS  # noqa: E402
from tests.numeric.conftest import hard_rows  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

INF = math.inf
CUDA = "cuda"


def _hard_rows(seed=0, shape=(12, 9)):
    return hard_rows(torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_maps_on_cuda_equal_cpu(name, params, dtype):
    m = TorchMap(name, **params)
    x = _hard_rows().to(dtype)
    p_cpu = m(x)
    p = m(x.to(CUDA))
    assert p.device.type == CUDA and p.dtype == dtype
    atol = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(p.cpu(), p_cpu, rtol=0, atol=atol, equal_nan=True)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_gradients_on_cuda_equal_cpu(name, params):
    x = _hard_rows(1)
    x[3, 0] = 0.0
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    grads = []
    for device in ("cpu", CUDA):
        xd = x.to(device).requires_grad_()
        (g,) = torch.autograd.grad((TorchMap(name, **params)(xd) * v.to(device)).sum(), xd)
        assert g.device.type == device
        grads.append(g.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=1e-12)


def test_alpha_on_cuda_gets_its_gradient_and_gradcheck():
    x = torch.randn(6, 7, dtype=torch.float64, device=CUDA)
    alpha = torch.linspace(1.1, 2.5, 6, dtype=torch.float64, device=CUDA).reshape(6, 1).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, a: get_map("entmax", alpha=a)(x), (x.requires_grad_(), alpha))
    with pytest.raises(ValueError, match="parameter alpha is on cpu"):
        get_map("entmax", alpha=torch.full((6, 1), 1.5, dtype=torch.float64))(x)


@pytest.mark.parametrize("mapping", ["softmax", "sparsemax", "entmax15"])
@pytest.mark.parametrize("block", [None, 16])
def test_attention_on_cuda_equals_cpu(mapping, block):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 40, 8, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(40, 40, generator=g) > 0.3
    mask[5] = False  # a fully masked row
    w = torch.randn(2, 3, 40, 8, generator=g, dtype=torch.float64)
    results = []
    for device in ("cpu", CUDA):
        leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
        out = attention(*leaves, attn_mask=mask.to(device), is_causal=True, mapping=mapping, block=block)
        assert out.device.type == device
        grads = torch.autograd.grad((out * w.to(device)).sum(), leaves)
        results.append([t.detach().cpu() for t in (out, *grads)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="attn_mask must be on the query's device"):
        attention(q.to(CUDA), k.to(CUDA), v.to(CUDA), attn_mask=mask)


def test_softmax_attention_on_cuda_equals_sdpa():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 4, 64, 16, generator=g).to(CUDA) for _ in range(3))
    torch.testing.assert_close(attention(q, k, v, is_causal=True),
                               torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                               rtol=0, atol=2e-6)


def test_dropout_on_cuda_replays_its_masks():
    q, k, v = (torch.randn(2, 30, 8, dtype=torch.float64, device=CUDA).requires_grad_() for _ in range(3))

    def f(q, k, v):
        torch.manual_seed(7)
        return attention(q, k, v, mapping="entmax15", dropout_p=0.3, block=8)

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_layer_and_loss_on_cuda():
    layer = MultiheadAttention(16, 4, batch_first=True, mapping="entmax", learn_alpha=True).to(CUDA)
    x = torch.randn(2, 10, 16, device=CUDA)
    out, weights = layer(x, x, x, need_weights=True)
    assert out.device.type == CUDA and weights.device.type == CUDA
    cpu = MultiheadAttention(16, 4, batch_first=True, mapping="entmax", learn_alpha=True)
    cpu.load_state_dict({n: t.cpu() for n, t in layer.state_dict().items()})
    torch.testing.assert_close(out.cpu(), cpu(x.cpu(), x.cpu(), x.cpu())[0], rtol=0, atol=1e-5)
    out.sum().backward()
    assert all(p.grad is not None and p.grad.device.type == CUDA for p in layer.parameters())
    scores = torch.randn(5, 7, device=CUDA, requires_grad=True)
    labels = torch.randint(0, 7, (5,), device=CUDA)
    loss = fenchel_young_loss(scores, labels, mapping="entmax15")
    loss.backward()
    assert scores.grad.device.type == CUDA
    torch.testing.assert_close(loss.cpu(), fenchel_young_loss(scores.detach().cpu(), labels.cpu(), mapping="entmax15"),
                               rtol=1e-5, atol=1e-6)
