// step_prep_kernel: a decoder step's per-row bookkeeping, done on the device so that a step captured in a CUDA
// graph needs nothing from the host: the same launch serves every step.
//
// Row i feeds tokens[i] at its position t = min(row_t[i], cache_rows - 1) (the clamp only keeps padding rows,
// which run on past their end, inside their slot): its embedding position (the padding index for a padding
// token, as M2M-100 numbers positions), the cache row where it writes its K/V (slot_base[i] + t, slot_base
// being the slot's first row), that row entered in its table at position t, the number of keys it attends to
// (t + 1); then row_t[i] = t + 1 for the next step.
//
// tokens, row_t, slot_base, pos, new_rows, self_len (N,) int32; table (N, ld_table) int32.
// Launch: grid (ceil(N / 256)), block 256 threads.
extern "C" __global__ void step_prep_kernel(const int* __restrict__ tokens, int* __restrict__ row_t,
                                            const int* __restrict__ slot_base, int* __restrict__ table, int ld_table,
                                            int* __restrict__ pos, int* __restrict__ new_rows,
                                            int* __restrict__ self_len, int n, int cache_rows, int pad) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int t = min(row_t[i], cache_rows - 1);
    const int row = slot_base[i] + t;
    pos[i] = tokens[i] == pad ? pad : t + pad + 1;
    new_rows[i] = row;
    table[(long long)i * ld_table + t] = row;
    self_len[i] = t + 1;
    row_t[i] = t + 1;
}

// sample_keys_kernel: each row's random stream key at this step, for sampling's noise (gemm_epilogue.cuh's
// gumbel_noise): noise[i] = mix32(key[i] + (self_len[i] - 2) * 0x9E3779B9), the step being the token's index
// after the language token (self_len, step_prep_kernel's, counts the decoder start and the language token).
// nllbcli/engine/numerics.py's step_keys. key, self_len, noise (N,) 32-bit. Launch: grid (ceil(N / 256)),
// block 256 threads.
extern "C" __global__ void sample_keys_kernel(const unsigned* __restrict__ key, const int* __restrict__ self_len,
                                              unsigned* __restrict__ noise, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned x = key[i] + (unsigned)(self_len[i] - 2) * 0x9E3779B9u;
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    noise[i] = x ^ (x >> 16);
}
