"""The math helpers of numeric.kernels.triton_math, run in Triton's interpreter, against NumPy in float64.

Every helper the printers call in place of a function Triton lacks (derive.codegen.functions.FUNCTIONS) is
tested here: within a few float32 roundings of the float64 value on its domain, from tiny arguments (where
``sinh``, ``tanh``, ``asinh``, ``atan`` are their argument and a naive form cancels) to the ends of float32's range,
and exactly at infinities and NaN.

``tl.where`` evaluates both of its branches: a helper's guarded branch must not divide 0 by 0 where the other is
taken (the interpreter runs on NumPy and turns that into an error; a map's traced link inversion calls the helpers on
every entry of a block, arguments near 0 included).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from .conftest import interpreter_reason

pytestmark = pytest.mark.skipif(interpreter_reason() is not None, reason=str(interpreter_reason()))

if interpreter_reason() is None:
    import torch
    import triton
    import triton.language as tl

    from numeric.kernels import triton_math as tm

    @triton.jit
    def _apply(X, Y, N: tl.constexpr, WHICH: tl.constexpr):
        offs = tl.arange(0, N)
        x = tl.load(X + offs)
        if WHICH == 0:
            y = tm.rg_log1p(x)
        elif WHICH == 1:
            y = tm.rg_expm1(x)
        elif WHICH == 2:
            y = tm.rg_cbrt(x)
        elif WHICH == 3:
            y = tm.rg_tan(x)
        elif WHICH == 4:
            y = tm.rg_sinh(x)
        elif WHICH == 5:
            y = tm.rg_cosh(x)
        elif WHICH == 6:
            y = tm.rg_tanh(x)
        elif WHICH == 7:
            y = tm.rg_asinh(x)
        elif WHICH == 8:
            y = tm.rg_acosh(x)
        elif WHICH == 9:
            y = tm.rg_atanh(x)
        elif WHICH == 10:
            y = tm.rg_asin(x)
        elif WHICH == 11:
            y = tm.rg_acos(x)
        else:
            y = tm.rg_atan(x)
        tl.store(Y + offs, y)


X = np.array([0.0, 1e-30, -1e-30, 1e-9, -1e-9, 6e-8, 1e-4, -1e-4, 0.5, -0.5, 1.0, 3.0, 30.0, -30.0, 1e3, 5e-8],
             np.float32)


@pytest.mark.parametrize(("which", "truth"), [(0, np.log1p), (1, np.expm1), (2, np.cbrt)], ids=["log1p", "expm1", "cbrt"])
def test_helpers_match_numpy_without_invalid_operations(which, truth):
    x = X if which != 0 else X[X > -1]
    x = np.concatenate([x, np.zeros(16 - x.size % 16 if x.size % 16 else 0, np.float32)])
    y = torch.empty(x.size, dtype=torch.float32)
    with warnings.catch_warnings():
        # a 0/0 in a branch tl.where discards is an error here (an overflow to inf or log(0) = -inf is not)
        warnings.filterwarnings("error", message="invalid value")
        with np.errstate(invalid="raise", over="ignore", divide="ignore"):
            _apply[(1,)](torch.from_numpy(x), y, N=x.size, WHICH=which)
    with np.errstate(over="ignore"):  # expm1(1000) is inf in float64 too
        want = truth(x.astype(np.float64))
    # a few float32 roundings relative to the value (Kahan's forms are accurate near 0 as well)
    np.testing.assert_allclose(y.numpy(), want, rtol=4 * 2.0**-24 * 4, atol=0)


def _run(which, x):
    """The helper ``which`` on the float32 values ``x`` (padded to a power of 2 with 1, a point of every domain)."""
    x = np.asarray(x, np.float32)
    n = 1 << max(4, (x.size - 1).bit_length())
    padded = np.concatenate([x, np.ones(n - x.size, np.float32)])
    y = torch.empty(n, dtype=torch.float32)
    with warnings.catch_warnings():
        # no 0/0, overflow, or log(0) in a branch tl.where discards; the taken branch may overflow to inf, as the
        # function does (sinh(100) in float32), or divide by 0 at a pole (atanh(1))
        warnings.filterwarnings("error", message="invalid value")
        with np.errstate(invalid="raise", over="ignore", divide="ignore"):
            _apply[(1,)](torch.from_numpy(padded), y, N=n, WHICH=which)
    return y.numpy()[: x.size]


_RNG = np.random.default_rng(43)
_WIDE = np.concatenate([_RNG.standard_normal(40) * 3, 10.0 ** _RNG.uniform(-30, 1.5, 30), [
    0.0, 1e-30, 1e-9, 6e-8, 1e-4, 0.5, 1.0, 19.9, 20.0, 20.5, 30.0, 50.0, 88.0, 89.0, 1e3, 3e8, 2.0**28, 3e38]])
_WIDE = np.concatenate([_WIDE, -_WIDE])
_UNIT = np.concatenate([_RNG.uniform(-1, 1, 60), [0.0, 1e-30, -1e-30, 1e-9, 1e-4, 0.5, -0.5, 0.999, -0.999,
                                                  1 - 2.0**-24, -1 + 2.0**-24, 1.0, -1.0]])
_ABOVE_ONE = np.concatenate([1 + np.abs(_RNG.standard_normal(40)) * 3, 10.0 ** _RNG.uniform(0, 38, 40),
                             [1.0, 1 + 2.0**-23, 1.5, 2.0, 3e8, 2.0**28, 2.0**29, 3e38]])
#: helper -> (index in _apply, float64 truth, arguments, what it must give at -inf, inf, NaN; None: not in its domain)
HELPERS = {
    "tan": (3, np.tan, _RNG.uniform(-1.55, 1.55, 60), None),
    "sinh": (4, np.sinh, _WIDE, (-np.inf, np.inf)),
    "cosh": (5, np.cosh, _WIDE, (np.inf, np.inf)),
    "tanh": (6, np.tanh, _WIDE, (-1.0, 1.0)),
    "asinh": (7, np.arcsinh, _WIDE, (-np.inf, np.inf)),
    "acosh": (8, np.arccosh, _ABOVE_ONE, (None, np.inf)),
    "atanh": (9, np.arctanh, _UNIT, None),
    "asin": (10, np.arcsin, _UNIT, None),
    "acos": (11, np.arccos, _UNIT, None),
    "atan": (12, np.arctan, _WIDE, (-np.pi / 2, np.pi / 2)),
}


@pytest.mark.parametrize("name", list(HELPERS))
def test_function_helpers_match_numpy(name):
    """Each helper within a few float32 roundings of the float64 function at the float32 arguments (relative;
    the functions are well conditioned there or, near tan's poles and acos near -1, the argument is exact)."""
    which, truth, x, ends = HELPERS[name]
    x = np.asarray(x, np.float32)
    got = _run(which, x)
    with np.errstate(over="ignore", divide="ignore"):
        want = truth(x.astype(np.float64))
    finite = np.abs(want) <= np.finfo(np.float32).max
    assert np.all(got[~finite] == want[~finite].astype(np.float32)), (x[~finite], got[~finite])
    np.testing.assert_allclose(got[finite], want[finite], rtol=4 * 2.0**-24 * 4, atol=0)
    if ends is not None:
        lo, hi = ends
        special = _run(which, [np.inf, np.nan] + ([-np.inf] if lo is not None else []))
        assert special[0] == hi and np.isnan(special[1]), special
        assert lo is None or special[2] == np.float32(lo), special


def test_every_printed_helper_is_tested_and_exported():
    """The helpers the Triton printer may call (derive.codegen.functions) are the ones tested above, and every one
    is exported by numeric.kernels.triton_math."""
    from derive.codegen.functions import TRITON_HELPERS

    tested = {"rg_log1p", "rg_expm1", "rg_cbrt", "rg_pow"} | {f"rg_{n}" for n in HELPERS}
    assert set(TRITON_HELPERS) == tested
    assert set(TRITON_HELPERS) <= set(tm.__all__)


_PTX_SCRIPT = r"""
import json, warnings
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from numeric.kernels import triton_math as tm

@triton.jit
def every_helper(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(X + offs)
    y = tm.rg_tan(x) + tm.rg_sinh(x) + tm.rg_cosh(x) + tm.rg_tanh(x) + tm.rg_asinh(x) + tm.rg_acosh(x + 1.0)
    y = y + tm.rg_atanh(x) + tm.rg_asin(x) + tm.rg_acos(x) + tm.rg_atan(x) + tm.rg_expm1(x) + tm.rg_log1p(x)
    tl.store(Y + offs, y + tm.rg_cbrt(x) + tm.rg_pow(x, x))

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    compiled = triton.compile(ASTSource(fn=every_helper, signature={"X": "*fp32", "Y": "*fp32", "N": "constexpr"},
                                        constexprs={(2,): 64}), target=GPUTarget("cuda", 80, 32))
print(json.dumps(compiled.asm["ptx"]))
"""


def test_every_helper_compiles_to_ptx(tmp_path):
    """Triton's compiler (not only its interpreter) takes every helper: one kernel calling them all compiles to PTX
    for sm_80, no GPU needed (in a process of its own, from a file: this one runs the interpreter, and Triton reads
    a jit function's source from its file)."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "every_helper.py"
    script.write_text(_PTX_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    ptx = json.loads(run.stdout.strip().splitlines()[-1])
    assert ".target sm_80" in ptx and ".entry every_helper" in ptx
