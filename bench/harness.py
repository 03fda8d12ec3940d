"""The benchmark harness: nllbcli's GPU engine and transformers' `generate`, one run, same GPU, same inputs.

    python -m bench.harness [--preset nllb-200-distilled-600M] [--sentences 4096]
                            [--ours 256x1,1024x1,4096x1,256x4,1024x4]
                            [--transformers 1024x1,4096x1,256x4,1024x4] [--out results.json]

Workload (issue 5): an NLLB-200-distilled-600M-shaped model with random bf16 weights, or another published
shape with --preset (nllbcli/model/shapes.py: the NLLB-200 sizes 600M, 1.3B and 3.3B, M2M-100 418M and 1.2B), the
same shape for both engines; 4,096 sentences of 10 to 60 source tokens, sorted by length; 40 generated
tokens each (the target-language token included, as transformers' max_new_tokens counts it: transformers
gets min_new_tokens = max_new_tokens = 40, and </s> is moved to the last id of the vocabulary for nllbcli,
one random weights never pick, so both generate exactly 40); each run is warmed up before it is timed:
transformers with one batch, nllbcli with every batch once (its decoder steps run as CUDA graphs, one for each
row count a step meets, made as each first comes: a long job's steady state). Tokens/s counts generated tokens; peak memory is the largest that PyTorch's or CuPy's
allocator held during that configuration (ours: the weights, the KV pool sized for the job's largest batch, and
the arrays of a batch).

A run of ours may add a decoding control, BATCHxBEAMS:VARIANT (VARIANTS: scores, hyp4 for 4 hypotheses,
sample, sample-scores, topk10, topk50, topp0.9; tgt3: each source translated into three target languages in one batch,
as --tgt a,b,c does, its encoder run once for the three, so tokens/s above the plain search's is the encoder
shared; fp8: --compute-type float8, the same weights in FP8 E4M3; kv8: --kv-cache-type float8, the K/V cache in
FP8 E4M3; fp8kv8: both), to time it against the plain search in the same run:

    python -m bench.harness --ours 4096x1,4096x1:scores,4096x1:sample,2048x4,2048x4:hyp4 --transformers ""

Real lengths (--lengths real, or forced,real for both in one run): each sentence ends at its own length, drawn
from the sample model's held-out target/source length ratios (bench/lengths.py), on both engines: nllbcli's
finished sentences leave the batch, transformers' stay in it padded until its longest ends. nllbcli's KV pool is
planned by the limits of --max-length-a 1.5 --max-length-b 10 (what docs/DECODING.md suggests), as for a job.
Every run is made at each length given, the engines' runs in one process each; the table gives each engine's
real-length tokens/s against its forced-length figure at the same batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

from nllbcli.model.shapes import DEFAULT, PRESETS, Preset, parameter_count
from nllbcli.model.checkpoint import ModelConfig

from . import lengths as real

NEW_TOKENS = 40
LENGTHS = ("forced", "real")  # every sentence NEW_TOKENS long, or each its own (bench/lengths.py)


def workload(sentences: int, preset: Preset, seed: int = 1) -> list[list[int]]:
    """Sources in the preset's language token; pieces below 250,000 (NLLB) or below the language tokens (M2M)."""
    rng = np.random.default_rng(seed)
    lengths = np.sort(rng.integers(10, 61, sentences))
    top = min(250000, preset.pieces)
    return [[preset.src_lang_id] + rng.integers(4, top, n - 2).tolist() + [2] for n in lengths]


# the decoding controls a run of ours may add (BATCHxBEAMS:VARIANT): their cost against the plain search
VARIANTS = {
    "": {},
    "scores": {"scores": True},
    "hyp4": {"num_hypotheses": 4},
    "sample": {"sampling_topk": 0, "seed": 1},
    "sample-scores": {"sampling_topk": 0, "seed": 1, "scores": True},
    "topk10": {"sampling_topk": 10, "seed": 1},
    "topk50": {"sampling_topk": 50, "seed": 1},  # past the fused top-k lists: each step's logits written whole
    "topp0.9": {"sampling_topk": 0, "sampling_topp": 0.9, "seed": 1},
    "tgt3": {},  # each source into three target languages in one batch (--tgt a,b,c): the encoder once for them
    "fp8": {},  # --compute-type float8: the same model's matrices in FP8 E4M3 (quantized on the GPU as uploaded)
    "kv8": {},  # --kv-cache-type float8: the decoder's K/V cache in FP8 E4M3 with a scale a (row, head)
    "fp8kv8": {},  # both
}
ENGINES = {"fp8": (True, False), "kv8": (False, True), "fp8kv8": (True, True)}  # (FP8 products, FP8 cache) a variant's
COPIES = {"tgt3": 3}  # a variant's sentences per source


def parse(runs: str) -> list[tuple[int, int, str]]:
    """BATCHxBEAMS[:VARIANT],... -> (batch, beams, variant) each."""
    parsed = []
    for run in runs.split(","):
        if run:
            size, _, variant = run.partition(":")
            if variant not in VARIANTS:
                raise SystemExit(f"unknown variant {variant!r}: one of {', '.join(v for v in VARIANTS if v)}")
            batch, beams = (int(x) for x in size.split("x"))
            parsed.append((batch, beams, variant))
    return parsed


def normal_weights(config: ModelConfig) -> dict[str, np.ndarray]:
    """Seeded weights of standard deviation 0.02, LayerNorms 1 and 0, one embedding shared (as NLLB's): the
    harness's model, rounded to bf16 when the engine uploads it."""
    rng = np.random.default_rng(0)
    d, out = config.d_model, {}
    normal = lambda *shape: (rng.standard_normal(shape, dtype=np.float32) * 0.02)  # noqa: E731
    shared = normal(config.vocab_size, d)
    out.update({"encoder.embed_tokens.weight": shared, "decoder.embed_tokens.weight": shared, "lm_head.weight": shared})
    for side, layers, ffn in (("encoder", config.encoder_layers, config.encoder_ffn_dim), ("decoder", config.decoder_layers, config.decoder_ffn_dim)):
        for i in range(layers):
            p = f"{side}.layers.{i}."
            for attn in ("self_attn", "encoder_attn") if side == "decoder" else ("self_attn",):
                for proj in "qkvo":
                    name = f"{p}{attn}.{'out' if proj == 'o' else proj}_proj."
                    out[name + "weight"], out[name + "bias"] = normal(d, d), normal(d)
                out[f"{p}{attn}_layer_norm.weight"], out[f"{p}{attn}_layer_norm.bias"] = np.ones(d, np.float32), np.zeros(d, np.float32)
            out[p + "fc1.weight"], out[p + "fc1.bias"] = normal(ffn, d), normal(ffn)
            out[p + "fc2.weight"], out[p + "fc2.bias"] = normal(d, ffn), normal(d)
            out[p + "final_layer_norm.weight"], out[p + "final_layer_norm.bias"] = np.ones(d, np.float32), np.zeros(d, np.float32)
        out[f"{side}.layer_norm.weight"], out[f"{side}.layer_norm.bias"] = np.ones(d, np.float32), np.zeros(d, np.float32)
    return out


def in_parts(sources, beams: int, rows: int, source_rows: int):
    """Sub-batches the KV pool holds at once (what Translator.generate does for the CLI)."""
    part, tokens = [], 0
    for s in sources:
        if part and ((len(part) + 1) * beams > rows or (s != part[-1] and tokens + len(s) > source_rows)):
            yield part
            part, tokens = [], 0
        if not part or s != part[-1]:  # a source's copies (tgt3) share its cross K/V rows
            tokens += len(s)
        part.append(s)
    if part:
        yield part


def bench_ours(sources, runs, results, preset: Preset, modes: tuple[str, ...] = ("forced",)) -> None:
    import cupy as cp

    from nllbcli.model.engine.cuda import CudaEngine
    from nllbcli.options import DecodeOptions
    from nllbcli.model.search import generate_ids

    # </s> moved out of reach, so every sentence generates NEW_TOKENS tokens (forced) or its own length (real), as
    # transformers is made to
    config = dataclasses.replace(preset.config, eos_token_id=preset.config.vocab_size - 1)
    weights, memory = normal_weights(config), cp.get_default_memory_pool()
    plain = (False, False)
    engines = {plain: CudaEngine(config, weights)}
    memory.free_all_blocks()  # (the uploads' float32 copies, cached)
    held = {plain: memory.total_bytes()}  # each engine's weights
    for kind in dict.fromkeys(ENGINES[variant] for _, _, variant in runs if variant in ENGINES):
        before = memory.total_bytes()
        engines[kind] = CudaEngine(config, weights, float8=kind[0], kv_float8=kind[1])
        memory.free_all_blocks()
        held[kind] = memory.total_bytes() - before
    del weights
    for (batch, beams, variant), mode in ((run, mode) for run in runs for mode in modes):
        try:
            kind = ENGINES.get(variant, plain)
            engine = engines[kind]
            for each in engines.values():  # each configuration's peak memory its own: the other engine's pool goes
                each.drop_pool()
            lengths = {"max_length": NEW_TOKENS} if mode == "forced" else {"max_length": real.CAP, **real.GUARD}
            options = DecodeOptions(beam_size=beams, **lengths, **VARIANTS[variant])
            copies = COPIES.get(variant, 1)
            run_sources = [s for s in sources for _ in range(copies)]  # a source's copies side by side, as plan_chunk keeps them
            # the pool sized for the job's largest batch, as the Translator sizes it for each (rows, source tokens)
            most_tokens = max(sum(map(len, sources[i : i + batch // copies])) for i in range(0, len(sources), batch // copies))
            ends = real.ends_of(run_sources, real.held_out_ratios()) if mode == "real" else [NEW_TOKENS] * len(run_sources)
            # the pool planned by the limits (a real-length run's sentences end before theirs), as for a job
            rows, source_rows = engine.capacity(max(options.length_limits(run_sources)), options.rows_per_sentence,
                                                sentences=batch, source_tokens=most_tokens)
            langs = [preset.tgt_lang_id + n % copies for n in range(len(run_sources))]  # other language tokens

            def parts(start: int, end: int):
                for part in in_parts(run_sources[start:end], options.rows_per_sentence, rows, source_rows):
                    yield part, langs[start : start + len(part)]
                    start += len(part)

            if mode == "real":
                real.install(real.held_out_ratios())
            pool = cp.get_default_memory_pool()
            # warm-up: every batch once, so that the steps' CUDA graphs of every row count the batches meet are made,
            # as in a long job (with real lengths a batch thins step by step, through the row counts of many graphs)
            for part, part_langs in (p for i in range(0, len(run_sources), batch) for p in parts(i, i + batch)):
                generate_ids(engine, part, part_langs, config, options)
            cp.cuda.Device().synchronize()
            pool_peak = pool.total_bytes()
            t = time.perf_counter()
            made = []
            for i in range(0, len(run_sources), batch):
                for part, part_langs in parts(i, i + batch):
                    made += [len(o) + 1 for o in generate_ids(engine, part, part_langs, config, options)]  # the language
                pool_peak = max(pool_peak, pool.total_bytes())  # token counts, as in max_new_tokens
            cp.cuda.Device().synchronize()
            seconds = time.perf_counter() - t
            if mode == "real":
                real.uninstall()
            tokens = sum(made)
            results.append({"engine": "nllbcli", "preset": preset.name, "batch": batch, "beams": beams, "variant": variant,
                            "lengths": mode, "lengths_as_drawn": made == ends, "tokens": tokens,
                            "seconds": seconds, "tokens_per_s": tokens / seconds, "peak_gib": (pool_peak - sum(held.values()) + held[kind]) / 2**30,
                            "weights_gib": held[kind] / 2**30, "kv_pool_gib": engine.pool.nbytes / 2**30, "pool_rows": rows, "pool_source_rows": source_rows})
            print(json.dumps(results[-1]), flush=True)
        except cp.cuda.memory.OutOfMemoryError:  # this configuration does not fit the GPU: said, and the next one run
            real.uninstall()
            for each in engines.values():
                each.drop_pool()
            cp.get_default_memory_pool().free_all_blocks()
            results.append({"engine": "nllbcli", "preset": preset.name, "batch": batch, "beams": beams, "variant": variant, "lengths": mode, "error": "out of memory"})
            print(json.dumps(results[-1]), flush=True)
    engines.clear()
    engine = each = None  # no reference left: transformers runs next, in the memory the engines held
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()


def m2m100_config(c: ModelConfig):
    """transformers' M2M100Config of the same shape (random weights: nothing is loaded)."""
    from transformers import M2M100Config

    return M2M100Config(vocab_size=c.vocab_size, d_model=c.d_model, encoder_layers=c.encoder_layers,
                        decoder_layers=c.decoder_layers, encoder_attention_heads=c.encoder_attention_heads,
                        decoder_attention_heads=c.decoder_attention_heads, encoder_ffn_dim=c.encoder_ffn_dim,
                        decoder_ffn_dim=c.decoder_ffn_dim, max_position_embeddings=c.max_position_embeddings,
                        scale_embedding=c.scale_embedding, activation_function=c.activation_function,
                        pad_token_id=c.pad_token_id, bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id,
                        decoder_start_token_id=c.decoder_start_token_id)


def bench_transformers(sources, runs, results, preset: Preset, modes: tuple[str, ...] = ("forced",)) -> None:
    import torch
    from transformers import GenerationConfig, LogitsProcessorList, M2M100ForConditionalGeneration

    c = preset.config
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(m2m100_config(c)).to("cuda", torch.bfloat16).eval()
    ratios = real.held_out_ratios() if "real" in modes else ()
    for (batch, beams, _), mode in ((run, mode) for run in runs for mode in modes):
        try:
            new_tokens = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS} if mode == "forced" else \
                {"max_new_tokens": real.CAP}
            gen = GenerationConfig(num_beams=beams, do_sample=False, forced_bos_token_id=preset.tgt_lang_id,
                                   decoder_start_token_id=c.decoder_start_token_id, eos_token_id=c.eos_token_id,
                                   pad_token_id=c.pad_token_id, early_stopping=False, **new_tokens)

            def run(chunk) -> list[int]:
                """Each sentence's generated tokens, the language token and </s> counted (as max_new_tokens counts)."""
                width = max(len(s) for s in chunk)
                ids = torch.full((len(chunk), width), c.pad_token_id, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for i, s in enumerate(chunk):
                    ids[i, : len(s)] = torch.tensor(s)
                    mask[i, : len(s)] = 1
                ending = LogitsProcessorList([real.forced_end(real.ends_of(chunk, ratios), beams, c.eos_token_id)]) \
                    if mode == "real" else None
                with torch.no_grad():
                    out = model.generate(input_ids=ids.cuda(), attention_mask=mask.cuda(), generation_config=gen,
                                         logits_processor=ending)
                if mode == "forced":
                    return [out.shape[1] - 1] * len(chunk)
                ended = out[:, 1:] == c.eos_token_id  # after the decoder start (</s> in NLLB)
                return torch.where(ended.any(dim=1), ended.int().argmax(dim=1) + 1, out.shape[1] - 1).tolist()

            run(sources[:batch])  # warm-up at this size
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t = time.perf_counter()
            made = [n for i in range(0, len(sources), batch) for n in run(sources[i : i + batch])]
            torch.cuda.synchronize()
            seconds = time.perf_counter() - t
            ends = real.ends_of(sources, ratios) if mode == "real" else [NEW_TOKENS] * len(sources)
            tokens = sum(made)
            results.append({"engine": "transformers", "preset": preset.name, "batch": batch, "beams": beams,
                            "lengths": mode, "lengths_as_drawn": made == ends, "tokens": tokens, "seconds": seconds,
                            "tokens_per_s": tokens / seconds, "peak_gib": torch.cuda.max_memory_allocated() / 2**30})
            print(json.dumps(results[-1]), flush=True)
        except torch.cuda.OutOfMemoryError:  # this configuration does not fit the GPU: said, and the next one run
            torch.cuda.empty_cache()
            results.append({"engine": "transformers", "preset": preset.name, "batch": batch, "beams": beams, "lengths": mode,
                            "error": "out of memory"})
            print(json.dumps(results[-1]), flush=True)


def table(results: list[dict]) -> str:
    best = {}
    for r in results:
        if r.get("variant") or "error" in r:
            continue
        key = (r["engine"], r["beams"], r.get("lengths", "forced"))
        if key not in best or r["tokens_per_s"] > best[key]["tokens_per_s"]:
            best[key] = r
    lines = ["| engine | batch | beams | variant | lengths | tokens/s | peak GiB |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['engine']} | {r['batch']} | {r['beams']} | {r.get('variant', '')} | {r.get('lengths', 'forced')} | "
              + (f"{r['tokens_per_s']:,.0f} | {r['peak_gib']:.1f} |" if "error" not in r else f"{r['error']} | |")
              for r in results]
    for beams, mode in sorted({(r["beams"], r.get("lengths", "forced")) for r in results}):
        ours, theirs = best.get(("nllbcli", beams, mode)), best.get(("transformers", beams, mode))
        if ours and theirs:
            lines.append(f"\nbeam {beams}, {mode} lengths: best nllbcli / best transformers = "
                         f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}")
    forced = {(r["engine"], r["batch"], r["beams"], r.get("variant", "")): r for r in results
              if r.get("lengths") == "forced" and "error" not in r}
    for r in results:  # how much of the forced-length speed each engine keeps with real lengths
        f = forced.get((r["engine"], r["batch"], r["beams"], r.get("variant", "")))
        if r.get("lengths") == "real" and f and "error" not in r:
            lines.append(f"{r['engine']} {r['batch']}x{r['beams']}{':' + r['variant'] if r.get('variant') else ''}: "
                         f"real / forced lengths = {r['tokens_per_s'] / f['tokens_per_s']:.3f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=list(PRESETS), default=DEFAULT,
                        help=f"model shape, random weights (nllbcli/model/shapes.py; default {DEFAULT})")
    parser.add_argument("--sentences", type=int, default=4096)
    parser.add_argument("--ours", default="256x1,1024x1,4096x1,256x4,1024x4")
    parser.add_argument("--transformers", default="1024x1,4096x1,256x4,1024x4")
    parser.add_argument("--lengths", default="forced", help="forced (every sentence 40 tokens), real (each its own: "
                        "bench/lengths.py) or forced,real (both, each run at each)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    modes = tuple(dict.fromkeys(m.strip() for m in args.lengths.split(",") if m.strip()))
    if not modes or not set(modes) <= set(LENGTHS):
        parser.error(f"--lengths takes {', '.join(LENGTHS)}, comma-separated")
    preset = PRESETS[args.preset]
    print(f"{preset.name}: {parameter_count(preset.config):,} parameters, random bf16 weights", flush=True)
    sources = workload(args.sentences, preset)
    results: list[dict] = []
    bench_ours(sources, parse(args.ours), results, preset, modes)
    if args.transformers:
        bench_transformers(sources, parse(args.transformers), results, preset, modes)
    print(f"{preset.name}\n" + table(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
