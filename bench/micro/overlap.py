"""What a decoder step in two halves on two streams gains against the step in one piece, at each cap on its GEMMs' SMs.

The halves (CudaEngine.step_halves, NLLB_STEP_HALVES) run one half's attention, bound by memory, beside the other's
GEMMs, bound by the tensor cores, the GEMMs on at most CudaEngine.gemm_sms SMs (NLLB_GEMM_SMS): side by side (mode
1, "halves"), or staggered (mode 2: taking turns at the products, the second half a phase behind the first,
CudaEngine.take_turns; the cap there holds only for the products an attention may run beside); on a published shape
with random weights.

    python -m bench.micro.overlap [--preset nllb-200-3.3B] [--rows 4096] [--beams 1,4] [--caps 132,124,116,108,100]
                                  [--modes halves,staggered]

The harness's model and workload (bench/harness.py: normal_weights, </s> out of reach so that every sentence
generates 40 tokens, sources of 10 to 60 tokens sorted by length): one batch of --rows sentences (default 4,096
greedy, 2,048 beam search; in parts where the KV pool holds fewer, as the harness goes) generated whole
(generate_ids, the step as CUDA graphs), with the step in one piece and in halves of each mode at each cap, the
configurations in turn, each warmed up first (kernels compiled, graphs captured), then --repeat rounds; the median
wall time of each. Also one greedy step's (or beam search's top-k step's) time over the first part's rows from the third
position, replayed as generate replays it (bench/micro/step_parts.py's way), and whether each configuration's ids
are exactly those of the step in one piece, and whether any step's graph capture failed (the step then launched
kernel by kernel: its times are not the graph's). JSON lines, then a table.
About a minute at 600M with one mode, about two with both at five caps (estimated: not yet timed); more at 3.3B.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import cupy as cp
import numpy as np

from bench.harness import NEW_TOKENS, in_parts, normal_weights, workload
from nllbcli.model.engine import kernels
from nllbcli.model.engine.cuda import CudaEngine
from nllbcli.model.engine.numerics import HALVES, STAGGERED, WHOLE
from nllbcli.model.search import generate_ids
from nllbcli.model.shapes import DEFAULT, PRESETS
from nllbcli.options import DecodeOptions

STEPS = 12  # steps timed a configuration, from the third position
MODES = {"halves": HALVES, "staggered": STAGGERED}  # --modes
NAMES = {WHOLE: "one piece", HALVES: "halves", STAGGERED: "staggered halves"}


def step_ms(engine: CudaEngine, sources: list[list[int]], beams: int, start: int, lang: int) -> float:
    """One decoder step's milliseconds over every row of the batch (beams a source): the greedy step (argmax), or
    beam search's (its 2 x beams best), each row fed its first choice; two steps first, run then captured."""
    encoded = engine.encode(sources)
    state = engine.start(encoded, np.repeat(np.arange(len(sources)), beams), STEPS + 4)
    rows = state.n

    def step(tokens):
        if beams == 1:
            return engine.step_argmax_ahead(encoded, state, tokens).device
        return engine.step_topk(encoded, state, tokens, 2 * beams)[1][:, 0]

    try:
        engine.step(encoded, state, np.full(rows, start), want_logits=False)
        tokens = step(np.full(rows, lang))
        tokens = step(tokens)
        cp.cuda.Device().synchronize()
        begin, end = cp.cuda.Event(), cp.cuda.Event()
        begin.record()
        for _ in range(STEPS):
            tokens = step(tokens)
        end.record()
        end.synchronize()
    finally:
        engine.release(state)
        engine.release_sources(encoded)
    return cp.cuda.get_elapsed_time(begin, end) / STEPS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default=DEFAULT, choices=sorted(PRESETS))
    parser.add_argument("--rows", type=int, help="sentences a batch (default 4,096 greedy, 2,048 beam search)")
    parser.add_argument("--beams", default="1,4", help="beam sizes, each a run of its own (1: greedy)")
    parser.add_argument("--caps", help="the GEMMs' SMs in halves, comma-separated (default: all, and 8, 16, 24 and "
                                       "32 fewer)")
    parser.add_argument("--modes", default="halves,staggered", help="the halved steps beside the step in one piece: "
                                                                     "halves, staggered, or both (comma-separated)")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds over the configurations")
    args = parser.parse_args()
    if not kernels.wgmma_available():
        raise SystemExit("needs a Hopper GPU")
    sms = kernels.multiprocessors()
    caps = [int(c) for c in args.caps.split(",")] if args.caps else [sms - 8 * i for i in range(5)]
    modes = [MODES[m] for m in args.modes.split(",")]
    configurations = [(WHOLE, None)] + [(mode, cap) for mode in modes for cap in caps]
    preset = PRESETS[args.preset]
    config = dataclasses.replace(preset.config, eos_token_id=preset.config.vocab_size - 1)  # </s> out of reach
    started = time.perf_counter()
    engine = CudaEngine(config, normal_weights(config))
    print(f"{args.preset}: engine built in {time.perf_counter() - started:.0f} s, {sms} SMs", flush=True)
    results = []
    for beams in (int(b) for b in args.beams.split(",")):
        sentences = args.rows or (4096 if beams == 1 else 2048)
        sources = workload(sentences, preset)
        options = DecodeOptions(beam_size=beams, max_length=NEW_TOKENS)
        engine.drop_pool()
        rows, source_rows = engine.capacity(options.max_length, beams, sentences, sum(map(len, sources)))
        parts = list(in_parts(sources, beams, rows, source_rows))
        times, steps = {c: [] for c in configurations}, {}
        ids, same = [], {c: True for c in configurations}  # the first run's (the step in one piece), every run's

        def generate(configuration) -> float:
            engine.step_halves, engine.gemm_sms = configuration
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            out = [o for part in parts for o in generate_ids(engine, part, preset.tgt_lang_id, config, options)]
            cp.cuda.Device().synchronize()
            seconds = time.perf_counter() - t
            if not ids:
                ids.extend(out)
            same[configuration] &= out == ids
            return seconds

        for configuration in configurations:  # warm-up: kernels compiled, each configuration's graphs captured
            generate(configuration)
            steps[configuration] = step_ms(engine, parts[0], beams, config.decoder_start_token_id, preset.tgt_lang_id)
        for _ in range(args.repeat):
            for configuration in configurations:
                times[configuration].append(generate(configuration))
        tokens = sum(len(o) + 1 for o in ids)  # the language token counts (the harness's way)
        for configuration in configurations:
            mode, cap = configuration
            seconds = statistics.median(times[configuration])
            results.append({"preset": args.preset, "beams": beams, "sentences": sentences, "parts": len(parts),
                            "mode": mode, "step": NAMES[mode], "gemm_sms": cap, "seconds": round(seconds, 4),
                            "all_s": [round(t, 4) for t in times[configuration]],
                            "tokens_per_s": round(tokens / seconds), "step_ms": round(steps[configuration], 3),
                            "same_ids": same[configuration]})
            print(json.dumps(results[-1]), flush=True)
    engine.step_halves, engine.gemm_sms = WHOLE, None
    if engine.capture_error:
        print(f"NOT GRAPHS: {engine.capture_error}", flush=True)
    print("\n| beams | sentences | step | s (median) | tokens/s | against one piece | step ms | same ids |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        whole = next(w for w in results if w["beams"] == r["beams"] and w["mode"] == WHOLE)
        step = f"{r['step']}, GEMMs on {r['gemm_sms']} SMs" if r["mode"] != WHOLE else r["step"]
        print(f"| {r['beams']} | {r['sentences']:,} | {step} | {r['seconds']:.3f} | {r['tokens_per_s']:,} | "
              f"{whole['seconds'] / r['seconds']:.3f}x | {r['step_ms']:.2f} | {'yes' if r['same_ids'] else 'NO'} |")
    return 0 if all(r["same_ids"] for r in results) and not engine.capture_error else 1


if __name__ == "__main__":
    sys.exit(main())
