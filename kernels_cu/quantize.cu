// quantize_rows_kernel: each row of x (M, K), bf16 or f32 (in_f32), to FP8 E4M3 codes scaled by the row's
// largest size: scales[m] = max_k |x[m, k]| / 448 (1 for an all-zero row), codes[m, k] = e4m3(x[m, k] / scales[m])
// by CUDA's satfinite conversion (the nearest value, ties to the even code, beyond 448 in size 448, NaN 0x7F).
// numerics.quantize_e4m3 bit for bit: both of its float32 divisions are IEEE's rounded ones here too (the scale's
// by __fdiv_rn, each value's by common.cuh's e4m3_quotient, whose code is __fdiv_rn's; under --use_fast_math `/`
// would be an approximate division).
// (Subnormal inputs are flushed to zero by --use_fast_math, keeping their sign, so their codes are those of zeros:
// a row whose largest size is subnormal is one the model scales otherwise.)
// x, codes: C-contiguous (M, K); scales (M,) f32. Launch: grid (M), block 256 (a multiple of 32, at most 1,024):
// a block a row, two passes over it (the second from L1/L2).
#include "common.cuh"
#include <cuda_fp8.h>

#define E4M3_MAX 448.f

__device__ __forceinline__ float load_element(const void* x, size_t at, int in_f32) {
    return in_f32 ? static_cast<const float*>(x)[at] : bf16_to_float(static_cast<const __nv_bfloat16*>(x)[at]);
}

extern "C" __global__ void quantize_rows_kernel(const void* __restrict__ x, unsigned char* __restrict__ codes,
                                                float* __restrict__ scales, int K, int in_f32) {
    __shared__ float scratch[32];
    const size_t row = (size_t)blockIdx.x * K;
    float top = 0.f;
    for (int k = threadIdx.x; k < K; k += blockDim.x) top = fmaxf(top, fabsf(load_element(x, row + k, in_f32)));
    top = warp_max(top);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = top;
    __syncthreads();
    const int lane = threadIdx.x & 31;
    top = lane < (blockDim.x >> 5) ? scratch[lane] : 0.f;
    top = warp_max(top);  // every warp reduces the warps' maxima: each thread has the row's
    const float scale = top > 0.f ? __fdiv_rn(top, E4M3_MAX) : 1.f;
    const float r = __frcp_rn(scale);
    for (int k = threadIdx.x; k < K; k += blockDim.x)
        codes[row + k] = __nv_cvt_float_to_fp8(e4m3_quotient(load_element(x, row + k, in_f32), scale, r), __NV_SATFINITE, __NV_E4M3);
    if (threadIdx.x == 0) scales[blockIdx.x] = scale;
}

// quantize_rows_warp_kernel: the same, a warp a row (8 rows a block of 256 threads), bf16 rows read 8 values (16
// bytes) a load and their codes written 8 (8 bytes) a store: for rows of K % 8 == 0 with x 16-byte and codes
// 8-byte aligned (kernels.quantize_rows checks). The same bits as quantize_rows_kernel (a maximum has no rounding).
extern "C" __global__ void quantize_rows_warp_kernel(const __nv_bfloat16* __restrict__ x, unsigned char* __restrict__ codes,
                                                     float* __restrict__ scales, int M, int K) {
    const int lane = threadIdx.x & 31, m = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (m >= M) return;
    const uint4* row = reinterpret_cast<const uint4*>(x + (size_t)m * K);
    const int vectors = K / 8;
    float top = 0.f;
    for (int i = lane; i < vectors; i += 32) {
        const uint4 v = row[i];
        const __nv_bfloat162* pair = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 f = __bfloat1622float2(pair[j]);
            top = fmaxf(top, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
    }
    top = warp_max(top);
    const float scale = top > 0.f ? __fdiv_rn(top, E4M3_MAX) : 1.f;
    const float r = __frcp_rn(scale);
    uint2* dst = reinterpret_cast<uint2*>(codes + (size_t)m * K);
    for (int i = lane; i < vectors; i += 32) {
        const uint4 v = row[i];
        const __nv_bfloat162* pair = reinterpret_cast<const __nv_bfloat162*>(&v);
        unsigned packed[2] = {0u, 0u};  // codes in increasing k, little-endian: byte b of the 8 is value b
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 f = __bfloat1622float2(pair[j]);
            const unsigned lo = __nv_cvt_float_to_fp8(e4m3_quotient(f.x, scale, r), __NV_SATFINITE, __NV_E4M3);
            const unsigned hi = __nv_cvt_float_to_fp8(e4m3_quotient(f.y, scale, r), __NV_SATFINITE, __NV_E4M3);
            packed[j / 2] |= (lo | hi << 8) << (16 * (j % 2));
        }
        dst[i] = make_uint2(packed[0], packed[1]);
    }
    if (lane == 0) scales[m] = scale;
}
