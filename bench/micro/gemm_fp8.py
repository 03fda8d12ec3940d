"""FP8 (E4M3) matrix products against bf16 at a decoder step's and the encoder's shapes, every wgmma tile: GPU
microseconds (median of 20, bench.micro.engine_bench.timed) of kernels.gemm and kernels.gemm_fp8 side by side,
the default tile of each, and what quantizing the input a row at a time costs (kernels.quantize_rows). --cublas
adds cuBLAS's products at the same shapes through PyTorch as the yardstick (not the same epilogue: bf16 output,
no bias): torch.mm of bf16, and torch._scaled_mm of E4M3 with a scale a row of A and a column of W^T (fast
accumulation), the FP8 recipe that gemm_fp8 computes.

    python -m bench.micro.gemm_fp8 [--rows 4096,1024] [--cublas]   # Hopper only; a minute with the kernels compiled
"""

from __future__ import annotations

import argparse
import json
import sys

import cupy as cp

from bench.micro.engine_bench import timed
from nllbcli.model.engine import kernels

# (N, K, what the product's output is): the 600M shape's q/k/v, out_proj, fc1, fc2 and the encoder's cross K/V
SHAPES = ((1024, 1024, "residual"), (3072, 1024, "bf16"), (4096, 1024, "relu"), (1024, 4096, "residual"),
          (24576, 1024, "bf16"))


def cublas_us(m: int, n: int, k: int) -> dict:
    """cuBLAS's (M, K) x (K, N) product through PyTorch, bf16 and E4M3 with row-wise scales: GPU microseconds."""
    import torch

    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
    a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    a_scale, w_scale = torch.ones(m, 1, device="cuda"), torch.ones(1, n, device="cuda")
    fp8 = lambda: torch._scaled_mm(a8, w8.t(), a_scale, w_scale, out_dtype=torch.bfloat16, use_fast_accum=True)
    return {"bf16_us": round(timed(lambda: torch.mm(a, w.t())) * 1e6, 1), "fp8_us": round(timed(fp8) * 1e6, 1)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="4096,1024")
    parser.add_argument("--cublas", action="store_true", help="cuBLAS's bf16 and FP8 products beside (PyTorch)")
    args = parser.parse_args()
    if not kernels.wgmma_available():
        raise SystemExit("FP8 products need a Hopper GPU (sm_90)")
    rng = cp.random.default_rng(0)
    for m in map(int, args.rows.split(",")):
        for n, k, kind in SHAPES:
            a = rng.standard_normal((m, k), dtype=cp.float32).astype("bfloat16")
            w = (rng.standard_normal((n, k), dtype=cp.float32) * 0.02).astype("bfloat16")
            bias, residual, out = cp.zeros(n, cp.float32), cp.zeros((m, n), cp.float32), cp.empty((m, n), "bfloat16")
            a_codes, a_scales = kernels.quantize_rows(a)
            w_codes, w_scales = kernels.quantize_rows(w)
            row = {"m": m, "n": n, "k": k, "out": kind, "default_bf16": kernels.gemm_tile(m, n, k),
                   "default_fp8": kernels.gemm_tile(m, n, max(k // 2, 1))}
            for tile in [t for t in kernels.available_tiles() if kernels.GEMM_TILES[t]["kind"] == "sm90"]:
                where = {"residual": residual, "out": residual} if kind == "residual" else {"out": out, "relu": kind == "relu"}
                bf16 = timed(lambda: kernels.gemm(a, w, bias, tile=tile, **where))
                fp8 = timed(lambda: kernels.gemm_fp8(a_codes, a_scales, w_codes, w_scales, bias, tile=tile, **where))
                row[tile] = {"bf16_us": round(bf16 * 1e6, 1), "fp8_us": round(fp8 * 1e6, 1)}
            row["quantize_us"] = round(timed(lambda: kernels.quantize_rows(a, a_codes, a_scales)) * 1e6, 1)
            if args.cublas:
                row["cublas"] = cublas_us(m, n, k)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
