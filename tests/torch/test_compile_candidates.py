"""A sparse typed map's candidate rounds under torch.compile(fullgraph=True): top-k, scatter and the
rows that need more scores (whose count no traced value can give: four times as many candidates, up to whole rows)
give eager's p and gradient."""

from __future__ import annotations

import importlib
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch._dynamo")

from numeric.core.screen import CANDIDATES  # noqa: E402
from numeric.torch.maps import get_map  # noqa: E402
from tests.profile import THOROUGH  # noqa: E402

#: (the ci profile leaves out the rows of 200, whose ladder starts at its second stage: rows of 100 and 300 compile
#: every stage, and each takes 20-40 s to trace)
CASES = [("gini_log1p", 100), ("gini_log1p", 300), ("cube", 100)] + ([("gini_log1p", 200)] if THOROUGH else [])


@pytest.mark.parametrize(("name", "n"), CASES)
def test_candidate_rounds_compile_to_one_graph(torch_user_modules, name, n):
    """The KKT solve's gini_log1p (candidates above a cut, then four times as many, then whole rows; on rows of
    200 the four times as many first, and on rows of 300, longer than the cut's rows, the four times as many above
    a cut first, then whole rows) and the root rule's p**3 (candidates above a cut, then whole rows)."""
    m = get_map(importlib.import_module(name))
    assert n > 2 * (CANDIDATES + 1)  # the candidate rounds run
    scales = torch.tensor([0.0, 0.1, 1, 3, 10, 30], dtype=torch.float64)[:, None]
    x = torch.randn(6, n, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * scales
    x[3, 50:] = -torch.inf
    dy = torch.randn_like(x)

    def run(fn):
        leaf = x.clone().requires_grad_()
        p = fn(leaf)
        return p, torch.autograd.grad((p * dy).sum(), leaf)[0]

    want = run(m)
    support = (want[0] > 0).sum(-1)
    assert support[0] == n and support.min() == 1  # a flat row (every round, then the whole row) and a one-hot row
    # (each case compiles its own shape: without the reset a case after another in the same process compiles the
    # same lambda again with the row length symbolic, dynamo's automatic dynamic shapes, and takes half as long again)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = run(torch.compile(lambda v: m(v), backend="aot_eager", fullgraph=True))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", ["gini_log1p", "shannon_gini"])
def test_the_kkt_fallback_runs_outside_the_compiled_graph(torch_user_modules, name, monkeypatch):
    """Rows that the KKT solve's Newton rounds leave (here all of them: no rounds) take the Halley fallback with the
    link inverted.  Under torch.compile that fallback runs eagerly, on those rows alone, in an operator opaque to
    the compiler (``TorchOps.rare_rows``): each compiled call runs it again, where a traced fallback would have
    run at the trace alone, and p and its gradient are eager's (float64, to 1e-13) and the full solve's."""
    from numeric.core import kkt

    m = get_map(importlib.import_module(name))
    x = torch.randn(5, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 2
    x[1, ::3] = -torch.inf
    dy = torch.randn_like(x)

    def run(fn):
        leaf = x.clone().requires_grad_()
        p = fn(leaf)
        return p, torch.autograd.grad((p * dy).sum(), leaf)[0]

    full = run(m)
    newton = kkt._kkt_newton
    monkeypatch.setattr(kkt, "_kkt_newton", lambda ops, r, y, steps, **kw: newton(ops, r, y, 0, **kw))
    rows = []
    root_halley = kkt.root_halley
    monkeypatch.setattr(kkt, "root_halley", lambda ops, r, y, *a: rows.append(y.shape[0]) or root_halley(ops, r, y, *a))
    want = run(m)
    assert rows == [5]  # (eager: every row falls back)
    torch._dynamo.reset()
    compiled = torch.compile(lambda v: m(v), backend="aot_eager", fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run(compiled)
        rows.clear()
        got = run(compiled)
    assert rows == [5]  # (the compiled call ran the fallback, on the 5 rows)
    for a, b, c in zip(got, want, full):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-14)


def test_a_module_not_found_by_its_name_keeps_its_fallback_in_the_graph(torch_user_modules, monkeypatch):
    """A generated module that ``sys.modules`` does not hold under its name (one made in memory, or imported and
    dropped) cannot be found again by the operator that runs a fallback outside the graph: its fallback rows are
    compiled with the rest, and give eager's p and gradient."""
    import sys

    from numeric.core import kkt
    from numeric.torch import _ops

    module = importlib.import_module("shannon_gini")
    m = get_map(module)
    monkeypatch.delitem(sys.modules, "shannon_gini")
    monkeypatch.setattr(_ops, "OUTSIDE_MODULES", {})
    newton = kkt._kkt_newton
    monkeypatch.setattr(kkt, "_kkt_newton", lambda ops, r, y, steps, **kw: newton(ops, r, y, 0, **kw))
    x = torch.randn(3, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    dy = torch.randn_like(x)

    def run(fn):
        leaf = x.clone().requires_grad_()
        p = fn(leaf)
        return p, torch.autograd.grad((p * dy).sum(), leaf)[0]

    want = run(m)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = run(torch.compile(lambda v: m(v), backend="aot_eager", fullgraph=True))
    assert _ops.OUTSIDE_MODULES == {}  # (nothing was run outside the graph)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)
