"""nllbcli's CPU engine (the NumPy float32 reference engine, through the API) against transformers' `generate`
(torch float32) and CTranslate2 (float32 and int8, converted from the same model directory) on the same sentences
in one run: CPU seconds at one thread, wall seconds at --threads threads, greedy and beam 4, and how many
translations each engine gives identical to nllb's and to transformers'. nllb-int8 is nllb with --compute-type int8.

    python -m bench.cpu [--models sample,600M] [--sentences N] [--threads T] [--engines nllb,nllb-int8,transformers,ct2,ct2-int8]
                        [--other-python /tmp/tfenv/bin/python] [--model-dir /tmp/nllb-cpu-600M] [--repeats 3]
                        [--profile] --out FILE.jsonl

nllb runs in this interpreter (nllbcli.load(model, device="cpu", threads=1), nllbcli.translate with
DecodeOptions(beam_size, max_length), split=False); transformers and CTranslate2 in --other-python, by
bench/cpu_others.py (torch.set_num_threads; CTranslate2's intra_threads with inter_threads=1). Each engine runs
the whole work once untimed, then --repeats timed runs at one thread (time.process_time: CPU seconds, which other
load on the machine moves little) and --repeats at --threads threads (time.perf_counter: wall seconds).

The sentences: sentence i is the held-out sentence i // 5 of language i % 5 of data/samples/heldout, translated
eng->fra, fra->deu, deu->spa, spa->ita, ita->eng; --sentences 500 is all 100 of each language.

The models: `sample` is data/samples/model (max length 200, nllb's default); `600M` is the 600M shape with random
weights (bench.e2e.build_model into --model-dir, about 1.2 GB, built once, reused), whose sentences never end:
every engine generates exactly --max-length-600M tokens (default 24), which suits timing, and the translations
(repeated pieces) must still agree. The max length is nllb's everywhere: tokens after the decoder start, the
language token included (transformers' max_new_tokens; CTranslate2's max_decoding_length, which counts the target
prefix, the language token).

--profile adds, per model and beam size, where nllb's CPU time goes: cProfile of the API call at one thread, the
engine's parts told apart by cProfile's callers (breakdown).

On the 2-core machine, busy with other work, with --profile: `--models sample --sentences 500 --repeats 3` took 8
minutes, `--models 600M --sentences 20 --repeats 2` 36 (its model built in 7 s); without --profile,
`--models 600M --sentences 10 --max-length-600M 16 --repeats 1` took 10.

Results are JSON lines on stdout and --out: setup, then per model and beam size one line per engine (times,
agreement) and, with --profile, one line per model and beam size of nllb's breakdown.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import nllbcli
from bench import cpu_others
from nllbcli.options import DecodeOptions

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"
DIRECTIONS = (("eng_Latn", "fra_Latn"), ("fra_Latn", "deu_Latn"), ("deu_Latn", "spa_Latn"), ("spa_Latn", "ita_Latn"),
              ("ita_Latn", "eng_Latn"))
ENGINES = ("nllb", "nllb-int8", "transformers", "ct2", "ct2-int8")
NLLB = {"nllb": "auto", "nllb-int8": "int8"}  # nllb's engines and their compute types


def directions(n: int) -> list[dict]:
    """The first n sentences by direction: sentence i is held-out line i // 5 of the source language of direction
    i % 5 (DIRECTIONS)."""
    lines = {src: (HELDOUT / f"{src}.txt").read_text(encoding="utf-8").splitlines() for src, _ in DIRECTIONS}
    out = [{"src": src, "tgt": tgt, "texts": []} for src, tgt in DIRECTIONS]
    for i in range(n):
        part = out[i % len(DIRECTIONS)]
        part["texts"].append(lines[part["src"]][i // len(DIRECTIONS)])
    return [part for part in out if part["texts"]]


def nllb_side(model_dir: str, parts: list[dict], beams: list[int], max_length: int, threads: int, repeats: int,
              compute_type: str = "auto") -> dict:
    """The nllb engine's times and translations, run as cpu_others runs the others'."""
    translator = nllbcli.load(model_dir, device="cpu", threads=1, compute_type=compute_type)

    def translate(part: dict, beam: int) -> list[str]:
        decode = DecodeOptions(beam_size=beam, max_length=max_length)
        return [r.text for r in nllbcli.translate(translator, part["texts"], part["src"], part["tgt"], decode, split=False)]

    def set_threads(n: int) -> None:
        translator.threads = n

    job = {"directions": parts, "beams": beams, "threads": threads, "repeats": repeats}
    return cpu_others.run(job, translate, set_threads)


def others_side(python: str, engines: list[str], model_dir: str, parts: list[dict], beams: list[int], max_length: int,
                threads: int, repeats: int, work: Path) -> dict:
    job = {"model_dir": model_dir, "work": str(work), "engines": engines, "directions": parts, "beams": beams,
           "max_length": max_length, "threads": threads, "repeats": repeats, "batch": 32}
    job_path, result_path = work / "job.json", work / "result.json"
    job_path.write_text(json.dumps(job), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MKL_", "OPENBLAS_"))}
    run = subprocess.run([python, str(ROOT / "bench" / "cpu_others.py"), str(job_path), str(result_path)], env=env,
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{python} bench/cpu_others.py failed ({run.returncode}):\n{run.stderr[-3000:]}")
    return json.loads(result_path.read_text(encoding="utf-8"))


# -- where nllb's time goes


def profile_nllb(model_dir: str, parts: list[dict], beam: int, max_length: int) -> dict:
    """cProfile of the API calls at one thread (after a warm-up), split into the engine's parts."""
    from nllbcli.model.engine import reference

    translator = nllbcli.load(model_dir, device="cpu", threads=1)
    decode = DecodeOptions(beam_size=beam, max_length=max_length)
    lm_head = translator.engine.w["lm_head.weight"]
    linear = reference.linear

    # every product goes through reference.linear: three names that cProfile tells apart
    def encoder_product(*args, **kwargs):
        return linear(*args, **kwargs)

    def decoder_product(*args, **kwargs):
        return linear(*args, **kwargs)

    def output_projection(*args, **kwargs):
        return linear(*args, **kwargs)

    phase = ["decoder"]

    def product(x, weight, *args, **kwargs):
        if phase[0] == "encoder":
            return encoder_product(x, weight, *args, **kwargs)
        return (output_projection if weight is lm_head else decoder_product)(x, weight, *args, **kwargs)

    encode = translator.engine.encode

    def encoding(*args, **kwargs):
        phase[0] = "encoder"
        try:
            return encode(*args, **kwargs)
        finally:
            phase[0] = "decoder"

    def once() -> None:
        for part in parts:
            nllbcli.translate(translator, part["texts"], part["src"], part["tgt"], decode, split=False)

    once()
    start = time.process_time()
    once()
    plain_s = time.process_time() - start
    reference.linear, translator.engine.encode = product, encoding
    try:
        profiler = cProfile.Profile()  # perf_counter: process_time as its timer costs a system call a call
        profiler.enable()
        once()
        profiler.disable()
    finally:
        reference.linear = linear
        del translator.engine.encode
    return {"cpu_s_unprofiled": round(plain_s, 3), **breakdown(pstats.Stats(profiler))}


def breakdown(stats: pstats.Stats) -> dict:
    """CPU seconds of nllb's parts from a profile of nllbcli.translate calls: each part's cumulative time, the
    same function's calls told apart by their caller where it is used in more than one part."""
    by_name: dict[tuple[str, str], tuple] = {}
    for (path, _, name), value in stats.stats.items():
        by_name[(Path(path).name, name)] = value

    def cum(file: str, name: str, caller: tuple[str, str] | None = None) -> float:
        found = [v for (f, n), v in by_name.items() if n == name and (f == file or file == "*")]
        if not found:
            return 0.0
        if caller is None:
            return sum(v[3] for v in found)
        return sum(c[3] for v in found for (cp, _, cn), c in v[4].items() if (Path(cp).name, cn) == caller)

    total = cum("api.py", "translate")
    generate = cum("translator.py", "generate_part")
    encode = cum("reference.py", "encode")
    encoder_products = cum("cpu.py", "encoder_product")
    step = cum("reference.py", "step_rows")
    products = cum("cpu.py", "decoder_product")
    projection = cum("cpu.py", "output_projection")
    attention = (cum("reference.py", "attention", ("reference.py", "step_rows"))
                 + cum("reference.py", "attention_over_padding", ("reference.py", "step_rows")))
    pick = (cum("numerics.py", "log_softmax") + cum("numerics.py", "topk_desc")
            + cum("~", "<method 'argmax' of 'numpy.ndarray' objects>", ("reference.py", "step_argmax_ahead")))
    select = cum("reference.py", "select")
    gather = cum("reference.py", "gather_rows")
    start = cum("reference.py", "start") + cum("reference.py", "make_room")
    parts = {
        "encoder products": encoder_products,
        "encoder, the rest": encode - encoder_products,
        "decoder products": products,
        "output projection": projection,
        "decoder attention": attention,
        "decoder step, the rest (layernorm, embedding, residuals)": step - products - projection - attention,
        "log-softmax, top-k, argmax": pick,
        "beams' cache copies (gather_rows)": gather,
        "select, the rest": select - gather,
        "decoder start, cache growth": start,
    }
    parts["search loop, per-step Python"] = generate - sum(parts.values())
    parts["outside the engine (tokenizing, job layer)"] = total - generate
    return {"profiled_s": round(total, 3),
            "parts_s": {k: round(v, 3) for k, v in parts.items()},
            "shares": {k: round(v / total, 3) if total else None for k, v in parts.items()}}


# -- the run


def agreement(translations: list[str], reference_: list[str] | None) -> int | None:
    if reference_ is None:
        return None
    return sum(a == b for a, b in zip(translations, reference_))


def machine() -> dict:
    from threadpoolctl import threadpool_info

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "numpy": np.__version__,
            "blas": [(i["internal_api"], i.get("version"), i.get("architecture")) for i in threadpool_info()
                     if i["user_api"] == "blas"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="sample,600M")
    parser.add_argument("--sentences", type=int, default=None,
                        help="sentences a model (default: 500 for sample, 20 for 600M)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads of the wall-time runs")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--other-python", default="/tmp/tfenv/bin/python",
                        help="an interpreter with torch, transformers, sentencepiece and ctranslate2")
    parser.add_argument("--model-dir", default="/tmp/nllb-cpu-600M", help="where the 600M shape's random model is built")
    parser.add_argument("--max-length-600M", type=int, default=24)
    parser.add_argument("--profile", action="store_true", help="also where nllb's CPU time goes (cProfile)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    engines = [e for e in args.engines.split(",") if e]  # none: --profile alone
    if unknown := set(engines) - set(ENGINES):
        parser.error(f"unknown engines {sorted(unknown)}: pick among {', '.join(ENGINES)}")
    beams = [int(b) for b in args.beams.split(",")]
    with open(args.out, "a", encoding="utf-8") as out:
        def emit(record: dict) -> None:
            line = json.dumps(record)
            print(line, flush=True)
            out.write(line + "\n")
            out.flush()

        emit({"what": "setup", "machine": machine(), "args": vars(args),
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        for model in args.models.split(","):
            if model == "sample":
                model_dir, max_length, n = str(SAMPLE), 200, args.sentences or 500
            elif model == "600M":
                from bench.e2e import build_model

                built = build_model(Path(args.model_dir), "nllb-200-distilled-600M", 0)
                emit({"what": "build", **built})
                model_dir, max_length, n = args.model_dir, args.max_length_600M, args.sentences or 20
            else:
                parser.error(f"unknown model {model}: sample or 600M")
            parts = directions(n)
            results = {}
            for name, compute_type in NLLB.items():
                if name in engines:
                    results[name] = {"setup": {"numpy": np.__version__}, "beams": nllb_side(
                        model_dir, parts, beams, max_length, args.threads, args.repeats, compute_type)}
            others = [e for e in engines if e not in NLLB]
            if others:
                with tempfile.TemporaryDirectory(prefix="nllb-cpu-") as work:
                    results.update(others_side(args.other_python, others, model_dir, parts, beams, max_length,
                                               args.threads, args.repeats, Path(work)))
            for beam in map(str, beams):
                ours = results.get("nllb", {}).get("beams", {}).get(beam, {}).get("translations")
                theirs = results.get("transformers", {}).get("beams", {}).get(beam, {}).get("translations")
                for engine, result in results.items():
                    r = result["beams"][beam]
                    emit({"what": "engine", "model": model, "engine": engine, "beam_size": int(beam), "sentences": n,
                          "max_length": max_length, "cpu_s_1_thread": r["cpu_s"], "threads": args.threads,
                          "wall_s": r["wall_s"], "wall_cpu_s": r["wall_cpu_s"],
                          "same_as_nllb": agreement(r["translations"], ours),
                          "same_as_transformers": agreement(r["translations"], theirs), "setup": result["setup"],
                          "first_differences": [
                              {"i": i, "engine": a, "nllb": b} for i, (a, b) in enumerate(zip(r["translations"], ours or []))
                              if a != b][:3]})
            if args.profile:
                for beam in beams:
                    emit({"what": "profile", "model": model, "beam_size": beam, "sentences": n,
                          **profile_nllb(model_dir, parts, beam, max_length)})


if __name__ == "__main__":
    main()
