"""Every field of every row reaches the output unchanged, or the row fails with a reason: JSONL and Parquet, in
and out, through the CLI with the fake translator (which reverses each text)."""

from __future__ import annotations

import datetime
import decimal
import io
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from nllbcli.cli import cli
from jobfiles import listing, stopped_after_commits

TRANSLATE = ["translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn"]


def translate(*args):
    return CliRunner().invoke(cli, TRANSLATE + list(args))


def read_parquet(path):
    """The whole file (pq.read_table goes through datasets, which refuse duplicate column names)."""
    return pq.ParquetFile(path).read()


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_jsonl_to_parquet_keeps_fields_the_first_rows_lack(fake, here):
    (here / "in.jsonl").write_text('{"text": "ab"}\n{"text": "cd", "id": 5, "note": "keep me"}\n{"id": "str", "text": "ef"}\n')
    result = translate("--on-error", "skip", "in.jsonl", "out.parquet")
    assert result.exit_code == 3
    assert result.stderr == "Skipped: in.jsonl:3: does not fit the Parquet schema of the rows before it: field 'id' is string where it was int64.\n"
    output = read_parquet("out.parquet")
    # the translation last, where it would be had the first row had every field
    assert output.schema == pa.schema([("text", pa.string()), ("id", pa.int64()), ("note", pa.string()), ("translation", pa.string())])
    assert output.to_pylist() == [{"text": "ab", "translation": "ba", "id": None, "note": None},
                                  {"text": "cd", "translation": "dc", "id": 5, "note": "keep me"}]


ROWS = [{"text": "a"}, {"text": "b", "n": None, "m": {}}, {"text": "c", "n": 1, "m": {"x": 1}}, {"text": "d", "n": 2.5, "m": {"y": "s"}},
        {"text": "e", "n": "s", "tags": [1]}, {"text": "f", "m": {}, "tags": [2.5, None], "n": 2 ** 60},
        {"text": "g", "tags": [], "m": {"x": 2.5, "z": [True]}}, {"text": "h", "tags": [True]}, {"text": "i", "tags": [1.5]}]


@pytest.mark.parametrize("chunk_rows", ["1", "2", "3", "100"])
def test_jsonl_to_parquet_schema_does_not_depend_on_chunk_rows(fake, here, chunk_rows):
    """A column's type follows from the rows in input order: null goes to any type, int64 to double, structs gain
    fields; a row that does not fit what the rows before it made the column fails alone, at any --chunk-rows."""
    (here / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    result = translate("--chunk-rows", chunk_rows, "--errors", "errors.jsonl", "in.jsonl", "out.parquet")
    assert result.exit_code == 3, result.output
    output = read_parquet("out.parquet")
    assert output.schema == pa.schema([
        ("text", pa.string()), ("n", pa.float64()),
        ("m", pa.struct([("x", pa.float64()), ("y", pa.string()), ("z", pa.list_(pa.field("element", pa.bool_())))])),
        ("tags", pa.list_(pa.field("element", pa.bool_()))),  # (Parquet names a list's items "element")
        ("translation", pa.string())])
    assert output.to_pylist() == [
        {"text": "a", "translation": "a", "n": None, "m": None, "tags": None},
        {"text": "c", "translation": "c", "n": 1.0, "m": {"x": 1.0, "y": None, "z": None}, "tags": None},
        {"text": "d", "translation": "d", "n": 2.5, "m": {"x": None, "y": "s", "z": None}, "tags": None},
        {"text": "g", "translation": "g", "n": None, "m": {"x": 2.5, "y": None, "z": [True]}, "tags": []},
        {"text": "h", "translation": "h", "n": None, "m": None, "tags": [True]}]
    assert [json.loads(line) for line in open("errors.jsonl")] == [
        {"row": 2, "error": "in.jsonl:2: cannot be written to Parquet: field 'm' is an empty object, which Parquet holds only where the rows before it gave the object fields.", "input": ROWS[1]},
        {"row": 5, "error": "in.jsonl:5: does not fit the Parquet schema of the rows before it: field 'n' is string where it was double.", "input": ROWS[4]},
        {"row": 6, "error": "in.jsonl:6: does not fit the Parquet schema of the rows before it: field 'n' is int64 where it was double, with integers a double cannot hold exactly.", "input": ROWS[5]},
        {"row": 9, "error": "in.jsonl:9: does not fit the Parquet schema of the rows before it: field 'tags[]' is double where it was bool.", "input": ROWS[8]}]


def test_parquet_duplicate_column_names_pass_through(fake, here):
    table = pa.Table.from_arrays([pa.array(["ab", "cd", "ef"]), pa.array([1, 2, 3]), pa.array([4, 5, 6])], names=["text", "a", "a"])
    pq.write_table(table, "in.parquet")
    result = translate("in.parquet", "out.parquet")
    assert result.exit_code == 0, result.output
    output = read_parquet("out.parquet")
    assert output.column_names == ["text", "a", "a", "translation"]
    assert [column.to_pylist() for column in output.columns] == [["ab", "cd", "ef"], [1, 2, 3], [4, 5, 6], ["ba", "dc", "fe"]]


def test_parquet_duplicate_names_refused_for_jsonl_output(fake, here):
    struct = pa.StructArray.from_arrays([pa.array([1]), pa.array([2])], names=["x", "x"])
    pq.write_table(pa.Table.from_arrays([pa.array(["ab"]), pa.array([1]), pa.array([4]), struct], names=["text", "a", "a", "s"]), "in.parquet")
    result = translate("--on-error", "skip", "in.parquet", "out.jsonl")
    assert result.exit_code == 1
    assert result.stderr == ("Error: in.parquet: more than one column (or struct field) is named 'a', 's.x', and a JSON object holds each "
                             "name once: rename them, or write Parquet, which keeps them.\n")
    assert listing(here) == ["in.parquet"]


@pytest.mark.parametrize("name,option", [("text", "--field"), ("tgt_lang", "--tgt-lang-field"), ("translation", "--output-field")])
def test_parquet_duplicate_column_the_job_names_is_refused(fake, here, name, option):
    columns = {"text": pa.array(["ab"]), name: pa.array(["de"])}
    pq.write_table(pa.Table.from_arrays(list(columns.values()) + [pa.array(["fr"])], names=list(columns) + [name]), "in.parquet")
    result = translate("--on-error", "skip", "in.parquet", "out.parquet")
    assert result.exit_code == 1
    assert result.stderr == (f"Error: in.parquet: 2 columns are named {name!r}, so which one {option} means is ambiguous: "
                             f"rename them, or name another column with {option}.\n")
    assert listing(here) == ["in.parquet"]


HUGE = "1" * 5000


def test_jsonl_numbers_python_cannot_hold_keep_their_text(fake, here):
    lines = [f'{{"text": "ab", "n": {HUGE}, "m": [-{HUGE}, 1e400, -1E+400, 1e-400, 5e-324, 0.0, 0e5]}}', '{"text": "cd", "id": 1e400}']
    (here / "in.jsonl").write_text("".join(line + "\n" for line in lines))
    result = translate("in.jsonl", "out.jsonl")
    assert result.exit_code == 0, result.output
    assert (here / "out.jsonl").read_text() == (
        f'{{"text": "ab", "n": {HUGE}, "m": [-{HUGE}, 1e400, -1E+400, 1e-400, 5e-324, 0.0, 0.0], "translation": "ba"}}\n'
        '{"text": "cd", "id": 1e400, "translation": "dc"}\n')


def test_jsonl_numbers_parquet_cannot_hold_fail_their_row(fake, here):
    (here / "in.jsonl").write_text(f'{{"text": "ab", "n": {HUGE}}}\n{{"text": "cd", "id": 1e400}}\n{{"text": "ef", "id": 2}}\n')
    result = translate("--on-error", "skip", "in.jsonl", "out.parquet")
    assert result.exit_code == 3
    assert result.stderr == (
        "Skipped: in.jsonl:1: cannot be written to Parquet: field 'n' is the number 11111111111111111111... (5000 characters), "
        "beyond what a Parquet number holds (a 64-bit integer, a double).\n"
        "Skipped: in.jsonl:2: cannot be written to Parquet: field 'id' is the number 1e400, beyond what a Parquet number holds "
        "(a 64-bit integer, a double).\n")
    assert read_parquet("out.parquet").to_pylist() == [{"text": "ef", "id": 2, "translation": "fe"}]


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
    from nllbcli.io import Added, LineSink, Record

    stream = io.BytesIO()
    records = [Record(0, "a", {"text": "a", "n": -(10 ** 5000) - 7, "m": [10 ** 4300]}, where="in:1")]
    assert LineSink(stream, "jsonl", Added("translation")).write(records, [{"translation": "A"}]) == []
    assert stream.getvalue() == ('{"text": "a", "n": -1' + "0" * 4999 + '7, "m": [1' + "0" * 4300 + '], "translation": "A"}\n').encode()


NANOSECONDS = pa.table({
    "text": ["ab", "cd", "ef"],
    "when": pa.array([1_700_000_000_123_456_789, 1_000, None], pa.timestamp("ns")),
    "utc": pa.array([-1, 0, 5_000_000], pa.timestamp("ns", tz="UTC")),
    "took": pa.array([1_001, -1, 86_400_000_000_000], pa.duration("ns")),
    "at": pa.array([1_001, 45_296_000_000_500, None], pa.time64("ns")),
    "nested": pa.array([[1_001], [], None], pa.list_(pa.timestamp("ns"))),
})


def test_nanosecond_columns_pass_through_parquet_untouched(fake, here):
    pq.write_table(NANOSECONDS, "in.parquet")
    result = translate("in.parquet", "out.parquet")
    assert result.exit_code == 0, result.output
    output = read_parquet("out.parquet")
    assert output.drop_columns(["translation"]).equals(NANOSECONDS)


def test_nanosecond_columns_in_jsonl(fake, here):
    """Python's text of the microseconds, with the three digits more where there are nanoseconds."""
    pq.write_table(NANOSECONDS, "in.parquet")
    result = translate("in.parquet", "out.jsonl")
    assert result.exit_code == 0, result.output
    assert [json.loads(line) for line in open("out.jsonl")] == [
        {"text": "ab", "when": "2023-11-14T22:13:20.123456789", "utc": "1969-12-31T23:59:59.999999999+00:00",
         "took": "0:00:00.000001001", "at": "00:00:00.000001001", "nested": ["1970-01-01T00:00:00.000001001"], "translation": "ba"},
        {"text": "cd", "when": "1970-01-01T00:00:00.000001", "utc": "1970-01-01T00:00:00+00:00",
         "took": "-1 day, 23:59:59.999999999", "at": "12:34:56.000000500", "nested": [], "translation": "dc"},
        {"text": "ef", "when": None, "utc": "1970-01-01T00:00:00.005000+00:00", "took": "1 day, 0:00:00", "at": None,
         "nested": None, "translation": "fe"}]


def other_types() -> pa.Table:
    """Columns of the types the tool does not translate, each as Parquet writes and reads it back."""
    table = pa.table({
        "text": pa.array(["ab", "cd", "ef"]).dictionary_encode(),
        "price": pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("-0.01")], pa.decimal128(9, 2)),
        "big": pa.array([decimal.Decimal(10 ** 40), None, 1], pa.decimal256(60, 0)),
        "tag": pa.array(["x", "y", "x"]).dictionary_encode(),
        "nested": pa.array([{"a": [1, 2], "b": {"c": "d"}}, None, {"a": None, "b": None}]),
        "pairs": pa.array([[("k", 1)], [], None], pa.map_(pa.string(), pa.int64())),
        "large": pa.array(["l", None, "m"], pa.large_string()),
        "blob": pa.array([b"\x00\xff", b"", None], pa.large_binary()),
        "fixed": pa.array([[1, 2], [3, 4], None], pa.list_(pa.int8(), 2)),
        "day": pa.array([0, 3_000_000, None], pa.date32()),
        "id": pa.array([b"0123456789abcdef", None, b"fedcba9876543210"], pa.uuid()),
        "half": pa.array([0.5, None, 2.0], pa.float16()),
    })
    table = table.replace_schema_metadata({"origin": "test", "pandas": "{}"})
    stream = io.BytesIO()
    pq.write_table(table, stream)
    return pq.ParquetFile(io.BytesIO(stream.getvalue())).read()


def test_every_other_column_type_passes_through_parquet(fake, here):
    table = other_types()
    pq.write_table(table, "in.parquet")
    result = translate("in.parquet", "out.parquet")
    assert result.exit_code == 0, result.output
    output = read_parquet("out.parquet")
    assert output.schema.equals(table.schema.append(pa.field("translation", pa.string())), check_metadata=True)
    assert output.drop_columns(["translation"]).equals(table)
    assert output.column("translation").to_pylist() == ["ba", "dc", "fe"]


def test_every_other_column_type_in_jsonl(fake, here):
    pq.write_table(other_types(), "in.parquet")
    result = translate("in.parquet", "out.jsonl")
    assert result.exit_code == 0, result.output
    assert [json.loads(line) for line in open("out.jsonl")][1:] == [
        {"text": "cd", "price": None, "big": None, "tag": "y", "nested": None, "pairs": [], "large": None, "blob": "",
         "fixed": [3, 4], "day": "10183-09-21", "id": None, "half": None, "translation": "dc"},
        {"text": "ef", "price": "-0.01", "big": "1", "tag": "x", "nested": {"a": None, "b": None}, "pairs": None, "large": "m",
         "blob": None, "fixed": None, "day": None, "id": "66656463-6261-3938-3736-353433323130", "half": 2.0, "translation": "fe"}]


def test_a_language_column_with_unreadable_values_fails_those_rows(fake, here):
    """Only the columns the job reads become Python values: the rest (here text that is not UTF-8) is carried."""
    bad = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(b"\x00\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00"), pa.py_buffer(b"de\xff")])
    pq.write_table(pa.table({"text": ["ab", "cd"], "tgt_lang": bad, "other": bad}), "in.parquet")
    result = translate("--on-error", "skip", "in.parquet", "out.parquet")
    assert result.exit_code == 3
    assert result.stderr == ("Skipped: in.parquet: row 2: cannot read column 'tgt_lang': 'utf-8' codec can't decode byte 0xff "
                             "in position 0: invalid start byte\n")
    assert read_parquet("out.parquet").column("translation").to_pylist() == ["ba"]


@pytest.mark.parametrize("commits", [1, 3, 5])
def test_jsonl_to_parquet_resumed_gives_the_same_bytes(fake, here, commits):
    """A resumed job takes up the columns' types (and which int64 columns hold integers a double cannot) from the
    frames it wrote, so it widens and fails rows as a job run straight through does."""
    rows = ROWS + [{"text": "j", "w": 2 ** 60}, {"text": "k", "w": 1.5}, {"text": "l", "w": 3, "n": 7}]
    (here / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = ["--chunk-rows", "2", "--errors", "errors.jsonl", "in.jsonl", "out.parquet"]
    assert translate(*args).exit_code == 3
    straight = (here / "out.parquet").read_bytes(), (here / "errors.jsonl").read_bytes()
    assert b"field 'w' is double where it was int64" in straight[1]
    os.unlink("out.parquet")
    os.unlink("errors.jsonl")
    with stopped_after_commits(commits) as saved:
        assert translate(*args).exit_code == 130
    assert not (here / "out.parquet").exists() and saved[-1].position.rows == 2 * commits
    result = translate(*args, "--resume")
    assert result.exit_code == 3, result.output
    assert ((here / "out.parquet").read_bytes(), (here / "errors.jsonl").read_bytes()) == straight


def test_stdout_parquet_from_jsonl_has_the_schema_of_every_row(fake, here):
    """Without a schema up front the chunks wait in a temporary file until the last has set the columns."""
    (here / "in.jsonl").write_text('{"text": "ab", "n": null}\n{"text": "cd", "n": 1}\n{"text": "ef", "n": 2.5, "x": "new"}\n')
    result = translate("--chunk-rows", "1", "--output-format", "parquet", "in.jsonl", "-")
    assert result.exit_code == 0, result.output
    output = read_parquet(io.BytesIO(result.stdout_bytes))
    assert output.to_pylist() == [{"text": "ab", "n": None, "translation": "ba", "x": None},
                                  {"text": "cd", "n": 1.0, "translation": "dc", "x": None},
                                  {"text": "ef", "n": 2.5, "translation": "fe", "x": "new"}]
    assert pq.ParquetFile(io.BytesIO(result.stdout_bytes)).metadata.num_row_groups == 3
    assert listing(here) == ["in.jsonl"]


# Property tests (hypothesis): rows and tables of drawn fields and types through the CLI at drawn --chunk-rows.

import math  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def quick(fake, monkeypatch):
    """The fake translator, and jobs without the full collection a job starts with (which tunes the collector
    only, and takes a while in a process holding all that hypothesis holds)."""
    import contextlib

    monkeypatch.setattr("nllbcli.job.loop.fewer_collections", contextlib.nullcontext)
    return fake


def run_job(directory, source, target, chunk_rows):
    """The failed rows' numbers and reasons; `target` "-" is Parquet on stdout, then returned too."""
    path = os.path.join(directory, source)
    if target == "-":
        result = CliRunner().invoke(cli, TRANSLATE + ["--chunk-rows", str(chunk_rows), "--on-error", "skip", "--output-format", "parquet", path, "-"])
        failed = re.findall(rf"^Skipped: ({re.escape(path)}(?::|: row )(\d+): .*)$", result.stderr, re.M)
        assert result.exit_code == (3 if failed else 0), result.output
        return {int(number): reason for reason, number in failed}, read_parquet(io.BytesIO(result.stdout_bytes))
    result = CliRunner().invoke(cli, TRANSLATE + ["--chunk-rows", str(chunk_rows), "--errors", os.path.join(directory, "errors.jsonl"),
                                                  path, os.path.join(directory, target)])
    assert result.exit_code in (0, 3), result.output
    assert "Traceback" not in result.output
    failed = {}
    rows = [line for line in open(path, encoding="utf-8") if line.strip()] if source.endswith(".jsonl") else None
    for line in open(os.path.join(directory, "errors.jsonl")):
        entry = exact(line)
        failed[int(entry["row"][1])] = entry["error"]
        if rows is not None:  # the failed row as it was, to be fixed and run again
            assert entry["input"] == exact(rows[int(entry["row"][1]) - 1]), entry
    return failed


NS = (st.sampled_from([1_001, -1, 999, 1_000, 86_400 * 10 ** 9 + 1, -86_400 * 10 ** 9 - 1_001, 2 ** 62])
      | st.builds(lambda seconds, micros, nanos: seconds * 10 ** 9 + micros * 1_000 + nanos,
                  st.integers(-2 ** 32, 2 ** 32), st.integers(0, 999_999), st.integers(0, 999)))
COLUMNS = [
    (pa.int64(), st.integers(-2 ** 63, 2 ** 63 - 1)),
    (pa.float64(), st.floats() | st.sampled_from([float("nan"), float("inf"), -0.0]).map(float)),
    (pa.string(), st.text(max_size=4)),
    (pa.timestamp("ns"), NS),
    (pa.duration("ns"), NS),
    (pa.time64("ns"), NS.map(lambda n: n % (86_400 * 10 ** 9))),
    (pa.decimal128(12, 3), st.decimals(-10 ** 8, 10 ** 8, places=3, allow_nan=False, allow_infinity=False)),
    (pa.dictionary(pa.int32(), pa.string()), st.sampled_from(["x", "y", "zz"])),
    (pa.list_(pa.int64()), st.lists(st.integers(-5, 5), max_size=3)),
    (pa.struct([("p", pa.int32()), ("q", pa.string())]), st.fixed_dictionaries({"p": st.integers(-5, 5), "q": st.text(max_size=3)})),
    (pa.list_(pa.timestamp("ns")), st.lists(NS, max_size=2)),
    (pa.large_binary(), st.binary(max_size=4)),
]


@st.composite
def tables(draw, duplicates: bool):
    rows = draw(st.integers(0, 9))
    names, arrays = ["text"], [pa.array(draw(st.lists(st.none() | st.text(max_size=4), min_size=rows, max_size=rows)), pa.string())]
    for _ in range(draw(st.integers(0, 4))):
        kind, values = draw(st.sampled_from(COLUMNS))
        drawn = draw(st.lists(st.none() | values, min_size=rows, max_size=rows))
        if pa.types.is_dictionary(kind):
            arrays.append(pa.array(drawn, pa.string()).dictionary_encode())
        else:
            storage = kind if not (pa.types.is_temporal(kind) or pa.types.is_list(kind) and pa.types.is_temporal(kind.value_type)) else None
            arrays.append(pa.array(drawn, storage) if storage else pa.array(drawn, pa.list_(pa.int64()) if pa.types.is_list(kind) else pa.int64()).cast(kind))
        names.append(draw(st.sampled_from(["a", "b"] if duplicates else [n for n in "abcdefgh" if n not in names])))
    return pa.Table.from_arrays(arrays, names=names), draw(st.integers(1, 4))


@SETTINGS
@given(tables(duplicates=True), st.integers(1, 5))
def test_parquet_columns_pass_through_parquet(quick, drawn, chunk_rows):
    """Every column of every written row is in the output as it was, its type too (names that occur twice
    included), and the output is the same at every --chunk-rows."""
    table, group = drawn
    with tempfile.TemporaryDirectory() as directory:
        pq.write_table(table, os.path.join(directory, "in.parquet"), row_group_size=group)
        table = read_parquet(os.path.join(directory, "in.parquet"))  # as Parquet gives it back
        failed = run_job(directory, "in.parquet", "out.parquet", chunk_rows)
        output = read_parquet(os.path.join(directory, "out.parquet"))
        one_by_one, stdout = run_job(directory, "in.parquet", "-", 1)
        assert one_by_one == failed and stdout.equals(output)
    texts = table.column("text").to_pylist()
    assert sorted(failed) == [n + 1 for n, text in enumerate(texts) if text is None]
    assert all(reason.endswith("field 'text' is null, not a string.") for reason in failed.values())
    kept = table.filter(pa.array([text is not None for text in texts], pa.bool_()))
    assert output.schema == table.schema.append(pa.field("translation", pa.string()))
    assert output.drop_columns(["translation"]).equals(kept)
    assert output.column("translation").null_count == 0


def nanoseconds(text: str, kind: pa.DataType) -> int:
    """The count of nanoseconds a JSONL output's text of a nanosecond value stands for."""
    whole, _, fraction = text.partition(".")
    extra = int(fraction.ljust(9, "0")) if fraction else 0
    if pa.types.is_timestamp(kind):
        return (datetime.datetime.fromisoformat(whole) - datetime.datetime(1970, 1, 1)) // datetime.timedelta(seconds=1) * 10 ** 9 + extra
    days = 0
    if "day" in whole:
        day_part, whole = whole.split(", ")
        days = int(day_part.split()[0])
    hours, minutes, seconds = map(int, whole.split(":"))
    return ((days * 24 + hours) * 60 + minutes) * 60 * 10 ** 9 + seconds * 10 ** 9 + extra


@SETTINGS
@given(tables(duplicates=False), st.integers(1, 5))
def test_parquet_columns_reach_jsonl(quick, drawn, chunk_rows):
    """Every column of every written row is in the JSONL output, in order, its value as Python holds it (JSON
    text for dates, decimals and bytes) and nanosecond values to the nanosecond; a row with a NaN or an infinity
    fails, naming the field."""
    table, group = drawn
    with tempfile.TemporaryDirectory() as directory:
        pq.write_table(table, os.path.join(directory, "in.parquet"), row_group_size=group)
        table = read_parquet(os.path.join(directory, "in.parquet"))
        failed = run_job(directory, "in.parquet", "out.jsonl", chunk_rows)
        written = [json.loads(line) for line in open(os.path.join(directory, "out.jsonl"))]
    from nllbcli.io.jsonl import to_json

    rows = iter(written)
    for n in range(table.num_rows):
        values = {name: table.column(name)[n] for name in table.column_names}
        nonfinite = {float("nan"): "NaN", float("inf"): "Infinity", float("-inf"): "-Infinity"}
        nan = [(name, nonfinite.get(value.as_py(), "NaN")) for name, value in values.items()
               if pa.types.is_floating(value.type) and value.is_valid and not math.isfinite(value.as_py())]
        if values["text"].as_py() is None:
            assert failed[n + 1].endswith("field 'text' is null, not a string.")
            continue
        if nan:
            assert failed[n + 1].endswith(f"field {nan[0][0]!r} is {nan[0][1]}, which JSON has no number for.")
            continue
        row = next(rows)
        assert list(row) == table.column_names + ["translation"]
        for name, value in values.items():
            kind = value.type
            nested_ns = pa.types.is_list(kind) and pa.types.is_temporal(kind.value_type)
            if value.is_valid and (pa.types.is_temporal(kind) and getattr(kind, "unit", "") == "ns"):
                assert nanoseconds(row[name], kind) == value.cast(pa.int64()).as_py()
            elif value.is_valid and nested_ns:
                assert [nanoseconds(v, kind.value_type) for v in row[name]] == value.values.cast(pa.int64()).to_pylist()
            else:
                assert row[name] == json.loads(json.dumps(value.as_py(), default=to_json))
    assert next(rows, None) is None


NAMES = st.sampled_from(["a", "b", "c", "text2"])
RAW = ["1" * 4500, "-" + "9" * 5000, "1e400", "-2.5E+999", "1e-400"]  # numbers int and float cannot hold
# values that meet each rule (null to anything, int to double, integers a double cannot hold, empty objects,
# structs gaining fields, numbers past int and float) more often than drawn ones would
EDGES = [None, True, 0, -7, 2 ** 53, 2 ** 53 + 1, -2 ** 60, 2 ** 63, 0.5, -0.0, 1e300, "", "s", [], {}, [1], [2.5], [True], [None],
         {"a": 1}, {"a": 2.5}, {"b": "x"}, {"a": {}}, [{}], [[1]], [2 ** 60], [1.5, 2 ** 60]] + [("raw", text) for text in RAW]
SCALAR = (st.sampled_from(EDGES) | st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
          | st.text(max_size=5))
JSON_VALUE = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3), max_leaves=6)
SMALL = st.integers(-3, 3) | st.floats(-2, 2, allow_nan=False)
KINDS = [st.integers(-3, 3), st.floats(-2, 2, allow_nan=False), SMALL, st.sampled_from([2 ** 60, -2 ** 53 - 1, 3]), st.text(max_size=3),
         st.booleans(), st.none(), st.lists(SMALL, max_size=2), st.lists(st.lists(st.integers(-3, 3), max_size=2), max_size=2),
         st.fixed_dictionaries({}, optional={"a": SMALL, "b": st.text(max_size=2), "c": st.lists(st.booleans(), max_size=2)})]


@st.composite
def jsonl_rows(draw):
    """Rows whose fields mostly keep a type of their own (drawn for the example), now and then another value: so
    that chunks often widen the columns whole, and now and then meet a row that does not fit."""
    kinds = {name: draw(st.sampled_from(KINDS)) for name in ["a", "b", "c"]}
    rows = []
    for _ in range(draw(st.integers(3, 12))):
        row = {"text": draw(st.text(max_size=6)) if draw(st.integers(0, 9)) else None}
        for name, kind in kinds.items():
            if draw(st.booleans()):
                pick = draw(st.integers(0, 9))
                row[name] = draw(st.sampled_from(EDGES) if pick == 0 else JSON_VALUE if pick == 1 else kind)
        rows.append(row)
    return rows


def json_line(row: dict) -> str:
    """json.dumps, with ("raw", text) written as the number `text`."""
    raws = []

    def mark(value):
        if isinstance(value, tuple):
            raws.append(value[1])
            return f"\x00{len(raws) - 1}\x00"
        if isinstance(value, list):
            return [mark(item) for item in value]
        if isinstance(value, dict):
            return {key: mark(item) for key, item in value.items()}
        return value

    return re.sub(r'"\\u0000(\d+)\\u0000"', lambda match: raws[int(match[1])], json.dumps(mark(row), ensure_ascii=False))


def exact(line: str) -> object:
    """A JSON line with every number as its text: what must come out as it went in."""
    return json.loads(line, parse_int=lambda text: ("number", text), parse_float=lambda text: ("number", text))


def same(given, written) -> bool:
    """`written` (read back from Parquet) holds `given` (a JSON value): bools stay bools, ints may be doubles now,
    and a struct may have gained fields (null here)."""
    if isinstance(given, bool) or given is None or isinstance(given, str):
        return type(written) is type(given) and written == given
    if isinstance(given, (int, float)):
        return type(written) in (int, float) and written == given and (type(written) is float or type(given) is int)
    if isinstance(given, list):
        return isinstance(written, list) and len(written) == len(given) and all(map(same, given, written))
    return (isinstance(written, dict) and all(k in written and same(v, written[k]) for k, v in given.items())
            and all(v is None for k, v in written.items() if k not in given))


@SETTINGS
@given(jsonl_rows(), st.integers(1, 5))
def test_jsonl_rows_keep_every_field(quick, rows, chunk_rows):
    """JSONL to JSONL: a row is written as it was read, numbers to the letter, or fails as not JSON Python can take
    (never here); to Parquet: every field of every row that is written holds its value, a row that fails is
    named with a reason that names one of its fields, and the schema and the failed rows are those of a job
    of one-row chunks."""
    lines = [json_line(row) for row in rows]
    with tempfile.TemporaryDirectory() as directory:
        with open(os.path.join(directory, "in.jsonl"), "w") as stream:
            stream.write("".join(line + "\n" for line in lines))
        failed = run_job(directory, "in.jsonl", "out.jsonl", chunk_rows)
        written = [exact(line) for line in open(os.path.join(directory, "out.jsonl"))]
        assert sorted(failed) == [n + 1 for n, row in enumerate(rows) if not isinstance(row["text"], str)]
        kept = [exact(line) for n, line in enumerate(lines) if n + 1 not in failed]
        assert [{k: v for k, v in row.items() if k != "translation"} for row in written] == kept
        assert all(isinstance(row["translation"], str) for row in written)

        failed = run_job(directory, "in.jsonl", "out.parquet", chunk_rows)
        output = read_parquet(os.path.join(directory, "out.parquet"))
        one_by_one, stdout = run_job(directory, "in.jsonl", "-", 1)
        assert failed == one_by_one
        assert output.equals(stdout)
    for number, reason in failed.items():
        row = rows[number - 1]
        named = re.search(r"field '([^'.\[]*)", reason)[1]
        assert reason.startswith(f"{directory}/in.jsonl:{number}: ") and named in row, reason
    kept = [row for n, row in enumerate(rows) if n + 1 not in failed]
    written = output.to_pylist()
    assert len(written) == len(kept)
    for given_row, written_row in zip(kept, written):
        assert isinstance(written_row["translation"], str)
        for name in output.column_names:
            if name != "translation":
                assert same(given_row.get(name), written_row[name]), (name, given_row, written_row)


@settings(max_examples=300, deadline=None)
@given(jsonl_rows(), st.lists(st.integers(1, 6), min_size=1, max_size=4))
def test_jsonl_rows_typed_as_chunks_of_one_row(rows, sizes):
    """The writer's typing alone, over many more drawn rows than the CLI's tests take: chunks of drawn sizes
    give the tables (cast to the last schema) and failed rows that chunks of one row give."""
    from nllbcli.io import Added, Record
    from nllbcli.io.parquet import TableMaker, conform

    records = [Record(n, "", {k: v for k, v in row.items() if k != "text"}, where=f"in:{n + 1}") for n, row in enumerate(rows)]

    def write(chunk_sizes):
        maker, tables, failed, done = TableMaker(None, Added("translation"), "text"), [], [], 0
        while done < len(records):
            size = chunk_sizes[len(tables) % len(chunk_sizes)]
            chunk = records[done:done + size]
            table, bad = maker.table(chunk, [{"translation": "t"}] * len(chunk))
            tables += [table] if table is not None else []
            failed += [(record.index, reason) for record, reason in bad]
            done += size
        schema = maker.schema
        return schema, [conform(table, schema).to_pylist() for table in tables], failed

    schema, tables, failed = write(sizes)
    one_schema, one_tables, one_failed = write([1])
    assert schema == one_schema and failed == one_failed
    assert [row for table in tables for row in table] == [row for table in one_tables for row in table]



@pytest.mark.parametrize("line,name", [('{"text": "ab", "a": 1, "a": 2}', "a"), ('{"text": "ab", "m": {"x": 1, "x": [2]}}', "x"),
                                       ('{"text": "ab", "text": "cd"}', "text")])
def test_a_name_given_twice_fails_its_row(fake, here, line, name):
    """json.loads kept the last value of a repeated name and dropped the other without a word."""
    (here / "in.jsonl").write_text(line + '\n{"text": "ok"}\n')
    result = translate("--on-error", "skip", "in.jsonl", "out.jsonl")
    assert result.exit_code == 3
    assert result.stderr == (f'Skipped: in.jsonl:1: the name "{name}" appears twice in one object, and only one of its '
                             "values could be kept.\n")
    assert (here / "out.jsonl").read_text() == '{"text": "ok", "translation": "ko"}\n'


@pytest.mark.parametrize("value, wider", [
    ([None, None], pa.list_(pa.null())),
    ({"x": [None, None]}, pa.struct([("x", pa.list_(pa.null())), ("y", pa.int64())])),
    ([[None], [None, None]], pa.list_(pa.list_(pa.null()))),
])
def test_a_frame_holding_lists_of_nulls_conforms_to_a_wider_schema(value, wider):
    """A JSONL frame's list of nulls (alone, in a struct, in a list) cast into the final schema keeps its nulls
    (pyarrow's own cast gave an invalid array: 'Length spanned by list offsets (2) larger than values array')."""
    from nllbcli.io.parquet import conform

    table = pa.Table.from_pylist([{"c": value}])
    schema = pa.schema([("c", wider), ("b", pa.null())])
    out = conform(table, schema)
    out.validate(full=True)
    assert out.to_pylist() == [{"c": {**value, "y": None} if isinstance(value, dict) else value, "b": None}]


def view_columns() -> pa.Table:
    """Arrow's view types (no take kernel in Arrow 26), with a row that fails (null text) between good ones."""
    return pa.table({
        "text": pa.array(["ab", None, "cd", "ef"], pa.string_view()),
        "blob": pa.array([b"\x00", b"y", None, b""], pa.binary_view()),
        "tags": pa.array([["a"], None, ["b", None], []], pa.list_(pa.string_view())),
    })


@pytest.mark.parametrize("out", ["out.parquet", "out.jsonl"])
@pytest.mark.parametrize("commits", [None, 1])
def test_view_columns_with_a_failed_row_between_good_ones(fake, here, out, commits):
    """A chunk's rows less a failed one are taken from Arrow's view types too (straight through, and resumed after
    a chunk of rows 1-3 committed)."""
    pq.write_table(view_columns(), "in.parquet")
    args = ["--chunk-rows", "3", "--on-error", "record", "--errors", "errors.jsonl", "in.parquet", out]
    if commits:
        with stopped_after_commits(commits):
            assert translate(*args).exit_code == 130
    result = translate(*args, *(["--resume"] if commits else []))
    assert result.exit_code == 3, result.output
    if out == "out.parquet":
        output = read_parquet(out)
        assert output.schema.equals(view_columns().schema.append(pa.field("translation", pa.string())))
        assert output.drop_columns(["translation"]).to_pylist() == [view_columns().to_pylist()[n] for n in (0, 2, 3)]
        assert output.column("translation").to_pylist() == ["ba", "dc", "fe"]
    else:
        assert [json.loads(line) for line in open(out)] == [
            {"text": "ab", "blob": "AA==", "tags": ["a"], "translation": "ba"},
            {"text": "cd", "blob": None, "tags": ["b", None], "translation": "dc"},
            {"text": "ef", "blob": "", "tags": [], "translation": "fe"}]
    assert [json.loads(line)["row"] for line in open("errors.jsonl")] == [2]


def test_translate_table_takes_view_columns_with_a_failed_row():
    import nllbcli

    sample = nllbcli.load(str(Path(__file__).parent.parent / "data" / "samples" / "model"), "cpu")
    greedy = nllbcli.DecodeOptions(beam_size=1, max_length=8)
    table = nllbcli.translate_table(sample, view_columns(), "eng_Latn", "fra_Latn", greedy, on_error="skip")
    assert table.drop_columns(["translation"]).to_pylist() == [view_columns().to_pylist()[n] for n in (0, 2, 3)]
    plain = nllbcli.translate(sample, ["ab", "cd", "ef"], "eng_Latn", "fra_Latn", greedy)
    assert table.column("translation").to_pylist() == [r.text for r in plain]
