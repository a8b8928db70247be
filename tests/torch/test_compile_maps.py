"""torch.compile of a map on CPU: forward and backward agree with eager (one compile, it is slow)."""

from __future__ import annotations

import math
import subprocess
import sys
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


def test_compiled_softmax_is_one_graph_with_the_rules_on_hard_rows():
    """softmax under torch.compile(fullgraph=True): no graph break (no value read on the host), and the rules'
    values on fully masked (0), NaN and +inf (NaN) rows; gradients equal eager's, 0 on the fully masked row."""
    pytest.importorskip("torch._dynamo")
    m = TorchMap("softmax")
    x = torch.randn(6, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x[1, 2] = -math.inf  # a masked score
    x[2] = -math.inf  # a fully masked row
    x[3, 4] = math.nan
    x[4, 0] = math.inf
    w = torch.randn(6, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def f(x):
        return m(x)

    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    pe = f(xe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch's own tracing warnings; see the test above)
        pc = torch.compile(f, backend="inductor", fullgraph=True)(xc)
    torch.testing.assert_close(pc, pe, rtol=1e-14, atol=1e-15, equal_nan=True)
    assert bool((pc[2] == 0).all()) and bool(pc[3].isnan().all()) and bool(pc[4].isnan().all())
    live = [0, 1, 2, 5]
    (ge,) = torch.autograd.grad((pe[live] * w[live]).sum(), xe)
    (gc,) = torch.autograd.grad((pc[live] * w[live]).sum(), xc)
    torch.testing.assert_close(gc[live], ge[live], rtol=1e-13, atol=1e-15)
    assert bool((gc[2] == 0).all())



_FIRST_CALL = """
import warnings
import torch
from numeric import torch as rt
warnings.simplefilter("ignore")
x = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
f = lambda x: rt.softmax(x, dim=0) * 2
got = torch.compile(f, backend="eager", fullgraph=True)(x)
torch.testing.assert_close(got, f(x), rtol=1e-14, atol=1e-15)
others = lambda x: rt.sparsemax(x) + rt.entmax15(x) + rt.entmax(x, 1.5)  # (their solvers branch on values)
torch.testing.assert_close(torch.compile(others, backend="eager")(x), others(x), rtol=1e-14, atol=1e-15)
print("ok")
"""


def test_the_built_in_maps_first_called_inside_a_compiled_function():
    """The built-in maps are built when numeric.torch is imported: a compiled function that calls softmax first
    is one graph (building a map loads and checks its module, which dynamo cannot trace: fullgraph=True raised).
    The other maps' solvers branch on values (graph breaks) and agree with eager."""
    pytest.importorskip("torch._dynamo")
    run = subprocess.run([sys.executable, "-c", _FIRST_CALL], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]
