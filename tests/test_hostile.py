"""Hostile input through the CLI (hypothesis): invalid UTF-8, NUL bytes, very long lines, nested JSON, nulls and
wrong types, empty and whitespace rows, CSV fields holding separators, quotes and line breaks, ragged records. Every row ends up exactly once, in order, either translated or named in
the errors file; the job never crashes (exit 0, or 3 with failed rows)."""

from __future__ import annotations

import json
import os
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nllbcli.cli import cli

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


def good_line(i):
    return st.builds(lambda text, extra: json.dumps({"i": i, "text": text, "extra": extra}, ensure_ascii=False).encode("utf-8", "surrogatepass"),
                     TEXT | st.just("a" * 20_000) | st.just("x\x00y. Z\u2028w"), JSON_VALUE)


BAD_LINES = st.one_of(
    st.binary(max_size=60).filter(lambda b: b"\n" not in b and b.strip()),  # anything, invalid UTF-8 included
    st.builds(lambda v: json.dumps({"text": v}).encode(), st.none() | st.integers() | st.lists(st.integers(), max_size=2)),
    st.builds(lambda v: json.dumps(v).encode(), st.lists(st.integers(), max_size=3) | st.integers() | st.text(max_size=5)),
    st.just(b'{"text": "\\ud800 lone surrogate"}'),  # valid JSON that UTF-8 cannot write
    st.just(b"[" * 50_000),  # nested too deeply
    st.just(b'{"text": "ok", "tgt_lang": "klingon"}'),
    st.just(b'{"text": "ok", "src_lang": 7}'),
)


def run(args, fake):
    return CliRunner().invoke(cli, ["translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn", "--on-error", "record",
                                    "--chunk-rows", "7", *args])


@SETTINGS
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3)), max_size=40), st.data())
def test_jsonl_every_row_once_in_order(fake, plan, data):
    lines, number = [], 0
    for good, blanks in plan:
        lines += [b"", b"  \t"][:blanks % 3]  # blank lines hold no row
        number += 1
        lines.append(data.draw(good_line(number)) if good else data.draw(BAD_LINES))
    with tempfile.TemporaryDirectory() as directory:
        source, target, errors = (os.path.join(directory, name) for name in ("in.jsonl", "out.jsonl", "errors.jsonl"))
        with open(source, "wb") as stream:
            stream.write(b"\n".join(lines) + (b"\n" if lines else b""))
        result = run(["--errors", errors, source, target], fake)
        assert result.exit_code in (0, 3), result.output
        assert "Traceback" not in result.output
        written = [json.loads(line) for line in open(target, "rb")]
        failed = [json.loads(line) for line in open(errors, "rb")]
    rows = [row["i"] for row in written if "i" in row] + [row["row"] for row in failed]
    assert len(written) + len(failed) == number
    assert sorted(rows) == list(range(1, number + 1))  # nothing lost, nothing twice
    assert [row["row"] for row in failed] == sorted(row["row"] for row in failed)
    good = [row for row in written if "i" in row]
    assert [row["i"] for row in good] == sorted(row["i"] for row in good)  # input order
    assert result.exit_code == (3 if failed else 0)


CSV_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00") | st.sampled_from(',"\r\n\t '), max_size=30)
CSV_BAD = st.one_of(
    st.just(b"1"),  # too few fields
    st.just(b'1,"a",b,c'),  # too many
    st.just(b"2,bad \xff utf-8,x"),
    st.just(b'3,"quoted"after,x'),
    st.just(b"4,cr\ralone,x"),
)


@settings(SETTINGS, max_examples=30)
@given(st.lists(st.one_of(st.tuples(CSV_TEXT, CSV_TEXT), CSV_BAD), max_size=30), st.sampled_from(["csv", "tsv"]))
def test_csv_every_row_once_in_order_with_its_fields(fake, rows, fmt):
    """Fields with separators, quotes and line breaks of every kind come back as they were; each bad record fails
    alone; blank lines hold no row."""
    import csv
    import io as stdio

    dialect = "excel" if fmt == "csv" else "excel-tab"
    lines = []
    for number, row in enumerate(rows, 1):
        if isinstance(row, bytes):
            lines.append(row.replace(b",", b"\t") if fmt == "tsv" else row)
        else:
            out = stdio.StringIO()
            csv.writer(out, dialect=dialect).writerow([number, *row])  # (CRLF ends: a CR in a field is quoted)
            lines.append(out.getvalue().encode("utf-8")[:-2])
    with tempfile.TemporaryDirectory() as directory:
        source, target, errors = (os.path.join(directory, name) for name in (f"in.{fmt}", f"out.{fmt}", "errors.jsonl"))
        with open(source, "wb") as stream:
            stream.write(b"n,text,note\r\n".replace(b",", b"," if fmt == "csv" else b"\t") + b"\r\n\n".join(lines))
        result = run(["--errors", errors, source, target], fake)
        assert result.exit_code in (0, 3), result.output
        assert "Traceback" not in result.output
        with open(target, encoding="utf-8", newline="") as stream:
            written = list(csv.reader(stream, dialect=dialect))
        failed = [json.loads(line)["row"] for line in open(errors, "rb")]
    assert written[0] == ["n", "text", "note", "translation"]
    good = [(n, row) for n, row in enumerate(rows, 1) if not isinstance(row, bytes)]
    assert [r[:3] for r in written[1:]] == [[str(n), *row] for n, row in good]  # in order, every field as it was
    assert failed == [n for n, row in enumerate(rows, 1) if isinstance(row, bytes)]
    assert result.exit_code == (3 if failed else 0)


@SETTINGS
@given(st.lists(st.binary(max_size=50).map(lambda b: b.replace(b"\n", b" ")), max_size=40))
@example([b"\xf1\x80\x80\x80"])  # U+40000: once taken for a language id by the fake, whose ids then began at 100,000
def test_text_lines_stay_aligned(fake, lines):
    with tempfile.TemporaryDirectory() as directory:
        source, target, errors = (os.path.join(directory, name) for name in ("in.txt", "out.txt", "errors.jsonl"))
        with open(source, "wb") as stream:
            stream.write(b"".join(line + b"\n" for line in lines))
        result = run(["--errors", errors, source, target], fake)
        assert result.exit_code in (0, 3), result.output
        output = open(target, "rb").read().decode("utf-8").split("\n")[:-1]
        failed = {json.loads(line)["row"] for line in open(errors, "rb")}
    assert len(output) == len(lines)  # line n of the output is row n of the input
    for number, (line, translated) in enumerate(zip(lines, output), start=1):
        try:
            text = line.decode("utf-8").removesuffix("\r")
        except UnicodeDecodeError:
            assert number in failed and translated == ""
            continue
        if number == 1:
            text = text.removeprefix("\ufeff")
        assert number not in failed
        # the fake reverses each sentence; joining changes only whitespace (chr(2) is the fake's </s>: dropped)
        def letters(t):
            return sorted(c for c in t if not c.isspace() and c != "\x02")

        assert letters(translated) == letters(text)


@SETTINGS
@given(st.lists(st.tuples(st.none() | TEXT, st.none() | st.integers(-5, 5), st.none() | st.just("de") | st.just("xx")), max_size=30), st.integers(1, 8))
def test_parquet_nulls_and_wrong_values(fake, rows, group):
    table = pa.table({
        "text": pa.array([r[0] for r in rows], pa.string()),
        "n": pa.array([r[1] for r in rows], pa.int64()),
        "tgt_lang": pa.array([r[2] for r in rows], pa.string()),
    })
    with tempfile.TemporaryDirectory() as directory:
        source, target, errors = (os.path.join(directory, name) for name in ("in.parquet", "out.parquet", "errors.jsonl"))
        pq.write_table(table, source, row_group_size=group)
        result = run(["--errors", errors, source, target], fake)
        assert result.exit_code in (0, 3), result.output
        written = pq.read_table(target).to_pylist()
        failed = [json.loads(line)["row"] for line in open(errors, "rb")]
    expected_failed = [i + 1 for i, r in enumerate(rows) if r[0] is None or r[2] == "xx"]
    assert failed == expected_failed
    kept = [r for r in rows if not (r[0] is None or r[2] == "xx")]
    assert [(w["text"], w["n"], w["tgt_lang"]) for w in written] == kept


def test_wrong_column_type_is_one_line_and_exit_1(fake, tmp_path):
    pq.write_table(pa.table({"text": pa.array([[1], [2]])}), tmp_path / "in.parquet")
    result = run([str(tmp_path / "in.parquet"), str(tmp_path / "out.parquet")] + ["--errors", str(tmp_path / "e.jsonl")], fake)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1 and "Traceback" not in result.output


def test_the_real_tokenizer_takes_hostile_text():
    """sentencepiece on NUL bytes, controls, private-use and astral characters: a translation or a row error."""
    from pathlib import Path

    from nllbcli.io import Record
    from nllbcli.options import BatchOptions, DecodeOptions
    from nllbcli.job.chunks import ChunkWorker
    from nllbcli.options import Job
    from nllbcli.model.translator import load_translator

    tiny = load_translator(str(Path(__file__).parent / "models" / "tiny-a"), "cpu")
    texts = ["a\x00b", "\x01\x02\x7f", "\ue000\U0010fffd", "🙂" * 300, "\u200b\u200d", "x" * 5000, "\ud800", "\t \u3000"]
    records = [Record(i, t, {}, where=f"in:{i + 1}") for i, t in enumerate(texts)]
    outcomes = ChunkWorker(tiny, Job("eng_Latn", "fra_Latn", on_error="skip"), DecodeOptions(beam_size=1, max_length=3), BatchOptions(max_batch_tokens=4096))(records)
    assert [o.error is None for o in outcomes] == [True, True, True, True, True, True, False, True]
    assert outcomes[6].error.startswith("in:7: field 'text' holds a lone surrogate")
    assert outcomes[5].cut and not outcomes[0].cut
