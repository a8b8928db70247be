"""CUDA C++ for a derivation: type-generic device functions and the kernels CuPy launches.

The source has two parts.

``device_source``: a prelude (``rg_*`` math overloads for float and double,
``rg_inf``, and those of :data:`PRELUDE_EXTRAS` the functions call) and one ``template <typename T> __device__`` function per piece of
the derivation.  It includes no header and uses no CUDA intrinsic, so the same
text compiles with NVRTC and, behind a three-line header that empties
``__device__``, with g++ on the host, where the tests call it through ctypes.

``kernel_source``: ``extern "C"`` kernels, one per dtype (``_f32``, ``_f64``),
all launched with 256 threads per block:

* ``NAME_forward_from_tau``: elementwise ``p = g_+(s - tau[row])``;
* ``NAME_forward_rows``: one block per row: max, then the threshold (closed
  form, or Newton with a bisection safeguard on the bracket followed, for the
  sort kind, by the exact support formula), then ``p``; writes ``tau`` too;
* ``NAME_jvp``: one block per row, ``J v = w*v - w (w.v) / sum(w)`` with
  ``w = w(p)`` on the support (``J`` is symmetric, so this is also the VJP).
"""

from __future__ import annotations

from numeric.newton import Ops, invert_link

PRELUDE = r"""// regattn prelude: float/double overloads, infinity, block reductions live in the kernel part
#ifndef REGATTN_PRELUDE
#define REGATTN_PRELUDE
__device__ __forceinline__ float rg_exp(float x) { return expf(x); }
__device__ __forceinline__ double rg_exp(double x) { return exp(x); }
__device__ __forceinline__ float rg_log(float x) { return logf(x); }
__device__ __forceinline__ double rg_log(double x) { return log(x); }
__device__ __forceinline__ float rg_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double rg_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float rg_cbrt(float x) { return cbrtf(x); }
__device__ __forceinline__ double rg_cbrt(double x) { return cbrt(x); }
__device__ __forceinline__ float rg_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double rg_pow(double x, double y) { return pow(x, y); }
__device__ __forceinline__ float rg_sin(float x) { return sinf(x); }
__device__ __forceinline__ double rg_sin(double x) { return sin(x); }
__device__ __forceinline__ float rg_cos(float x) { return cosf(x); }
__device__ __forceinline__ double rg_cos(double x) { return cos(x); }
__device__ __forceinline__ float rg_tan(float x) { return tanf(x); }
__device__ __forceinline__ double rg_tan(double x) { return tan(x); }
__device__ __forceinline__ float rg_sinh(float x) { return sinhf(x); }
__device__ __forceinline__ double rg_sinh(double x) { return sinh(x); }
__device__ __forceinline__ float rg_cosh(float x) { return coshf(x); }
__device__ __forceinline__ double rg_cosh(double x) { return cosh(x); }
__device__ __forceinline__ float rg_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double rg_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float rg_asinh(float x) { return asinhf(x); }
__device__ __forceinline__ double rg_asinh(double x) { return asinh(x); }
__device__ __forceinline__ float rg_acosh(float x) { return acoshf(x); }
__device__ __forceinline__ double rg_acosh(double x) { return acosh(x); }
__device__ __forceinline__ float rg_atanh(float x) { return atanhf(x); }
__device__ __forceinline__ double rg_atanh(double x) { return atanh(x); }
__device__ __forceinline__ float rg_asin(float x) { return asinf(x); }
__device__ __forceinline__ double rg_asin(double x) { return asin(x); }
__device__ __forceinline__ float rg_acos(float x) { return acosf(x); }
__device__ __forceinline__ double rg_acos(double x) { return acos(x); }
__device__ __forceinline__ float rg_atan(float x) { return atanf(x); }
__device__ __forceinline__ double rg_atan(double x) { return atan(x); }
__device__ __forceinline__ float rg_erf(float x) { return erff(x); }
__device__ __forceinline__ double rg_erf(double x) { return erf(x); }
__device__ __forceinline__ float rg_fabs(float x) { return fabsf(x); }
__device__ __forceinline__ double rg_fabs(double x) { return fabs(x); }
template <typename T> __device__ __forceinline__ T rg_inf() { return T(1) / T(0); }
template <typename T> __device__ __forceinline__ T rg_eps();
template <> __device__ __forceinline__ float rg_eps<float>() { return 1.1920929e-07f; }
template <> __device__ __forceinline__ double rg_eps<double>() { return 2.220446049250313e-16; }
template <typename T> __device__ __forceinline__ T rg_log_tiny();  // log of the smallest normal
template <> __device__ __forceinline__ float rg_log_tiny<float>() { return -87.3f; }
template <> __device__ __forceinline__ double rg_log_tiny<double>() { return -708.3; }
#endif
"""

# Overloads that a module's prelude holds only where its functions call them
# (printers.stable_form brings them in), each under an include guard of its own.
PRELUDE_EXTRAS = {
    "rg_log1p": r"""#ifndef REGATTN_LOG1P
#define REGATTN_LOG1P
__device__ __forceinline__ float rg_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double rg_log1p(double x) { return log1p(x); }
#endif
""",
    "rg_expm1": r"""#ifndef REGATTN_EXPM1
#define REGATTN_EXPM1
__device__ __forceinline__ float rg_expm1(float x) { return expm1f(x); }
__device__ __forceinline__ double rg_expm1(double x) { return expm1(x); }
#endif
""",
}


def prelude_for(code: str) -> str:
    """:data:`PRELUDE` and the :data:`PRELUDE_EXTRAS` that ``code`` calls."""
    return PRELUDE + "".join(text for fname, text in PRELUDE_EXTRAS.items() if f"{fname}(" in code)


class _C:
    """A value of the C tracer: the name of a local (or a literal) and its type."""

    def __init__(self, tracer: _Tracer, text: str, kind: str = "T"):
        self.tracer, self.text, self.kind = tracer, text, kind

    def _bin(self, op, other, kind="T", swap=False):
        a, b = self.text, self.tracer.value(other).text
        return self.tracer.let(f"{b} {op} {a}" if swap else f"{a} {op} {b}", kind)

    def __add__(self, o): return self._bin("+", o)
    def __radd__(self, o): return self._bin("+", o, swap=True)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, swap=True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, swap=True)
    def __truediv__(self, o): return self._bin("/", o)
    def __rtruediv__(self, o): return self._bin("/", o, swap=True)
    def __lt__(self, o): return self._bin("<", o, "bool")
    def __le__(self, o): return self._bin("<=", o, "bool")
    def __gt__(self, o): return self._bin(">", o, "bool")
    def __ge__(self, o): return self._bin(">=", o, "bool")
    def __eq__(self, o): return self._bin("==", o, "bool")  # type: ignore[override]
    def __ne__(self, o): return self._bin("!=", o, "bool")  # type: ignore[override]
    def __and__(self, o): return self._bin("&&", o, "bool")
    def __neg__(self): return self.tracer.let(f"-{self.text}")
    def __abs__(self): return self.tracer.let(f"rg_fabs({self.text})")

    __hash__ = None  # type: ignore[assignment]


class _Tracer(Ops):
    """:class:`numeric.newton.Ops` whose values are C: each operation appends a statement."""

    def __init__(self, indent: str = "    "):
        self.lines: list[str] = []
        self.indent = indent
        self.count = 0
        self.log_tiny = _C(self, "rg_log_tiny<T>()")
        self.eps = _C(self, "rg_eps<T>()")

    def value(self, x) -> _C:
        if isinstance(x, _C):
            return x
        if isinstance(x, bool):
            return _C(self, "true" if x else "false", "bool")
        return _C(self, f"T({x!r})")

    def let(self, expr: str, kind: str = "T") -> _C:
        self.count += 1
        name = f"{'b' if kind == 'bool' else 'v'}{self.count}"
        self.lines.append(f"{self.indent}const {kind} {name} = {expr};")
        return _C(self, name, kind)

    def call(self, fname: str, *args) -> _C:
        return self.let(f"{fname}({', '.join(self.value(a).text for a in args)})")

    def full(self, like, value):
        return self.value(value)

    def exp(self, x):
        return self.call("rg_exp", x)

    def where(self, cond, a, b):
        a, b = self.value(a), self.value(b)
        return self.let(f"{self.value(cond).text} ? {a.text} : {b.text}", a.kind)

    def not_(self, b):
        return self.let(f"!{self.value(b).text}", "bool")

    def repeat(self, n, body, state, going):
        self.count += 1
        tag = self.count
        names = [f"s{tag}_{i}" for i in range(len(state))]
        for nm, v in zip(names, state):
            v = self.value(v)
            self.lines.append(f"{self.indent}{v.kind} {nm} = {v.text};")
        self.lines.append(f"{self.indent}bool go{tag} = {self.value(going).text};")
        self.lines.append(f"{self.indent}for (int i{tag} = 0; i{tag} < {n} && go{tag}; ++i{tag}) {{")
        outer, self.indent = self.indent, self.indent + "    "
        kinds = [self.value(v).kind for v in state]
        new, cont = body(tuple(_C(self, nm, kd) for nm, kd in zip(names, kinds)))
        for nm, v in zip(names, new):
            self.lines.append(f"{self.indent}{nm} = {self.value(v).text};")
        self.lines.append(f"{self.indent}go{tag} = {self.value(cont).text};")
        self.indent = outer
        self.lines.append(f"{self.indent}}}")
        return tuple(_C(self, nm, kd) for nm, kd in zip(names, kinds))


def newton_link_source(name: str, params: list[str]) -> str:
    """The device function ``NAME_link(z, params...)`` for a link with no closed form.

    It is :func:`numeric.newton.invert_link` traced into C: the same algorithm as
    the NumPy link and the reference, in the function's precision ``T``.
    """
    tr = _Tracer()
    z = _C(tr, "z")
    args = [_C(tr, q) for q in params]
    p = invert_link(
        tr,
        z,
        lambda q: tr.call(f"{name}_omega_prime", q, *args),
        lambda q: tr.call(f"{name}_omega_second", q, *args),
    )
    decl = "".join(f", T {q}" for q in params)
    head = (
        f"template <typename T> __device__ __forceinline__ T {name}_link(T z{decl}) {{\n"
        "    // omega'(p) = z for p: numeric.newton.invert_link (safeguarded Newton on u = log p, then in p)"
    )
    return "\n".join([head, *tr.lines, f"    return {p.text};", "}"])


LINK_PLUS = r"""
template <typename T> __device__ __forceinline__ T {name}_link_plus(T z{params_decl}) {{
    // the clipped link g_+(z): 0 at or below omega'(0+) (and for z = -inf)
    if (z != z) return z;
    if (z == -rg_inf<T>() || z <= {name}_clip<T>({params_only})) return T(0);
    return {name}_link(z{params_call});
}}
"""

REDUCTIONS = r"""
#ifndef REGATTN_REDUCTIONS
#define REGATTN_REDUCTIONS
#ifndef REGATTN_HOST_EMULATION  // the host emulation (one thread per block) brings its own
template <typename T> __device__ __forceinline__ T rg_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
template <typename T> __device__ __forceinline__ T rg_warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) { T w = __shfl_down_sync(0xffffffffu, v, o); v = (w > v || w != w) ? w : v; }
    return v;
}
// block-wide sum / max of one value per thread; every thread gets the result
template <typename T> __device__ T rg_block_sum(T v, T* shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = rg_warp_sum(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = (threadIdx.x < (blockDim.x >> 5)) ? shared[lane] : T(0);
    if (warp == 0) v = rg_warp_sum(v);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    T out = shared[0];
    __syncthreads();
    return out;
}
template <typename T> __device__ T rg_block_max(T v, T* shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = rg_warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = (threadIdx.x < (blockDim.x >> 5)) ? shared[lane] : -rg_inf<T>();
    if (warp == 0) v = rg_warp_max(v);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    T out = shared[0];
    __syncthreads();
    return out;
}
#endif
#endif
"""

FORWARD_FROM_TAU = r"""
extern "C" __global__ void {name}_forward_from_tau_{suffix}(const {T}* s, const {T}* tau, {T}* p,
        long long rows, long long cols{params_kernel}) {{
    long long n = rows * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {{
        p[i] = {name}_link_plus<{T}>(s[i] - tau[i / cols]{params_call});
    }}
}}
"""

JVP = r"""
extern "C" __global__ void {name}_jvp_{suffix}(const {T}* p, const {T}* v, {T}* out,
        long long rows, long long cols{params_kernel}) {{
    // J v = w*v - w (w.v) / sum(w), w = w(p) on the support; J is symmetric, so also the VJP
    __shared__ {T} shared[32];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {{
        const {T}* pr = p + row * cols; const {T}* vr = v + row * cols; {T}* outr = out + row * cols;
        {T} sw = 0, swv = 0;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {{
            // off the support w = 0; a NaN p (a NaN row) gives w NaN, so the whole row comes out NaN
            {T} w = pr[j] > {T}(0) ? {name}_weight<{T}>(pr[j]{params_call}) : (pr[j] == pr[j] ? {T}(0) : pr[j]);
            sw += w; swv += w * vr[j];
        }}
        sw = rg_block_sum(sw, shared);
        swv = rg_block_sum(swv, shared);
        {T} mean = sw > {T}(0) ? swv / sw : (sw == sw ? {T}(0) : sw);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {{
            {T} w = pr[j] > {T}(0) ? {name}_weight<{T}>(pr[j]{params_call}) : (pr[j] == pr[j] ? {T}(0) : pr[j]);
            outr[j] = w * (vr[j] - mean);
        }}
    }}
}}
"""

FORWARD_ROWS_HEAD = r"""
extern "C" __global__ void {name}_forward_rows_{suffix}(const {T}* s, {T}* p, {T}* tau_out,
        long long rows, long long cols{params_kernel}) {{
    // one block per row: m = max(s); the threshold tau; p = g_+(s - tau)
    __shared__ {T} shared[32];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {{
        const {T}* sr = s + row * cols; {T}* pr = p + row * cols;
        {T} m = -rg_inf<{T}>(), finite = 0, nan = 0;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {{
            {T} v = sr[j];
            if (v != v) nan += 1; else if (v > -rg_inf<{T}>()) {{ finite += 1; m = v > m ? v : m; }}
        }}
        m = rg_block_max(m, shared);
        finite = rg_block_sum(finite, shared);
        nan = rg_block_sum(nan, shared);
        {T} tau, lo = 0, hi = 0, rho = 0, phi = 0, k = 1, r = 0;  // (the root solvers' final state)
        if (nan > {T}(0)) {{
            tau = {T}(0) / {T}(0);
        }} else if (finite == {T}(0)) {{
            tau = rg_inf<{T}>();  // every score masked: all probabilities 0
        }} else {{
"""

FORWARD_ROWS_CLOSED = r"""
            // closed form: tau = m + tau_from_sum(sum_j term(s_j - m))
            {T} total = 0;
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) {{
                {T} v = sr[j];
                if (v > -rg_inf<{T}>()) total += {name}_term<{T}>(v - m{params_call});
            }}
            total = rg_block_sum(total, shared);
            tau = m + {name}_tau_from_sum<{T}>(total{params_call});
"""

FORWARD_ROWS_ROOT = r"""
            // Newton on f(tau) = sum_j g_+(s_j - tau) - 1 (decreasing), f' = -sum_j w(p_j),
            // safeguarded by bisection on [m - omega'(1), m - omega'(1/n)]
            lo = m - {name}_omega_prime<{T}>({T}(1){params_call});
            hi = m - {name}_omega_prime<{T}>({T}(1) / finite{params_call});
            tau = lo;
            {T} step_old = hi - lo, step = step_old;
            for (int it = 0; it < 200; ++it) {{
                {T} f = 0, df = 0;
                for (long long j = threadIdx.x; j < cols; j += blockDim.x) {{
                    {T} q = {name}_link_plus<{T}>(sr[j] - tau{params_call});
                    f += q;
                    if (q > {T}(0)) df += {name}_weight<{T}>(q{params_call});
                }}
                f = rg_block_sum(f, shared) - {T}(1);
                df = rg_block_sum(df, shared);
                if (f == {T}(0)) break;
                if (f > {T}(0)) lo = tau; else hi = tau;
                {T} next = df > {T}(0) ? tau + f / df : lo - {T}(1);
                // (a Newton point on an end of the bracket is the root to rounding: accepted, it stops the
                // loop; taken for outside, it made every later step a bisection)
                if (next >= lo && next <= hi && rg_fabs(next - tau) < {T}(0.5) * rg_fabs(step_old)) {{
                    step_old = step; step = next - tau; tau = next;
                }} else {{
                    step_old = step; step = (hi - lo) / {T}(2); tau = lo + step;
                }}
                if (rg_fabs(step) <= {T}(2) * rg_eps<{T}>() * ({T}(1) + rg_fabs(tau))) break;
            }}
"""

FORWARD_ROWS_ROOT_TAIL = r"""
        }}
        // p = g_+(s - tau), divided by its sum (1 to the iteration's tolerance).  Where F jumps
        // across 1 between neighbouring floats of tau (a score entering the support where the
        // link's slope is infinite), no tau gives sum 1: p is the sum-1 combination of p at the
        // two ends of the final bracket [lo, hi], and the entering score takes the mass.
        {T} f_tau = 0, f_lo = 0, f_hi = 0;
        if (nan == {T}(0) && finite > {T}(0)) {{
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) {{
                f_tau += {name}_link_plus<{T}>(sr[j] - tau{params_call});
                f_lo += {name}_link_plus<{T}>(sr[j] - lo{params_call});
                f_hi += {name}_link_plus<{T}>(sr[j] - hi{params_call});
            }}
            f_tau = rg_block_sum(f_tau, shared);
            f_lo = rg_block_sum(f_lo, shared);
            f_hi = rg_block_sum(f_hi, shared);
        }}
        bool ends = rg_fabs(f_tau - {T}(1)) > {T}(4) * rg_eps<{T}>() && f_lo >= {T}(1) && f_hi <= {T}(1) && f_lo > f_hi;
        {T} lam = ends ? (f_lo - {T}(1)) / (f_lo - f_hi) : {T}(0);
        if (threadIdx.x == 0) tau_out[row] = tau;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {{
            {T} q;
            if (nan > {T}(0)) q = tau;
            else if (finite == {T}(0)) q = {T}(0);
            else if (ends) {{
                {T} a = {name}_link_plus<{T}>(sr[j] - lo{params_call}), b = {name}_link_plus<{T}>(sr[j] - hi{params_call});
                q = a + lam * (b - a);
            }} else q = {name}_link_plus<{T}>(sr[j] - tau{params_call}) / f_tau;
            pr[j] = q;
        }}
        __syncthreads();
    }}
}}
"""

FORWARD_ROWS_POWER = r"""
            // link of the power form g(z) = (a (z - z0))**k, z0 = omega'(0+).  With y = s - m,
            // c = p_max**(1/k) and r = a / c the ratios q_j = p_j / p_max = max(1 + r y_j, 0)**k
            // lie in [0, 1] and p_max = 1 / Q, Q = sum_j q_j; rho = log r solves
            // phi(rho) = rho - log(a) - log(Q) / k = 0, phi increasing with phi' >= 1, on
            // [log(a), log(a) + log(n) / k].  Nothing underflows (c may, at large alpha on long
            // rows) and nothing cancels where c is small (wide supports).  Newton with a bisection
            // safeguard; F = sum_j p_j = exp(-k phi).
            k = {name}_link_exponent<{T}>({params_only});
            {T} log_a = rg_log({name}_link_scale<{T}>({params_only}));
            lo = log_a; hi = log_a + rg_log(finite) / k;
            rho = lo;
            {T} step_old = hi - lo, step = step_old;
            for (int it = 0; it < 200; ++it) {{
                {T} q_sum = 0, slope = 0, er = rg_exp(rho);
                for (long long j = threadIdx.x; j < cols; j += blockDim.x) {{
                    {T} u = {name}_power_base<{T}>(rho, er, m - sr[j]);
                    if (u > {T}(0)) {{
                        {T} q = (k == {T}(1)) ? u : rg_exp(k * rg_log(u));
                        q_sum += q;
                        slope += q / u - q;
                    }}
                }}
                q_sum = rg_block_sum(q_sum, shared);
                slope = rg_block_sum(slope, shared);
                phi = rho - log_a - rg_log(q_sum) / k;
                if (phi == {T}(0)) {{ lo = hi = rho; break; }}
                if (phi < {T}(0)) lo = rho; else hi = rho;  // F >= 1 where phi <= 0
                if (k * rg_fabs(phi) <= {T}(2) * rg_eps<{T}>()) break;
                {T} next = rho - phi / ({T}(1) + slope / q_sum);
                if (next == rho) break;  // the root to rounding (a point on the bracket's end included)
                if (next >= lo && next <= hi && rg_fabs(next - rho) < {T}(0.5) * rg_fabs(step_old)) {{
                    step_old = step; step = next - rho; rho = next;
                }} else {{
                    step_old = step; step = (hi - lo) / {T}(2); rho = lo + step;
                }}
                if (hi - lo <= {T}(4) * rg_eps<{T}>() * rg_fabs(rho)) break;
            }}
            // rho is resolved to about |rho| ulps, r = exp(rho) likewise: where r is finite and the
            // row settled, Newton on F(r) = (a / r)**k Q(r) (one rounding in c = a / r, one in the
            // power) polishes r to a few ulps, which the wide supports' p = q / Q need
            r = rg_exp(rho);
            if (r < rg_inf<{T}>() && k * rg_fabs(phi) <= {T}(4) * rg_eps<{T}>()) {{
                // (within the initial bracket: the final one, exp(lo) to exp(hi), is a few ulps of rho
                // wide and rounds in exp, so it need not hold the root in r)
                {T} a = {name}_link_scale<{T}>({params_only}), r_lo = a, r_hi = a * rg_exp(rg_log(finite) / k);
                for (int it = 0; it < 2; ++it) {{
                    {T} q_sum = 0, carry = 0, slope = 0;
                    for (long long j = threadIdx.x; j < cols; j += blockDim.x) {{
                        {T} u = {T}(1) - r * (m - sr[j]);
                        if (u > {T}(0)) {{
                            {T} q = (k == {T}(1)) ? u : rg_exp(k * rg_log(u));
                            {name}_add_compensated<{T}>(q_sum, carry, q);
                            slope += q / u - q;
                        }}
                    }}
                    q_sum -= carry;
                    q_sum = rg_block_sum(q_sum, shared);
                    slope = rg_block_sum(slope, shared);
                    {T} f = rg_pow(a / r, k) * q_sum;  // F decreases in r; dF/dr = -k F (1 + slope / Q) / r
                    {T} next = r + (f - {T}(1)) * r / (k * f * ({T}(1) + slope / q_sum));
                    if (!(next > r_lo && next < r_hi)) break;
                    r = next;
                }}
            }}
            // tau - m = -c / a - z0 = -1/r - z0
            tau = m - (r < rg_inf<{T}>() ? {T}(1) / r : rg_exp(-rho)) - {name}_clip<{T}>({params_only});
        }}
        // p_j = F(rho) q_j(rho) / Q(rho).  Settled (k |phi| at most a few ulps): q_j / Q at r.  Where F
        // jumps across 1 at a kink, the sum-1 combination of p at the ends lo, hi of the bracket.
        {T} q_mid = 0, carry = 0, q_lo = 0, q_hi = 0;
        if (nan == {T}(0) && finite > {T}(0)) {{
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) {{
                {T} y = m - sr[j];
                {name}_add_compensated<{T}>(q_mid, carry, {name}_power_ratio<{T}>(rho, r, y, k));
                q_lo += {name}_power_ratio<{T}>(lo, rg_exp(lo), y, k);
                q_hi += {name}_power_ratio<{T}>(hi, rg_exp(hi), y, k);
            }}
            q_mid = rg_block_sum(q_mid - carry, shared);
            q_lo = rg_block_sum(q_lo, shared);
            q_hi = rg_block_sum(q_hi, shared);
        }}
        {T} log_a = rg_log({name}_link_scale<{T}>({params_only}));
        {T} f_lo = rg_exp(-k * (lo - log_a)) * q_lo, f_hi = rg_exp(-k * (hi - log_a)) * q_hi;  // F = exp(-k phi)
        bool ends = k * rg_fabs(phi) > {T}(4) * rg_eps<{T}>() && lo < hi && f_lo >= {T}(1) && f_hi <= {T}(1) && f_lo > f_hi;
        {T} lam = ends ? (f_lo - {T}(1)) / (f_lo - f_hi) : {T}(0);
        if (threadIdx.x == 0) tau_out[row] = tau;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {{
            {T} q;
            if (nan > {T}(0)) q = tau;
            else if (finite == {T}(0)) q = {T}(0);
            else if (ends) {{
                {T} y = m - sr[j];
                {T} pa = {name}_power_ratio<{T}>(lo, rg_exp(lo), y, k) * (f_lo / q_lo);
                {T} pb = {name}_power_ratio<{T}>(hi, rg_exp(hi), y, k) * (f_hi / q_hi);
                q = pa + lam * (pb - pa);
            }} else q = {name}_power_ratio<{T}>(rho, r, m - sr[j], k) / q_mid;
            pr[j] = q;
        }}
        __syncthreads();
    }}
}}
"""

POWER_RATIO = r"""
template <typename T> __device__ __forceinline__ T {name}_power_base(T rho, T r, T minus_y) {{
    // u = 1 + r y with r = exp(rho), y = s - max(s) <= 0: one rounding of r y where r is finite,
    // else -exp(rho + log(-y)) (r overflows where c underflows)
    return r < rg_inf<T>() ? T(1) - r * minus_y : T(1) - rg_exp(rho + rg_log(minus_y));
}}
template <typename T> __device__ __forceinline__ void {name}_add_compensated(T& sum, T& carry, T v) {{
    // Kahan: sum + carry holds the running total to about one ulp however many terms a thread adds
    T y = v - carry, t = sum + y;
    carry = (t - sum) - y;
    sum = t;
}}
template <typename T> __device__ __forceinline__ T {name}_power_ratio(T rho, T r, T minus_y, T k) {{
    // q = max(1 + r y, 0)**k: p / p_max at y = s - max(s) for a link of the power form (r = exp(rho))
    T u = {name}_power_base<T>(rho, r, minus_y);
    if (!(u > T(0))) return T(0);
    return k == T(1) ? u : rg_exp(k * rg_log(u));
}}
"""

FORWARD_ROWS_SORT = r"""
            // exact support formula on the support found by the iteration
            {T} k = 0, s1 = 0, s2 = 0, cut = {name}_clip<{T}>({params_only});
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) {{
                {T} v = sr[j];
                if (v - tau > cut) {{ {T} x = v - m; k += 1; s1 += x; s2 += x * x; }}
            }}
            k = rg_block_sum(k, shared);
            s1 = rg_block_sum(s1, shared);
            s2 = rg_block_sum(s2, shared);
            if (k > {T}(0)) tau = m + {name}_tau_candidate<{T}>(k, s1, s2{params_call});
"""

FORWARD_ROWS_TAIL = r"""
        }}
        if (threadIdx.x == 0) tau_out[row] = tau;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {{
            pr[j] = (nan > {T}(0)) ? tau : {name}_link_plus<{T}>(sr[j] - tau{params_call});
        }}
        __syncthreads();
    }}
}}
"""


def kernel_source(name: str, kind: str, params: list[str], form: str = "general") -> str:
    """The ``extern "C"`` kernels for one map, for float and double.

    ``form`` is the link's derived shape (:mod:`derive._linkform`): a root
    threshold with a link of the ``"power"`` form iterates on ``log(a / c)``
    (:data:`FORWARD_ROWS_POWER`); other root thresholds on ``tau``.
    """
    out = [REDUCTIONS]
    if kind == "root" and form == "power":
        out.append(POWER_RATIO.format(name=name))
    for T, suffix in (("float", "f32"), ("double", "f64")):
        fmt = dict(
            name=name,
            T=T,
            suffix=suffix,
            params_kernel="".join(f", {T} {q}" for q in params),
            params_call="".join(f", {q}" for q in params),
            params_only=", ".join(params),
        )
        out.append(FORWARD_FROM_TAU.format(**fmt))
        body = FORWARD_ROWS_HEAD
        if kind == "closed":
            body += FORWARD_ROWS_CLOSED + FORWARD_ROWS_TAIL
        elif kind == "sort":
            body += FORWARD_ROWS_ROOT + FORWARD_ROWS_SORT + FORWARD_ROWS_TAIL
        elif form == "power":
            body += FORWARD_ROWS_POWER
        else:
            body += FORWARD_ROWS_ROOT + FORWARD_ROWS_ROOT_TAIL
        out.append(body.format(**fmt))
        out.append(JVP.format(**fmt))
    return "".join(out)


def kernel_names(name: str) -> list[str]:
    return [f"{name}_{role}_{suffix}" for suffix in ("f32", "f64") for role in ("forward_from_tau", "forward_rows", "jvp")]
