"""The math helpers of numeric.kernels.triton_math, run in Triton's interpreter, against NumPy in float64.

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
        else:
            y = tm.rg_cbrt(x)
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
