"""What a fixed split of K would give FFN2 (K = 4,096 onto the f32 residual), for the issue owner's decision.

    python bench/splitk_estimate.py [--rows 64,256,1024,4096] [--out results.jsonl]

The engine sums each output over all of K in one block, so that a sentence's outputs never depend on its batch.
At 64 and 256 rows that block must take in A's rows over all of K, which bounds FFN2 below cuBLAS (which splits
K there): docs/PERF.md, tenth session. A split of K in two halves *at every size* would keep outputs independent
of the batch (the same order for every row: (first half + second half) + bias + residual) but round every FFN2
sum differently from now. This estimates its speed without writing the cluster kernel it would need: the two
halves as two of the engine's GEMMs (f32 out, no residual) running at once on two streams, each with the tile
that does best, then one elementwise kernel adding them, the bias and the residual in that order. The halves'
time is an estimate of a kernel that sums the halves in a cluster pair (which would also save the partials'
round trip through L2); the combine's is an upper bound of what that kernel's epilogue adds.

Prints a JSON line per row count: the engine's FFN2 now (TFLOP/s), the halves at once and the combine (us), the
estimate, and how far the split's outputs are from the engine's (they differ in rounding only).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.engine_bench import hold_gpu, timed  # noqa: E402
from bench.gemm_variants import EXTRA_TILES  # noqa: E402
from nllbcli.engine import kernels  # noqa: E402

N, K = 1024, 4096  # FFN2 of the 600M shape: d_model x FFN
# tiles for a half (K = 2,048): the engine's, and gemm_variants' 64 x 16
HALF_TILES = ("wg64n8k4", "wg64n16k4", "wg64n32k4", "wg64nk4", "wg64k2", "wg128k2", "wg256")
COMBINE = cp.ElementwiseKernel(
    "float32 p0, float32 p1, float32 bias, float32 residual", "float32 out",
    "float acc = p0 + p1; out = (acc + bias) + residual", "ffn2_split_combine")


def timed_pair(first, second, repeat: int = 20) -> float:
    """Median seconds of first() and second() queued at once on two streams, from one start to both ends (CUDA
    events, behind a spin kernel as engine_bench.timed)."""
    streams = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    times = []
    for i in range(repeat + 2):
        start, end, done = cp.cuda.Event(), cp.cuda.Event(), [cp.cuda.Event(), cp.cuda.Event()]
        hold_gpu(1.5e-3)
        start.record()
        for stream, fn, event in zip(streams, (first, second), done):
            stream.wait_event(start)
            with stream:
                fn()
            event.record(stream)
        for event in done:
            cp.cuda.get_current_stream().wait_event(event)
        end.record()
        end.synchronize()
        if i >= 2:
            times.append(cp.cuda.get_elapsed_time(start, end) / 1000)
    return float(np.median(times))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="64,256,1024,4096")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not kernels.wgmma_available():
        raise SystemExit("needs a Hopper GPU (the engine's wgmma GEMMs)")
    kernels.GEMM_TILES.setdefault("wg64n16k4", EXTRA_TILES["wg64n16k4"])
    rng = cp.random.default_rng(0)
    w = (rng.standard_normal((N, K), dtype=cp.float32) * 0.02).astype(kernels.BF16)
    bias = rng.standard_normal(N, dtype=cp.float32) * 0.1
    lines = []
    for m in (int(r) for r in args.rows.split(",")):
        a = rng.standard_normal((m, K), dtype=cp.float32).clip(0, None).astype(kernels.BF16)  # after ReLU
        residual = rng.standard_normal((m, N), dtype=cp.float32)
        flops = 2 * m * N * K
        out = residual.copy()
        now = timed(lambda: kernels.gemm(a, w, bias=bias, residual=out, out=out), inner=10)
        want = residual.copy()
        kernels.gemm(a, w, bias=bias, residual=want, out=want)
        # each half as an array of its own (gemm takes C-contiguous operands; a split kernel would read the halves
        # of A and W in place, through TMA maps of the same bytes)
        halves = [(cp.ascontiguousarray(a[:, :K // 2]), cp.ascontiguousarray(w[:, :K // 2])),
                  (cp.ascontiguousarray(a[:, K // 2:]), cp.ascontiguousarray(w[:, K // 2:]))]
        parts = [cp.empty((m, N), dtype=cp.float32) for _ in halves]
        row = {"what": f"FFN2 split in two halves, {m} rows", "shape": [m, K, N], "now_tflops": flops / now / 1e12,
               "now_us": now * 1e6, "halves_us": {}}
        for tile in HALF_TILES:
            run = [lambda h=h, p=p, t=tile: kernels.gemm(h[0], h[1], out=p, tile=t) for h, p in zip(halves, parts)]
            row["halves_us"][tile] = timed_pair(*run) * 1e6
        best = min(row["halves_us"], key=row["halves_us"].get)
        out = cp.empty_like(residual)
        combine = timed(lambda: COMBINE(parts[0], parts[1], bias, residual, out), inner=10)
        for h, p in zip(halves, parts):
            kernels.gemm(h[0], h[1], out=p, tile=best)
        COMBINE(parts[0], parts[1], bias, residual, out)
        estimate = row["halves_us"][best] + combine * 1e6
        row.update(best_half_tile=best, combine_us=combine * 1e6, estimate_us=estimate,
                   estimate_tflops=flops / estimate / 1e6,
                   max_abs_diff_from_now=float(cp.abs(out - want).max()),
                   same_bits_share=float((out == want).mean()))
        lines.append(json.dumps({k: round(v, 3) if isinstance(v, float) else
                                 ({t: round(s, 2) for t, s in v.items()} if isinstance(v, dict) else v)
                                 for k, v in row.items()}))
        print(lines[-1], flush=True)
    if args.out:
        with args.out.open("a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
