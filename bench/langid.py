"""How well --src auto detects a row's language, and what it costs (docs/LANGUAGES.md, "Detecting the source
language"). Under a minute on the CPU; no GPU, no network.

  python -m bench.langid [--thresholds 0.3,0.5,0.7] [--locale-dir /usr/share/locale]

It prints, as Markdown tables:
- the sample model's held-out sentences (data/samples/heldout/*.txt): per language, the rows detected right,
  detected as another of the model's languages, and not detected (a language the model lacks, or a confidence
  below the threshold), at MIN_CONFIDENCE and at each of --thresholds;
- mixed rows: two held-out sentences of two languages in one row, and two of one language, as the job's
  per-sentence rule (job.rows.sentence_languages) gives them their languages: how many rows come out with each
  sentence in its own language, and how many one-language rows are taken for mixed ones;
- Debian's gettext catalogues (the messages of apt, dpkg and coreutils translated into dozens of languages, which
  the system's packages install under /usr/share/locale): a multilingual text of real sentences, each message
  of at least 30 letters, detected against NLLB-200's codes, per language and in all;
- the cost: what --src auto adds to a row's preparation (job.rows.prepare_records, which splits and tokenizes:
  rows of one sentence, and of three), against the sample model's CPU translation of the row, and against GPU
  rates of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import gettext
import re
import time
from pathlib import Path

from nllbcli.errors import NllbError
from nllbcli.model.langid import MIN_CONFIDENCE, detect_languages, load_detector
from nllbcli.model.langs import FLORES_200_CODES, resolve_lang

HELDOUT = Path("data/samples/heldout")
SAMPLE_MODEL = Path("data/samples/model")
SAMPLE_CODES = ("eng_Latn", "fra_Latn", "deu_Latn", "spa_Latn", "ita_Latn")
CATALOGUES = ("apt.mo", "libapt-pkg6.0.mo", "dpkg.mo", "coreutils.mo")
FORMAT = re.compile(r"%[-+ #0-9.*lhzjtqL']*[a-zA-Z%]|\$\{?\w+\}?|\\[nt]|[<>{}\[\]`'\"_/=|]")


def heldout() -> dict[str, list[str]]:
    return {path.stem: path.read_text(encoding="utf-8").splitlines() for path in sorted(HELDOUT.glob("*.txt"))}


def tally(expected: list[str], texts: list[str], codes: tuple[str, ...], threshold: float) -> tuple[int, int, int]:
    """(right, wrong, not detected) of texts against their expected codes."""
    found = detect_languages(texts, codes, threshold)
    right = sum(f.code == e for f, e in zip(found, expected))
    missing = sum(f.code is None for f in found)
    return right, len(texts) - right - missing, missing


def heldout_table(thresholds: list[float]) -> None:
    sentences = heldout()
    print(f"\nHeld-out sentences of the sample model (its 5 languages' codes), threshold {MIN_CONFIDENCE}:\n")
    print("| language | rows | right | another of the 5 | not detected |\n|---|---|---|---|---|")
    totals = [0, 0, 0, 0]
    for code, texts in sentences.items():
        right, wrong, missing = tally([code] * len(texts), texts, SAMPLE_CODES, MIN_CONFIDENCE)
        print(f"| {code} | {len(texts)} | {right} | {wrong} | {missing} |")
        totals = [a + b for a, b in zip(totals, (len(texts), right, wrong, missing))]
    print(f"| all | {totals[0]} | {totals[1]} ({100 * totals[1] / totals[0]:.1f}%) | {totals[2]} | {totals[3]} |")
    print("\nAll held-out sentences at other thresholds:\n")
    print("| threshold | right | another of the 5 | not detected |\n|---|---|---|---|")
    expected = [code for code, texts in sentences.items() for _ in texts]
    texts = [text for each in sentences.values() for text in each]
    for threshold in sorted({0.0, *thresholds, MIN_CONFIDENCE}):
        right, wrong, missing = tally(expected, texts, SAMPLE_CODES, threshold)
        print(f"| {threshold} | {right} | {wrong} | {missing} |")


def mixed_table() -> None:
    from nllbcli.job.rows import sentence_languages

    sentences = heldout()
    codes = list(sentences)
    mixed = right_mixed = same = taken_mixed = 0
    for a in codes:
        for b in codes:
            for first, second in zip(sentences[a][:20], sentences[b][20:40]):
                row = detect_languages([f"{first} {second}"], SAMPLE_CODES)[0]
                parts = detect_languages([first, second], SAMPLE_CODES)
                languages = sentence_languages(row, parts)
                if a != b:
                    mixed += 1
                    right_mixed += languages == [a, b]
                else:
                    same += 1
                    taken_mixed += languages is not None and len(set(languages)) > 1
    print("\nRows of two held-out sentences, each sentence's language by the per-sentence rule:\n")
    print("| rows | each sentence in its own language | one-language rows taken for mixed |\n|---|---|---|")
    print(f"| {mixed} mixed, {same} of one language | {right_mixed} of {mixed} ({100 * right_mixed / mixed:.0f}%) | "
          f"{taken_mixed} of {same} |")


def catalogue_messages(locale_dir: Path, language: str) -> list[str]:
    """A language's translated messages of CATALOGUES, format directives and markup taken out, each of at least 30
    letters, once each."""
    messages = {}
    for name in CATALOGUES:
        path = locale_dir / language / "LC_MESSAGES" / name
        if not path.is_file():
            continue
        with open(path, "rb") as file:
            catalogue = gettext.GNUTranslations(file)._catalog  # noqa: SLF001 - the messages, without a lookup each
        for key, text in catalogue.items():
            if not key or not isinstance(text, str):
                continue
            text = " ".join(FORMAT.sub(" ", text).split())
            if sum(char.isalpha() for char in text) >= 30:
                messages[text] = None
    return list(messages)


def catalogue_table(locale_dir: Path) -> None:
    if not locale_dir.is_dir():
        print(f"\n{locale_dir} is not here: no gettext catalogues measured.")
        return
    rows, all_right, all_wrong, all_missing = [], 0, 0, 0
    for folder in sorted(p.name for p in locale_dir.iterdir()):
        try:
            expected = resolve_lang(folder.split("@")[0].replace("_", "-"), FLORES_200_CODES)
        except NllbError:
            continue  # a language NLLB lacks, or a locale name langcodes cannot read
        texts = catalogue_messages(locale_dir, folder)
        if len(texts) < 20:
            continue
        right, wrong, missing = tally([expected] * len(texts), texts, FLORES_200_CODES, MIN_CONFIDENCE)
        rows.append((folder, expected, len(texts), right, wrong, missing))
        all_right, all_wrong, all_missing = all_right + right, all_wrong + wrong, all_missing + missing
    total = all_right + all_wrong + all_missing
    print(f"\nDebian's gettext catalogues ({', '.join(CATALOGUES)} under {locale_dir}), detected among NLLB-200's "
          f"codes, threshold {MIN_CONFIDENCE}:\n")
    print("| locale | NLLB code | messages | right | another language | not detected |\n|---|---|---|---|---|---|")
    for folder, expected, count, right, wrong, missing in rows:
        print(f"| {folder} | {expected} | {count} | {right} ({100 * right / count:.0f}%) | {wrong} | {missing} |")
    print(f"| all {len(rows)} | | {total} | {all_right} ({100 * all_right / total:.1f}%) | {all_wrong} | {all_missing} |")


def cost_table() -> None:
    from nllbcli.api import load

    sentences = [text for texts in heldout().values() for text in texts]
    rows = {"a sentence": sentences, "three sentences": [" ".join(sentences[n:n + 3]) for n in range(0, 498, 3)]}
    started = time.perf_counter()
    load_detector.cache_clear()
    load_detector()
    loaded = time.perf_counter() - started
    translator = load(str(SAMPLE_MODEL), device="cpu")
    translate = sample_translation_cost(translator, sentences[:40])
    print(f"\nCost on this CPU of a row's preparation (job.rows.prepare_records: split, tokenize, and with --src "
          f"auto detect), the best of 5 (detector loaded in {loaded * 1e3:.0f} ms, once a process):\n")
    print("| rows of | prepared, --src eng_Latn | --src auto | detection, µs a row | against the sample model's CPU "
          "translation of the row |\n|---|---|---|---|---|")
    costs = {}
    for name, texts in rows.items():
        given, auto = (min(prepared(translator, texts, src) for _ in range(5)) for src in ("eng_Latn", "auto"))
        costs[name] = auto - given
        sentences_a_row = 1 if name == "a sentence" else 3
        print(f"| {name} | {given:.1f} µs | {auto:.1f} µs | {auto - given:.1f} | "
              f"{100 * (auto - given) / (translate * sentences_a_row):.2f}% of {translate * sentences_a_row / 1e3:.1f} ms |")
    for rate in (2000, 5000, 10000):
        per_row = 1e6 / rate
        print(f"\nAt a GPU job's {rate:,} rows/s ({per_row:.0f} µs a row) a one-sentence row's detection is "
              f"{100 * costs['a sentence'] / per_row:.1f}% of a row's time on one thread.")


def prepared(translator, texts: list[str], src: str) -> float:
    """µs a row of prepare_records for these rows."""
    from nllbcli.io import Record
    from nllbcli.job.rows import prepare_records
    from nllbcli.options import Job

    job = Job(src=src, tgt="fra_Latn", on_error="skip")
    records = [Record(n, text, {"text": text}, where=f"row {n + 1}") for n, text in enumerate(texts)]
    started = time.perf_counter()
    prepare_records(translator, records, job)
    return (time.perf_counter() - started) / len(texts) * 1e6


def sample_translation_cost(translator, sentences: list[str]) -> float:
    """The sample model's CPU translation of a sentence, greedy, in µs."""
    from nllbcli.api import translate
    from nllbcli.options import DecodeOptions

    decode = DecodeOptions(beam_size=1)
    translate(translator, sentences[:4], "eng_Latn", "fra_Latn", decode)
    started = time.perf_counter()
    translate(translator, sentences, "eng_Latn", "fra_Latn", decode)
    return (time.perf_counter() - started) / len(sentences) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--thresholds", default="0.3,0.5,0.7,0.9")
    parser.add_argument("--locale-dir", default="/usr/share/locale", type=Path)
    args = parser.parse_args()
    heldout_table([float(t) for t in args.thresholds.split(",")])
    mixed_table()
    catalogue_table(args.locale_dir)
    cost_table()


if __name__ == "__main__":
    main()
