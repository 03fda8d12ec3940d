import csv
import io
import json
import re
import os
from pathlib import Path

import click
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from nllbcli.cli import cli
from nllbcli.errors import NllbError
from jobfiles import listing

TEXTS = ["The red car", "", "is in the garden", "   ", "on Monday."]
REVERSED = ["rac der ehT", "", "nedrag eht ni si", "", ".yadnoM no"]  # what the fake translator gives
TRANSLATE = ["translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn"]


def write_input(path, fmt, texts, **extra):
    """An input file of `texts` with extra fields (one value per row) beside the text field."""
    rows = [{"id": i, "text": t, **{k: v[i] for k, v in extra.items()}} for i, t in enumerate(texts)]
    if fmt == "text":
        path.write_text("".join(t + "\n" for t in texts))
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif fmt in ("csv", "tsv"):
        rows = as_text(rows)  # CSV has no types
        with open(path, "w", newline="") as stream:
            writer = csv.DictWriter(stream, list(rows[0]), dialect="excel" if fmt == "csv" else "excel-tab")
            writer.writeheader()
            writer.writerows(rows)
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return rows


def as_text(rows):
    return [{name: str(value) for name, value in row.items()} for row in rows]


def read_output(path, fmt):
    if fmt == "text":
        return path.read_text().splitlines()
    if fmt == "jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    if fmt in ("csv", "tsv"):
        return list(csv.DictReader(io.StringIO(path.read_text(), newline=""), dialect="excel" if fmt == "csv" else "excel-tab"))
    return pq.read_table(path).to_pylist()


EXTENSION = {"text": "txt", "jsonl": "jsonl", "parquet": "parquet", "csv": "csv", "tsv": "tsv"}


@pytest.mark.parametrize("fmt", ["text", "jsonl", "parquet", "csv", "tsv"])
def test_translate_file(fake, tmp_path, fmt):
    source, target = tmp_path / f"in.{EXTENSION[fmt]}", tmp_path / f"out.{EXTENSION[fmt]}"
    rows = write_input(source, fmt, TEXTS)
    result = CliRunner().invoke(cli, TRANSLATE + [str(source), str(target)])
    assert result.exit_code == 0, result.output
    assert result.output == ""
    expected = REVERSED if fmt == "text" else [{**row, "translation": t} for row, t in zip(rows, REVERSED)]
    assert read_output(target, fmt) == expected
    assert listing(tmp_path) == sorted([source.name, target.name])


def test_stdin_to_stdout_is_text(fake):
    result = CliRunner().invoke(cli, TRANSLATE, input="The red car\r\n\nis in the garden")
    assert result.exit_code == 0
    assert result.stdout == "rac der ehT\n\nnedrag eht ni si\n"
    assert result.stderr == ""


def test_stdin_jsonl_to_stdout(fake):
    lines = '{"text": "ab", "n": 1}\n\n{"n": 2, "text": "été"}\n'
    result = CliRunner().invoke(cli, TRANSLATE + ["--input-format", "jsonl", "-", "-"], input=lines)
    assert result.exit_code == 0
    assert result.stdout == '{"text": "ab", "n": 1, "translation": "ba"}\n{"n": 2, "text": "été", "translation": "été"}\n'


def test_stdin_parquet_to_stdout_parquet(fake, tmp_path):
    write_input(tmp_path / "in.parquet", "parquet", ["ab", "cd"])
    result = CliRunner().invoke(
        cli, TRANSLATE + ["--input-format", "parquet"], input=(tmp_path / "in.parquet").read_bytes()
    )
    assert result.exit_code == 0
    (tmp_path / "out.parquet").write_bytes(result.stdout_bytes)
    assert read_output(tmp_path / "out.parquet", "parquet") == [
        {"id": 0, "text": "ab", "translation": "ba"},
        {"id": 1, "text": "cd", "translation": "dc"},
    ]


@pytest.mark.parametrize(
    "source_format,target_format",
    [("text", "jsonl"), ("text", "parquet"), ("jsonl", "text"), ("jsonl", "parquet"), ("parquet", "jsonl"), ("parquet", "text"),
     ("csv", "jsonl"), ("csv", "parquet"), ("csv", "text"), ("csv", "tsv"), ("jsonl", "csv"), ("parquet", "csv"),
     ("text", "csv")],
)
def test_cross_format(fake, tmp_path, source_format, target_format):
    source = tmp_path / f"in.{EXTENSION[source_format]}"
    target = tmp_path / f"out.{EXTENSION[target_format]}"
    rows = write_input(source, source_format, TEXTS)
    result = CliRunner().invoke(cli, TRANSLATE + [str(source), str(target)])
    assert result.exit_code == 0, result.output
    if target_format == "text":
        expected = REVERSED
    elif source_format == "text":
        expected = [{"text": t, "translation": r} for t, r in zip(TEXTS, REVERSED)]
    else:
        expected = [{**row, "translation": r} for row, r in zip(rows, REVERSED)]
    assert read_output(target, target_format) == (as_text(expected) if target_format in ("csv", "tsv") else expected)


@pytest.mark.parametrize("fmt", ["text", "jsonl", "parquet", "csv"])
def test_format_flags_override_extensions(fake, tmp_path, fmt):
    source, target = tmp_path / "in.data", tmp_path / "out.data"
    write_input(source, fmt, ["ab"])
    result = CliRunner().invoke(cli, TRANSLATE + ["--input-format", fmt, "--output-format", "text", str(source), str(target)])
    assert result.exit_code == 0, result.output
    assert target.read_text() == "ba\n"


@pytest.mark.parametrize("fmt", ["text", "jsonl", "parquet", "csv"])
def test_row_order_across_many_batches(fake, tmp_path, fmt):
    texts = [("x" * (i * 7 % 23)) + str(i) for i in range(300)]
    source, target = tmp_path / f"in.{EXTENSION[fmt]}", tmp_path / f"out.{EXTENSION[fmt]}"
    write_input(source, fmt, texts)
    result = CliRunner().invoke(cli, TRANSLATE + ["--max-batch-tokens", "64", str(source), str(target)])
    assert result.exit_code == 0, result.output
    output = read_output(target, fmt)
    translations = output if fmt == "text" else [row["translation"] for row in output]
    assert translations == [t[::-1] for t in texts]
    assert len(fake.batches) > 50
    assert all(len(batch) * max(map(len, batch)) <= 64 for batch in fake.batches)


def test_max_input_length_cuts_sources_as_the_models_positions_do(fake, tmp_path):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text('{"text": "abcdef"}\n{"text": "ab"}\n')
    result = CliRunner().invoke(cli, TRANSLATE + ["--max-input-length", "4", "--status-field", "status", str(source),
                                                  str(target)])
    assert result.exit_code == 0, result.output
    assert [(row["translation"], row["status"]) for row in read_output(target, "jsonl")] == [("ba", "cut"), ("ba", "ok")]
    lang = fake.tokenizer.lang_id("eng_Latn")
    assert sorted(map(tuple, sum(fake.batches, []))) == [(lang, ord("a"), ord("b"), 2)] * 2  # 3 ids and </s>
    result = CliRunner().invoke(cli, TRANSLATE + ["--max-input-length", "2"], input="ab\n")
    assert result.exit_code == 2 and "--max-input-length must leave room" in result.output


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
def test_max_batch_sentences_caps_each_batch_and_changes_no_row(fake, tmp_path, fmt):
    texts = [("x" * (i * 7 % 23)) + str(i) for i in range(100)]
    source, target = tmp_path / f"in.{EXTENSION[fmt]}", tmp_path / f"out.{EXTENSION[fmt]}"
    write_input(source, fmt, texts)
    result = CliRunner().invoke(cli, TRANSLATE + ["--max-batch-tokens", "4096", "--max-batch-sentences", "7",
                                                  str(source), str(target)])
    assert result.exit_code == 0, result.output
    output = read_output(target, fmt)
    assert (output if fmt == "text" else [row["translation"] for row in output]) == [t[::-1] for t in texts]
    assert max(map(len, fake.batches)) == 7 and sum(map(len, fake.batches)) == 100


def test_parquet_keeps_columns_and_types(fake, tmp_path):
    schema = pa.schema(
        [
            ("id", pa.int32()),
            ("text", pa.string()),
            ("score", pa.float64()),
            ("tags", pa.list_(pa.string())),
            ("when", pa.timestamp("ms", tz="UTC")),
            ("note", pa.string()),
        ]
    )
    table = pa.table(
        {"id": [7, 8], "text": ["ab", "cd"], "score": [0.5, None], "tags": [["a"], []], "when": [0, 86_400_000], "note": [None, "x"]},
        schema=schema,
    )
    pq.write_table(table, tmp_path / "in.parquet")
    result = CliRunner().invoke(cli, TRANSLATE + [str(tmp_path / "in.parquet"), str(tmp_path / "out.parquet")])
    assert result.exit_code == 0, result.output
    output = pq.read_table(tmp_path / "out.parquet")
    assert output.schema == schema.append(pa.field("translation", pa.string()))
    assert output.drop_columns(["translation"]).equals(table)
    assert output.column("translation").to_pylist() == ["ba", "dc"]


def test_jsonl_keeps_fields_and_their_order(fake, tmp_path):
    line = {"meta": {"a": [1, 2.5, None]}, "text": "ab", "translation": "old", "ok": True}
    (tmp_path / "in.jsonl").write_text(json.dumps(line) + "\n")
    result = CliRunner().invoke(cli, TRANSLATE + ["--overwrite-field", str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl")])
    assert result.exit_code == 0
    assert (tmp_path / "out.jsonl").read_text() == '{"meta": {"a": [1, 2.5, null]}, "text": "ab", "translation": "ba", "ok": true}\n'


def test_field_and_output_field(fake, tmp_path):
    (tmp_path / "in.jsonl").write_text('{"body": "ab"}\n')
    result = CliRunner().invoke(
        cli, TRANSLATE + ["--field", "body", "--output-field", "body_fr", str(tmp_path / "in.jsonl"), "-"]
    )
    assert result.exit_code == 0
    assert result.stdout == '{"body": "ab", "body_fr": "ba"}\n'


@pytest.mark.parametrize("fmt", ["text", "jsonl", "parquet", "csv"])
def test_empty_input_gives_empty_output(fake, tmp_path, fmt):
    source, target = tmp_path / f"in.{EXTENSION[fmt]}", tmp_path / f"out.{EXTENSION[fmt]}"
    if fmt == "parquet":
        pq.write_table(pa.table({"text": pa.array([], pa.string()), "n": pa.array([], pa.int64())}), source)
    else:
        source.write_text("")
    result = CliRunner().invoke(cli, TRANSLATE + [str(source), str(target)])
    assert result.exit_code == 0
    if fmt == "parquet":
        assert pq.read_schema(target).names == ["text", "n", "translation"]
        assert pq.read_table(target).num_rows == 0
    elif fmt == "csv":  # the header of the text column and the translation
        assert target.read_bytes() == b"text,translation\n"
    else:
        assert target.read_bytes() == b""
    assert fake.batches == []


def test_empty_stdin(fake):
    result = CliRunner().invoke(cli, TRANSLATE, input="")
    assert result.exit_code == 0
    assert result.stdout == ""


def test_empty_strings_do_not_reach_the_model(fake):
    result = CliRunner().invoke(cli, TRANSLATE, input="\n \t\nab\n")
    assert result.stdout == "\n\nba\n"
    assert fake.batches == [[[fake.tokenizer.lang_id("eng_Latn"), ord("a"), ord("b"), 2]]]


def test_options_reach_the_translator(fake, monkeypatch):
    monkeypatch.setenv("NLLB_MODEL", "/models/nllb")
    result = CliRunner().invoke(
        cli, TRANSLATE + ["--device", "cpu", "--beam-size", "1", "--max-length", "20", "--length-penalty", "0.5"], input="ab\n"
    )
    assert result.exit_code == 0
    assert fake.loaded == [("/models/nllb", "cpu")]
    assert (fake.options[0].beam_size, fake.options[0].max_length, fake.options[0].length_penalty) == (1, 20, 0.5)


def test_model_option_beats_environment(fake, monkeypatch):
    monkeypatch.setenv("NLLB_MODEL", "/models/env")
    CliRunner().invoke(cli, TRANSLATE + ["--model", "/models/flag"], input="ab\n")
    assert fake.loaded == [("/models/flag", "auto")]


def test_langs(fake):
    result = CliRunner().invoke(cli, ["langs"])
    assert result.exit_code == 0
    assert result.output == "deu_Latn  German\neng_Latn  English\nfra_Latn  French\n"


def test_version():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("nllb, version ")


def test_help_is_the_docstring():
    result = CliRunner().invoke(cli, ["translate", "--help"])
    assert result.exit_code == 0
    assert "Translate INPUT into OUTPUT" in result.output
    assert "--max-batch-tokens" in result.output and "NLLB_MODEL" in result.output


def assert_one_line_error(result, exit_code, message):
    assert result.exit_code == exit_code, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.output
    assert result.stderr == f"Error: {message}\n"


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"text": "ab"}\n{"text": "cd"\n', "in.jsonl:2: not valid JSON: Expecting ',' delimiter (column 14)."),
        ('{"text": "ab"}\n\n[1, 2]\n', "in.jsonl:3: expected a JSON object, not list."),
        ('{"body": "ab"}\n', "in.jsonl:1: no field 'text' to translate (fields: body); name the text field with --field."),
        ('{"text": 5}\n', "in.jsonl:1: field 'text' is int, not a string."),
        ('{"text": null}\n', "in.jsonl:1: field 'text' is null, not a string."),
    ],
)
def test_bad_jsonl(fake, tmp_path, monkeypatch, content, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text(content)
    result = CliRunner().invoke(cli, TRANSLATE + ["in.jsonl", "out.jsonl"])
    assert_one_line_error(result, 1, message)
    assert listing(tmp_path) == ["in.jsonl"]


def test_bad_parquet(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.parquet").write_bytes(b"not parquet at all")
    result = CliRunner().invoke(cli, TRANSLATE + ["in.parquet", "out.parquet"])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: in.parquet: cannot read it as Parquet: ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert listing(tmp_path) == ["in.parquet"]


@pytest.mark.parametrize(
    "column,message",
    [
        (pa.array([1, 2]), "in.parquet: column 'text' is int64, not a string."),
        (pa.array(["ab", None]), "in.parquet: row 2: field 'text' is null, not a string."),
    ],
)
def test_bad_parquet_column(fake, tmp_path, monkeypatch, column, message):
    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"text": column}), "in.parquet")
    result = CliRunner().invoke(cli, TRANSLATE + ["in.parquet", "out.parquet"])
    assert_one_line_error(result, 1, message)
    assert listing(tmp_path) == ["in.parquet"]


def test_failure_keeps_the_old_output(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text('{"text": "ab"}\n' * 5000 + "oops\n")
    (tmp_path / "out.jsonl").write_text("yesterday's\n")
    result = CliRunner().invoke(cli, TRANSLATE + ["--force", "in.jsonl", "out.jsonl"])
    assert_one_line_error(result, 1, "in.jsonl:5001: not valid JSON: Expecting value (column 1).")
    assert (tmp_path / "out.jsonl").read_text() == "yesterday's\n"
    # the 4096 rows of the first two chunks are kept for --resume
    assert listing(tmp_path) == [".out.jsonl.nllb-partial", ".out.jsonl.nllb-state.json", "in.jsonl", "out.jsonl"]
    fake.batches.clear()
    result = CliRunner().invoke(cli, TRANSLATE + ["--resume", "--on-error", "skip", "in.jsonl", "out.jsonl"])
    assert result.exit_code == 3
    assert result.stderr == "Skipped: in.jsonl:5001: not valid JSON: Expecting value (column 1).\n"
    assert sum(map(len, fake.batches)) == 5000 - 4096
    assert (tmp_path / "out.jsonl").read_text() == '{"text": "ab", "translation": "ba"}\n' * 5000
    assert listing(tmp_path) == ["in.jsonl", "out.jsonl"]


@pytest.mark.parametrize("option", ["--src", "--tgt"])
def test_unknown_language(fake, tmp_path, option):
    args = ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn", str(tmp_path / "in.txt"), str(tmp_path / "out.txt")]
    args[args.index(option) + 1] = "englsh"
    (tmp_path / "in.txt").write_text("ab\n")
    result = CliRunner().invoke(cli, args)
    message = f"Invalid value for '{option}': unknown language code 'englsh': the model knows 3 FLORES-200 codes such as eng_Latn. Did you mean eng_Latn?"
    assert_one_line_error(result, 2, message)
    assert fake.batches == [] and fake.loaded == []
    assert listing(tmp_path) == ["in.txt"]


@pytest.mark.parametrize(
    "typed,code",
    [("en", "eng_Latn"), ("eng", "eng_Latn"), ("en-US", "eng_Latn"), ("fre", "fra_Latn"), ("fr-CA", "fra_Latn"),
     ("de_DE", "deu_Latn"), ("ENG_LATN", "eng_Latn"), ("eng-Latn", "eng_Latn")],
)
def test_language_codes_users_type(fake, typed, code):
    result = CliRunner().invoke(cli, ["translate", "-q", "--src", typed, "--tgt", typed], input="ab\n")
    assert result.exit_code == 0, result.output
    assert fake.batches == [[[fake.tokenizer.lang_id(code), ord("a"), ord("b"), 2]]]


def test_language_in_a_script_the_model_lacks(fake):
    result = CliRunner().invoke(cli, TRANSLATE[:5] + ["en-Cyrl"], input="ab\n")
    assert_one_line_error(result, 2, "Invalid value for '--tgt': language code 'en-Cyrl' asks for eng in Cyrl script, which the model does not have: use eng_Latn.")


def test_model_not_found(fake, monkeypatch):
    def load_model(model, device):
        raise NllbError(f"no model at {model}: looked in the local Hugging Face cache.")

    monkeypatch.setattr("nllbcli.cli.load_model", load_model)
    result = CliRunner().invoke(cli, TRANSLATE + ["--model", "nope"], input="ab\n")
    assert_one_line_error(result, 1, "no model at nope: looked in the local Hugging Face cache.")


def test_bad_device_from_the_loader(fake, monkeypatch):
    def load_model(model, device):
        raise ValueError("device cuda:3 asked for, but no GPU is visible to CuPy")

    monkeypatch.setattr("nllbcli.cli.load_model", load_model)
    result = CliRunner().invoke(cli, TRANSLATE + ["--device", "cuda:3"], input="ab\n")
    assert_one_line_error(result, 1, "device cuda:3 asked for, but no GPU is visible to CuPy")


def test_malformed_device_is_usage_error(fake):
    result = CliRunner().invoke(cli, TRANSLATE + ["--device", "gpu"], input="ab\n")
    assert result.exit_code == 2
    assert "'gpu' is not a device" in result.stderr
    assert fake.loaded == []


def test_unknown_extension(fake, tmp_path):
    (tmp_path / "in.txt").write_text("ab\n")
    result = CliRunner().invoke(cli, TRANSLATE + [str(tmp_path / "in.txt"), str(tmp_path / "out.xlsx")])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: cannot tell the format of OUTPUT {tmp_path / 'out.xlsx'} from its extension "
                                    "(tried: .xlsx; known: .jsonl, .ndjson, .json, .parquet, .txt, .csv, .tsv, .po, .pot, each "
                                    "optionally + .gz or .zst): name it with --output-format.")
    assert result.stderr.count("\n") == 1
    assert fake.loaded == []


def test_missing_input_file(fake, tmp_path):
    result = CliRunner().invoke(cli, TRANSLATE + [str(tmp_path / "missing.txt")])
    assert result.exit_code == 2
    assert "does not exist" in result.stderr and "Traceback" not in result.output


def test_missing_output_directory(fake, tmp_path):
    (tmp_path / "in.txt").write_text("ab\n")
    result = CliRunner().invoke(cli, TRANSLATE + [str(tmp_path / "in.txt"), str(tmp_path / "no" / "out.txt")])
    assert result.exit_code == 1
    assert result.stderr == f"Error: cannot write {tmp_path / 'no' / 'out.txt'}: No such file or directory.\n"


def test_missing_src(fake):
    result = CliRunner().invoke(cli, ["translate", "--tgt", "fra_Latn"], input="ab\n")
    assert result.exit_code == 2
    assert "Missing option '--src'" in result.stderr


def test_interrupt_exits_130_and_leaves_no_file(fake, tmp_path):
    fake.fail_with = KeyboardInterrupt()
    (tmp_path / "in.txt").write_text("ab\n")
    result = CliRunner().invoke(cli, TRANSLATE + [str(tmp_path / "in.txt"), str(tmp_path / "out.txt")])
    assert result.exit_code == 130
    assert result.output == ""
    assert listing(tmp_path) == ["in.txt"]


def test_output_file_gets_ordinary_permissions(fake, tmp_path):
    (tmp_path / "in.txt").write_text("ab\n")
    old = os.umask(0o022)
    try:
        CliRunner().invoke(cli, TRANSLATE + [str(tmp_path / "in.txt"), str(tmp_path / "out.txt")])
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "out.txt").st_mode & 0o777 == 0o644


# End to end, on the tiny test model: the CLI gives exactly what Translator.translate gives.

TINY = os.path.join(os.path.dirname(__file__), "models", "tiny-a")
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "",
    "Hello!",
    "Мы встретимся на вокзале в семь часов вечера.",
    "我们晚上七点在车站见面。",
    "Combien de personnes vivent dans cette ville ?",
]


@pytest.fixture(scope="module")
def tiny():
    from nllbcli.model.translator import load_translator

    return load_translator(TINY, "cpu")


@pytest.mark.skipif(not os.path.isdir(TINY), reason="tests/models/tiny-a is not there")
@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("fmt", ["text", "jsonl", "parquet", "csv"])
def test_tiny_model_end_to_end(tiny, tmp_path, fmt, beam_size):
    from nllbcli.options import DecodeOptions

    source, target = tmp_path / f"in.{EXTENSION[fmt]}", tmp_path / f"out.{EXTENSION[fmt]}"
    rows = write_input(source, fmt, SENTENCES)
    args = ["--model", TINY, "--device", "cpu", "--beam-size", str(beam_size), "--max-length", "12", "--max-batch-tokens", "40"]
    result = CliRunner().invoke(cli, TRANSLATE + args + [str(source), str(target)])
    assert result.exit_code == 0, result.output
    options = DecodeOptions(beam_size=beam_size, max_length=12)
    expected = [tiny.translate_sentences([text], "eng_Latn", "fra_Latn", options)[0] if text else "" for text in SENTENCES]
    assert sum(map(bool, expected)) >= 3  # the random weights do say something
    output = read_output(target, fmt)
    assert output == (expected if fmt == "text" else [{**row, "translation": t} for row, t in zip(rows, expected)])


@pytest.mark.skipif(not os.path.isdir(TINY), reason="tests/models/tiny-a is not there")
def test_tiny_model_cuts_long_sources(tiny):
    from nllbcli.options import DecodeOptions
    from nllbcli.job.rows import cut_source

    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 4)
    ids = tiny.tokenizer.encode(text, "eng_Latn")
    assert len(ids) > tiny.config.max_position_embeddings
    cut = cut_source(ids, tiny.config.max_position_embeddings)
    options = DecodeOptions(beam_size=1, max_length=8)
    expected = tiny.tokenizer.decode(tiny.generate([cut], "fra_Latn", options)[0])
    args = ["--model", TINY, "--device", "cpu", "--beam-size", "1", "--max-length", "8", "--no-split"]
    result = CliRunner().invoke(cli, TRANSLATE + args, input=text + "\n")
    assert result.exit_code == 0, result.output
    assert result.stdout == expected + "\n"


@pytest.mark.skipif(not os.path.isdir(TINY), reason="tests/models/tiny-a is not there")
def test_tiny_model_langs():
    result = CliRunner().invoke(cli, ["langs", "--model", TINY])
    assert result.exit_code == 0
    codes = [line.split()[0] for line in result.output.splitlines()]
    assert len(codes) == 202 and codes[0] == "ace_Arab" and "eng_Latn" in codes


@pytest.mark.skipif(not os.path.isdir(TINY), reason="tests/models/tiny-a is not there")
def test_tiny_model_unknown_language():
    result = CliRunner().invoke(cli, TRANSLATE[:3] + ["englsh", "--tgt", "fra_Latn", "--model", TINY], input="Hello\n")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: Invalid value for '--src': ") and "eng_Latn" in result.stderr
    assert result.stderr.count("\n") == 1


def test_languages_are_checked_before_the_weights_load(tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(TINY, model)
    (model / "model.safetensors").unlink()  # loading the weights would fail: the language check must come first
    result = CliRunner().invoke(cli, TRANSLATE[:5] + ["fra_Latm", "--model", str(model)], input="Hello\n")
    assert result.exit_code == 2 and "fra_Latn" in result.stderr and result.stderr.count("\n") == 1


def test_real_model_not_found(tmp_path):
    result = CliRunner().invoke(cli, TRANSLATE + ["--model", str(tmp_path / "nope")], input="Hello\n")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ") and str(tmp_path / "nope") in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_failure_after_chunks_were_written_leaves_them_for_resume(fake, tmp_path, monkeypatch, fmt):
    monkeypatch.chdir(tmp_path)
    texts = ["ab"] * 3000 + [None]
    if fmt == "parquet":
        pq.write_table(pa.table({"text": texts}), "in.parquet")
    elif fmt == "csv":
        (tmp_path / "in.csv").write_text("n,text\n" + "".join(f"{n},ab\n" for n in range(3000)) + "3000\n")
    else:
        (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    result = CliRunner().invoke(cli, TRANSLATE + [f"in.{fmt}", f"out.{fmt}"])
    where = {"parquet": "in.parquet: row 3001", "jsonl": "in.jsonl:3001", "csv": "in.csv: row 3001 (line 3002)"}[fmt]
    reason = "has 1 field where the header has 2." if fmt == "csv" else "field 'text' is null, not a string."
    assert_one_line_error(result, 1, f"{where}: {reason}")
    assert sum(map(len, fake.batches)) == 2048  # the first chunk was translated and written before the bad row was read
    assert listing(tmp_path) == [f".out.{fmt}.nllb-partial", f".out.{fmt}.nllb-state.json", f"in.{fmt}"]
    # without --resume a new run starts over and leaves only its output
    result = CliRunner().invoke(cli, TRANSLATE + ["--on-error", "skip", f"in.{fmt}", f"out.{fmt}"])
    assert result.exit_code == 3
    assert sum(map(len, fake.batches)) == 2048 + 3000
    assert listing(tmp_path) == [f"in.{fmt}", f"out.{fmt}"]


def test_on_a_gpu_the_first_chunk_is_smaller(fake, tmp_path, monkeypatch):
    """The GPU starts on a quarter chunk while the reader tokenizes the next whole one; rows stay in order."""
    monkeypatch.chdir(tmp_path)
    fake.device = "cuda:0"
    (tmp_path / "in.txt").write_text("".join(f"a{i}\n" for i in range(5000)))
    result = CliRunner().invoke(cli, TRANSLATE + ["--chunk-rows", "2048", "in.txt", "out.txt"])
    assert result.exit_code == 0, result.output
    assert [len(batch) for batch in fake.batches] == [512, 2048, 2048, 392]
    assert (tmp_path / "out.txt").read_text() == "".join(f"{i}"[::-1] + "a\n" for i in range(5000))


def test_failure_before_any_commit_leaves_nothing(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text('{"text": "ab"}\n{"text": 1}\n')
    result = CliRunner().invoke(cli, TRANSLATE + ["in.jsonl", "out.jsonl"])
    assert_one_line_error(result, 1, "in.jsonl:2: field 'text' is int, not a string.")
    assert listing(tmp_path) == ["in.jsonl"]


SAMPLE = os.path.join(os.path.dirname(__file__), "..", "data", "samples")


@pytest.mark.skipif(not os.path.isfile(os.path.join(SAMPLE, "model", "config.json")), reason="no sample model yet")
def test_sample_model_translates_the_demo_file(tmp_path):
    from nllbcli.options import DecodeOptions
    from nllbcli.model.translator import load_translator

    model = os.path.join(SAMPLE, "model")
    source = os.path.join(SAMPLE, "demo.eng_Latn.jsonl")
    result = CliRunner().invoke(cli, TRANSLATE + ["--model", model, "--beam-size", "1", source, str(tmp_path / "out.jsonl")])
    assert result.exit_code == 0, result.output
    rows = read_output(tmp_path / "out.jsonl", "jsonl")
    texts = [row["text"] for row in rows]
    expected = load_translator(model, "cpu").translate_sentences(texts, "eng_Latn", "fra_Latn", DecodeOptions(beam_size=1))
    assert [row["translation"] for row in rows] == expected
    assert all(expected)


# Per-row errors, exit codes, per-row languages, progress and summary, pipes.

BAD_ROWS = '{"text": "ab"}\n{"text": 5}\nnot json\n{"text": "cd", "tgt_lang": "xx"}\n{"text": "ef"}\n'


def test_on_error_record_writes_the_errors_file_and_exits_3(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text(BAD_ROWS)
    result = CliRunner().invoke(cli, TRANSLATE + ["--errors", "bad.jsonl", "in.jsonl", "out.jsonl"])
    assert result.exit_code == 3 and result.output == ""
    assert (tmp_path / "out.jsonl").read_text() == '{"text": "ab", "translation": "ba"}\n{"text": "ef", "translation": "fe"}\n'
    assert [json.loads(line) for line in (tmp_path / "bad.jsonl").read_text().splitlines()] == [
        {"row": 2, "error": "in.jsonl:2: field 'text' is int, not a string.", "input": {"text": 5}},
        {"row": 3, "error": "in.jsonl:3: not valid JSON: Expecting value (column 1).", "input": "not json"},
        {"row": 4, "error": "in.jsonl:4: field 'tgt_lang': unknown language code 'xx': the model knows 3 FLORES-200 codes such as eng_Latn. Run `nllb langs` to list them.",
         "input": {"text": "cd", "tgt_lang": "xx"}},
    ]
    assert listing(tmp_path) == ["bad.jsonl", "in.jsonl", "out.jsonl"]


def test_on_error_skip_names_rows_on_stderr(fake):
    result = CliRunner().invoke(cli, TRANSLATE + ["--on-error", "skip", "--input-format", "jsonl"], input=BAD_ROWS)
    assert result.exit_code == 3
    assert result.stdout == '{"text": "ab", "translation": "ba"}\n{"text": "ef", "translation": "fe"}\n'
    assert result.stderr.splitlines() == [
        "Skipped: <stdin>:2: field 'text' is int, not a string.",
        "Skipped: <stdin>:3: not valid JSON: Expecting value (column 1).",
        "Skipped: <stdin>:4: field 'tgt_lang': unknown language code 'xx': the model knows 3 FLORES-200 codes such as eng_Latn. Run `nllb langs` to list them.",
    ]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--on-error", "record"], "--on-error record needs --errors FILE to record the failed rows in."),
        (["--resume"], "--resume needs an OUTPUT file: what went to stdout cannot be continued."),
        (["--on-error", "skip", "--errors", "e.jsonl"], "--errors is only written with --on-error record, not skip, or with --on-flag record."),
    ],
)
def test_usage_errors_of_the_new_options(fake, args, message):
    result = CliRunner().invoke(cli, TRANSLATE + args, input="ab\n")
    assert_one_line_error(result, 2, message)
    assert fake.loaded == []


def test_text_input_needs_src_and_tgt(fake):
    result = CliRunner().invoke(cli, ["translate", "--tgt", "fr"], input="ab\n")
    assert result.exit_code == 2 and "Missing option '--src' (text rows cannot name their own languages)." in result.stderr


def test_per_row_languages_in_jsonl_without_defaults(fake):
    rows = '{"text": "ab", "src": "en", "tgt": "de"}\n{"text": "cd", "src": "fr", "tgt": "en-GB"}\n{"text": "ef", "src": "de", "tgt": "de"}\n'
    result = CliRunner().invoke(cli, ["translate", "-q", "--input-format", "jsonl", "--src-lang-field", "src", "--tgt-lang-field", "tgt"], input=rows)
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["translation"] for line in result.stdout.splitlines()] == ["ba", "dc", "fe"]
    assert fake.languages == [["deu_Latn", "eng_Latn", "deu_Latn"]]  # one batch mixing target languages
    assert sorted(s[0] for batch in fake.batches for s in batch) == sorted(map(fake.tokenizer.lang_id, fake.tokenizer.lang_codes))


def test_summary_line_on_stderr(fake):
    result = CliRunner().invoke(cli, TRANSLATE[:1] + TRANSLATE[2:], input="Ab. Cd.\n\nef\n")
    assert result.exit_code == 0
    assert result.stdout == ".bA .dC\n\nfe\n"
    assert re.fullmatch(
        r"Done: 3 rows into stdout \(3 translated, 0 failed, 0 flagged: 0 cut to fit the model, 0 stopped at "
        r"--max-length\), 3 sentences, 8 tokens in \d+\.\d s on the CPU( \(--device auto: [^)]+\))?: [\d,.]+ rows/s, [\d,]+ tokens/s\.\n", result.stderr)


def test_progress_json_ends_with_a_summary_object(fake):
    result = CliRunner().invoke(cli, TRANSLATE[:1] + TRANSLATE[2:] + ["--progress", "json"], input="ab\ncd\n")
    assert result.exit_code == 0
    summary = json.loads(result.stderr.splitlines()[-1])
    assert summary["event"] == "summary" and summary["rows"] == 2 and summary["translated"] == 2 and summary["tokens"] == 4


def test_flags_are_counted_in_the_summary(fake):
    fake.config.max_position_embeddings = 5
    result = CliRunner().invoke(cli, TRANSLATE[:1] + TRANSLATE[2:] + ["--progress", "json", "--max-length", "4"], input="abcdef\nab\nabc\n")
    summary = json.loads(result.stderr.splitlines()[-1])
    assert (summary["cut"], summary["max_length"], summary["flagged"]) == (1, 2, 2)  # a row cut and stopped: once


def test_decoding_options_reach_the_translator(fake):
    result = CliRunner().invoke(cli, TRANSLATE + ["--no-repeat-ngram-size", "3", "--repetition-penalty", "1.2"], input="ab\n")
    assert result.exit_code == 0
    assert (fake.options[0].no_repeat_ngram_size, fake.options[0].repetition_penalty) == (3, 1.2)


def test_closed_stdout_ends_quietly(tmp_path):
    """`nllb translate ... | head -1`: the job stops when head goes, with no message and no traceback."""
    import subprocess
    import sys

    (tmp_path / "in.txt").write_text("Hello there.\n" * 3000)
    pipeline = (f"{sys.executable} -m nllbcli.cli translate --src en --tgt fr --model {TINY} --device cpu --beam-size 1 "
                f"--max-length 3 --chunk-rows 10 {tmp_path / 'in.txt'} | head -1; echo \"${{PIPESTATUS[0]}}\" >&2")
    result = subprocess.run(["bash", "-c", pipeline], capture_output=True, text=True, timeout=120)
    assert result.stdout.count("\n") == 1
    assert result.stderr == "141\n"


def test_json_progress_comes_on_a_timer_and_counts_rows_before_their_commit(fake, monkeypatch):
    """A line every JSON_INTERVAL seconds while a batch takes longer than that, and each row counted when the
    model has finished it ("done"), before its chunk is committed: the counters are the committed rows', and agree
    with each other in every line."""
    import time

    monkeypatch.setattr("nllbcli.job.progress.JSON_INTERVAL", 0.05)
    generate = fake.generate

    def slow(sources, tgt, options):
        time.sleep(0.5)
        return generate(sources, tgt, options)

    fake.generate = slow
    result = CliRunner().invoke(cli, TRANSLATE[:1] + TRANSLATE[2:] + ["--progress", "json", "--max-batch-tokens", "1"],
                                input="ab\ncd\n")  # one chunk, two batches of one sentence
    assert result.exit_code == 0
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    progress = [line for line in lines if line["event"] == "progress"]
    assert lines[-1]["event"] == "summary" and lines[-1]["rows"] == 2
    assert len([p for p in progress if p["done"] == 0 and p["tokens"] == 0]) >= 3  # while the first batch runs
    assert len([p for p in progress if (p["done"], p["rows"], p["tokens"]) == (1, 0, 0)]) >= 3  # the second runs
    assert all(p["rows"] == p["translated"] + p["failed"] and p["done"] >= p["rows"] for p in lines[:-1])
    assert all(a["seconds"] < b["seconds"] for a, b in zip(progress, progress[1:]))


def test_progress_bar_names_the_input_and_the_direction(fake, tmp_path):
    (tmp_path / "notes.txt").write_text("ab\n")
    result = CliRunner().invoke(cli, TRANSLATE[:1] + TRANSLATE[2:] + ["--progress", "bar", str(tmp_path / "notes.txt")])
    assert result.exit_code == 0
    assert "notes.txt: eng_Latn → fra_Latn" in result.stderr


@pytest.mark.parametrize("how, threads", [(["--threads", "1"], 1), ({"NLLB_THREADS": "3"}, 3), ([], "default")])
def test_threads_hold_the_blas_pool_inside_the_engine(monkeypatch, tmp_path, how, threads):
    """--threads N (or NLLB_THREADS) is the BLAS pool's thread count while the engine generates (threadpoolctl);
    without either, half the cores, at least 1."""
    from threadpoolctl import threadpool_info

    from nllbcli.options import cpu_threads
    from nllbcli.model.translator import Translator

    seen = []
    generate = Translator.generate_hypotheses

    def spy(self, *args, **kwargs):
        seen.append({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(Translator, "generate_hypotheses", spy)
    before = [pool["num_threads"] for pool in threadpool_info()]
    (tmp_path / "in.txt").write_text("Hello!\n")
    env = how if isinstance(how, dict) else {}
    result = CliRunner(env=env).invoke(cli, TRANSLATE + ["--model", TINY, "--device", "cpu", "--max-length", "4",
                                                       *([] if env else how), str(tmp_path / "in.txt")])
    assert result.exit_code == 0, result.output
    assert seen == [{cpu_threads() if threads == "default" else threads}]
    assert [pool["num_threads"] for pool in threadpool_info()] == before  # as it was once the job is done


@pytest.mark.parametrize("how", [["--threads", "0"], ["--threads", "two"], {"NLLB_THREADS": "-1"}])
def test_a_bad_thread_count_is_refused(fake, how):
    env = how if isinstance(how, dict) else {}
    result = CliRunner(env=env).invoke(cli, TRANSLATE + ([] if env else how), input="ab\n")
    assert result.exit_code == 2
    assert "Invalid value for '--threads'" in result.stderr
    assert fake.batches == []


def test_help_shows_every_option_in_a_section_and_what_the_paths_default_to():
    """`nllb translate --help` in the sections of cli.HELP_GROUPS, every option in one of them (a new option left
    out would be listed under "Other options"), and a usage line that says INPUT and OUTPUT may be left out."""
    from nllbcli.cli import HELP_GROUPS

    result = CliRunner().invoke(cli, ["translate", "--help"], prog_name="nllb")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[:2] == ["Usage: nllb translate [OPTIONS] [INPUT [OUTPUT]]",
                         "  INPUT and OUTPUT default to -: stdin and stdout."]
    assert [line[:-1] for line in lines if line.endswith(":") and not line.startswith(" ")] == list(HELP_GROUPS)
    grouped = [name for names in HELP_GROUPS.values() for name in names]
    assert len(grouped) == len(set(grouped))
    options = {param.name for name in ("translate", "score") for param in cli.commands[name].params
               if isinstance(param, click.Option)}
    assert options | {"help"} == set(grouped)
    result = CliRunner().invoke(cli, ["score", "--help"], prog_name="nllb")
    assert result.exit_code == 0 and "Other options" not in result.output


def test_the_options_reference_is_the_commands_help():
    """docs/OPTIONS.md is made from the command (tools/make_options_reference.py): an option added, changed or
    regrouped without the page made again fails here."""
    import runpy

    tools = runpy.run_path(str(Path(__file__).resolve().parent.parent / "tools" / "make_options_reference.py"))
    assert tools["PAGE"].read_text(encoding="utf-8") == tools["options_reference"](), \
        "docs/OPTIONS.md differs from the command: run python tools/make_options_reference.py"
