// embed_kernel: out[m] = table[ids[m]] * scale + positions[pos[m]], the first hidden state of a token.
//
// ids, pos (M,) int32; table (V, D) bf16 (the shared embedding, also the output projection); positions
// (P, D) f32, the sinusoidal table made by reference.sinusoidal_positions (row padding_idx is zero);
// out (M, D) f32, the residual stream. Launch: grid (M), block 128 threads; any D.
// embed_e4m3_kernel: the same from a table in FP8 (--compute-type float8): codes (V, D) E4M3 and a scale a row
// (V,) f32, the row's values e4m3(code) * scale (numerics.E4M3Matrix.rows), each then times `scale` plus its position.
#include "common.cuh"
#include <cuda_fp8.h>

extern "C" __global__ void embed_kernel(const int* __restrict__ ids, const int* __restrict__ pos,
                                        const __nv_bfloat16* __restrict__ table, const float* __restrict__ positions,
                                        float* __restrict__ out, int D, float scale) {
    const __nv_bfloat16* token = table + (size_t)ids[blockIdx.x] * D;
    const float* where = positions + (size_t)pos[blockIdx.x] * D;
    float* dst = out + (size_t)blockIdx.x * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) dst[d] = bf16_to_float(token[d]) * scale + where[d];
}

extern "C" __global__ void embed_e4m3_kernel(const int* __restrict__ ids, const int* __restrict__ pos,
                                             const unsigned char* __restrict__ codes, const float* __restrict__ scales,
                                             const float* __restrict__ positions, float* __restrict__ out, int D,
                                             float scale) {
    const int id = ids[blockIdx.x];
    const unsigned char* token = codes + (size_t)id * D;
    const float row_scale = scales[id];
    const float* where = positions + (size_t)pos[blockIdx.x] * D;
    float* dst = out + (size_t)blockIdx.x * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        __nv_fp8_e4m3 code;
        code.__x = token[d];
        const float value = __fmul_rn(static_cast<float>(code), row_scale);  // rounded as the reference's product
        dst[d] = value * scale + where[d];
    }
}
