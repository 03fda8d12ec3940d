"""Where a batch's time goes as its sentences end: each decoder step's GPU time against its live rows, and the GPU
time between steps (the search's bookkeeping kernels, and the GPU idle while the host works), forced and real
lengths (bench/lengths.py), steps replayed from CUDA graphs as in a job.

    python -m bench.micro.thinning [--preset nllb-200-distilled-600M] [--batch 4096] [--beams 1]

The harness's model and workload (bench/harness.py: random weights, </s> out of reach); one batch of --batch
sentences, generated once to make its graphs, then measured: CUDA events recorded before and after every
engine.run_step (outside the steps' graphs), so that a step's span is the GPU's time from reaching the step to its
end, and the time from one step's end to the next one's start is what ran between them, or nothing. The steps
are grouped by their live rows (powers of two); JSON lines, then a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import defaultdict

import cupy as cp

from bench import lengths as real
from bench.harness import NEW_TOKENS, normal_weights, workload
from nllbcli.model.engine.cuda import CudaEngine
from nllbcli.model.search import generate_ids
from nllbcli.model.shapes import DEFAULT, PRESETS
from nllbcli.options import DecodeOptions


def measured(engine: CudaEngine, sources, langs, config, options) -> dict:
    """One generate of `sources`, every step between two events: spans by live rows, and the gaps between steps."""
    marks: list[tuple[int, cp.cuda.Event, cp.cuda.Event]] = []
    run_step = engine.run_step

    def timed_step(state, *args, **kwargs):
        begin, end = cp.cuda.Event(), cp.cuda.Event()
        begin.record()
        run_step(state, *args, **kwargs)
        end.record()
        marks.append((state.n, begin, end))

    engine.run_step = timed_step
    try:
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        made = generate_ids(engine, sources, langs, config, options)
        cp.cuda.Device().synchronize()
        wall = time.perf_counter() - t
    finally:
        del engine.run_step
    by_rows: dict[int, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # steps, their ms, ms after them
    for i, (rows, begin, end) in enumerate(marks):
        group = by_rows[1 << max(rows - 1, 0).bit_length()]
        group[0] += 1
        group[1] += cp.cuda.get_elapsed_time(begin, end)
        if i + 1 < len(marks):
            group[2] += cp.cuda.get_elapsed_time(end, marks[i + 1][1])
    tokens = sum(len(ids) + 1 for ids in made)
    return {"wall_ms": wall * 1e3, "tokens": tokens, "tokens_per_s": tokens / wall, "steps": len(marks),
            "steps_ms": sum(g[1] for g in by_rows.values()), "between_ms": sum(g[2] for g in by_rows.values()),
            "by_rows": {rows: {"steps": g[0], "ms": g[1], "between_ms": g[2]} for rows, g in sorted(by_rows.items())}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default=DEFAULT, choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=4096, help="sentences (beam search: each its --beams rows)")
    parser.add_argument("--beams", type=int, default=1)
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    config = dataclasses.replace(preset.config, eos_token_id=preset.config.vocab_size - 1)
    engine = CudaEngine(config, normal_weights(config))
    sources = workload(args.batch, preset)
    langs = [preset.tgt_lang_id] * len(sources)
    results = {}
    for mode in ("forced", "real"):
        limits = {"max_length": NEW_TOKENS} if mode == "forced" else {"max_length": real.CAP, **real.GUARD}
        options = DecodeOptions(beam_size=args.beams, **limits)
        engine.capacity(max(options.length_limits(sources)), args.beams, sentences=len(sources),
                        source_tokens=sum(map(len, sources)))
        if mode == "real":
            real.install(real.held_out_ratios())
        try:
            generate_ids(engine, sources, langs, config, options)  # its graphs made
            results[mode] = measured(engine, sources, langs, config, options)
        finally:
            real.uninstall()
        print(json.dumps({"preset": preset.name, "batch": args.batch, "beams": args.beams, "lengths": mode,
                          **results[mode]}), flush=True)
    print("\n| lengths | live rows up to | steps | step ms | ms between steps |\n|---|---|---|---|---|")
    for mode, r in results.items():
        for rows, g in r["by_rows"].items():
            print(f"| {mode} | {rows:,} | {g['steps']} | {g['ms']:,.1f} | {g['between_ms']:,.1f} |")
        print(f"| {mode}, all | | {r['steps']} | {r['steps_ms']:,.1f} | {r['between_ms']:,.1f} "
              f"(wall {r['wall_ms']:,.1f} ms, {r['tokens_per_s']:,.0f} tokens/s) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
