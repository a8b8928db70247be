"""Typed maps whose derived routines need functions Triton lacks (sinh, cosh, tanh, asinh, acosh, atanh, asin, acos,
atan, tan: :mod:`numeric.kernels.triton_math`) or has (sin, cos, erf), run by the fused Triton kernels in Triton's
interpreter, forward and backward, against numeric's NumPy attention in float64 and within the float32 bounds of
tests/triton/test_fused_attention.py; the same maps' NumPy and CUDA code is checked against derive's mpmath
references in tests/derive/test_codegen_functions.py (:data:`PRINTED_MAPS` there).

Regression (issue 43, item 9): ``p*log(p) + cosh(p)`` printed ``tl.sinh``, which ``triton.language`` does not have.

The interpreter is slow: tiny shapes, the ci profile's two maps (:data:`CI_MAPS`), the whole table in the thorough
profile.
"""

from __future__ import annotations

import pytest

from tests.derive.test_codegen_functions import MAPS, PRINTED_MAPS, regularizer

from .conftest import interpreter_reason

pytestmark = pytest.mark.skipif(interpreter_reason() is not None, reason=str(interpreter_reason()))

if interpreter_reason() is None:
    from derive.testing import generated_map

    from .test_fused_attention import _check, _inputs

#: (L, S, causal, mask) of the tiny layouts: ragged blocks, causal with a float mask and a fully masked row
LAYOUTS = [(6, 9, False, None), (9, 5, True, "float")]


#: maps whose omega is convex, or real, only a little past p = 1 (1/p - sin(p) > 0 up to p = 1.11; tan's pole at
#: pi/2; asin(p/2), acos(p/2), atanh(p/2) real up to p = 2): the kernels' traced Newton link steps past p = 1 there
#: (NaN warnings in the interpreter, or another root: 0.26 off the NumPy attention for tan_shannon), where the
#: NumPy, torch and JAX maps are right (tests/derive/test_codegen_functions.py); not a printing defect
BEYOND_ONE = {"tan_shannon", "sin_shannon", "atanh_shannon", "asin_shannon", "acos_shannon"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    n in BEYOND_ONE, reason="the fused kernels' Newton link leaves the domain where omega is convex", strict=True))
    for n in MAPS])
def test_fused_forward_and_backward_of_printed_functions(name, tmp_path):
    """The map's kernels run (no fallback: a warning is an error in _check) and agree with the float64 NumPy
    attention within the float32 error bounds, output and dq, dk, dv."""
    with generated_map(regularizer(name), name, str(tmp_path)) as module:
        for seed, (L, S, causal, mask) in enumerate(LAYOUTS):
            _check(module, {}, L, S, causal, mask, inputs=_inputs(seed, B=2, H=1, L=L, S=S))
        for helper in PRINTED_MAPS[name][1]:  # the kernels ran the functions the table is there for
            assert f"{helper}(" in module.TRITON_SOURCE, helper
