"""Continuous batching against static batching, greedy search, on sentences that end at drawn lengths.

    python bench/continuous.py [--preset nllb-200-distilled-600M] [--live-rows 4096] [--sentences 16384]
                               [--ends 5,60] [--repeats 2] [--pool-gib 40] [--out results.jsonl]
    python bench/continuous.py --smoke          # a tiny shape on the CPU's reference engine, in seconds

Workload: the harness's (bench/harness.py) model shape with random bf16 weights (bench/shapes.py) and its
sources (10 to 60 tokens, sorted by length); sentence i ends at a length L_i drawn evenly from 5 to 60 (--ends):
its L_i-th generated token (the language token the first) is forced to </s> by EndAt, a wrapper around the
engine, since random weights never end a sentence on their own (</s> is moved to the last id of the vocabulary,
as in the harness, so none ends earlier either). max_length is the largest end, so every end is in reach.

Static: search.generate over batches of --live-rows sentences in the sorted order (rows leave a batch as they
end; the batch's last steps run with few rows). Continuous: search.greedy_continuous with --live-rows rows at
most, a group admitted whenever fewer than REFILL of them are alive. Both must give the same ids. Tokens count
the generated tokens with the language token, without </s> (the harness's count). One JSON line per mode and
repeat, then one with the ratio of the last repeat's tokens/s; the first repeat includes the warm-up's leftovers
(graphs captured at their second use).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.harness import workload  # noqa: E402
from bench.shapes import DEFAULT, PRESETS, Preset, model_config, random_weights  # noqa: E402
from nllbcli import search  # noqa: E402
from nllbcli.options import DecodeOptions  # noqa: E402
from nllbcli.search import Ready, generate, greedy_continuous  # noqa: E402

SMOKE = Preset("smoke", model_config(vocab_size=1024, d_model=64, layers=2, ffn=128, heads=4), 1000, 1001, 1000)


class EndAt:
    """An engine whose greedy ids are </s> (`eos`) at each sentence's drawn end: the sentence of source s ends
    at its ends[tuple(s)]-th generated token (the language token the first). A row at position t (the decoder
    start at 0, the language token at 1) makes its (t + 1)-th generated token, so it is forced where
    t = end - 1; each state's rows count down their steps left (`left`, on the host) through start, join,
    select and every step queued. The </s> is put into the ids the search fetches, not into the device's copy
    the next step reads: a row leaves when the search sees its </s>, and what its steps queued after it read
    is thrown away, as for any row that ends. (Forced on the device, the ends moved with the batch on the GPU:
    docs/PERF.md, eighth session.) Counts the steps and the rows they ran (`steps`, `row_steps`)."""

    def __init__(self, engine, ends: dict[tuple, int], eos: int):
        self.engine, self.ends, self.eos = engine, ends, eos
        self.encoded_ends: dict[int, tuple] = {}  # id(encoded) -> (encoded, each source's end)
        self.left: dict[int, tuple] = {}  # id(state) -> (state, each row's steps left until its end)
        self.steps = self.row_steps = 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def encode(self, sources):
        encoded = self.engine.encode(sources)
        self.encoded_ends[id(encoded)] = (encoded, np.array([self.ends[tuple(s)] for s in sources]))
        return encoded

    def release_sources(self, encoded) -> None:
        self.engine.release_sources(encoded)
        self.encoded_ends.pop(id(encoded), None)

    def start(self, encoded, source_rows, max_positions):
        state = self.engine.start(encoded, source_rows, max_positions)
        ends = self.encoded_ends[id(encoded)][1][np.asarray(source_rows)]
        self.left[id(state)] = (state, ends - np.asarray(state.t))
        return state

    def counted(self, state) -> np.ndarray:
        """The rows' steps left before this step; one step down after it."""
        left = self.left[id(state)][1]
        self.left[id(state)] = (state, left - 1)
        self.steps += 1
        self.row_steps += state.n
        return left

    def step(self, encoded, state, tokens, want_logits: bool = True):
        self.counted(state)
        return self.engine.step(encoded, state, tokens, want_logits)

    def step_argmax_ahead(self, encoded, state, tokens):
        ending = self.counted(state) == 1
        inner = getattr(self.engine, "step_argmax_ahead", None)
        if inner is None:
            return Ready(np.where(ending, self.eos, self.engine.step_argmax(encoded, state, tokens)))
        pending = inner(encoded, state, tokens)
        fetch = pending.fetch  # subset() fetches through the replaced one
        pending.fetch = lambda: np.where(ending, self.eos, fetch())
        return pending

    def step_argmax(self, encoded, state, tokens):
        return self.step_argmax_ahead(encoded, state, tokens).fetch()

    def select(self, state, rows) -> None:
        self.engine.select(state, rows)
        self.left[id(state)] = (state, self.left[id(state)][1][np.asarray(rows)])

    def join(self, state, other) -> None:
        joined = self.left.pop(id(other))[1]
        self.engine.join(state, other)
        self.left[id(state)] = (state, np.concatenate([self.left[id(state)][1], joined]))

    def release(self, state) -> None:
        self.engine.release(state)
        self.left.pop(id(state), None)

    def reorder(self, state, parents) -> None:
        raise NotImplementedError("EndAt measures greedy search")


def make_engine(preset: Preset, smoke: bool, pool_gib: float):
    config = dataclasses.replace(preset.config, eos_token_id=preset.config.vocab_size - 1)  # out of random weights' reach
    weights = random_weights(config, seed=0, scale=0.02, embed_scale=0.02)
    if smoke:
        from nllbcli.engine.reference import ReferenceEngine

        return config, ReferenceEngine(config, weights)
    from nllbcli.engine.cuda import CudaEngine

    return config, CudaEngine(config, weights, pool_bytes=int(pool_gib * 2**30))


def synchronize(smoke: bool) -> None:
    if not smoke:
        import cupy as cp

        cp.cuda.Device().synchronize()


def run_static(engine, sources, lang: int, config, options, live_rows: int) -> list[list[int]]:
    outputs = []
    for i in range(0, len(sources), live_rows):
        outputs += generate(engine, sources[i : i + live_rows], lang, config, options)
    return outputs


def measure(mode: str, run, engine: EndAt, smoke: bool, record: dict) -> list[list[int]]:
    engine.steps = engine.row_steps = 0
    synchronize(smoke)
    t = time.perf_counter()
    outputs = run()
    synchronize(smoke)
    seconds = time.perf_counter() - t
    tokens = sum(len(o) + 1 for o in outputs)  # the language token counts, </s> does not (the harness's count)
    record.update(mode=mode, tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds, steps=engine.steps,
                  row_steps=engine.row_steps, rows_per_step=engine.row_steps / max(engine.steps, 1))
    return outputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=list(PRESETS), default=DEFAULT, help=f"model shape, random weights (default {DEFAULT})")
    parser.add_argument("--live-rows", type=int, default=4096, help="static batch size; continuous: rows alive at most")
    parser.add_argument("--sentences", type=int, default=16384)
    parser.add_argument("--ends", default="5,60", help="each sentence's length, drawn evenly from LOW,HIGH (max_length HIGH)")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each mode, after a warm-up")
    parser.add_argument("--pool-gib", type=float, default=40.0, help="the GPU engine's KV pool (room for 4,096 rows)")
    parser.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU's reference engine (8 rows, 64 sentences by default)")
    parser.add_argument("--out", type=Path, help="append the JSON lines to this file too")
    args = parser.parse_args()
    if args.smoke:
        preset = SMOKE
        live_rows = args.live_rows if args.live_rows != parser.get_default("live_rows") else 8
        count = args.sentences if args.sentences != parser.get_default("sentences") else 64
    else:
        preset, live_rows, count = PRESETS[args.preset], args.live_rows, args.sentences

    sources = workload(count, preset)
    rng = np.random.default_rng(2)
    low, high = (int(x) for x in args.ends.split(","))
    ends = dict(zip(map(tuple, sources), rng.integers(low, high + 1, count).tolist()))
    config, inner = make_engine(preset, args.smoke, args.pool_gib)
    engine = EndAt(inner, ends, config.eos_token_id)
    options = DecodeOptions(beam_size=1, max_length=high)
    lang = preset.tgt_lang_id
    rows, _ = engine.capacity(options.max_length)
    if rows < live_rows:
        raise SystemExit(f"the KV pool holds {rows} rows, fewer than --live-rows {live_rows}: raise --pool-gib")
    common = {"preset": preset.name, "device": "cpu" if args.smoke else "cuda", "live_rows": live_rows, "sentences": count,
              "ends": [low, high], "ahead": search.AHEAD, "refill": search.REFILL}

    warm = sources[:live_rows]  # every kernel compiled, each mode's first buckets seen
    run_static(engine, warm, lang, config, options, live_rows)
    greedy_continuous(engine, warm, lang, config, options, live_rows)

    lines = []
    for repeat in range(args.repeats):
        static, continuous = dict(common, repeat=repeat), dict(common, repeat=repeat)
        want = measure("static", lambda: run_static(engine, sources, lang, config, options, live_rows), engine, args.smoke, static)
        stats: dict = {}
        got = measure("continuous", lambda: greedy_continuous(engine, sources, lang, config, options, live_rows, stats=stats),
                      engine, args.smoke, continuous)
        continuous.update(stats=stats, same_ids=got == want)
        lines += [static, continuous]
        for line in (static, continuous):
            print(json.dumps(line), flush=True)
        if got != want:
            differ = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
            print(json.dumps({"error": "continuous and static ids differ", "sentences": differ[:20], "count": len(differ)}), flush=True)
    summary = dict(common, continuous_over_static=lines[-1]["tokens_per_s"] / lines[-2]["tokens_per_s"],
                   same_ids=all(line.get("same_ids", True) for line in lines))
    lines.append(summary)
    print(json.dumps(summary), flush=True)
    if args.out:
        with args.out.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    return 0 if summary["same_ids"] else 1


if __name__ == "__main__":
    sys.exit(main())
