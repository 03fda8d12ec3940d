"""What a job's own work (detection, flags, status fields, reading and writing) costs beside a GPU, measured on any
machine: `nllb translate` with the translator's search replaced by a stand-in that waits as long as the GPU engine
would take (--rate generated tokens/s, a step at a time, the GIL released as a CUDA wait releases it) and gives
each sentence the same --tokens pieces of the sample model's vocabulary. Each variant runs in a process of its own
(--repeat times, the variants interleaved), on bench.e2e's sentences as JSONL; prints each run's job seconds (the
summary's, after the model's load) and the median against the plain job's.

    python -m bench.job_cost [--sentences 20000] [--rate 270000] [--repeat 2] [--variants plain,auto,flags,status]

A stand-in is not the GPU: it shows what the job's threads cost while the engine waits, not how the engine's
own host work shares the CPU with them (bench.e2e --measure C on a GPU does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAMPLE = Path("data/samples/model")
FLAGS = ["--flags", "repetition,wrong_language,length_ratio,copy,low_score", "--min-score", "-1"]
VARIANTS = {
    "plain": [],
    "auto": ["--src", "auto", "--on-error", "skip"],
    "flags": FLAGS,
    "status": [*FLAGS, "--status-field", "status"],
}
STEPS = 40  # a batch's decoder steps: the stand-in's waits


def stand_in(rate: float, tokens: int):
    """A Translator.generate_hypotheses that waits as long as the engine would: STEPS waits a batch, each of a
    step's share of len(sources) x tokens / rate seconds."""
    from nllbcli.model.search import Hypothesis

    ids = list(range(1000, 1000 + tokens))

    def generate_hypotheses(self, sources, tgt_lang, options, keys=None, prefixes=None, targets=None):
        for _ in range(STEPS):
            time.sleep(len(sources) * tokens / rate / STEPS)
        return [[Hypothesis(ids, -1.0, -1.0)] for _ in sources]

    return generate_hypotheses


def child(args: argparse.Namespace, command: list[str]) -> None:
    """This process runs `nllb` over `command` with the stand-in search."""
    from nllbcli.model import translator

    translator.Translator.generate_hypotheses = stand_in(args.rate, args.tokens)
    sys.argv = ["nllb", *command]
    from nllbcli.__main__ import main

    main()


def run(args: argparse.Namespace, variant: str, source: Path, work: Path) -> float:
    command = ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn", "--model", str(SAMPLE), "--device", "cpu",
               "--progress", "json", "--force", "--max-batch-tokens", "262144", "--chunk-rows", "8192",
               *VARIANTS[variant], str(source), str(work / f"{variant}.jsonl")]
    done = subprocess.run([sys.executable, "-m", "bench.job_cost", "--child", "--rate", str(args.rate),
                           "--tokens", str(args.tokens), "--", *command], capture_output=True, text=True)
    summaries = [json.loads(line) for line in done.stderr.splitlines() if line.startswith('{"event": "summary"')]
    if not summaries:
        raise SystemExit(f"{variant}: no summary (exit {done.returncode}): {done.stderr[-500:]}")
    return summaries[-1]["seconds"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=20000)
    parser.add_argument("--rate", type=float, default=270000,
                        help="the engine's generated tokens/s (600M on an H100: 270,000)")
    parser.add_argument("--tokens", type=int, default=39, help="pieces a translation, </s> aside")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--variants", default="plain,auto,flags,status")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args, args.command)
        return 0
    from bench.e2e import make_sentences
    from nllbcli.model.tokenizer import tokenizer_from_model_dir

    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}: {', '.join(VARIANTS)}")
    lines = make_sentences(args.sentences, 1, tokenizer_from_model_dir(SAMPLE), "eng_Latn")
    seconds: dict[str, list[float]] = {variant: [] for variant in variants}
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        source = work / "in.jsonl"
        source.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines), encoding="utf-8")
        for _ in range(args.repeat):
            for variant in variants:
                seconds[variant].append(run(args, variant, source, work))
    base = statistics.median(seconds["plain"]) if "plain" in seconds else None
    engine = args.sentences * args.tokens / args.rate
    print(f"{args.sentences:,} sentences, the stand-in engine {engine:.2f} s ({args.rate:,.0f} tokens/s)")
    for variant, runs in seconds.items():
        median = statistics.median(runs)
        cost = f", {median / base - 1:+.1%} against plain" if base else ""
        print(f"{variant:>7}: job seconds {', '.join(f'{s:.2f}' for s in runs)} (median {median:.2f}{cost})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
