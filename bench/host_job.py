"""The whole job's host side on the CPU (no GPU): `translate_file` over N lines with a stand-in translator
whose generate takes as long as the GPU would (generated tokens / --rate) and returns made-up ids. Of each of
its 40 steps it spends --gil-share in Python, holding the GIL as the engine's kernel launches do, and sleeps
the rest (the GIL free, as in the engine's waits). Prints the job's time against generate's own: the share of
the job the host's work does not hide (C of issue 5). On the H200 a greedy step of 4,096 rows takes ~14 ms
of GPU time and its ~250 launches a few ms of Python.

    python bench/host_job.py [--rows 100000] [--rate 280000] [--gil-share 0.2] [--profile]

A rough aid for profiling the host side, not a measure of C: it rated a finisher thread for decoding and
committing 0.81 against 0.73 (at --gil-share 0.2 to 0.4), where the GPU measured it 0.78 against 0.79-0.85
(docs/PERF.md, fifth session). The stand-in's Python is not the engine's: the GPU idles only when the
launches fall a whole queued step behind.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nllbcli.checkpoint import ModelConfig  # noqa: E402
from nllbcli.options import GPU_BATCHING, DecodeOptions  # noqa: E402
from nllbcli.pipeline import Job, translate_file  # noqa: E402
from nllbcli.tokenizer import tokenizer_from_model_dir  # noqa: E402

WORDS = "the red car is in garden on monday it was there tuesday too number of my uncle went to rome friday".split()
NEW_TOKENS = 39  # after the language token, as the harness's 40


class SleepingTranslator:
    device = "cuda"  # the GPU's chunking (a small first chunk)

    def __init__(self, rate: float, gil_share: float):
        self.model_dir = str(ROOT / "data" / "samples" / "model")
        self.config = ModelConfig.from_json(Path(self.model_dir) / "config.json")
        self.tokenizer = tokenizer_from_model_dir(Path(self.model_dir), self.config)
        self.rate, self.gil_share, self.slept, self.calls = rate, gil_share, 0.0, 0
        self.outputs = np.random.default_rng(0).integers(4, 3000, size=(1000, NEW_TOKENS)).tolist()

    def generate(self, sources, tgt_lang, options):
        seconds = len(sources) * NEW_TOKENS / self.rate
        step = seconds / (NEW_TOKENS + 1)
        for _ in range(NEW_TOKENS + 1):
            launched = time.perf_counter() + step * self.gil_share
            while time.perf_counter() < launched:  # Python, as the launches: the GIL taken, other threads switched in
                pass
            time.sleep(step * (1 - self.gil_share))
        self.slept += seconds
        self.calls += 1
        return [self.outputs[i % 1000] for i in range(len(sources))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100000)
    parser.add_argument("--rate", type=float, default=280000, help="the engine's generated tokens/s (default: the H200's greedy)")
    parser.add_argument("--gil-share", type=float, default=0.2, help="the part of each step spent in Python (default 0.2)")
    parser.add_argument("--profile", action="store_true", help="cProfile the main thread")
    args = parser.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as work:
        source = Path(work) / "in.txt"
        source.write_text("".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 45))).capitalize() + ".\n"
                                  for _ in range(args.rows)))
        translator = SleepingTranslator(args.rate, args.gil_share)
        job = Job("eng_Latn", "fra_Latn", input=str(source), output=str(Path(work) / "out.txt"))
        profile = cProfile.Profile() if args.profile else None
        start = time.perf_counter()
        if profile:
            profile.enable()
        translate_file(translator, job, DecodeOptions(beam_size=1, max_length=NEW_TOKENS + 1), GPU_BATCHING)
        if profile:
            profile.disable()
        wall = time.perf_counter() - start
    print(f"{args.rows} rows: job {wall:.2f} s, generate's own time {translator.slept:.2f} s in {translator.calls} "
          f"batches: {translator.slept / wall:.3f}")
    if profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
