"""numeric.torch.hf's attention function through the fused Triton kernels (Triton's interpreter on CPU tensors):
equal to its torch path, with grouped heads, padding, causality and a map parameter per head."""

from __future__ import annotations

import warnings

import pytest

from tests.profile import THOROUGH

from .conftest import interpreter_reason

pytestmark = pytest.mark.skipif(interpreter_reason() is not None, reason=str(interpreter_reason()))
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


#: (map, causal): every pair in the thorough profile; in the others a built-in and a typed map (no closed-form
#: link), one causal and one not (each call takes 8 s in the interpreter)
CASES = [(m, c) for m in ("softmax", "entmax15", "gini_log1p") for c in (True, False)
         if THOROUGH or (m, c) in (("entmax15", True), ("gini_log1p", False))]


@pytest.mark.parametrize(("mapping", "causal"), CASES)
def test_fused_equals_the_torch_path(mapping, causal):
    from numeric.torch import hf

    g = torch.Generator().manual_seed(0)
    module = torch.nn.Module()
    module.is_causal = causal
    B, H, Hk, T, D = 2, 4, 2, 9, 16
    q = torch.randn(B, H, T, D, generator=g)
    k, v = (torch.randn(B, Hk, T, D, generator=g) for _ in range(2))
    mask = torch.ones(B, 1, T, T, dtype=torch.bool)
    mask[1, ..., :3] = False  # left padding of the second sequence
    if causal:
        mask &= torch.ones(T, T, dtype=torch.bool).tril()
    for m in (mask, None):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the kernels take the call: no warning that it fell back
            fused, _ = hf.attention_forward(module, q, k, v, m, mapping=mapping, backend="triton")
        ref, _ = hf.attention_forward(module, q, k, v, m, mapping=mapping, backend="torch")
        assert fused.shape == (B, T, H, D)
        assert (fused - ref).abs().max() <= 2e-6 * ref.abs().max()
