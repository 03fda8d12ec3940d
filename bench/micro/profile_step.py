"""Where a decode step's time goes: GPU time per kernel family (CUDA events around each launcher) against
the step's wall time, on a published shape (nllbcli/model/shapes.py; default NLLB-600M) with random weights.

    python -m bench.micro.profile_step [--preset nllb-200-3.3B] [--pool-gib 40] [--batches 1024,4096] [--steps 8]
                                       [--generate 4096x1,2048x4] [--compute-type float8] [--kv-cache-type float8]

Also times the fused output projection with both GEMM tile shapes at each batch, to choose between them.
--generate BATCHxBEAMS: whole `generate` calls (the harness's workload, </s> out of reach) with the same
per-family GPU times, against the call's wall time: what the search's own work (beam bookkeeping in CuPy,
host syncs) costs shows as the difference. The steps are launched one by one, not replayed from CUDA graphs
(a graph hides the launches the timer wraps): the wall times here are without graphs; bench/harness.py's are
with them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import defaultdict

import cupy as cp
import numpy as np

from bench.harness import normal_weights
from bench.micro.engine_bench import timed
from bench.harness import NEW_TOKENS, workload
from nllbcli.model.shapes import DEFAULT, PRESETS
from nllbcli.model.engine import kernels
from nllbcli.model.engine.cuda import CudaEngine
from nllbcli.options import DecodeOptions
from nllbcli.model.search import generate_ids

# (in FP8, the logits' launchers quantize their input themselves: quantize_rows' time is inside theirs too)
FAMILIES = ["gemm", "gemm_fp8", "quantize_rows", "attention", "attention_prefill", "layernorm", "embed", "copy_rows",
            "logits_argmax", "logits_topk"]


class Timer:
    """Wraps each launcher in the kernels module with a pair of CUDA events."""

    def __init__(self, step_rows: int = 8192):
        self.events = []
        self.step_rows = step_rows  # GEMMs with more rows are the encoder's (a batch's source tokens, packed)
        self.originals = {name: getattr(kernels, name) for name in FAMILIES}
        for name, fn in self.originals.items():
            setattr(kernels, name, self.wrap(name, fn))

    def wrap(self, name, fn):
        def timed_call(*args, **kwargs):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            self.events.append((name, start, end))
            if name in ("gemm", "gemm_fp8"):  # also per shape: (K, N), the encoder's (packed source rows) apart from the steps'
                a, w = args[0], args[1 if name == "gemm" else 2]
                side = "encoder" if a.shape[0] > self.step_rows else "step"
                self.events.append((f"{name} {side} K{w.shape[1]} N{w.shape[0]}", start, end))
            return out

        return timed_call

    def collect(self) -> dict[str, float]:
        cp.cuda.Device().synchronize()
        totals = defaultdict(float)
        for name, start, end in self.events:
            totals[name] += cp.cuda.get_elapsed_time(start, end)
        self.events = []
        return dict(totals)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1024,4096")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--generate", default="", help="BATCHxBEAMS,...: profile whole generate calls instead")
    parser.add_argument("--preset", default=DEFAULT, choices=sorted(PRESETS))
    parser.add_argument("--pool-gib", type=int, default=40, help="the KV pool (40: 4,096 sources at once at 600M)")
    parser.add_argument("--compute-type", default="bfloat16", choices=("bfloat16", "float8"))
    parser.add_argument("--kv-cache-type", default="bfloat16", choices=("bfloat16", "float8"))
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    # </s> moved out of reach, as the harness does
    config = dataclasses.replace(preset.config, eos_token_id=preset.config.vocab_size - 1)
    d, vocab = config.d_model, config.vocab_size
    engine = CudaEngine(config, normal_weights(config), pool_bytes=args.pool_gib << 30, float8=args.compute_type == "float8",
                        kv_float8=args.kv_cache_type == "float8")
    engine.capacity(40)
    engine.use_graphs = False  # the timer's events wrap each launcher: nothing to wrap inside a graph's replay
    timer = Timer()
    sources = workload(4096, preset)
    if args.generate:
        return profile_generate(engine, config, sources, timer, args.generate, preset.tgt_lang_id)
    for batch in map(int, args.batches.split(",")):
        chunk = sources[:batch]
        for attempt in ("warm-up", "measured"):
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            encoded = engine.encode(chunk)
            cp.cuda.Device().synchronize()
            encode_wall = time.perf_counter() - t
            encode_gpu = timer.collect()
            state = engine.start(encoded, np.arange(batch), 41)
            engine.step(encoded, state, np.full(batch, 2), want_logits=False)
            tokens = np.full(batch, preset.tgt_lang_id)
            timer.collect()
            t = time.perf_counter()
            for _ in range(args.steps):
                tokens = engine.step_argmax(encoded, state, tokens)
            step_wall = (time.perf_counter() - t) / args.steps
            step_gpu = {k: v / args.steps for k, v in timer.collect().items()}
            engine.release(state)
            engine.release_sources(encoded)
        print(json.dumps({
            "batch": batch, "source_tokens": int(sum(map(len, chunk))),
            "encode_wall_ms": encode_wall * 1e3, "encode_gpu_ms": encode_gpu,
            "step_wall_ms": step_wall * 1e3, "step_gpu_ms": step_gpu, "step_gpu_total_ms": sum(v for k, v in step_gpu.items() if k in FAMILIES),
            "tokens_per_s_decode_only": batch / step_wall,
        }), flush=True)
        if engine.float8:  # the tile comparisons below are bf16's
            continue
        h = cp.random.default_rng(0).standard_normal((batch, d), dtype=cp.float32).astype("bfloat16")
        for tile in [t for t in kernels.available_tiles() if t in ("small", "large", "wg128", "wg256", "wg64w")]:
            ms = timed(lambda: timer.originals["logits_argmax"](h, engine.lm_head, tile=tile), repeat=5) * 1e3
            print(json.dumps({"batch": batch, "logits_argmax_tile": tile, "ms": ms,
                              "tflops": 2 * batch * d * vocab / ms / 1e9}), flush=True)
        for tile in [t for t in kernels.available_tiles() if t in ("small", "wg128", "wg256")]:
            ms = timed(lambda: timer.originals["logits_topk"](h, engine.lm_head, 8, tile=tile), repeat=5) * 1e3
            print(json.dumps({"batch": batch, "logits_topk8_tile": tile, "ms": ms}), flush=True)
        for rows in (batch, 2 * batch):  # the top-k's first pass alone, and both with each second-pass tile
            hr = cp.concatenate([h] * (rows // batch))
            tile = "wg128" if kernels.wgmma_available() else "small"
            stat = cp.empty((rows, -(-vocab // kernels.GEMM_TILES[tile]["BN"]), 2), dtype=cp.float32)
            first = timed(lambda: kernels.gemm_launch(tile, hr, engine.lm_head, epilogue=kernels.EPILOGUE_STAT,
                                                      part_stat=stat, TOPK=8), repeat=5) * 1e3
            row = {"rows": rows, "topk_first_pass_ms": first}
            for second in [t for t in kernels.available_tiles() if t in ("small", "wg128", "wg64")]:
                if kernels.GEMM_TILES[second]["BN"] == kernels.GEMM_TILES[tile]["BN"]:
                    row[f"logits_topk8_{tile}_{second}_ms"] = timed(lambda: timer.originals["logits_topk"](
                        hr, engine.lm_head, 8, tile=tile, select_tile=second), repeat=5) * 1e3
            print(json.dumps(row), flush=True)
    return 0


def profile_generate(engine, config, sources, timer, runs: str, tgt_lang_id: int) -> int:
    for run in runs.split(","):
        batch, beams = map(int, run.split("x"))
        options = DecodeOptions(beam_size=beams, max_length=NEW_TOKENS)
        engine.capacity(options.max_length, beams)
        for attempt in ("warm-up", "measured"):
            cp.cuda.Device().synchronize()
            timer.collect()
            t = time.perf_counter()
            generate_ids(engine, sources[:batch], tgt_lang_id, config, options)
            cp.cuda.Device().synchronize()
            wall = time.perf_counter() - t
            gpu = timer.collect()
        print(json.dumps({"generate": run, "wall_ms": wall * 1e3, "gpu_ms": gpu, "gpu_total_ms": sum(v for k, v in gpu.items() if k in FAMILIES),
                          "tokens_per_s": batch * NEW_TOKENS / wall}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
