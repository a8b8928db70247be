"""torch.compile of a map on CPU: forward and backward agree with eager (one compile, it is slow)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from numeric.torch import TorchMap  # noqa: E402


def test_compiled_map_forward_and_backward():
    pytest.importorskip("torch._dynamo")
    m = TorchMap("entmax15")

    def f(x):
        return (m(x) * torch.arange(x.shape[-1], dtype=x.dtype)).sum()

    x = torch.randn(4, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ve = f(xe)
    ve.backward()
    # dynamo and inductor warn about torch's own internals while tracing (the deprecated torch.jit.script_method
    # of torch.utils.mkldnn, instantiating autograd.Function, .grad of non-leaf tensors): recorded, and none may
    # come from numeric's code
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = torch.compile(f, backend="inductor")
        vc = compiled(xc)
        vc.backward()
    ours = [w for w in caught if "/numeric/" in w.filename.replace("\\", "/")]
    assert not ours, [str(w.message) for w in ours]
    torch.testing.assert_close(vc, ve, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-12, atol=1e-12)
