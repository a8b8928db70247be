// regattn's CUDA prelude: float and double overloads of the math functions generated code calls (rg_*),
// infinity, NaN, the rounding unit, the smallest normal and its log, a compensated running sum, and the
// clipped link and weight of a map's struct (see rows.cuh).  No header and no intrinsic: the same text
// compiles with NVRTC and, behind a header that empties __device__ (derive.codegen.compilers.HOST_HEADER),
// with g++ on the host.
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
__device__ __forceinline__ float rg_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double rg_log1p(double x) { return log1p(x); }
__device__ __forceinline__ float rg_expm1(float x) { return expm1f(x); }
__device__ __forceinline__ double rg_expm1(double x) { return expm1(x); }
template <typename T> __device__ __forceinline__ T rg_inf() { return T(1) / T(0); }
template <typename T> __device__ __forceinline__ T rg_nan() { return T(0) / T(0); }
template <typename T> __device__ __forceinline__ T rg_tiny();  // the smallest normal
template <> __device__ __forceinline__ float rg_tiny<float>() { return 1.17549435e-38f; }
template <> __device__ __forceinline__ double rg_tiny<double>() { return 2.2250738585072014e-308; }
template <typename T> __device__ __forceinline__ T rg_eps();
template <> __device__ __forceinline__ float rg_eps<float>() { return 1.1920929e-07f; }
template <> __device__ __forceinline__ double rg_eps<double>() { return 2.220446049250313e-16; }
template <typename T> __device__ __forceinline__ T rg_log_tiny();  // log of the smallest normal
template <> __device__ __forceinline__ float rg_log_tiny<float>() { return -87.3f; }
template <> __device__ __forceinline__ double rg_log_tiny<double>() { return -708.3; }

// Kahan: sum - carry holds a thread's running total to about one ulp however many terms it adds (an
// infinite total has no carry: inf - inf would make it NaN)
template <typename T> __device__ __forceinline__ void rg_add_compensated(T& sum, T& carry, T v) {
    T y = v - carry, t = sum + y;
    carry = rg_fabs(t) < rg_inf<T>() ? (t - sum) - y : T(0);
    sum = t;
}

// the clipped link g_+(z) of a map's struct (see rows.cuh): 0 at or below omega'(0+) (and for z = -inf), NaN for NaN
template <class M, typename T> __device__ __forceinline__ T rg_link_plus(const M& map, T z) {
    if (z != z) return z;
    if (z == -rg_inf<T>() || z <= map.clip()) return T(0);
    return map.link(z);
}

// the map's weight w(p) on the support, 0 off it; a NaN p (a NaN row) gives NaN
template <class M, typename T> __device__ __forceinline__ T rg_weight_plus(const M& map, T p) {
    return p > T(0) ? map.weight(p) : (p == p ? T(0) : p);
}
#endif
