"""How many flagged rows --retry-flagged clears, on the sample model, with inputs built to make it loop and
hallucinate: short phrases of the held-out English sentences repeated 5 to 20 times, words repeated alone,
out-of-domain strings (code, URLs, symbols, sentences of other topics), and held-out sentences three at a time
translated whole (--no-split). The figures of docs/FLAGS.md, Retry.

    python -m bench.flags              # the CPU engine, about a minute

Each pass translates the rows eng_Latn -> fra_Latn with the flags repetition, length_ratio, low_score
(--min-score -0.5) and copy, through the chunk worker every runner uses: first without the retry, then with it
(its default configuration), for greedy search and for beam search (4 beams, the model's default). Printed: the
rows flagged and each flag's count, before and after.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from pathlib import Path

from nllbcli.io import Record
from nllbcli.job.chunks import ChunkWorker
from nllbcli.job.flags import flag_names
from nllbcli.model.translator import load_translator
from nllbcli.options import BatchOptions, DecodeOptions, Job

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT / "data" / "samples" / "heldout"
MIN_SCORE = -0.5  # below every held-out translation's log-probability per token (the least: -0.38,
#                   bench.length_ratio --bands)
OUT_OF_DOMAIN = [
    "The mitochondria is the powerhouse of the cell.", "SELECT * FROM users WHERE id = 42;", "lol",
    "Ω≈ç√∫˜µ≤≥÷", "asdf qwer zxcv uiop hjkl", "I I I I I I I I I I I I", "12 12 12 12 12 12 12 12",
    "The quick brown fox jumps over the lazy dog.", "Quantum chromodynamics describes the strong interaction.",
    "Click here to unsubscribe from our newsletter.", "Terms and conditions apply. See store for details.",
    "https://example.com/index.html?id=12345&lang=en", "Error: segmentation fault (core dumped)",
    "Please find attached the invoice for your order.", "Thank you! Thank you! Thank you! Thank you!",
    "ha ha ha ha ha ha ha ha", "#include <stdio.h> int main() { return 0; }", "NLLB-200 translates 200 languages.",
    "Photosynthesis converts light into chemical energy.", "The committee postponed the vote indefinitely.",
]


def loop_inputs(seed: int = 1234) -> dict[str, list[tuple[str, bool]]]:
    """The rows (text, split) of each kind: repeated phrases and words, out-of-domain strings, sentences three
    at a time whole."""
    rng = random.Random(seed)
    sentences = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()
    repeated = []
    for _ in range(40):  # a phrase of 1 to 4 words of a held-out sentence, 5 to 20 times over
        words = rng.choice(sentences).rstrip(".").split()
        start = rng.randrange(len(words))
        phrase = " ".join(words[start:start + rng.randint(1, 4)])
        repeated.append((" ".join([phrase] * rng.choice((5, 10, 20))), True))
    whole = [(" ".join(sentences[3 * n:3 * n + 3]), False) for n in range(20)]  # translated whole (--no-split)
    return {"repeated phrases (40)": repeated, "out of domain (20)": [(text, True) for text in OUT_OF_DOMAIN],
            "3 sentences whole (20)": whole}


def run(translator, rows: list[tuple[str, bool]], decode: DecodeOptions, retry: bool) -> tuple[int, Counter, int]:
    """The rows flagged (cut alone aside), each flag's count, and the rows retried."""
    if not rows:
        return 0, Counter(), 0
    counts, flagged, retried = Counter(), 0, 0
    for split in (True, False):
        texts = [text for text, s in rows if s == split]
        records = [Record(n, text, {"text": text}, None, f"row {n + 1}") for n, text in enumerate(texts)]
        job = Job(src="eng_Latn", tgt="fra_Latn", split=split, flags=("repetition", "length_ratio", "copy"),
                  min_score=MIN_SCORE, retry_flagged=retry)
        for outcome in ChunkWorker(translator, job, decode, BatchOptions())(records):
            names = [name for name in flag_names(outcome) if name != "cut"]
            counts.update(names)
            flagged += bool(names)
            retried += outcome.retried
    return flagged, counts, retried


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    translator = load_translator(str(ROOT / "data" / "samples" / "model"), "cpu")
    print(f"flags repetition, length_ratio, low_score (--min-score {MIN_SCORE}), copy, max_length")
    print("| rows | first pass | flagged | flagged after --retry-flagged | flags before | flags after |")
    print("|---|---|---|---|---|---|")
    shown = lambda c: ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "none"  # noqa: E731
    for kind, rows in loop_inputs().items():
        for name, decode in (("greedy", DecodeOptions(beam_size=1)), ("beam 4", DecodeOptions(beam_size=4))):
            before, counts, _ = run(translator, rows, decode, False)
            after, counts_after, _ = run(translator, rows, decode, True)
            print(f"| {kind} | {name} | {before} | {after} | {shown(counts)} | {shown(counts_after)} |")


if __name__ == "__main__":
    main()
