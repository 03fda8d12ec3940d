// Shared helpers for nllbcli's kernels: bf16 conversion, warp and block reductions, ceil_div.
// Included textually by engine/kernels.py (so CuPy's compile cache sees header changes), never by path.
#pragma once
#include <cuda_bf16.h>

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#define NEG_INF (__int_as_float(0xff800000))  // NVRTC has no INFINITY macro

// Lets the kernel launched after this one as a programmatic dependent (the wgmma GEMMs: launch.py) be launched and
// set up, and load its constant weights, while this one's last blocks run: it waits for this kernel's end before it
// reads what this kernel writes (gemm_sm90.cu). Called at a kernel's start (the dependent launches once every block
// of this one has run it, so it takes no SM from them). Nothing on GPUs before Hopper, or with no such dependent.
__device__ __forceinline__ void let_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ float bf16_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ __nv_bfloat16 float_to_bf16(float x) { return __float2bfloat16_rn(x); }

// x / scale as FP8 E4M3 takes it: a quotient whose E4M3 code (cvt.rn.satfinite) is that of IEEE's rounded one,
// __fdiv_rn(x, scale), in a multiply and two FMAs. r = __frcp_rn(scale); q = x * r is within an ulp of x / scale,
// the remainder x - q * scale is exact, and q + remainder * r is the rounded quotient (Markstein's theorem) wherever
// the remainder does not underflow: every quotient of 2^-12 or more in size when 2^-80 <= scale <= 2^100 (below
// 2^-12 both are E4M3's zero of x's sign). Other scales (infinite, NaN, tiny, huge) divide. Why not __fdiv_rn
// itself: it takes a slow path for a zero dividend, which is half of a ReLU output (docs/PERFORMANCE.md, "FP8 that
// pays").
__device__ __forceinline__ float e4m3_quotient(float x, float scale, float r) {
    if (!(scale >= 8.2718061e-25f && scale <= 1.2676506e30f)) return __fdiv_rn(x, scale);  // 2^-80, 2^100
    const float q = __fmul_rn(x, r);
    return copysignf(__fmaf_rn(__fmaf_rn(-q, scale, x), r, q), x);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
    return v;
}

// Sum over the whole block; `scratch` holds 32 floats. Every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.f;
    return warp_sum(v);
}
