// layernorm_kernel: out[m] = (x[m] - mean) / sqrt(var + eps) * weight + bias, over D, as torch.nn.LayerNorm.
//
// x (M, D) f32: the residual stream stays f32 between layers; weight, bias (D,) f32; out (M, D) bf16, the
// input of the next GEMM. Statistics in f32, two passes (mean, then the centred sum of squares), biased
// variance. One warp per row, 16-byte loads where D % 4 == 0 and the arrays are aligned for them; there, up to
// D = 128 * HELD, the row is loaded once into registers, all its loads in flight together (loads issued one after
// another hold a warp per row to about a quarter of HBM's bandwidth), and summed in the same order as the loop
// over L1 that serves other rows (the same bits). Launch: grid (ceil(M / 8)), block 256 threads (8 rows); any D.
// layernorm_e4m3_kernel: the same LayerNorm, its output rounded to bf16 as layernorm_kernel's, then to FP8 E4M3 by the
// row's largest size (quantize.cu's rule and arithmetic): codes (M, D) uint8 and scales (M,) f32 instead of the bf16
// out, the input of an FP8 GEMM (--compute-type float8), bit for bit quantize_rows_kernel(layernorm_kernel(x)).
#include "common.cuh"
#include <cuda_fp8.h>

constexpr int HELD = 16;  // float4s a lane holds: rows of up to 2,048 (NLLB's widest d_model) in registers

// A row's mean and 1 / sqrt(var + eps), summed as layernorm_kernel sums them (16-byte loads where `vec`).
__device__ __forceinline__ void row_stats(const float* __restrict__ row, int D, float eps, bool vec, int lane,
                                          float& mean, float& inv) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    float sum = 0.f;
    if (vec)
        for (int i = lane; i < D / 4; i += 32) { const float4 v = row4[i]; sum += (v.x + v.y) + (v.z + v.w); }
    else
        for (int d = lane; d < D; d += 32) sum += row[d];
    mean = warp_sum(sum) / D;
    float squares = 0.f;
    if (vec)
        for (int i = lane; i < D / 4; i += 32) {
            const float4 v = row4[i];
            const float a = v.x - mean, b = v.y - mean, c = v.z - mean, d = v.w - mean;
            squares += (a * a + b * b) + (c * c + d * d);
        }
    else
        for (int d = lane; d < D; d += 32) { const float c = row[d] - mean; squares += c * c; }
    inv = rsqrtf(warp_sum(squares) / D + eps);
}

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
    if (vec && D <= 128 * HELD) {
        const float4* w4 = reinterpret_cast<const float4*>(weight);
        const float4* b4 = reinterpret_cast<const float4*>(bias);
        const int n4 = D / 4;
        float4 v[HELD];
#pragma unroll
        for (int j = 0; j < HELD; ++j)
            if (lane + 32 * j < n4) v[j] = row4[lane + 32 * j];
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < HELD; ++j)
            if (lane + 32 * j < n4) sum += (v[j].x + v[j].y) + (v[j].z + v[j].w);
        const float mean = warp_sum(sum) / D;
        float squares = 0.f;
#pragma unroll
        for (int j = 0; j < HELD; ++j)
            if (lane + 32 * j < n4) {
                const float a = v[j].x - mean, b = v[j].y - mean, c = v[j].z - mean, d = v[j].w - mean;
                squares += (a * a + b * b) + (c * c + d * d);
            }
        const float inv = rsqrtf(warp_sum(squares) / D + eps);
#pragma unroll
        for (int j = 0; j < HELD; ++j) {
            const int i = lane + 32 * j;
            if (i < n4) {
                const float4 w = w4[i], b = b4[i];
                __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(dst + 4 * i);
                o[0] = __floats2bfloat162_rn((v[j].x - mean) * inv * w.x + b.x, (v[j].y - mean) * inv * w.y + b.y);
                o[1] = __floats2bfloat162_rn((v[j].z - mean) * inv * w.z + b.z, (v[j].w - mean) * inv * w.w + b.w);
            }
        }
        return;
    }
    float mean, inv;
    row_stats(row, D, eps, vec, lane, mean, inv);
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

extern "C" __global__ void layernorm_e4m3_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                                 const float* __restrict__ bias, unsigned char* __restrict__ codes,
                                                 float* __restrict__ scales, int M, int D, float eps) {
    let_dependents_launch();
    const int lane = threadIdx.x & 31, m = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (m >= M) return;
    const float* row = x + (size_t)m * D;
    const bool vec = (D & 3) == 0 && (((size_t)x | (size_t)weight | (size_t)bias) & 15) == 0;
    float mean, inv;
    row_stats(row, D, eps, vec, lane, mean, inv);
    float top = 0.f;  // the bf16 outputs' largest size (the row stays in L1 for the passes)
    for (int d = lane; d < D; d += 32)
        top = fmaxf(top, fabsf(bf16_to_float(float_to_bf16((row[d] - mean) * inv * weight[d] + bias[d]))));
    top = warp_max(top);
    const float scale = top > 0.f ? __fdiv_rn(top, 448.f) : 1.f;
    const float r = __frcp_rn(scale);
    unsigned char* dst = codes + (size_t)m * D;
    for (int d = lane; d < D; d += 32) {
        const float y = bf16_to_float(float_to_bf16((row[d] - mean) * inv * weight[d] + bias[d]));
        dst[d] = __nv_cvt_float_to_fp8(e4m3_quotient(y, scale, r), __NV_SATFINITE, __NV_E4M3);
    }
    if (lane == 0) scales[m] = scale;
}
