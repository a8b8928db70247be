"""torch.compile(fullgraph=True) of attention and of the MultiheadAttention layer on CPU: values and gradients
equal eager's (small sizes: compiling is slow; one compiled function runs several maps and block sizes).

Under compile the query blocks take plain autograd (the blocked Function's backward is not traced), so these
tests also check the compiled block path against the eager Function's."""

from __future__ import annotations

import importlib
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch._dynamo")

from numeric.torch.attention import attention  # noqa: E402
from numeric.torch.layers import MultiheadAttention  # noqa: E402
from numeric.torch.maps import get_map  # noqa: E402

# torch's own warnings met while compiling: inductor imports torch.utils.mkldnn (TorchScript), dynamo
# instantiates the autograd.Function classes it traces and reads .grad of the non-leaf tensors it wraps
pytestmark = [pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf Tensor:UserWarning"),
              pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:<class 'torch.autograd.function.Function'> should not be instantiated"
                                         ":DeprecationWarning")]

TOL = {torch.float64: (1e-12, 1e-14), torch.float32: (2e-5, 2e-6)}


def _inputs(seed, dtype, L=6, S=5):
    """q, k, v (two batches of two heads) requiring grad, and a boolean mask whose row 3 allows no key."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, L, 4, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 2, S, 4, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 2, S, 3, generator=g, dtype=dtype, requires_grad=True)
    mask = torch.rand(L, S, generator=g) > 0.3
    mask[:, 0] = True
    mask[3] = False
    return q, k, v, mask


def _check(f, leaves, backend, tol):
    """``f(*leaves)`` (a list of outputs) compiled (fullgraph) equals eager, and so do the gradients of a weighted
    sum of the outputs with respect to every leaf that requires grad."""
    want = f(*leaves)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch's own tracing warnings; see pytestmark)
        got = torch.compile(f, backend=backend, fullgraph=True)(*leaves)
    rtol, atol = tol
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
    weights = [torch.randn(b.shape, dtype=b.dtype, generator=torch.Generator().manual_seed(i)) for i, b in enumerate(want)]
    wrt = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    ge = torch.autograd.grad(sum((b * w).sum() for b, w in zip(want, weights)), wrt)
    gc = torch.autograd.grad(sum((a * w).sum() for a, w in zip(got, weights)), wrt)
    for i, (a, b) in enumerate(zip(gc, ge)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"gradient {i}: {m}")
    return got


def test_compiled_attention_equals_eager(torch_user_modules):
    """softmax and the typed map gini_log1p (one block), alpha-entmax with a learnable alpha per head in blocks of
    2 queries (of 3 in float32), causal and masked with a query that may attend to no key (output 0), float64 and
    float32: one graph, outputs and gradients (q, k, v, alpha) equal to eager's (whose blocks are the blocked
    Function's)."""
    gini_log1p = get_map(importlib.import_module("gini_log1p"))

    def f(q, k, v, mask, q32, k32, v32, alpha):
        entmax = get_map("entmax_sparse", alpha=alpha)
        out = []
        for mapping, block in (("softmax", None), (entmax, 2), (gini_log1p, None)):
            out.append(attention(q, k, v, attn_mask=mask, is_causal=True, mapping=mapping, block=block))
        out.append(attention(q32, k32, v32, attn_mask=mask, mapping=get_map("entmax_sparse", alpha=alpha.float()), block=3))
        return out

    q, k, v, mask = _inputs(0, torch.float64)
    q32, k32, v32, _ = _inputs(1, torch.float32)
    alpha = torch.tensor([1.3, 2.5], dtype=torch.float64).reshape(2, 1, 1).requires_grad_()
    got = _check(f, (q, k, v, mask, q32, k32, v32, alpha), "aot_eager", TOL[torch.float32])
    for out in got:
        assert bool((out[..., 3, :] == 0).all())
    # float64 to float64's rounding
    want = f(q, k, v, mask, q32, k32, v32, alpha)
    for a, b in zip(got[:3], want[:3]):
        torch.testing.assert_close(a, b, rtol=TOL[torch.float64][0], atol=TOL[torch.float64][1])


def test_compiled_attention_inductor_and_without_gradients():
    """inductor's code for sparsemax in blocks of 2 (float32) equals eager, and so does a compiled call without
    gradients (the blocked forward, thresholds kept) with the map given by its name."""
    q, k, v, mask = _inputs(2, torch.float32)

    def f(q, k, v, mask):
        return [attention(q, k, v, attn_mask=mask, is_causal=True, mapping="sparsemax", block=2)]

    _check(f, (q, k, v, mask), "inductor", TOL[torch.float32])

    def g(q, k, v):
        return attention(q, k, v, is_causal=True, mapping="entmax15", block=2)

    with torch.no_grad():
        want = g(q, k, v)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = torch.compile(g, backend="aot_eager", fullgraph=True)(q, k, v)
    torch.testing.assert_close(got, want, rtol=TOL[torch.float32][0], atol=TOL[torch.float32][1])


def test_compiled_layer_equals_eager():
    """MultiheadAttention with alpha-entmax and a learned alpha per head, with the weights (need_weights=True) and
    through attention (need_weights=False), an attention mask with a query that may attend to no key and a key
    padding mask: one graph, outputs, weights and the gradients of the input and every parameter (alpha_logit
    included) equal to eager's."""
    torch.manual_seed(0)
    layer = MultiheadAttention(8, 2, batch_first=True, mapping="entmax_sparse", learn_alpha=True, dtype=torch.float64)
    with torch.no_grad():
        layer.alpha_logit.copy_(torch.tensor([-1.0, 1.5]))
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    blocked = torch.zeros(5, 5, dtype=torch.bool)
    blocked[2] = True  # query 2 may attend to no key
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[1, 3:] = True

    def f(x, *params):
        out, weights = layer(x, x, x, key_padding_mask=padding, attn_mask=blocked, need_weights=True)
        out2, _ = layer(x, x, x, key_padding_mask=padding, attn_mask=blocked, need_weights=False)
        return [out, weights, out2]

    _check(f, (x, *layer.parameters()), "aot_eager", TOL[torch.float64])
