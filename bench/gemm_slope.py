"""A GEMM's time against K at a fixed number of tiles: the slope is a block's time a k-step, the intercept the
fixed cost (launch, first loads, epilogue). A tuning aid, not the harness.

    python bench/gemm_slope.py [--tiles wg256,wg256s4r] [--ks 512,1024,2048,4096,8192] [--out slope.jsonl]

Grids: one tile (M = the tile's rows, N = its columns: a block alone, no other block contending for L2) and 128
tiles of 128 x 256 (M = 4,096, N = 1,024: the decode's attention out at 4,096 rows, a block an SM). bf16 out
with a bias (the TMA store where the tile has it); cuBLAS (`cupy.matmul`, bf16, no bias) beside. A line a
(grid, K), microseconds (bench/engine_bench.py's timed, 10 calls back to back), then a line a grid with each
variant's least-squares slope (us a 64-column k-step) and intercept (us).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.engine_bench import timed  # noqa: E402
from bench.gemm_variants import EXTRA_TILES as VARIANT_TILES  # noqa: E402
from nllbcli.engine import kernels  # noqa: E402

EXTRA_TILES = {
    # a name ending in "r": timed with register stores (no staging buffer: the stages keep its shared memory)
    "wg256s4r": dict(kind="sm90", BN=256, CONSUMERS=2, STAGES=4),
    "wg256s2r": dict(kind="sm90", BN=256, CONSUMERS=2, STAGES=2),
    # (prefetching the tensor maps, and waiting for the last copies' reads only: no change, PERF.md ninth session)
    "wg256skip": dict(kind="sm90", BN=256, CONSUMERS=2, STAGES=4, EPI_SKIP=1),  # no epilogue
    "wg256smem": dict(kind="sm90", BN=256, CONSUMERS=2, STAGES=4, EPI_SKIP=2),  # into shared memory, not stored
    "wg256tma": dict(kind="sm90", BN=256, CONSUMERS=2, STAGES=4, EPI_SKIP=3),  # stored, shared memory not written
    "wg256k2r": dict(kind="sm90", BN=256, CONSUMERS=2, STAGES=2, KSTEPS=2),  # 2 stages of 2 k-steps (register stores)
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiles", default="wg256,wg256s4r,wg256s2r,wg256k2r,wg128")
    parser.add_argument("--ks", default="512,1024,2048,4096,8192")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    kernels.GEMM_TILES.update(VARIANT_TILES)
    kernels.GEMM_TILES.update(EXTRA_TILES)
    tiles = args.tiles.split(",")
    ks = [int(k) for k in args.ks.split(",")]
    rng = cp.random.default_rng(0)
    empty = cp.RawKernel('extern "C" __global__ void empty() {}', "empty")
    lines = []
    for grid, (m, n) in (("one tile", (0, 0)), ("128 tiles", (4096, 1024))):
        times: dict[str, list[float]] = {t: [] for t in tiles + ["cublas", "empty"]}
        for k in ks:
            row = {"grid": grid, "K": k}
            for tile in tiles + ["cublas", "empty"]:
                mm, nn = (m, n) if m else (128 if tile in ("cublas", "empty") else kernels.tile_rows(tile),
                                           256 if tile in ("cublas", "empty") else kernels.GEMM_TILES[tile]["BN"])
                a = rng.standard_normal((mm, k), dtype=cp.float32).astype("bfloat16")
                w = rng.standard_normal((nn, k), dtype=cp.float32).astype("bfloat16")
                bias = rng.standard_normal(nn, dtype=cp.float32)
                out = cp.empty((mm, nn), dtype="bfloat16")
                if tile == "empty":  # a kernel of one block doing nothing: the launches' own cost
                    fn = lambda: empty((1,), (32,), ())  # noqa: E731
                elif tile == "cublas":
                    wt = w.T
                    fn = lambda: cp.matmul(a, wt)  # noqa: E731
                else:
                    kernels.TMA_STORE = not tile.endswith("r")
                    fn = lambda: kernels.gemm_launch(tile, a, w, bias, None, out, None, None, None,  # noqa: E731
                                                     kernels.EPILOGUE_STORE)
                us = timed(fn, inner=10) * 1e6
                kernels.TMA_STORE = True
                times[tile].append(us)
                row[tile] = round(us, 2)
            lines.append(json.dumps(row))
            print(lines[-1], flush=True)
        fit = {"grid": grid, "fit": "us a k-step, intercept us"}
        for tile, us in times.items():
            slope, intercept = np.polyfit(np.array(ks) / 64, np.array(us), 1)
            fit[tile] = [round(float(slope), 4), round(float(intercept), 2)]
        lines.append(json.dumps(fit))
        print(lines[-1], flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
