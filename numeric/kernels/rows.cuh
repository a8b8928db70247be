// regattn's row kernels, written once for every map.  A map enters as a struct of its generated device
// functions (`template <typename T> struct NAME_map`, printed by derive.codegen.emit into the map module's
// CUDA_DEVICE_SOURCE) holding the map's parameters and providing
//
//   static constexpr rg_solver solver;         the traced solve its rows take (numeric/_generated/rows_solve.py)
//   T clip() const;                            omega'(0+): p = 0 where z = s - tau <= clip
//   T link(T z) const;                         g = (omega')^{-1}, unclipped
//   T weight(T p) const;                       w = 1/omega''(p)
//   T omega(T p), omega_prime(T p), omega_second(T p), omega_third(T p), weight_d2(T p) const;
//   and the routines of its threshold (term, tau_from_sum; tau_candidate, discriminant; link_scale,
//   link_exponent; link_dtau) that numeric.core.rules.solve calls.
//
// The map module's kernels (`extern "C"`, one per dtype, launched with numeric.contract.CUDA_THREADS threads
// per block) call the templates below with such a struct:
//
// * rg_forward_from_tau: elementwise p = g_+(s - tau[row]);
// * rg_forward_rows: one block per row: rg_solve_row, numeric.core.rules.solve traced into CUDA by
//   `regattn generate` (derive.codegen.trace_rows), the one algorithm the NumPy, torch and JAX maps run;
//   writes p and tau;
// * rg_jvp: one block per row, J v = w*v - w (w.v) / sum(w) with w = w(p) on the support (J is symmetric,
//   so this is also the VJP): rg_jvp_row, numeric.core.derivatives.jvp traced likewise.
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
    // one block per row: numeric.core.derivatives.jvp traced (a NaN row comes out NaN as a whole)
    __shared__ T shared[32];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        rg_jvp_row(map, p + row * cols, v + row * cols, out + row * cols, cols, shared);
        __syncthreads();
    }
}

template <class M, typename T>
__device__ void rg_forward_rows(const T* s, T* p, T* tau_out, long long rows, long long cols, const M map) {
    // one block per row: the traced solve writes the row's p and gives its tau
    __shared__ T shared[32];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        T tau;
        rg_solve_row(map, s + row * cols, p + row * cols, cols, shared, tau);
        if (threadIdx.x == 0) tau_out[row] = tau;
        __syncthreads();
    }
}
#endif
