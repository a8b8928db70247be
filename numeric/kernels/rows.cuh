// regattn's row kernels, written once for every map.  A map enters as a struct of its generated device
// functions (`template <typename T> struct NAME_map`, printed by derive.codegen.emit into the map module's
// CUDA_DEVICE_SOURCE) holding the map's parameters and providing
//
//   static constexpr rg_threshold threshold;   how tau is found (RG_CLOSED, RG_SORT, RG_ROOT, RG_ROOT_POWER)
//   T clip() const;                            omega'(0+): p = 0 where z = s - tau <= clip
//   T link(T z) const;                         g = (omega')^{-1}, unclipped
//   T weight(T p) const;                       w = 1/omega''(p)
//   T omega_prime(T p) const;
//   T term(T s), tau_from_sum(T S) const;      RG_CLOSED: tau = tau_from_sum(sum_j term(s_j))
//   T tau_candidate(T k, T S1, T S2) const;    RG_SORT: tau from the k largest scores (sum S1, squares S2)
//   T link_scale(), link_exponent() const;     RG_ROOT_POWER: g(z) = (a (z - clip))**k
//
// The map module's kernels (`extern "C"`, one per dtype, launched with numeric.contract.CUDA_THREADS threads
// per block) call the templates below with such a struct:
//
// * rg_forward_from_tau: elementwise p = g_+(s - tau[row]);
// * rg_forward_rows: one block per row: the maximum, then the threshold (closed form, or Newton with a
//   bisection safeguard on the bracket followed, for the sort kind, by the exact support formula), then p;
//   writes tau too;
// * rg_jvp: one block per row, J v = w*v - w (w.v) / sum(w) with w = w(p) on the support (J is symmetric,
//   so this is also the VJP).
#ifndef REGATTN_ROWS
#define REGATTN_ROWS

template <class M, typename T>
__device__ void rg_forward_from_tau(const T* s, const T* tau, T* p, long long rows, long long cols, const M map) {
    long long n = rows * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        p[i] = rg_link_plus(map, s[i] - tau[i / cols]);
    }
}

template <class M, typename T>
__device__ void rg_jvp(const T* p, const T* v, T* out, long long rows, long long cols, const M map) {
    __shared__ T shared[32];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* pr = p + row * cols; const T* vr = v + row * cols; T* outr = out + row * cols;
        T sw = 0, swv = 0;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            T w = rg_weight_plus(map, pr[j]);  // a NaN row comes out NaN as a whole
            sw += w; swv += w * vr[j];
        }
        sw = rg_block_sum(sw, shared);
        swv = rg_block_sum(swv, shared);
        T mean = sw > T(0) ? swv / sw : (sw == sw ? T(0) : sw);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            outr[j] = rg_weight_plus(map, pr[j]) * (vr[j] - mean);
        }
    }
}

// Newton on f(tau) = sum_j g_+(s_j - tau) - 1 (decreasing), f' = -sum_j w(p_j), safeguarded by bisection on
// [m - omega'(1), m - omega'(1/n)] (rg_safeguarded_point, traced from numeric.newton.safeguarded_point);
// tau is the root, [lo, hi] the final bracket
template <class M, typename T>
__device__ void rg_tau_newton(const M& map, const T* sr, long long cols, T m, T finite, T* shared, T& tau, T& lo,
                              T& hi) {
    lo = m - map.omega_prime(T(1));
    hi = m - map.omega_prime(T(1) / finite);
    tau = lo;
    T step_old = hi - lo, step = step_old;
    for (int it = 0; it < 200; ++it) {
        T f = 0, df = 0;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            T q = rg_link_plus(map, sr[j] - tau);
            f += q;
            if (q > T(0)) df += map.weight(q);
        }
        f = rg_block_sum(f, shared) - T(1);
        df = rg_block_sum(df, shared);
        if (f == T(0)) break;
        if (f > T(0)) lo = tau; else hi = tau;
        bool took;
        T next = rg_safeguarded_point<T>(tau, lo, hi, step_old, tau + f / df, df > T(0), false, took);
        step_old = step; step = next - tau; tau = next;
        if (rg_fabs(step) <= T(2) * rg_eps<T>() * (T(1) + rg_fabs(tau))) break;
    }
}

// u = 1 + r y with r = exp(rho), y = s - max(s) <= 0: one rounding of r y where r is finite,
// else -exp(rho + log(-y)) (r overflows where c underflows)
template <typename T> __device__ __forceinline__ T rg_power_base(T rho, T r, T minus_y) {
    return r < rg_inf<T>() ? T(1) - r * minus_y : T(1) - rg_exp(rho + rg_log(minus_y));
}
// Kahan: sum + carry holds the running total to about one ulp however many terms a thread adds
template <typename T> __device__ __forceinline__ void rg_add_compensated(T& sum, T& carry, T v) {
    T y = v - carry, t = sum + y;
    carry = (t - sum) - y;
    sum = t;
}
// q = max(1 + r y, 0)**k: p / p_max at y = s - max(s) for a link of the power form (r = exp(rho))
template <typename T> __device__ __forceinline__ T rg_power_ratio(T rho, T r, T minus_y, T k) {
    T u = rg_power_base<T>(rho, r, minus_y);
    if (!(u > T(0))) return T(0);
    return k == T(1) ? u : rg_exp(k * rg_log(u));
}

// A root threshold for a link of the power form g(z) = (a (z - z0))**k, z0 = omega'(0+).  With y = s - m,
// c = p_max**(1/k) and r = a / c the ratios q_j = p_j / p_max = max(1 + r y_j, 0)**k lie in [0, 1] and
// p_max = 1 / Q, Q = sum_j q_j; rho = log r solves phi(rho) = rho - log(a) - log(Q) / k = 0, phi increasing
// with phi' >= 1, on [log(a), log(a) + log(n) / k].  Nothing underflows (c may, at large alpha on long rows)
// and nothing cancels where c is small (wide supports).  Newton with a bisection safeguard; F = sum_j p_j =
// exp(-k phi).  Sets rho, r = exp(rho) (polished), the final bracket [lo, hi] of rho, phi there, and tau.
template <class M, typename T>
__device__ void rg_tau_power(const M& map, const T* sr, long long cols, T m, T finite, T* shared, T k, T& rho,
                             T& r, T& lo, T& hi, T& phi, T& tau) {
    T log_a = rg_log(map.link_scale());
    lo = log_a; hi = log_a + rg_log(finite) / k;
    rho = lo;
    T step_old = hi - lo, step = step_old;
    for (int it = 0; it < 200; ++it) {
        T q_sum = 0, slope = 0, er = rg_exp(rho);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            T u = rg_power_base<T>(rho, er, m - sr[j]);
            if (u > T(0)) {
                T q = (k == T(1)) ? u : rg_exp(k * rg_log(u));
                q_sum += q;
                slope += q / u - q;
            }
        }
        q_sum = rg_block_sum(q_sum, shared);
        slope = rg_block_sum(slope, shared);
        phi = rho - log_a - rg_log(q_sum) / k;
        if (phi == T(0)) { lo = hi = rho; break; }
        if (phi < T(0)) lo = rho; else hi = rho;  // F >= 1 where phi <= 0
        if (k * rg_fabs(phi) <= T(2) * rg_eps<T>()) break;
        T newton = rho - phi / (T(1) + slope / q_sum);
        if (newton == rho) break;  // the root to rounding (a point on the bracket's end included)
        bool took;
        T next = rg_safeguarded_point<T>(rho, lo, hi, step_old, newton, true, false, took);
        step_old = step; step = next - rho; rho = next;
        if (hi - lo <= T(4) * rg_eps<T>() * rg_fabs(rho)) break;
    }
    // rho is resolved to about |rho| ulps, r = exp(rho) likewise: where r is finite and the
    // row settled, Newton on F(r) = (a / r)**k Q(r) (one rounding in c = a / r, one in the
    // power) polishes r to a few ulps, which the wide supports' p = q / Q need
    r = rg_exp(rho);
    if (r < rg_inf<T>() && k * rg_fabs(phi) <= T(4) * rg_eps<T>()) {
        // (within the initial bracket: the final one, exp(lo) to exp(hi), is a few ulps of rho
        // wide and rounds in exp, so it need not hold the root in r)
        T a = map.link_scale(), r_lo = a, r_hi = a * rg_exp(rg_log(finite) / k);
        for (int it = 0; it < 2; ++it) {
            T q_sum = 0, carry = 0, slope = 0;
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
                T u = T(1) - r * (m - sr[j]);
                if (u > T(0)) {
                    T q = (k == T(1)) ? u : rg_exp(k * rg_log(u));
                    rg_add_compensated<T>(q_sum, carry, q);
                    slope += q / u - q;
                }
            }
            q_sum -= carry;
            q_sum = rg_block_sum(q_sum, shared);
            slope = rg_block_sum(slope, shared);
            T f = rg_pow(a / r, k) * q_sum;  // F decreases in r; dF/dr = -k F (1 + slope / Q) / r
            T next = r + (f - T(1)) * r / (k * f * (T(1) + slope / q_sum));
            if (!(next > r_lo && next < r_hi)) break;
            r = next;
        }
    }
    // tau - m = -c / a - z0 = -1/r - z0
    tau = m - (r < rg_inf<T>() ? T(1) / r : rg_exp(-rho)) - map.clip();
}

template <class M, typename T>
__device__ void rg_forward_rows(const T* s, T* p, T* tau_out, long long rows, long long cols, const M map) {
    // one block per row: m = max(s); the threshold tau; p = g_+(s - tau)
    __shared__ T shared[32];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* sr = s + row * cols; T* pr = p + row * cols;
        T m = -rg_inf<T>(), finite = 0, nan = 0;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            T v = sr[j];
            if (v != v) nan += 1; else if (v > -rg_inf<T>()) { finite += 1; m = v > m ? v : m; }
        }
        m = rg_block_max(m, shared);
        finite = rg_block_sum(finite, shared);
        nan = rg_block_sum(nan, shared);
        bool live = nan == T(0) && finite > T(0);
        T tau, lo = 0, hi = 0, rho = 0, phi = 0, k = 1, r = 0;  // (the root solvers' final state)
        if (nan > T(0)) {
            tau = T(0) / T(0);
        } else if (finite == T(0)) {
            tau = rg_inf<T>();  // every score masked: all probabilities 0
        } else if constexpr (M::threshold == RG_CLOSED) {
            // closed form: tau = m + tau_from_sum(sum_j term(s_j - m))
            T total = 0;
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
                T v = sr[j];
                if (v > -rg_inf<T>()) total += map.term(v - m);
            }
            total = rg_block_sum(total, shared);
            tau = m + map.tau_from_sum(total);
        } else if constexpr (M::threshold == RG_SORT) {
            rg_tau_newton(map, sr, cols, m, finite, shared, tau, lo, hi);
            // exact support formula on the support found by the iteration
            T k = 0, s1 = 0, s2 = 0, cut = map.clip();
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
                T v = sr[j];
                if (v - tau > cut) { T x = v - m; k += 1; s1 += x; s2 += x * x; }
            }
            k = rg_block_sum(k, shared);
            s1 = rg_block_sum(s1, shared);
            s2 = rg_block_sum(s2, shared);
            if (k > T(0)) tau = m + map.tau_candidate(k, s1, s2);
        } else if constexpr (M::threshold == RG_ROOT) {
            rg_tau_newton(map, sr, cols, m, finite, shared, tau, lo, hi);
        } else {
            k = map.link_exponent();
            rg_tau_power(map, sr, cols, m, finite, shared, k, rho, r, lo, hi, phi, tau);
        }
        if constexpr (M::threshold == RG_CLOSED || M::threshold == RG_SORT) {
            if (threadIdx.x == 0) tau_out[row] = tau;
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
                pr[j] = (nan > T(0)) ? tau : rg_link_plus(map, sr[j] - tau);
            }
        } else if constexpr (M::threshold == RG_ROOT) {
            // p = g_+(s - tau), divided by its sum (1 to the iteration's tolerance).  Where F jumps
            // across 1 between neighbouring floats of tau (a score entering the support where the
            // link's slope is infinite), no tau gives sum 1: p is the sum-1 combination of p at the
            // two ends of the final bracket [lo, hi], and the entering score takes the mass.
            T f_tau = 0, f_lo = 0, f_hi = 0;
            if (live) {
                for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
                    f_tau += rg_link_plus(map, sr[j] - tau);
                    f_lo += rg_link_plus(map, sr[j] - lo);
                    f_hi += rg_link_plus(map, sr[j] - hi);
                }
                f_tau = rg_block_sum(f_tau, shared);
                f_lo = rg_block_sum(f_lo, shared);
                f_hi = rg_block_sum(f_hi, shared);
            }
            bool ends = rg_fabs(f_tau - T(1)) > T(4) * rg_eps<T>() && f_lo >= T(1) && f_hi <= T(1) && f_lo > f_hi;
            T lam = ends ? (f_lo - T(1)) / (f_lo - f_hi) : T(0);
            if (threadIdx.x == 0) tau_out[row] = tau;
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
                T q;
                if (nan > T(0)) q = tau;
                else if (finite == T(0)) q = T(0);
                else if (ends) {
                    T a = rg_link_plus(map, sr[j] - lo), b = rg_link_plus(map, sr[j] - hi);
                    q = a + lam * (b - a);
                } else q = rg_link_plus(map, sr[j] - tau) / f_tau;
                pr[j] = q;
            }
        } else {
            // p_j = F(rho) q_j(rho) / Q(rho).  Settled (k |phi| at most a few ulps): q_j / Q at r.  Where F
            // jumps across 1 at a kink, the sum-1 combination of p at the ends lo, hi of the bracket.
            T q_mid = 0, carry = 0, q_lo = 0, q_hi = 0;
            if (live) {
                for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
                    T y = m - sr[j];
                    rg_add_compensated<T>(q_mid, carry, rg_power_ratio<T>(rho, r, y, k));
                    q_lo += rg_power_ratio<T>(lo, rg_exp(lo), y, k);
                    q_hi += rg_power_ratio<T>(hi, rg_exp(hi), y, k);
                }
                q_mid = rg_block_sum(q_mid - carry, shared);
                q_lo = rg_block_sum(q_lo, shared);
                q_hi = rg_block_sum(q_hi, shared);
            }
            T log_a = rg_log(map.link_scale());
            T f_lo = rg_exp(-k * (lo - log_a)) * q_lo, f_hi = rg_exp(-k * (hi - log_a)) * q_hi;  // F = exp(-k phi)
            bool ends = k * rg_fabs(phi) > T(4) * rg_eps<T>() && lo < hi && f_lo >= T(1) && f_hi <= T(1) && f_lo > f_hi;
            T lam = ends ? (f_lo - T(1)) / (f_lo - f_hi) : T(0);
            if (threadIdx.x == 0) tau_out[row] = tau;
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
                T q;
                if (nan > T(0)) q = tau;
                else if (finite == T(0)) q = T(0);
                else if (ends) {
                    T y = m - sr[j];
                    T pa = rg_power_ratio<T>(lo, rg_exp(lo), y, k) * (f_lo / q_lo);
                    T pb = rg_power_ratio<T>(hi, rg_exp(hi), y, k) * (f_hi / q_hi);
                    q = pa + lam * (pb - pa);
                } else q = rg_power_ratio<T>(rho, r, m - sr[j], k) / q_mid;
                pr[j] = q;
            }
        }
        __syncthreads();
    }
}
#endif
