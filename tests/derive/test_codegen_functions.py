"""The functions generated code calls: one table (derive.codegen.functions) that every printer spells, and typed maps
whose derived routines need each function, generated and checked in NumPy and CUDA against 50-digit references.

* every spelling of :data:`~derive.codegen.functions.FUNCTIONS` exists in its target: NumPy, torch and JAX (which
  run the NumPy text with ``numpy`` bound to their namespace), the CUDA prelude (float and double), Triton
  (``triton.language`` or :mod:`numeric.kernels.triton_math`); each printer prints the table's spelling;
* a function no target can compute is refused when the code is generated, naming it (before, ``erfc`` printed as
  ``math.erfc``, which fails on arrays when it runs);
* :data:`PRINTED_MAPS`: regularizers whose ``omega'``, ``omega''``, weight or link need ``sinh``, ``cosh``,
  ``tanh``, ``asinh``, ``acosh``, ``atanh``, ``asin``, ``acos``, ``atan``, ``tan``, ``sin``, ``cos``, ``erf``;
  each map's NumPy routines and CUDA device functions (g++ for the host, float and double) within
  :data:`derive.codegen.verify.TOLERANCE` of the SymPy expressions at 50 digits, its CUDA source compiled by
  NVRTC, its probabilities equal to derive's mpmath reference (KKT at 30 digits).  The fused Triton kernels run
  the same maps in tests/triton/test_printed_functions.py.

The ci profile takes :data:`CI_MAPS`; the thorough one the whole table.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy as sp
from sympy.codegen.cfunctions import expm1, log1p

from derive import DerivationError, Regularizer, derive_map
from derive import reference as R
from derive.codegen import generate_module
from derive.codegen import verify as V
from derive.codegen.compilers import host_library, nvrtc_available, nvrtc_compile
from derive.codegen.files import load_module
from derive.codegen.functions import FUNCTIONS, TRITON_HELPERS, check_functions
from derive.codegen.printers import CudaPrinter, PyPrinter, TritonPrinter, print_block
from derive.regularizers import p
from tests.profile import THOROUGH

ROOT = Path(__file__).resolve().parents[2]

#: name -> (regularizer as text, or a SymPy expression where the text parser lacks the function; the functions
#: its generated Triton source calls, beyond exp, log, sqrt and powers)
PRINTED_MAPS = {
    # dense, link by Newton: sinh in omega', cosh in omega'' and the weight (issue 43, item 9)
    "cosh_shannon": ("p*log(p) + cosh(p)", {"rg_sinh", "rg_cosh"}),
    # sparse with a closed link log(z + sqrt(z**2 + 1)), printed as asinh(z); weight 1/cosh(p)
    "cosh_sparse": ("cosh(p)", {"rg_asinh", "rg_sinh", "rg_cosh"}),
    "logcosh_shannon": ("p*log(p) + log(cosh(p))", {"rg_tanh"}),
    "asinh_sparse": ("p*asinh(p) - sqrt(1 + p**2)", {"rg_asinh"}),
    "atan_sparse": ("p*atan(p) - log(1 + p**2)/2", {"rg_atan"}),
    "erf_shannon": ("p*log(p) + p*erf(p)", {"tl.erf"}),
    "tan_shannon": ("p*log(p) + tan(p)", {"rg_tan"}),
    "sin_shannon": ("p*log(p) + sin(p)", {"tl.cos", "tl.sin"}),
    "atanh_shannon": (p * sp.log(p) + p * sp.atanh(p / 2), {"rg_atanh"}),
    "asin_shannon": (p * sp.log(p) + p * sp.asin(p / 2), {"rg_asin"}),
    "acos_shannon": (p * sp.log(p) - p * sp.acos(p / 2), {"rg_acos"}),
    "acosh_shannon": (p * sp.log(p) + p * sp.acosh(p + 2), {"rg_acosh"}),
}
#: the maps the ci profile runs: the issue's and the closed asinh link
CI_MAPS = ["cosh_shannon", "cosh_sparse"]
MAPS = list(PRINTED_MAPS) if THOROUGH else CI_MAPS


def regularizer(name: str) -> Regularizer:
    omega = PRINTED_MAPS[name][0]
    return Regularizer.from_string(omega, name=name) if isinstance(omega, str) else Regularizer(omega, name=name)


@lru_cache(maxsize=None)
def derivation(name: str):
    return derive_map(regularizer(name))


@lru_cache(maxsize=None)
def module(name: str, folder: str):
    path = Path(folder) / f"{name}.py"
    path.write_text(generate_module(derivation(name), name))
    return load_module(path, prefix="_regattn_test_")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(tmp_path_factory.mktemp("printed_maps"))


# ------------------------------------------------------------------ the table
def test_every_spelling_exists_in_its_target():
    """NumPy's, torch's and JAX's namespaces have every NumPy name; the CUDA prelude declares every ``rg_*`` name
    for float and double; Triton has every Triton name, in ``triton.language`` or numeric.kernels.triton_math."""
    namespaces = {"numpy": np}
    try:
        from numeric.torch.maps import TORCH_AS_NUMPY

        namespaces["torch"] = TORCH_AS_NUMPY
    except ImportError:
        pass
    try:
        import jax.numpy as jnp

        namespaces["jax"] = jnp
    except ImportError:
        pass
    prelude = (ROOT / "numeric" / "kernels" / "prelude.cuh").read_text()
    for name, spelled in FUNCTIONS.items():
        if spelled.numpy != "erf":  # bound by each framework (numeric.special.erf for NumPy)
            for which, namespace in namespaces.items():
                assert callable(getattr(namespace, spelled.numpy, None)), (which, name, spelled.numpy)
        for ctype in ("float", "double"):
            assert re.search(rf"\b{ctype} {spelled.cuda}\({ctype} x\)", prelude), (name, spelled.cuda, ctype)
    triton = pytest.importorskip("triton")
    del triton
    import triton.language as tl

    from numeric.kernels import triton_math

    for name, spelled in FUNCTIONS.items():
        if spelled.triton.startswith("tl."):
            assert callable(getattr(tl, spelled.triton[3:], None)), (name, spelled.triton)
        else:
            assert spelled.triton in TRITON_HELPERS and spelled.triton in triton_math.__all__, (name, spelled.triton)


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_printers_spell_the_table(name):
    f = {"expm1": expm1, "log1p": log1p}.get(name) or getattr(sp, name)
    spelled = FUNCTIONS[name]
    x = sp.Symbol("x", real=True)
    numpy_name = "erf" if spelled.numpy == "erf" else f"numpy.{spelled.numpy}"
    for printer, want in ((PyPrinter(), numpy_name), (TritonPrinter(), spelled.triton), (CudaPrinter(), spelled.cuda)):
        assert printer.doprint(f(x)) == f"{want}(x)", (name, type(printer).__name__)


@pytest.mark.parametrize("expr", [sp.erfc(p), sp.gamma(p), sp.loggamma(p + 1), sp.erfinv(p / 2), sp.sinc(p),
                                  sp.floor(p), sp.Max(p, 1 - p), sp.Function("f")(p), sp.acot(p), sp.LambertW(p)],
                         ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("printer", [PyPrinter, TritonPrinter, CudaPrinter], ids=lambda c: c.__name__)
def test_unknown_functions_are_refused_when_generated(expr, printer):
    """A function outside the table is refused by every printer, naming it, before any code is written."""
    name = type(expr).__name__
    with pytest.raises(DerivationError, match=rf"{name}\b"):
        print_block(printer(), [p * expr + p**2], "omega_prime(...)")
    with pytest.raises(DerivationError, match=rf"{name}\b"):
        printer().doprint(p * expr)


@pytest.mark.parametrize(("f", "g"), [(sp.sec, sp.cos), (sp.csc, sp.sin), (sp.cot, sp.tan), (sp.sech, sp.cosh),
                                      (sp.csch, sp.sinh), (sp.coth, sp.tanh)], ids=lambda f: f.__name__)
def test_reciprocal_functions_print_as_reciprocals(f, g):
    """``sec(u)`` prints as ``1/cos(u)`` and so on (SymPy's simplification may write them), with its value."""
    assigns, (text,) = print_block(PyPrinter(), [f(p + 1) * p], "weight(...)")
    assert not assigns and f"numpy.{FUNCTIONS[g.__name__].numpy}(" in text, text
    got = eval(text, {"numpy": np, "p": 0.3})  # noqa: S307 - our own printed text
    with mpmath.workdps(30):
        want = sp.lambdify([p], f(p + 1) * p, "mpmath")(mpmath.mpf("0.3"))
    assert abs(got - float(want)) <= 1e-15 * abs(float(want))


def test_check_functions_names_the_function_and_the_alternatives():
    with pytest.raises(DerivationError, match=r"contains the function erfc \(erfc\(p\)\).*NumPy, CUDA C and Triton"):
        check_functions(p + sp.erfc(p), "omega_prime(...)")


# ------------------------------------------------------------------ maps that need each function
@pytest.mark.parametrize("name", MAPS)
def test_printed_map_calls_its_functions(name, folder):
    """The Triton source calls the functions the derivation needs, and imports each helper it calls."""
    text = module(name, folder).TRITON_SOURCE
    called = set(re.findall(r"\b(rg_\w+|tl\.\w+)\(", text))
    assert PRINTED_MAPS[name][1] <= called, (name, called)
    helpers = {h for h in called if h in TRITON_HELPERS}
    imported = re.search(r"from numeric\.kernels\.triton_math import (.*)", text)
    assert not helpers or (imported and helpers <= set(imported.group(1).split(", "))), (helpers, imported)


@pytest.mark.parametrize("name", MAPS)
def test_printed_map_numpy_and_device_functions_match_reference(name, folder):
    """Every NumPy routine and CUDA device function (host build, float and double) of the map within the verify
    tolerance of its SymPy expression at 50 digits (scaled by the condition number)."""
    dv, mod = derivation(name), module(name, folder)
    points = 12 if THOROUGH else 6
    numpy_report = V.check(dv, lambda f, args, params: float(np.asarray(getattr(mod, f)(
        *[np.array([a]) for a in args], *params)).reshape(-1)[0]), "double", f"numpy {name}", points=points)
    assert numpy_report.ok, numpy_report
    fns = {f: len(args) + len(mod.PARAMETERS) for f, (_, args) in V.functions(dv).items()}
    lib = host_library(mod.CUDA_DEVICE_SOURCE, name, fns)
    for ctype in ("double", "float"):
        report = V.check(dv, lambda f, args, params: lib[ctype][f](*args, *params), ctype, f"{ctype} {name}",
                         points=points)
        assert report.ok, report


@pytest.mark.skipif(not nvrtc_available(), reason="cuda-bindings / nvidia-cuda-nvrtc not installed")
@pytest.mark.parametrize("name", MAPS)
def test_printed_map_cuda_source_compiles_with_nvrtc(name, folder):
    result = nvrtc_compile(module(name, folder).CUDA_SOURCE, "compute_80")
    assert result.ok, result.log


#: maps whose omega' is not real for large p (asin(p/2) past p = 2): derive.reference's Newton link first checks
#: omega'(e**WIDEN_STEPS) against z and fails comparing a complex number (numeric's maps are right: the KKT test)
REFERENCE_OUTSIDE_DOMAIN = {"atanh_shannon", "asin_shannon", "acos_shannon"}
ROWS = np.array([[0.3, -1.2, 2.0, 0.0, 0.7], [5.0, 4.9, -3.0, 0.1, 0.2], [0.0, 0.0, 0.0, 1e-3, -1e-3]])


@pytest.mark.parametrize("name", MAPS)
def test_printed_map_probabilities_satisfy_kkt(name, folder):
    """The NumPy map's probabilities (float64) satisfy the KKT conditions at 30 digits: they sum to 1 and
    ``s_i - omega'(p_i)`` is one value ``tau`` over the support (a sparse map: ``s_i - tau <= omega'(0+)`` off it)."""
    import numeric as nm

    dv = derivation(name)
    got = nm.get_map(module(name, folder))(ROWS)
    omega_prime = sp.lambdify([p], dv.omega_prime, "mpmath")
    with mpmath.workdps(30):
        for row, p_row in zip(ROWS, got):
            assert abs(mpmath.fsum(mpmath.mpf(float(v)) for v in p_row) - 1) <= 1e-15
            live = p_row > 0
            taus = [mpmath.mpf(float(s)) - omega_prime(mpmath.mpf(float(q))) for s, q in zip(row[live], p_row[live])]
            assert max(taus) - min(taus) <= 1e-12 * (1 + abs(taus[0])), (name, row, taus)
            if dv.sparse:
                clip = float(dv.clip)
                assert all(float(s - taus[0]) <= clip + 1e-12 for s in row[~live]), (name, row)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    n in REFERENCE_OUTSIDE_DOMAIN, reason="derive.reference evaluates omega' past its real domain", strict=True))
    for n in MAPS])
def test_printed_map_probabilities_match_the_mpmath_reference(name, folder):
    """The NumPy map's probabilities (float64) against derive's reference solution of the KKT conditions."""
    import numeric as nm

    got = nm.get_map(module(name, folder))(ROWS)
    for row, p_row in zip(ROWS, got):
        want = R.evaluate(derivation(name), row.tolist(), digits=30)
        np.testing.assert_allclose(p_row, [float(v) for v in want], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("expr", [sp.log(sp.cosh(p)), sp.log(sp.cos(p)), p * sp.log(p) + sp.log(sp.cosh(p))],
                         ids=["log-cosh", "log-cos", "logcosh_shannon-omega"])
def test_log_of_a_function_near_one_keeps_its_digits(expr):
    """``log(cosh(p))`` is ``p**2/2`` near 0 while ``cosh(p)`` rounds to 1: printed as ``log1p(2 sinh(p/2)**2)``
    it keeps float32's digits (as written it kept none at p = 1e-6, and logcosh_shannon's omega lost 5e-6
    relative at p = 1e-4)."""
    assigns, (text,) = print_block(PyPrinter(), [expr], "omega(...)")
    f = sp.lambdify([p], expr, "mpmath")
    for x in (1e-6, 1e-4, 3e-4, 1e-2, 0.5, 1.0):
        scope = {"numpy": np, "p": np.float32(x)}
        for lhs, rhs in assigns:
            scope[lhs] = eval(rhs, scope)  # noqa: S307 - our own printed text
        got = eval(text, scope)  # noqa: S307
        assert isinstance(got, np.float32), type(got)
        with mpmath.workdps(30):
            want = f(mpmath.mpf(float(np.float32(x))))
        assert abs(got - want) <= 8 * 2.0**-24 * abs(want), (expr, x, got, want)


def test_constants_print_as_values():
    """``sqrt(pi)`` prints as its value, not as ``sqrt`` of a temporary holding ``pi`` (a Python float, which
    torch.sqrt refuses), and Triton prints ``pi`` and ``e`` as literals (triton.language has neither): erf's
    derivative ``2 exp(-p**2)/sqrt(pi)`` failed on torch and in Triton."""
    expr = 2 * p * sp.exp(-p**2) / sp.sqrt(sp.pi) + sp.pi * p + sp.E * p
    for printer in (PyPrinter(), TritonPrinter(), CudaPrinter()):
        assigns, (text,) = print_block(printer, [expr], "omega_prime(...)")
        assert not assigns and "sqrt" not in text and "tl.pi" not in text and "tl.e*" not in text, text
    torch = pytest.importorskip("torch")
    from numeric.torch.maps import TORCH_AS_NUMPY

    _, (text,) = print_block(PyPrinter(), [expr], "omega_prime(...)")
    x = torch.tensor([1e-3, 0.5, 1.0], dtype=torch.float64)
    got = eval(text, {"numpy": TORCH_AS_NUMPY, "p": x})  # noqa: S307 - our own printed text
    want = [float(expr.subs(p, v).evalf(30)) for v in x.tolist()]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-15)


@pytest.mark.parametrize("name", MAPS)
def test_printed_map_runs_on_torch_and_jax(name, folder):
    """The map's routines run on torch and JAX arrays (the NumPy text with ``numpy`` bound to their namespace)
    and give NumPy's probabilities in float64."""
    import numeric as nm

    mod = module(name, folder)
    want = nm.get_map(mod)(ROWS)
    torch = pytest.importorskip("torch")
    from numeric import torch as rt

    np.testing.assert_allclose(rt.get_map(mod)(torch.tensor(ROWS)).numpy(), want, rtol=1e-12, atol=1e-15)
    jax = pytest.importorskip("jax")
    from numeric import jax as rj

    with jax.enable_x64(True):
        np.testing.assert_allclose(np.asarray(rj.get_map(mod)(jax.numpy.asarray(ROWS))), want, rtol=1e-12, atol=1e-15)
