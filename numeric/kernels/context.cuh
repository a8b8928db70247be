// regattn's context kernel of a continuous map, written once for every map.  A map enters as a struct of its
// generated device functions (`template <typename T> struct NAME_map`, printed by derive.codegen.continuous
// into the module's CUDA_DEVICE_SOURCE) providing
//
//   T support_radius(T sigma2), support_radius_dsigma2(T sigma2) const;   a, da/dsigma2 (a = inf: Gaussian)
//   T rbf_expectation(T mu, T sigma2, T c, T s2) const;                    E_p[N(t; c, s2)], closed form
//   T rbf_expectation_dmu(...), rbf_expectation_dsigma2(...) const;       its derivatives in mu and sigma2
//   static constexpr bool quadrature;                                      whether it carries the rules below
//
// and, for a truncated polynomial of fixed shape p(u) = P(u / a) / a whose closed form cancels where the
// support is narrow next to the basis function (derive.codegen.continuous), the Gauss-Legendre rules:
//
//   static constexpr int rules; static constexpr double below;   the rules, and the cut a < below * sqrt(s2)
//   const int* gl_count(), gl_start(); const double* gl_x(), gl_w();   nodes x > 0 and doubled weights
//   const double* gl_gamma(bool single) const;                    the gamma up to which each rule serves
//   T shape(T x) const;                                           P(x)
#ifndef REGATTN_CONTEXT
#define REGATTN_CONTEXT

// The context of a fixed-shape truncated polynomial p(u) = P(u/a)/a by Gauss-Legendre on
// the support, with u = a x, d = c - mu, h = u^2 / (2 s2), y = d u / s2 and
// psi(mu + u) = phi0 exp(y - h), phi0 = N(c; mu, s2).  Pairing the nodes +-x (P is even):
//   E          = phi0 (1 + sum w P (expm1(-h) cosh y + 2 sinh^2(y/2)))       (int P = 1 exactly)
// where expm1(-h) = e^(-h) - 1 = -2 e^(-h/2) sinh(h/2)
//   dE/dmu     = phi0 (d / s2) (E / phi0 - (a^2 / s2) S1)
//   dE/dsigma2 = a'(sigma2) phi0 (a / s2) ((d^2 / s2) S1 - C2)
// with S1 = sum w P x^2 e^(-h) sinh(y) / y and C2 = sum w P x^2 e^(-h) cosh(y): no term
// is large next to the result, so nothing cancels but what the exact values cancel.
// Returns false (nothing written) where the closed form is to be used.
template <class M, typename T>
__device__ bool rg_rbf_quadrature(const M& map, T mu, T sigma2, T c, T s2, T* e, T* dmu, T* dsigma2) {
    const T a = map.support_radius(sigma2);
    const T s = rg_sqrt(s2);
    if (!(a < T(M::below) * s)) return false;
    const T d = c - mu;
    const T gamma = (a * rg_fabs(d) + a * a / T(2)) / s2;
    const double* limits = map.gl_gamma(sizeof(T) == sizeof(float));
    int rule = -1;
    for (int k = 0; k < M::rules; ++k) {
        if (gamma <= T(limits[k])) { rule = k; break; }
    }
    if (rule < 0) return false;  // far from the support: erf has saturated and the closed form is exact
    T sum0 = T(0), s1 = T(0), c2 = T(0);
    const int first = map.gl_start()[rule], last = first + map.gl_count()[rule];
    for (int i = first; i < last; ++i) {
        const T x = T(map.gl_x()[i]), w = T(map.gl_w()[i]);
        const T shape = map.shape(x);
        const T u = a * x, h = u * u / (T(2) * s2), y = d * u / s2;
        const T eh = rg_exp(-h), ch = rg_cosh(y), half = rg_sinh(y / T(2));
        const T expm1_h = T(-2) * rg_exp(-h / T(2)) * rg_sinh(h / T(2));  // e^(-h) - 1 without cancellation
        const T sinhc = y == T(0) ? T(1) : rg_sinh(y) / y;
        sum0 += w * shape * (expm1_h * ch + T(2) * half * half);
        s1 += w * shape * x * x * eh * sinhc;
        c2 += w * shape * x * x * eh * ch;
    }
    const T phi0 = rg_exp(-d * d / (T(2) * s2)) / rg_sqrt(T(2) * T(3.141592653589793) * s2);
    const T b0 = T(1) + sum0;
    *e = phi0 * b0;
    *dmu = phi0 * (d / s2) * (b0 - a * a / s2 * s1);
    *dsigma2 = map.support_radius_dsigma2(sigma2) * phi0 * (a / s2) * (d * d / s2 * s1 - c2);
    return true;
}

// e[r, j] = E_p[N(t; c_j, s2_j)] for p of (mu_r, sigma2_r), and its derivatives; dmu, dsigma2 may be null
template <class M, typename T>
__device__ void rg_rbf_context(const T* mu, const T* sigma2, const T* c, const T* s2, long long rows,
                               long long nbasis, T* e, T* dmu, T* dsigma2, const M map) {
    long long n = rows * nbasis;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        long long r = i / nbasis, j = i % nbasis;
        if constexpr (M::quadrature) {
            T qe, qmu, qvar;
            if (rg_rbf_quadrature(map, mu[r], sigma2[r], c[j], s2[j], &qe, &qmu, &qvar)) {
                e[i] = qe;
                if (dmu) dmu[i] = qmu;
                if (dsigma2) dsigma2[i] = qvar;
                continue;
            }
        }
        e[i] = map.rbf_expectation(mu[r], sigma2[r], c[j], s2[j]);
        if (dmu) dmu[i] = map.rbf_expectation_dmu(mu[r], sigma2[r], c[j], s2[j]);
        if (dsigma2) dsigma2[i] = map.rbf_expectation_dsigma2(mu[r], sigma2[r], c[j], s2[j]);
    }
}
#endif
