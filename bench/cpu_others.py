"""The transformers and CTranslate2 sides of bench/cpu.py, run by it in another interpreter (one with torch,
transformers, sentencepiece and ctranslate2; nllbcli does not depend on them). It
imports neither nllbcli nor bench; bench.cpu times its nllb side with this file's run().

    PYTHON bench/cpu_others.py JOB.json RESULT.json

JOB.json: {"model_dir", "work" (a directory for CTranslate2's converted models), "engines" (of transformers, ct2,
ct2-int8), "directions": [{"src", "tgt", "texts"}], "beams", "max_length", "threads" (the wall-time thread
count), "repeats", "batch"}. RESULT.json: per engine, its set-up, and per beam size the CPU seconds of each run
at one thread (time.process_time), the wall seconds of each run at `threads` threads (time.perf_counter), and
the translations (in the directions' order). Every timed run follows an untimed warm-up run of the same work.

max_length is nllb's (tokens generated after the decoder start, the language token included): transformers'
max_new_tokens; CTranslate2's max_decoding_length counts the target prefix (the language token) too, so it is the
same number (checked by bench/cpu.py on a model that never ends a sentence).
"""

import json
import os
import sys
import time


def transformers_engine(job: dict):
    import torch
    from transformers import M2M100ForConditionalGeneration, NllbTokenizer

    tokenizer = NllbTokenizer.from_pretrained(job["model_dir"])
    model = M2M100ForConditionalGeneration.from_pretrained(job["model_dir"], dtype=torch.float32).eval()

    def translate(direction: dict, beams: int) -> list[str]:
        tokenizer.src_lang = direction["src"]
        texts = direction["texts"]
        order = sorted(range(len(texts)), key=lambda i: len(tokenizer(texts[i])["input_ids"]))
        out: list[str] = [""] * len(texts)
        tgt_id = tokenizer.convert_tokens_to_ids(direction["tgt"])
        with torch.inference_mode():
            for first in range(0, len(order), job["batch"]):
                rows = order[first : first + job["batch"]]
                batch = tokenizer([texts[i] for i in rows], return_tensors="pt", padding=True)
                ids = model.generate(**batch, forced_bos_token_id=tgt_id, num_beams=beams, do_sample=False,
                                     max_new_tokens=job["max_length"], length_penalty=1.0, early_stopping=False,
                                     no_repeat_ngram_size=0, num_return_sequences=1)
                for i, text in zip(rows, tokenizer.batch_decode(ids, skip_special_tokens=True)):
                    out[i] = text
        return out

    return translate, torch.set_num_threads, {"torch": torch.__version__, "dtype": "float32"}


def ct2_engine(job: dict, compute_type: str):
    import ctranslate2
    from transformers import NllbTokenizer

    tokenizer = NllbTokenizer.from_pretrained(job["model_dir"])
    converted = os.path.join(job["work"], f"ct2-{compute_type}")
    start = time.perf_counter()
    if not os.path.isfile(os.path.join(converted, "model.bin")):
        ctranslate2.converters.TransformersConverter(job["model_dir"]).convert(converted, quantization=compute_type,
                                                                               force=True)
    convert_s = time.perf_counter() - start
    translators: dict[int, object] = {}

    def threads(n: int) -> None:
        if n not in translators:
            translators[n] = ctranslate2.Translator(converted, device="cpu", compute_type=compute_type,
                                                    inter_threads=1, intra_threads=n)
        translators["now"] = translators[n]

    def translate(direction: dict, beams: int) -> list[str]:
        tokenizer.src_lang = direction["src"]
        tokens = [tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"]) for text in direction["texts"]]
        results = translators["now"].translate_batch(
            tokens, target_prefix=[[direction["tgt"]]] * len(tokens), beam_size=beams, length_penalty=1.0,
            max_decoding_length=job["max_length"], max_batch_size=job["batch"], batch_type="examples")
        return [tokenizer.decode(tokenizer.convert_tokens_to_ids(r.hypotheses[0][1:]), skip_special_tokens=True)
                for r in results]

    return translate, threads, {"ctranslate2": ctranslate2.__version__, "compute_type": compute_type,
                                "convert_s": round(convert_s, 2)}


def run(job: dict, translate, set_threads) -> dict:
    def once(beams: int) -> list[str]:
        return [text for direction in job["directions"] for text in translate(direction, beams)]

    result = {}
    for beams in job["beams"]:
        record = {"cpu_s": [], "wall_s": [], "wall_cpu_s": []}
        set_threads(1)
        translations = once(beams)  # warm-up
        for _ in range(job["repeats"]):
            start = time.process_time()
            once(beams)
            record["cpu_s"].append(round(time.process_time() - start, 3))
        set_threads(job["threads"])
        once(beams)
        for _ in range(job["repeats"]):
            start, cpu = time.perf_counter(), time.process_time()
            once(beams)
            record["wall_s"].append(round(time.perf_counter() - start, 3))
            record["wall_cpu_s"].append(round(time.process_time() - cpu, 3))
        record["translations"] = translations
        result[str(beams)] = record
    return result


def main() -> None:
    job_path, result_path = sys.argv[1:3]
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    results = {}
    for engine in job["engines"]:
        if engine == "transformers":
            translate, set_threads, setup = transformers_engine(job)
        else:
            translate, set_threads, setup = ct2_engine(job, "int8" if engine == "ct2-int8" else "float32")
        results[engine] = {"setup": setup, "beams": run(job, translate, set_threads)}
        print(json.dumps({engine: {b: {k: v for k, v in r.items() if k != "translations"}
                                   for b, r in results[engine]["beams"].items()}}), file=sys.stderr, flush=True)
    with open(result_path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(results, f)
    os.replace(result_path + ".tmp", result_path)


if __name__ == "__main__":
    main()
