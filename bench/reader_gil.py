"""How the pipeline's reader (prepare_records: splitting and tokenizing a chunk) fares when another thread
wants the GIL, as the main thread does while it drives the GPU. CPU only, the sample model's tokenizer.

    python bench/reader_gil.py [--rows 20000]

Prints the reader's time for the rows alone, and with a main thread that spins in Python meanwhile (the
worst case: the real main thread mostly waits on the GPU, without the GIL). A reader that holds the GIL in
long stretches of Python slows down many times over against the spinning thread; one whose work is mostly
inside calls that release the GIL (sentencepiece's batch encode) hardly does.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nllbcli.io import Record  # noqa: E402
from nllbcli.pipeline import SWITCH_INTERVAL, Job, prepare_records  # noqa: E402
from nllbcli.tokenizer import tokenizer_from_model_dir  # noqa: E402

WORDS = "the red car is in garden on monday it was there tuesday too number of my uncle went to rome friday".split()


class Translator:  # what prepare_records reads of a translator
    def __init__(self):
        self.tokenizer = tokenizer_from_model_dir(ROOT / "data" / "samples" / "model")
        self.config = type("Config", (), {"max_position_embeddings": 1024})()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20000)
    args = parser.parse_args()
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))).capitalize() + "." for _ in range(args.rows)]
    records = [Record(i, text, {}) for i, text in enumerate(texts)]
    translator, job = Translator(), Job("eng_Latn", "fra_Latn")
    prepare_records(translator, records[:100], job)  # warm-up
    t0 = time.perf_counter()
    prepare_records(translator, records, job)
    alone = time.perf_counter() - t0
    sys.setswitchinterval(SWITCH_INTERVAL)  # as the pipeline sets it while its reader runs
    took = []

    def reader() -> None:
        start = time.perf_counter()
        prepare_records(translator, records, job)
        took.append(time.perf_counter() - start)

    thread = threading.Thread(target=reader)
    thread.start()
    while thread.is_alive():  # the main thread wants the GIL all the time
        pass
    print(f"{args.rows} rows: reader alone {alone:.2f} s, against a spinning main thread {took[0]:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
