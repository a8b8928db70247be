"""Turn a :class:`~derive.continuous.ContinuousDerivation` into the text of an importable module.

:func:`generate_continuous_module` writes, for a continuous map called ``NAME``:

* constants ``NAME``, ``REGULARIZER``, ``FAMILY`` (``"gaussian"`` or
  ``"compact"``), ``FORMAT_VERSION`` (:data:`numeric.contract.FORMAT_VERSION`, also
  in the header), ``CUDA_THREADS`` and ``CUDA_KERNELS``;
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
  ``theta_1 t + theta_2 t^2`` (the derivatives in ``theta`` exist only there:
  :data:`THETA_PARTS`); compact maps also ``support_radius_dsigma2``;
* ``CUDA_DEVICE_SOURCE``: the functions the context kernel calls as
  ``template <typename T> __device__`` functions, the Gauss-Legendre tables where
  the map has them, and the struct ``NAME_map<T>`` through which the package's
  kernel (``numeric/kernels/context.cuh``) calls them; ``CUDA_SOURCE`` adds that
  kernel and the entry points ``NAME_rbf_context_{f32,f64}`` filling ``E``,
  ``dE/dmu`` and ``dE/dsigma2`` for every (row, basis function) pair.

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
from functools import cache

import mpmath
import numpy as np
import sympy as sp

from numeric import contract

from ..continuous import ContinuousDerivation, sigma2
from ..errors import DerivationError
from .emit import cuda_function, Piece, python_function, assemble, check_name
from .printers import CudaPrinter, PyPrinter, print_block

__all__ = ["generate_continuous_module", "continuous_functions", "THETA_PARTS", "numpy_function", "DEVICE_FUNCTIONS", "QUADRATURE_NODES", "legendre_rule", "quadrature_gamma", "quadrature_threshold", "quadrature_constants"]

#: Node counts of the Gauss-Legendre rules a generated module carries (even: the nodes pair up as +-x).
QUADRATURE_NODES = (4, 6, 8, 12, 16, 24, 32, 48, 64)
#: Rounding unit the node counts are chosen for, by C type.
_UNIT = {"double": 2.0**-53, "float": 2.0**-24}
#: Past ``|d| = a + 8 s`` every ``erf`` in the closed form is +-1 to the last bit, and its terms cancel exactly.
_SATURATED = 8.0
#: The closed form is used where its cancellation bound stays below this many rounding units.
_CLOSED_FORM_ULPS = 64.0

@cache
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
    rhos = [1 + 10 ** (e / 50) for e in range(-150, 101)]
    bigs = [(rho + 1 / rho) / 2 for rho in rhos]
    # the log of the bound at (gamma, rho) is head + gamma R^2 - tail, the parts without gamma computed once
    head = np.array([math.log(64 / 15) + math.log(sum(abs(p) * big**j for j, p in enumerate(shape)) * big * big)
                     for big in bigs])
    tail = [2 * (n - 1) * math.log(rho) for rho in rhos], [math.log(rho * rho - 1) for rho in rhos]
    tail, bigs = (np.array(tail[0]), np.array(tail[1])), np.array(bigs)
    fits = lambda gamma: float(np.min(head + gamma * bigs * bigs - tail[0] - tail[1])) <= math.log(unit)  # noqa: E731
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
    from ..continuous import X

    poly = sp.Poly(shape, X)
    coeffs = tuple(float(poly.coeff_monomial(X**j)) for j in range(poly.degree() + 1))
    rules = []
    for n in QUADRATURE_NODES:
        nodes, weights = legendre_rule(n)
        rules.append((n, quadrature_gamma(n, coeffs, _UNIT["double"]), quadrature_gamma(n, coeffs, _UNIT["float"]),
                      nodes, weights))
    return {"SHAPE": coeffs, "DEGREE": cm.degree, "QUADRATURE_BELOW": quadrature_threshold(cm.degree),
            "QUADRATURE_RULES": tuple(rules)}


def _quadrature_source(name: str, q: dict) -> list[str]:
    """The Gauss-Legendre tables of ``q`` (:func:`quadrature_constants`) as ``__device__`` arrays, and the
    members of ``NAME_map`` that hand them to ``rg_rbf_quadrature`` (``numeric/kernels/context.cuh``)."""
    rules = q["QUADRATURE_RULES"]
    counts = [len(rule[3]) for rule in rules]
    starts = [sum(counts[:k]) for k in range(len(counts))]
    flat = lambda values: ", ".join(repr(float(v)) for v in values)  # noqa: E731
    horner = "T(0)"
    for coeff in reversed(q["SHAPE"]):
        horner = f"T({float(coeff)!r})" if horner == "T(0)" else f"({horner}) * x + T({float(coeff)!r})"
    n, total = len(rules), sum(counts)
    tables = [
        f"__device__ const int {name}_gl_count[{n}] = {{{', '.join(map(str, counts))}}};",
        f"__device__ const int {name}_gl_start[{n}] = {{{', '.join(map(str, starts))}}};",
        f"__device__ const double {name}_gl_gamma_f64[{n}] = {{{flat(r[1] for r in rules)}}};",
        f"__device__ const double {name}_gl_gamma_f32[{n}] = {{{flat(r[2] for r in rules)}}};",
        f"__device__ const double {name}_gl_x[{total}] = {{{flat(x for r in rules for x in r[3])}}};",
        f"__device__ const double {name}_gl_w[{total}] = {{{flat(w for r in rules for w in r[4])}}};",
    ]
    members = [
        f"    static constexpr int rules = {n};",
        f"    static constexpr double below = {q['QUADRATURE_BELOW']!r};",
        f"    __device__ const int* gl_count() const {{ return {name}_gl_count; }}",
        f"    __device__ const int* gl_start() const {{ return {name}_gl_start; }}",
        f"    __device__ const double* gl_x() const {{ return {name}_gl_x; }}",
        f"    __device__ const double* gl_w() const {{ return {name}_gl_w; }}",
        f"    __device__ const double* gl_gamma(bool single) const {{ return single ? {name}_gl_gamma_f32 : "
        f"{name}_gl_gamma_f64; }}",
        f"    __device__ T shape(T x) const {{ return {horner}; }}",
    ]
    return tables, members


#: The routines of a continuous map the context kernel calls (numeric/kernels/context.cuh): its device functions.
_CONTEXT_METHODS = {"support_radius": ("sigma2",), "support_radius_dsigma2": ("sigma2",),
                    "rbf_expectation": ("mu", "sigma2", "c", "s2"), "rbf_expectation_dmu": ("mu", "sigma2", "c", "s2"),
                    "rbf_expectation_dsigma2": ("mu", "sigma2", "c", "s2")}


#: The functions a continuous module has as ``template <typename T> __device__`` functions.
DEVICE_FUNCTIONS = tuple(_CONTEXT_METHODS)


def _map_struct(name: str, pieces: list[Piece], quad: dict | None) -> str:
    """``NAME_map<T>``: the interface of the context kernel to this map, after its quadrature tables."""
    tables, members = _quadrature_source(name, quad) if quad is not None else ([], [])
    have = {pc.name for pc in pieces}
    lines = tables + [f"// the interface of the context kernel (numeric/kernels/context.cuh) to {name}",
                      f"template <typename T> struct {name}_map {{",
                      f"    static constexpr bool quadrature = {'true' if quad is not None else 'false'};"]
    for routine, args in _CONTEXT_METHODS.items():
        if routine in have:
            decl, call = ", ".join(f"T {a}" for a in args), ", ".join(args)
            lines.append(f"    __device__ T {routine}({decl}) const {{ return {name}_{routine}<T>({call}); }}")
    return "\n".join(lines + members + ["};"])


def _entry_points(name: str) -> str:
    """The ``extern "C"`` kernels ``NAME_rbf_context_{f32,f64}``: ``rg_rbf_context`` with the map's struct."""
    out = []
    for T, suffix in (("float", "f32"), ("double", "f64")):
        out += [f'extern "C" __global__ void {name}_rbf_context_{suffix}(const {T}* mu, const {T}* sigma2, '
                f"const {T}* c, const {T}* s2,",
                f"        long long rows, long long nbasis, {T}* e, {T}* dmu, {T}* dsigma2) {{",
                f"    rg_rbf_context(mu, sigma2, c, s2, rows, nbasis, e, dmu, dsigma2, {name}_map<{T}>{{}});", "}"]
    return "\n".join(out)


#: The scalar functions a continuous module has only as an entry of ``rbf_expectation_theta``'s result (which
#: shares one evaluation with the value), by that entry's index.
THETA_PARTS = {"rbf_expectation_dtheta_1": 1, "rbf_expectation_dtheta_2": 2}


def numpy_function(module, fname: str):
    """The NumPy function of a continuous module computing the scalar function ``fname`` of
    :func:`continuous_functions`: the module's own, or the entry of ``rbf_expectation_theta`` (:data:`THETA_PARTS`)."""
    if fname in THETA_PARTS:
        return lambda *args: module.rbf_expectation_theta(*args)[THETA_PARTS[fname]]
    return getattr(module, fname)


def continuous_functions(cm: ContinuousDerivation) -> list[Piece]:
    """The scalar functions of a continuous module, the truth the verifier checks: each a NumPy function (those
    of :data:`THETA_PARTS` an entry of ``rbf_expectation_theta``), those the context kernel calls also CUDA
    device functions."""
    e, e_mu, e_var = cm.rbf_expectation_grad()
    _, e_t1, e_t2 = cm.rbf_expectation_theta()
    inside = "on the support |t - mu| < a" if cm.family == "compact" else "a Gaussian"
    pieces = [
        Piece("support_radius", ["sigma2"], cm.support_radius, "a: the density is zero where |t - mu| >= a."),
        Piece("density_inside", ["t", "mu", "sigma2"], cm.density_at(), f"p(t) {inside} (not clipped)."),
        Piece("rbf_expectation", ["mu", "sigma2", "c", "s2"], e, "E_p[N(t; c, s2)], the context of one Gaussian basis function."),
        Piece("rbf_expectation_dmu", ["mu", "sigma2", "c", "s2"], e_mu, "d/dmu E_p[N(t; c, s2)]."),
        Piece("rbf_expectation_dsigma2", ["mu", "sigma2", "c", "s2"], e_var, "d/dsigma2 E_p[N(t; c, s2)]."),
        Piece("rbf_expectation_dtheta_1", ["theta_1", "theta_2", "c", "s2"], e_t1,
               "d/dtheta_1 E_p[N(t; c, s2)] for scores theta_1 t + theta_2 t^2 (theta_2 < 0)."),
        Piece("rbf_expectation_dtheta_2", ["theta_1", "theta_2", "c", "s2"], e_t2,
               "d/dtheta_2 E_p[N(t; c, s2)] for scores theta_1 t + theta_2 t^2 (theta_2 < 0)."),
    ]
    if cm.family == "compact":
        pieces.insert(1, Piece("support_radius_dsigma2", ["sigma2"], sp.simplify(sp.diff(cm.support_radius, sigma2)),
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
    device_parts = [cuda_function(piece, [], cu, name) for piece in pieces if piece.name in _CONTEXT_METHODS]
    device_parts.append(_map_struct(name, pieces, quad))
    device_source = "\n".join(device_parts) + "\n"
    kernels = [f"{name}_rbf_context_{suffix}" for suffix in ("f32", "f64")]
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
        f"FORMAT_VERSION = {contract.FORMAT_VERSION}",
        f"CUDA_THREADS = {contract.CUDA_THREADS}",
        f"CUDA_KERNELS = {tuple(kernels)!r}",
        "",
    ]
    body += _quadrature_constants_text(quad)
    for piece in pieces:
        if piece.name not in THETA_PARTS:
            body += ["", python_function(piece, [], py), ""]
    body += ["", _DENSITY[cm.family], ""]
    body += ["", _tuple_function("rbf_expectation_grad", ["mu", "sigma2", "c", "s2"], [e, e_mu, e_var],
                                 "(E, dE/dmu, dE/dsigma2) for E = E_p[N(t; c, s2)], sharing one evaluation.", py), ""]
    body += ["", _tuple_function("rbf_expectation_theta", ["theta_1", "theta_2", "c", "s2"], list(theta),
                                 "(E, dE/dtheta_1, dE/dtheta_2) for scores theta_1 t + theta_2 t^2 (theta_2 < 0).", py), ""]
    return assemble(doc, body, device_source, _entry_points(name), "context_source",
                    [f"map: {name} (continuous)", f"regularizer: omega(p) = {reg_text}",
                     f"format: {contract.FORMAT_VERSION}"])
