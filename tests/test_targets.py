"""Several target languages in one run (--tgt fra_Latn,deu_Latn): each row into each target, as columns or rows,
every target's translation the one a run into that target alone gives, each sentence through the encoder once."""

import json
import signal
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import nllbcli
from nllbcli.job.chunks import ChunkWorker, plan_batches
from nllbcli.cli import cli
from nllbcli.errors import NllbError
from nllbcli.options import BatchOptions, DecodeOptions, Job, ModelOptions
from nllbcli.model.translator import load_translator

from counting import CountingEngine
from test_decoding import MODELS
from test_resume import TINY, run

SAMPLE = str(MODELS["sample"])
BASE = ["translate", "-q", "--src", "eng_Latn", "--model", SAMPLE, "--device", "cpu", "--max-length", "24"]
TEXTS = ["The meeting is on the twentieth. I will bring ninety-seven red boxes.", "", "Yes.", "Hello!",
         "The meeting is on the twentieth."]
TARGETS = ["fra_Latn", "deu_Latn", "spa_Latn"]


@pytest.fixture(scope="module")
def sample():
    return load_translator(SAMPLE, "cpu")


def write_jsonl(path, texts, **extra):
    path.write_text("".join(json.dumps({"id": n, "text": t, **extra}) + "\n" for n, t in enumerate(texts)))


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def translate(args, source, target):
    result = CliRunner().invoke(cli, BASE + args + [str(source), str(target)])
    assert result.exit_code == 0, result.output
    return result


def alone(tmp_path, args, code):
    """Each row's fields from a run into `code` alone, with the same options."""
    translate(["--tgt", code, *args], tmp_path / "in.jsonl", tmp_path / f"{code}.jsonl")
    return rows_of(tmp_path / f"{code}.jsonl")


@pytest.mark.parametrize("args", [[], ["--beam-size", "3", "--scores", "--status-field", "status"]])
def test_each_target_column_is_that_targets_translation_alone(tmp_path, args):
    write_jsonl(tmp_path / "in.jsonl", TEXTS)
    translate(["--tgt", "fr,deu_Latn,es", *args], tmp_path / "in.jsonl", tmp_path / "out.jsonl")
    rows = rows_of(tmp_path / "out.jsonl")
    added = ["translation"] + (["status", "score", "log_prob"] if args else [])
    assert [list(row) for row in rows] == [["id", "text"] + [f"{name}_{code}" for name in added for code in TARGETS]] * 5
    for code in TARGETS:
        for row, single in zip(rows, alone(tmp_path, args, code)):
            for name in added:  # scores to the bit, though from other batches
                assert row[f"{name}_{code}"] == single[name]
    assert rows[0]["translation_fra_Latn"] != rows[0]["translation_deu_Latn"]


def test_rows_come_once_per_target_in_order_in_jsonl_parquet_and_text(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", TEXTS)
    args = ["--tgt", "fra_Latn,deu_Latn", "--targets-as", "rows", "--num-hypotheses", "2", "--beam-size", "2"]
    for out in ("out.jsonl", "out.parquet"):
        translate(args, tmp_path / "in.jsonl", tmp_path / out)
    rows = rows_of(tmp_path / "out.jsonl")
    assert pq.read_table(tmp_path / "out.parquet").to_pylist() == rows
    singles = {code: alone(tmp_path, args[4:], code) for code in TARGETS[:2]}
    assert [(row["id"], row["tgt_lang"]) for row in rows] == [(n, code) for n in range(5) for code in TARGETS[:2]]
    for row in rows:
        assert list(row) == ["id", "text", "tgt_lang", "translation"]
        assert row["translation"] == singles[row["tgt_lang"]][row["id"]]["translation"]
    # a text output takes rows by default: a line per target (and hypothesis), the targets in --tgt's order
    text = CliRunner().invoke(cli, BASE + ["--tgt", "fra_Latn,deu_Latn", *args[4:], "--output-format", "text",
                                           str(tmp_path / "in.jsonl"), "-"])
    assert text.exit_code == 0, text.output
    assert text.output.splitlines() == [line for n in range(5) for code in TARGETS[:2]
                                        for line in singles[code][n]["translation"]]


def test_a_failed_row_fails_in_every_target(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"text": "Yes."}\n{"text": 5}\n{"text": "Hello!"}\n')
    args = ["--tgt", "fr,de", "--on-error", "skip"]
    text = CliRunner().invoke(cli, BASE + args + ["--output-format", "text", str(tmp_path / "in.jsonl"), "-"])
    assert text.exit_code == 3
    lines = text.stdout.splitlines()
    assert len(lines) == 6 and lines[2:4] == ["", ""] and all(lines[:2] + lines[4:])
    assert text.stderr.count("Skipped:") == 1
    for how in ("columns", "rows"):
        result = CliRunner().invoke(cli, BASE + args + ["--targets-as", how, "--on-error", "record", "--errors",
                                                        str(tmp_path / f"{how}.errors.jsonl"), str(tmp_path / "in.jsonl"),
                                                        str(tmp_path / f"{how}.jsonl")])
        assert result.exit_code == 3
        assert [row["text"] for row in rows_of(tmp_path / f"{how}.jsonl")] == (
            ["Yes.", "Hello!"] if how == "columns" else ["Yes.", "Yes.", "Hello!", "Hello!"])
        assert [row["row"] for row in rows_of(tmp_path / f"{how}.errors.jsonl")] == [2]


@pytest.mark.parametrize("beam_size", [1, 2])
def test_each_sentence_goes_through_the_encoder_once_for_all_targets(sample, beam_size):
    from dataclasses import replace

    from nllbcli.io import Record

    texts = [f"The meeting is on the {day}. Yes." for day in ("first", "second", "third", "fourth", "fifth")]
    records = [Record(n, text, {"text": text}) for n, text in enumerate(texts)]
    counting = CountingEngine(sample.engine)
    translator = replace(sample, engine=counting)
    decode = DecodeOptions(beam_size=beam_size, max_length=8)
    job = Job(src="eng_Latn", tgt=None, targets=tuple(TARGETS), output_format="jsonl")
    # batches of 4 sentences: 3 targets of a sentence would straddle them but for plan_chunk's groups
    outcomes = ChunkWorker(translator, job, decode, BatchOptions(max_batch_tokens=10**6, max_batch_sentences=4))(records)
    yes = tuple(sample.tokenizer.encode("Yes.", "eng_Latn"))
    sources = {tuple(sample.tokenizer.encode(s, "eng_Latn")) for t in texts for s in nllbcli.model.split.split_text(t)[0]}
    assert len(sources) == 6  # "Yes." in every row: 15 copies, more than a batch holds
    assert sorted(s for s in counting.encoded if s != yes) == sorted(sources - {yes})  # each once, not once a target
    counting.encoded.clear()
    ChunkWorker(translator, job, decode, BatchOptions(max_batch_tokens=10**6))(records)  # one batch: "Yes." once for all its rows too
    assert sorted(counting.encoded) == sorted(sources)
    for code, n in zip(TARGETS, range(3)):
        single = ChunkWorker(sample, Job(src="eng_Latn", tgt=code, output_format="jsonl"), decode, BatchOptions(max_batch_tokens=10**6))(records)
        assert [o.targets[n].translation for o in outcomes] == [o.translation for o in single]


def test_a_batch_larger_than_the_kv_pool_keeps_a_sentences_targets_in_one_part(sample, monkeypatch):
    from dataclasses import replace

    counting = CountingEngine(sample.engine)
    monkeypatch.setattr(counting, "capacity", lambda max_length, per_sentence, **job: (4, 10**6), raising=False)
    translator = replace(sample, engine=counting)
    sources = [sample.tokenizer.encode(t, "eng_Latn") for t in ("Yes.", "Hello!", "No.")]
    batch = [ids for ids in sources for _ in range(3)]  # each into 3 targets, parts of 4 sentences at most
    decode = DecodeOptions(beam_size=1, max_length=8)
    found = translator.generate(batch, TARGETS * 3, decode)
    assert sorted(counting.encoded) == sorted(tuple(ids) for ids in sources)
    assert found == sample.generate(batch, TARGETS * 3, decode)


def test_plan_batches_keeps_a_group_together_where_it_fits():
    lengths = {n: 5 for n in range(9)}
    groups = {n: n // 3 * 3 for n in range(9)}  # three groups of three
    assert plan_batches(lengths, 100, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert plan_batches(lengths, 100, 4, groups) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert plan_batches(lengths, 100, 2, groups) == [[0, 1], [2], [3, 4], [5], [6, 7], [8]]  # too large: cut
    assert plan_batches({0: 5, 1: 5, 2: 3, 3: 3}, 100, 3, {0: 0, 1: 1, 2: 2, 3: 2}) == [[0, 1], [2, 3]]


def test_sampling_draws_each_targets_tokens_as_that_target_alone(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", TEXTS)
    args = ["--sampling-topk", "0", "--seed", "7", "--sampling-temperature", "2"]
    translate(["--tgt", "fra_Latn,deu_Latn", *args], tmp_path / "in.jsonl", tmp_path / "out.jsonl")
    rows = rows_of(tmp_path / "out.jsonl")
    for code in TARGETS[:2]:
        assert [row[f"translation_{code}"] for row in rows] == [row["translation"] for row in alone(tmp_path, args, code)]


def test_devices_give_one_devices_rows(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", TEXTS * 2)
    args = ["--tgt", "fr,de", "--targets-as", "rows", "--chunk-rows", "3", str(tmp_path / "in.jsonl")]
    one = CliRunner().invoke(cli, BASE + args + [str(tmp_path / "one.jsonl")])
    on_devices = [a for a in BASE if a not in ("--device", "cpu")] + ["--devices", "cpu:2"]
    two = CliRunner().invoke(cli, on_devices + args + [str(tmp_path / "two.jsonl")])
    assert one.exit_code == two.exit_code == 0, two.output
    assert (tmp_path / "one.jsonl").read_bytes() == (tmp_path / "two.jsonl").read_bytes()


@pytest.mark.parametrize("args, message", [
    (["--tgt", "fr,fra_Latn"], "Invalid value for '--tgt': fr and fra_Latn are both fra_Latn: name each target "
                               "language once."),
    (["--tgt", "fr,fr"], "Invalid value for '--tgt': fr and fr are both fra_Latn: name each target language once."),
    (["--tgt", "fr,de", "--field", "translation_de"], None),  # it would clash with translation_de, not translation_deu_Latn
    (["--tgt", "fr,"], "Invalid value for '--tgt': 'fr,' has an empty language code: name them with commas between, as "
                       "fra_Latn,deu_Latn."),
    (["--tgt", "fr,xx_Yyyy"], "Invalid value for '--tgt': "),
    (["--tgt", "fr", "--targets-as", "rows"], "--targets-as goes with several target languages: --tgt fra_Latn,deu_Latn."),
    (["--tgt", "fr,de", "--targets-as", "columns", "--output-format", "text"],
     "Several target languages as columns need JSONL, Parquet or CSV output: a text output has no columns. Pass "
     "--targets-as rows for a line per target language."),
    (["--tgt", "fr,de", "--targets-as", "rows", "--tgt-lang-field", ""],
     "--targets-as rows names each row's target language in --tgt-lang-field: give it a name."),
    (["--tgt", "fr,de", "--field", "translation_deu_Latn"],
     "--output-field translation writes translation_deu_Latn, which is the field being translated (--field)"),
    (["--tgt", "fr,de", "--targets-as", "rows", "--tgt-lang-field", "status", "--status-field", "status"],
     "--status-field status is --tgt-lang-field's field too: name another."),
])
def test_several_targets_that_cannot_be_are_one_line(tmp_path, args, message):
    write_jsonl(tmp_path / "in.jsonl", ["Yes."])
    result = CliRunner().invoke(cli, BASE + args + [str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl")])
    if message is None:
        assert result.exit_code == 1 and "no field 'translation_de'" in result.output  # checked on the codes
        return
    assert result.exit_code == 2, result.output
    assert message in result.output and result.output.count("\n") == 1 and "Traceback" not in result.output


def test_a_row_with_a_targets_field_is_refused_unless_overwritten(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", ["Yes."], tgt_lang="kor_Hang")
    result = CliRunner().invoke(cli, BASE + ["--tgt", "fr,de", "--targets-as", "rows", str(tmp_path / "in.jsonl"), "-"])
    assert result.exit_code == 1 and "has a field 'tgt_lang' already, which --tgt-lang-field would replace" in result.output
    result = CliRunner().invoke(cli, BASE + ["--tgt", "fr,de", "--targets-as", "rows", "--overwrite-field",
                                             str(tmp_path / "in.jsonl"), "-"])
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["tgt_lang"] for line in result.output.splitlines()] == ["fra_Latn", "deu_Latn"]
    pq.write_table(pa.table({"text": ["Yes."], "translation_deu_Latn": ["x"]}), tmp_path / "in.parquet")
    result = CliRunner().invoke(cli, BASE + ["--tgt", "fr,de", str(tmp_path / "in.parquet"), str(tmp_path / "o.parquet")])
    assert result.exit_code == 1
    assert "a column 'translation_deu_Latn' already, which --output-field would replace" in result.output


def test_the_table_api_and_sparks_schema_take_several_targets(sample):
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from nllbcli.spark import partition_translator

    table = pa.table({"id": [0, 1], "text": ["Yes.", None]})
    columns = nllbcli.translate_table(sample, table, "eng_Latn", "fr,de", DecodeOptions(max_length=8),
                                      status_field="status", error_field="error")
    assert columns.column_names == ["id", "text", "translation_fra_Latn", "translation_deu_Latn", "status_fra_Latn",
                                    "status_deu_Latn", "error"]
    single = nllbcli.translate_table(sample, table, "eng_Latn", "deu_Latn", DecodeOptions(max_length=8), on_error="skip")
    assert columns.column("translation_deu_Latn").to_pylist() == single.column("translation").to_pylist() + [None]
    rows = nllbcli.translate_table(sample, table, "eng_Latn", ["fr", "de"], DecodeOptions(max_length=8),
                                   targets_as="rows", error_field="error")
    assert rows.select(["id", "tgt_lang"]).to_pylist() == [
        {"id": 0, "tgt_lang": "fra_Latn"}, {"id": 0, "tgt_lang": "deu_Latn"},
        {"id": 1, "tgt_lang": "fra_Latn"}, {"id": 1, "tgt_lang": "deu_Latn"}]
    assert rows.column("error").null_count == 2
    with pytest.raises(NllbError, match="fr and fra_Latn are both fra_Latn: name each target language once."):
        nllbcli.translate_table(sample, table, "eng_Latn", "fr,fra_Latn")
    given = StructType([StructField("id", LongType()), StructField("text", StringType())])
    for out, options in ((columns, {"status_field": "status"}), (rows, {"targets_as": "rows"})):
        schema = partition_translator(SAMPLE, src="eng_Latn", tgt="fr,de", **options).schema(given)
        assert [f.name for f in schema.fields] == out.column_names


def test_ray_takes_several_targets_as_columns_only(tmp_path):
    raydata = pytest.importorskip("nllbcli.runners.ray")
    write_jsonl(tmp_path / "in.jsonl", ["Yes."])
    job = Job(src="eng_Latn", tgt=None, targets=("fra_Latn", "deu_Latn"), targets_as="rows")
    with pytest.raises(NllbError, match="several target languages go to columns there"):
        raydata.translate_with_ray([str(tmp_path / "in.jsonl")], str(tmp_path / "out"), job, DecodeOptions(), ModelOptions(SAMPLE))


@pytest.mark.parametrize("how, extension", [("rows", "parquet")])  # a row per target: more rows out than in
def test_a_killed_job_of_several_targets_resumes_to_the_same_bytes(tmp_path, how, extension):
    texts = [f"Hello {n}. The weather is nice." if n % 4 else "" for n in range(240)]
    source = tmp_path / f"in.{extension}"
    if extension == "parquet":
        pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), source, row_group_size=32)
    else:
        write_jsonl(source, texts)

    def command(target, *extra):
        return [sys.executable, "-m", "nllbcli.cli", "translate", "--src", "en", "--tgt", "fra_Latn,deu_Latn,es",
                "--targets-as", how, "--model", TINY, "--device", "cpu", "--max-length", "6", "--chunk-rows", "20",
                "--progress", "none", *extra, str(source), str(target)]

    assert subprocess.run(command(tmp_path / f"straight.{extension}")).returncode == 0
    target = tmp_path / f"out.{extension}"
    state = tmp_path / f".out.{extension}.nllb-state.json"
    run(command(target), kill_after=0, sig=signal.SIGKILL, after_commit=state)
    assert state.exists() and not target.exists()
    assert subprocess.run(command(target, "--resume")).returncode == 0
    assert target.read_bytes() == (tmp_path / f"straight.{extension}").read_bytes()
    changed = subprocess.run(command(target, "--resume"), capture_output=True, text=True)  # finished: nothing to do
    assert changed.returncode == 0


def test_translate_takes_one_target(sample):
    with pytest.raises(NllbError, match="translate takes one target language, not 'fr,de': translate_table takes several."):
        nllbcli.translate(sample, ["Yes."], "en", "fr,de")


def test_a_sources_copies_take_its_cross_rows_once_in_the_kv_pool(sample, monkeypatch):
    """The copies of a source share its cross K/V rows: a part counts the source's tokens once, so copies that
    fit together as one source are not cut into parts (each encoding the source again)."""
    from dataclasses import replace

    yes = sample.tokenizer.encode("Yes.", "eng_Latn")
    counting = CountingEngine(sample.engine)
    monkeypatch.setattr(counting, "capacity", lambda max_length, per_sentence, **job: (100, 2 * len(yes)), raising=False)
    decode = DecodeOptions(beam_size=1, max_length=8)
    found = replace(sample, engine=counting).generate([yes] * 3, TARGETS, decode)
    assert counting.encoded == [tuple(yes)]
    assert found == sample.generate([yes] * 3, TARGETS, decode)
