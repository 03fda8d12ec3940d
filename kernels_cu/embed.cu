// embed_kernel: out[m] = table[ids[m]] * scale + positions[pos[m]], the first hidden state of a token.
//
// ids, pos (M,) int32; table (V, D) bf16 (the shared embedding, also the output projection); positions
// (P, D) f32, the sinusoidal table made by reference.sinusoidal_positions (row padding_idx is zero);
// out (M, D) f32, the residual stream. Launch: grid (M), block 128 threads; any D.
#include "common.cuh"

extern "C" __global__ void embed_kernel(const int* __restrict__ ids, const int* __restrict__ pos,
                                        const __nv_bfloat16* __restrict__ table, const float* __restrict__ positions,
                                        float* __restrict__ out, int D, float scale) {
    const __nv_bfloat16* token = table + (size_t)ids[blockIdx.x] * D;
    const float* where = positions + (size_t)pos[blockIdx.x] * D;
    float* dst = out + (size_t)blockIdx.x * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) dst[d] = bf16_to_float(token[d]) * scale + where[d];
}
