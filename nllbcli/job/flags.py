"""Row flags: what marks a translated row as one to look at, each a small function with its definition
(docs/FLAGS.md). cut and max_length come of the source and the search (rows.prepare_records, chunks.translate_prepared);
the flags here are computed, where the job asks for them (Job.row_flags), from a row's sentences once they are
joined: its source pieces, its best hypotheses' pieces and log-probabilities, its texts.

    repetition      the translation repeats an n-gram of words back to back more than its source does
    wrong_language  the translation's detected language is not the target (a detector passed in)
    length_ratio    translation pieces / source pieces outside the direction's band
    low_score       log-probability per generated token below --min-score
    copy            the translation's letters are (nearly) the source's

And the retry's choice between a row's two translations (better_of).
"""

from __future__ import annotations

import difflib
import operator
import re
from collections import Counter
from functools import lru_cache
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import NllbError
from .rows import flag_names

if TYPE_CHECKING:
    from ..io import Record
    from ..options import Job
    from .rows import Outcome, Sentence
    from ..model.search import Hypothesis

Detect = Callable[[list[str], tuple[str, ...]], list[tuple[str | None, float]]]  # texts, the model's codes ->
#                                                         each text's detected code (None: unsure) and confidence


REPEAT_NGRAM = 8  # repetition: n-grams of 1 to this many words (characters: twice as many) are looked at ...
REPEAT_RUN = 4  # ... one back to back this many times or more is a loop, unless the source repeats an n-gram of
#                 a like size (half to twice as many words) as many times
COPY_SIMILARITY = 0.9  # copy: difflib's ratio of the two texts' letters (casefolded) at least this ...
COPY_MIN_LETTERS = 8  # ... where the source has this many letters or more (names, codes and numbers pass)
WRONG_LANGUAGE_CONFIDENCE = 0.5  # wrong_language: the detector's confidence at least this
LENGTH_RATIO_MIN_PIECES = 4  # length_ratio: sources of fewer pieces than this are not judged (their ratios vary)

# length_ratio's bands, translation pieces / source pieces, by direction: the sample model's 100 held-out sentences
# each way (python -m bench.length_ratio --bands), their least ratio / 1.25 to their largest x 1.25 (docs/FLAGS.md)
LENGTH_BANDS: dict[tuple[str, str], tuple[float, float]] = {
    ("deu_Latn", "eng_Latn"): (0.55, 2.0),
    ("deu_Latn", "fra_Latn"): (0.62, 2.04),
    ("deu_Latn", "ita_Latn"): (0.55, 1.61),
    ("deu_Latn", "spa_Latn"): (0.7, 1.88),
    ("eng_Latn", "deu_Latn"): (0.5, 1.79),
    ("eng_Latn", "fra_Latn"): (0.56, 1.67),
    ("eng_Latn", "ita_Latn"): (0.45, 1.48),
    ("eng_Latn", "spa_Latn"): (0.51, 1.61),
    ("fra_Latn", "deu_Latn"): (0.49, 1.61),
    ("fra_Latn", "eng_Latn"): (0.6, 1.78),
    ("fra_Latn", "ita_Latn"): (0.45, 1.43),
    ("fra_Latn", "spa_Latn"): (0.6, 1.61),
    ("ita_Latn", "deu_Latn"): (0.62, 1.79),
    ("ita_Latn", "eng_Latn"): (0.67, 2.23),
    ("ita_Latn", "fra_Latn"): (0.7, 2.23),
    ("ita_Latn", "spa_Latn"): (0.7, 1.95),
    ("spa_Latn", "deu_Latn"): (0.53, 1.43),
    ("spa_Latn", "eng_Latn"): (0.62, 1.94),
    ("spa_Latn", "fra_Latn"): (0.62, 1.67),
    ("spa_Latn", "ita_Latn"): (0.51, 1.43),
}
GENERAL_BAND = (0.4, 2.5)  # any other direction


def runs(units: Sequence, longest: int) -> list[int]:
    """runs[n]: the most times an n-gram of `units` occurs back to back (1: none repeats), for n 1 to `longest`
    (runs[0] is 1): run_count's, each."""
    return [1] + [run_count(units, n) for n in range(1, longest + 1)]


def run_count(units: Sequence, n: int) -> int:
    """The most times an n-gram of `units` occurs back to back (1: none repeats). Along a streak of m positions
    where units[i] == units[i - n], the n-gram repeats 1 + m // n times. (A shift's comparisons and streaks are
    counted in C: rows are judged by the hundred thousand.)"""
    if n > len(units) // 2:
        return 1
    same = bytes(map(operator.eq, units[n:], units))  # 1 where units[i] == units[i - n]
    return 1 + max(map(len, same.split(b"\0"))) // n


def repeats(units: Sequence[str], longest: int, times: int) -> bool:
    """Whether an n-gram of `units` (n 1 to `longest`) occurs `times` times back to back or more: runs' counts
    reaching `times`, found by one regular expression over the units as characters (in C; most rows have none)."""
    if not isinstance(units, str):  # words: each distinct one a character
        codes: dict[str, int] = {}
        numbers = [codes.setdefault(unit, len(codes)) for unit in units]
        if len(codes) > 0x10FFFF:  # more distinct words than characters: let runs count
            return True
        units = "".join(map(chr, numbers))
    return back_to_back(longest, times).search(units) is not None


@lru_cache(maxsize=None)
def back_to_back(longest: int, times: int) -> re.Pattern:
    return re.compile(r"(.{1,%d})\1{%d}" % (longest, times - 1), re.S)


def repetition_units(text: str) -> list[str] | str:
    """What repetition counts in: a text's words, casefolded, without the punctuation around them; the
    characters (spaces left out, as a string) of a text written mostly without spaces (under one space in 10
    characters: Chinese, Japanese, Thai)."""
    words = text.casefold().split()
    if len(text) > 10 * len(words):
        return "".join(words)
    return [word for word in (word.strip(PUNCTUATION) for word in words) if word]


PUNCTUATION = ".,;:!?¿¡\"'«»“”„‘’()[]{}-–—…。、，！？"


def is_repetition(source: str, translation: str, run: int = REPEAT_RUN) -> bool:
    """repetition: the translation has an n-gram (of 1 to REPEAT_NGRAM words) back to back `run` times or
    more, more times than the source repeats any n-gram of half to twice its size (a source that says "ha ha
    ha ha", or a phrase five times over, may be translated so)."""
    target = repetition_units(translation)
    longest = REPEAT_NGRAM if len(translation) <= 10 * max(1, len(translation.split())) else 2 * REPEAT_NGRAM
    if not repeats(target, longest, run):  # most rows: neither runs nor the source need be looked at
        return False
    units = repetition_units(source)
    given: dict[int, int] = {}  # the source's run_count of each size looked at: those of the loops' sizes only

    def source_run(size: int) -> int:
        if size not in given:
            given[size] = run_count(units, size)
        return given[size]

    for n in range(1, longest + 1):  # the smallest loop that the source does not explain answers
        count = run_count(target, n)
        if count >= run and count > max(source_run(size) for size in range((n + 1) // 2, 2 * n + 1)):
            return True
    return False


def letters(text: str) -> str:
    """A text's letters, casefolded: what copy compares (spaces, digits and punctuation left out)."""
    return "".join(filter(str.isalpha, text.casefold()))


def is_copy(source: str, translation: str) -> bool:
    """copy: the translation's letters are the source's, or nearly (difflib's ratio >= COPY_SIMILARITY), for a
    source of COPY_MIN_LETTERS letters or more. A row whose source and target languages are one is not judged."""
    a, b = letters(source), letters(translation)
    if len(a) < COPY_MIN_LETTERS:
        return False
    # difflib's real_quick_ratio and quick_ratio (bounds of its ratio from the lengths and from the letters
    # shared, counted in C here) before its ratio: most rows fail the bounds
    total = len(a) + len(b)
    if 2.0 * min(len(a), len(b)) / total < COPY_SIMILARITY:
        return False
    if 2.0 * sum((Counter(a) & Counter(b)).values()) / total < COPY_SIMILARITY:
        return False
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() >= COPY_SIMILARITY


def length_band(job: Job, src: str, tgt: str) -> tuple[float, float]:
    """length_ratio's band for a direction: the job's ends (--length-ratio), else the measured band's, else
    GENERAL_BAND's."""
    low, high = LENGTH_BANDS.get((src, tgt), GENERAL_BAND)
    return (low if job.length_ratio_min is None else job.length_ratio_min,
            high if job.length_ratio_max is None else job.length_ratio_max)


def is_length_off(source_pieces: int, translation_pieces: int, band: tuple[float, float]) -> bool:
    """length_ratio: translation pieces / source pieces outside the band, for a source of
    LENGTH_RATIO_MIN_PIECES pieces or more."""
    if source_pieces < LENGTH_RATIO_MIN_PIECES:
        return False
    ratio = translation_pieces / source_pieces
    return not band[0] <= ratio <= band[1]


def is_low_score(token_log_prob: float | None, min_score: float) -> bool:
    """low_score: the translation's log-probability per generated token (rows.token_log_prob) below min_score."""
    return token_log_prob is not None and token_log_prob < min_score


def wrong_languages(texts: list[str], targets: list[str], codes: tuple[str, ...], detect: Detect) -> list[bool]:
    """wrong_language, for each text: the detector names a language other than the text's target, with a
    confidence of WRONG_LANGUAGE_CONFIDENCE or more (an unsure detector, None, flags nothing). An empty text is
    not judged."""
    judged = [n for n, text in enumerate(texts) if text.strip()]
    found = detect([texts[n] for n in judged], codes) if judged else []
    wrong = [False] * len(texts)
    for n, (code, confidence) in zip(judged, found):
        wrong[n] = code is not None and code != targets[n] and confidence >= WRONG_LANGUAGE_CONFIDENCE
    return wrong


def load_detector() -> Detect:
    """The language detector of nllbcli/model/langid.py (its detect), for wrong_language."""
    from ..model import langid

    return langid.detect


def flag_rows(outcomes: list[Outcome], sentences: list[Sentence], found: dict[int, list[Hypothesis]],
              records: list[Record], job: Job, codes: tuple[str, ...], detect: Detect | None = None) -> None:
    """Each translated row's flags (Job.row_flags) into its Outcome's `flags`, from its sentences (`found[n]`:
    sentence n's hypotheses, the best first) and its record's text."""
    wanted = job.row_flags
    if not wanted:
        return
    sources: dict[int, list[list[int]]] = {}  # each row's sentences' source pieces, and their best translations'
    outputs: dict[int, list[list[int]]] = {}
    for number, sentence in enumerate(sentences):
        if number in found:
            sources.setdefault(sentence.row, []).append(sentence.ids[1:-1])  # without the language token and </s>
            outputs.setdefault(sentence.row, []).append(found[number][0].ids)
    rows = [n for n, o in enumerate(outcomes) if o.error is None and o.translation is not None]
    wrong = [False] * len(rows)
    if "wrong_language" in wanted:
        wrong = wrong_languages([outcomes[n].translation for n in rows], [outcomes[n].tgt for n in rows], codes,
                                detect or load_detector())
    for n, is_wrong in zip(rows, wrong):
        outcome, source, output = outcomes[n], sources.get(n, []), outputs.get(n, [])
        checks = {
            "repetition": lambda: is_repetition(records[n].text, outcome.translation),
            "wrong_language": lambda: is_wrong,
            "length_ratio": lambda: is_length_off(sum(map(len, source)), sum(map(len, output)),
                                                  length_band(job, outcome.src, outcome.tgt)),
            "low_score": lambda: is_low_score(outcome.token_log_prob, job.min_score),
            "copy": lambda: outcome.src != outcome.tgt and is_copy(records[n].text, outcome.translation),
        }
        outcome.flags = [name for name in wanted if checks[name]()]


def better_of(first: Outcome, retried: Outcome) -> Outcome:
    """The retry's choice: the translation with fewer flags, and between as many the higher log-probability per
    generated token (the first on a tie). cut is the source's and counts for neither."""
    def rank(outcome: Outcome) -> tuple[int, float]:
        flags = [name for name in flag_names(outcome) if name != "cut"]
        score = outcome.token_log_prob if outcome.token_log_prob is not None else float("-inf")
        return len(flags), -score

    return retried if rank(retried) < rank(first) else first
