"""One GEMM shape, ours (the default tile, or --tile) and cuBLAS's, launched a few times for Nsight Compute.

    ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
        -k regex:'gemm_sm90|nvjet|sm90_xmma' --launch-skip 2 python3 -m bench.micro.ncu_gemm --shape 4096,1024,4096

--shape M,K,N (default: decode FFN1 at 4,096 rows); with a bias, and for K = 4,096 (FFN2) f32 out onto a
residual in place, as the engine runs them. cuBLAS's kernel name gives its tile, stages and cluster shape (the
docs/history/PERF-log.md's sixth session). The first two launches of each (warm-up) are there for --launch-skip.
"""

from __future__ import annotations

import argparse
import sys

import cupy as cp

from nllbcli.model.engine import kernels


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="4096,1024,4096", help="M,K,N")
    parser.add_argument("--tile", help="a tile of kernels.GEMM_TILES (default: kernels.gemm_tile's pick)")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--residual", action="store_true", help="f32 onto a residual whatever K (attention out)")
    args = parser.parse_args()
    m, k, n = map(int, args.shape.split(","))
    rng = cp.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=cp.float32).astype("bfloat16")
    w = rng.standard_normal((n, k), dtype=cp.float32).astype("bfloat16")
    bias = rng.standard_normal(n, dtype=cp.float32)
    onto_residual = k > 1024 or args.residual
    out = rng.standard_normal((m, n), dtype=cp.float32) if onto_residual else cp.empty((m, n), dtype="bfloat16")
    tile = args.tile or kernels.gemm_tile(m, n, k)
    print(f"{m} x {k} x {n}: ours on {tile}, {'f32 onto the residual' if onto_residual else 'bf16 out'}", flush=True)
    for _ in range(args.runs):
        kernels.gemm(a, w, bias, out if onto_residual else None, out=out, tile=tile)
    for _ in range(args.runs):
        cp.matmul(a, w.T)
    cp.cuda.Device().synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
