"""The Python API: the command's semantics from a list of strings or an Arrow table, failures as values, and the
example of docs/API.md as it is written."""

from __future__ import annotations

import contextlib
import io
import json
import re
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import nllbcli
from nllbcli.cli import cli
from nllbcli.errors import NllbError
from nllbcli.job.spec import shaping_values

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "samples" / "model"
TWO = "The concert is on the twelfth of March. Emma's birthday is on the fourth of July."
ROWS = [TWO, "David sees twenty black hats at the market every morning.", "", "  Hello there.\nMy uncle went to Rome on Friday.  "]
GREEDY = nllbcli.DecodeOptions(beam_size=1, max_length=48)


@lru_cache(maxsize=1)
def sample():
    return nllbcli.load(str(SAMPLE), "cpu")


def cli_jsonl(tmp_path, rows: list[dict], *args: str) -> list[dict]:
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = CliRunner().invoke(cli, ["translate", "-q", "-m", str(SAMPLE), "--device", "cpu", "--beam-size", "1",
                                      "--max-length", "48", *args, str(source), str(target)])
    assert result.exit_code in (0, 3), result.output
    return [json.loads(line) for line in target.read_text().splitlines()]


def test_translate_gives_the_commands_translations_sentence_by_sentence(tmp_path):
    results = nllbcli.translate(sample(), ROWS, "en", "fr", GREEDY)
    expected = cli_jsonl(tmp_path, [{"text": text} for text in ROWS], "--src", "en", "--tgt", "fr")
    assert [r.text for r in results] == [row["translation"] for row in expected]
    assert [r.status for r in results] == ["ok"] * len(ROWS) and all(r.error is None for r in results)
    # two sentences, each translated: not the one sentence that translating the row whole gives
    whole = sample().translate_sentences([TWO], "eng_Latn", "fra_Latn", GREEDY)[0]
    assert results[0].text.count(".") == 2 and results[0].text != whole
    assert [r.text for r in nllbcli.translate(sample(), ROWS, "en", "fr", GREEDY, split=False)] == \
        [row["translation"] for row in cli_jsonl(tmp_path, [{"text": t} for t in ROWS], "--src", "en", "--tgt", "fr", "--no-split")]


def test_translate_gives_failures_and_flags_as_values():
    results = nllbcli.translate(sample(), [ROWS[1], 5, None, ROWS[1]], "en", "fr", nllbcli.DecodeOptions(beam_size=1, max_length=4))
    assert [r.status for r in results] == ["max_length", "failed", "failed", "max_length"]
    assert results[1] == nllbcli.Result(None, "row 2: int, not a string.", "failed")
    assert results[2].error == "row 3: NoneType, not a string."
    with pytest.raises(NllbError, match="unknown language code"):
        nllbcli.translate(sample(), ROWS, "en", "xx_Latn")


def test_max_input_length_cuts_as_the_command_does(tmp_path):
    results = nllbcli.translate(sample(), ROWS, "en", "fr", GREEDY, max_input_length=6)
    expected = cli_jsonl(tmp_path, [{"text": text} for text in ROWS], "--src", "en", "--tgt", "fr",
                         "--max-input-length", "6", "--status-field", "status")
    assert [(r.text, r.status) for r in results] == [(row["translation"], row["status"]) for row in expected]
    assert "cut" in {r.status for r in results}
    table = nllbcli.translate_table(sample(), pa.table({"text": ROWS}), "en", "fr", GREEDY, max_input_length=6)
    assert table.column("translation").to_pylist() == [r.text for r in results]


def test_translate_table_gives_the_parquet_output_of_the_command(tmp_path):
    table = pa.table({"id": pa.array([1, 2, 3, 4, 5], pa.int16()), "text": [ROWS[0], None, ROWS[1], ROWS[3], "Hola."],
                      "tgt_lang": [None, None, "deu_Latn", None, "xx"],
                      "meta": [{"a": 1}, None, {"a": 3}, {"a": 4}, None]})
    pq.write_table(table, tmp_path / "in.parquet")
    result = CliRunner().invoke(cli, ["translate", "-q", "-m", str(SAMPLE), "--device", "cpu", "--beam-size", "1",
                                      "--max-length", "48", "--src", "en", "--tgt", "fr", "--status-field", "status",
                                      "--on-error", "skip", str(tmp_path / "in.parquet"), str(tmp_path / "out.parquet")])
    assert result.exit_code == 3, result.output
    expected = pq.read_table(tmp_path / "out.parquet")
    got = nllbcli.translate_table(sample(), table, src="en", tgt="fr", decode=GREEDY, status_field="status",
                                  on_error="skip")
    assert got.equals(expected)
    batches = nllbcli.translate_table(sample(), table.to_batches(max_chunksize=2), src="en", tgt="fr", decode=GREEDY,
                                      status_field="status", on_error="skip")
    assert batches.to_pylist() == got.to_pylist()
    kept = nllbcli.translate_table(sample(), table, src="en", tgt="fr", decode=GREEDY, error_field="error")
    assert kept.num_rows == 5 and kept.column_names == ["id", "text", "tgt_lang", "meta", "translation", "error"]
    errors = kept.column("error").to_pylist()
    assert [e is None for e in errors] == [True, False, True, True, False]
    assert errors[1] == "the table: row 2: field 'text' is null, not a string." and "unknown language code 'xx'" in errors[4]
    assert kept.filter(pa.array([e is None for e in errors])).drop_columns(["error"]).to_pylist() == \
        expected.drop_columns(["status"]).to_pylist()


def test_a_row_that_fails_keeps_its_place_or_fails_the_table_as_it_fails_the_command(tmp_path):
    """A failed row is never left out silently: by default it keeps its place with a null translation and its
    reason in the error column; on_error="fail" fails the call on it, naming it, as the command does under its
    default --on-error fail; on_error="skip" leaves it out."""
    table = pa.table({"id": [1, 2, 3], "text": [ROWS[0], None, ROWS[1]]})
    pq.write_table(table, tmp_path / "in.parquet")
    result = CliRunner().invoke(cli, ["translate", "-q", "-m", str(SAMPLE), "--device", "cpu", "--src", "en", "--tgt",
                                      "fr", str(tmp_path / "in.parquet"), str(tmp_path / "out.parquet")])
    assert result.exit_code == 1
    assert result.output == f"Error: {tmp_path / 'in.parquet'}: row 2: field 'text' is null, not a string.\n"
    kept = nllbcli.translate_table(sample(), table, "en", "fr", GREEDY)
    assert kept.column_names == ["id", "text", "translation", "error"]
    assert kept.column("error").to_pylist() == [None, "the table: row 2: field 'text' is null, not a string.", None]
    assert kept.column("translation").null_count == 1
    for given in ({"on_error": "fail"}, {"error_field": None}):
        with pytest.raises(NllbError, match=r"^the table: row 2: field 'text' is null, not a string\.$"):
            nllbcli.translate_table(sample(), table, "en", "fr", GREEDY, **given)
    assert nllbcli.translate_table(sample(), table, "en", "fr", GREEDY, on_error="skip").column("id").to_pylist() == [1, 3]
    assert nllbcli.translate_table(sample(), table, "en", "fr", GREEDY, error_field="why").column_names[-1] == "why"
    for given, message in (({"on_error": "record", "error_field": None}, "give both, or neither"),
                           ({"on_error": "ignore"}, "not 'ignore'"),
                           ({"on_error": "skip", "error_field": "error"}, "on_error is 'skip'")):
        with pytest.raises(ValueError, match=message):
            nllbcli.translate_table(sample(), table, "en", "fr", GREEDY, **given)


def test_translate_table_refuses_what_the_command_refuses():
    with pytest.raises(NllbError, match="no column 'body'"):
        nllbcli.translate_table(sample(), pa.table({"text": ["a"]}), "en", "fr", field="body")
    with pytest.raises(NllbError, match="or pass overwrite_field=True to replace it"):
        nllbcli.translate_table(sample(), pa.table({"text": ["a"], "translation": ["b"]}), "en", "fr")
    replaced = nllbcli.translate_table(sample(), pa.table({"text": ["Hello."], "translation": ["old"]}), "en", "fr",
                                       GREEDY, overwrite_field=True)
    assert replaced.column_names == ["text", "translation", "error"] and replaced.column("translation")[0].as_py() != "old"


def test_the_docs_example_runs_as_written(monkeypatch):
    monkeypatch.chdir(ROOT)
    page = (ROOT / "docs" / "API.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S)[1]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/API.md", "exec"), {})
    said = [line.split("#", 1)[1].strip() for line in code.splitlines() if line.startswith("print(") and "#" in line]
    assert printed.getvalue().splitlines() == said


def test_the_api_is_not_imported_by_the_command_start_up():
    import subprocess
    import sys

    code = "import sys, nllbcli.cli; print('nllbcli.api' in sys.modules, 'nllbcli.job.loop' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split() == ["False", "False"]


@pytest.mark.parametrize("given", [{"error_field": "id"}, {"status_field": "id"}, {"error_field": "id", "field": "id"}])
def test_an_added_column_never_replaces_an_input_one_unless_asked(given):
    table = pa.table({"id": ["a", "b"], "text": ["Hello.", None]})
    field = given.get("field", "text")
    option = next(name for name in given if name != "field")
    named = option  # messages name the API's arguments, not the command's options
    with pytest.raises(NllbError) as caught:
        nllbcli.translate_table(sample(), table, "en", "fr", GREEDY, **given)
    if field == "id":  # the error column over the text itself: not even with overwrite_field
        assert str(caught.value) == "error_field id is field's field too: name another."
        return
    assert str(caught.value) == (f"the table: it has a column 'id' already, which {named} would replace: name another "
                                 f"with {named}, or pass overwrite_field=True to replace it.")
    skip = {} if option == "error_field" else {"on_error": "skip"}  # row 2 has no text
    replaced = nllbcli.translate_table(sample(), table, "en", "fr", GREEDY, overwrite_field=True, **given, **skip)
    assert replaced.column_names == ["id", "text", "translation"]
    assert replaced.column("id").to_pylist() == ([None, "the table: row 2: field 'text' is null, not a string."]
                                                 if option == "error_field" else ["ok"])


def test_error_field_is_checked_against_the_other_added_fields():
    with pytest.raises(NllbError, match="^error_field translation is output_field's field too: name another.$"):
        nllbcli.translate_table(sample(), pa.table({"text": ["Hello."]}), "en", "fr", GREEDY, error_field="translation")


def test_a_table_is_translated_in_chunks_of_its_batching_and_a_chunk_of_no_rows_is_refused():
    table = pa.table({"text": ROWS})
    one = nllbcli.translate_table(sample(), table, "en", "fr", GREEDY, batching=nllbcli.BatchOptions(read_chunk_rows=1))
    assert one.equals(nllbcli.translate_table(sample(), table, "en", "fr", GREEDY))
    for rows in (0, -1):
        with pytest.raises(ValueError, match=f"^read_chunk_rows must be from 1 to 2,147,483,647, not {rows}.$"):
            nllbcli.translate(sample(), ROWS, "en", "fr", GREEDY, batching=nllbcli.BatchOptions(read_chunk_rows=rows))


@pytest.mark.parametrize("call, error, message", [
    (lambda: nllbcli.translate(sample(), "Hello.", "en", "fr"), TypeError,
     "texts must be a list of strings, not str 'Hello.': put one text in a list, [text]."),
    (lambda: nllbcli.translate(sample(), {"text": "Hello."}, "en", "fr"), TypeError,
     "texts must be a list of strings, not dict {'text': 'Hello.'}."),
    (lambda: nllbcli.translate(sample(), 5, "en", "fr"), TypeError, "texts must be a list of strings, not int 5."),
    (lambda: nllbcli.translate(sample(), ["Hello."], None, "fr"), TypeError,
     "src must be a language code (a str), such as eng_Latn or en, not NoneType None."),
    (lambda: nllbcli.translate(sample(), ["Hello."], 5, "fr"), TypeError,
     "src must be a language code (a str), such as eng_Latn or en, not int 5."),
    (lambda: nllbcli.translate(sample(), ["Hello."], "en", None), TypeError,
     "tgt must be a language code (a str), such as fra_Latn or fr, not NoneType None."),
    (lambda: nllbcli.translate(sample(), ["Hello."], "en", "fr", {"beam_size": 1}), TypeError,
     "decode must be a DecodeOptions (nllbcli.DecodeOptions(beam_size=...)) or None, not dict {'beam_size': 1}."),
    (lambda: nllbcli.translate(sample(), ["Hello."], "en", "fr", batching=4096), TypeError,
     "batching must be a BatchOptions (nllbcli.BatchOptions(...)) or None, not int 4096."),
    (lambda: nllbcli.translate("data/samples/model", ["Hello."], "en", "fr"), TypeError,
     "translator must be a Translator, what nllbcli.load gives, not str 'data/samples/model'."),
    (lambda: nllbcli.translate_table(sample(), {"text": ["Hello."]}, "en", "fr"), TypeError,
     "table must be a pyarrow Table, a RecordBatch or record batches, not dict {'text': ['Hello.']}: "
     "pyarrow.table(columns) makes a Table of a dict of columns."),
    (lambda: nllbcli.translate_table(sample(), [pa.table({"text": ["Hello."]})], "en", "fr"), TypeError,
     "table must be a pyarrow Table, a RecordBatch or record batches, not a list holding "
     "Table pyarrow.Table\ntext: string\n----\ntext:...."),
    (lambda: nllbcli.translate_table(sample(), pa.table({"text": ["Hello."]}), 5, "fr"), TypeError,
     "src must be a language code (a str), such as eng_Latn or en, or None, not int 5."),
    (lambda: nllbcli.translate_table(sample(), pa.table({"text": ["Hello."]}), "en", 5), TypeError,
     "tgt must be a language code (a str), a list of them or None, not int 5."),
    (lambda: nllbcli.translate_table(sample(), pa.table({"text": ["Hello."]}), "en", "fr", field=5), TypeError,
     "field must be a string, not int 5."),
    (lambda: nllbcli.translate_table(sample(), pa.table({"text": ["Hello."]}), "en", "fr", split="no"), TypeError,
     "split must be True or False, not str 'no'."),
    (lambda: nllbcli.translate_table(sample(), pa.table({"text": ["Hello."]}), "en", "fr", max_input_length=5.5),
     TypeError, "max_input_length must be an integer or None, not float 5.5."),
    (lambda: nllbcli.DecodeOptions(seed="x"), TypeError, "seed must be an integer or None, not str 'x'."),
    (lambda: nllbcli.DecodeOptions(beam_size=True), TypeError, "beam_size must be an integer, not bool True."),
    (lambda: nllbcli.DecodeOptions(length_penalty="1"), TypeError, "length_penalty must be a number, not str '1'."),
    (lambda: nllbcli.DecodeOptions(max_length_b=-5), ValueError, "max_length_b must be from 0 to 65,536, not -5."),
    (lambda: nllbcli.load(5), TypeError, "model must be a directory (a str or path) or None, not int 5."),
    (lambda: nllbcli.load(str(SAMPLE), None), TypeError, "device must be a str, not NoneType None."),
])
def test_the_api_checks_its_arguments_at_the_door_naming_them(call, error, message):
    with pytest.raises(error) as caught:
        call()
    assert str(caught.value) == message


def test_numpy_numbers_are_taken_as_pythons():
    import numpy as np

    options = nllbcli.DecodeOptions(beam_size=np.int64(1), max_length=np.int32(48), length_penalty=np.float32(0.5))
    assert (type(options.beam_size), type(options.max_length), type(options.length_penalty)) == (int, int, float)
    assert json.dumps(shaping_values(options))  # a job's identity is JSON
    assert nllbcli.translate(sample(), ROWS[1:2], "en", "fr", options) == nllbcli.translate(sample(), ROWS[1:2], "en", "fr", GREEDY)


@pytest.mark.parametrize("given, message", [
    ({"output_field": "text"}, "output_field text is the field being translated (field), and the translation would "
                               "replace the source text: name another with output_field, or pass overwrite_field=True "
                               "to replace it."),
    ({"status_field": "translation"}, "status_field translation is output_field's field too: name another."),
    ({"tgt": ["fr", "de"], "targets_as": "rows", "tgt_field": ""},
     "targets_as='rows' names each row's target language in tgt_field: give it a name."),
])
def test_a_field_clash_is_told_in_the_apis_arguments(given, message):
    """The API's checks are the command's (job.spec.check_fields), and name what the caller wrote: arguments, not
    the command's options."""
    with pytest.raises(NllbError) as caught:
        nllbcli.translate_table(sample(), pa.table({"text": ["Hello."]}), **{"src": "en", "tgt": "fr", **given})
    assert str(caught.value) == message


def test_load_takes_the_commands_model_record():
    """nllbcli.load takes a ModelOptions (the command's record of -m, --adapter, --compute-type and --device) in
    place of its four arguments, and loads the same model."""
    record = nllbcli.ModelOptions(str(SAMPLE), device="cpu")
    loaded = nllbcli.load(record)
    assert (loaded.model_dir, loaded.device, loaded.adapter) == (sample().model_dir, "cpu", None)
    assert [r.text for r in nllbcli.translate(loaded, ROWS[:2], "en", "fr", GREEDY)] == \
        [r.text for r in nllbcli.translate(sample(), ROWS[:2], "en", "fr", GREEDY)]


def test_load_takes_the_commands_thread_limit_and_each_call_keeps_to_it(monkeypatch):
    """threads= at load is --threads: the BLAS library's threads while a call computes on the CPU (None: the
    command's default, $NLLB_THREADS else half the cores), so that a library call beside other work does not
    spin on every core."""
    from threadpoolctl import threadpool_info

    from nllbcli.options import cpu_threads

    assert nllbcli.load(str(SAMPLE), "cpu").threads == cpu_threads()
    translator = nllbcli.load(str(SAMPLE), "cpu", threads=1)
    seen = []
    generate = translator.generate_hypotheses

    def watched(*args, **kwargs):
        seen.append({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})
        return generate(*args, **kwargs)

    monkeypatch.setattr(translator, "generate_hypotheses", watched)
    nllbcli.translate(translator, ROWS[:2], "en", "fr", GREEDY)
    list(nllbcli.translate_iterable(translator, ROWS[:2], "en", "fr", GREEDY))
    assert seen and all(threads == {1} for threads in seen)
    for wrong in (0, 2.5, True):
        with pytest.raises(TypeError, match="^threads must be a number of threads"):
            nllbcli.load(str(SAMPLE), "cpu", threads=wrong)


def test_translate_iterable_streams_in_order_with_bounded_memory():
    """A stream's results come in order as each chunk is done, the texts taken only as far as the chunk being
    translated: a stream of any length (a generator here, which would never end) in bounded memory."""
    taken = []

    def endless():
        n = 0
        while True:
            taken.append(n)
            yield ROWS[n % len(ROWS)]
            n += 1

    batching = nllbcli.BatchOptions(read_chunk_rows=4)
    results = nllbcli.translate_iterable(sample(), endless(), "en", "fr", GREEDY, batching=batching)
    first = [next(results) for _ in range(6)]
    assert len(taken) <= 2 * 4 + 1  # two chunks at most, whatever is left of the stream
    assert [r.text for r in first] == [r.text for r in nllbcli.translate(sample(), (ROWS * 2)[:6], "en", "fr", GREEDY)]
    with pytest.raises(TypeError, match="^texts must be an iterable of strings"):
        nllbcli.translate_iterable(sample(), "one text", "en", "fr")


def test_decoding_options_given_are_merged_over_the_models_generation_config():
    """As transformers merges what generate is given into the model's generation config, and the command its
    options: DecodeOptions(beam_size=2) keeps the model's max_length (NLLB's 199 new tokens), not nllb's 200."""
    from nllbcli.api import model_decode

    merged = model_decode(sample(), nllbcli.DecodeOptions(beam_size=2))
    assert (merged.beam_size, merged.max_length) == (2, 199)
    assert model_decode(sample(), nllbcli.DecodeOptions(beam_size=2, max_length=200)).max_length == 200
    assert model_decode(sample(), nllbcli.DecodeOptions(sampling_topk=0, beam_size=1)).beam_size == 1
    assert model_decode(sample()) == model_decode(sample(), nllbcli.DecodeOptions())
