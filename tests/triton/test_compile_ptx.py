"""The generated Triton kernels compile for NVIDIA GPUs (PTX for sm_80 and sm_90) with Triton's own compiler, no GPU
needed: what the interpreter does not check (types of loop-carried values, constexpr branches, tensor-core dots of
half inputs with 64-row blocks) is checked here.  The CI profile compiles softmax (with every constraint set's
branches) and a typed map's backward kernels (their PTX, not assembled); the thorough one every kind of map, with
every set."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.profile import THOROUGH

from .conftest import interpreter_reason

pytestmark = pytest.mark.skipif(interpreter_reason() is not None, reason=str(interpreter_reason()))

_SCRIPT = r"""
import json, sys, warnings
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import numeric as nm
from numeric import family
from numeric.kernels import triton_attention as kernels
from numeric.kernels import triton_backward as backward
from numeric.torch import fused

POINTERS = {"Tau": "fp32", "Fsum": "fp32", "C": "fp32", "Params": "fp32", "DQ": "fp32", "DK": "fp32", "DV": "fp32",
            "Support": "i8", "Mask": "u8", "Bmax": "fp32", "U": "fp32", "Wsum": "fp32", "Upper": "fp32",
            "Ceiling": "fp32", "DU": "fp32", "Column": "fp32", "DColumn": "fp32"}
INPUTS = {"Q", "K", "V", "Out", "DO"}
name, params, dtype, arch, boxes, assemble, names = json.loads(sys.argv[1])
def ptx_only(*args):  # (PTX without ptxas's cubin: the compiler's pipeline through its stage "ptx", the last a stub)
    if not args:
        return "ptx-only", "ptx-only"  # (the key and hash that keep these kernels apart in Triton's cache)
    args[1]["cubin"] = lambda src, metadata: b""
mapping = nm.get_map(name, **params)
module = family.resolve(mapping.module, mapping.params)  # (a family's kernels are its cases')
# (a window and a softcap: their branches compile too)
constexprs = dict(MAP=fused.map_functions(module), HAS_MASK=True, MASK_BOOL=True, CAUSAL=True, WINDOW=256, SOFTCAP=30.0,
                  MAX_STEPS=60, WEIGHTED=True, BLOCK_M=64, BLOCK_N=64, BLOCK_E=64,
                  BLOCK_EV=64, KEEP=fused.KEEP["cuda"], UPCAST=False, EXP_LINK=bool(module.TERM_IS_EXP) and module.LINK_FORM == "exp")
out = {}
# (each kernel with and without bounds, a sink's column and without a sum: SET and UPPER_GRAD are constexpr branches)
for kernel, box in [(kernel, box) for kernel in names
                    for box in (("simplex", "box", "column", "nosum") if boxes else ("simplex",))]:
    fn = getattr(kernels if kernel == "attention_forward" else backward, kernel)
    signature, values = {}, {}
    for i, p in enumerate(fn.params):
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            values[(i,)] = (box == "box" if p.name == "UPPER_GRAD" else box if p.name == "SET" else constexprs[p.name])
        elif p.name in INPUTS:
            signature[p.name] = "*" + dtype
        elif p.name in POINTERS:
            signature[p.name] = "*" + POINTERS[p.name]
        else:
            signature[p.name] = "fp32" if p.name == "scale" else "i32"
    # (ptxas assembles the kernels of the sets asked for: the other sets' differ from those in a few constexpr branches)
    triton.knobs.runtime.add_stages_inspection_hook = None if box in assemble else ptx_only
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=values),
                                  target=GPUTarget("cuda", arch, 32), options={"enable_fp_fusion": True})
    out[kernel + ("" if box == "simplex" else "-" + box)] = compiled.asm["ptx"]
print(json.dumps(out))
"""

# (name, parameters, dtype, architecture, whether the kernels of the other sets compile too (bounds, a sink's column,
# no sum: the sets' code is the same for every map, so the CI profile compiles them for one map), the sets whose PTX
# ptxas assembles into a cubin (the typed map's forward is a large kernel: ptxas takes 40 of its 70 s; the box's
# kernels of softmax 17 of 21 s; the checks this test is for come before it, so the CI profile assembles the closed
# map's simplex kernels only))
# (the CI profile: both half formats and both architectures, a closed map with every set and the typed map)
# and the kernels compiled (a typed map's forward inlines its traced Newton inversion of the link, 500 lines, at
# each of its ten calls of the link: LLVM takes 33 s on it, where the backward kernels, which call it once, take 3 s
# each, and check the same loop; the CI profile compiles the typed map's backward kernels only)
ASSEMBLED = ["simplex", "box"]
KERNELS = ["attention_forward", "attention_backward_rows", "attention_backward_keys"]
CASES = [("softmax", {}, "bf16", 80, True, ASSEMBLED if THOROUGH else ["simplex"], KERNELS),
         ("gini_log1p", {}, "fp16", 90, THOROUGH, ASSEMBLED if THOROUGH else [],  # (a link with no closed form)
          KERNELS if THOROUGH else KERNELS[1:])]
if THOROUGH:
    CASES += [(*case, ASSEMBLED, KERNELS) for case in [
        ("entmax", {"alpha": 1.5}, "bf16", 90, True), ("softmax", {}, "fp16", 80, True),
        ("sparsemax", {}, "fp16", 80, True), ("entmax15", {}, "bf16", 80, True), ("softmax", {}, "fp32", 90, True),
        ("shannon_gini", {}, "fp32", 80, True)]]  # (a dense map: its first pass sums exp(s - m))


@pytest.mark.parametrize(("name", "params", "dtype", "arch", "boxes", "assemble", "names"), CASES,
                         ids=[f"{c[0]}-{c[2]}-sm{c[3]}" + ("-sets" if c[4] else "") + ("" if c[5] else "-ptx")
                              + ("" if c[6] == KERNELS else "-backward") for c in CASES])
def test_kernels_compile_to_ptx(name, params, dtype, arch, boxes, assemble, names, triton_user_modules):
    """Each kernel compiles to PTX for the architecture (in a process of its own: this one runs Triton's
    interpreter, whose functions the compiler does not take), for each constraint set where ``boxes``; half inputs
    multiply on tensor cores (mma).  The user maps (gini_log1p) are importable from the session's folder."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(triton_user_modules), *filter(None, [env.get("PYTHONPATH")])])
    run = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps([name, params, dtype, arch, boxes, assemble, names])], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    ptx = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(ptx) == len(names) * (4 if boxes else 1)
    for kernel, text in ptx.items():
        assert f".target sm_{arch}" in text and f".entry {kernel.split('-')[0]}" in text
        if dtype != "fp32":
            assert "mma" in text, kernel
