"""How long a chain of dependent wgmma instructions takes on this GPU, by the width of the instruction.

    python bench/wgmma_latency.py

Every output of our GEMMs sums its K products 16 at a time in increasing k (the same bits at every tile and
batch size), so a tile's k-steps are a chain: each wgmma waits for the accumulators of the one before. With few
rows the chain's length, not the count of tiles, sets a GEMM's time (docs/PERF.md, sixth session). This times,
with the SM's clock, R steps of m64nNk16 (bf16 in shared memory, f32 accumulators) for N = 8 .. 256:
- "chain": groups of 4 instructions on one accumulator set, each group committed and waited for before the next,
  as the GEMM's main loop at its slowest;
- "pipelined": the same with the wait for the group before (wait_group 1), as the main loop runs;
- "2 chains": two warpgroups of one block, each its own chain: does a second chain hide the first's latency?
Prints clocks per instruction and the tensor rate it makes (FLOP per clock per SM).
"""

from __future__ import annotations

import sys

import cupy as cp
import numpy as np

R = 256  # instructions a chain


def wgmma_source(n: int) -> str:
    regs = n // 2  # f32 accumulators a thread: 64 x n over 128 threads
    ops = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    return f"""
__device__ __forceinline__ void wgmma{n}(float* d, unsigned long long da, unsigned long long db) {{
    asm volatile("{{\\nwgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{ops}}}, %{regs}, %{regs + 1}, 1, 1, 1, 0, 0;\\n}}\\n"
                 : {outs} : "l"(da), "l"(db));
}}
extern "C" __global__ void __launch_bounds__(256, 1) chain{n}(long long* clocks, float* sink, int pipelined) {{
    __shared__ __align__(1024) unsigned char smem[64 * 128 + 256 * 128];
    for (int i = threadIdx.x; i < (64 + 256) * 128 / 4; i += blockDim.x) reinterpret_cast<unsigned*>(smem)[i] = 0x3c003c00u * (i & 1);
    asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");
    __syncthreads();
    float d[{regs}];
    for (int i = 0; i < {regs}; ++i) d[i] = 0.f;
    const unsigned long long da = desc(smem), db = desc(smem + 64 * 128);
    long long start = clock64();
    for (int g = 0; g < {R} / 4; ++g) {{
        asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
#pragma unroll
        for (int k = 0; k < 4; ++k) wgmma{n}(d, da + 2 * k, db + 2 * k);
        asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
        if (pipelined) asm volatile("wgmma.wait_group.sync.aligned 1;\\n" ::: "memory");
        else asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
    }}
    asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
    long long stop = clock64();
    float s = 0.f;
    for (int i = 0; i < {regs}; ++i) s += d[i];
    sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x % 128 == 0) clocks[blockIdx.x * 2 + threadIdx.x / 128] = stop - start;
}}
"""


HEADER = r"""
__device__ __forceinline__ unsigned long long desc(const void* p) {
    const unsigned long long addr = (unsigned)__cvta_generic_to_shared(p);
    return ((addr & 0x3FFFF) >> 4) | ((16ull >> 4) << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}
"""


def main() -> int:
    widths = (8, 16, 32, 64, 128, 256)
    module = cp.RawModule(code=HEADER + "".join(wgmma_source(n) for n in widths), options=("-std=c++17", "-arch=sm_90a"))
    sink = cp.zeros(132 * 256, dtype=cp.float32)
    print(f"{'N':>4} {'mode':>10} {'clk/instr':>10} {'FLOP/clk/SM':>12}")
    for n in widths:
        kernel = module.get_function(f"chain{n}")
        for mode, threads, pipelined in (("chain", 128, 0), ("pipelined", 128, 1), ("2 chains", 256, 1)):
            clocks = cp.zeros(132 * 2, dtype=cp.int64)
            for _ in range(2):  # the first launch warms up
                kernel((132,), (threads,), (clocks, sink, np.int32(pipelined)))
            cp.cuda.Device().synchronize()
            per = float(clocks.get()[0]) / R
            chains = threads // 128
            print(f"{n:>4} {mode:>10} {per:>10.1f} {2 * 64 * n * 16 * chains / per:>12.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
