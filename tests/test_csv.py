"""CSV and TSV through the CLI with the fake translator (which reverses each text): a header, RFC 4180 quoting
(separators, quotes and line breaks in fields), every other column kept as its text, the job's columns last, bad
rows failing alone named by row and line, a byte-order mark and CRLF line ends, conversions to and from JSONL,
Parquet and text, resume; and a JSON Lines input that is one JSON array, refused with the jq command that makes it
JSON Lines."""

from __future__ import annotations

import csv
import datetime
import gzip
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
TINY = str(Path(__file__).parent / "models" / "tiny-a")
# separators, quotes, line breaks (LF, CRLF, CR) and spaces in fields, quotes where none are needed, empty fields
QUOTED = (b'id,text,note\r\n007,"My uncle, the doctor","said ""hi"""\r\n1.50,"two\nlines",  spaced  \r\n,"",\r\n'
          b'"x","cr\ralone","tab\there"\r\n')
QUOTED_OUT = (b'id,text,note,translation\n007,"My uncle, the doctor","said ""hi""","rotcod eht ,elcnu yM"\n'
              b'1.50,"two\nlines",  spaced  ,"owt\nsenil"\n,,,\nx,"cr\ralone",tab\there,"rc\renola"\n')


def translate(*args, input=None):
    return CliRunner().invoke(cli, TRANSLATE + list(args), input=input)


def as_tsv(data: bytes) -> bytes:
    """The same records as TSV, as the csv module writes them (quotes only where a field needs them)."""
    out = io.StringIO()
    csv.writer(out, dialect="excel-tab").writerows(csv.reader(io.StringIO(data.decode(), newline="")))
    return out.getvalue().encode()


def test_fields_keep_their_text_and_are_quoted_where_rfc_4180_needs(fake, here):
    (here / "in.csv").write_bytes(QUOTED)
    result = translate("in.csv", "out.csv")
    assert result.exit_code == 0, result.output
    assert (here / "out.csv").read_bytes() == QUOTED_OUT
    assert listing(here) == ["in.csv", "out.csv"]


def test_tsv_quotes_tabs_not_commas(fake, here):
    (here / "in.tsv").write_bytes(as_tsv(QUOTED))
    result = translate("in.tsv", "out.tsv")
    assert result.exit_code == 0, result.output
    assert (here / "out.tsv").read_bytes() == (
        b'id\ttext\tnote\ttranslation\n007\tMy uncle, the doctor\t"said ""hi"""\trotcod eht ,elcnu yM\n'
        b'1.50\t"two\nlines"\t  spaced  \t"owt\nsenil"\n\t\t\t\nx\t"cr\ralone"\t"tab\there"\t"rc\renola"\n')
    assert translate("in.tsv", "out.csv").exit_code == 0
    assert (here / "out.csv").read_bytes() == QUOTED_OUT


def test_a_byte_order_mark_is_kept_and_blank_lines_hold_no_row(fake, here):
    (here / "in.csv").write_bytes(b'\xef\xbb\xbf\r\n"id",text\r\n\r\n1,ab\r\n\n2,cd')
    result = CliRunner().invoke(cli, [*TRANSLATE[:1], *TRANSLATE[2:], "--progress", "json", "in.csv", "out.csv"])
    assert result.exit_code == 0, result.output
    assert (here / "out.csv").read_bytes() == b"\xef\xbb\xbfid,text,translation\n1,ab,ba\n2,cd,dc\n"
    assert '"total": 2' in result.stderr
    assert translate("in.csv", "out.jsonl").exit_code == 0  # a JSONL output has none
    assert (here / "out.jsonl").read_bytes() == b'{"id": "1", "text": "ab", "translation": "ba"}\n{"id": "2", "text": "cd", "translation": "dc"}\n'


@pytest.mark.parametrize("content,expected", [
    (b"id,text\n", b"id,text,translation\n"),  # a header alone
    (b"", b"text,translation\n"),  # nothing: the text column and the job's
    (b"\n\r\n", b"text,translation\n"),
])
def test_inputs_without_rows(fake, here, content, expected):
    (here / "in.csv").write_bytes(content)
    result = translate("in.csv", "out.csv")
    assert result.exit_code == 0, result.output
    assert (here / "out.csv").read_bytes() == expected


BAD = (b'id,text,note\n1,ab,x\n2,cd\n3,"e""f",x,y\n4,gh\xff,x\n5,"ij"k,x\n6,kl\rmn,x\n7,"a\nmulti, line",x\n'
       b'8,"unclosed,x\n9,op,x\n')


def test_bad_rows_fail_alone_named_by_row_and_line(fake, here):
    (here / "in.csv").write_bytes(BAD)
    result = translate("--errors", "errors.jsonl", "in.csv", "out.csv")
    assert result.exit_code == 3, result.output
    assert (here / "out.csv").read_bytes() == b'id,text,note,translation\n1,ab,x,ba\n7,"a\nmulti, line",x,"a\nenil ,itlum"\n'
    assert [json.loads(line) for line in open("errors.jsonl")] == [
        {"row": 2, "error": "in.csv: row 2 (line 3): has 2 fields where the header has 3.", "input": "2,cd"},
        {"row": 3, "error": "in.csv: row 3 (line 4): has 4 fields where the header has 3.", "input": '3,"e""f",x,y'},
        {"row": 4, "error": "in.csv: row 4 (line 5): not valid UTF-8 (byte 5).", "input": "4,gh\\xff,x"},
        {"row": 5, "error": "in.csv: row 5 (line 6): a quoted field goes on after its closing quote (a quote in a "
                            "quoted field is written twice).", "input": '5,"ij"k,x'},
        {"row": 6, "error": "in.csv: row 6 (line 7): holds a carriage return outside quotes (a line break in a field "
                            "is written in quotes).", "input": "6,kl\rmn,x"},
        # the quote left open takes the rest of the input into its row
        {"row": 8, "error": "in.csv: row 8 (line 10): a quote opened in it is still open at the end of the input.",
         "input": '8,"unclosed,x\n9,op,x'}]


def test_a_bad_row_fails_the_job_by_default_and_is_named_when_skipped(fake, here):
    (here / "in.csv").write_bytes(b"id,text\n1,ab\n2\n3,cd\n")
    result = translate("in.csv", "out.csv")
    assert result.exit_code == 1
    assert result.stderr == "Error: in.csv: row 2 (line 3): has 1 field where the header has 2.\n"
    assert listing(here) == ["in.csv"]
    result = translate("--on-error", "skip", "in.csv", "out.csv")
    assert result.exit_code == 3
    assert result.stderr == "Skipped: in.csv: row 2 (line 3): has 1 field where the header has 2.\n"
    assert (here / "out.csv").read_bytes() == b"id,text,translation\n1,ab,ba\n3,cd,dc\n"


@pytest.mark.parametrize("content,args,message", [
    (b"id,body\n1,ab\n", [], "in.csv: no column 'text' to translate (columns: 'id', 'body'); name the text column with --field."),
    (b"id,text,id\n1,ab,2\n", [], "in.csv: the header names the column 'id' more than once, and a row holds each column once: rename one."),
    (b"\nid,te\xffxt\n1,ab\n", [], "in.csv: line 2: cannot read the header: not valid UTF-8 (byte 6)."),
    (b'id,"text\n1,ab\n', [], "in.csv: line 1: cannot read the header: a quote opened in it is still open at the end of the input."),
    (b"id,text,translation\n1,ab,x\n", [], "in.csv: it has a column 'translation' already, which --output-field would replace: name "
                                           "another with --output-field, or pass --overwrite-field to replace it."),
    (b"id,text,st\n1,ab,x\n", ["--status-field", "st"], "in.csv: it has a column 'st' already, which --status-field would "
                                                       "replace: name another with --status-field, or pass --overwrite-field to replace it."),
])
def test_a_header_the_job_cannot_use_is_one_line(fake, here, content, args, message):
    (here / "in.csv").write_bytes(content)
    result = translate(*args, "in.csv", "out.csv")
    assert result.exit_code == 1
    assert result.stderr == f"Error: {message}\n"
    assert listing(here) == ["in.csv"]


def test_the_jobs_columns_go_last_or_in_place(fake, here):
    (here / "in.csv").write_bytes(b"translation,text,n\nold,ab,1\n")
    result = translate("--overwrite-field", "--status-field", "status", "--scores", "in.csv", "out.csv")
    assert result.exit_code == 0, result.output
    assert (here / "out.csv").read_bytes() == b"translation,text,n,status,score,log_prob\nba,ab,1,ok,-0.5,-2.0\n"
    result = translate("--overwrite-field", "--output-field", "text", "in.csv", "out.csv")
    assert (here / "out.csv").read_bytes() == b"translation,text,n\nold,ba,1\n"


def test_several_targets_hypotheses_and_row_languages(fake, here):
    (here / "in.csv").write_bytes(b"text,src_lang,tgt_lang\nab,,\ncd,eng_Latn,deu_Latn\nef,,klingon\n")
    result = CliRunner().invoke(cli, ["translate", "-q", "--src", "en", "--tgt", "fr", "--on-error", "skip", "in.csv",
                                      "out.csv"])
    assert result.exit_code == 3
    assert result.stderr.startswith("Skipped: in.csv: row 3 (line 4): field 'tgt_lang': unknown language code 'klingon'")
    assert (here / "out.csv").read_bytes() == b"text,src_lang,tgt_lang,translation\nab,,,ba\ncd,eng_Latn,deu_Latn,dc\n"
    assert fake.languages == [["fra_Latn", "deu_Latn"]]  # an empty field names no language: --tgt's
    result = translate("--tgt", "fra_Latn,deu_Latn", "--num-hypotheses", "2", "--beam-size", "2", "--scores", "in.csv",
                       "out.csv")
    assert result.exit_code == 0, result.output  # (several targets: the rows' own are not read)
    assert (here / "out.csv").read_bytes().splitlines()[:2] == [
        b"text,src_lang,tgt_lang,translation_fra_Latn,translation_deu_Latn,score_fra_Latn,score_deu_Latn,"
        b"log_prob_fra_Latn,log_prob_deu_Latn",
        b'ab,,,"[""ba"", ""ba1""]","[""ba"", ""ba1""]","[-0.5, -0.75]","[-0.5, -0.75]","[-2.0, -2.5]","[-2.0, -2.5]"']
    result = translate("--tgt", "fra_Latn,deu_Latn", "--targets-as", "rows", "--tgt-lang-field", "to", "--src-lang-field",
                       "", "in.csv", "out.csv")
    assert result.exit_code == 0, result.output
    assert (here / "out.csv").read_bytes().splitlines()[:3] == [b"text,src_lang,tgt_lang,to,translation",
                                                                b"ab,,,fra_Latn,ba", b"ab,,,deu_Latn,ba"]


def test_jsonl_to_csv_takes_its_columns_from_the_first_row_written(fake, here):
    rows = ['{"text": "ab", "n": 1, "m": {"a": [1, 2.5]}, "z": null, "t": true}', '{"text": 5}',
            '{"text": "cd", "extra": 1}', '{"n": 1e400, "text": "ef"}', '{"text": "gh", "n": "\\ud800"}']
    (here / "in.jsonl").write_text("".join(row + "\n" for row in rows))
    result = translate("--on-error", "skip", "in.jsonl", "out.csv")
    assert result.exit_code == 3
    assert result.stderr.splitlines()[1:] == [
        "Skipped: in.jsonl:3: field 'extra' is not one of the CSV output's columns, which the first row written named "
        "(text, n, m, z, t, translation): write JSONL or Parquet, which keep every row's fields.",
        "Skipped: in.jsonl:5: holds a lone surrogate (a \\ud800-\\udfff escape), which UTF-8 cannot write."]
    assert (here / "out.csv").read_bytes() == (b'text,n,m,z,t,translation\nab,1,"{""a"": [1, 2.5]}",,true,ba\n'
                                               b"ef,1e400,,,,fe\n")  # a field a row lacks is empty


def test_parquet_values_are_written_as_text(fake, here):
    table = pa.table({"text": ["ab", "cd"], "n": [1, 2], "x": [0.5, float("nan")], "day": [datetime.date(2024, 5, 1), None],
                      "tags": [["a", "b"], []], "ok": [True, None]})
    pq.write_table(table, "in.parquet")
    result = translate("in.parquet", "out.csv")
    assert result.exit_code == 0, result.output
    assert (here / "out.csv").read_bytes() == (b'text,n,x,day,tags,ok,translation\nab,1,0.5,2024-05-01,"[""a"", ""b""]",true,ba\n'
                                               b"cd,2,NaN,,[],,dc\n")
    pq.write_table(pa.Table.from_arrays([pa.array(["ab"]), pa.array([1]), pa.array([2])], names=["text", "n", "n"]), "dup.parquet")
    result = translate("dup.parquet", "out.tsv")
    assert result.exit_code == 1
    assert result.stderr == ("Error: dup.parquet: more than one column (or struct field) is named 'n', and a TSV row (its "
                             "objects JSON text) holds each name once: rename them, or write Parquet, which keeps them.\n")


@pytest.mark.parametrize("target", ["out.jsonl", "out.parquet", "out.txt", "out.tsv"])
def test_csv_to_the_other_formats_and_back(fake, here, target):
    (here / "in.csv").write_bytes(b'id,text\n1,"a, b"\n2,\n')
    result = translate("in.csv", target)
    assert result.exit_code == 0, result.output
    if target == "out.jsonl":
        assert (here / target).read_text() == ('{"id": "1", "text": "a, b", "translation": "b ,a"}\n'
                                               '{"id": "2", "text": "", "translation": ""}\n')  # values are strings
    elif target == "out.parquet":
        table = pq.read_table(target)
        assert table.schema == pa.schema([("id", pa.string()), ("text", pa.string()), ("translation", pa.string())])
        assert table.to_pylist() == [{"id": "1", "text": "a, b", "translation": "b ,a"}, {"id": "2", "text": "", "translation": ""}]
    elif target == "out.txt":
        assert (here / target).read_text() == "b ,a\n\n"
    else:
        assert (here / target).read_bytes() == b"id\ttext\ttranslation\n1\ta, b\tb ,a\n2\t\t\n"
    back = translate("--field", "translation", "--output-field", "back", target, "back.csv")
    assert back.exit_code == 0, back.output
    assert (here / "back.csv").read_bytes().splitlines()[1].endswith(b'"b ,a","a, b"')


def test_text_to_csv_and_stdin_to_stdout(fake, here):
    (here / "in.txt").write_text('ab\n"q", r\n')
    assert translate("in.txt", "out.csv").exit_code == 0
    assert (here / "out.csv").read_bytes() == b'text,translation\nab,ba\n"""q"", r","r ,""q"""\n'
    result = translate("--input-format", "csv", input=b'text\n"x\ny"\n')
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == b'text,translation\n"x\ny","x\ny"\n'  # CSV in, CSV out
    result = translate("--input-format", "tsv", "--output-format", "jsonl", input=b"n\ttext\n1\tab\n")
    assert result.stdout_bytes == b'{"n": "1", "text": "ab", "translation": "ba"}\n'
    (here / "two.txt").write_text("cd\n")
    result = translate("--output-format", "csv", "-o", "dir", "in.txt", "two.txt")
    assert result.exit_code == 0, result.output
    assert listing("dir") == ["in.csv", "two.csv"]


@pytest.mark.parametrize("source,target,commits", [("in.csv", "out.csv", 1), ("in.csv", "out.csv", 3),
                                                   ("in.csv.gz", "out.tsv.zst", 2), ("in.jsonl", "out.csv", 2)])
def test_a_resumed_job_gives_the_same_bytes(fake, here, source, target, commits):
    """The partial file cut back to the last commit, the input's header read again and its rows continued at the
    saved byte (records spanning lines, a byte-order mark); a JSONL input's columns read back from the partial
    file."""
    texts = [f"row {n}" + ("\nnext, line" if n % 3 == 0 else "") for n in range(9)]
    if source.startswith("in.csv"):
        out = io.StringIO()
        csv.writer(out, lineterminator="\r\n").writerows([["id", "text"], *([n, t] for n, t in enumerate(texts))])
        data = b"\xef\xbb\xbf" + out.getvalue().encode()
        (here / source).write_bytes(gzip.compress(data) if source.endswith(".gz") else data)
    else:
        rows = [{"text": t, **({"n": n} if n % 2 == 0 else {})} for n, t in enumerate(texts)]  # the first names the columns
        (here / source).write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = ["--chunk-rows", "2", source, target]
    assert translate(*args).exit_code == 0
    straight = (here / target).read_bytes()
    os.unlink(target)
    with stopped_after_commits(commits) as saved:
        assert translate(*args).exit_code == 130
    assert not (here / target).exists() and saved[-1].position.rows == 2 * commits
    result = translate(*args, "--resume")
    assert result.exit_code == 0, result.output
    assert (here / target).read_bytes() == straight
    assert listing(here) == sorted([source, target])


@pytest.mark.parametrize("name,message", [
    ("in.json", "in.json is one JSON array, not JSON Lines (a JSON object a line): `jq -c '.[]' in.json > in.jsonl` "
                "turns it into JSON Lines."),
    ("in.jsonl", "in.jsonl is one JSON array, not JSON Lines (a JSON object a line): `jq -c '.[]' in.jsonl > "
                 "in.lines.jsonl` turns it into JSON Lines."),
    ("in.json.gz", "in.json.gz is one JSON array, not JSON Lines (a JSON object a line): `gzip -dc in.json.gz | jq -c "
                   "'.[]' > in.jsonl` turns it into JSON Lines."),
    ("in data", "in data is one JSON array, not JSON Lines (a JSON object a line): `jq -c '.[]' 'in data' > "
                "'in data.jsonl'` turns it into JSON Lines."),
])
def test_a_json_array_file_is_named_with_the_jq_command(fake, here, name, message):
    array = b'\xef\xbb\xbf [\n  {"id": 1, "text": "My uncle"},\n  {"id": 2, "text": "b"}\n]\n'
    (here / name).write_bytes(gzip.compress(array) if name.endswith(".gz") else array)
    result = translate(name, "out.jsonl")
    assert result.exit_code == 2
    assert result.stderr == f"Error: {message}\n"
    assert fake.loaded == [] and listing(here) == [name]


def test_a_json_array_on_stdin_is_named_and_lists_in_json_lines_are_bad_rows(fake, here):
    stdin = "Error: <stdin> is one JSON array, not JSON Lines (a JSON object a line): pipe it through `jq -c '.[]'` to make it JSON Lines.\n"
    result = translate(input=b'[{"text": "a"}, {"text": "b"}]')  # found from its bytes
    assert (result.exit_code, result.stderr) == (2, stdin)
    result = translate("--input-format", "jsonl", input=b'\n[\n{"text": "a"}\n,{"text": "b"}]\n')  # by the reader
    assert (result.exit_code, result.stderr) == (1, stdin)
    # a row that is a list, or a line `[` before objects, is a bad row as before
    result = translate("--input-format", "jsonl", "--on-error", "skip", input=b'[1, 2]\n{"text": "ab"}\n[\n{"text": "cd"}\n')
    assert result.exit_code == 3
    assert result.stdout == '{"text": "ab", "translation": "ba"}\n{"text": "cd", "translation": "dc"}\n'
    assert result.stderr == ("Skipped: <stdin>:1: expected a JSON object, not list.\n"
                             "Skipped: <stdin>:3: not valid JSON: Expecting value (column 2).\n")
    result = translate(input=b"[not json]\n")
    assert result.stdout == "]nosj ton[\n"


def test_ray_refuses_csv_and_json_arrays_in_one_line(here):
    (here / "in.csv").write_text("text\nab\n")
    (here / "in.json").write_text('[{"text": "ab"}]')
    for name, message in (("in.csv", "--ray reads JSONL and Parquet, not csv."),
                          ("in.json", "in.json is one JSON array, not JSON Lines (a JSON object a line): `jq -c '.[]' "
                                      "in.json > in.jsonl` turns it into JSON Lines.")):
        result = CliRunner().invoke(cli, ["translate", "--ray", "-m", TINY, "--src", "en", "--tgt", "fr", name, "out"])
        assert (result.exit_code, result.stderr) == (1, f"Error: {message}\n")
