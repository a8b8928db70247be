"""Turn a :class:`~derive.continuous.ContinuousDerivation` into the text of an importable module.

:func:`generate_continuous_module` writes, for a continuous map called ``NAME``:

* constants ``NAME``, ``REGULARIZER``, ``FAMILY`` (``"gaussian"`` or
  ``"compact"``), ``CUDA_THREADS`` and ``CUDA_KERNELS``;
* for a truncated polynomial whose shape does not depend on ``sigma2``
  (``p(u) = P(u / a) / a``), the data of the stable evaluation of the context
  (:func:`quadrature_constants`): ``SHAPE`` (the coefficients of ``P(x)``,
  lowest first), ``DEGREE``, ``QUADRATURE_BELOW`` and ``QUADRATURE_RULES``
  (``None``, ``0.0`` and ``()`` for other maps);
* NumPy functions (scalars or broadcasting arrays, float64 recommended):
  ``support_radius(sigma2)`` (``inf`` for the Gaussian), ``density(t, mu, sigma2)``
  (zero off the support), ``rbf_expectation(mu, sigma2, c, s2)`` =
  ``E_p[N(t; c, s2)]`` and its derivatives ``rbf_expectation_dmu`` and
  ``rbf_expectation_dsigma2``, the same three at once from
  ``rbf_expectation_grad`` (one shared CSE), and ``rbf_expectation_theta(theta_1,
  theta_2, c, s2)`` giving ``(E, dE/dtheta_1, dE/dtheta_2)`` for the scores
  ``theta_1 t + theta_2 t^2``; compact maps also ``support_radius_dsigma2``;
* ``CUDA_SOURCE``: the scalar functions as ``template <typename T> __device__``
  functions (``CUDA_DEVICE_SOURCE``) and the kernel ``NAME_rbf_context_{f32,f64}``
  filling ``E``, ``dE/dmu`` and ``dE/dsigma2`` for every (row, basis function) pair.

The closed forms of a compact map subtract nearly equal terms where the support
is narrow next to the basis function: ``E = sum_k b_k (J_k(x_+) - J_k(x_-))``
with ``|b_k|`` up to ``max p ((|d| + a) / a)^D`` (``D`` the degree of ``p``,
``d = c - mu``), while ``E`` is at most ``max psi ~ 1 / s``.  Where ``erf`` has
not saturated (``|d| < a + 8 s``) the rounding error relative to ``1 / s`` is
about ``eps ((8 s + a) / a)^D (s / a) / 2`` (measured in float64: for
``a / s = 0.1, 1, 2`` the biweight's worst is 3.6e-8, 5.9e-13, 2.6e-14, the
parabola's at ``a / s = 0.1, 1`` 4.9e-12, 5.8e-15).  The kernel, and
:class:`numeric.continuous.ContinuousMap`, switch to a Gauss-Legendre rule on the
support where ``a / s`` is below the threshold at which that bound reaches
``64 eps`` (:func:`quadrature_threshold`); the number of nodes comes from the
Gauss-Legendre error bound for an integrand analytic in a Bernstein ellipse
(:func:`quadrature_gamma`).

The same determinism and header as :func:`~derive.codegen.emit.generate_module`.
"""

from __future__ import annotations

import math

import mpmath
import sympy as sp

from numeric import contract

from ..continuous import ContinuousDerivation, sigma2
from ..errors import DerivationError
from . import cuda
from .emit import _cuda_function, _Piece, _python_function, assemble, check_name
from .printers import CudaPrinter, PyPrinter, print_block

__all__ = ["generate_continuous_module", "continuous_functions", "CONTEXT_KERNEL", "QUADRATURE_BRANCH", "QUADRATURE_KERNEL",
           "QUADRATURE_NODES", "legendre_rule", "quadrature_gamma", "quadrature_threshold", "quadrature_constants"]

#: Node counts of the Gauss-Legendre rules a generated module carries (even: the nodes pair up as +-x).
QUADRATURE_NODES = (4, 6, 8, 12, 16, 24, 32, 48, 64)
#: Rounding unit the node counts are chosen for, by C type.
_UNIT = {"double": 2.0**-53, "float": 2.0**-24}
#: Past ``|d| = a + 8 s`` every ``erf`` in the closed form is +-1 to the last bit, and its terms cancel exactly.
_SATURATED = 8.0
#: The closed form is used where its cancellation bound stays below this many rounding units.
_CLOSED_FORM_ULPS = 64.0

CONTEXT_KERNEL = r"""
extern "C" __global__ void {name}_rbf_context_{suffix}(const {T}* mu, const {T}* sigma2, const {T}* c,
        const {T}* s2, long long rows, long long nbasis, {T}* e, {T}* dmu, {T}* dsigma2) {{
    // e[r, j] = E_p[N(t; c_j, s2_j)] for p of (mu_r, sigma2_r); dmu, dsigma2 may be null
    long long n = rows * nbasis;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {{
        long long r = i / nbasis, j = i % nbasis;
{quadrature}        e[i] = {name}_rbf_expectation<{T}>(mu[r], sigma2[r], c[j], s2[j]);
        if (dmu) dmu[i] = {name}_rbf_expectation_dmu<{T}>(mu[r], sigma2[r], c[j], s2[j]);
        if (dsigma2) dsigma2[i] = {name}_rbf_expectation_dsigma2<{T}>(mu[r], sigma2[r], c[j], s2[j]);
    }}
}}
"""


def legendre_rule(n: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The ``n``-point Gauss-Legendre rule on ``[-1, 1]`` (``n`` even), halved: the nodes
    ``x_i > 0`` in increasing order and the weights doubled, so that
    ``int_{-1}^{1} f = sum_i w_i f(x_i)`` for even ``f``.

    Newton on the Legendre polynomial at 40 digits, so the printed floats do not
    depend on the machine.
    """
    if n <= 0 or n % 2:
        raise DerivationError(f"legendre_rule needs a positive even n, got {n}")
    with mpmath.workdps(40):
        nodes, weights = [], []
        for i in range(n // 2):
            x = mpmath.cos(mpmath.pi * (i + mpmath.mpf(3) / 4) / (n + mpmath.mpf(1) / 2))
            for _ in range(100):
                p0, p1 = mpmath.mpf(1), x
                for k in range(2, n + 1):
                    p0, p1 = p1, ((2 * k - 1) * x * p1 - (k - 1) * p0) / k
                dp = n * (x * p1 - p0) / (x * x - 1)
                step = p1 / dp
                x -= step
                if abs(step) < mpmath.mpf(10) ** -38:
                    break
            nodes.append(x)
            weights.append(2 * 2 / ((1 - x * x) * dp * dp))
        order = sorted(range(len(nodes)), key=lambda j: nodes[j])
        return tuple(float(nodes[j]) for j in order), tuple(float(weights[j]) for j in order)


def quadrature_gamma(n: int, shape: tuple[float, ...], unit: float) -> float:
    """The largest ``gamma`` for which the ``n``-point Gauss-Legendre rule integrates
    ``P(x) x^k exp(alpha x + beta x^2)`` (``k <= 2``, ``|alpha| + |beta| <= gamma``) over
    ``[-1, 1]`` to within ``unit``.

    For ``f`` analytic inside the Bernstein ellipse ``E_rho`` with ``|f| <= M``
    there, the error of the ``n``-point rule is at most
    ``64 M rho^(-2(n - 1)) / (15 (rho^2 - 1))`` (Trefethen, SIAM Review 2008,
    Theorem 4.5, whose ``I_n`` has ``n + 1`` points).  On ``E_rho``, ``|x| <= R = (rho + 1/rho) / 2``,
    so ``M <= sum_j |P_j| R^(j + 2) exp(gamma R^2)``; the bound is minimised over
    ``rho`` on a grid and ``gamma`` found by bisection.
    """
    def log_bound(gamma: float, rho: float) -> float:
        big = (rho + 1 / rho) / 2
        size = sum(abs(p) * big**j for j, p in enumerate(shape)) * big * big
        return (math.log(64 / 15) + math.log(size) + gamma * big * big - 2 * (n - 1) * math.log(rho)
                - math.log(rho * rho - 1))

    rhos = [1 + 10 ** (e / 50) for e in range(-150, 101)]
    fits = lambda gamma: min(log_bound(gamma, rho) for rho in rhos) <= math.log(unit)  # noqa: E731
    if not fits(0.0):
        return 0.0
    lo, hi = 0.0, 500.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return float(f"{lo:.6g}")


def quadrature_threshold(degree: int) -> float:
    """``T``: the closed form of a degree-``D`` truncated polynomial is used where ``a >= T s``.

    The smallest ``A = a / s`` at which the cancellation bound
    ``((8 + A) / A)^D / (2 A)`` rounding units (module docstring) is at most 64.
    """
    cost = lambda ratio: ((_SATURATED + ratio) / ratio) ** degree / (2 * ratio)  # noqa: E731
    lo, hi = 1e-6, 1e3
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if cost(mid) <= _CLOSED_FORM_ULPS else (mid, hi)
    return float(f"{hi:.6g}")


def quadrature_constants(cm: ContinuousDerivation) -> dict | None:
    """``SHAPE``, ``DEGREE``, ``QUADRATURE_BELOW`` and ``QUADRATURE_RULES`` of a truncated polynomial
    of fixed shape, or ``None`` (Gaussian, general, or a shape that changes with ``sigma2``).

    ``QUADRATURE_RULES`` holds ``(n, gamma_double, gamma_float, nodes, weights)``
    per rule of :data:`QUADRATURE_NODES` (halved, :func:`legendre_rule`): the
    rule serves ``gamma = (a |d| + a^2 / 2) / s^2`` up to its ``gamma`` for the type.
    """
    if cm.family != "compact" or not cm.closed_context:
        return None
    shape = cm.shape()
    if shape is None:
        return None
    from ..continuous import _x

    poly = sp.Poly(shape, _x)
    coeffs = tuple(float(poly.coeff_monomial(_x**j)) for j in range(poly.degree() + 1))
    rules = []
    for n in QUADRATURE_NODES:
        nodes, weights = legendre_rule(n)
        rules.append((n, quadrature_gamma(n, coeffs, _UNIT["double"]), quadrature_gamma(n, coeffs, _UNIT["float"]),
                      nodes, weights))
    return {"SHAPE": coeffs, "DEGREE": cm.degree, "QUADRATURE_BELOW": quadrature_threshold(cm.degree),
            "QUADRATURE_RULES": tuple(rules)}


# The context of a fixed-shape truncated polynomial p(u) = P(u/a)/a by Gauss-Legendre on
# the support, with u = a x, d = c - mu, h = u^2 / (2 s2), y = d u / s2 and
# psi(mu + u) = phi0 exp(y - h), phi0 = N(c; mu, s2).  Pairing the nodes +-x (P is even):
#   E          = phi0 (1 + sum w P (expm1(-h) cosh y + 2 sinh^2(y/2)))       (int P = 1 exactly)
# where expm1(-h) = e^(-h) - 1 = -2 e^(-h/2) sinh(h/2) (the base prelude's sinh, no expm1 needed)
#   dE/dmu     = phi0 (d / s2) (E / phi0 - (a^2 / s2) S1)
#   dE/dsigma2 = a'(sigma2) phi0 (a / s2) ((d^2 / s2) S1 - C2)
# with S1 = sum w P x^2 e^(-h) sinh(y) / y and C2 = sum w P x^2 e^(-h) cosh(y): no term
# is large next to the result, so nothing cancels but what the exact values cancel.
QUADRATURE_KERNEL = r"""
__device__ const int {name}_gl_count[{rules}] = {{{counts}}};
__device__ const int {name}_gl_start[{rules}] = {{{starts}}};
__device__ const double {name}_gl_gamma_f64[{rules}] = {{{gamma64}}};
__device__ const double {name}_gl_gamma_f32[{rules}] = {{{gamma32}}};
__device__ const double {name}_gl_x[{total}] = {{{nodes}}};
__device__ const double {name}_gl_w[{total}] = {{{weights}}};

// E_p[N(t; c, s2)] and its derivatives in (mu, sigma2) by Gauss-Legendre on the support, where the
// closed form cancels (a < {below} sqrt(s2)); false (nothing written) where the closed form is to be used
template <typename T> __device__ bool {name}_rbf_quadrature(T mu, T sigma2, T c, T s2, T* e, T* dmu, T* dsigma2) {{
    const T a = {name}_support_radius<T>(sigma2);
    const T s = rg_sqrt(s2);
    if (!(a < T({below}) * s)) return false;
    const T d = c - mu;
    const T gamma = (a * rg_fabs(d) + a * a / T(2)) / s2;
    int rule = -1;
    for (int k = 0; k < {rules}; ++k) {{
        const double limit = sizeof(T) == sizeof(float) ? {name}_gl_gamma_f32[k] : {name}_gl_gamma_f64[k];
        if (gamma <= T(limit)) {{ rule = k; break; }}
    }}
    if (rule < 0) return false;  // far from the support: erf has saturated and the closed form is exact
    T sum0 = T(0), s1 = T(0), c2 = T(0);
    for (int i = {name}_gl_start[rule]; i < {name}_gl_start[rule] + {name}_gl_count[rule]; ++i) {{
        const T x = T({name}_gl_x[i]), w = T({name}_gl_w[i]);
        const T shape = {horner};
        const T u = a * x, h = u * u / (T(2) * s2), y = d * u / s2;
        const T eh = rg_exp(-h), ch = rg_cosh(y), half = rg_sinh(y / T(2));
        const T expm1_h = T(-2) * rg_exp(-h / T(2)) * rg_sinh(h / T(2));  // e^(-h) - 1 without cancellation
        const T sinhc = y == T(0) ? T(1) : rg_sinh(y) / y;
        sum0 += w * shape * (expm1_h * ch + T(2) * half * half);
        s1 += w * shape * x * x * eh * sinhc;
        c2 += w * shape * x * x * eh * ch;
    }}
    const T phi0 = rg_exp(-d * d / (T(2) * s2)) / rg_sqrt(T(2) * T(3.141592653589793) * s2);
    const T b0 = T(1) + sum0;
    *e = phi0 * b0;
    *dmu = phi0 * (d / s2) * (b0 - a * a / s2 * s1);
    *dsigma2 = {name}_support_radius_dsigma2<T>(sigma2) * phi0 * (a / s2) * (d * d / s2 * s1 - c2);
    return true;
}}
"""

#: The quadrature branch of the context kernel, for maps that carry Gauss-Legendre rules.
QUADRATURE_BRANCH = r"""        {T} qe, qmu, qvar;
        if ({name}_rbf_quadrature<{T}>(mu[r], sigma2[r], c[j], s2[j], &qe, &qmu, &qvar)) {{
            e[i] = qe;
            if (dmu) dmu[i] = qmu;
            if (dsigma2) dsigma2[i] = qvar;
            continue;
        }}
"""


def _quadrature_source(name: str, q: dict) -> str:
    """The tables and the ``NAME_rbf_quadrature`` device function of :data:`QUADRATURE_KERNEL`."""
    rules = q["QUADRATURE_RULES"]
    counts = [len(rule[3]) for rule in rules]
    starts = [sum(counts[:k]) for k in range(len(counts))]
    flat = lambda values: ", ".join(repr(float(v)) for v in values)  # noqa: E731
    horner = "T(0)"
    for coeff in reversed(q["SHAPE"]):
        horner = f"T({float(coeff)!r})" if horner == "T(0)" else f"({horner}) * x + T({float(coeff)!r})"
    return QUADRATURE_KERNEL.format(
        name=name, rules=len(rules), counts=", ".join(map(str, counts)), starts=", ".join(map(str, starts)),
        gamma64=flat(r[1] for r in rules), gamma32=flat(r[2] for r in rules), total=sum(counts),
        nodes=flat(x for r in rules for x in r[3]), weights=flat(w for r in rules for w in r[4]),
        below=repr(q["QUADRATURE_BELOW"]), horner=horner)


def continuous_functions(cm: ContinuousDerivation) -> list[_Piece]:
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
    if cm.family == "compact":
        pieces.insert(1, _Piece("support_radius_dsigma2", ["sigma2"], sp.simplify(sp.diff(cm.support_radius, sigma2)),
                                "da/dsigma2: how fast the support widens with sigma2."))
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


def _quadrature_constants_text(quad: dict | None) -> list[str]:
    """The module constants of the stable context evaluation (see :func:`quadrature_constants`)."""
    if quad is None:
        return ["# no fixed-shape truncated polynomial: the context is the closed form everywhere",
                "SHAPE = None", "DEGREE = None", "QUADRATURE_BELOW = 0.0", "QUADRATURE_RULES = ()", ""]
    lines = [
        "# p(u) = P(u / a) / a on |u| < a with P(x) = sum_j SHAPE[j] x^j (int_{-1}^{1} P = 1), of degree DEGREE.",
        "# Where a < QUADRATURE_BELOW * s the closed form cancels, and the context is a Gauss-Legendre",
        "# sum on the support instead: QUADRATURE_RULES holds (n, gamma_double, gamma_float, nodes, weights),",
        "# the nodes x > 0 of the n-point rule with doubled weights, serving gamma = (a |d| + a^2 / 2) / s^2",
        "# up to gamma_double (float64) or gamma_float (float32).",
        f"SHAPE = {quad['SHAPE']!r}",
        f"DEGREE = {quad['DEGREE']!r}",
        f"QUADRATURE_BELOW = {quad['QUADRATURE_BELOW']!r}",
        "QUADRATURE_RULES = (",
    ]
    for n, g64, g32, nodes, weights in quad["QUADRATURE_RULES"]:
        lines += [f"    ({n}, {g64!r}, {g32!r},", f"     {nodes!r},", f"     {weights!r}),"]
    return lines + [")", ""]


def generate_continuous_module(cm: ContinuousDerivation, name: str) -> str:
    """The text of an importable module with ``cm``'s NumPy functions and CUDA source.

    Raises
    ------
    DerivationError
        If ``name`` is not an identifier or an expression cannot be printed.
    """
    if not isinstance(cm, ContinuousDerivation):
        raise DerivationError(f"generate_continuous_module expects a ContinuousDerivation, got {type(cm).__name__}")
    check_name(name)
    pieces = continuous_functions(cm)
    quad = quadrature_constants(cm)
    py, cu = PyPrinter(), CudaPrinter()
    device_parts = [cuda.PRELUDE] + [_cuda_function(piece, [], cu, name) for piece in pieces]
    if quad is not None:
        device_parts.append(_quadrature_source(name, quad))
    device_source = "\n".join(device_parts) + "\n"
    kernels = [f"{name}_rbf_context_{suffix}" for suffix in ("f32", "f64")]
    kernel_source = cuda.REDUCTIONS + "".join(
        CONTEXT_KERNEL.format(name=name, T=T, suffix=suffix,
                              quadrature="" if quad is None else QUADRATURE_BRANCH.format(name=name, T=T))
        for T, suffix in (("float", "f32"), ("double", "f64"))
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
        f"CUDA_SOURCE compiles with NVRTC on its own (kernels launched with {contract.CUDA_THREADS} threads per block).",
        '"""',
    ]
    body = [
        f"NAME = {name!r}",
        f"REGULARIZER = {reg_text!r}",
        f"FAMILY = {cm.family!r}",
        f"CUDA_THREADS = {contract.CUDA_THREADS}",
        f"CUDA_KERNELS = {tuple(kernels)!r}",
        "",
    ]
    body += _quadrature_constants_text(quad)
    for piece in pieces:
        body += ["", _python_function(piece, [], py), ""]
    body += ["", _DENSITY[cm.family], ""]
    body += ["", _tuple_function("rbf_expectation_grad", ["mu", "sigma2", "c", "s2"], [e, e_mu, e_var],
                                 "(E, dE/dmu, dE/dsigma2) for E = E_p[N(t; c, s2)], sharing one evaluation.", py), ""]
    body += ["", _tuple_function("rbf_expectation_theta", ["theta_1", "theta_2", "c", "s2"], list(theta),
                                 "(E, dE/dtheta_1, dE/dtheta_2) for scores theta_1 t + theta_2 t^2 (theta_2 < 0).", py), ""]
    return assemble(doc, body, device_source, kernel_source,
                    [f"map: {name} (continuous)", f"regularizer: omega(p) = {reg_text}"])
