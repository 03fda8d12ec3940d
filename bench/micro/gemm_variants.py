"""GEMM kernel variants against each other and cuBLAS at the engine's shapes (a tuning aid, not the harness).

    python -m bench.micro.gemm_variants [--out results.jsonl] [--preset nllb-200-3.3B --rows 1024,2048 --no-encoder]

Each variant: a tile of kernels.GEMM_TILES, or one made here (other pipeline depths), with a bias (as every
GEMM of the model), storing as the engine does: FFN2 and attention out in f32 onto the residual in place, the others
bf16 (through the TMA unit unless the variant's name ends in " reg": stored from the registers; " bf16" after a
tile: the f32 shapes in bf16 without their residual;
" nopdl": CuPy's launches, not programmatic dependents, nllbcli/model/engine/launch.py). "auto" for a tile:
kernels.gemm_tile's pick. Timed over
10 launches back to back behind a spin kernel (bench/micro/engine_bench.py's timed: the GPU's time alone, no launch
latency). "default": the tile kernels.gemm_tile picks, as the engine runs it. Shapes: the encoder's (35,840
packed source rows, the 600M shape's) and each decode GEMM of the preset's widths (--preset: d_model, the FFN's;
"cross query" is the d x d product with a bf16 output, "attention out" the one onto the residual) at 64, 256,
1,024 and 4,096 rows. cuBLAS (`cupy.matmul`): bf16 out, no bias; "cublas+epilogue": the same product followed by
one elementwise kernel doing what ours fuses (bias, ReLU for FFN1, the add onto the f32 residual for FFN2 and
attention out), the cheapest way to the layer's result through cuBLAS from CuPy; "cublas f32+residual" (the f32
shapes): cublasGemmEx adding onto the f32 residual in place (beta 1; no bias), cuBLAS's own fused way.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from functools import lru_cache
from pathlib import Path

import cupy as cp
import numpy as np

from bench.micro.engine_bench import GEMM_SHAPES, timed
from nllbcli.model.engine import kernels, launch
from nllbcli.model.shapes import DEFAULT, PRESETS

EXTRA_TILES = {
    "wg64n": dict(kind="sm90", BN=64, CONSUMERS=1, STAGES=8),  # 64 x 64, one k-step a stage: more tiles for few rows
    "wg256s3": dict(kind="sm90", BN=256, CONSUMERS=2, STAGES=3),  # the stages wg256 kept beside whole TMA_STORE buffers
    # few rows, long K (FFN2 at 64 rows): fewer blocks each reading the whole of A, more bytes a stage (neither
    # faster than wg64n8k4)
    "wg64n16k4": dict(kind="sm90", BN=16, CONSUMERS=1, STAGES=5, KSTEPS=4),
    "wg64n16k8": dict(kind="sm90", BN=16, CONSUMERS=1, STAGES=2, KSTEPS=8),
    # the TMA store epilogue's ways (kernels.STORE_OPTIONS, by default all three): 3-D copies of a chunk's boxes
    # (o3), copies in 2 or 4 chunks (c2, c4), stmatrix for bf16 (st); "wg256e0": none of them
    "wg256e0": dict(kind="sm90", BN=256, CONSUMERS=2, STAGES=4, OUT_3D=0, EPI_CHUNKS=1, STMATRIX=0),
    "wg256o3": dict(kind="sm90", BN=256, CONSUMERS=2, STAGES=4, OUT_3D=1, EPI_CHUNKS=1, STMATRIX=0),
    "wg256o3c2": dict(kind="sm90", BN=256, CONSUMERS=2, STAGES=4, OUT_3D=1, EPI_CHUNKS=2, STMATRIX=0),
    "wg256st": dict(kind="sm90", BN=256, CONSUMERS=2, STAGES=4, OUT_3D=1, EPI_CHUNKS=1, STMATRIX=1),
    "wg256stc2": dict(kind="sm90", BN=256, CONSUMERS=2, STAGES=4, OUT_3D=1, EPI_CHUNKS=2, STMATRIX=1),
}
_EPILOGUES = r"""
#include <cuda_bf16.h>
extern "C" __global__ void bias_relu(const __nv_bfloat16* y, const float* bias, __nv_bfloat16* out, long long total,
                                     int n, int relu) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        float v = __bfloat162float(y[i]) + bias[i % n];
        out[i] = __float2bfloat16_rn(relu && v < 0.f ? 0.f : v);
    }
}
extern "C" __global__ void onto_residual(const __nv_bfloat16* y, const float* bias, float* out, long long total, int n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x)
        out[i] += __bfloat162float(y[i]) + bias[i % n];
}
"""


@lru_cache(maxsize=None)
def cublas_library():
    """libcublas as CuPy loaded it (ctypes finds a loaded library by its soname), or None."""
    cp.matmul(cp.ones((8, 8), "bfloat16"), cp.ones((8, 8), "bfloat16"))  # loaded by now
    for name in ("libcublas.so.13", "libcublas.so.12"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def cublas_onto_residual(a, w, out) -> None:
    """out += a @ w.T by cublasGemmEx with beta 1: bf16 operands, the f32 residual as C and D, f32 accumulation
    (no bias: cuBLAS's own way to our f32 GEMMs onto the residual, as near as it comes)."""
    lib = cublas_library()
    m, k = a.shape
    n = w.shape[0]
    one = np.ones(1, np.float32)
    OP_N, OP_T, R_16BF, R_32F, COMPUTE_32F, ALGO_DEFAULT = 0, 1, 14, 0, 68, -1
    p = ctypes.c_void_p
    handle = p(cp.cuda.device.get_cublas_handle())
    lib.cublasSetStream_v2(handle, p(cp.cuda.get_current_stream().ptr))
    rc = lib.cublasGemmEx(handle, OP_T, OP_N, n, m, k, p(one.ctypes.data),
                          p(w.data.ptr), R_16BF, k, p(a.data.ptr), R_16BF, k, p(one.ctypes.data), p(out.data.ptr),
                          R_32F, n, COMPUTE_32F, ALGO_DEFAULT)
    if rc:
        raise RuntimeError(f"cublasGemmEx: status {rc}")


@lru_cache(maxsize=None)
def epilogue_kernel(name: str):
    return cp.RawModule(code=_EPILOGUES, options=("-std=c++17",)).get_function(name)


def epilogue(name: str, y, bias, out, *extra) -> None:
    """One elementwise pass after cuBLAS: what our GEMM's epilogue does inside it."""
    epilogue_kernel(name)((132 * 8,), (256,), (y, bias, out, np.int64(y.size), np.int32(y.shape[1])) + extra)


VARIANTS = ["wg256", "wg192", "wg128", "wg128k2", "wg64", "wg64k2", "wg64n", "wg64nk4", "wg64n32k4", "wg64n8k4"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--variants", help="comma-separated tiles (default: VARIANTS)")
    parser.add_argument("--rows", default="64,256,1024,4096", help="decode rows, comma-separated")
    parser.add_argument("--no-encoder", action="store_true", help="leave out the encoder's shapes")
    parser.add_argument("--no-logits", action="store_true", help="leave out the output projection's argmax passes")
    parser.add_argument("--preset", default=DEFAULT, choices=sorted(PRESETS), help="the decode shapes' widths")
    args = parser.parse_args()
    with cp.cuda.Stream(non_blocking=True):  # a stream of its own (programmatic launches want one)
        return measure(args)


def measure(args) -> int:
    variants = args.variants.split(",") if args.variants else VARIANTS
    kernels.GEMM_TILES.update(EXTRA_TILES)
    rng = cp.random.default_rng(0)
    lines = []
    config = PRESETS[args.preset].config
    d, ffn = config.d_model, config.decoder_ffn_dim
    shapes = [s for s in GEMM_SHAPES if s[3].startswith("encoder") and not args.no_encoder] + [
        (m, k, n, f"decode {what}, {m:,} rows") for m in map(int, args.rows.split(","))
        for k, n, what in ((d, 3 * d, "QKV"), (d, d, "attention out"), (d, d, "cross query"), (d, ffn, "FFN1"), (ffn, d, "FFN2"))]
    for m, k, n, what in shapes:
        a = rng.standard_normal((m, k), dtype=cp.float32).astype("bfloat16")
        w = rng.standard_normal((n, k), dtype=cp.float32).astype("bfloat16")
        bias = rng.standard_normal(n, dtype=cp.float32)
        f32 = "FFN2" in what or "attention out" in what  # onto the residual stream
        out = rng.standard_normal((m, n), dtype=cp.float32) if f32 else cp.empty((m, n), dtype="bfloat16")
        residual = out if f32 else None  # in place, as the engine adds onto its residual stream
        out16 = cp.empty((m, n), dtype="bfloat16")
        flops = 2 * m * n * k
        wt = w.T
        relu = "FFN1" in what

        def cublas_layer():
            y = cp.matmul(a, wt)
            if f32:
                epilogue("onto_residual", y, bias, out)
            else:
                epilogue("bias_relu", y, bias, out, np.int32(relu))

        row = {"what": what, "shape": [m, k, n], "out": "f32+residual" if f32 else "bf16",
               "cublas": flops / timed(lambda: cp.matmul(a, wt), inner=10) / 1e12,
               "cublas+epilogue": flops / timed(cublas_layer, inner=10) / 1e12,
               "default": flops / timed(lambda: kernels.gemm(a, w, bias, residual, relu=relu, out=out), inner=10) / 1e12}
        if f32 and cublas_library() is not None:  # cuBLAS adding onto the f32 residual itself (beta 1), no bias
            check = out.copy()
            cublas_onto_residual(a, w, check)
            want = out + cp.matmul(a.astype(cp.float32), wt.astype(cp.float32))
            assert float(cp.abs(check - want).max()) < 1e-2 * float(cp.abs(want).max()), "cublasGemmEx: wrong sums"
            row["cublas f32+residual"] = flops / timed(lambda: cublas_onto_residual(a, w, out), inner=10) / 1e12
        for variant in variants:
            tile, how = (variant.split() + [""])[:2]
            if how == "bf16" and not f32:
                continue
            if tile == "auto":  # the engine's pick
                tile = kernels.gemm_tile(m, n, k)
            kernels.TMA_STORE = how != "reg"
            # "bf16": the f32 shapes stored as bf16 without their residual (cuBLAS's output);
            # "nopdl": CuPy's launches, not programmatic dependents (launch.py), each one's set-up after the last
            o, r = (out16, None) if how == "bf16" else (out, residual)
            launch.ENABLED = how != "nopdl"
            seconds = timed(lambda: kernels.gemm_launch(tile, a, w, epilogue=kernels.EPILOGUE_STORE, bias=bias, residual=r,
                                                        out=o, out_f32=o.dtype == kernels.F32), inner=10)
            launch.ENABLED = True
            row[variant] = flops / seconds / 1e12
        kernels.TMA_STORE = True
        lines.append(json.dumps({key: round(v, 1) if isinstance(v, float) else v for key, v in row.items()}))
        print(lines[-1], flush=True)
    for m in () if args.no_logits else (16, 64, 256, 4096):  # the output projection's GEMM with its argmax epilogue
        h = rng.standard_normal((m, d), dtype=cp.float32).astype("bfloat16")
        w = (rng.standard_normal((config.vocab_size, d), dtype=cp.float32) * 0.02).astype("bfloat16")
        row = {"what": f"logits argmax pass {m} rows"}
        for tile in ("wg256", "wg64w") if m <= 256 else ("wg256",):
            parts = -(-config.vocab_size // kernels.GEMM_TILES[tile]["BN"])
            pv, pi = cp.empty((m, parts), cp.float32), cp.empty((m, parts), cp.int32)
            seconds = timed(lambda: kernels.gemm_launch(tile, h, w, epilogue=kernels.EPILOGUE_ARGMAX, part_val=pv,
                                                        part_idx=pi), repeat=10, inner=5)
            row[tile + " ms"], row[tile + " TB/s"] = seconds * 1e3, w.nbytes / seconds / 1e12
        lines.append(json.dumps(row))
        print(lines[-1], flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
