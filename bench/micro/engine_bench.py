"""First GPU measurements: the project's GEMM against cuBLAS (cupy.matmul) and the engine's generation speed.

    python -m bench.micro.engine_bench [--out results.json] [--quick]

Shapes are NLLB-200-distilled-600M's (d_model 1,024, FFN 4,096, 12+12 layers, 256,206-row output
projection) with random weights, so no checkpoint is needed. The workload of generation: sources of 10 to
60 tokens sorted by length, 40 generated tokens (max_length 41 with the language token), greedy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import cupy as cp
import numpy as np

from bench.harness import in_parts, normal_weights
from nllbcli.model.engine import kernels
from nllbcli.model.engine.cuda import CudaEngine
from nllbcli.options import DecodeOptions
from nllbcli.model.search import generate_ids
from nllbcli.model.shapes import NLLB_600M



_spin = None


def hold_gpu(seconds: float) -> None:
    """Keep the GPU busy for about `seconds` (one thread spinning on the clock), so that the launches the host
    queues meanwhile run back to back after it."""
    global _spin
    if _spin is None:
        _spin = cp.RawKernel(r"""extern "C" __global__ void spin(long long cycles) {
            const long long start = clock64();
            while (clock64() - start < cycles) { }
        }""", "spin")
    hz = cp.cuda.Device().attributes.get("ClockRate", 2e6) * 1e3  # the attribute is in kHz
    _spin((1,), (1,), (np.int64(seconds * hz),))


def timed(fn, repeat=20, inner=1) -> float:
    """Median seconds of fn() over `repeat` runs after two warm-up runs, timed with CUDA events: the GPU's time
    alone. Each run's calls are queued behind a spin kernel (hold_gpu), so the host's launch latency (Python's,
    CuPy's or cuBLAS's) neither delays the first call after the start event nor leaves the GPU waiting between
    calls. inner > 1: each timing covers that many calls back to back (and is divided by it)."""
    fn(), fn()
    times = []
    for _ in range(repeat):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        hold_gpu(1e-3 + 2e-4 * inner)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1000 / inner)
    return float(np.median(times))


GEMM_SHAPES = [  # M, K, N
    (35840, 1024, 4096, "encoder FFN1"), (35840, 1024, 3072, "encoder QKV"), (35840, 4096, 1024, "encoder FFN2"),
    (1024, 1024, 3072, "decode QKV, 1,024 rows"), (1024, 1024, 4096, "decode FFN1, 1,024 rows"),
    (64, 1024, 4096, "decode FFN1, 64 rows"), (256, 4096, 1024, "decode FFN2, 256 rows"),
    (4096, 1024, 3072, "decode QKV, 4,096 rows"), (4096, 4096, 1024, "decode FFN2, 4,096 rows"),
    (4096, 1024, 1024, "decode attention out, 4,096 rows"), (4096, 1024, 4096, "decode FFN1, 4,096 rows"),
    (8192, 1024, 4096, "FFN1, 8,192 rows"), (16384, 1024, 4096, "FFN1, 16,384 rows"),
]


def bench_gemm(results: list) -> None:
    rng = cp.random.default_rng(0)
    for m, k, n, what in GEMM_SHAPES:
        a = rng.standard_normal((m, k), dtype=cp.float32).astype("bfloat16")
        w = rng.standard_normal((n, k), dtype=cp.float32).astype("bfloat16")
        wt = w.T
        cublas = timed(lambda: cp.matmul(a, wt), inner=10)
        flops = 2 * m * n * k
        row = {"what": f"gemm {what}", "shape": [m, k, n], "cublas_ms": cublas * 1e3, "cublas_tflops": flops / cublas / 1e12,
               "default_tile": kernels.gemm_tile(m, n, k)}
        for tile in kernels.available_tiles():
            ours = timed(lambda: kernels.gemm(a, w, tile=tile), inner=10)
            row[f"{tile}_ms"], row[f"{tile}_tflops"] = ours * 1e3, flops / ours / 1e12
        results.append(row)
        print(json.dumps(results[-1]), flush=True)
    for m in (64, 1024, 4096):
        h = rng.standard_normal((m, 1024), dtype=cp.float32).astype("bfloat16")
        w = (rng.standard_normal((256206, 1024), dtype=cp.float32) * 0.02).astype("bfloat16")
        wt = w.T
        ours = timed(lambda: kernels.logits_argmax(h, w), repeat=10, inner=5)
        cublas = timed(lambda: cp.matmul(h, wt).argmax(axis=1), repeat=10, inner=5)
        results.append({"what": f"logits+argmax {m} rows", "ours_ms": ours * 1e3, "cublas_matmul_argmax_ms": cublas * 1e3,
                        "ours_weight_tbps": w.nbytes / ours / 1e12, "ours_tflops": 2 * m * 1024 * 256206 / ours / 1e12})
        print(json.dumps(results[-1]), flush=True)


def bench_engine(results: list, runs: list[tuple[int, int]]) -> None:
    config = NLLB_600M
    t0 = time.perf_counter()
    engine = CudaEngine(config, normal_weights(config))
    results.append({"what": "engine load (random 600M weights, host to GPU)", "seconds": time.perf_counter() - t0})
    rng = np.random.default_rng(1)
    for batch, beams in runs:
        lengths = np.sort(rng.integers(10, 61, batch))
        sources = [[256047] + rng.integers(4, 250000, n - 2).tolist() + [2] for n in lengths]
        options = DecodeOptions(beam_size=beams, max_length=41)
        rows, source_rows = engine.capacity(options.max_length, options.beam_size)
        generate_ids(engine, sources[:8], 256057, config, options)  # warm-up: compile every kernel
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        outputs = [o for part in in_parts(sources, beams, rows, source_rows) for o in generate_ids(engine, part, 256057, config, options)]
        cp.cuda.Device().synchronize()
        seconds = time.perf_counter() - t
        tokens = sum(len(o) + 1 for o in outputs)  # the language token counts, as in transformers' max_new_tokens
        results.append({"what": f"engine batch {batch}, beam {beams}", "generated_tokens": tokens, "seconds": seconds,
                        "tokens_per_s": tokens / seconds, "pool_gib": engine.pool.nbytes / 2**30,
                        "peak_gib": cp.get_default_memory_pool().total_bytes() / 2**30})
        print(json.dumps(results[-1]), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--runs", default="256x1,1024x1,256x4", help="batch x beams, comma-separated")
    args = parser.parse_args()
    results = [{"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "cupy": cp.__version__}]
    bench_gemm(results)
    bench_engine(results, [tuple(int(x) for x in run.split("x")) for run in args.runs.split(",") if run])
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
