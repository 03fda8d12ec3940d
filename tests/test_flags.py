"""Flagged and failed rows visible in the output: --status-field marks each written row ok, cut or max_length;
the errors file holds each failed row as it was in the input, to be fixed and run again; and the translation
never replaces a field of the input (the source text above all) without --overwrite-field."""

from __future__ import annotations

import datetime
import json
import signal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from nllbcli.cli import cli
from nllbcli.job.signals import Stopped

TRANSLATE = ["translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn"]


def invoke(*args: str):
    return CliRunner().invoke(cli, TRANSLATE + list(args))


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def write_jsonl(path, rows) -> None:
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows))


# The fake model's translation of a text is its pieces reversed: as many tokens out as characters in. With 8
# positions a source of more than 6 characters (language token and </s> besides) is cut; a translation of
# --max-length - 1 characters or more stopped at --max-length.
TEXTS = ["a", "abcdefghij", "abc", "b"]


@pytest.mark.parametrize("max_length, statuses", [("10", ["ok", "cut", "ok", "ok"]),
                                                  ("3", ["ok", "cut,max_length", "max_length", "ok"])])
def test_status_field_marks_cut_and_max_length_rows_in_jsonl(fake, here, max_length, statuses):
    fake.config.max_position_embeddings = 8
    write_jsonl("in.jsonl", [{"text": text, "id": n} for n, text in enumerate(TEXTS)])
    result = invoke("--max-length", max_length, "--status-field", "status", "in.jsonl", "out.jsonl")
    assert result.exit_code == 0, result.output
    rows = jsonl("out.jsonl")
    assert [row["status"] for row in rows] == statuses
    assert list(rows[0]) == ["text", "id", "translation", "status"]
    # without the option the rows are as they were
    assert invoke("--max-length", max_length, "in.jsonl", "plain.jsonl").exit_code == 0
    assert jsonl("plain.jsonl") == [{k: v for k, v in row.items() if k != "status"} for row in rows]


def test_status_column_in_parquet_from_parquet_and_from_jsonl(fake, here):
    fake.config.max_position_embeddings = 8
    table = pa.table({"id": pa.array([1, 2, 3, 4], pa.int32()), "text": TEXTS})
    pq.write_table(table, "in.parquet")
    write_jsonl("in.jsonl", table.to_pylist())
    for source in ("in.parquet", "in.jsonl"):
        result = invoke("--max-length", "3", "--status-field", "flag", source, "out.parquet")
        assert result.exit_code == 0, result.output
        output = pq.read_table("out.parquet")
        assert output.column_names == ["id", "text", "translation", "flag"]
        assert output.schema.field("flag").type == pa.string()
        assert output.column("flag").to_pylist() == ["ok", "cut,max_length", "max_length", "ok"]
        assert output.column("translation").to_pylist() == ["a", "fedcba", "cba", "b"]


def test_status_column_survives_a_resume(fake, here):
    """A job stopped after its first chunk and resumed writes the same file, status column included, as a run
    straight through."""
    write_jsonl("in.jsonl", [{"text": "x" * n} for n in range(1, 7)])
    args = ["--chunk-rows", "2", "--max-length", "4", "--status-field", "status", "in.jsonl"]
    assert invoke(*args, "whole.parquet").exit_code == 0
    generate, calls = type(fake).generate, []

    def stop_on_the_second_chunk(self, *rest):
        calls.append(1)
        if len(calls) == 2:
            raise Stopped(signal.SIGTERM)
        return generate(self, *rest)

    fake.generate = stop_on_the_second_chunk.__get__(fake)
    assert invoke(*args, "out.parquet").exit_code == 143
    fake.generate = generate.__get__(fake)
    result = invoke(*args, "--resume", "out.parquet")
    assert result.exit_code == 0, result.output
    assert Path("out.parquet").read_bytes() == Path("whole.parquet").read_bytes()
    assert pq.read_table("out.parquet").column("status").to_pylist() == ["ok", "ok", "max_length", "max_length",
                                                                         "max_length", "max_length"]


def test_status_field_is_refused_for_text_output_and_over_the_other_fields(fake, here):
    Path("in.txt").write_text("ab\n")
    result = invoke("--status-field", "status", "in.txt", "out.txt")
    assert result.exit_code == 2 and "--status-field needs JSONL, Parquet or CSV output" in result.stderr
    for option in (["--status-field", "text"], ["--status-field", "translation"],
                   ["--status-field", "tr", "--output-field", "tr"]):
        result = invoke(*option, "in.txt", "out.jsonl")
        assert result.exit_code == 2 and "name another" in result.stderr, result.output
    assert not Path("out.jsonl").exists() and not Path("out.txt").exists()


# -- the errors file holds the failed rows' input ---------------------------------------------------------------------

def test_errors_file_holds_each_failed_row_as_it_was(fake, here):
    """JSONL rows that are objects come back as objects, lines that are not JSON (or not UTF-8) as their text, so
    that `jq -c .input` gives rows to fix and run again."""
    Path("in.jsonl").write_bytes(b'{"text": "ab"}\n{"text": null, "id": 7, "big": 123456789012345678901234567890}\n'
                                 b'[1, 2]\n{"text": "\xff"}\n{"text": "cd", "tgt_lang": "xx"}\n')
    result = invoke("--errors", "bad.jsonl", "in.jsonl", "out.jsonl")
    assert result.exit_code == 3, result.output
    inputs = [entry["input"] for entry in jsonl("bad.jsonl")]
    assert inputs == [{"text": None, "id": 7, "big": 123456789012345678901234567890}, "[1, 2]",
                      '{"text": "\\xff"}', {"text": "cd", "tgt_lang": "xx"}]
    assert [entry["row"] for entry in jsonl("bad.jsonl")] == [2, 3, 4, 5]


def test_errors_file_holds_a_text_row_and_a_parquet_row(fake, here):
    fake.tokenizer.reject = "!"  # the tokenizer fails these rows
    Path("in.txt").write_text("ab\nno!\n")
    assert invoke("--errors", "bad.jsonl", "in.txt", "out.txt").exit_code == 3
    assert [entry["input"] for entry in jsonl("bad.jsonl")] == ["no!"]
    table = pa.table({"text": ["ab", "no!"], "day": [datetime.date(2026, 1, 2)] * 2, "blob": [b"\x00\x01"] * 2})
    pq.write_table(table, "in.parquet")
    assert invoke("--errors", "bad.jsonl", "in.parquet", "out.parquet").exit_code == 3
    assert [entry["input"] for entry in jsonl("bad.jsonl")] == [{"text": "no!", "day": "2026-01-02", "blob": "AAE="}]


# -- the translation does not replace the input's fields --------------------------------------------------------------

def test_output_field_over_the_source_text_is_refused_before_any_work(fake, here):
    write_jsonl("in.jsonl", [{"text": "ab"}])
    Path("in.txt").write_text("ab\n")
    for source, target in (("in.jsonl", "out.jsonl"), ("in.txt", "out.jsonl"), ("in.jsonl", "out.parquet")):
        result = invoke("--output-field", "text", source, target)
        assert result.exit_code == 2, result.output
        assert "would replace the source text" in result.stderr and "--overwrite-field" in result.stderr
        assert not Path(target).exists()
    assert fake.batches == []
    assert invoke("--output-field", "text", "--overwrite-field", "in.jsonl", "out.jsonl").exit_code == 0
    assert jsonl("out.jsonl") == [{"text": "ba"}]
    # text output has no fields to replace
    assert invoke("--output-field", "text", "in.jsonl", "out.txt").exit_code == 0


def test_a_jsonl_row_with_the_output_field_already_is_a_bad_row(fake, here):
    write_jsonl("in.jsonl", [{"text": "ab"}, {"text": "cd", "translation": "kept"}, {"text": "ef"}])
    result = invoke("in.jsonl", "out.jsonl")
    assert result.exit_code == 1
    assert "in.jsonl:2: the row has a field 'translation' already" in result.stderr
    assert not Path("out.jsonl").exists()
    result = invoke("--on-error", "skip", "in.jsonl", "out.jsonl")
    assert result.exit_code == 3
    assert jsonl("out.jsonl") == [{"text": "ab", "translation": "ba"}, {"text": "ef", "translation": "fe"}]
    assert invoke("--overwrite-field", "in.jsonl", "out.jsonl").exit_code == 0
    assert jsonl("out.jsonl")[1] == {"text": "cd", "translation": "dc"}


def test_a_parquet_input_with_the_output_column_is_refused_before_any_work(fake, here):
    pq.write_table(pa.table({"text": ["ab"], "translation": ["old"], "status": ["x"]}), "in.parquet")
    for option in ([], ["--output-field", "fr", "--status-field", "status"]):
        result = invoke(*option, "in.parquet", "out.parquet")
        assert result.exit_code == 1 and "it has a column" in result.stderr and "--overwrite-field" in result.stderr
        assert not Path("out.parquet").exists()
    assert fake.batches == []
    assert invoke("--overwrite-field", "--status-field", "status", "in.parquet", "out.parquet").exit_code == 0
    assert pq.read_table("out.parquet").to_pylist() == [{"text": "ab", "translation": "ba", "status": "ok"}]
