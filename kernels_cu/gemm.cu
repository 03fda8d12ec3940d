// gemm_kernel: C = epilogue(A @ W^T), bf16 tensor cores (mma.sync m16n8k16), fp32 accumulation.
//
// A (M, K) bf16 row-major; W (N, K) bf16 row-major (nn.Linear's weight layout, so both operands are
// K-contiguous); K % 8 == 0 (16-byte rows for cp.async); M and N any size (edges are zero-filled/guarded).
// Epilogues (bias, ReLU, residual; or argmax / top-k of the logits without writing them): gemm_epilogue.cuh.
// Launch: grid (ceil(N/BN), ceil(M/BM)), block 32 * (BM/WM) * (BN/WN) threads, dynamic shared memory
// STAGES * (BM + BN) * 40 * 2 bytes. Tile sizes are -D defines set by the loader: BM x BN per block, WM x WN
// per warp (multiples of 16 x 16), BK = 32, STAGES (2 or more).
// Shared memory: STAGES stages of A and W tiles, rows padded to 40 bf16 (80 bytes) so that the eight rows an
// ldmatrix reads fall on distinct banks; cp.async fills STAGES - 1 stages ahead while the tensor cores read
// one. Every output element sums its K products in the same order whatever the tile shape or stage count,
// so all configurations give the same bits.

#ifndef BM
#define BM 128
#define BN 128
#define WM 64
#define WN 32
#endif
#define BK 32
#define LDS (BK + 8)
#ifndef STAGES
#define STAGES 2
#endif
#define WARPS_M (BM / WM)
#define WARPS_N (BN / WN)
#define THREADS (32 * WARPS_M * WARPS_N)
#define MT (WM / 16)
#define NT (WN / 8)
#define EPI_THREADS THREADS
#define EPI_SYNC() __syncthreads()
#define EPI_SMEM_BYTES (STAGES * (BM + BN) * LDS * 2)
#include "common.cuh"
#include "gemm_epilogue.cuh"

__device__ __forceinline__ void cp_async_16(void* smem, const void* global, bool valid) {
    unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    int bytes = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros, read nothing
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global), "r"(bytes));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, const void* smem) {
    unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ void mma_bf16(float* c, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_kernel(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ W,
            const float* __restrict__ bias, const float* __restrict__ residual, void* __restrict__ out,
            float* __restrict__ part_val, int* __restrict__ part_idx,
            int M, int N, int K, int relu, int epilogue, int out_f32, float* __restrict__ part_stat,
            const float* __restrict__ thresh, const unsigned char* __restrict__ needed,
            const unsigned* __restrict__ noise) {
    extern __shared__ __align__(16) unsigned char gemm_smem[];
    __nv_bfloat16* As = reinterpret_cast<__nv_bfloat16*>(gemm_smem);  // STAGES x BM x LDS
    __nv_bfloat16* Ws = As + STAGES * BM * LDS;                         // STAGES x BN x LDS
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
    const int block_m = blockIdx.y * BM, block_n = blockIdx.x * BN;
    if (needed && !needed[blockIdx.y * gridDim.x + blockIdx.x]) return;  // a tile no row needs (see gemm_sm90.cu)

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

    auto load_stage = [&](int stage, int k0) {
        for (int c = tid; c < BM * (BK / 8); c += THREADS) {
            const int row = c / (BK / 8), col = (c % (BK / 8)) * 8, gm = block_m + row, gk = k0 + col;
            const bool ok = gm < M && gk < K;
            cp_async_16(&As[(stage * BM + row) * LDS + col], ok ? (const void*)(A + (size_t)gm * K + gk) : (const void*)A, ok);
        }
        for (int c = tid; c < BN * (BK / 8); c += THREADS) {
            const int row = c / (BK / 8), col = (c % (BK / 8)) * 8, gn = block_n + row, gk = k0 + col;
            const bool ok = gn < N && gk < K;
            cp_async_16(&Ws[(stage * BN + row) * LDS + col], ok ? (const void*)(W + (size_t)gn * K + gk) : (const void*)W, ok);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };

    const int k_tiles = CEIL_DIV(K, BK);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {  // fill the pipeline; an empty group where there is no tile
        if (s < k_tiles) load_stage(s, s * BK);
        else asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int kt = 0; kt < k_tiles; ++kt) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));  // tile kt has landed
        __syncthreads();  // ... for every thread, and every warp is done with the stage refilled below
        const int ahead = kt + STAGES - 1;
        if (ahead < k_tiles) load_stage(ahead % STAGES, ahead * BK);
        else asm volatile("cp.async.commit_group;\n" ::);
        const int stage = kt % STAGES;
        const __nv_bfloat16* as = As + stage * BM * LDS;
        const __nv_bfloat16* ws = Ws + stage * BN * LDS;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned a[MT][4], b[NT][2];
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const int row = warp_m * WM + i * 16 + (lane & 15), col = kk + (lane >> 4) * 8;
                ldmatrix_x4(a[i][0], a[i][1], a[i][2], a[i][3], as + row * LDS + col);
            }
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                const int row = warp_n * WN + j * 8 + (lane & 7) + (lane >> 4) * 8, col = kk + ((lane >> 3) & 1) * 8;
                ldmatrix_x4(b[j][0], b[j][1], b[j + 1][0], b[j + 1][1], ws + row * LDS + col);
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j) mma_bf16(acc[i][j], a[i], b[j]);
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();  // the stages may be reused by the epilogue
    gemm_epilogue(acc, gemm_smem, tid, warp_m, warp_n, block_m, block_n, blockIdx.x, gridDim.x, bias, residual, out,
                  part_val, part_idx, part_stat, thresh, noise, M, N, relu, epilogue, out_f32);
}

// argmax_reduce_kernel: per row m, the best of `parts` (value, index) partials -> values[m], ids[m]. With part_sum
// (the ARGMAX_LSE epilogue's: each part's sum of exp(logit - its max)), also logprob[m] = the chosen id's
// log-probability, -log(sum_p part_sum * exp(part max - best)) (its logit less the row's log-sum-exp).
// Launch: grid (M), block 128 threads.
extern "C" __global__ void argmax_reduce_kernel(const float* __restrict__ part_val, const int* __restrict__ part_idx,
                                                float* __restrict__ values, int* __restrict__ ids, int parts,
                                                const float* __restrict__ part_sum, float* __restrict__ logprob) {
    __shared__ float sv[32], top;
    __shared__ int si[32];
    const int m = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float best = NEG_INF;
    int at = 0x7fffffff;
    for (int p = threadIdx.x; p < parts; p += blockDim.x) {
        const float v = part_val[(size_t)m * parts + p];
        const int n = part_idx[(size_t)m * parts + p];
        if (beats(v, n, best, at)) { best = v; at = n; }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float v = __shfl_xor_sync(0xffffffff, best, offset);
        const int n = __shfl_xor_sync(0xffffffff, at, offset);
        if (beats(v, n, best, at)) { best = v; at = n; }
    }
    if (lane == 0) { sv[warp] = best; si[warp] = at; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
            if (beats(sv[w], si[w], best, at)) { best = sv[w]; at = si[w]; }
        values[m] = best;
        ids[m] = at;
        top = best;
    }
    if (!part_sum) return;
    __syncthreads();  // top, the row's best, seen by every thread
    float total = 0.f;
    for (int p = threadIdx.x; p < parts; p += blockDim.x)
        total += part_sum[(size_t)m * parts + p] * __expf(part_val[(size_t)m * parts + p] - top);
    total = block_sum(total, sv);
    if (threadIdx.x == 0) logprob[m] = -__logf(total);
}

// Beam search's top-k in two passes over the output projection (kernels.logits_topk): EPILOGUE_STAT gives each
// row's max and sum of exponentials per block of BN columns (a "part"); topk_threshold_kernel turns them into
// the row's log-sum-exp and a threshold, the TOPK-th largest part max; the EPILOGUE_TOPK pass recomputes only
// the tiles where some row's part max reaches its threshold and lists the candidates there; topk_select_kernel
// picks each row's TOPK best. The TOPK best logits of a row are at least its threshold (TOPK parts hold a
// logit that large), so they lie in parts whose max reaches it: the same TOPK, in the same order, as over
// every column.

// topk_threshold_kernel: per row m, from part_stat (M, parts, 2): lse[m] = max + log(sum_p sum_p *
// exp(max_p - max)), and thresh[m] = the TOPK-th largest of the parts' maxima (counting repeats; -inf where
// there are fewer parts); needed[(m / needed_rows) * parts + p] = 1 for each part p whose max reaches it
// (needed: zeroed by the caller, one byte per tile of the EPILOGUE_TOPK pass, needed_rows its BM).
// Launch: grid (M), block 256 threads (the log-sum-exp's summation order depends on it).
extern "C" __global__ void topk_threshold_kernel(const float* __restrict__ part_stat, float* __restrict__ lse,
                                                 float* __restrict__ thresh, unsigned char* __restrict__ needed,
                                                 int parts, int needed_rows) {
    __shared__ float sv[32], list_val[8][TOPK];
    __shared__ int list_at[8][TOPK];
    __shared__ float shared_max, shared_thresh;
    const int m = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float* stat = part_stat + (size_t)m * parts * 2;

    float mx = NEG_INF;
    float top[TOPK];
    int at[TOPK];
#pragma unroll
    for (int r = 0; r < TOPK; ++r) top[r] = NEG_INF, at[r] = 0x7fffffff;
    for (int p = threadIdx.x; p < parts; p += blockDim.x) {
        mx = fmaxf(mx, stat[2 * p]);
        topk_insert(top, at, stat[2 * p], p);
    }
    mx = warp_max(mx);
    merge_topk_lanes<32>(top, at);
    if (lane == 0) {
        sv[warp] = mx;
#pragma unroll
        for (int r = 0; r < TOPK; ++r) list_val[warp][r] = top[r], list_at[warp][r] = at[r];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float v = sv[0];
        for (int w = 1; w < warps; ++w) v = fmaxf(v, sv[w]);
        shared_max = v;
        for (int w = 1; w < warps; ++w)
#pragma unroll
            for (int r = 0; r < TOPK; ++r) topk_insert(top, at, list_val[w][r], list_at[w][r]);
        shared_thresh = top[TOPK - 1];
        thresh[m] = top[TOPK - 1];
    }
    __syncthreads();
    float total = 0.f;
    for (int p = threadIdx.x; p < parts; p += blockDim.x)
        if (stat[2 * p] != NEG_INF) total += stat[2 * p + 1] * __expf(stat[2 * p] - shared_max);
    total = warp_sum(total);
    __syncthreads();
    if (lane == 0) sv[warp] = total;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int w = 0; w < warps; ++w) t += sv[w];
        lse[m] = shared_max + __logf(t);
    }
    unsigned char* mark = needed + (size_t)(m / needed_rows) * parts;
    for (int p = threadIdx.x; p < parts; p += blockDim.x)
        if (stat[2 * p] >= shared_thresh) mark[p] = 1;
}

// topk_select_kernel: per row m, the TOPK best of the candidates listed in the parts whose max reaches
// thresh[m] (part_val/part_idx (M, parts, TOPK)) -> logprob = logit - lse[m] (M, TOPK) f32 and ids (M, TOPK)
// int32, best first (ties: lower column). Launch: grid (ceil(M / 8)), block 256 threads: a warp per row.
extern "C" __global__ void topk_select_kernel(const float* __restrict__ part_stat, const float* __restrict__ part_val,
                                              const int* __restrict__ part_idx, const float* __restrict__ lse,
                                              const float* __restrict__ thresh, float* __restrict__ logprob,
                                              int* __restrict__ ids, int M, int parts) {
    const int m = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (m >= M) return;
    const float* stat = part_stat + (size_t)m * parts * 2;
    const float floor = thresh[m];
    float top[TOPK];
    int at[TOPK];
#pragma unroll
    for (int r = 0; r < TOPK; ++r) top[r] = NEG_INF, at[r] = 0x7fffffff;
    for (int p = lane; p < parts; p += 32) {
        if (stat[2 * p] < floor) continue;
        const size_t slot = ((size_t)m * parts + p) * TOPK;
        for (int r = 0; r < TOPK; ++r) {
            const float v = part_val[slot + r];
            if (v < floor) break;  // the list is best first, and only logits from the threshold up count
            topk_insert(top, at, v, part_idx[slot + r]);
        }
    }
    merge_topk_lanes<32>(top, at);
    if (lane == 0) {
        const float l = lse[m];
#pragma unroll
        for (int r = 0; r < TOPK; ++r) logprob[(size_t)m * TOPK + r] = top[r] - l, ids[(size_t)m * TOPK + r] = at[r];
    }
}
