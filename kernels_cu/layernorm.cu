// layernorm_kernel: out[m] = (x[m] - mean) / sqrt(var + eps) * weight + bias, over D, as torch.nn.LayerNorm.
//
// x (M, D) f32: the residual stream stays f32 between layers; weight, bias (D,) f32; out (M, D) bf16, the
// input of the next GEMM. Statistics in f32, two passes (mean, then the centred sum of squares), biased
// variance. One warp per row (the row stays in L1 between the passes), 16-byte loads where D % 4 == 0 and
// the arrays are aligned for them. Launch: grid (ceil(M / 8)), block 256 threads (8 rows); any D.
#include "common.cuh"

extern "C" __global__ void layernorm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                            const float* __restrict__ bias, __nv_bfloat16* __restrict__ out,
                                            int M, int D, float eps) {
    let_dependents_launch();  // the next GEMM (a programmatic dependent) launches under this kernel
    const int lane = threadIdx.x & 31, m = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (m >= M) return;
    const float* row = x + (size_t)m * D;
    __nv_bfloat16* dst = out + (size_t)m * D;
    const bool vec = (D & 3) == 0 && (((size_t)x | (size_t)weight | (size_t)bias) & 15) == 0 && ((size_t)out & 7) == 0;
    const float4* row4 = reinterpret_cast<const float4*>(row);
    float sum = 0.f;
    if (vec)
        for (int i = lane; i < D / 4; i += 32) { const float4 v = row4[i]; sum += (v.x + v.y) + (v.z + v.w); }
    else
        for (int d = lane; d < D; d += 32) sum += row[d];
    const float mean = warp_sum(sum) / D;
    float squares = 0.f;
    if (vec)
        for (int i = lane; i < D / 4; i += 32) {
            const float4 v = row4[i];
            const float a = v.x - mean, b = v.y - mean, c = v.z - mean, d = v.w - mean;
            squares += (a * a + b * b) + (c * c + d * d);
        }
    else
        for (int d = lane; d < D; d += 32) { const float c = row[d] - mean; squares += c * c; }
    const float inv = rsqrtf(warp_sum(squares) / D + eps);
    if (vec) {
        const float4* w4 = reinterpret_cast<const float4*>(weight);
        const float4* b4 = reinterpret_cast<const float4*>(bias);
        for (int i = lane; i < D / 4; i += 32) {
            const float4 v = row4[i], w = w4[i], b = b4[i];
            __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(dst + 4 * i);
            o[0] = __floats2bfloat162_rn((v.x - mean) * inv * w.x + b.x, (v.y - mean) * inv * w.y + b.y);
            o[1] = __floats2bfloat162_rn((v.z - mean) * inv * w.z + b.z, (v.w - mean) * inv * w.w + b.w);
        }
    } else {
        for (int d = lane; d < D; d += 32) dst[d] = float_to_bf16((row[d] - mean) * inv * weight[d] + bias[d]);
    }
}
