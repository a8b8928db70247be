"""What a fully masked row (a query that may attend to no key) gives, for the installed torch: the claims of
docs/frameworks.md ("Fully masked rows"), measured with torch 2.13 on CPU, pinned so that a torch that changes them
fails here (and the docs get updated with it).

A row fully masked by a boolean mask (all False) or a float mask (all -inf):

* ``torch.nn.functional.scaled_dot_product_attention``: output 0 and zero gradients on CPU for torch 2.13 (PyTorch's
  SDPA zeroes such rows since pull request 133882, ``_safe_softmax``); ``torch.softmax`` of such a row gives NaN, as
  does ``torch.nn.MultiheadAttention`` where it returns the weights or takes its inference fast path;
* :func:`numeric.torch.attention`, every map: output 0, zero gradients, the other rows unaffected (every backend:
  tests/edges/test_rows.py; softmax's numbers are SDPA's here).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

#: the torch release the docs' statements were measured with (a different one re-measures them here)
MEASURED = "2.13"


def _masks(dtype):
    keep = torch.ones(4, 5, dtype=torch.bool)
    keep[1] = False  # query 1 may attend to no key
    keep[3, :2] = False  # query 3 to some
    return {"bool": keep, "float": torch.zeros(4, 5, dtype=dtype).masked_fill(~keep, -math.inf)}


def _run(fn, dtype, mask):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, 8, dtype=dtype, generator=g).requires_grad_()
    k = torch.randn(2, 3, 5, 8, dtype=dtype, generator=g).requires_grad_()
    v = torch.randn(2, 3, 5, 6, dtype=dtype, generator=g).requires_grad_()
    out = fn(q, k, v, attn_mask=mask)
    out.backward(torch.randn(out.shape, dtype=dtype, generator=g))
    return out.detach(), q.grad, k.grad, v.grad


def _reference(dtype, keep):
    """The rows that may attend somewhere, by softmax written out in float64; 0 on the fully masked row."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, e, dtype=dtype, generator=g).double() for n, e in ((4, 8), (5, 8), (5, 6)))
    s = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~keep, -math.inf)
    p = torch.exp(s - s.amax(-1, keepdim=True).clamp_min(-1e300))
    p = torch.nan_to_num(p / p.sum(-1, keepdim=True))
    return p @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_gives_zero_on_a_fully_masked_row(kind, dtype):
    """SDPA of the installed torch on CPU: output 0 and zero gradients on the fully masked row (bool and float
    masks), the other rows softmax attention.  Fails where torch returns NaN there (as before _safe_softmax)."""
    mask = _masks(dtype)[kind]
    out, dq, dk, dv = _run(lambda *a, **kw: F.scaled_dot_product_attention(*a, **kw), dtype, mask)
    assert torch.equal(out[..., 1, :], torch.zeros_like(out[..., 1, :])), (torch.__version__, out[..., 1, :])
    assert torch.equal(dq[..., 1, :], torch.zeros_like(dq[..., 1, :]))
    assert bool(dk.isfinite().all() and dv.isfinite().all())
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert torch.allclose(out.double(), _reference(dtype, _masks(dtype)["bool"]), atol=tol, rtol=tol)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_regattn_softmax_is_sdpa_on_every_row(kind):
    """numeric.torch's softmax attention gives SDPA's numbers, the fully masked row's zeros among them (that every
    map and backend gives zeros there: tests/edges/test_rows.py)."""
    from numeric.torch import attention

    mask = _masks(torch.float64)[kind]
    out = _run(lambda *a, **kw: attention(*a, mapping="softmax", **kw), torch.float64, mask)
    ref = _run(lambda *a, **kw: F.scaled_dot_product_attention(*a, **kw), torch.float64, mask)
    for a, b in zip(out, ref):
        assert torch.allclose(a, b, atol=1e-12, rtol=1e-12)


def test_softmax_and_multihead_attention_give_nan_on_a_fully_masked_row():
    """What still gives NaN with the installed torch: torch.softmax of an all -inf row, and
    nn.MultiheadAttention's fully masked query with need_weights=True, or in its inference fast path (eval, no
    gradients) with need_weights=False."""
    assert bool(torch.softmax(torch.full((3,), -math.inf), -1).isnan().all())
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 4, 8)
    blocked = torch.zeros(4, 4, dtype=torch.bool)
    blocked[1] = True  # (MultiheadAttention's convention: True = may not attend)
    out, w = mha(x, x, x, attn_mask=blocked, need_weights=True)
    assert bool(out[0, 1].isnan().all() and w[0, 1].isnan().all())
    out, _ = mha(x, x, x, attn_mask=blocked, need_weights=False)  # training path: SDPA, 0
    assert torch.equal(out[0, 1], torch.zeros(8))
    mha.eval()
    with torch.no_grad():
        out, _ = mha(x, x, x, attn_mask=blocked, need_weights=False)  # the fast path
    assert bool(out[0, 1].isnan().all())


def test_the_docs_say_what_was_measured():
    """docs/frameworks.md states these results with the release they were measured with (not NaN for SDPA)."""
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "frameworks.md").read_text().split())
    assert "SDPA gives NaN" not in text
    assert f"SDPA of torch {MEASURED} on CPU gives output 0 and zero gradients there" in text
    if not torch.__version__.startswith(MEASURED + "."):
        pytest.skip(f"measured with torch {MEASURED}, installed {torch.__version__}: the tests above re-measure")
