"""`nllb score` against greedy translation of the same pairs (issue 44): is scoring a translation at least as fast
as making it?

Engine alone: the Translator's generate_hypotheses, greedy with a fixed output length (bench/e2e.py's random
model: 40 generated tokens a sentence, the language token included), then forced decoding (score_targets) of the
translations it made, on the same length-sorted batches; each warmed up once, then timed (median of --repeats).
Whole jobs: `nllb translate --beam-size 1 --scores` on the sentences, then `nllb score` on its output, the rows/s
and tokens/s of each one's summary line. One JSON line per measurement into --out.

On the GPU (the 600M shape; about 2-3 minutes with the model built and the kernels compiled on the first run):

    python3 -m bench.score_speed --model-dir /tmp/e2e-model --cache-dir /tmp/e2e-cupy --out $OUT/score.jsonl

Here, on the CPU (a smoke run, tiny shape):

    .venv/bin/python -m bench.score_speed --device cpu --shape tiny --sentences 64 --batch 32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.e2e import make_sentences, model_and_cache, summary_of
from nllbcli.model.shapes import DEFAULT

NEW_TOKENS = 40  # generated tokens a sentence, the language token included (the random model never ends sooner)


def timed(fn, repeats: int, sync) -> tuple[float, object]:
    """The median seconds of `repeats` runs of fn after one warm-up, and its last result."""
    result = fn()
    sync()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        sync()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), result


def engine_alone(args, model_dir: Path, lines: list[str]) -> list[dict]:
    from nllbcli.model.translator import load_translator
    from nllbcli.options import DecodeOptions

    translator = load_translator(str(model_dir), args.device)
    sync = (lambda: __import__("cupy").cuda.Device().synchronize()) if args.device != "cpu" else (lambda: None)
    sources = sorted((translator.tokenizer.encode(line, "eng_Latn") for line in lines), key=len, reverse=True)
    batches = [sources[i : i + args.batch] for i in range(0, len(sources), args.batch)]
    greedy = DecodeOptions(beam_size=1, max_length=NEW_TOKENS)

    def translate_all():
        return [translator.generate_hypotheses(batch, "fra_Latn", greedy) for batch in batches]

    seconds, found = timed(translate_all, args.repeats, sync)
    targets = [[h[0].ids for h in batch] for batch in found]
    tokens = sum(len(ids) + 1 for batch in targets for ids in batch)  # the language token, then the pieces

    def score_all():
        return [translator.generate_hypotheses(batch, "fra_Latn", greedy, targets=given)
                for batch, given in zip(batches, targets)]

    scoring, scored = timed(score_all, args.repeats, sync)
    scored_tokens = sum(len(h[0].token_log_probs) for batch in scored for h in batch)  # the pieces and </s>
    return [{"measure": "engine", "what": "greedy translate", "sentences": len(sources), "batch": args.batch,
             "seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds},
            {"measure": "engine", "what": "score", "sentences": len(sources), "batch": args.batch,
             "seconds": scoring, "tokens": scored_tokens, "tokens_per_s": scored_tokens / scoring,
             "speed_vs_greedy": seconds / scoring}]


def whole_jobs(args, model_dir: Path, cache_dir: Path, lines: list[str], work: Path) -> list[dict]:
    source = work / "in.jsonl"
    source.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines), encoding="utf-8")
    env = {**os.environ, "CUPY_CACHE_DIR": str(cache_dir)}
    common = ["-m", str(model_dir), "--src", "eng_Latn", "--tgt", "fra_Latn", "--device", args.device, "--force",
              "--progress", "json"]
    commands = {
        "translate": ["translate", *common, "--beam-size", "1", "--max-length", str(NEW_TOKENS), "--scores",
                      "--score-field", "search_score", "--log-prob-field", "search_log_prob", str(source), str(work / "out.jsonl")],
        "score": ["score", *common, str(work / "out.jsonl"), str(work / "scored.jsonl")],
    }
    records = []
    for what, command in commands.items():
        stderr = work / f"{what}.stderr"
        with open(stderr, "w") as err:
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "nllbcli", *command], env=env, stdout=subprocess.DEVNULL,
                                  stderr=err, timeout=args.timeout)
        records.append({"measure": "job", "what": what, "rc": done.returncode, "wall_s": time.perf_counter() - start,
                        "summary": summary_of(stderr), **({} if done.returncode == 0 else {"stderr": stderr.read_text()[-500:]})})
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", default=DEFAULT)  # bench.e2e's shapes: nllbcli/model/shapes.py's, or tiny
    parser.add_argument("--seed", type=int, default=1)  # bench.e2e's: its model directory is reused
    parser.add_argument("--sentences", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--cache-dir", type=Path)
    parser.add_argument("--timeout", type=float, default=280)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir, _, cache_dir, tokenizer = model_and_cache(args, work)
        os.environ["CUPY_CACHE_DIR"] = str(cache_dir)
        lines = make_sentences(args.sentences, args.seed, tokenizer, "eng_Latn")
        records = engine_alone(args, model_dir, lines) + whole_jobs(args, model_dir, cache_dir, lines, work)
    with open(args.out, "a") if args.out else sys.stdout as out:
        for record in records:
            out.write(json.dumps({**record, "shape": args.shape, "device": args.device}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
