"""How fast one SM's TMA unit fills shared memory, by box shape, pipeline depth and blocks: the loads of our
GEMM's main loop with no products.

    python bench/tma_throughput.py

Each block (one producer thread, one consumer warp) streams K-steps of an A box (64 columns x BM rows) and a W
box (64 x BN rows) through STAGES stages with a full and an empty barrier each, as gemm_sm90_kernel does; the
consumer only waits for each stage and hands it back. The data (8 MB each of A and W) stays in L2 across the
repetitions. Prints GB/s an SM and in all, for 1 and 132 blocks. "k-steps": the 64-column steps a stage holds, loaded by
that many 2-D boxes an operand, or by one 3-D box (the array seen as K / 64 slices of rows x 64). If one SM's rate is low however deep the
pipeline, a GEMM of few rows (few blocks) cannot go faster than that rate whatever its tile.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nllbcli.engine import kernels  # noqa: E402

SOURCE = r"""
struct __align__(64) TensorMap { unsigned long long bits[16]; };
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    asm volatile("{\n.reg .pred done;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@!done bra WAIT;\n}\n"
                 ::"r"(smem_addr(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_expect_bytes(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, int x, int y, unsigned long long* bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(smem_addr(dst)), "l"((unsigned long long)map), "r"(x), "r"(y), "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void tma_load3(void* dst, const TensorMap* map, int x, int y, int z, unsigned long long* bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(smem_addr(dst)), "l"((unsigned long long)map), "r"(x), "r"(y), "r"(z), "r"(smem_addr(bar)) : "memory");
}
extern "C" __global__ void __launch_bounds__(64, 1)
stream(const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_w, int steps, int k_tiles,
       int rows_a, int rows_w) {
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) unsigned long long full[STAGES], empty[STAGES];
    unsigned char* base = smem + ((1024 - (smem_addr(smem) & 1023)) & 1023);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) { mbar_init(&full[s], 1); mbar_init(&empty[s], 1); }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int it = 0; it < steps; ++it) {
            const int s = it % STAGES, kt = it % (k_tiles / KS), tile = it / (k_tiles / KS) + blockIdx.x;
            if (it >= STAGES) mbar_wait(&empty[s], ((it / STAGES) - 1) & 1);
            unsigned char* stage = base + s * (BM + BN) * 128 * KS;
            mbar_expect_bytes(&full[s], (BM + BN) * 128 * KS);
#if DIM3
            tma_load3(stage, &map_a, 0, (tile * BM) % rows_a, kt * KS, &full[s]);
            tma_load3(stage + BM * 128 * KS, &map_w, 0, (tile * BN) % rows_w, kt * KS, &full[s]);
#else
            for (int ks = 0; ks < KS; ++ks) {
                tma_load(stage + ks * BM * 128, &map_a, (kt * KS + ks) * 64, (tile * BM) % rows_a, &full[s]);
                tma_load(stage + BM * 128 * KS + ks * BN * 128, &map_w, (kt * KS + ks) * 64, (tile * BN) % rows_w, &full[s]);
            }
#endif
        }
    } else if (threadIdx.x == 32) {
        for (int it = 0; it < steps; ++it) {
            const int s = it % STAGES;
            mbar_wait(&full[s], (it / STAGES) & 1);
            mbar_arrive(&empty[s]);
        }
    }
}
"""


def tensor_map3(a: cp.ndarray, box_rows: int, box_steps: int):
    """a (rows, K) bf16 seen as (K / 64, rows, 64): a box of box_steps k-steps of 64 x box_rows, one after another
    in shared memory, each laid out as tensor_map's box (128-byte swizzle)."""
    import ctypes
    rows, cols = a.shape
    raw = np.zeros(kernels.TENSOR_MAP.itemsize + 64, np.uint8)
    offset = -raw.ctypes.data % 64
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    rc = kernels._encode_tiled()(raw.ctypes.data + offset, 9, 3, a.data.ptr, (u64 * 3)(64, rows, cols // 64),
                                 (u64 * 2)(a.strides[0], 128), (u32 * 3)(64, box_rows, box_steps), (u32 * 3)(1, 1, 1),
                                 0, 3, 2, 0)
    if rc:
        raise RuntimeError(f"cuTensorMapEncodeTiled (3-D) failed: {rc}")
    return raw[offset:offset + kernels.TENSOR_MAP.itemsize].view(kernels.TENSOR_MAP)[0]


def main() -> int:
    k = 1024
    a = cp.ones((4096, k), dtype="bfloat16")
    w = cp.ones((4096, k), dtype="bfloat16")
    steps = 2048
    print(f"{'BM':>4} {'BN':>4} {'k-steps':>8} {'stages':>6} {'blocks':>6} {'KB/step':>7} {'GB/s/SM':>8} {'GB/s':>7} "
          f"{'ns/64k':>8}")
    configs = [(bm, bn, 1, 0, stages) for bm, bn in ((64, 8), (64, 64), (64, 128), (128, 256)) for stages in (4, 8)]
    configs += [(bm, bn, ks, dim3, stages) for bm, bn in ((64, 8), (64, 64)) for ks in (2, 4) for dim3 in (0, 1)
                for stages in (4, 8)]
    for bm, bn, ks, dim3, stages in configs:
        if True:
            smem = stages * (bm + bn) * 128 * ks + 1024
            if smem > 200 * 1024:
                continue
            module = cp.RawModule(code=SOURCE, options=("-std=c++17", "-arch=sm_90a", f"-DBM={bm}", f"-DBN={bn}",
                                                         f"-DSTAGES={stages}", f"-DKS={ks}", f"-DDIM3={dim3}"))
            kernel = module.get_function("stream")
            kernel.max_dynamic_shared_size_bytes = smem
            if dim3:
                map_a, map_w = tensor_map3(a, bm, ks), tensor_map3(w, bn, ks)
            else:
                map_a, map_w = kernels.tensor_map(a, bm), kernels.tensor_map(w, bn)
            for blocks in (1, 132):
                args = (map_a, map_w, np.int32(steps), np.int32(k // 64), np.int32(4096), np.int32(4096))
                kernel((blocks,), (64,), args, shared_mem=smem)  # warm-up
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                for _ in range(5):
                    kernel((blocks,), (64,), args, shared_mem=smem)
                stop.record()
                stop.synchronize()
                seconds = cp.cuda.get_elapsed_time(start, stop) / 1e3 / 5
                step_bytes = (bm + bn) * 128 * ks
                per_sm = steps * step_bytes / seconds / 1e9
                how = f"{ks}{' 3-D' if dim3 else ''}"
                print(f"{bm:>4} {bn:>4} {how:>8} {stages:>6} {blocks:>6} {step_bytes / 1024:>7.0f} {per_sm:>8.1f} "
                      f"{per_sm * blocks:>7.0f} {seconds / steps / ks * 1e9:>8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
