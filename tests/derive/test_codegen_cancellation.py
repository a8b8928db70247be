"""Sums that cancel where the generated functions are evaluated, and a verdict that names what a failure affects.

``omega(p) = cosh(p) - 1`` is ``p**2/2`` to leading order while its terms are 1:
printed as SymPy writes it, it keeps no digit below ``p = 1e-8`` in double
(and below ``3e-4`` in float), although the map, which uses only
``omega' = sinh``, is exact.  The printer finds such sums by their series at
the points of evaluation (``p`` near 0 and 1, ``z`` near ``omega'(0+)``) and
rewrites them by an identity or by a series switch
(:func:`derive.codegen.rewrite.stable_form`).  Here: which sums are found,
that every rewrite is an identity (to the switch's truncation, 2**-56), that
the generated NumPy functions and the g++-built device functions keep their
digits (a few ulps times ``1 + kappa``) in float64 and float32 where the
naive forms lose them, that ``regattn verify`` passes on the three
regularizers of the issue, and that a verify which fails on ``omega`` says
the loss is affected and the map is not.
"""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st
from sympy.codegen.cfunctions import expm1

from derive import Regularizer, derive_map
from derive.cli import main
from derive.codegen import generate_module, printers, rewrite
from derive.codegen.compilers import host_library
from derive.codegen.files import load_module
from derive.codegen.pipeline import Failure, Lost, verdict, verify_map
from derive.codegen.rewrite import Select, cancelling_points, series_switch, stable_form
from derive.regularizers import alpha, p, z
from numeric import contract

_MPMATH = [{"Select": lambda c, a, b: a if c >= 0 else b, "log1p": mpmath.log1p, "expm1": mpmath.expm1}, "mpmath"]


# ------------------------------------------------------------ which sums cancel, and where
@pytest.mark.parametrize("expr, point", [
    (sp.cosh(p) - 1, (p, 0)),
    (1 - sp.cos(p), (p, 0)),
    (sp.exp(p) - 1 - p, (p, 0)),
    (p - sp.log(1 + p), (p, 0)),
    (sp.sqrt(1 + p) - 1, (p, 0)),
    (1 - 1 / (1 + p), (p, 0)),
    (sp.sinh(p) - p, (p, 0)),
    ((1 + p) * sp.log(1 + p) - p, (p, 0)),
    (p * sp.log(p) - p + 1, (p, 1)),  # (p - 1)**2/2: a double zero at 1
    (sp.exp(z) - 1 - z, (z, 0)),
], ids=str)
def test_cancelling_sums_are_found(expr, point):
    assert point in cancelling_points(expr)


@pytest.mark.parametrize("expr", [
    p**2 / 2 + p,
    p * sp.log(p) + p,  # the sum is of the order of its largest term at 0
    sp.log(p) + 1,
    sp.Rational(4, 3) * p ** sp.Rational(3, 2) - sp.Rational(4, 3) * p,  # entmax15: a simple zero at 1 is as
    p**2 / 2 - p / 2,  # ill-conditioned as the cancellation it causes, so it does not count
    z + sp.Rational(1, 2),
    p**alpha - p,  # a symbolic exponent: SymPy cannot order the terms (the power rewrite handles it)
], ids=str)
def test_other_sums_are_not(expr):
    assert cancelling_points(expr) == []


# ------------------------------------------------------------ every rewrite is an identity
#: regularizer-like sums that cancel at p = 0 or 1, and what their stable form must hold
REWRITES = {
    "cosh(p) - 1": sp.sinh,
    "1 - cos(p)": sp.sin,
    "3*cosh(2*p) - 3 + p": sp.sinh,
    "exp(p) - 1 - p": Select,
    "exp(-p) - 1 + p": Select,
    "alpha*(exp(alpha*p) - 1 - alpha*p)": Select,
    "p - log(1 + p)": Select,
    "p**2/2 + p - log(1 + p)": Select,
    "sinh(p) - p": Select,
    "p*log(p) - p + 1": Select,
    "(1 + p)*log(1 + p) - p": Select,
    "sqrt(1 + p) - 1": None,
    "1 + p - sqrt(1 + 2*p)": None,
    "1 - 1/(1 + p)": None,
}


def _parse(text: str) -> sp.Expr:
    return sp.sympify(text, locals={"p": p, "alpha": alpha})


@pytest.mark.parametrize("text", list(REWRITES))
@given(x=st.one_of(st.floats(1e-12, 1.0), st.floats(1.0, 20.0)), a=st.floats(0.1, 3.0))
def test_rewrite_is_an_identity(text, x, a):
    """At 60 digits, on both sides of a series switch: the switch's polynomial to 2**-55 relative, the rest exactly."""
    expr = _parse(text)
    stable = stable_form(expr)
    assert stable != expr and not stable.has(sp.cosh, sp.cos), stable
    if REWRITES[text] is not None:
        assert stable.has(REWRITES[text]), stable
    tolerance = 2.0**-55 if stable.has(Select) else 1e-45
    with mpmath.workdps(60):
        args = (mpmath.mpf(x), mpmath.mpf(a))
        want = sp.lambdify([p, alpha], expr, "mpmath")(*args)
        got = sp.lambdify([p, alpha], stable, _MPMATH)(*args)
        assert abs(got - want) <= tolerance * abs(want) + mpmath.mpf(10) ** -55, (stable, x, a)


@pytest.mark.parametrize("text", list(REWRITES))
def test_no_cancelling_sum_is_left_where_it_is_evaluated(text):
    """Outside the direct branches of series switches (used only away from the point), no sum cancels."""
    def sums(e):
        if isinstance(e, Select):
            yield from sums(e.args[1])
            return
        if e.is_Add:
            yield e
        for a in e.args:
            yield from sums(a)

    stable = stable_form(_parse(text))
    assert [s for s in sums(stable) if cancelling_points(s)] == [], stable


def test_phi_switch_hands_over_where_the_direct_form_keeps_its_digits():
    """``expm1(u) - u``: the polynomial below |u| = 1, the direct form (at most 4.5 times the rounding) above."""
    u = sp.Symbol("u", real=True)
    r, poly, amplification = series_switch(expm1(u) - u, u, 0)
    assert r == 1 and amplification <= rewrite.SWITCH_GOOD
    assert sp.Poly(poly, rewrite._H).degree() <= rewrite.SWITCH_TERMS


def test_a_sum_without_a_usable_series_is_left_alone():
    """``tanh(p) - p``: its series converges too slowly (radius pi/2) where the difference stops cancelling."""
    assert cancelling_points(sp.tanh(p) - p) and stable_form(sp.tanh(p) - p) == sp.tanh(p) - p


def test_stable_form_is_idempotent():
    for text in REWRITES:
        once = stable_form(_parse(text))
        assert stable_form(once) == once, text


@pytest.mark.parametrize("printer", [printers.PyPrinter, printers.TritonPrinter], ids=["numpy", "triton"])
@pytest.mark.parametrize("text", ["exp(p) - 1 - p", "p - log(1 + p)", "p*log(p) - p + 1", "1 + p - sqrt(1 + 2*p)"])
def test_every_python_printer_prints_the_switch(printer, text):
    """The NumPy text, and the Triton text run on NumPy arrays (``tl.where``, ``tl.abs``; ``rg_expm1`` and
    ``rg_log1p`` the helpers of numeric.kernels.triton_math), on both sides of the switch, within 4 eps of the
    60-digit value."""
    tl = SimpleNamespace(**{n: getattr(np, n) for n in ("where", "abs", "exp", "log", "sqrt")})
    ns = {"numpy": np, "tl": tl, "rg_expm1": np.expm1, "rg_log1p": np.log1p}
    expr = _parse(text)
    assigns, (result,) = printers.print_block(printer(), [expr], text)
    xs = np.geomspace(1e-9, 3.0, 40)
    ns["p"] = xs
    exec("\n".join(f"{lhs} = {rhs}" for lhs, rhs in assigns), ns)
    got = eval(result, ns)
    with mpmath.workdps(60):
        want = [sp.lambdify(p, expr, "mpmath")(mpmath.mpf(float(x))) for x in xs]
        errors = [float(abs(g - w) / abs(w)) for g, w in zip(got, want)]
    assert max(errors) <= 4 * EPS["double"], (result, max(errors))


# ------------------------------------------------------------ generated code keeps its digits
#: valid regularizers (strictly convex on (0, 1]) whose omega cancels as SymPy writes it
REGULARIZERS = {
    "coshm1": "cosh(p) - 1",
    "expm1p": "exp(p) - 1 - p",
    "plog1p": "p - log(1 + p)",
    "onecos": "1 - cos(p)",
    "sinhp": "sinh(p) - p",
    "mixlog": "p**2/2 + p - log(1 + p)",
    "xlogx": "p*log(p) - p + 1",  # cancels near p = 1
    "xlog1p": "(1 + p)*log(1 + p) - p",
    "sqrtp": "1 + p - sqrt(1 + 2*p)",
}
#: where the naive forms lose digits: p down to 1e-9, and up to 1e-7 below 1
POINTS = np.concatenate([np.geomspace(1e-9, 1.0, 37), 1 - np.geomspace(1e-7, 0.5, 15)])
#: relative error allowed, in units of the type's epsilon times 1 + kappa (the function's condition number)
ULPS = 4
EPS = {"double": float(np.finfo(np.float64).eps), "float": float(np.finfo(np.float32).eps)}


@lru_cache(maxsize=None)
def _folder() -> Path:
    path = Path(tempfile.mkdtemp(prefix="regattn-cancel-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@lru_cache(maxsize=None)
def _derivation(name: str):
    return derive_map(Regularizer.from_string(REGULARIZERS[name], name=name))


@lru_cache(maxsize=None)
def _module(name: str):
    path = _folder() / f"{name}.py"
    path.write_text(generate_module(_derivation(name), name))
    return load_module(path, prefix="_regattn_cancel_")


@lru_cache(maxsize=None)
def _device(name: str):
    return host_library(_module(name).CUDA_DEVICE_SOURCE, name, {"omega": 1, "omega_prime": 1}, _folder())


@pytest.mark.parametrize("name", list(REGULARIZERS))
@pytest.mark.parametrize("ctype", ["double", "float"])
@pytest.mark.parametrize("fname", ["omega", "omega_prime"])
def test_generated_functions_keep_their_digits(name, ctype, fname):
    """NumPy (on float64 and float32 arrays) and g++ device code within 4 eps (1 + kappa) of the 50-digit value."""
    dv = _derivation(name)
    expr = dv.omega if fname == "omega" else dv.omega_prime
    exact_fn = sp.lambdify(p, expr, "mpmath")
    slope_fn = sp.lambdify(p, sp.diff(expr, p), "mpmath")
    dtype = np.float64 if ctype == "double" else np.float32
    numpy_fn, device_fn = getattr(_module(name), fname), _device(name)[ctype][fname]
    bad = []
    for x in POINTS.astype(dtype):
        with mpmath.workdps(50):
            xm = mpmath.mpf(float(x))
            exact = exact_fn(xm)
            if exact == 0:
                continue
            kappa = abs(xm * slope_fn(xm) / exact)
        for where, got in (("numpy", numpy_fn(np.array([x], dtype=dtype))), ("device", device_fn(float(x)))):
            if where == "numpy":
                assert got.dtype == dtype
                got = float(got[0])
            error = float(abs(mpmath.mpf(got) - exact) / abs(exact) / (1 + kappa)) / EPS[ctype]
            if not error <= ULPS:
                bad.append(f"{where} {fname}({float(x)!r}) = {got!r}, exact {mpmath.nstr(exact, 17)}: "
                           f"{error:.3g} eps (1 + kappa)")
    assert not bad, f"{REGULARIZERS[name]}: " + "; ".join(bad[:5])


# ------------------------------------------------------------ regattn verify on the regularizers
@pytest.mark.parametrize("expr", ["cosh(p) - 1", "exp(p) - 1 - p", "p - log(1 + p)"])
def test_verify_passes_on_regularizers_whose_omega_cancels(expr, capsys):
    assert main(["verify", "--expr", expr, "--samples", "3", "--points", "40"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "verdict      all checks passed"


# ------------------------------------------------------------ the verdict names what is affected
def _lost(where: str, ctype: str, digits: float) -> Lost:
    return Lost("loss", "omega", ctype, where, digits, "p = 1.2e-06")


def test_verdict_of_a_loss_that_cancels_in_float32():
    failures = [Failure(f"omega (float, {w}) exceeds its bound", scope, ("loss",), (_lost(w, "float", 4.9),))
                for w, scope in (("device (g++)", "float"), ("torch", "torch float"))]
    assert verdict(failures) == (
        "FAIL: omega (float, device (g++)) exceeds its bound; omega (float, torch) exceeds its bound; "
        "the map and its JVP are within tolerance; the Fenchel-Young loss (omega) loses up to 4.9 digits in float32 "
        "near p = 1.2e-06 (device (g++), torch): compute the loss in float64")


def test_verdict_of_a_loss_that_cancels_in_float64():
    failures = [Failure("omega (double, numpy) exceeds its bound", "all", ("loss",), (_lost("numpy", "double", 4.8),)),
                Failure("omega (float, jax) exceeds its bound", "jax float", ("loss",), (_lost("jax", "float", 7.3),))]
    text = verdict(failures)
    assert "do not use the map" not in text
    assert text.endswith("; the map and its JVP are within tolerance; the Fenchel-Young loss (omega) loses up to 4.8 "
                         "digits in float64 near p = 1.2e-06 (numpy) and all its digits in float32 near p = 1.2e-06 "
                         "(jax): do not use the loss")


def test_verdict_of_the_map_and_a_part():
    """A failure of the map's own routines decides where it is usable; the JVP is named on its own."""
    jvp = Lost("JVP", "weight", "float", "torch", 2.5, "p = 0.3")
    failures = [Failure("weight, link (float, torch) exceed their bound", "torch float", ("JVP", "map"), (jvp,)),
                Failure("omega_prime_d_alpha (double, jax) exceeds its bound", "jax", ("gradient in alpha",),
                        (Lost("gradient in alpha", "omega_prime_d_alpha", "double", "jax", 3.0, "p = 0.5"),))]
    assert verdict(failures).endswith(
        "; the map is usable in NumPy and with CuPy on a GPU, with torch in float64 only; "
        "the JVP (weight) loses up to 2.5 digits in float32 near p = 0.3 (torch): compute the JVP in float64 with torch; "
        "the gradient in alpha (omega_prime_d_alpha) loses up to 3.0 digits in float64 near p = 0.5 (jax): "
        "do not compute the gradient in alpha with jax")
    assert verdict([("x", "all"), failures[0]]).endswith("; do not use the map")


def test_verify_of_a_cancelling_omega_names_the_loss(monkeypatch):
    """cosh(p) - 1 printed as SymPy writes it (the rewrites of cancelling sums switched off): omega fails in both
    types, everywhere, and the verdict says the map and its JVP are fine and the loss is not."""
    monkeypatch.setattr(rewrite, "_cancelling_sum", lambda expr, points: expr)
    rewrite._stable.cache_clear()
    try:
        result = verify_map(derive_map(Regularizer.from_string("cosh(p) - 1")), "coshm1", samples=3, points=40)
    finally:
        monkeypatch.undo()
        rewrite._stable.cache_clear()
    assert not result.ok
    assert {f.parts for f in result.failures} == {("loss",)}
    text = result.verdict()
    checks = ", ".join(["device (g++)"] + [t for t in contract.FRAMEWORKS if importlib.util.find_spec(t)])
    assert "do not use the map" not in text and "; the map and its JVP are within tolerance; " in text, text
    assert "the Fenchel-Young loss (omega) loses up to " in text and " in float32 near p = " in text, text
    assert text.endswith(f"({checks}): do not use the loss"), text
