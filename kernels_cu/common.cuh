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
