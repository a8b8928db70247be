"""The row kernels' forward pass is :func:`numeric.core.rules.solve` traced into CUDA (``derive.codegen.trace_rows``).

Checked here: the kernels (compiled for the host, one thread per block) give NumPy's ``p`` and ``tau`` to 1e-13 in
float64 for every test map, typed maps included, on rows long enough for every rule's rounds; each kind of map
takes the solve its struct names; the tracer's rules (a read of a row written over, a sort, a loop per score are
errors; a loop that reads the value per score it carries keeps it in the output row); the host rules the trace
needs (the sort maps' rounds without a sort, the KKT solve's last step to sum 1).
"""

from __future__ import annotations

import ctypes
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import numeric
from derive import Regularizer, derive_map, generate_module
from derive.codegen import trace_print as TRP
from derive.codegen import trace_rows as TRR
from derive.codegen.files import load_module
from numeric.core import rules
from numeric.core.ops import Routines
from numeric.contract import module_routines
from numeric.numpy.ops import NumpyRowOps

from .test_codegen import ALL_MAPS, module_for
from .test_kernels_host import PARAMS, _kernel, _ptr

#: the solve each test map's struct names
SOLVER_OF = {"softmax": "closed", "sparsemax": "sort_linear", "entmax15": "sort_square", "entmax_sparse": "root_power",
             "entmax_dense": "root_link", "sigmoid": "root_link",
             "shannon_gini": "kkt_dense", "cube": "root_power", "quartic": "kkt"}


def kernel_forward(name, x):
    """``(p, tau)`` of the map's ``forward_rows`` kernel (host, one thread per block) on float64 rows ``x``."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    p, tau = np.full_like(x, 7.0), np.full(x.shape[0], 7.0)
    params = [float(v) for v in PARAMS.get(name, {}).values()]
    _kernel(name, "forward_rows", "f64")(_ptr(x, ctypes.c_double), _ptr(p, ctypes.c_double),
                                          _ptr(tau, ctypes.c_double), x.shape[0], x.shape[1], *params)
    return p, tau


def numpy_forward(name, x):
    return numeric.Map(module_for(name), **PARAMS.get(name, {})).forward(np.asarray(x, dtype=np.float64))


@pytest.mark.parametrize("name", ALL_MAPS)
def test_each_map_takes_its_solve(name):
    src = module_for(name).CUDA_DEVICE_SOURCE
    assert f"static constexpr rg_solver solver = RG_SOLVE_{SOLVER_OF[name].upper()};" in src


rows = hnp.arrays(np.float64, st.tuples(st.integers(1, 6), st.sampled_from([1, 2, 7, 40, 130])),
                  elements=st.one_of(st.floats(-8, 8), st.just(-math.inf)))


@pytest.mark.parametrize("name", ALL_MAPS)
@settings(deadline=None)
@given(x=rows, scale=st.sampled_from([0.05, 1.0, 6.0]))
def test_kernels_give_numpys_p_and_tau(name, x, scale):
    """The kernels run the algorithm NumPy runs: the same ``p`` to 1e-13 (the sums' order differs), the same
    ``tau`` to 1e-13 of the scores' scale, on masked, fully masked and NaN rows too."""
    x = x * scale
    x[-1, 0] = np.nan if x.shape[0] > 2 else x[-1, 0]
    p, tau = kernel_forward(name, x)
    want, want_tau = numpy_forward(name, x)
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-13)
    finite = np.isfinite(want_tau)
    assert np.array_equal(np.isnan(tau), np.isnan(want_tau)) and np.array_equal(tau[~finite], want_tau[~finite], equal_nan=True)
    scale_of = np.max(np.abs(np.where(np.isfinite(x), x, 0)), axis=-1) + 1
    # tau is found to the rounding of F = sum p over F's slope sum w(p): 1 where p is spread, small where omega's
    # domain ends at 1 and the largest p nears it (the sigmoid's rows far apart)
    with np.errstate(all="ignore"):
        slope = np.sum(np.where(want > 0, module_for(name).weight(np.where(want > 0, want, 0.5), *PARAMS.get(name, {}).values()), 0), axis=-1)
    bound = 1e-13 * scale_of + 4 * np.finfo(np.float64).eps / np.where(slope > 0, slope, np.inf)
    assert np.all(np.abs(tau[finite] - want_tau[finite]) <= bound[finite])


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "quartic", "shannon_gini", "entmax_sparse",
                                  "entmax_dense"])
def test_kernels_on_long_rows(name):
    """Rows of 3000 scores: the sort maps' rounds and the KKT solve's rounds over many scores per thread."""
    x = np.random.default_rng(7).standard_normal((4, 3000)) * np.array([[0.1], [1.0], [3.0], [10.0]])
    p, tau = kernel_forward(name, x)
    want, want_tau = numpy_forward(name, x)
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-13)
    np.testing.assert_allclose(tau, want_tau, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", ALL_MAPS)
def test_kernel_jvp_is_numpys(name):
    """The JVP kernel is :func:`numeric.core.derivatives.jvp` traced: NumPy's ``J v`` to 1e-13, a NaN row NaN."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 70)) * np.array([[0.1], [1.0], [4.0], [1.0], [1.0]])
    x[3, 20:] = -np.inf
    x[4, 3] = np.nan
    p, _ = numpy_forward(name, x)
    v = rng.standard_normal(x.shape)
    out = np.full_like(p, 7.0)
    params = [float(q) for q in PARAMS.get(name, {}).values()]
    ptr = [_ptr(np.ascontiguousarray(a), ctypes.c_double) for a in (p, v, out)]
    _kernel(name, "jvp", "f64")(*ptr, x.shape[0], x.shape[1], *params)
    want = numeric.Map(module_for(name), **PARAMS.get(name, {})).jvp(p, v)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-13 * (1 + np.nanmax(np.abs(want))))
    assert np.isnan(out[4]).all() and np.isnan(want[4]).all()


def test_root_link_kernel_is_numpys(tmp_path):
    """A root map with a printed link not of the power form (``p**2/2 + p**3/3``: ``g(z) = (sqrt(1 + 4z) - 1)/2``)
    takes the ``root_link`` solve (safeguarded Halley): the kernel gives NumPy's ``p`` to 1e-13."""
    name = "quad_cubic"
    path = tmp_path / f"{name}.py"
    path.write_text(generate_module(derive_map(Regularizer.from_string("p**2/2 + p**3/3", name=name)), name))
    module = load_module(path)
    assert "RG_SOLVE_ROOT_LINK;" in module.CUDA_DEVICE_SOURCE
    from derive.codegen.compilers import host_kernels

    fn = getattr(host_kernels(module.CUDA_SOURCE, name), f"{name}_forward_rows_f64")
    dp = ctypes.POINTER(ctypes.c_double)
    fn.argtypes = [dp, dp, dp, ctypes.c_longlong, ctypes.c_longlong]
    x = np.random.default_rng(4).standard_normal((6, 90)) * np.array([[0.05], [0.5], [1.0], [3.0], [10.0], [1.0]])
    x[5, 30:] = -np.inf
    p, tau = np.full_like(x, 7.0), np.full(6, 7.0)
    fn(*(_ptr(a, ctypes.c_double) for a in (x, p, tau)), 6, 90)
    want, want_tau = numeric.Map(module).forward(x)
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-13)
    np.testing.assert_allclose(tau, want_tau, rtol=1e-13, atol=1e-13)


# ----------------------------------------------------------------- the tracer
def test_a_read_of_a_row_written_over_is_an_error():
    tr = TRR.RowTracer()
    first = tr.store(tr.scores * 2)
    tr.store(first + 1)
    with pytest.raises(TRR.TraceError, match="written over"):
        tr.row_sum(first)


def test_a_sort_is_an_error():
    tr = TRR.RowTracer()
    with pytest.raises(TRR.TraceError, match="sort"):
        tr.sort_desc(tr.scores)


def test_a_loop_per_score_is_an_error():
    tr = TRR.RowTracer()
    with pytest.raises(TRR.TraceError, match="per score"):
        tr.repeat(3, lambda s: (s, s[0] > 0), (tr.scores,), tr.scores > 0)


def test_a_loop_that_reads_its_value_per_score_keeps_it_in_the_output_row():
    """``p`` halved three times: the loop reads the ``p`` it carries, so it lives in ``pr`` between rounds; a value
    the loop only writes stays an expression (no store in its rounds)."""
    tr = TRR.RowTracer()
    (p,) = tr.repeat(3, lambda s: ((s[0] * 0.5,), True), (tr.scores,), True)
    text = "\n".join(tr.lines)
    assert p.buffer is not None and text.count("pr[j] = ") == 2  # the start, and each round's
    tr2 = TRR.RowTracer()
    q, _ = tr2.repeat(3, lambda s: ((tr2.scores * s[1], s[1] + 1), True), (tr2.full(tr2.scores, 0.0), 1.0), True)
    assert q.buffer is None and "pr[j]" not in "\n".join(tr2.lines)


def test_reductions_in_a_row_share_a_loop_and_are_compensated():
    tr = TRR.RowTracer()
    a = tr.row_sum(tr.scores)
    b = tr.row_max(tr.scores * 2)
    tr.let(f"{a.text} + {b.text}")
    text = "\n".join(tr.lines)
    assert text.count("for (long long j") == 1
    assert f"rg_add_compensated({a.text}, {a.text}_c," in text and f"rg_block_sum({a.text} - {a.text}_c" in text


def test_a_reduction_of_a_queued_one_waits_for_it():
    tr = TRR.RowTracer()
    f = tr.row_sum(tr.scores)
    tr.row_sum(tr.scores / f)
    tr.flush()
    assert "\n".join(tr.lines).count("for (long long j") == 2


def test_prune_drops_what_nothing_reads():
    lines = ["    T v1 = T(0);", "    T v2 = T(0);", "    v1 = T(3.0);", "    v2 = v1 * T(2.0);",
             "    for (long long j = threadIdx.x; j < cols; j += blockDim.x) {", "        const T e3 = sr[j] - v1;",
             "    }", "    tau = v1;"]
    assert TRP.prune(lines) == ["    T v1 = T(0);", "    v1 = T(3.0);", "    tau = v1;"]


def test_solver_for_every_kind():
    assert TRR.solver_for("closed", None, "closed", "exp", None, True).name == "closed"
    assert TRR.solver_for("sort", 1, "closed", "power", 1.0, False).name == "sort_linear"
    assert TRR.solver_for("sort", 2, "closed", "power", 2.0, False).name == "sort_square"
    assert TRR.solver_for("sort", 2, "closed", "general", None, False).name == "sort_link_quadratic"
    assert TRR.solver_for("root", None, "closed", "power", None, False).name == "root_power"
    assert TRR.solver_for("root", None, "closed", "general", None, False).name == "root_link"
    assert TRR.solver_for("root", None, "newton", "general", None, False).name == "kkt"
    assert TRR.solver_for("root", None, "newton", "general", None, True).name == "kkt_dense"


# ------------------------------------------------ the host rules the trace needs
class UnsortedOps(NumpyRowOps):
    """NumPy without sorting, as device code: the sort maps' open rows take the support at the root rule's tau."""

    sorts = False


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_support_rule_without_a_sort(name):
    """With no rounds (every row open), the support at the root rule's threshold gives the sorted rule's tau."""
    mod = module_for(name)
    r = Routines(mod, module_routines(mod), ())
    y = np.random.default_rng(2).standard_normal((50, 37)) * 2
    y[3, 5:] = -np.inf
    y = y - y.max(-1, keepdims=True)
    got = rules.support_rule(UnsortedOps(np.float64), r, y, steps=0)
    want = rules.sort_rule(NumpyRowOps(np.float64), r, y)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-14)


def test_kkt_step_to_sum_one_at_a_kink(tmp_path):
    """``p**12 + p**13`` on a row with a score just inside the support (``p = 0.066``, ``w`` 5e8 times the others'):
    its ``p`` is fixed by the sum, not by its flat ``omega'``.  Dividing by the sum spread its rounding over
    the row (6.4e-10 off the reference); the step in the threshold keeps the others to 1e-12 of their weights."""
    d = derive_map(Regularizer.from_string("p**12 + p**13", name="power12_13"))
    path = tmp_path / "power12_13.py"
    path.write_text(generate_module(d, "power12_13"))
    module = load_module(path)
    x = np.random.default_rng(3).standard_normal((60, 6))[36:37] * 0.1
    p = numeric.Map(module)(x)[0]
    want = np.array([float(v) for v in d.evaluate(x[0].tolist(), digits=60)])
    w = np.sort(1 / (132 * want[want > 0] ** 10 + 156 * want[want > 0] ** 11))
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-12 * max(1.0, float(w[:-1].sum())))


# ------------------------------------------------ device functions
def _functions(source):
    """``{name: (parameters, body, origin)}`` of every ``__device__`` function of ``source`` (``origin``: the
    comment above it, the Python function it comes from)."""
    found = re.finditer(r"// ([^\n]*)\ntemplate <[^>\n]*>\n__device__ void (\w+)\((.*?)\) \{\n(.*?)\n\}", source, re.S)
    return {m.group(2): (m.group(3), m.group(4), m.group(1)) for m in found}


def _reached(functions, name):
    """The device functions ``name`` calls, directly or not."""
    seen, stack = set(), [name]
    while stack:
        for callee in re.findall(r"\b(rg_\w+)<", functions[stack.pop()][1]):
            if callee in functions and callee not in seen:
                seen.add(callee)
                stack.append(callee)
    return seen


def test_a_helper_shared_by_solvers_is_printed_once():
    """A function of numeric.core that several solves meet with the same text is one device function they call:
    ``threshold_round`` (a round of the bracketed solves) once, its loop's rounds reached from the Halley solves of
    five kinds of map (a printed link's first round, whose state starts as constants, traces a text of its own);
    the KKT rounds' safeguard (free for the first steps) once for the sparse and the dense KKT solve; no two device
    functions have the same text."""
    source = TRR.rows_solve_source()
    assert source.count("__device__ void rg_threshold_round(") == 1
    functions = _functions(source)
    solvers = {"sort_link", "sort_link_quadratic", "root_link", "kkt", "kkt_dense"}
    shared = [name for name in functions if name.startswith("rg_threshold_round")
              and solvers <= {s.name for s in TRR.SOLVERS if name in _reached(functions, f"rg_solve_{s.name}")}]
    assert len(shared) == 1, shared
    kkt = _reached(functions, "rg_solve_kkt") & _reached(functions, "rg_solve_kkt_dense")
    assert any(functions[f][2] == "numeric.newton.safeguarded_point" for f in kkt)
    texts = [(params, body) for params, body, _ in functions.values()]
    assert len(texts) == len(set(texts))


def test_device_functions_are_named_after_their_python_functions():
    """Each device function but the solves' own is a function of numeric.core or numeric.newton, named after it."""
    functions = _functions(TRR.rows_solve_source())
    modules = {m.__name__: m for m in TRR.TRACED_MODULES}
    helpers = {name: origin for name, (_, _, origin) in functions.items()
               if not name.startswith(("rg_solve_", "rg_jvp_"))}
    assert len(helpers) > 20
    for name, origin in helpers.items():
        module, function = origin.rsplit(".", 1)
        assert callable(getattr(modules[module], function))
        assert re.fullmatch(rf"rg_{function.lstrip('_')}(_\d+)?", name), (name, origin)


def test_the_trace_leaves_numeric_as_it_was():
    """The trace binds the traced modules' functions to its own while it runs, and gives them back, also where it
    fails."""
    before = {(m.__name__, n): f for m in TRR.TRACED_MODULES for n, f in vars(m).items() if callable(f)}
    TRR.trace_solver(TRR.SOLVERS[0])
    with pytest.raises(TypeError):  # (a sort map without tau_candidate)
        TRR.trace_solver(TRR.Solver("broken", "sort", "other", ("link",)))
    after = {(m.__name__, n): f for m in TRR.TRACED_MODULES for n, f in vars(m).items() if callable(f)}
    assert before.keys() == after.keys() and all(before[k] is after[k] for k in before)


def _scaled_sum(ops, x, t):
    s = ops.row_sum(x * t)
    u = s * 0.5
    return u + 1, s - 1, x * u


def test_a_device_function_takes_what_it_reads_and_gives_what_is_read():
    """A per-score argument is passed as the row-wide values it reads and evaluated over ``sr`` in the function; a
    per-score result is evaluated by the caller from the row-wide values it reads (returned); a result nothing reads
    is not returned; locals are declared where they are assigned."""
    tr = TRR.RowTracer()
    t = tr.let("T(2.0)")
    t2 = tr.let(f"{t.text} * {t.text}")
    a, _, e = tr.device_call(_scaled_sum, (tr, tr.scores - t, t2), {})
    tr.store(e)
    printer = TRP.Printer()
    body = TRP.declare(printer.body(tr, [tr.indent + d for d in tr.decls] + tr.lines + [f"    tau = {a.text};"],
                                     keep=("tau",)))
    (function,) = printer.functions
    assert "__device__ void rg_scaled_sum(const T* sr, long long cols, T* shared, T x_0, T t, T& ret0, T& ret1) {" \
        in function
    assert "const T e2 = sr[j] - x_0;" in function and "ret1 = v4;" in function and "T(1.0)" in function
    assert "T(-1.0)" not in function and " - T(1.0)" not in function  # (s - 1: read by nobody)
    assert body[:3] == ["    const T v1 = T(2.0);", "    const T v2 = v1 * v1;", "    T v3 = T(0);"]
    assert "    rg_scaled_sum<T>(sr, cols, shared, v1, v2, v3, v5);" in body
    assert "        const T e7 = e6 * v5;" in body and body[-1] == "    tau = v3;"


def test_locals_are_declared_where_they_are_used():
    """A local assigned in a loop and read only there is declared at its assignment; one read after the loop just
    before it."""
    lines = ["    T v1 = T(0);", "    T v2 = T(0);", "    bool go3 = false;", "    go3 = true;",
             "    for (int i4 = 0; i4 < 3 && go3; ++i4) {", "        v1 = T(2.0);", "        v2 = v1 * v1;",
             "        go3 = v2 < T(1.0);", "    }", "    tau = v2;"]
    assert TRP.declare(lines) == [
        "    bool go3 = true;", "    T v2 = T(0);", "    for (int i4 = 0; i4 < 3 && go3; ++i4) {",
        "        const T v1 = T(2.0);", "        v2 = v1 * v1;", "        go3 = v2 < T(1.0);", "    }", "    tau = v2;"]
