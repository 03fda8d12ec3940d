"""Every field of every row reaches the output unchanged, or the row fails with a reason: JSONL and Parquet, in
and out, through the CLI with the fake translator (which reverses each text)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from nllbcli.cli import cli

TRANSLATE = ["translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn"]


def translate(*args):
    return CliRunner().invoke(cli, TRANSLATE + list(args))


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


HUGE = "1" * 5000


def test_jsonl_numbers_python_cannot_hold_keep_their_text(fake, here):
    lines = [f'{{"text": "ab", "n": {HUGE}, "m": [-{HUGE}, 1e400, -1E+400, 1e-400, 5e-324, 0.0, 0e5]}}', '{"text": "cd", "id": 1e400}']
    (here / "in.jsonl").write_text("".join(line + "\n" for line in lines))
    result = translate("in.jsonl", "out.jsonl")
    assert result.exit_code == 0, result.output
    assert (here / "out.jsonl").read_text() == (
        f'{{"text": "ab", "n": {HUGE}, "m": [-{HUGE}, 1e400, -1E+400, 1e-400, 5e-324, 0.0, 0.0], "translation": "ba"}}\n'
        '{"text": "cd", "id": 1e400, "translation": "dc"}\n')


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_jsonl_nan_and_infinity_are_not_json(fake, here, literal):
    (here / "in.jsonl").write_text(f'{{"text": "ab", "x": [{literal}]}}\n{{"text": "cd"}}\n')
    result = translate("--on-error", "skip", "in.jsonl", "out.jsonl")
    assert result.exit_code == 3
    assert result.stderr == f"Skipped: in.jsonl:1: not valid JSON: {literal} is not a JSON value (RFC 8259).\n"
    assert (here / "out.jsonl").read_text() == '{"text": "cd", "translation": "dc"}\n'


def test_parquet_nan_and_infinity_fail_their_row_in_jsonl(fake, here):
    pq.write_table(pa.table({"text": ["ab", "cd", "ef", "gh"], "x": [1.5, float("nan"), None, 2.0],
                             "y": [[1.0], [2.0], [float("-inf")], None]}), "in.parquet")
    result = translate("--on-error", "skip", "in.parquet", "out.jsonl")
    assert result.exit_code == 3
    assert result.stderr == ("Skipped: in.parquet: row 2: field 'x' is NaN, which JSON has no number for.\n"
                             "Skipped: in.parquet: row 3: field 'y[0]' is -Infinity, which JSON has no number for.\n")
    assert (here / "out.jsonl").read_text() == ('{"text": "ab", "x": 1.5, "y": [1.0], "translation": "ba"}\n'
                                                '{"text": "gh", "x": 2.0, "y": null, "translation": "hg"}\n')


def test_huge_python_int_reaches_the_jsonl_writer():
    from nllbcli.io import LineSink, Record

    stream = io.BytesIO()
    records = [Record(0, "a", {"text": "a", "n": -(10 ** 5000) - 7, "m": [10 ** 4300]}, where="in:1")]
    assert LineSink(stream, "jsonl", "translation").write(records, ["A"]) == []
    assert stream.getvalue() == ('{"text": "a", "n": -1' + "0" * 4999 + '7, "m": [1' + "0" * 4300 + '], "translation": "A"}\n').encode()
