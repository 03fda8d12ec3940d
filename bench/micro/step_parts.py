"""A decoder step's time placed by leaving one kernel family out at a time, the step replayed as the product runs
it (a CUDA graph), on a published shape with random weights.

    python -m bench.micro.step_parts [--preset nllb-200-3.3B] [--batch 2048] [--first 1024] [--out results.jsonl]
                                     [--kv-cache-type float8]

bench/micro/profile_step.py wraps each launcher in CUDA events, which takes the steps out of their graphs and adds
the events' own gaps (a few microseconds each, much of a small kernel's time). Here the step runs whole, as
`generate` runs it, and each family's share is the step's time with it against the step's time without it (its
launches replaced by nothing, the graphs captured again: the outputs are then wrong, the times are what counts):
layernorm, attention (self and cross), copy_rows (the new K/V into the pool), gemm (the layer products) and
logits_argmax (the output projection with its argmax). Also the step launched kernel by kernel (no graph), the
layer products alone, and the products with the output projection alone. Each variant runs `--steps` steps
(after two to compile and capture) from the third position of a batch of --batch sources of the harness's
workload (bench/harness.py: 4,096 sorted by length), from the --first-th on; twice, in turn. Milliseconds a step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import cupy as cp
import numpy as np

from bench.harness import normal_weights, workload
from nllbcli.model.engine import kernels
from nllbcli.model.engine.cuda import CudaEngine
from nllbcli.model.shapes import DEFAULT, PRESETS

LEFT_OUT = {  # a family's launcher replaced by nothing: what it would have written stays as it was
    "layernorm": lambda h, weight, bias, out=None, **options: out,
    "attention": lambda *args, out=None, **options: out,
    "copy_rows": lambda *args, **options: None,
    "gemm": lambda x, w, bias=None, out=None, **options: out,
    "logits_argmax": lambda final, lm_head, ids=None, **options: ids,
}
VARIANTS = [("whole", (), True), ("whole, no graph", (), False)] + [
    (f"without {family}", (family,), True) for family in LEFT_OUT] + [
    ("gemm alone", ("layernorm", "attention", "copy_rows", "logits_argmax"), True),
    ("gemm and logits_argmax alone", ("layernorm", "attention", "copy_rows"), True)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default=DEFAULT, choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=4096, help="sources (one row each: greedy)")
    parser.add_argument("--first", type=int, default=0, help="the first of the harness's sorted sources to take")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--kv-cache-type", default="bfloat16", choices=("bfloat16", "float8"),
                        help="float8: the K/V cache in E4M3 (its attention and row copies are the same families)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not kernels.wgmma_available():
        raise SystemExit("needs a Hopper GPU")
    preset = PRESETS[args.preset]
    config = dataclasses.replace(preset.config, eos_token_id=preset.config.vocab_size - 1)  # </s> out of reach
    started = time.perf_counter()
    engine = CudaEngine(config, normal_weights(config), kv_float8=args.kv_cache_type == "float8")
    sources = workload(4096, preset)[args.first:args.first + args.batch]
    engine.capacity(args.steps + 4, 1, len(sources), sum(map(len, sources)))
    encoded = engine.encode(sources)
    built = time.perf_counter() - started
    launchers = {family: getattr(kernels, family) for family in LEFT_OUT}

    def step_ms(left_out: tuple, graphs: bool) -> float:
        for family, launcher in launchers.items():
            setattr(kernels, family, LEFT_OUT[family] if family in left_out else launcher)
        engine.use_graphs = graphs
        if engine.ws is not None:  # captured again with this variant's launches
            engine.ws.graphs.clear()
            engine.ws.seen.clear()
        state = engine.start(encoded, np.arange(len(sources)), args.steps + 4)
        engine.step(encoded, state, np.full(len(sources), config.decoder_start_token_id), want_logits=False)
        tokens = np.full(len(sources), preset.tgt_lang_id)
        for _ in range(2):  # run eagerly, then captured
            tokens = engine.step_argmax(encoded, state, tokens)
        cp.cuda.Device().synchronize()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(args.steps):
            tokens = engine.step_argmax(encoded, state, tokens)
        end.record()
        end.synchronize()
        engine.release(state)
        return cp.cuda.get_elapsed_time(start, end) / args.steps

    try:
        times: dict[str, list[float]] = {}
        for _ in range(2):
            for name, left_out, graphs in VARIANTS:
                times.setdefault(name, []).append(round(step_ms(left_out, graphs), 3))
    finally:
        for family, launcher in launchers.items():
            setattr(kernels, family, launcher)
    line = json.dumps({"preset": args.preset, "kv_cache_type": args.kv_cache_type, "batch": len(sources),
                       "first": args.first,
                       "source_tokens": int(sum(map(len, sources))), "built_s": round(built, 1), "step_ms": times})
    print(line, flush=True)
    if args.out:
        args.out.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
