"""torch.compile(attention) on CPU, forward and backward, equals eager (small sizes: compiling is slow)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from numeric.torch.attention import attention  # noqa: E402
from numeric.torch.maps import get_map  # noqa: E402

# torch's own warnings met while compiling: inductor imports torch.utils.mkldnn (TorchScript), dynamo
# instantiates the autograd.Function classes it traces and reads .grad of the non-leaf tensors it wraps
pytestmark = [pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf Tensor:UserWarning"),
              pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:<class 'torch.autograd.function.Function'> should not be instantiated"
                                         ":DeprecationWarning")]


def _inputs(seed, L=6, S=5):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, L, 4, generator=g, requires_grad=True)
    k = torch.randn(2, 2, S, 4, generator=g, requires_grad=True)
    v = torch.randn(2, 2, S, 3, generator=g, requires_grad=True)
    mask = torch.rand(L, S, generator=g) > 0.3
    mask[:, 0] = True
    return q, k, v, mask


@pytest.mark.parametrize(("mapping", "block"), [("softmax", None), ("entmax15", None), ("sparsemax", 2)])
def test_compiled_attention_equals_eager(mapping, block):
    torch._dynamo.reset()
    q, k, v, mask = _inputs(0)
    mapping = get_map(mapping)  # built outside the compiled function, as a layer holds it

    def f(q, k, v, mask):
        return attention(q, k, v, attn_mask=mask, is_causal=True, mapping=mapping, block=block)

    compiled = torch.compile(f, backend="inductor", dynamic=False)
    got = compiled(q, k, v, mask)
    want = f(q, k, v, mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
    for a, b in zip(torch.autograd.grad((got * g).sum(), (q, k, v)), torch.autograd.grad((want * g).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
