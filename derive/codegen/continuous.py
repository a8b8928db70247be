"""Turn a :class:`~derive.continuous.ContinuousMap` into the text of an importable module.

:func:`generate_continuous_module` writes, for a continuous map called ``NAME``:

* constants ``NAME``, ``REGULARIZER``, ``FAMILY`` (``"gaussian"`` or
  ``"compact"``), ``CUDA_THREADS`` and ``CUDA_KERNELS``;
* NumPy functions (scalars or broadcasting arrays, float64 recommended):
  ``support_radius(sigma2)`` (``inf`` for the Gaussian), ``density(t, mu, sigma2)``
  (zero off the support), ``rbf_expectation(mu, sigma2, c, s2)`` =
  ``E_p[N(t; c, s2)]`` and its derivatives ``rbf_expectation_dmu`` and
  ``rbf_expectation_dsigma2``, the same three at once from
  ``rbf_expectation_grad`` (one shared CSE), and ``rbf_expectation_theta(theta_1,
  theta_2, c, s2)`` giving ``(E, dE/dtheta_1, dE/dtheta_2)`` for the scores
  ``theta_1 t + theta_2 t^2``;
* ``CUDA_SOURCE``: the scalar functions as ``template <typename T> __device__``
  functions (``CUDA_DEVICE_SOURCE``) and the kernel ``NAME_rbf_context_{f32,f64}``
  filling ``E``, ``dE/dmu`` and ``dE/dsigma2`` for every (row, basis function) pair.

The same determinism and header as :func:`~derive.codegen.emit.generate_module`.
"""

from __future__ import annotations

import sympy as sp

from ..continuous import ContinuousMap
from ..errors import DerivationError
from . import cuda
from .emit import _cuda_function, _Piece, _python_function, assemble, check_name
from .printers import CudaPrinter, PyPrinter, print_block

__all__ = ["generate_continuous_module", "continuous_functions", "CONTEXT_KERNEL"]

CONTEXT_KERNEL = r"""
extern "C" __global__ void {name}_rbf_context_{suffix}(const {T}* mu, const {T}* sigma2, const {T}* c,
        const {T}* s2, long long rows, long long nbasis, {T}* e, {T}* dmu, {T}* dsigma2) {{
    // e[r, j] = E_p[N(t; c_j, s2_j)] for p of (mu_r, sigma2_r); dmu, dsigma2 may be null
    long long n = rows * nbasis;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {{
        long long r = i / nbasis, j = i % nbasis;
        e[i] = {name}_rbf_expectation<{T}>(mu[r], sigma2[r], c[j], s2[j]);
        if (dmu) dmu[i] = {name}_rbf_expectation_dmu<{T}>(mu[r], sigma2[r], c[j], s2[j]);
        if (dsigma2) dsigma2[i] = {name}_rbf_expectation_dsigma2<{T}>(mu[r], sigma2[r], c[j], s2[j]);
    }}
}}
"""


def continuous_functions(cm: ContinuousMap) -> list[_Piece]:
    """The scalar functions of a continuous module (each also a CUDA device function)."""
    e, e_mu, e_var = cm.rbf_expectation_grad()
    _, e_t1, e_t2 = cm.rbf_expectation_theta()
    inside = "on the support |t - mu| < a" if cm.family == "compact" else "a Gaussian"
    pieces = [
        _Piece("support_radius", ["sigma2"], cm.support_radius, "a: the density is zero where |t - mu| >= a."),
        _Piece("density_inside", ["t", "mu", "sigma2"], cm.density_at(), f"p(t) {inside} (not clipped)."),
        _Piece("rbf_expectation", ["mu", "sigma2", "c", "s2"], e, "E_p[N(t; c, s2)], the context of one Gaussian basis function."),
        _Piece("rbf_expectation_dmu", ["mu", "sigma2", "c", "s2"], e_mu, "d/dmu E_p[N(t; c, s2)]."),
        _Piece("rbf_expectation_dsigma2", ["mu", "sigma2", "c", "s2"], e_var, "d/dsigma2 E_p[N(t; c, s2)]."),
        _Piece("rbf_expectation_dtheta_1", ["theta_1", "theta_2", "c", "s2"], e_t1,
               "d/dtheta_1 E_p[N(t; c, s2)] for scores theta_1 t + theta_2 t^2 (theta_2 < 0)."),
        _Piece("rbf_expectation_dtheta_2", ["theta_1", "theta_2", "c", "s2"], e_t2,
               "d/dtheta_2 E_p[N(t; c, s2)] for scores theta_1 t + theta_2 t^2 (theta_2 < 0)."),
    ]
    return pieces


def _tuple_function(name: str, args: list[str], exprs: list[sp.Expr], doc: str, printer: PyPrinter) -> str:
    assigns, results = print_block(printer, exprs, f"{name}(...)")
    lines = [f"def {name}({', '.join(args)}):", f'    """{doc}"""']
    lines += [f"    {lhs} = {rhs}" for lhs, rhs in assigns]
    lines.append(f"    return ({', '.join(results)})")
    return "\n".join(lines)


_DENSITY = {
    "compact": '''def density(t, mu, sigma2):
    """p(t): the density on |t - mu| < support_radius(sigma2), zero elsewhere."""
    inside = numpy.abs(t - mu) < support_radius(sigma2)
    return numpy.where(inside, density_inside(t, mu, sigma2), 0.0)''',
    "gaussian": '''def density(t, mu, sigma2):
    """p(t): the Gaussian density N(t; mu, sigma2)."""
    return density_inside(t, mu, sigma2)''',
}


def generate_continuous_module(cm: ContinuousMap, name: str) -> str:
    """The text of an importable module with ``cm``'s NumPy functions and CUDA source.

    Raises
    ------
    DerivationError
        If ``name`` is not an identifier or an expression cannot be printed.
    """
    if not isinstance(cm, ContinuousMap):
        raise DerivationError(f"generate_continuous_module expects a ContinuousMap, got {type(cm).__name__}")
    check_name(name)
    pieces = continuous_functions(cm)
    py, cu = PyPrinter(), CudaPrinter()
    device_source = "\n".join([cuda.PRELUDE] + [_cuda_function(piece, [], cu, name) for piece in pieces]) + "\n"
    kernels = [f"{name}_rbf_context_{suffix}" for suffix in ("f32", "f64")]
    kernel_source = cuda.REDUCTIONS + "".join(
        CONTEXT_KERNEL.format(name=name, T=T, suffix=suffix) for T, suffix in (("float", "f32"), ("double", "f64"))
    )
    reg_text = sp.sstr(cm.regularizer.omega)
    e, e_mu, e_var = cm.rbf_expectation_grad()
    theta = cm.rbf_expectation_theta()
    doc = [
        f'"""The continuous {name} map, generated from omega(p) = {reg_text}.',
        "",
        f"Regularizer: {cm.regularizer.name}; density: {cm.family}"
        + (f", support |t - mu| < {sp.sstr(cm.support_radius)}" if cm.family == "compact" else "") + ".",
        "Scores theta_1 t + theta_2 t^2 (theta_2 < 0): mu = -theta_1 / (2 theta_2), sigma2 = -1 / (2 theta_2).",
        "The context of a Gaussian basis function N(t; c, s2) is rbf_expectation(mu, sigma2, c, s2).",
        "CUDA_SOURCE compiles with NVRTC on its own (kernels launched with 256 threads per block).",
        '"""',
    ]
    body = [
        f"NAME = {name!r}",
        f"REGULARIZER = {reg_text!r}",
        f"FAMILY = {cm.family!r}",
        "CUDA_THREADS = 256",
        f"CUDA_KERNELS = {tuple(kernels)!r}",
        "",
    ]
    for piece in pieces:
        body += ["", _python_function(piece, [], py), ""]
    body += ["", _DENSITY[cm.family], ""]
    body += ["", _tuple_function("rbf_expectation_grad", ["mu", "sigma2", "c", "s2"], [e, e_mu, e_var],
                                 "(E, dE/dmu, dE/dsigma2) for E = E_p[N(t; c, s2)], sharing one evaluation.", py), ""]
    body += ["", _tuple_function("rbf_expectation_theta", ["theta_1", "theta_2", "c", "s2"], list(theta),
                                 "(E, dE/dtheta_1, dE/dtheta_2) for scores theta_1 t + theta_2 t^2 (theta_2 < 0).", py), ""]
    return assemble(doc, body, device_source, kernel_source,
                    [f"map: {name} (continuous)", f"regularizer: omega(p) = {reg_text}"])
