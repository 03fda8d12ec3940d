// layernorm_kernel: out[m] = (x[m] - mean) / sqrt(var + eps) * weight + bias, over D, as torch.nn.LayerNorm.
//
// x (M, D) f32: the residual stream stays f32 between layers; weight, bias (D,) f32; out (M, D) bf16, the
// input of the next GEMM. Statistics in f32, two passes (mean, then the centred sum of squares), biased
// variance. Launch: grid (M), block 256 threads; any D.
#include "common.cuh"

extern "C" __global__ void layernorm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                            const float* __restrict__ bias, __nv_bfloat16* __restrict__ out,
                                            int D, float eps) {
    __shared__ float scratch[32];
    const float* row = x + (size_t)blockIdx.x * D;
    float sum = 0.f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) sum += row[d];
    const float mean = block_sum(sum, scratch) / D;
    float squares = 0.f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        const float c = row[d] - mean;
        squares += c * c;
    }
    const float inv = rsqrtf(block_sum(squares, scratch) / D + eps);
    __nv_bfloat16* dst = out + (size_t)blockIdx.x * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) dst[d] = float_to_bf16((row[d] - mean) * inv * weight[d] + bias[d]);
}
