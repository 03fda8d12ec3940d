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
#include <cuda_fp8.h>

#define MAX_KEYS 2048

extern "C" __global__ void attention_kernel(const __nv_bfloat16* __restrict__ q, int ldq,
                                            const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
                                            int ldk, const int* __restrict__ start, const int* __restrict__ length,
                                            const int* __restrict__ table, int table_stride,
                                            __nv_bfloat16* __restrict__ out, int E, float scale) {
    let_dependents_launch();  // the output projection (a programmatic dependent GEMM) launches under this kernel
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

// The value of an E4M3 code, and of two packed in 16 bits (the lower byte first): every E4M3 value is a half
// exactly, and the conversion is one instruction on sm_89 and later.
__device__ __forceinline__ float e4m3_to_float(unsigned char code) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}

__device__ __forceinline__ float2 e4m3x2_to_float2(unsigned short codes) {
    return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(codes, __NV_E4M3)));
}

// attention_e4m3_kernel: attention_kernel over an FP8 K/V cache (--kv-cache-type float8): key j's head h is the E
// E4M3 codes k[row * ldk + h*E ..] with the scale k_scales[row * lds + h] (numerics.quantize_heads), row as
// attention_kernel finds it (start or table), v alike with v_scales. Its score is k's scale times the dot product
// of q with the codes' values, all in f32; each weight of the softmax is taken times v's scale before the values
// are summed. reference.attention_e4m3 models it. k, v (rows, ldk) uint8; k_scales, v_scales (rows, lds) f32.
// Launch: grid (rows, H), block 128 threads.
extern "C" __global__ void attention_e4m3_kernel(const __nv_bfloat16* __restrict__ q, int ldq,
                                                 const unsigned char* __restrict__ k, const unsigned char* __restrict__ v,
                                                 int ldk, const float* __restrict__ k_scales,
                                                 const float* __restrict__ v_scales, int lds,
                                                 const int* __restrict__ start, const int* __restrict__ length,
                                                 const int* __restrict__ table, int table_stride,
                                                 __nv_bfloat16* __restrict__ out, int E, float scale) {
    let_dependents_launch();
    __shared__ float scores[MAX_KEYS];
    __shared__ float qs[256];
    __shared__ float scratch[32];
    __shared__ float maxes[32];
    const int row = blockIdx.x, h = blockIdx.y, H = gridDim.y;
    const int n = length[row];
    const int* rows = table ? table + (size_t)row * table_stride : nullptr;
    const int first = table ? 0 : start[row];
    const unsigned char* kh = k + h * E;
    const unsigned char* vh = v + h * E;
#define CODE_ROW(j) ((size_t)(rows ? rows[j] : first + (j)))
    for (int e = threadIdx.x; e < E; e += blockDim.x) qs[e] = bf16_to_float(q[(size_t)row * ldq + h * E + e]);
    __syncthreads();

    float local_max = NEG_INF;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const size_t at = CODE_ROW(j);
        const unsigned char* key = kh + at * ldk;
        float dot = 0.f;
        for (int e = 0; e < E; ++e) dot += qs[e] * e4m3_to_float(key[e]);
        scores[j] = dot * k_scales[at * lds + h] * scale;
        local_max = fmaxf(local_max, scores[j]);
    }
    local_max = warp_max(local_max);
    if ((threadIdx.x & 31) == 0) maxes[threadIdx.x >> 5] = local_max;
    __syncthreads();
    float m = NEG_INF;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, maxes[w]);

    float local_sum = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float p = __expf(scores[j] - m);
        scores[j] = p * v_scales[CODE_ROW(j) * lds + h];  // the weight of the codes' values
        local_sum += p;
    }
    const float inv = 1.f / block_sum(local_sum, scratch);  // block_sum syncs: scores are all written
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < n; ++j) acc += scores[j] * e4m3_to_float(vh[CODE_ROW(j) * ldk + e]);
        out[(size_t)row * H * E + h * E + e] = float_to_bf16(acc * inv);
    }
#undef CODE_ROW
}

// A warp's scores sc[0..n-1], whose largest is m, become exp(sc - m); returns 1 / their sum (every lane).
__device__ __forceinline__ float warp_softmax(float* sc, int n, float m, int lane) {
    float sum = 0.f;
    for (int j = lane; j < n; j += 32) {
        const float p = __expf(sc[j] - m);
        sc[j] = p;
        sum += p;
    }
    return 1.f / warp_sum(sum);
}

// attention_prefill_kernel: encoder self-attention, one block per (sequence, head): the sequence's K and V
// rows of this head are read once into shared memory, then each warp takes one query at a time.
//
// Query i of sequence b is row seq_start[b] + i of q (ldq), its keys and values rows seq_start[b] .. +
// seq_len[b] - 1 of k and v (ldk); out row seq_start[b] + i (ldo), for i < rows_per_seq: rows past the
// sequence's length (padding) are written as zeros. rows_per_seq 0: the sequences are packed one after
// the other with no padding, and only their own rows are written. Scores and the softmax in f32.
// A query's lanes score one key each (its dot product over e in increasing order), then each lane sums the
// values of its own output columns over the keys in increasing order.
// Shared memory (dynamic): K and V as max_len x (E + 2) bf16 (the 2 spare columns put the rows that the 32
// lanes read at once on 32 different banks), then 8 x E f32 for the queries, then 8 x max_len f32 scores.
// Launch: grid (B, H), block 256 threads; seq_len <= max_len; E even, and a multiple of 8 for the
// specialised head sizes (attention_prefill_64_kernel, _128_: E fixed at compile time) and rows of q, k and
// v 16-byte aligned there; attention_prefill_kernel takes any even E.
template <int HEAD>
__device__ __forceinline__ void attention_prefill(const __nv_bfloat16* __restrict__ q, int ldq,
                                                  const __nv_bfloat16* __restrict__ k,
                                                  const __nv_bfloat16* __restrict__ v, int ldk,
                                                  const int* __restrict__ seq_start, const int* __restrict__ seq_len,
                                                  int rows_per_seq, __nv_bfloat16* __restrict__ out, int ldo,
                                                  int E_runtime, float scale, int max_len) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int E = HEAD ? HEAD : E_runtime;  // a constant where the kernel is specialised: loops unroll
    const int b = blockIdx.x, h = blockIdx.y;
    const int start = seq_start[b], n = seq_len[b], lds = E + 2;
    __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem);
    __nv_bfloat16* Vs = Ks + (size_t)max_len * lds;
    float* Qs = reinterpret_cast<float*>(Vs + (size_t)max_len * lds);
    float* Ss = Qs + 8 * E;
    if constexpr (HEAD > 0) {  // 16-byte loads, stored as four 4-byte words (rows of E + 2 are only 4-byte aligned)
        constexpr int CHUNKS = HEAD / 8;
        for (int idx = threadIdx.x; idx < n * CHUNKS; idx += blockDim.x) {
            const int j = idx / CHUNKS, c = (idx - j * CHUNKS) * 8;
            const size_t at = (size_t)(start + j) * ldk + h * E + c;
            const uint4 kr = *reinterpret_cast<const uint4*>(k + at), vr = *reinterpret_cast<const uint4*>(v + at);
            unsigned* kd = reinterpret_cast<unsigned*>(Ks + j * lds + c);
            unsigned* vd = reinterpret_cast<unsigned*>(Vs + j * lds + c);
            kd[0] = kr.x, kd[1] = kr.y, kd[2] = kr.z, kd[3] = kr.w;
            vd[0] = vr.x, vd[1] = vr.y, vd[2] = vr.z, vd[3] = vr.w;
        }
    } else {
        for (int idx = threadIdx.x; idx < n * E; idx += blockDim.x) {
            const int j = idx / E, e = idx - j * E;
            Ks[j * lds + e] = k[(size_t)(start + j) * ldk + h * E + e];
            Vs[j * lds + e] = v[(size_t)(start + j) * ldk + h * E + e];
        }
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    float* qs = Qs + warp * E;
    float* sc = Ss + warp * max_len;
    const int rows_here = rows_per_seq ? rows_per_seq : n;
    for (int i = warp; i < rows_here; i += warps) {
        __nv_bfloat16* dst = out + (size_t)(start + i) * ldo + h * E;
        if (i >= n) {
            for (int e = lane; e < E; e += 32) dst[e] = float_to_bf16(0.f);
            continue;
        }
        for (int e = lane; e < E; e += 32) qs[e] = bf16_to_float(q[(size_t)(start + i) * ldq + h * E + e]);
        __syncwarp();
        float m = NEG_INF;
        for (int j = lane; j < n; j += 32) {
            const __nv_bfloat162* key = reinterpret_cast<const __nv_bfloat162*>(Ks + j * lds);
            float dot = 0.f;
#pragma unroll 8
            for (int e2 = 0; e2 < E / 2; ++e2) {
                const float2 kv = __bfloat1622float2(key[e2]);
                dot += qs[2 * e2] * kv.x;
                dot += qs[2 * e2 + 1] * kv.y;
            }
            sc[j] = dot * scale;
            m = fmaxf(m, sc[j]);
        }
        const float inv = warp_softmax(sc, n, warp_max(m), lane);
        __syncwarp();
        for (int e2 = lane; e2 < E / 2; e2 += 32) {  // output columns 2 e2 and 2 e2 + 1
            float acc0 = 0.f, acc1 = 0.f;
            for (int j = 0; j < n; ++j) {
                const float2 val = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(Vs + j * lds)[e2]);
                acc0 += sc[j] * val.x;
                acc1 += sc[j] * val.y;
            }
            reinterpret_cast<__nv_bfloat162*>(dst)[e2] = __floats2bfloat162_rn(acc0 * inv, acc1 * inv);
        }
        __syncwarp();
    }
}

#define PREFILL_ENTRY(NAME, HEAD)                                                                                \
    extern "C" __global__ void NAME(const __nv_bfloat16* __restrict__ q, int ldq, const __nv_bfloat16* __restrict__ k, \
                                    const __nv_bfloat16* __restrict__ v, int ldk, const int* __restrict__ seq_start,  \
                                    const int* __restrict__ seq_len, int rows_per_seq, __nv_bfloat16* __restrict__ out, \
                                    int ldo, int E, float scale, int max_len) {                                       \
        let_dependents_launch();                                                                                 \
        attention_prefill<HEAD>(q, ldq, k, v, ldk, seq_start, seq_len, rows_per_seq, out, ldo, E, scale, max_len);   \
    }
PREFILL_ENTRY(attention_prefill_kernel, 0)
PREFILL_ENTRY(attention_prefill_64_kernel, 64)
PREFILL_ENTRY(attention_prefill_128_kernel, 128)

// attention_prefill_mma_64_kernel, _128_: attention_prefill_64_kernel's encoder self-attention on the tensor cores
// (mma.sync m16n8k16, bf16 operands, f32 accumulation): the same arguments, the same rows written (padding rows as
// zeros), any seq_len <= max_len.
//
// One block per (sequence, head), MMA_WARPS warps. The sequence's K and V rows of this head go to shared memory
// once, rows n .. n rounded up to 16 as zeros (a 16-key step may read them; they are masked, and zero V keeps
// 0 * V finite). Each warp takes 16 queries at a time (tiles warp, warp + MMA_WARPS, ...), copies them into its
// own slice of shared memory and reads them with ldmatrix. Keys go in chunks of MMA_KEYS:
//   S = Q K^T (16 x MMA_KEYS f32 in registers) * scale; keys at or past seq_len are -inf;
//   online softmax: each query row keeps its running max m, sum l and output O, rescaled by exp(m_old - m_new)
//   when a chunk raises the max (one chunk, n <= MMA_KEYS: the factor is 0 on an empty O and l, and P is
//   exp(s - max) as attention_prefill takes it), P = exp(s - m) by __expf in f32;
//   O += P V with P split into two bf16 terms, hi = bf16(P) and lo = bf16(P - hi): hi + lo holds P to 2^-16 of
//   itself (bf16 alone: 2^-8), for twice the P V mma; l sums hi + lo (exact in f32), the weights
//   that V is taken with. reference.attention_prefill_mma models these numerics.
// O / l is written as bf16. Fragments (m16n8k16; g = lane / 4, t = lane % 4): the S accumulator of keys
// 16c .. 16c + 15 (two n-tiles, rows g and g + 8, columns 2t and 2t + 1) is register for register P's A
// fragment for k-step c; K's B fragments by ldmatrix from K rows (keys) as they lie, V's by ldmatrix.trans.
// Shared memory (dynamic): K and V as R x (E + 8) bf16, R = max_len rounded up to 16, then MMA_WARPS x 16 x
// (E + 8) bf16 for the queries (rows of E + 8 bf16 are 16-byte aligned, and put the 8 rows an ldmatrix reads
// on 8 different 16-byte bank groups).
// Launch: grid (B, H), block 32 * MMA_WARPS threads; seq_len <= max_len; rows of q, k, v and out 16-byte aligned.
#define MMA_WARPS 4
#define MMA_KEYS 64

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const __nv_bfloat16* p) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const __nv_bfloat16* p) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two f32 weights (columns 2t, 2t + 1 of a row) as bf16 hi and lo halves of an A fragment register; returns
// hi + lo of both, the weight that the mma takes.
__device__ __forceinline__ float split_bf16(float p0, float p1, unsigned& hi, unsigned& lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(p0, p1);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(p0 - hf.x, p1 - hf.y);
    const float2 lf = __bfloat1622float2(l);
    hi = *reinterpret_cast<const unsigned*>(&h);
    lo = *reinterpret_cast<const unsigned*>(&l);
    return (hf.x + lf.x) + (hf.y + lf.y);
}

template <int HEAD>
__device__ __forceinline__ void attention_prefill_mma(const __nv_bfloat16* __restrict__ q, int ldq,
                                                      const __nv_bfloat16* __restrict__ k,
                                                      const __nv_bfloat16* __restrict__ v, int ldk,
                                                      const int* __restrict__ seq_start, const int* __restrict__ seq_len,
                                                      int rows_per_seq, __nv_bfloat16* __restrict__ out, int ldo,
                                                      float scale, int max_len) {
    constexpr int LD = HEAD + 8, CHUNKS = HEAD / 8, KSTEPS = HEAD / 16, OTILES = HEAD / 8, STILES = MMA_KEYS / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    const int b = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const int start = seq_start[b], n = seq_len[b], rows16 = (n + 15) & ~15;
    __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem);
    __nv_bfloat16* Vs = Ks + (size_t)((max_len + 15) & ~15) * LD;
    __nv_bfloat16* Qs = Vs + (size_t)((max_len + 15) & ~15) * LD;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int idx = tid; idx < rows16 * CHUNKS; idx += blockDim.x) {
        const int j = idx / CHUNKS, c = (idx - j * CHUNKS) * 8;
        uint4 kr = zero, vr = zero;
        if (j < n) {
            const size_t at = (size_t)(start + j) * ldk + h * HEAD + c;
            kr = *reinterpret_cast<const uint4*>(k + at);
            vr = *reinterpret_cast<const uint4*>(v + at);
        }
        *reinterpret_cast<uint4*>(Ks + j * LD + c) = kr;
        *reinterpret_cast<uint4*>(Vs + j * LD + c) = vr;
    }
    for (int idx = tid; idx < (rows_per_seq - n) * CHUNKS; idx += blockDim.x) {  // padding rows (none when packed)
        const int i = n + idx / CHUNKS, c = (idx % CHUNKS) * 8;
        *reinterpret_cast<uint4*>(out + (size_t)(start + i) * ldo + h * HEAD + c) = zero;
    }
    __syncthreads();

    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    __nv_bfloat16* qs = Qs + warp * 16 * LD;
    for (int q0 = warp * 16; q0 < n; q0 += MMA_WARPS * 16) {
        for (int idx = lane; idx < 16 * CHUNKS; idx += 32) {  // queries past n as zeros: their rows are not written
            const int r = idx / CHUNKS, c = (idx - r * CHUNKS) * 8;
            *reinterpret_cast<uint4*>(qs + r * LD + c) =
                q0 + r < n ? *reinterpret_cast<const uint4*>(q + (size_t)(start + q0 + r) * ldq + h * HEAD + c) : zero;
        }
        __syncwarp();
        float o[OTILES][4];
#pragma unroll
        for (int et = 0; et < OTILES; ++et) o[et][0] = o[et][1] = o[et][2] = o[et][3] = 0.f;
        float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};  // rows g and g + 8 of the tile
        for (int c0 = 0; c0 < n; c0 += MMA_KEYS) {
            float s[STILES][4];
#pragma unroll
            for (int j = 0; j < STILES; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                unsigned a[4];
                ldmatrix_x4(a, qs + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int j = 0; j < STILES; j += 2) {  // keys c0 + 8j .. + 15: rows below rows16
                    if (c0 + j * 8 < n) {
                        unsigned bk[4];
                        ldmatrix_x4(bk, Ks + (c0 + j * 8 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
                        mma_bf16(s[j], a, bk[0], bk[1]);
                        mma_bf16(s[j + 1], a, bk[2], bk[3]);
                    }
                }
            }
            float top[2] = {m[0], m[1]};
#pragma unroll
            for (int j = 0; j < STILES; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[j][e] = c0 + j * 8 + 2 * t + (e & 1) < n ? s[j][e] * scale : NEG_INF;
                    top[e >> 1] = fmaxf(top[e >> 1], s[j][e]);
                }
            float alpha[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {  // the quad's four lanes hold the row's columns
                top[r] = fmaxf(top[r], __shfl_xor_sync(0xffffffff, top[r], 1));
                top[r] = fmaxf(top[r], __shfl_xor_sync(0xffffffff, top[r], 2));
                alpha[r] = __expf(m[r] - top[r]);  // 0 at the first chunk (m = -inf); top is finite: key c0 < n
                m[r] = top[r];
                l[r] *= alpha[r];
            }
#pragma unroll
            for (int et = 0; et < OTILES; ++et) {
                o[et][0] *= alpha[0], o[et][1] *= alpha[0];
                o[et][2] *= alpha[1], o[et][3] *= alpha[1];
            }
#pragma unroll
            for (int kc = 0; kc < STILES / 2; ++kc) {  // keys c0 + 16 kc .. + 15
                if (c0 + kc * 16 < n) {
                    const float* s0 = s[2 * kc];
                    const float* s1 = s[2 * kc + 1];
                    unsigned hi[4], lo[4];
                    l[0] += split_bf16(__expf(s0[0] - m[0]), __expf(s0[1] - m[0]), hi[0], lo[0]);
                    l[1] += split_bf16(__expf(s0[2] - m[1]), __expf(s0[3] - m[1]), hi[1], lo[1]);
                    l[0] += split_bf16(__expf(s1[0] - m[0]), __expf(s1[1] - m[0]), hi[2], lo[2]);
                    l[1] += split_bf16(__expf(s1[2] - m[1]), __expf(s1[3] - m[1]), hi[3], lo[3]);
#pragma unroll
                    for (int et = 0; et < OTILES; et += 2) {
                        unsigned bv[4];
                        ldmatrix_x4_trans(bv, Vs + (c0 + kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + et * 8 + (lane >> 4) * 8);
                        mma_bf16(o[et], hi, bv[0], bv[1]);
                        mma_bf16(o[et + 1], hi, bv[2], bv[3]);
                        mma_bf16(o[et], lo, bv[0], bv[1]);
                        mma_bf16(o[et + 1], lo, bv[2], bv[3]);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
        }
        const float inv0 = 1.f / l[0], inv1 = 1.f / l[1];
        const int i0 = q0 + g, i1 = q0 + g + 8;
#pragma unroll
        for (int et = 0; et < OTILES; ++et) {
            const int col = h * HEAD + et * 8 + 2 * t;
            if (i0 < n)
                *reinterpret_cast<__nv_bfloat162*>(out + (size_t)(start + i0) * ldo + col) =
                    __floats2bfloat162_rn(o[et][0] * inv0, o[et][1] * inv0);
            if (i1 < n)
                *reinterpret_cast<__nv_bfloat162*>(out + (size_t)(start + i1) * ldo + col) =
                    __floats2bfloat162_rn(o[et][2] * inv1, o[et][3] * inv1);
        }
        __syncwarp();  // every lane's ldmatrix of this tile is done before the next tile overwrites qs
    }
}

#define PREFILL_MMA_ENTRY(NAME, HEAD)                                                                            \
    extern "C" __global__ void __launch_bounds__(32 * MMA_WARPS)                                                \
    NAME(const __nv_bfloat16* __restrict__ q, int ldq, const __nv_bfloat16* __restrict__ k,                      \
         const __nv_bfloat16* __restrict__ v, int ldk, const int* __restrict__ seq_start,                        \
         const int* __restrict__ seq_len, int rows_per_seq, __nv_bfloat16* __restrict__ out, int ldo, int E,     \
         float scale, int max_len) {                                                                             \
        let_dependents_launch();                                                                                 \
        attention_prefill_mma<HEAD>(q, ldq, k, v, ldk, seq_start, seq_len, rows_per_seq, out, ldo, scale, max_len); \
    }
PREFILL_MMA_ENTRY(attention_prefill_mma_64_kernel, 64)
PREFILL_MMA_ENTRY(attention_prefill_mma_128_kernel, 128)

// attention_decode_kernel: one query per row (decoder self- or cross-attention), one warp per (row, head).
//
// Same inputs as attention_kernel (start or table, length per row). Eight lanes share a key or value row:
// each holds E/8 contiguous bf16 of it (16-byte loads). Scores: three shuffles add a key's parts, and a warp
// scores eight keys at a time (two per 8-lane group, both loads in flight at once). Values: each 8-lane group
// sums the weighted values of every fourth key, eight keys a round likewise, and two shuffles add the four
// groups' sums. Keys are taken 32 at a time, each lane looking up one of their cache rows, passed around by
// shuffles (no dependent load per key). E is 64 or 128; at most DECODE_MAX_KEYS keys.
// Launch: grid (ceil(rows * H / 4)), block 128 threads (4 warps).
#define DECODE_MAX_KEYS 1024
#ifndef DECODE_MIN_BLOCKS
#define DECODE_MIN_BLOCKS 10  // head size 64: __launch_bounds__'s blocks an SM, registers capped at 48 (best of 1, 10, 12)
#endif

// Load 8-lane group member `sub`'s VEC bf16 of a row (16 bytes at a time) as floats.
template <int VEC>
__device__ __forceinline__ void load_part(const __nv_bfloat16* at, uint4 (&raw)[VEC / 8]) {
#pragma unroll
    for (int c = 0; c < VEC / 8; ++c) raw[c] = *reinterpret_cast<const uint4*>(at + c * 8);
}

template <int VEC>
__device__ __forceinline__ float part_value(const uint4 (&raw)[VEC / 8], int x) {
    return bf16_to_float(reinterpret_cast<const __nv_bfloat16*>(&raw[x / 8])[x % 8]);
}

// Keys 0 .. n-1 of a warp's query, eight a round (two per 8-lane group: j and j + 4), the group's lanes each
// loading their VEC elements of the key's row of `base` (k or v); cache rows looked up 32 keys at a time, a
// lane each, and passed around by shuffles. visit(ja, has_a, raw_a, jb, has_b, raw_b) on every lane, each round.
template <int VEC, typename Visit>
__device__ __forceinline__ void walk_key_rows(const __nv_bfloat16* __restrict__ base, int ldk, size_t column, int n,
                                              const int* __restrict__ rows_of, int first, int lane, int group,
                                              Visit visit) {
    for (int c0 = 0; c0 < n; c0 += 32) {
        const int span = min(32, n - c0);
        const int mine = lane < span ? (rows_of ? rows_of[c0 + lane] : first + c0 + lane) : 0;  // cache rows
        for (int j0 = 0; j0 < span; j0 += 8) {
            const int ja = j0 + group, jb = ja + 4;
            const size_t ra = __shfl_sync(0xffffffff, mine, ja), rb = __shfl_sync(0xffffffff, mine, jb);
            uint4 rawa[VEC / 8], rawb[VEC / 8];
            if (ja < span) load_part<VEC>(base + ra * ldk + column, rawa);
            if (jb < span) load_part<VEC>(base + rb * ldk + column, rawb);
            visit(c0 + ja, ja < span, rawa, c0 + jb, jb < span, rawb);
        }
    }
}

// The warp's (row, head) of a decode block: with `together`, a block takes 4 consecutive rows of one head (rows that
// read the same keys share them in L1), else 4 consecutive (row, head) pairs. False: the warp has none.
__device__ __forceinline__ bool decode_row_head(int together, int rows, int H, int warp, int& row, int& h) {
    if (together) {
        row = blockIdx.x / H * 4 + warp, h = blockIdx.x % H;
        return row < rows;
    }
    const int pair = blockIdx.x * 4 + warp;
    if (pair >= rows * H) return false;
    row = pair / H, h = pair - row * H;
    return true;
}

// A lane's VEC query elements as floats.
template <int VEC>
__device__ __forceinline__ void load_query(const __nv_bfloat16* at, float (&qv)[VEC]) {
    uint4 raw[VEC / 8];
    load_part<VEC>(at, raw);
#pragma unroll
    for (int x = 0; x < VEC; ++x) qv[x] = part_value<VEC>(raw, x);
}

// The four 8-lane groups' sums of a lane's VEC output columns, times inv, stored as bf16 at dst by group 0.
template <int VEC>
__device__ __forceinline__ void store_decode_out(float (&acc)[VEC], float inv, int group, __nv_bfloat16* dst) {
#pragma unroll
    for (int x = 0; x < VEC; ++x) {
        acc[x] += __shfl_xor_sync(0xffffffff, acc[x], 8);
        acc[x] += __shfl_xor_sync(0xffffffff, acc[x], 16);
    }
    if (group != 0) return;
#pragma unroll
    for (int c = 0; c < VEC / 8; ++c) {
        uint4 packed;
        __nv_bfloat162* pk = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
        for (int x = 0; x < 4; ++x)
            pk[x] = __floats2bfloat162_rn(acc[c * 8 + 2 * x] * inv, acc[c * 8 + 2 * x + 1] * inv);
        *reinterpret_cast<uint4*>(dst + c * 8) = packed;
    }
}

template <int E>
__device__ __forceinline__ void attention_decode(const __nv_bfloat16* __restrict__ q, int ldq,
                                                 const __nv_bfloat16* __restrict__ k,
                                                 const __nv_bfloat16* __restrict__ v, int ldk,
                                                 const int* __restrict__ start, const int* __restrict__ length,
                                                 const int* __restrict__ table, int table_stride,
                                                 __nv_bfloat16* __restrict__ out, int rows, int H, float scale,
                                                 int together) {
    __shared__ float scores[4][DECODE_MAX_KEYS];
    constexpr int VEC = E / 8;  // elements per lane of a key or value row
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row, h;
    if (!decode_row_head(together, rows, H, warp, row, h)) return;
    const int n = length[row];
    const int* rows_of = table ? table + (size_t)row * table_stride : nullptr;
    const int first = table ? 0 : start[row];
    const int group = lane >> 3, sub = lane & 7;
    const size_t column = h * E + sub * VEC;
    float qv[VEC];
    load_query<VEC>(q + (size_t)row * ldq + column, qv);
    float* sc = scores[warp];
    float m = NEG_INF;
    using Raw = uint4[VEC / 8];
    walk_key_rows<VEC>(k, ldk, column, n, rows_of, first, lane, group,
                       [&](int ja, bool has_a, const Raw& rawa, int jb, bool has_b, const Raw& rawb) {
        float da = 0.f, db = 0.f;
        if (has_a) {
#pragma unroll
            for (int x = 0; x < VEC; ++x) da += qv[x] * part_value<VEC>(rawa, x);
        }
        if (has_b) {
#pragma unroll
            for (int x = 0; x < VEC; ++x) db += qv[x] * part_value<VEC>(rawb, x);
        }
#pragma unroll
        for (int offset = 1; offset < 8; offset <<= 1) {
            da += __shfl_xor_sync(0xffffffff, da, offset);
            db += __shfl_xor_sync(0xffffffff, db, offset);
        }
        if (has_a) {
            if (sub == 0) sc[ja] = da * scale;
            m = fmaxf(m, da * scale);
        }
        if (has_b) {
            if (sub == 0) sc[jb] = db * scale;
            m = fmaxf(m, db * scale);
        }
    });
    m = warp_max(m);
    __syncwarp();
    const float inv = warp_softmax(sc, n, m, lane);
    __syncwarp();
    float acc[VEC];
#pragma unroll
    for (int x = 0; x < VEC; ++x) acc[x] = 0.f;
    walk_key_rows<VEC>(v, ldk, column, n, rows_of, first, lane, group,
                       [&](int ja, bool has_a, const Raw& rawa, int jb, bool has_b, const Raw& rawb) {
        if (has_a) {
            const float p = sc[ja];
#pragma unroll
            for (int x = 0; x < VEC; ++x) acc[x] += p * part_value<VEC>(rawa, x);
        }
        if (has_b) {
            const float p = sc[jb];
#pragma unroll
            for (int x = 0; x < VEC; ++x) acc[x] += p * part_value<VEC>(rawb, x);
        }
    });
    store_decode_out<VEC>(acc, inv, group, out + (size_t)row * H * E + column);
}

#define DECODE_ENTRY(E, MIN_BLOCKS)                                                                              \
    extern "C" __global__ void __launch_bounds__(128, MIN_BLOCKS) attention_decode_##E##_kernel(                  \
        const __nv_bfloat16* __restrict__ q, int ldq, const __nv_bfloat16* __restrict__ k,                        \
        const __nv_bfloat16* __restrict__ v, int ldk, const int* __restrict__ start, const int* __restrict__ length, \
        const int* __restrict__ table, int table_stride, __nv_bfloat16* __restrict__ out, int rows, int H,        \
        float scale, int together) {                                                                             \
        let_dependents_launch();                                                                                 \
        attention_decode<E>(q, ldq, k, v, ldk, start, length, table, table_stride, out, rows, H, scale, together); \
    }
DECODE_ENTRY(64, DECODE_MIN_BLOCKS)
DECODE_ENTRY(128, 1)  // not capped: at 48 registers it spills (head size 128, unmeasured)


// attention_decode_e4m3_64_kernel, _128_: attention_decode over an FP8 K/V cache (--kv-cache-type float8), with
// attention_e4m3_kernel's numbers: the same warps, lanes and order of keys, each 8-lane group loading its E/8 codes
// of a key row (8 or 16 bytes), each lane looking up the scale of the key whose cache row it looked up and passing
// it around with the row. A score is the scale times the dot product of q with the codes' values; a value row is
// summed with its weight times its scale. k, v (rows, ldk) uint8, k_scales, v_scales (rows, lds) f32; rows of k and v
// 8-byte aligned (E 64) or 16-byte (E 128).
// Launch: grid (ceil(rows * H / 4)), block 128 threads (4 warps).
#ifndef DECODE_E4M3_MIN_BLOCKS
#define DECODE_E4M3_MIN_BLOCKS 10  // head size 64: as attention_decode_64_kernel's
#endif

// Keys 0 .. n-1 of a warp's query, eight a round, as walk_key_rows takes them, over E4M3 rows: each lane's VEC
// codes of the key's row (VEC / 8 loads of 8 bytes), and the key's scale. visit(ja, has_a, raw_a, scale_a, jb,
// has_b, raw_b, scale_b) on every lane, each round.
template <int VEC, typename Visit>
__device__ __forceinline__ void walk_code_rows(const unsigned char* __restrict__ base, int ldk, size_t column,
                                               const float* __restrict__ scales, int lds, int h, int n,
                                               const int* __restrict__ rows_of, int first, int lane, int group,
                                               Visit visit) {
    for (int c0 = 0; c0 < n; c0 += 32) {
        const int span = min(32, n - c0);
        const int mine = lane < span ? (rows_of ? rows_of[c0 + lane] : first + c0 + lane) : 0;  // cache rows
        const float my_scale = lane < span ? scales[(size_t)mine * lds + h] : 0.f;
        for (int j0 = 0; j0 < span; j0 += 8) {
            const int ja = j0 + group, jb = ja + 4;
            const size_t ra = __shfl_sync(0xffffffff, mine, ja), rb = __shfl_sync(0xffffffff, mine, jb);
            const float sa = __shfl_sync(0xffffffff, my_scale, ja), sb = __shfl_sync(0xffffffff, my_scale, jb);
            uint2 rawa[VEC / 8], rawb[VEC / 8];
#pragma unroll
            for (int c = 0; c < VEC / 8; ++c) {
                if (ja < span) rawa[c] = *reinterpret_cast<const uint2*>(base + ra * ldk + column + c * 8);
                if (jb < span) rawb[c] = *reinterpret_cast<const uint2*>(base + rb * ldk + column + c * 8);
            }
            visit(c0 + ja, ja < span, rawa, sa, c0 + jb, jb < span, rawb, sb);
        }
    }
}

// A lane's VEC codes as floats.
template <int VEC>
__device__ __forceinline__ void code_values(const uint2 (&raw)[VEC / 8], float (&out)[VEC]) {
    const unsigned short* pairs = reinterpret_cast<const unsigned short*>(raw);
#pragma unroll
    for (int x = 0; x < VEC / 2; ++x) {
        const float2 f = e4m3x2_to_float2(pairs[x]);
        out[2 * x] = f.x;
        out[2 * x + 1] = f.y;
    }
}

template <int E>
__device__ __forceinline__ void attention_decode_e4m3(const __nv_bfloat16* __restrict__ q, int ldq,
                                                      const unsigned char* __restrict__ k,
                                                      const unsigned char* __restrict__ v, int ldk,
                                                      const float* __restrict__ k_scales,
                                                      const float* __restrict__ v_scales, int lds,
                                                      const int* __restrict__ start, const int* __restrict__ length,
                                                      const int* __restrict__ table, int table_stride,
                                                      __nv_bfloat16* __restrict__ out, int rows, int H, float scale,
                                                      int together) {
    __shared__ float scores[4][DECODE_MAX_KEYS];
    constexpr int VEC = E / 8;  // codes per lane of a key or value row
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row, h;
    if (!decode_row_head(together, rows, H, warp, row, h)) return;
    const int n = length[row];
    const int* rows_of = table ? table + (size_t)row * table_stride : nullptr;
    const int first = table ? 0 : start[row];
    const int group = lane >> 3, sub = lane & 7;
    const size_t column = h * E + sub * VEC;
    float qv[VEC];
    load_query<VEC>(q + (size_t)row * ldq + column, qv);
    float* sc = scores[warp];
    float m = NEG_INF;
    using Raw = uint2[VEC / 8];
    walk_code_rows<VEC>(k, ldk, column, k_scales, lds, h, n, rows_of, first, lane, group,
                        [&](int ja, bool has_a, const Raw& rawa, float sa, int jb, bool has_b, const Raw& rawb, float sb) {
        float da = 0.f, db = 0.f;
        float values[VEC];
        if (has_a) {
            code_values<VEC>(rawa, values);
#pragma unroll
            for (int x = 0; x < VEC; ++x) da += qv[x] * values[x];
        }
        if (has_b) {
            code_values<VEC>(rawb, values);
#pragma unroll
            for (int x = 0; x < VEC; ++x) db += qv[x] * values[x];
        }
#pragma unroll
        for (int offset = 1; offset < 8; offset <<= 1) {
            da += __shfl_xor_sync(0xffffffff, da, offset);
            db += __shfl_xor_sync(0xffffffff, db, offset);
        }
        da = da * sa * scale, db = db * sb * scale;
        if (has_a) {
            if (sub == 0) sc[ja] = da;
            m = fmaxf(m, da);
        }
        if (has_b) {
            if (sub == 0) sc[jb] = db;
            m = fmaxf(m, db);
        }
    });
    m = warp_max(m);
    __syncwarp();
    const float inv = warp_softmax(sc, n, m, lane);
    __syncwarp();
    float acc[VEC];
#pragma unroll
    for (int x = 0; x < VEC; ++x) acc[x] = 0.f;
    walk_code_rows<VEC>(v, ldk, column, v_scales, lds, h, n, rows_of, first, lane, group,
                        [&](int ja, bool has_a, const Raw& rawa, float sa, int jb, bool has_b, const Raw& rawb, float sb) {
        float values[VEC];
        if (has_a) {
            const float p = sc[ja] * sa;
            code_values<VEC>(rawa, values);
#pragma unroll
            for (int x = 0; x < VEC; ++x) acc[x] += p * values[x];
        }
        if (has_b) {
            const float p = sc[jb] * sb;
            code_values<VEC>(rawb, values);
#pragma unroll
            for (int x = 0; x < VEC; ++x) acc[x] += p * values[x];
        }
    });
    store_decode_out<VEC>(acc, inv, group, out + (size_t)row * H * E + column);
}

#define DECODE_E4M3_ENTRY(E, MIN_BLOCKS)                                                                         \
    extern "C" __global__ void __launch_bounds__(128, MIN_BLOCKS) attention_decode_e4m3_##E##_kernel(             \
        const __nv_bfloat16* __restrict__ q, int ldq, const unsigned char* __restrict__ k,                        \
        const unsigned char* __restrict__ v, int ldk, const float* __restrict__ k_scales,                         \
        const float* __restrict__ v_scales, int lds, const int* __restrict__ start, const int* __restrict__ length, \
        const int* __restrict__ table, int table_stride, __nv_bfloat16* __restrict__ out, int rows, int H,        \
        float scale, int together) {                                                                             \
        let_dependents_launch();                                                                                 \
        attention_decode_e4m3<E>(q, ldq, k, v, ldk, k_scales, v_scales, lds, start, length, table, table_stride,  \
                                 out, rows, H, scale, together);                                                 \
    }
DECODE_E4M3_ENTRY(64, DECODE_E4M3_MIN_BLOCKS)
DECODE_E4M3_ENTRY(128, 1)
