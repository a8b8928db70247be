// regattn's block reductions: the sum and the maximum of one value per thread over a block of a multiple of
// 32 threads (shuffles within each warp, one slot per warp in shared memory), every thread getting the result.
// The host emulation of derive.codegen.compilers (one thread per block) defines its own.
#ifndef REGATTN_REDUCTIONS
#define REGATTN_REDUCTIONS
#ifndef REGATTN_HOST_EMULATION
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
