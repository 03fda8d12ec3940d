// rows_topk_kernel: each row's k largest log-probabilities from logits written whole, for more candidates than
// the fused lists of gemm.cu's top-k hold (engine/cuda.py's FUSED_TOPK): beam search with many beams, top-k
// sampling past 32. Radix selection, as PyTorch's topk does, never a sort of the row.
//
// Row r of x (M, V) f32: lse[r] = max + log(sum(exp(x - max))) (one pass, the running max rescaling the sum);
// its log-probabilities v = x - lse[r], in float32 as the host computes them. The k largest v, best first, ties to
// the lower index, as a stable sort of -v orders them (numerics.topk_desc): values (M, k) f32 and ids (M, k) int32.
//
// How: each v maps to a 32-bit key whose unsigned order is v's (order_key). Three passes over the row narrow the
// k-th largest key digit by digit, 11, 11 and 10 bits from the top, in a shared histogram of the keys that
// match the digits found so far (lanes adding to one bin add once, __match_any_sync: log-probs crowd a few
// exponents). Then one pass in index order lists the keys above that threshold and the lowest-index keys equal to
// it (a block-wide count of each tile keeps the order), and a bitonic sort of the k by (key, -index) orders them.
// k <= TOPK_MAX. Launch: grid (M), block 1024 threads (TOPK_THREADS).
#include "common.cuh"

#define TOPK_THREADS 1024
#define TOPK_MAX 1024
#define TOPK_BINS 2048

__device__ __forceinline__ unsigned order_key(float v) {
    const unsigned u = __float_as_uint(v == 0.f ? 0.f : v);  // -0 as +0: equal floats, equal keys
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The running (max, sum of exp(x - max)) of two parts merged.
__device__ __forceinline__ void merge_lse(float& m, float& s, float m2, float s2) {
    if (m2 == NEG_INF) return;
    if (m == NEG_INF) { m = m2; s = s2; return; }
    if (m2 > m) { s = s * expf(m - m2) + s2; m = m2; }
    else s += s2 * expf(m2 - m);
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS, 1)
rows_topk_kernel(const float* __restrict__ x, int v_len, int k, float* __restrict__ lse_out,
                 float* __restrict__ values, int* __restrict__ ids) {
    __shared__ unsigned hist[TOPK_BINS];
    __shared__ unsigned long long cand[TOPK_MAX];
    __shared__ float red_m[32], red_s[32];
    __shared__ unsigned warp_gt[32], warp_eq[32];
    __shared__ unsigned found_digit, found_above;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* row = x + (long long)blockIdx.x * v_len;

    // the row's log-sum-exp
    float m = NEG_INF, s = 0.f;
    for (int i = tid; i < v_len; i += TOPK_THREADS) {
        const float a = row[i];
        if (a > m) { s = (m == NEG_INF ? 0.f : s * expf(m - a)) + 1.f; m = a; }
        else s += expf(a - m);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffff, m, offset), s2 = __shfl_xor_sync(0xffffffff, s, offset);
        merge_lse(m, s, m2, s2);
    }
    if (lane == 0) { red_m[warp] = m; red_s[warp] = s; }
    __syncthreads();
    if (warp == 0) {
        m = red_m[lane];
        s = red_s[lane];
        for (int offset = 16; offset > 0; offset >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffff, m, offset), s2 = __shfl_xor_sync(0xffffffff, s, offset);
            merge_lse(m, s, m2, s2);
        }
        if (lane == 0) red_m[0] = m + logf(s);
    }
    __syncthreads();
    const float lse = red_m[0];
    if (tid == 0) lse_out[blockIdx.x] = lse;

    // the k-th largest key, digit by digit: `prefix` its bits found so far (under `mask`), `need` how many of the
    // keys matching them are still to be taken
    unsigned prefix = 0, mask = 0;
    int need = k;
    for (int pass = 0; pass < 3; ++pass) {
        const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0, bins = pass == 2 ? 1024 : 2048;
        for (int b = tid; b < bins; b += TOPK_THREADS) hist[b] = 0;
        __syncthreads();
        for (int base = 0; base < v_len; base += TOPK_THREADS) {
            const int i = base + tid;
            const unsigned key = i < v_len ? order_key(row[i] - lse) : 0u;
            const bool in = i < v_len && (key & mask) == prefix;
            const unsigned bin = in ? (key >> shift) & (bins - 1) : 0xffffffffu;
            const unsigned same = __match_any_sync(0xffffffff, bin);
            if (in && lane == __ffs(same) - 1) atomicAdd(&hist[bin], __popc(same));
        }
        __syncthreads();
        if (warp == 0) {  // the bin holding the need-th largest: each lane sums a run of bins, top run first
            const int per = bins / 32;
            const int top = bins - 1 - lane * per;  // this lane's run: bins top, top - 1, ..., top - per + 1
            unsigned run = 0;
            for (int j = 0; j < per; ++j) run += hist[top - j];
            unsigned before = run;  // inclusive prefix over lanes 0..lane (the runs above and this one)
            for (int offset = 1; offset < 32; offset <<= 1) {
                const unsigned up = __shfl_up_sync(0xffffffff, before, offset);
                if (lane >= offset) before += up;
            }
            const unsigned above_run = before - run;
            const bool here = above_run < (unsigned)need && before >= (unsigned)need;
            if (here) {
                unsigned above = above_run;
                int b = top;
                while (above + hist[b] < (unsigned)need) above += hist[b--];
                found_digit = b;
                found_above = above;
            }
        }
        __syncthreads();
        prefix |= found_digit << shift;
        mask |= (unsigned)(bins - 1) << shift;
        need -= found_above;
        __syncthreads();
    }

    // the keys above the threshold (k - need of them), then the `need` lowest-index keys equal to it
    const unsigned threshold = prefix;
    const int greater = k - need;
    const unsigned below_lane = (1u << lane) - 1u;
    unsigned taken_gt = 0, taken_eq = 0;
    for (int base = 0; base < v_len; base += TOPK_THREADS) {
        if (taken_gt >= (unsigned)greater && taken_eq >= (unsigned)need) break;  // the same in every thread
        const int i = base + tid;
        const unsigned key = i < v_len ? order_key(row[i] - lse) : 0u;
        const bool gt = i < v_len && key > threshold, eq = i < v_len && key == threshold;
        const unsigned bal_gt = __ballot_sync(0xffffffff, gt), bal_eq = __ballot_sync(0xffffffff, eq);
        if (lane == 0) { warp_gt[warp] = __popc(bal_gt); warp_eq[warp] = __popc(bal_eq); }
        __syncthreads();
        unsigned off_gt = 0, off_eq = 0, all_gt = 0, all_eq = 0;
        for (int w = 0; w < TOPK_THREADS / 32; ++w) {
            const unsigned g = warp_gt[w], e = warp_eq[w];
            if (w < warp) { off_gt += g; off_eq += e; }
            all_gt += g;
            all_eq += e;
        }
        if (gt) {
            const unsigned at = taken_gt + off_gt + __popc(bal_gt & below_lane);
            cand[at] = ((unsigned long long)key << 32) | (0xffffffffu - (unsigned)i);
        }
        if (eq) {
            const unsigned at = taken_eq + off_eq + __popc(bal_eq & below_lane);
            if (at < (unsigned)need) cand[greater + at] = ((unsigned long long)key << 32) | (0xffffffffu - (unsigned)i);
        }
        taken_gt += all_gt;
        taken_eq += all_eq;
        __syncthreads();
    }

    // the k best first: a bitonic sort, descending, of the next power of two, padded with the smallest
    int size = 1;
    while (size < k) size <<= 1;
    for (int j = k + tid; j < size; j += TOPK_THREADS) cand[j] = 0ull;
    __syncthreads();
    for (int block = 2; block <= size; block <<= 1) {
        for (int stride = block >> 1; stride > 0; stride >>= 1) {
            for (int j = tid; j < size; j += TOPK_THREADS) {
                const int partner = j ^ stride;
                if (partner > j) {
                    const bool descending = (j & block) == 0;
                    const unsigned long long a = cand[j], b = cand[partner];
                    if (descending ? a < b : a > b) { cand[j] = b; cand[partner] = a; }
                }
            }
            __syncthreads();
        }
    }
    for (int j = tid; j < k; j += TOPK_THREADS) {
        const int i = (int)(0xffffffffu - (unsigned)(cand[j] & 0xffffffffull));
        values[(long long)blockIdx.x * k + j] = row[i] - lse;
        ids[(long long)blockIdx.x * k + j] = i;
    }
}
