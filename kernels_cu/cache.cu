// copy_rows_kernel: dst[dst_rows[r], 0:width] = src[src_rows[r], 0:width] for r < R.
//
// Moves K/V rows into the cache pools: a step's new K or V (one row per live sequence) to its slot's
// position, the encoder's cross K/V (one row per real source token) to the source's run of cross rows, and
// a parent beam's cache rows to a child's slot. src (*, ld_src) and dst (*, ld_dst) bf16, rows of `width`
// elements; src_rows, dst_rows (R,) int32. width, ld_src, ld_dst % 8 == 0 and 16-byte aligned bases
// (16-byte copies). Launch: grid (R), block 128 threads.
#include "common.cuh"

extern "C" __global__ void copy_rows_kernel(const __nv_bfloat16* __restrict__ src, long long ld_src,
                                            const int* __restrict__ src_rows, __nv_bfloat16* __restrict__ dst,
                                            long long ld_dst, const int* __restrict__ dst_rows, int width) {
    const uint4* from = (const uint4*)(src + src_rows[blockIdx.x] * ld_src);
    uint4* to = (uint4*)(dst + dst_rows[blockIdx.x] * ld_dst);
    for (int c = threadIdx.x; c < width / 8; c += blockDim.x) to[c] = from[c];
}
