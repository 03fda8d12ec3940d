// cache_write_kernel: pool[slot[r], pos[r], :] = src[r, :], placing each new K or V row in its cache slot.
//
// src (R, D) bf16 (one projected row per live sequence, or per source token at prefill); slot, pos (R,)
// int32; pool (slots, rows_per_slot, D) bf16. Launch: grid (R), block 128 threads; D % 8 == 0 (16-byte copies).
#include "common.cuh"

extern "C" __global__ void cache_write_kernel(const __nv_bfloat16* __restrict__ src, const int* __restrict__ slot,
                                              const int* __restrict__ pos, __nv_bfloat16* __restrict__ pool,
                                              int rows_per_slot, int D) {
    const int r = blockIdx.x;
    const uint4* from = (const uint4*)(src + (size_t)r * D);
    uint4* to = (uint4*)(pool + ((size_t)slot[r] * rows_per_slot + pos[r]) * D);
    for (int c = threadIdx.x; c < D / 8; c += blockDim.x) to[c] = from[c];
}
