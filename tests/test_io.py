import io
import os
from contextlib import contextmanager

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nllbcli.errors import NllbError
from nllbcli.io import Added, Record, format_of, open_input, open_sink


@pytest.mark.parametrize(
    "path,given,expected",
    [("a.jsonl", None, "jsonl"), ("A.PARQUET", None, "parquet"), ("a.txt", None, "text"), ("-", None, "text"), ("-", "jsonl", "jsonl"), ("a.csv", "text", "text"),
     ("a.ndjson", None, "jsonl"), ("a.json", None, "jsonl"), ("a.jsonl.gz", None, "jsonl"), ("a.parquet.zst", None, "parquet"), ("a.TXT.GZ", None, "text")],
)
def test_format_of(path, given, expected):
    assert format_of(path, given) == expected


def test_format_of_unknown_extension():
    with pytest.raises(NllbError, match=r"cannot tell the format of OUTPUT a\.xlsx\.gz from its extension \(tried: \.xlsx; "):
        format_of("a.xlsx.gz", None)


def read(path, fmt, field="text", stdin=None, errors=False):
    with open_input(str(path), fmt, field, stdin=stdin, count=True) as source:
        if errors:
            return source.total, [(r.index, r.text, r.fields, r.error) for r in source.records]
        return source.total, [(r.index, r.text, r.fields) for r in source.records]


def test_read_text_lines(tmp_path):
    (tmp_path / "in.txt").write_bytes("\ufeffone\r\ntwo\r\r\n\nlast".encode())
    total, records = read(tmp_path / "in.txt", "text")
    assert total == 4
    assert [text for _, text, _ in records] == ["one", "two\r", "", "last"]
    assert records[0] == (0, "one", {"text": "one"})


def test_read_text_from_stdin_has_no_total():
    assert read("-", "text", stdin=io.BytesIO(b"a\nb\n")) == (None, [(0, "a", {"text": "a"}), (1, "b", {"text": "b"})])


def test_read_text_bad_utf8_is_a_bad_row(tmp_path):
    (tmp_path / "in.txt").write_bytes(b"ok\nbad \xff\nlast\n")
    _, records = read(tmp_path / "in.txt", "text", errors=True)
    assert records == [(0, "ok", {"text": "ok"}, None), (1, "", {}, f"{tmp_path / 'in.txt'}:2: not valid UTF-8 (byte 5)."),
                       (2, "last", {"text": "last"}, None)]


@pytest.mark.parametrize(
    "line,error",
    [
        (b'{"text": "a"', "not valid JSON: Expecting ',' delimiter (column 13)."),
        (b"[1]", "expected a JSON object, not list."),
        (b'{"text": 1}', "field 'text' is int, not a string."),
        (b'{"text": null}', "field 'text' is null, not a string."),
        (b'{"body": "a"}', "no field 'text' to translate (fields: body); name the text field with --field."),
        (b"\xfe{}", "not valid UTF-8 (byte 1)."),
        (b"[" * 100_000, "JSON nested too deeply to read."),
    ],
)
def test_read_jsonl_bad_rows_keep_their_place(tmp_path, line, error):
    (tmp_path / "in.jsonl").write_bytes(b'{"text": "a"}\n\n' + line + b'\n{"text": "b"}\n')
    _, records = read(tmp_path / "in.jsonl", "jsonl", errors=True)
    assert [(i, t, e) for i, t, _, e in records] == [(0, "a", None), (1, "", f"{tmp_path / 'in.jsonl'}:3: {error}"), (2, "b", None)]


@pytest.mark.parametrize("fmt", ["text", "jsonl", "parquet", "csv", "tsv"])
def test_readers_continue_from_a_position(tmp_path, fmt):
    from nllbcli.io import Position

    texts = [f"row {i}" for i in range(2500)]
    path = tmp_path / f"in.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.table({"text": texts}), path, row_group_size=700)
    elif fmt == "jsonl":
        path.write_text("".join(f'{{"text": "{t}"}}\n\n' for t in texts))
    elif fmt in ("csv", "tsv"):  # a header after a blank line, records of two lines, a byte-order mark
        texts = [t.replace(" ", "\n") for t in texts]
        sep = "," if fmt == "csv" else "\t"
        path.write_bytes(b"\xef\xbb\xbf\r\n" + f"n{sep}text\r\n".encode() + "".join(f'{i}{sep}"{t}"\r\n' for i, t in enumerate(texts)).encode())
    else:
        path.write_text("".join(t + "\n" for t in texts))
    with open_input(str(path), fmt, "text") as source:
        records = iter(source.records)
        head = [next(records) for _ in range(1234)]
        position = Position(**vars(source.position))
    with open_input(str(path), fmt, "text", start=position) as source:
        rest = list(source.records)
    assert [r.text for r in head + rest] == texts
    assert [r.index for r in rest] == list(range(1234, 2500))
    if fmt in ("csv", "tsv"):
        assert rest[0].where == f"{path}: row 1235 (line {2 + 2 * 1234 + 1})"
        assert rest[0].fields == {"n": "1234", "text": "row\n1234"}
    elif fmt != "parquet":
        assert rest[0].where == f"{path}:{1235 if fmt == 'text' else 2 * 1234 + 1}"


def test_jsonl_blank_lines_are_json_whitespace_only(tmp_path):
    """A line of other characters Python calls space (\x1c, U+2028, a form feed) is a bad row in its place, never
    dropped as blank (found by test_hostile: such a row was lost); the count agrees, a byte-order mark included."""
    (tmp_path / "in.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "a"}\n \t\r\n\x1c\n\xe2\x80\xa8\n\x0c\n\n{"text": "b"}\n')
    total, records = read(tmp_path / "in.jsonl", "jsonl", errors=True)
    assert total == len(records) == 5
    assert [(i, t) for i, t, _, _ in records] == [(0, "a"), (1, ""), (2, ""), (3, ""), (4, "b")]
    assert [e is None for *_, e in records] == [True, False, False, False, True]
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf\n{\"text\": \"a\"}\n")
    total, records = read(tmp_path / "bom.jsonl", "jsonl")
    assert total == len(records) == 1


def test_read_jsonl_skips_blank_lines_and_counts_rows(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n\n  \n{"text": "b", "k": [1]}')
    total, records = read(tmp_path / "in.jsonl", "jsonl")
    assert total == 2
    assert records == [(0, "a", {"text": "a"}), (1, "b", {"text": "b", "k": [1]})]


def test_read_parquet(tmp_path):
    pq.write_table(pa.table({"n": [1, 2, 3], "body": ["a", "b", "c"]}), tmp_path / "in.parquet", row_group_size=2)
    total, records = read(tmp_path / "in.parquet", "parquet", field="body")
    assert total == 3
    assert records[2] == (2, "c", {"n": 3, "body": "c"})


def test_read_parquet_dictionary_column(tmp_path):
    pq.write_table(pa.table({"text": pa.array(["a", "b", "a"]).dictionary_encode()}), tmp_path / "in.parquet")
    assert [text for _, text, _ in read(tmp_path / "in.parquet", "parquet")[1]] == ["a", "b", "a"]


def test_read_parquet_missing_column(tmp_path):
    pq.write_table(pa.table({"n": [1]}), tmp_path / "in.parquet")
    with pytest.raises(NllbError, match=r"no column 'text' to translate \(columns: n\)"):
        read(tmp_path / "in.parquet", "parquet")


def test_read_truncated_parquet(tmp_path):
    pq.write_table(pa.table({"text": ["a"] * 100}), tmp_path / "in.parquet")
    data = (tmp_path / "in.parquet").read_bytes()
    (tmp_path / "in.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(NllbError, match="cannot read it as Parquet"):
        read(tmp_path / "in.parquet", "parquet")


def as_values(translations):
    """What a writer takes for rows with these translations (None: a failed row)."""
    return [None if t is None else {"translation": t} for t in translations]


def records_of(*texts, **fields):
    return [Record(i, t, {"text": t, **fields}) for i, t in enumerate(texts)]


@contextmanager
def open_writer(stream, fmt, schema=None):
    """A writer of `fmt` on `stream` whose rows that cannot be written raise NllbError, as --on-error fail."""
    sink = open_sink(stream, fmt, Added("translation"), schema, "text")

    def write(records, translations):
        for _, error in sink.write(records, as_values(translations)):
            raise NllbError(error)

    try:
        yield write
    except BaseException:
        sink.abort()
        raise
    sink.close()


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "text", "csv", "tsv"])
def test_writers_to_a_stream(fmt):
    stream = io.BytesIO()
    with open_writer(stream, fmt) as write:
        write(records_of("a", "b", n=1), ["A", "B"])
        write(records_of("c", n=2), ["C"])
    if fmt == "text":
        assert stream.getvalue() == b"A\nB\nC\n"
    elif fmt in ("csv", "tsv"):  # the first row named the columns (no schema: JSONL's rows)
        sep = b"," if fmt == "csv" else b"\t"
        assert stream.getvalue() == b"\n".join(sep.join(row) for row in [[b"text", b"n", b"translation"], [b"a", b"1", b"A"],
                                                                        [b"b", b"1", b"B"], [b"c", b"2", b"C"]]) + b"\n"
    elif fmt == "jsonl":
        assert stream.getvalue().decode().splitlines()[2] == '{"text": "c", "n": 2, "translation": "C"}'
    else:
        table = pq.read_table(io.BytesIO(stream.getvalue()))
        assert table.column("translation").to_pylist() == ["A", "B", "C"]
        assert pq.ParquetFile(io.BytesIO(stream.getvalue())).metadata.num_row_groups == 2


def test_parquet_writer_replaces_an_existing_translation_column():
    stream = io.BytesIO()
    schema = pa.schema([("translation", pa.int64()), ("text", pa.string())])
    with open_writer(stream, "parquet", schema) as write:
        write([Record(0, "a", {"translation": 5, "text": "a"})], ["A"])
    assert pq.read_table(io.BytesIO(stream.getvalue())).to_pylist() == [{"translation": "A", "text": "a"}]


def test_parquet_writer_rejects_rows_that_do_not_fit():
    stream = io.BytesIO()
    with pytest.raises(NllbError, match=r"^in:2: does not fit the Parquet schema of the rows before it: field 'n' is string where it was int64\.$"):
        with open_writer(stream, "parquet") as write:
            write(records_of("a", n=1), ["A"])
            write([Record(1, "b", {"text": "b", "n": "two"}, where="in:2")], ["B"])


def test_parquet_sink_fails_only_the_rows_that_do_not_fit():
    from nllbcli.io.parquet import ParquetSink

    stream = io.BytesIO()
    sink = ParquetSink(stream, None, Added("translation"), "text")
    records = [Record(0, "a", {"text": "a", "n": 1}, where="r1"), Record(1, "b", {"text": "b", "n": "x"}, where="r2"),
               Record(2, "c", {"text": "c", "n": 3}, where="r3"), Record(3, "d", {"text": "d", "n": 4}, where="r4")]
    failed = sink.write(records, as_values(["A", "B", "C", None]))
    sink.close()
    assert [(r.index, e.split(":")[0]) for r, e in failed] == [(1, "r2")]
    assert pq.read_table(io.BytesIO(stream.getvalue())).to_pylist() == [
        {"text": "a", "n": 1, "translation": "A"}, {"text": "c", "n": 3, "translation": "C"}]


def test_jsonl_writer_fails_rows_utf8_cannot_hold():
    from nllbcli.io import LineSink

    stream = io.BytesIO()
    records = [Record(0, "a", {"text": "a", "x": "\ud800"}, where="in:1"), Record(1, "b", {"text": "b"}, where="in:2")]
    failed = LineSink(stream, "jsonl", Added("translation")).write(records, as_values(["A", "B"]))
    assert [(r.index, e) for r, e in failed] == [(0, "in:1: holds a lone surrogate (a \\ud800-\\udfff escape), which UTF-8 cannot write.")]
    assert stream.getvalue() == b'{"text": "b", "translation": "B"}\n'


def test_text_writer_keeps_failed_rows_as_empty_lines():
    from nllbcli.io import LineSink

    stream = io.BytesIO()
    LineSink(stream, "text", Added("translation")).write(records_of("a", "b", "c"), as_values(["A", None, "C"]))
    assert stream.getvalue() == b"A\n\nC\n"


def test_json_output_of_parquet_values():
    import datetime
    import decimal

    stream = io.BytesIO()
    fields = {"text": "a", "day": datetime.date(2024, 5, 1), "price": decimal.Decimal("1.50"), "raw": b"\x00\x01"}
    with open_writer(stream, "jsonl") as write:
        write([Record(0, "a", fields)], ["A"])
    assert stream.getvalue() == b'{"text": "a", "day": "2024-05-01", "price": "1.50", "raw": "AAE=", "translation": "A"}\n'


def test_a_replaced_output_keeps_its_mode(fake, tmp_path):
    """The output is written beside the destination (private, 0600) and renamed onto it with the mode of the
    file it replaces."""
    from click.testing import CliRunner

    from nllbcli.cli import cli

    (tmp_path / "in.txt").write_text("ab\n")
    command = ["translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn", str(tmp_path / "in.txt"), str(tmp_path / "out.txt")]
    assert CliRunner().invoke(cli, command).exit_code == 0
    os.chmod(tmp_path / "out.txt", 0o640)
    assert CliRunner().invoke(cli, command).exit_code == 0
    assert os.stat(tmp_path / "out.txt").st_mode & 0o777 == 0o640
    assert sorted(os.listdir(tmp_path)) == [".out.txt.nllb-state.json", "in.txt", "out.txt"]
