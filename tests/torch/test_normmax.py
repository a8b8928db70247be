"""normmax on torch (``get_map("normmax")``, a :class:`numeric.torch.TorchMap` of the family
:mod:`numeric.families.normmax`): values against the NumPy map (itself checked against
:mod:`derive.normmax`), gradcheck (scores; twice), the loss, attention with alpha per head, and the entmax
package's ``normmax_bisect`` as a peer."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import numeric as nm  # noqa: E402
import numeric.torch as rt  # noqa: E402


def _x():
    return torch.randn(4, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("alpha", [1.25, 2.0, 3.0, 7.5])
def test_values_and_gradients(alpha):
    x = _x()
    x[1, 3] = -torch.inf
    p = rt.normmax(x, alpha)
    np.testing.assert_allclose(p.numpy(), nm.normmax(x.numpy(), alpha), rtol=0, atol=1e-14)
    p32 = rt.normmax(x.float(), alpha)
    assert p32.dtype == torch.float32
    np.testing.assert_allclose(p32.numpy(), p.numpy(), rtol=0, atol=2e-6)
    xg = _x().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: rt.normmax(x, alpha), (xg,))
    assert torch.autograd.gradgradcheck(lambda x: rt.normmax(x, alpha), (xg,))


def test_alpha_per_row_along_a_dim():
    x = torch.randn(3, 5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    alpha = torch.tensor([[[1.5, 2.0]], [[3.0, 4.0]], [[2.0, 2.0]]], dtype=torch.float64)
    got = rt.get_map("normmax", alpha=alpha)(x, dim=1)
    np.testing.assert_allclose(got.numpy(), nm.normmax(x.numpy(), alpha.numpy(), axis=1), rtol=0, atol=1e-14)


@pytest.mark.parametrize("alpha", [1.5, 2.0, 3.0])
def test_loss(alpha):
    x = _x().requires_grad_()
    labels = torch.tensor([0, 1, 2, 3])
    m = rt.get_map("normmax", alpha=alpha)
    value = rt.fenchel_young_loss(x, labels, m, reduction="none")
    want, grad = nm.get_map("normmax", alpha=alpha).loss_and_grad(x.detach().numpy(), labels.numpy(), reduction="none")
    np.testing.assert_allclose(value.detach().numpy(), want, rtol=0, atol=1e-13)
    (g,) = torch.autograd.grad(value.sum(), x)
    np.testing.assert_allclose(g.numpy(), grad, rtol=0, atol=1e-14)
    assert torch.autograd.gradcheck(lambda x: rt.fenchel_young_loss(x, labels, m), (x,))


def test_the_entmax_package_agrees():
    entmax = pytest.importorskip("entmax")
    x = _x()
    for alpha in (1.5, 2.0, 3.0):
        torch.testing.assert_close(rt.normmax(x, alpha), entmax.normmax_bisect(x, alpha=alpha, n_iter=200),
                                   rtol=0, atol=1e-14)


def test_attention_with_alpha_per_head():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64, generator=g).requires_grad_() for _ in range(3))
    alpha = torch.tensor([[[1.5]], [[3.0]]], dtype=torch.float64)
    m = rt.get_map("normmax", alpha=alpha)
    for block in (None, 2):
        out = rt.attention(q, k, v, mapping=m, is_causal=True, block=block)
        s = (q @ k.transpose(-1, -2) / 2).masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -torch.inf)
        torch.testing.assert_close(out, m(s) @ v, rtol=0, atol=1e-14)
        (gq,) = torch.autograd.grad((out * torch.cos(out)).sum(), q)  # against the map's own backward, composed
        (want,) = torch.autograd.grad((m(s) @ v * torch.cos(m(s) @ v)).sum(), q)
        torch.testing.assert_close(gq, want, rtol=0, atol=1e-13)
    small = q[:1, :, :3].detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda q: rt.attention(q, k[:1, :, :3], v[:1, :, :3], mapping=m, block=2), (small,))


def test_errors_by_name():
    with pytest.raises(ValueError, match="alpha > 1"):
        rt.normmax(torch.zeros(3), 0.9)
    with pytest.raises(ValueError, match="no box constraints"):
        rt.get_map("normmax")(torch.zeros(3), upper=0.5)
    alpha = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="no gradient in alpha"):
        rt.normmax(_x(), alpha).sum().backward()
    pytest.importorskip("triton")
    with pytest.warns(RuntimeWarning, match="normmax has no fused kernels"):
        q = torch.zeros(1, 1, 2, 4)
        rt.attention(q, q, q, mapping="normmax", backend="triton")
