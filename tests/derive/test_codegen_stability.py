"""Generated code for closed forms that cancel in floating point, and for extreme constants.

SymPy's closed-form links can hold differences of nearly equal values: the root
``z/2 + sqrt(z**2 + c)/2`` of a quadratic for ``z`` very negative,
``log(z + sqrt(z**2 + 1))`` (omega = cosh), ``exp(z) - 1`` and ``log(1 + z)``
near 0.  The printed code must still meet the verify bound
``tol * (1 + kappa)`` (``kappa`` the condition number of the function; 1e-13
in double, 1e-6 in float) against the 50-digit SymPy value.  Constants beyond
the range of a literal must print as correct floating literals, or be refused
with an error naming them.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from derive import DerivationError, Regularizer, derive_map
from derive.codegen import generate_module
from derive.codegen import verify as V
from derive.codegen.files import load_module
from derive.codegen.compilers import host_library, nvrtc_available, nvrtc_compile
from derive.codegen.printers import CudaPrinter, PyPrinter, print_block
from derive.regularizers import p, z
from numeric.kernels import cuda_file

#: user maps whose closed-form links cancel as SymPy writes them
CANCELLING = {
    "cosh": "cosh(p)",  # link log(z + sqrt(z**2 + 1)) = asinh(z)
    "quadlog": "p**2/2 - log(p)/10",  # link z/2 + sqrt(25*z**2 + 10)/10
    "explin": "exp(p) - p",  # link log(z + 1) = log1p(z)
    "xlogx1": "(1 + p)*log(1 + p) - p",  # link exp(z) - 1 = expm1(z)
}
#: the maps whose every generated function must pass verify in both types
VERIFIED = ["cosh", "quadlog", "explin", "xlogx1"]
LINK_FUNCTIONS = ["link", "link_dtau", "link_dtau2"]
TOL = {"double": 1e-13, "float": 1e-6}


@lru_cache(maxsize=None)
def folder() -> Path:
    """A folder of this process for the generated modules, removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="regattn-stability-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def write_module(dv, name: str):
    path = folder() / f"{name}.py"
    path.write_text(generate_module(dv, name))
    return load_module(path, prefix="_regattn_stability_")


@lru_cache(maxsize=None)
def derivation(name: str):
    return derive_map(Regularizer.from_string(CANCELLING[name], name=name))


@lru_cache(maxsize=None)
def module(name: str):
    return write_module(derivation(name), name)


@lru_cache(maxsize=None)
def device(name: str):
    fns = {fname: len(args) for fname, (_, args) in V.functions(derivation(name)).items()}
    return host_library(module(name).CUDA_DEVICE_SOURCE, name, fns)


def _numpy_call(name):
    mod = module(name)

    def call(fname, xs, ps):
        out = getattr(mod, fname)(*[np.array([x]) for x in xs], *ps)
        return float(np.broadcast_to(np.asarray(out, dtype=np.float64), (1,))[0])

    return call


# ------------------------------------------------------ the verify check
@pytest.mark.parametrize("name", VERIFIED)
def test_cancelling_link_maps_pass_verify(name):
    """What `regattn verify --expr` checks: every function, NumPy and device (double, float)."""
    dv = derivation(name)
    reports = [V.check(dv, _numpy_call(name), "double", "numpy", points=40)]
    for ctype in ("double", "float"):
        lib = device(name)[ctype]
        reports.append(V.check(dv, lambda f, xs, ps, lib=lib: lib[f](*xs, *ps), ctype, "device", points=40))
    for report in reports:
        assert report.ok, f"{report.where} {report.ctype}: {report.worst}"


# ------------------------------------------- the link far into its tails
@st.composite
def link_argument(draw, name: str, ctype: str):
    """``z = omega'(p0)`` with ``p0`` log-uniform in [1e-8, 1]: the tail where SymPy's forms cancel."""
    p0 = sp.Float(10.0 ** draw(st.floats(-8.0, 0.0)), 30)
    value = float(derivation(name).omega_prime.subs(p, p0))
    return float(np.float32(value)) if ctype == "float" else value


def _check_link_function(name, fname, ctype, where, got_fn, zz):
    want, kappa = V.exact_value(derivation(name), fname, [zz], [])
    assume(want is not None and V.representable(want, ctype) and TOL[ctype] * kappa < 1)
    got = got_fn(zz)
    err = V.scaled_error(got, want, kappa)
    assert err <= TOL[ctype], (
        f"{where} {ctype} {name}.{fname}({zz!r}) = {got!r}, exact {mpmath.nstr(want, 17)}, "
        f"kappa {mpmath.nstr(kappa, 3)}: scaled error {err:.3g} > {TOL[ctype]}"
    )


@pytest.mark.parametrize("name", list(CANCELLING))
@pytest.mark.parametrize("fname", LINK_FUNCTIONS)
@given(data=st.data())
def test_numpy_link_is_stable(name, fname, data):
    zz = data.draw(link_argument(name, "double"))
    fn = getattr(module(name), fname)
    _check_link_function(name, fname, "double", "numpy", lambda x: float(fn(np.array([x]))[0]), zz)


@pytest.mark.parametrize("name", list(CANCELLING))
@pytest.mark.parametrize("fname", LINK_FUNCTIONS)
@pytest.mark.parametrize("ctype", ["double", "float"])
@given(data=st.data())
def test_device_link_is_stable(name, fname, ctype, data):
    zz = data.draw(link_argument(name, ctype))
    _check_link_function(name, fname, ctype, "device", device(name)[ctype][fname], zz)


@pytest.mark.parametrize("name", list(CANCELLING))
def test_numpy_link_keeps_float32(name):
    d1 = sp.lambdify([p], derivation(name).omega_prime)
    zz = np.array([d1(q) for q in (1e-6, 1e-3, 0.3, 1.0)], dtype=np.float32)
    for fname in LINK_FUNCTIONS:
        assert getattr(module(name), fname)(zz).dtype == np.float32, fname


@pytest.mark.skipif(not nvrtc_available(), reason="cuda-bindings / nvidia-cuda-nvrtc not installed")
@pytest.mark.parametrize("name", list(CANCELLING))
def test_cancelling_link_maps_compile_with_nvrtc(name):
    result = nvrtc_compile(module(name).CUDA_SOURCE, "compute_80")
    assert result.ok, result.log


def test_device_functions_call_log1p_and_expm1_only_where_they_cancel():
    """The maps' own device functions (after the package's prelude, which defines rg_log1p and rg_expm1 for
    every map) call them where the sums cancel, and cosh's do not."""
    prelude = cuda_file("prelude.cuh")
    own = {n: module(n).CUDA_DEVICE_SOURCE for n in ("explin", "xlogx1", "cosh")}
    assert all(text.startswith(prelude) for text in own.values())
    own = {n: text[len(prelude):] for n, text in own.items()}
    assert "rg_log1p(z)" in own["explin"] and "rg_expm1(z)" in own["xlogx1"]
    assert "rg_log1p" not in own["cosh"] and "rg_expm1" not in own["cosh"]
    assert "double rg_log1p(double x)" in prelude and "double rg_expm1(double x)" in prelude


def test_stable_generation_is_deterministic_across_hash_seeds():
    code = (
        "import sys; from derive import Regularizer, derive_map; from derive.codegen import generate_module; "
        f"sys.stdout.write(''.join(generate_module(derive_map(Regularizer.from_string(e, name='m')), 'm') for e in {list(CANCELLING.values())!r}))"
    )
    outs = []
    for seed in ("0", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.append(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)
    assert outs[0] == outs[1] and "numpy.arcsinh(z)" in outs[0] and "numpy.where(" in outs[0]


# ------------------------------------- the whole map in float32, scores x 100
EPS32 = float(np.finfo(np.float32).eps)


@given(
    scores=hnp.arrays(np.float32, st.integers(2, 24), elements=st.floats(-3.0, 3.0, width=32)),
    scale=st.sampled_from([1.0, 10.0, 100.0]),
)
def test_quadlog_map_in_float32_is_accurate_on_small_weights(scores, scale):
    """p*(s) for omega = p**2/2 - log(p)/10 in float32: every p_i to 8 eps32 (1 + kappa_i).

    ``kappa_i = sum_j |s_j J_ij| / p_i`` is the condition number of ``p_i`` in the
    scores, ``J = diag(w) - w w^T / sum(w)`` with ``w = 1/omega''(p)`` (exact values).
    With scores times 100 most weights are ~1e-3 and come from the link's tail.
    """
    import numeric as nm

    s = (scores * np.float32(scale)).astype(np.float32)
    got = nm.get_map(module("quadlog"))(s[None, :])[0]
    assert got.dtype == np.float32
    dv = derivation("quadlog")
    with mpmath.workdps(50):
        exact = dv.evaluate([float(v) for v in s], digits=50)
        w = [1 / dv.omega_second.subs(p, sp.Float(q, 50)).evalf(50) for q in exact]
        w = [mpmath.mpf(str(v)) for v in w]
        total = mpmath.fsum(w)
        for i, want in enumerate(exact):
            row = [(w[i] if i == j else 0) - w[i] * w[j] / total for j in range(len(s))]
            kappa = mpmath.fsum(abs(mpmath.mpf(float(s[j])) * row[j]) for j in range(len(s))) / want
            err = abs(mpmath.mpf(float(got[i])) - want) / want
            assert err <= 8 * EPS32 * (1 + kappa), (
                f"p[{i}] = {got[i]!r}, exact {mpmath.nstr(want, 10)}: relative error {mpmath.nstr(err, 3)} "
                f"> 8 eps32 (1 + kappa), kappa = {mpmath.nstr(kappa, 3)}; scores {s.tolist()}"
            )


# ---------------------------------------------------------- big constants
def test_integers_beyond_literal_range_print_as_floating_literals():
    cu, py = CudaPrinter(), PyPrinter()
    big = sp.Integer(2 * 10**20)
    assert cu.doprint(big * z) == "T(2e+20)*z"
    assert cu.doprint(sp.Integer(2**31 - 1) * z) == "2147483647*z"
    assert py.doprint(sp.Integer(10**300) * z) == "1e+300*z"
    assert py.doprint(sp.Integer(2**53) * z) == f"{2**53}*z"
    assert cu.doprint(sp.Rational(1, 3 * 10**20) * z) == f"(T({1 / 3e20!r}))*z"
    assert py.doprint(sp.Rational(10**400 + 1, 10**399) * z) == "(10.0)*z"


def test_big_constant_map_compiles_and_passes_verify():
    """omega = 1e20 p**2: the sort threshold holds S_1 - 2e20; g++ rejected the integer literal."""
    dv = derive_map(Regularizer.from_string("p**2 * 1e20", name="big"))
    mod = write_module(dv, "big")
    fns = {fname: len(args) for fname, (_, args) in V.functions(dv).items()}
    lib = host_library(mod.CUDA_DEVICE_SOURCE, "big", fns)
    for ctype in ("double", "float"):
        report = V.check(dv, lambda f, xs, ps, c=ctype: lib[c][f](*xs, *ps), ctype, "device", points=20)
        assert report.ok, report.worst

    def call(fname, xs, ps):
        return float(np.broadcast_to(np.asarray(getattr(mod, fname)(*[np.array([x]) for x in xs], *ps), dtype=np.float64), (1,))[0])

    report = V.check(dv, call, "double", "numpy", points=20)
    assert report.ok, report.worst


def test_numeric_function_constants_print_as_values():
    """omega = exp(3) p**2: omega'' = 2 exp(3) is a number (a TypeError while printing it before)."""
    dv = derive_map(Regularizer.from_string("exp(3)*p**2", name="e3"))
    mod = write_module(dv, "e3")
    assert "rg_exp(3)" not in mod.CUDA_SOURCE  # C cannot pick an rg_exp overload for an int
    want = 2 * mpmath.exp(3)
    assert abs(mod.omega_second(np.array([0.5]))[0] - want) <= 1e-15 * want
    fns = {fname: len(args) for fname, (_, args) in V.functions(dv).items()}
    lib = host_library(mod.CUDA_DEVICE_SOURCE, "e3", fns)
    assert abs(lib["double"]["omega_second"](0.5) - want) <= 1e-15 * want


@pytest.mark.parametrize("expr, constant", [("exp(1000)*p**2", "exp(1000)"), ("exp(-1000)*p**2", "exp(-1000)")])
def test_constants_outside_float64_are_refused_by_name(expr, constant):
    """The regularizer or, at the latest, the printer refuses the map with an error naming the constant."""
    with pytest.raises(DerivationError, match=rf"constant {re.escape(constant)} "):
        generate_module(derive_map(Regularizer.from_string(expr, name="huge")), "huge")


@pytest.mark.parametrize("constant", [sp.exp(1000), sp.exp(-800), sp.Integer(10) ** 400, sp.Float("1e-320")])
@pytest.mark.parametrize("printer", [PyPrinter, CudaPrinter])
def test_printer_refuses_constants_outside_float64(constant, printer):
    with pytest.raises(DerivationError, match=rf"(?i)constant {re.escape(str(constant))} = .*outside the float64 range"):
        print_block(printer(), [constant * z + 1], "f(z)")


# --------------------------------------------------- the rewrites themselves
_x = sp.Symbol("x", real=True)
_a = sp.Symbol("a", positive=True)
REWRITTEN = [
    _x / 2 + sp.sqrt(25 * _x**2 + 10) / 10,
    _x - sp.sqrt(_x**2 + 3),
    2 - _x - sp.sqrt((_x - 2) ** 2 + _a),
    -3 * _x + sp.sqrt(9 * _x**2 + _a),
    sp.log(_x + sp.sqrt(_x**2 + 1)),
    sp.log(2 * _x + sp.sqrt(4 * _x**2 + _a)),
    sp.exp(_x) - 1,
    3 - 3 * sp.exp(_a * _x),
    sp.log(1 + _a * _x**2),
    1 - _x + sp.sqrt(_x**2 + _x * _a),
]
_MPMATH = [{"Select": lambda c, a, b: a if c >= 0 else b, "log1p": mpmath.log1p, "expm1": mpmath.expm1}, "mpmath"]


@pytest.mark.parametrize("expr", REWRITTEN, ids=str)
@given(x=st.floats(-1e6, 1e6), a=st.floats(0.01, 100.0))
def test_stable_form_is_an_identity(expr, x, a):
    from derive.codegen.rewrite import stable_form

    stable = stable_form(expr)
    assert stable != expr
    with mpmath.workdps(60):
        want = sp.lambdify([_x, _a], expr, "mpmath")(mpmath.mpf(x), mpmath.mpf(a))
        got = sp.lambdify([_x, _a], stable, _MPMATH)(mpmath.mpf(x), mpmath.mpf(a))
        assert abs(got - want) <= mpmath.mpf(10) ** -45 * (1 + abs(want)), (stable, x, a)


@pytest.mark.parametrize("expr", [(3 * _x + 4) ** 2 / 36, sp.exp(_x - 1), _x + sp.sqrt(_x), sp.sqrt(_x**2 + _x) + _x**3])
def test_stable_form_leaves_other_forms_alone(expr):
    from derive.codegen.rewrite import stable_form

    assert stable_form(expr) == expr


# ------------------------------------------- differences of powers with a symbolic exponent
def _power_differences():
    from derive.regularizers import alpha

    return [p**alpha - p, alpha * p**alpha - p, (alpha * p**alpha - p) / (alpha * p * (alpha - 1)),
            (p - p**alpha) / (alpha * (alpha - 1))]


@pytest.mark.parametrize("index", range(4))
@given(x=st.floats(1e-9, 1.0), a=st.floats(1.0001, 20.0))
def test_power_difference_is_an_identity(index, x, a):
    """``T1 + T2 -> -T2 expm1(log(-T1/T2))`` at 60 digits; the rewrite takes place."""
    from derive.codegen.rewrite import stable_form
    from derive.regularizers import alpha

    expr = _power_differences()[index]
    stable = stable_form(expr)
    assert stable.has(sp.Function("expm1")) or "expm1" in str(stable)
    with mpmath.workdps(60):
        want = sp.lambdify([p, alpha], expr, "mpmath")(mpmath.mpf(x), mpmath.mpf(a))
        got = sp.lambdify([p, alpha], stable, _MPMATH)(mpmath.mpf(x), mpmath.mpf(a))
        assert abs(got - want) <= mpmath.mpf(10) ** -45 * (1 + abs(want)), (stable, x, a)


@lru_cache(maxsize=None)
def _tsallis_device():
    from derive import tsallis
    from derive.regularizers import alpha

    dv = derive_map(tsallis(alpha))
    fns = {fname: len(args) + 1 for fname, (_, args) in V.functions(dv).items()}
    return dv, host_library(write_module(dv, "tsallis_near_one").CUDA_DEVICE_SOURCE, "tsallis_near_one", fns)


@pytest.mark.parametrize("fname", ["omega", "omega_prime"])
@pytest.mark.parametrize("a", [1.001, 1.01, 1.05, 1.2])
def test_tsallis_near_alpha_one_in_float32(fname, a):
    """omega and omega' of alpha-entmax as SymPy writes them, ``(alpha p**alpha - p)/(alpha p (alpha - 1))``,
    cancel in float32 near alpha = 1 (``alpha p**(alpha - 1)`` is within 1% of 1): 1.6e-5 relative at
    p = 0.342, alpha = 1.05, where the condition number is 14.  The printed ``expm1`` form meets
    the verify bound."""
    dv, lib = _tsallis_device()
    a32 = float(np.float32(a))
    for x in np.geomspace(1e-6, 1.0, 60).astype(np.float32):
        want, kappa = V.exact_value(dv, fname, [float(x)], [a32])
        if want is None or not V.representable(want, "float") or TOL["float"] * kappa >= 1:
            continue
        got = lib["float"][fname](float(x), a32)
        assert V.scaled_error(got, want, kappa) <= TOL["float"], (fname, float(x), a32, got, want)


# ------------------------------------------------------------- the array module as a setting
def test_the_array_module_is_a_printer_setting():
    """A printer for another NumPy-like module is a subclass that sets ``_module``: no ``numpy.`` is left."""
    x, a = sp.symbols("x a", positive=True)
    y = sp.Symbol("y", real=True)

    class XPrinter(PyPrinter):
        _module = "xp"

    e = (sp.sqrt(x) * sp.cbrt(x + 1) + x**a + sp.exp(x) + sp.log(x) + sp.tanh(x) + 3 * sp.exp(a * x) - 3
         + sp.log(1 + x * a) + sp.pi * x + sp.atan(x))
    e2 = -3 * y + sp.sqrt(9 * y**2 + a)  # a sign select of its conjugate form
    assigns, (result, result2) = print_block(XPrinter(), [e, e2], "e")
    text = " ".join([result, result2] + [rhs for _, rhs in assigns])
    assert "numpy" not in text
    for name in ("xp.sqrt", "xp.cbrt", "xp.power", "xp.exp", "xp.log", "xp.tanh", "xp.log1p", "xp.expm1", "xp.pi", "xp.arctan",
                 "xp.where"):
        assert name in text, name
    ns = {"xp": np, "x": 0.7, "a": 1.3, "y": -0.4}
    exec("\n".join(f"{lhs} = {rhs}" for lhs, rhs in assigns), ns)
    assert eval(result, ns) == pytest.approx(float(e.subs({x: 0.7, a: 1.3})), rel=1e-14)
    assert eval(result2, ns) == pytest.approx(float(e2.subs({a: 1.3, y: -0.4})), rel=1e-14)
    assert "numpy.exp" in print_block(PyPrinter(), [sp.exp(x)], "e")[1][0]
