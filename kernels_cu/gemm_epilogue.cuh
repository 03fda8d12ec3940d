// The GEMM kernels' shared epilogue: what happens to a finished BM x BN tile of fp32 accumulators.
// Pasted after the including kernel has defined its geometry:
//   BM, BN       the block tile; WM, WN one warp's part of it; MT = WM / 16, NT = WN / 8; WARPS_N = BN / WN
//   EPI_THREADS  the threads that hold the tile (warps numbered from 0 among them); EPI_SYNC() their barrier
//   EPI_SMEM_BYTES  shared memory free for staging once the main loop is done; TOPK the candidates per block
//   EPILOGUE_KIND (optional) fixes the epilogue at compile time (the `epilogue` argument is then ignored).
// Fragment acc[i][j][e] of warp (warp_m, warp_n) is tile row warp_m * WM + i * 16 + lane / 4 + (e / 2) * 8,
// tile column warp_n * WN + j * 8 + (lane % 4) * 2 + e % 2: the layout of mma.sync m16n8 and of wgmma m64nN.
//   EPILOGUE_STORE  out[m, n] = relu?(acc + bias[n]) + residual[m, n], stored bf16 or f32 (out_f32);
//                   bias (N,) f32 and residual (M, N) f32 may be null.
//   EPILOGUE_ARGMAX the logits are never written: per row, the largest value over this block's BN columns
//                   and its column go to part_val/part_idx[m, part] (ties: lower column), where part is the
//                   block's column-tile index of `parts`; argmax_reduce_kernel reduces the partials per row.
//                   Compiled with SAMPLE (sampling over the whole vocabulary), the value of column n is
//                   logit * SAMPLE_INV_TEMP + gumbel_noise(noise[m], n), and -inf at column SAMPLE_BANNED (-1:
//                   none): by the Gumbel-max trick, the largest is a draw from softmax(logits / temperature).
//                   (A column whose scaled logit is below the best so far by GUMBEL_MAX, which no draw reaches,
//                   is skipped: it cannot win.) Compiled with ARGMAX_LSE instead, also the sum of exp(logit -
//                   that largest value) over the block's columns to part_stat[m, part] (one exp a logit, from the
//                   registers where WARPS_N == 1), from which argmax_reduce_kernel makes each row's log-sum-exp and
//                   the chosen id's log-probability.
//   EPILOGUE_STAT   the logits are never written either: per row and part of PART columns (PART divides BN;
//                   less than BN only where WARPS_N == 1), the max and the sum of exp(logit - max) over the
//                   part go to part_stat[m, p, 0..1], p = column / PART of ceil(N / PART) parts. The same
//                   operations in the same order whatever BN, so the same bits as from a BN = PART tile.
//   EPILOGUE_TOPK   the second pass of beam search's top-k (kernels.logits_topk): for the rows whose max over
//                   this block reaches thresh[m] (null: every row), the block's TOPK best columns, best first
//                   (ties: lower column), go to part_val/part_idx[m, part, 0..TOPK-1]; other rows' lists are
//                   not written. Where a warp holds whole rows of the tile (WARPS_N == 1, the wgmma kernel)
//                   from the registers, each quad merging its lanes' lists, and only logits from the
//                   threshold up (the rest of the list padded with -inf and column 0x7fffffff); elsewhere
//                   through the tile staged in shared memory (BM * BN floats), every logit (topk_select_kernel
//                   stops at the threshold). A row's max over the block is the max of its EPILOGUE_STAT parts
//                   here (a max has no rounding), so both passes agree on which rows take part.
#define EPILOGUE_STORE 0
#define EPILOGUE_ARGMAX 1
#define EPILOGUE_TOPK 2
#define EPILOGUE_STAT 3
#define POS_INF (__int_as_float(0x7f800000))
#ifndef TOPK
#define TOPK 8
#endif
#ifndef PART
#define PART BN
#endif
#if BN % PART || (WARPS_N > 1 && PART != BN)
#error "PART must divide BN, and equal it unless a warp holds whole rows"
#endif

#ifdef SAMPLE
#ifndef SAMPLE_BANNED
#define SAMPLE_BANNED -1
#endif
// nllbcli/engine/numerics.py's mix32 and gumbel_noise, operation for operation: a Gumbel(0, 1) draw for token
// n of a row whose step key is row_key, from the row's counter-based stream.
__device__ __forceinline__ unsigned mix32(unsigned x) {
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    return x ^ (x >> 16);
}

__device__ __forceinline__ float gumbel_noise(unsigned row_key, int n) {
    const unsigned h = mix32(row_key ^ ((unsigned)n * 0x27D4EB2Fu + 0x165667B1u));
    const float v = ((float)(h >> 9) + 0.5f) * 1.1920928955078125e-07f;  // (0, 1): 23 bits and a half, times 2^-23
    const float e = v < 0.00390625f ? v * (1.f + v * 0.5f) : -logf(1.f - v);  // Exp(1): -log(1 - v), precise at 0
    return -logf(e);
}
#define GUMBEL_MAX 16.7f  // above every gumbel_noise: a logit this far below the best so far cannot win
#endif

// Is (v, i) a better maximum than (best, at)? Ties go to the lower index, as torch.argmax and numpy.
__device__ __forceinline__ bool beats(float v, int i, float best, int at) {
    return v > best || (v == best && i < at);
}

// Put (v, n) into top[0..TOPK-1] / at[], kept best first (ties: lower column), if it beats the last.
__device__ __forceinline__ void topk_insert(float (&top)[TOPK], int (&at)[TOPK], float v, int n) {
    if (!beats(v, n, top[TOPK - 1], at[TOPK - 1])) return;
    top[TOPK - 1] = v, at[TOPK - 1] = n;
#pragma unroll
    for (int r = TOPK - 1; r > 0; --r)
        if (beats(top[r], at[r], top[r - 1], at[r - 1])) {
            const float tv = top[r];
            const int ti = at[r];
            top[r] = top[r - 1], at[r] = at[r - 1];
            top[r - 1] = tv, at[r - 1] = ti;
        }
}

// Each lane's list merged with those of the lanes whose numbers differ only below SPAN (4: a quad, 32: the
// warp): every one of them ends with their TOPK best. The best of a set, so the order of the merges is free.
// Long lists are inserted one entry at a time in a loop (the partner's list in local memory), not unrolled:
// TOPK 32 unrolled was ~5,000 compare-and-swaps a call, and 80-95 s of compiling.
template <int SPAN>
__device__ __forceinline__ void merge_topk_lanes(float (&top)[TOPK], int (&at)[TOPK]) {
    constexpr int unrolled = TOPK <= 8 ? TOPK : 1;
#pragma unroll
    for (int offset = 1; offset < SPAN; offset <<= 1) {
        float other[TOPK];
        int other_at[TOPK];
#pragma unroll
        for (int r = 0; r < TOPK; ++r) {
            other[r] = __shfl_xor_sync(0xffffffff, top[r], offset);
            other_at[r] = __shfl_xor_sync(0xffffffff, at[r], offset);
        }
#pragma unroll unrolled
        for (int r = 0; r < TOPK; ++r) {
            if (!beats(other[r], other_at[r], top[TOPK - 1], at[TOPK - 1])) break;  // the rest of a best-first list neither
            topk_insert(top, at, other[r], other_at[r]);
        }
    }
}

#if WARPS_N == 1
// The max of tile row (i, half)'s logits in n8 chunks j0 .. j1 - 1 (columns past N left out), over its quad.
__device__ __forceinline__ float quad_row_max(const float (&acc)[MT][NT][4], int i, int half, int j0, int j1,
                                              int block_n, int N, int lane) {
    float best = NEG_INF;
#pragma unroll
    for (int j = j0; j < j1; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
            if (block_n + j * 8 + (lane & 3) * 2 + e < N) best = fmaxf(best, acc[i][j][half * 2 + e]);
    best = fmaxf(best, __shfl_xor_sync(0xffffffff, best, 1));
    return fmaxf(best, __shfl_xor_sync(0xffffffff, best, 2));
}
#endif

__device__ __forceinline__ void gemm_epilogue(
    float (&acc)[MT][NT][4], unsigned char* stage_smem, int tid, int warp_m, int warp_n, int block_m, int block_n,
    int part, int parts, const float* __restrict__ bias, const float* __restrict__ residual, void* __restrict__ out,
    float* __restrict__ part_val, int* __restrict__ part_idx, float* __restrict__ part_stat,
    const float* __restrict__ thresh, const unsigned* __restrict__ noise, int M, int N, int relu, int epilogue,
    int out_f32) {
    const int lane = tid & 31;
#ifdef EPILOGUE_KIND  // the kernel was compiled for one epilogue: the others' code is left out
    epilogue = EPILOGUE_KIND;
#endif
    if (epilogue == EPILOGUE_STORE) {
        // two neighbouring columns in one 4- or 8-byte access, where N is even and the arrays are aligned for it
        const bool pairs = (N & 1) == 0 && (((size_t)bias | (size_t)residual) & 7) == 0 &&
                           ((size_t)out & (out_f32 ? 7 : 3)) == 0;
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int m = block_m + warp_m * WM + i * 16 + (lane >> 2) + half * 8;
                    const int n = block_n + warp_n * WN + j * 8 + (lane & 3) * 2;
                    if (m >= M || n >= N) continue;
                    float v0 = acc[i][j][half * 2], v1 = acc[i][j][half * 2 + 1];
                    const size_t at = (size_t)m * N + n;
                    if (pairs) {  // n is even, so n + 1 < N too
                        if (bias) { const float2 b = *reinterpret_cast<const float2*>(bias + n); v0 += b.x; v1 += b.y; }
                        if (relu) { v0 = fmaxf(v0, 0.f); v1 = fmaxf(v1, 0.f); }
                        if (residual) { const float2 r = *reinterpret_cast<const float2*>(residual + at); v0 += r.x; v1 += r.y; }
                        if (out_f32) *reinterpret_cast<float2*>((float*)out + at) = make_float2(v0, v1);
                        else *reinterpret_cast<__nv_bfloat162*>((__nv_bfloat16*)out + at) = __floats2bfloat162_rn(v0, v1);
                        continue;
                    }
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        if (n + e >= N) continue;
                        float v = e ? v1 : v0;
                        if (bias) v += bias[n + e];
                        if (relu) v = fmaxf(v, 0.f);
                        if (residual) v += residual[at + e];
                        if (out_f32) ((float*)out)[at + e] = v;
                        else ((__nv_bfloat16*)out)[at + e] = float_to_bf16(v);
                    }
                }
        return;
    }

#if WARPS_N == 1  // a row of the tile lives in the 4 lanes of one quad: statistics and top-k from the registers
    if (epilogue == EPILOGUE_STAT) {
        const int stat_parts = CEIL_DIV(N, PART);
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int half = 0; half < 2; ++half)
#pragma unroll
                for (int sub = 0; sub < BN / PART; ++sub) {
                    const int m = block_m + warp_m * WM + i * 16 + (lane >> 2) + half * 8;
                    if (block_n + sub * PART >= N) continue;  // the same for the whole warp
                    const float best = quad_row_max(acc, i, half, sub * (PART / 8), (sub + 1) * (PART / 8), block_n, N, lane);
                    float sum = 0.f;
#pragma unroll
                    for (int j = sub * (PART / 8); j < (sub + 1) * (PART / 8); ++j)
#pragma unroll
                        for (int e = 0; e < 2; ++e)
                            if (block_n + j * 8 + (lane & 3) * 2 + e < N) sum += __expf(acc[i][j][half * 2 + e] - best);
                    sum += __shfl_xor_sync(0xffffffff, sum, 1);
                    sum += __shfl_xor_sync(0xffffffff, sum, 2);
                    const size_t slot = (size_t)m * stat_parts + (block_n / PART + sub);
                    if ((lane & 3) == 0 && m < M) part_stat[2 * slot] = best, part_stat[2 * slot + 1] = sum;
                }
        return;
    }
    if (epilogue == EPILOGUE_TOPK) {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int m = block_m + warp_m * WM + i * 16 + (lane >> 2) + half * 8;
                const size_t slot = (size_t)m * parts + part;
                const float best = quad_row_max(acc, i, half, 0, NT, block_n, N, lane);
                // a row takes part when its max reaches its threshold; the shuffles below need the whole warp
                const float floor = m >= M ? POS_INF : thresh ? thresh[m] : NEG_INF;
                const bool wanted = best >= floor;
                if (!__any_sync(0xffffffff, wanted)) continue;
                float top[TOPK];
                int at[TOPK];
#pragma unroll
                for (int r = 0; r < TOPK; ++r) top[r] = NEG_INF, at[r] = 0x7fffffff;
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int n = block_n + j * 8 + (lane & 3) * 2 + e;
                        const float v = acc[i][j][half * 2 + e];
                        if (n < N && v >= floor) topk_insert(top, at, v, n);
                    }
                merge_topk_lanes<4>(top, at);
                if ((lane & 3) == 0 && wanted) {
#pragma unroll
                    for (int r = 0; r < TOPK; ++r) part_val[slot * TOPK + r] = top[r], part_idx[slot * TOPK + r] = at[r];
                }
            }
        return;
    }
#elif BM * BN * 4 <= EPI_SMEM_BYTES  // tiles whose logits fit in the freed stages
    if (epilogue == EPILOGUE_STAT || epilogue == EPILOGUE_TOPK) {
        // Stage the tile's logits in shared memory (the stages are free once every warp is done), then one
        // warp per row.
        float* tile = reinterpret_cast<float*>(stage_smem);
        const int warp = tid >> 5;
        EPI_SYNC();
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = warp_m * WM + i * 16 + (lane >> 2) + (e >> 1) * 8;
                    const int col = warp_n * WN + j * 8 + (lane & 3) * 2 + (e & 1);
                    tile[row * BN + col] = block_n + col < N ? acc[i][j][e] : NEG_INF;
                }
        EPI_SYNC();
        for (int row = warp; row < BM; row += EPI_THREADS / 32) {
            const int m = block_m + row;
            if (m >= M) continue;
            float* values = tile + row * BN;
            float best = NEG_INF;
            for (int c = lane; c < BN; c += 32) best = fmaxf(best, values[c]);
            best = warp_max(best);
            const size_t slot = (size_t)m * parts + part;
            if (epilogue == EPILOGUE_STAT) {
                float sum = 0.f;
                for (int c = lane; c < BN; c += 32) sum += values[c] == NEG_INF ? 0.f : __expf(values[c] - best);
                sum = warp_sum(sum);
                if (lane == 0) { part_stat[2 * slot] = best; part_stat[2 * slot + 1] = sum; }
                continue;
            }
            if (thresh && best < thresh[m]) continue;  // no logit of this row here reaches its threshold
            for (int r = 0; r < TOPK; ++r) {  // TOPK rounds of a warp argmax, each taking its winner out
                float v = NEG_INF;
                int at = 0x7fffffff;
                for (int c = lane; c < BN; c += 32)
                    if (beats(values[c], block_n + c, v, at)) { v = values[c]; at = block_n + c; }
#pragma unroll
                for (int offset = 16; offset > 0; offset >>= 1) {
                    const float ov = __shfl_xor_sync(0xffffffff, v, offset);
                    const int oi = __shfl_xor_sync(0xffffffff, at, offset);
                    if (beats(ov, oi, v, at)) { v = ov; at = oi; }
                }
                if (lane == 0) { part_val[slot * TOPK + r] = v; part_idx[slot * TOPK + r] = at; }
                if (at != 0x7fffffff && ((at - block_n) & 31) == lane) values[at - block_n] = NEG_INF;
                __syncwarp();
            }
        }
        return;
    }
#endif

    // EPILOGUE_ARGMAX: best column per row within the thread, then the 4 lanes of a row, then the warps (where a
    // warp holds whole rows of the tile, the quad's answer is the tile's: no shared memory, no barrier).
    // ARGMAX_LSE: each lane's sum of exp(logit - the quad's best), summed over the quad; across warps, each
    // warp's sum rescaled to the tile's best.
#if WARPS_N > 1
    __shared__ float red_val[WARPS_N][BM];
    __shared__ int red_idx[WARPS_N][BM];
#ifdef ARGMAX_LSE
    __shared__ float red_sum[WARPS_N][BM];
#endif
#endif
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float best = NEG_INF;
            int at = 0x7fffffff;
#ifdef SAMPLE
            const int m = block_m + warp_m * WM + i * 16 + (lane >> 2) + half * 8;
            const unsigned row_key = m < M ? noise[m] : 0u;
#endif
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int n = block_n + warp_n * WN + j * 8 + (lane & 3) * 2 + e;
#ifdef SAMPLE  // the noise only where it could win: a logit below the best so far by GUMBEL_MAX cannot
                    const float scaled = acc[i][j][half * 2 + e] * SAMPLE_INV_TEMP;
                    const float v = n == SAMPLE_BANNED || scaled + GUMBEL_MAX < best ? NEG_INF
                                                                                     : scaled + gumbel_noise(row_key, n);
#else
                    const float v = acc[i][j][half * 2 + e];
#endif
                    if (n < N && beats(v, n, best, at)) { best = v; at = n; }
                }
#pragma unroll
            for (int offset = 1; offset < 4; offset <<= 1) {
                const float v = __shfl_xor_sync(0xffffffff, best, offset);
                const int n = __shfl_xor_sync(0xffffffff, at, offset);
                if (beats(v, n, best, at)) { best = v; at = n; }
            }
#ifdef ARGMAX_LSE
            float sum = 0.f;  // no term where the warp holds no column of the row below N (best -inf)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (block_n + warp_n * WN + j * 8 + (lane & 3) * 2 + e < N) sum += __expf(acc[i][j][half * 2 + e] - best);
            sum += __shfl_xor_sync(0xffffffff, sum, 1);
            sum += __shfl_xor_sync(0xffffffff, sum, 2);
#endif
            const int row = warp_m * WM + i * 16 + (lane >> 2) + half * 8;
#if WARPS_N == 1
            if ((lane & 3) == 0 && block_m + row < M) {
                part_val[(size_t)(block_m + row) * parts + part] = best;
                part_idx[(size_t)(block_m + row) * parts + part] = at;
#ifdef ARGMAX_LSE
                part_stat[(size_t)(block_m + row) * parts + part] = sum;
#endif
            }
#else
            if ((lane & 3) == 0) {
                red_val[warp_n][row] = best;
                red_idx[warp_n][row] = at;
#ifdef ARGMAX_LSE
                red_sum[warp_n][row] = sum;
#endif
            }
#endif
        }
#if WARPS_N > 1
    EPI_SYNC();
    for (int row = tid; row < BM; row += EPI_THREADS) {
        const int m = block_m + row;
        if (m >= M) continue;
        float best = red_val[0][row];
        int at = red_idx[0][row];
        for (int w = 1; w < WARPS_N; ++w)
            if (beats(red_val[w][row], red_idx[w][row], best, at)) { best = red_val[w][row]; at = red_idx[w][row]; }
        part_val[(size_t)m * parts + part] = best;
        part_idx[(size_t)m * parts + part] = at;
#ifdef ARGMAX_LSE
        float sum = 0.f;
        for (int w = 0; w < WARPS_N; ++w)
            if (red_val[w][row] != NEG_INF) sum += red_sum[w][row] * __expf(red_val[w][row] - best);
        part_stat[(size_t)m * parts + part] = sum;
#endif
    }
    EPI_SYNC();  // red_val, red_idx (and red_sum) are free for the next tile
#endif
}
