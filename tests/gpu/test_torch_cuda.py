"""numeric.torch on CUDA tensors: the same answers as on the CPU and as numeric's NumPy maps, nothing moved between
devices (skipped, and counted, without torch or a CUDA device)."""

from __future__ import annotations

import numpy as np
import pytest

import numeric as nm

torch = pytest.importorskip("torch")
from numeric import torch as rt  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch")]

MAPS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3}), ("entmax", {"alpha": 1.7})]


def _scores(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    x = 4 * torch.randn(3, 17, 300, generator=g, dtype=dtype)
    x[0, 0, ::2] = -torch.inf
    x[0, 1, :] = -torch.inf
    x[1, 2, 5] = torch.nan
    return x


@pytest.mark.parametrize("name, params", MAPS)
def test_maps_on_cuda_match_numpy(name, params):
    x = _scores()
    got = rt.get_map(name, **params)(x.cuda(), dim=-1)
    assert got.device.type == "cuda" and got.dtype == torch.float64
    want = nm.get_map(name, **params)(x.numpy())
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=0, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("name, params", MAPS)
def test_backward_on_cuda_matches_the_cpu(name, params):
    x = _scores()[2]  # rows without NaN
    dy = torch.randn_like(x)
    m = rt.get_map(name, **params)
    grads = []
    for device in ("cpu", "cuda"):
        leaf = x.to(device).requires_grad_()
        m(leaf, dim=-1).backward(dy.to(device))
        grads.append(leaf.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_compute_in_float32_on_cuda(dtype):
    x = _scores(torch.float32)[2]
    got = rt.entmax15(x.to(dtype).cuda(), dim=-1)
    assert got.dtype == dtype
    want = rt.entmax15(x.to(dtype).float(), dim=-1)
    torch.testing.assert_close(got.float().cpu(), want.to(dtype).float(), rtol=0, atol=0)


def test_a_parameter_on_another_device_is_an_error_naming_it():
    x = _scores()[2].cuda()
    with pytest.raises(ValueError, match="alpha"):
        rt.entmax(x, torch.full((17, 1), 1.5), dim=-1)


@pytest.mark.parametrize("mapping", ["softmax", "entmax15"])
def test_attention_on_cuda_matches_the_cpu(mapping):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 40, 8, generator=g, dtype=torch.float64) for _ in range(3))
    cpu = rt.attention(q, k, v, is_causal=True, mapping=mapping)
    cuda = rt.attention(q.cuda(), k.cuda(), v.cuda(), is_causal=True, mapping=mapping)
    assert cuda.device.type == "cuda"
    torch.testing.assert_close(cuda.cpu(), cpu, rtol=1e-12, atol=1e-12)
    if mapping == "softmax":
        sdpa = torch.nn.functional.scaled_dot_product_attention(q.cuda(), k.cuda(), v.cuda(), is_causal=True)
        torch.testing.assert_close(cuda, sdpa, rtol=1e-10, atol=1e-10)


def test_a_mask_on_another_device_is_an_error():
    q = torch.randn(1, 4, 8, device="cuda")
    with pytest.raises((ValueError, RuntimeError), match="attn_mask"):
        rt.attention(q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.bool))


def test_the_layer_on_cuda_matches_torchs():
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(16, 4, batch_first=True).cuda().double()
    ours = rt.MultiheadAttention(16, 4, batch_first=True).cuda().double()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 10, 16, device="cuda", dtype=torch.float64)
    torch.testing.assert_close(ours(x, x, x)[0], ref(x, x, x)[0], rtol=1e-10, atol=1e-10)


def test_alpha_on_cuda_gets_its_gradient_and_gradcheck():
    x = torch.randn(6, 7, dtype=torch.float64, device="cuda")
    alpha = torch.linspace(1.1, 2.5, 6, dtype=torch.float64, device="cuda").reshape(6, 1).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, a: rt.get_map("entmax", alpha=a)(x), (x.requires_grad_(), alpha))
    with pytest.raises(ValueError, match="parameter alpha is on cpu"):
        rt.get_map("entmax", alpha=torch.full((6, 1), 1.5, dtype=torch.float64))(x)


@pytest.mark.parametrize("mapping", ["softmax", "sparsemax", "entmax15"])
@pytest.mark.parametrize("block", [None, 16])
def test_attention_gradients_on_cuda_equal_the_cpu(mapping, block):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 40, 8, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(40, 40, generator=g) > 0.3
    mask[5] = False  # a fully masked row
    w = torch.randn(2, 3, 40, 8, generator=g, dtype=torch.float64)
    results = []
    for device in ("cpu", "cuda"):
        leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
        out = rt.attention(*leaves, attn_mask=mask.to(device), is_causal=True, mapping=mapping, block=block, backend="torch")
        assert out.device.type == device
        grads = torch.autograd.grad((out * w.to(device)).sum(), leaves)
        results.append([t.detach().cpu() for t in (out, *grads)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="attn_mask must be on the query's device"):
        rt.attention(q.cuda(), k.cuda(), v.cuda(), attn_mask=mask)


def test_dropout_on_cuda_replays_its_masks():
    q, k, v = (torch.randn(2, 30, 8, dtype=torch.float64, device="cuda").requires_grad_() for _ in range(3))

    def f(q, k, v):
        torch.manual_seed(7)
        return rt.attention(q, k, v, mapping="entmax15", dropout_p=0.3, block=8)

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_layer_and_loss_on_cuda():
    layer = rt.MultiheadAttention(16, 4, batch_first=True, mapping="entmax", learn_alpha=True).cuda()
    x = torch.randn(2, 10, 16, device="cuda")
    out, weights = layer(x, x, x, need_weights=True)
    assert out.device.type == "cuda" and weights.device.type == "cuda"
    cpu = rt.MultiheadAttention(16, 4, batch_first=True, mapping="entmax", learn_alpha=True)
    cpu.load_state_dict({n: t.cpu() for n, t in layer.state_dict().items()})
    torch.testing.assert_close(out.cpu(), cpu(x.cpu(), x.cpu(), x.cpu())[0], rtol=0, atol=1e-5)
    out.sum().backward()
    assert all(p.grad is not None and p.grad.device.type == "cuda" for p in layer.parameters())
    scores = torch.randn(5, 7, device="cuda", requires_grad=True)
    labels = torch.randint(0, 7, (5,), device="cuda")
    loss = rt.fenchel_young_loss(scores, labels, mapping="entmax15")
    loss.backward()
    assert scores.grad.device.type == "cuda"
    torch.testing.assert_close(loss.cpu(), rt.fenchel_young_loss(scores.detach().cpu(), labels.cpu(), mapping="entmax15"),
                               rtol=1e-5, atol=1e-6)
