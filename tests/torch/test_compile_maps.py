"""torch.compile(fullgraph=True) of every kind of map on CPU: values and gradients equal eager's on hard rows.

Compiling is slow (a minute to several a graph on a CI core: docs/benchmarks.md), so each test compiles one function that calls many
maps at once, in float32 and float64 together: the built-ins, alpha-entmax with a learnable alpha tensor (one
value per row, on both sides of alpha = 2, where the solver takes different rules), and two typed maps (links
with no closed form, solved by Newton on the KKT system): gini_log1p (sparse) and plogp_cube (dense); and a map whose
printed link is transcendental, ``cosh(p) - 1`` (``asinh``), beside the compiled ``arcsinh`` against mpmath.
``backend="aot_eager"`` traces what inductor is given (dynamo's graph, autograd's backward graph, the
while_loop and cond operators) and runs it op by op; one test runs inductor's generated code as well.
"""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch._dynamo")

from derive.codegen.files import write_user_module  # noqa: E402
from numeric.core import kkt, rules  # noqa: E402
from numeric.torch import TorchMap  # noqa: E402
from numeric.torch.maps import get_map  # noqa: E402
from tests.profile import THOROUGH  # noqa: E402

# torch's own warnings met while compiling: inductor imports torch.utils.mkldnn (TorchScript), dynamo
# instantiates the autograd.Function classes it traces and reads .grad of the non-leaf tensors it wraps
pytestmark = [pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf Tensor:UserWarning"),
              pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:<class 'torch.autograd.function.Function'> should not be instantiated"
                                         ":DeprecationWarning")]

#: alpha per row of the scores (alpha > 2 takes the root rule's Halley branch, alpha <= 2 Newton on F**(1/k))
ALPHAS = [1.3, 1.7, 2.5, 1.01, 3.0, 1.5, 2.0, 1.2]
#: (rtol, atol) of compiled against eager: the same rounds of the same rules, so rounding alone
TOL = {torch.float64: (1e-13, 1e-15), torch.float32: (2e-6, 1e-7)}


@pytest.fixture(scope="module")
def typed(torch_user_modules):
    """The typed maps: conftest's gini_log1p and plogp_cube, generated here as `regattn generate --expr` does."""
    write_user_module("p*log(p) + p**3", "plogp_cube", torch_user_modules)
    importlib.invalidate_caches()
    return [get_map(importlib.import_module(name)) for name in ("gini_log1p", "plogp_cube")]


def hard_scores(dtype, seed=0):
    """8 rows of 7 scores: 1 a masked score, 2 fully masked, 3 a NaN, 4 a +inf, 5 ties, 6 a wide spread, 7 a large
    offset with a tiny spread."""
    x = torch.randn(8, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    x[1, 2] = -math.inf
    x[2] = -math.inf
    x[3, 4] = math.nan
    x[4, 0] = math.inf
    x[5, :3] = 1.5
    x[6] *= 40
    x[7] = x[7] * 1e-3 + 1e4
    return x.to(dtype)


def _inputs(dtypes):
    """``(scores, alpha)`` leaves requiring grad for each dtype, and a weight for each dtype."""
    leaves, weights = [], {}
    for i, dtype in enumerate(dtypes):
        leaves += [hard_scores(dtype).requires_grad_(), torch.tensor(ALPHAS, dtype=dtype).reshape(-1, 1).requires_grad_()]
        weights[dtype] = torch.randn(8, 7, dtype=dtype, generator=torch.Generator().manual_seed(10 + i))
    return leaves, weights


def _compare(fn, backend, dtypes, names):
    """``fn(x, alpha) -> list of p`` compiled (fullgraph) and eager on the hard scores of each dtype: p, and the
    gradients of ``sum(p * weight)`` over every map with respect to the scores and alpha, equal to rounding.
    ``names``: what each p is, in the order of the results over the dtypes."""
    def both(*leaves):
        return [p for x, alpha in zip(leaves[::2], leaves[1::2]) for p in fn(x, alpha)]

    runs = []
    for compiled in (False, True):
        leaves, weights = _inputs(dtypes)
        f = torch.compile(both, backend=backend, fullgraph=True) if compiled else both
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (torch's own tracing warnings; see pytestmark)
            ps = f(*leaves)
            loss = sum((p * weights[p.dtype]).sum() for p in ps)
            runs.append((ps, torch.autograd.grad(loss, leaves)))
    (pe, ge), (pc, gc) = runs
    assert len(pe) == len(pc) == len(names)
    for name, a, b in zip(names, pc, pe):
        rtol, atol = TOL[b.dtype]
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{name}, {b.dtype}: {m}")
        assert bool((a[2] == 0).all()) and bool(a[3].isnan().all()) and bool(a[4].isnan().all()), name
        assert bool(a[[0, 1, 5, 6, 7]].sum(-1).sub(1).abs().max() < 50 * torch.finfo(a.dtype).eps), name
    for i, (a, b) in enumerate(zip(gc, ge)):
        rtol, atol = TOL[b.dtype]
        what = ("scores", "alpha")[i % 2]
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"d/d{what}, {b.dtype}: {m}")
    assert bool((gc[0][2] == 0).all()), "a fully masked row has zero gradients"


def test_every_map_compiles_to_one_graph_and_equals_eager(typed):
    """entmax with a learnable alpha per row, gini_log1p and plogp_cube (and softmax, sparsemax, entmax15, and
    float64 besides float32, in the thorough profile), one graph (``fullgraph=True``): p and the gradients (scores,
    alpha) equal eager's on masked, fully masked, NaN and +inf rows.  (In the ci profile the built-ins are compiled
    by test_compiled_softmax_is_one_graph_with_the_rules_on_hard_rows and
    test_the_built_in_maps_first_called_inside_a_compiled_function.)"""
    builtins = [get_map(name) for name in ("softmax", "sparsemax", "entmax15")] if THOROUGH else []
    entmax = get_map("entmax_sparse")

    def fn(x, alpha):
        return [m(x) for m in builtins] + [entmax(x, alpha=alpha)] + [m(x) for m in typed]

    names = ["softmax", "sparsemax", "entmax15"][:len(builtins)] + ["entmax", "gini_log1p", "plogp_cube"]
    # (float64 in the thorough profile: the one graph of six maps takes minutes to trace per dtype)
    dtypes = (torch.float32, torch.float64) if THOROUGH else (torch.float32,)
    _compare(fn, "aot_eager", dtypes, names * len(dtypes))


def test_inductor_code_equals_eager(typed):
    """inductor's generated code (the loops and branches of the solvers compiled, fullgraph) equals eager: the
    typed map gini_log1p in float64 (and in the thorough profile alpha-entmax in float32, its alpha gradient
    computed in float64, and sparsemax in float64)."""
    sparsemax, entmax, gini_log1p = get_map("sparsemax"), get_map("entmax_sparse"), typed[0]

    def fn(x, alpha):
        if x.dtype == torch.float32:
            return [entmax(x, alpha=alpha)]
        return [sparsemax(x) + 0 * alpha.sum(), gini_log1p(x)] if THOROUGH else [gini_log1p(x) + 0 * alpha.sum()]

    torch._dynamo.reset()
    if THOROUGH:
        _compare(fn, "inductor", (torch.float32, torch.float64), ["entmax", "sparsemax", "gini_log1p"])
    else:
        _compare(fn, "inductor", (torch.float64,), ["gini_log1p"])


def test_compiled_fallbacks_equal_eager(typed):
    """The rules' fallbacks under compile (a torch.cond that runs them only where some row asks): the support rule
    with one Newton step (3 of these 6 rows are left over and take the sort rule) and the KKT rule with 4 rounds
    (4 rows left over take the Halley solve), compiled and eager alike; the fallbacks'
    p are the full solve's."""
    from numeric.torch._ops import ops_for

    y = torch.randn(6, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) * 3
    y = y - y.amax(-1, keepdim=True)
    ops = ops_for(torch.float64)
    entmax15 = get_map("entmax15")._solver.routines(())
    gini_log1p = typed[0]._solver.routines(())

    def fn(y):
        return [rules.support_rule(ops, entmax15, y, 1), *kkt.kkt_rule(ops, gini_log1p, y, 4)]

    want = fn(y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = torch.compile(fn, backend="aot_eager", fullgraph=True)(y)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(got[0], rules.sort_rule(ops, entmax15, y), rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(got[1], kkt.kkt_rule(ops, gini_log1p, y)[0], rtol=1e-12, atol=1e-14)


def test_parameter_outside_its_domain_under_compile():
    """Under compile a tensor parameter's domain is checked with the graph (no value reaches Python): an alpha
    outside (1, inf) raises, naming the parameter; inside, the values are eager's."""
    entmax = get_map("entmax_sparse")
    f = torch.compile(lambda x, a: entmax(x, alpha=a), backend="eager", fullgraph=True)
    x = hard_scores(torch.float64)[[0, 5, 6]]
    a = torch.tensor([[1.5], [2.5], [1.1]], dtype=torch.float64)
    torch.testing.assert_close(f(x, a), entmax(x, alpha=a), rtol=1e-14, atol=1e-15)
    with pytest.raises(RuntimeError, match="parameter alpha is outside"):
        f(x, torch.tensor([[1.5], [0.5], [1.1]], dtype=torch.float64))


def test_compiled_softmax_is_one_graph_with_the_rules_on_hard_rows():
    """softmax under torch.compile(fullgraph=True) and inductor: no graph break (no value read on the host), and the
    rules' values on fully masked (0), NaN and +inf (NaN) rows; gradients equal eager's, 0 on the fully masked row."""
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
        warnings.simplefilter("ignore")  # (torch's own tracing warnings; see pytestmark)
        pc = torch.compile(f, backend="inductor", fullgraph=True)(xc)
    torch.testing.assert_close(pc, pe, rtol=1e-14, atol=1e-15, equal_nan=True)
    assert bool((pc[2] == 0).all()) and bool(pc[3].isnan().all()) and bool(pc[4].isnan().all())
    live = [0, 1, 2, 5]
    (ge,) = torch.autograd.grad((pe[live] * w[live]).sum(), xe)
    (gc,) = torch.autograd.grad((pc[live] * w[live]).sum(), xc)
    torch.testing.assert_close(gc[live], ge[live], rtol=1e-13, atol=1e-15)
    assert bool((gc[2] == 0).all())


def _conds(gm) -> int:
    """The torch.cond calls in a dynamo graph and its subgraphs."""
    own = sum(node.op == "call_function" and node.target is torch.ops.higher_order.cond for node in gm.graph.nodes)
    return own + sum(_conds(sub) for _, sub in gm.named_children() if isinstance(sub, torch.fx.GraphModule))


def test_a_closed_solve_traces_without_branches():
    """The rules' shift of each row by its maximum and the overwrite of rows without a finite one (fully masked, a
    NaN, +inf) are masked work under compile, not torch.cond: softmax's closed rule with a sink column traces with
    no branch at all, and gives eager's values on those rows."""
    from numeric.torch._ops import ops_for

    ops, r = ops_for(torch.float64), get_map("softmax")._solver.routines(())
    x = hard_scores(torch.float64)
    sink = torch.randn(x.shape[0], 1, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    def fn(x, sink):
        return rules.closed_with(ops, r, x, sink)

    got = torch.compile(fn, backend=backend, fullgraph=True)(x, sink)
    want = fn(x, sink)
    assert len(graphs) == 1 and _conds(graphs[0]) == 0
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-15, equal_nan=True)
    assert bool((got[0][2] == 0).all()) and bool(got[0][3].isnan().all()) and bool(got[0][4].isnan().all())


_FIRST_CALL = """
import warnings
import torch
from numeric import torch as rt
warnings.simplefilter("ignore")
x = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
f = lambda x: rt.softmax(x, dim=0) * 2
got = torch.compile(f, backend="eager", fullgraph=True)(x)
torch.testing.assert_close(got, f(x), rtol=1e-14, atol=1e-15)
# float32 scores with a float32 alpha: the alpha gradient is computed in float64, whose operations this
# process meets first inside the compiled backward (before any float64 solve)
x32 = x.float().requires_grad_()
alpha = torch.full((3, 1), 1.3, requires_grad=True)
g = lambda x, a: (rt.entmax(x, a) * torch.arange(5.0)).sum()
got = torch.autograd.grad(torch.compile(g, backend="eager", fullgraph=True)(x32, alpha), alpha)[0]
want = torch.autograd.grad(g(x32, alpha), alpha)[0]
torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
others = lambda x: rt.sparsemax(x) + rt.entmax15(x) + rt.entmax(x, 1.5) + rt.get_map("sparsemax")(x)
torch.testing.assert_close(torch.compile(others, backend="eager", fullgraph=True)(x), others(x), rtol=1e-14, atol=1e-15)
print("ok")
"""


def test_the_built_in_maps_first_called_inside_a_compiled_function():
    """The built-in maps are built when numeric.torch is imported, and get_map of a built-in name returns them: a
    compiled function that calls a map first is one graph (building a map loads and checks its module, which dynamo
    cannot trace), and so is a float32 map's backward whose alpha gradient meets the float64 operations first."""
    run = subprocess.run([sys.executable, "-c", _FIRST_CALL], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_maps_with_a_sink_compile_to_one_graph_and_equal_eager(typed):
    """softmax, sparsemax and the typed gini_log1p with a sink per row (each map's own autograd Function on the
    scores and the sink: softmax traced as the rules, the others solved on the longer rows) compile to one graph;
    p and the gradients in the scores and the sink equal eager's, on rows with a masked score and a fully masked
    one."""
    maps = [get_map("softmax"), get_map("sparsemax"), typed[0]]
    x = hard_scores(torch.float64)[[0, 1, 2, 5, 6]]
    b = torch.tensor([[0.3], [2.0], [0.5], [-1.0], [40.0]], dtype=torch.float64)
    w = torch.randn(5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(4))

    def f(x, b):
        return [m(x, sink=b) for m in maps]

    runs = []
    for g in (f, torch.compile(f, backend="aot_eager", fullgraph=True)):
        xs, bs = x.clone().requires_grad_(), b.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (torch's own tracing warnings; see pytestmark)
            ps = g(xs, bs)
            runs.append((ps, torch.autograd.grad(sum((p * w).sum() for p in ps), (xs, bs))))
    (pe, ge), (pc, gc) = runs
    for a, e in zip([*pc, *gc], [*pe, *ge]):
        torch.testing.assert_close(a, e, rtol=TOL[torch.float64][0], atol=TOL[torch.float64][1])
    assert all(bool((p[2] == 0).all()) and bool((p.sum(-1) <= 1 + 8 * torch.finfo(p.dtype).eps).all()) for p in pc)


def test_compiled_arcsinh_is_asinh_to_two_ulps():
    """The ``arcsinh`` printed routines call under ``torch.compile`` (one log1p where inductor's asinh takes two) is
    mpmath's asinh to 2 ulps in float32 and float64, from subnormal to the largest finite arguments of both signs,
    and keeps asinh's zeros, infinities and NaN."""
    import mpmath
    import numpy as np

    from numeric.torch.maps import TORCH_AS_NUMPY

    rng = np.random.default_rng(3)
    mags = np.concatenate([10.0 ** rng.uniform(-44, 38.5, 300), 2.0 ** np.arange(55, 66), rng.uniform(0, 3, 100)])
    xs = np.concatenate([mags, -mags])
    f = torch.compile(TORCH_AS_NUMPY.arcsinh, fullgraph=True)
    for dtype, ftype in ((torch.float32, np.float32), (torch.float64, np.float64)):
        x = torch.tensor(xs.astype(ftype))
        got = f(x).numpy()
        with mpmath.workdps(40):
            want = np.array([float(mpmath.asinh(mpmath.mpf(float(v)))) for v in x.numpy()]).astype(ftype)
        ulps = np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(want)).astype(np.float64)
        assert ulps.max() <= 2, (dtype, x.numpy()[ulps.argmax()], got[ulps.argmax()], want[ulps.argmax()])
        edge = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan], dtype=dtype)
        out = f(edge)
        assert out[0] == 0 and not out[0].signbit() and out[1] == 0 and out[1].signbit(), out
        assert out[2] == math.inf and out[3] == -math.inf and out[4].isnan(), out


def test_a_printed_transcendental_link_compiles_and_equals_eager(torch_user_modules):
    """``cosh(p) - 1`` (link ``asinh``, solved by Halley on the printed link) compiled (fullgraph) equals eager on
    the hard rows, p and the gradients: compiled, its link runs the one-log1p arcsinh above."""
    write_user_module("cosh(p) - 1", "cosh_one", torch_user_modules)
    importlib.invalidate_caches()
    cosh_one = get_map(importlib.import_module("cosh_one"))

    def fn(x, alpha):
        return [cosh_one(x) + 0 * alpha.sum()]

    dtypes = (torch.float32, torch.float64) if THOROUGH else (torch.float32,)
    _compare(fn, "aot_eager", dtypes, ["cosh_one"] * len(dtypes))
