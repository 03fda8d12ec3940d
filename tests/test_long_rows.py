"""One row's cost is bounded: a huge sentence is cut before it is tokenized, to a prefix that gives the same ids
once cut to the model's positions, and the readers hold a huge line in a small multiple of its size."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nllbcli.io import Record
from nllbcli.options import Job
from nllbcli.job.rows import bound_text, cut_source, prepare_records
from nllbcli.model.translator import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "data" / "samples" / "model"
WORDS = ["the", "red", "car", "is", "in", "garden", ",", ".", "«", "»", "Straße", "ﬁnal", "e\u0301t\u00e9", "x" * 40,
         "日本語", "123", "-", "'s", "", "\t", "\n", "\u3000", "\u00a0", "\u200b", "a.b"]


@lru_cache(maxsize=None)
def tokenizer():
    return load_tokenizer(str(MODEL))


@settings(max_examples=150, deadline=None)
@given(words=st.lists(st.sampled_from(WORDS), min_size=20, max_size=400),
       spaces=st.lists(st.sampled_from([" ", "  ", "   ", " \t ", "\n "]), min_size=1, max_size=5),
       limit=st.sampled_from([4, 8, 13, 32]))
def test_a_bounded_sentence_gives_the_same_ids_once_cut(words, spaces, limit):
    text = "".join(word + spaces[n % len(spaces)] for n, word in enumerate(words))
    bounded = bound_text(tokenizer(), text, "eng_Latn", limit)
    full = tokenizer().encode(text, "eng_Latn")
    ids = tokenizer().encode(bounded, "eng_Latn")
    assert cut_source(ids, limit) == cut_source(full, limit)
    assert (len(ids) > limit) == (len(full) > limit)  # a cut row is still counted as cut
    assert text.startswith(bounded)


def test_a_huge_sentence_is_cut_before_the_tokenizer_takes_it(monkeypatch):
    text = "the red car is in the garden and " * 100_000  # 3.3 MB, one sentence
    limit = 256  # the sample model's positions
    given = []
    many = tokenizer().encode_many
    monkeypatch.setattr(tokenizer(), "encode_many", lambda texts, srcs: given.extend(map(len, texts)) or many(texts, srcs))

    class Translator:
        config = type("Config", (), {"max_position_embeddings": limit})

    Translator.tokenizer = tokenizer()
    outcomes, sentences = prepare_records(Translator, [Record(0, text, {"text": text})], Job("eng_Latn", "fra_Latn"))
    assert given and max(given) < 16 * limit + 100
    assert sentences[0].ids == cut_source(tokenizer().encode(text, "eng_Latn"), limit)
    assert outcomes[0].cut


def test_a_sentence_without_spaces_is_left_whole():
    text = "x" * 10_000
    assert bound_text(tokenizer(), text, "eng_Latn", 8) == text


# the process's own peak (VmHWM: ru_maxrss starts from the parent's, pytest's, which holds the test's long lines)
STATUS = """
import sys
def status(name):
    return next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith(name + ':'))  # KiB
"""
SCRIPT = STATUS + """
import nllbcli.cli as cli
try:
    cli.main()
finally:
    print(status('VmHWM'), file=sys.stderr)
"""


def peak_kib(tmp_path: Path, name: str, line: str) -> int:
    source = tmp_path / name
    source.write_text(line + "\n" if name.endswith(".txt") else json.dumps({"text": line}) + "\n")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, "translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn", "--model", str(MODEL),
         "--force", str(source), str(tmp_path / ("out-" + name))], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return int(result.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["in.txt", "in.jsonl"])
def test_a_long_one_sentence_row_costs_a_small_multiple_of_its_size(tmp_path, name):
    """A 20 MB sentence, which takes 1 GB to tokenize whole: ~2x its size as text, ~6x as JSONL (read, and its
    row written back whole)."""
    small = peak_kib(tmp_path, name, "the red car is in the garden")
    large = peak_kib(tmp_path, name, "the red car is in the garden and " * 600_000)
    assert large - small < (4 if name.endswith(".txt") else 8) * 20_000, (small, large)


@pytest.mark.parametrize("fmt", ["text", "jsonl", "csv"])
@pytest.mark.parametrize("stdin", [False, True])
def test_reading_a_long_line_costs_a_small_multiple_of_it(tmp_path, fmt, stdin):
    """Peak memory while a 36 MB line is read, over the memory in use before: the line as bytes and as text (and
    its JSON value, or the csv module's field: 4 bytes a character as it parses, then the text), not more
    copies."""
    line = "the red car " * 3_000_000
    path = tmp_path / "in"
    path.write_text({"text": line + "\n", "jsonl": json.dumps({"text": line}) + "\n", "csv": f"n,text\n1,{line}\n"}[fmt])
    script = (f"{STATUS}from nllbcli.io import open_input\n"
              "in_use = status('VmRSS')\n"
              f"with open_input({'-' if stdin else str(path)!r}, {fmt!r}, 'text') as source:\n"
              "    lengths = [len(r.text) for r in source.records]\n"
              "print(lengths, status('VmHWM') - in_use)\n")
    with path.open("rb") as stream:
        result = subprocess.run([sys.executable, "-c", script], stdin=stream, capture_output=True, text=True, timeout=120)
    lengths, grown = result.stdout.rsplit(" ", 1)
    assert lengths == f"[{len(line)}]", result.stderr
    assert int(grown) < {"text": 3, "jsonl": 4, "csv": 7}[fmt] * len(line) / 1024, grown  # KiB
