// attention_kernel: softmax(q k^T * scale) v for one query row and one head, over a run of keys.
//
// One kernel serves the three attentions, because each query reads a contiguous run of key rows:
//   encoder self-attention: query b*S+i reads its source's rows b*S .. b*S+len-1 (the source padding mask
//     is the length: padded keys are never read);
//   decoder self-attention: one query per live sequence reads the cache rows of its positions 0..t (the
//     step's own K/V written first), through its row table: a beam's history may lie in its parent's
//     rows, so beams follow their parents by copying a table row, never the K/V;
//   cross-attention: one query per live sequence reads its source's run in the cross K/V rows.
// q (rows, ldq) bf16, head h at columns h*E..h*E+E; key j of query r at k[row * ldk + h*E + e] with
// row = table ? table[r * table_stride + j] : start[r] + j (v alike); start, length (rows,) int32,
// length >= 1; table (rows, table_stride) int32 or null; out (rows, H*E) bf16. Scores and the softmax in f32;
// at most MAX_KEYS keys (the scores live in shared memory); E <= 256.
// Launch: grid (rows, H), block 128 threads.
#include "common.cuh"

#define MAX_KEYS 2048

extern "C" __global__ void attention_kernel(const __nv_bfloat16* __restrict__ q, int ldq,
                                            const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
                                            int ldk, const int* __restrict__ start, const int* __restrict__ length,
                                            const int* __restrict__ table, int table_stride,
                                            __nv_bfloat16* __restrict__ out, int E, float scale) {
    __shared__ float scores[MAX_KEYS];
    __shared__ float qs[256];
    __shared__ float scratch[32];
    const int row = blockIdx.x, h = blockIdx.y, H = gridDim.y;
    const int n = length[row];
    const int* rows = table ? table + (size_t)row * table_stride : nullptr;
    const int first = table ? 0 : start[row];
    const __nv_bfloat16* kh = k + h * E;
    const __nv_bfloat16* vh = v + h * E;
#define KEY_ROW(j) ((size_t)(rows ? rows[j] : first + (j)) * ldk)
    for (int e = threadIdx.x; e < E; e += blockDim.x) qs[e] = bf16_to_float(q[(size_t)row * ldq + h * E + e]);
    __syncthreads();

    float local_max = NEG_INF;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const __nv_bfloat16* key = kh + KEY_ROW(j);
        float dot = 0.f;
        for (int e = 0; e < E; ++e) dot += qs[e] * bf16_to_float(key[e]);
        scores[j] = dot * scale;
        local_max = fmaxf(local_max, scores[j]);
    }
    // block max through the same scratch as block_sum (max of maxima)
    local_max = warp_max(local_max);
    __shared__ float maxes[32];
    if ((threadIdx.x & 31) == 0) maxes[threadIdx.x >> 5] = local_max;
    __syncthreads();
    float m = NEG_INF;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, maxes[w]);

    float local_sum = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float p = __expf(scores[j] - m);
        scores[j] = p;
        local_sum += p;
    }
    const float inv = 1.f / block_sum(local_sum, scratch);  // block_sum syncs: scores are all written
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < n; ++j) acc += scores[j] * bf16_to_float(vh[KEY_ROW(j) + e]);
        out[(size_t)row * H * E + h * E + e] = float_to_bf16(acc * inv);
    }
}
