// copy_rows_kernel: dst[dst_rows[r], 0:width] = src[src_rows[r], 0:width] for r < R.
//
// Moves K/V rows into the cache pools: a step's new K or V (one row per live sequence) to its slot's
// position, the encoder's cross K/V (one row per real source token) to the source's run of cross rows, and
// a parent beam's cache rows to a child's slot. src (*, ld_src) and dst (*, ld_dst) bf16, rows of `width`
// elements; src_rows, dst_rows (R,) int32. width, ld_src, ld_dst % 8 == 0 and 16-byte aligned bases
// (16-byte copies). Launch: grid (R), block 128 threads.
#include "common.cuh"
#include <cuda_fp8.h>

#define E4M3_MAX 448.f

extern "C" __global__ void copy_rows_kernel(const __nv_bfloat16* __restrict__ src, long long ld_src,
                                            const int* __restrict__ src_rows, __nv_bfloat16* __restrict__ dst,
                                            long long ld_dst, const int* __restrict__ dst_rows, int width) {
    const uint4* from = (const uint4*)(src + src_rows[blockIdx.x] * ld_src);
    uint4* to = (uint4*)(dst + dst_rows[blockIdx.x] * ld_dst);
    for (int c = threadIdx.x; c < width / 8; c += blockDim.x) to[c] = from[c];
}

// copy_rows_e4m3_kernel: copy_rows into an FP8 K/V cache (--kv-cache-type float8), each row quantized a head at a
// time as it is copied (numerics.quantize_heads, bit for bit): the E elements of head g of row src_rows[r] of src
// get scale = max |x| / 448 over the head (1 for an all-zero head), stored at scales[dst_rows[r] * ld_scales + g],
// and codes[dst_rows[r] * ld_codes + g*E + e] = e4m3(x[g*E + e] / scale) by CUDA's satfinite conversion (the
// nearest value, ties to the even code, beyond 448 in size 448). Both divisions are IEEE's rounded ones (__fdiv_rn,
// and e4m3_quotient for the values), as quantize.cu's, so the codes are the NumPy model's under --use_fast_math too.
// src (*, ld_src) bf16, codes (*, ld_codes) uint8, scales (*, ld_scales) f32; src_rows, dst_rows (R,) int32; width
// (the elements of a row) a multiple of E, E even; src rows 4-byte and codes rows 2-byte aligned (pairs of elements).
// Launch: grid (R), block 128 threads: each warp a head at a time, each lane a pair of its elements at a time (one
// pair a lane at E 64), the head's maximum by shuffles, its elements read again from L1 for the codes.
extern "C" __global__ void copy_rows_e4m3_kernel(const __nv_bfloat16* __restrict__ src, long long ld_src,
                                                 const int* __restrict__ src_rows, unsigned char* __restrict__ codes,
                                                 long long ld_codes, float* __restrict__ scales, long long ld_scales,
                                                 const int* __restrict__ dst_rows, int width, int E) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5, pairs = E / 2;
    const __nv_bfloat162* from = reinterpret_cast<const __nv_bfloat162*>(src + src_rows[blockIdx.x] * ld_src);
    const long long row = dst_rows[blockIdx.x];
    unsigned short* to = reinterpret_cast<unsigned short*>(codes + row * ld_codes);
    for (int g = warp; g < width / E; g += warps) {
        const int first = g * pairs;
        float top = 0.f;
        for (int p = lane; p < pairs; p += 32) {
            const float2 f = __bfloat1622float2(from[first + p]);
            top = fmaxf(top, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
        top = warp_max(top);
        const float scale = top > 0.f ? __fdiv_rn(top, E4M3_MAX) : 1.f;
        const float r = __frcp_rn(scale);
        for (int p = lane; p < pairs; p += 32) {
            const float2 f = __bfloat1622float2(from[first + p]);
            const unsigned lo = __nv_cvt_float_to_fp8(e4m3_quotient(f.x, scale, r), __NV_SATFINITE, __NV_E4M3);
            const unsigned hi = __nv_cvt_float_to_fp8(e4m3_quotient(f.y, scale, r), __NV_SATFINITE, __NV_E4M3);
            to[first + p] = static_cast<unsigned short>(lo | hi << 8);  // little-endian: element 2p first
        }
        if (lane == 0) scales[row * ld_scales + g] = scale;
    }
}
