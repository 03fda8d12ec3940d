"""The decoding controls as users reach them: --scores, --num-hypotheses, --min-length, --max-length-a/b on the
command line (JSONL, Parquet, text, --devices, resume) and through the table API."""

import json
from dataclasses import fields, replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import nllbcli
from nllbcli.cli import cli
from nllbcli.options import DecodeOptions
from nllbcli.model.translator import load_translator

from test_decoding import MODELS

SAMPLE = str(MODELS["sample"])
TRANSLATE = ["translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn", "--model", SAMPLE, "--device", "cpu",
             "--max-length", "24"]
TEXTS = ["The meeting is on the twentieth.", "", "Hello! I will bring ninety-seven red boxes.", "Yes."]


@pytest.fixture(scope="module")
def sample():
    return load_translator(SAMPLE, "cpu")


def write_jsonl(path, texts):
    path.write_text("".join(json.dumps({"id": n, "text": t}) + "\n" for n, t in enumerate(texts)))


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("beam_size", [1, 4])
def test_scores_are_the_searchs_summed_over_a_rows_sentences(tmp_path, sample, beam_size):
    write_jsonl(tmp_path / "in.jsonl", TEXTS)
    result = CliRunner().invoke(cli, TRANSLATE + ["--beam-size", str(beam_size), "--scores", str(tmp_path / "in.jsonl"),
                                                  str(tmp_path / "out.jsonl")])
    assert result.exit_code == 0, result.output
    rows = rows_of(tmp_path / "out.jsonl")
    options = DecodeOptions(beam_size=beam_size, max_length=24, scores=True)
    for row, text in zip(rows, TEXTS):
        assert list(row) == ["id", "text", "translation", "score", "log_prob"]
        sentences = nllbcli.model.split.split_text(text)[0] if text else []
        found = [h[0] for h in sample.generate_hypotheses([sample.tokenizer.encode(s, "eng_Latn") for s in sentences],
                                                            "fra_Latn", options)]
        assert row["log_prob"] == sum(h.log_prob for h in found)  # to the bit, though in another batch
        if len(found) == 1:
            assert row["score"] == found[0].score
        elif beam_size == 1:
            assert row["score"] == row["log_prob"]
        elif found:
            assert row["score"] == sum(h.score for h in found) / len(found)
    assert rows[1]["translation"] == "" and rows[1]["score"] == rows[1]["log_prob"] == 0.0
    assert len(nllbcli.model.split.split_text(TEXTS[2])[0]) == 2  # a row of two sentences is there
    if beam_size == 1:
        assert all(r["score"] == r["log_prob"] for r in rows)
    else:
        assert all(r["score"] > r["log_prob"] for r in rows if r["text"])


@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_bytes_do_not_depend_on_the_batches_or_the_threads(tmp_path, beam_size):
    """Scores included, to the bit: each sentence alone (--max-batch-sentences 1), in batches of a few source
    tokens, in chunks of one row, or in the default batches of the whole input; on 1 thread or 3."""
    heldout = (MODELS["sample"].parent / "heldout" / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()
    write_jsonl(tmp_path / "in.jsonl", TEXTS + [" ".join(line.split()[: 2 + n % 9]) for n, line in enumerate(heldout[:16])])
    args = ["--beam-size", str(beam_size), "--scores", str(tmp_path / "in.jsonl"), "-"]
    variants = ([], ["--max-batch-sentences", "1"], ["--max-batch-tokens", "30"], ["--chunk-rows", "1"], ["--threads", "3"])
    runs = [CliRunner().invoke(cli, TRANSLATE + ["--threads", "1"] + extra + args) for extra in variants]
    assert [run.exit_code for run in runs] == [0] * len(variants), runs[0].output
    assert [run.output for run in runs[1:]] == [runs[0].output] * (len(variants) - 1)


def test_n_best_lists_in_jsonl_and_parquet_and_lines_in_text(tmp_path, sample):
    write_jsonl(tmp_path / "in.jsonl", TEXTS)
    args = ["--num-hypotheses", "3", "--beam-size", "4", "--scores", "--status-field", "status"]
    for out in ("out.jsonl", "out.parquet"):
        result = CliRunner().invoke(cli, TRANSLATE + args + [str(tmp_path / "in.jsonl"), str(tmp_path / out)])
        assert result.exit_code == 0, result.output
    rows = rows_of(tmp_path / "out.jsonl")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.field("translation").type == pa.list_(pa.string())
    assert table.schema.field("score").type == table.schema.field("log_prob").type == pa.list_(pa.float64())
    assert table.schema.field("status").type == pa.string()
    assert table.to_pylist() == rows
    best = CliRunner().invoke(cli, TRANSLATE + ["--beam-size", "4", str(tmp_path / "in.jsonl"), "-"])
    for row, plain in zip(rows, best.output.splitlines()):
        assert len(row["translation"]) == len(row["score"]) == len(row["log_prob"]) == 3
        assert row["translation"][0] == json.loads(plain)["translation"]  # the best is the plain translation
        assert row["score"] == sorted(row["score"], reverse=True)
        assert row["status"] == "ok"
    assert len({*rows[0]["translation"]}) == 3
    text = CliRunner().invoke(cli, TRANSLATE + ["--num-hypotheses", "3", "--beam-size", "4", "--output-format", "text",
                                                str(tmp_path / "in.jsonl"), "-"])
    assert text.exit_code == 0
    assert text.output.splitlines() == [t for row in rows for t in row["translation"]]


def test_a_failed_row_keeps_its_lines_in_n_best_text(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"text": "Yes."}\n{"text": 5}\n{"text": "Hello!"}\n')
    result = CliRunner().invoke(cli, TRANSLATE + ["--num-hypotheses", "2", "--on-error", "skip", "--output-format",
                                                  "text", str(tmp_path / "in.jsonl"), "-"], catch_exceptions=False)
    assert result.exit_code == 3
    lines = result.stdout.splitlines()
    assert len(lines) == 6 and lines[2] == lines[3] == "" and all(lines[:2] + lines[4:])


@pytest.mark.parametrize("args,message", [
    (["--scores", "--output-format", "text"], "--scores needs JSONL, Parquet or CSV output"),
    (["--score-field", "s"], "--score-field goes with --scores."),
    (["--num-hypotheses", "5", "--beam-size", "4"], "1 to the beam size (4), not 5"),
    (["--scores", "--score-field", "translation"], "--score-field translation is --output-field's field too"),
    (["--scores", "--log-prob-field", "text"], "--log-prob-field text is --field's field too"),
])
def test_decoding_options_that_cannot_go_together_are_one_line(tmp_path, args, message):
    write_jsonl(tmp_path / "in.jsonl", ["Yes."])
    result = CliRunner().invoke(cli, TRANSLATE + args + [str(tmp_path / "in.jsonl"), "-"])
    assert result.exit_code != 0 and message in result.output and result.output.count("\n") == 1, result.output


def test_a_row_with_a_score_field_is_refused_unless_overwritten(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"text": "Yes.", "score": 0.9}\n')
    result = CliRunner().invoke(cli, TRANSLATE + ["--scores", str(tmp_path / "in.jsonl"), "-"])
    assert result.exit_code == 1 and "field 'score' already, which --score-field would replace" in result.output
    result = CliRunner().invoke(cli, TRANSLATE + ["--scores", "--score-field", "nllb_score", str(tmp_path / "in.jsonl"), "-"])
    assert result.exit_code == 0 and list(json.loads(result.output)) == ["text", "score", "translation", "nllb_score",
                                                                         "log_prob"]


def test_length_options_reach_the_search_and_flag_the_rows(tmp_path, sample):
    write_jsonl(tmp_path / "in.jsonl", ["Hello! I will bring ninety-seven red boxes."])
    args = ["--no-split", "--beam-size", "1", "--max-length-a", "0.5", "--max-length-b", "1", "--status-field", "status"]
    result = CliRunner().invoke(cli, TRANSLATE + args + [str(tmp_path / "in.jsonl"), "-"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.output)
    source = sample.tokenizer.encode(row["text"], "eng_Latn")
    limit = int(0.5 * len(source) + 1)
    assert row["status"] == "max_length"
    assert len(sample.tokenizer.encode(row["translation"], "fra_Latn")) - 1 <= limit  # its pieces, </s> left out
    result = CliRunner().invoke(cli, TRANSLATE + ["--no-split", "--beam-size", "1", "--min-length", "20",
                                                  str(tmp_path / "in.jsonl"), "-"])
    want = sample.generate([source], "fra_Latn", DecodeOptions(beam_size=1, max_length=24, min_length=20))[0]
    assert json.loads(result.output)["translation"] == sample.tokenizer.decode(want)
    assert len(want) + 1 >= 20


def test_devices_give_the_scores_and_lists_of_one_device(tmp_path):
    """... to the bit, though each worker has half the one-device job's threads."""
    write_jsonl(tmp_path / "in.jsonl", TEXTS * 3)
    args = ["--num-hypotheses", "2", "--beam-size", "2", "--scores", "--chunk-rows", "2", "--threads", "2",
            str(tmp_path / "in.jsonl")]
    one = CliRunner().invoke(cli, TRANSLATE + args + [str(tmp_path / "one.jsonl")])
    on_devices = [a for a in TRANSLATE if a not in ("--device", "cpu")] + ["--devices", "cpu:2"]
    two = CliRunner().invoke(cli, on_devices + args + [str(tmp_path / "two.jsonl")])
    assert one.exit_code == two.exit_code == 0, two.output
    assert (tmp_path / "one.jsonl").read_bytes() == (tmp_path / "two.jsonl").read_bytes()


def test_the_table_api_adds_typed_columns(sample):
    table = pa.table({"text": TEXTS})
    decode = DecodeOptions(beam_size=3, max_length=24, scores=True, num_hypotheses=2)
    out = nllbcli.translate_table(sample, table, "eng_Latn", "fra_Latn", decode, error_field="error")
    assert out.column_names == ["text", "translation", "score", "log_prob", "error"]
    assert out.schema.field("score").type == pa.list_(pa.float64())
    results = nllbcli.translate(sample, TEXTS, "eng_Latn", "fra_Latn", decode)
    assert [r.hypotheses for r in results] == out.column("translation").to_pylist()
    assert [r.score for r in results] == out.column("score").to_pylist()
    assert [r.text for r in results] == [h[0] for h in out.column("translation").to_pylist()]
    plain = nllbcli.translate(sample, TEXTS, "eng_Latn", "fra_Latn", replace(decode, scores=False, num_hypotheses=1))
    assert [r.text for r in plain] == [r.text for r in results] and plain[0].score is None


def test_every_decoding_option_is_in_the_jobs_identity():
    """Each decoding option picks the tokens (or the fields a row gets), at its default too: a state written
    before an option existed names the model by its directory alone, and is never continued anyway."""
    from nllbcli.job.spec import shaping_values

    assert set(shaping_values(DecodeOptions())) == {f.name for f in fields(DecodeOptions)}
    assert shaping_values(DecodeOptions(min_length=3))["min_length"] == 3


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_prefix_field_starts_the_rows_translation(tmp_path, sample, beam_size):
    rows = [{"text": "The meeting is on the twentieth. Yes.", "p": "Ils ont vendu"}, {"text": "Yes.", "p": None},
            {"text": "Yes."}, {"text": "Hello!", "p": ""}, {"text": "Yes.", "p": 7}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["--beam-size", str(beam_size), "--on-error", "skip", str(tmp_path / "in.jsonl"), "-"]
    result = CliRunner().invoke(cli, TRANSLATE + ["--prefix-field", "p"] + args)
    plain = CliRunner().invoke(cli, TRANSLATE + args)
    assert result.exit_code == 3 and result.stderr.count("\n") == 1
    assert "in.jsonl:5: field 'p' is int, not a string to start the translation with." in result.stderr
    got, want = [json.loads(x) for x in result.stdout.splitlines()], [json.loads(x) for x in plain.stdout.splitlines()]
    assert got[0]["translation"].startswith("Ils ont vendu") and not want[0]["translation"].startswith("Ils ont vendu")
    sentences = [sample.tokenizer.encode(s, "eng_Latn") for s in ("The meeting is on the twentieth.", "Yes.")]
    prefix = sample.tokenizer.encode("Ils ont vendu", "fra_Latn")[1:-1]
    options = DecodeOptions(beam_size=beam_size, max_length=24)
    first, second = [h[0].ids for h in sample.generate_hypotheses(sentences, "fra_Latn", options, None, [prefix, []])]
    assert first[: len(prefix)] == prefix
    assert got[0]["translation"] == sample.tokenizer.decode(first) + " " + sample.tokenizer.decode(second)
    assert [r["translation"] for r in got[1:]] == [r["translation"] for r in want[1:4]]  # the others as without


def test_a_prefix_with_a_lone_surrogate_fails_its_row_naming_it(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"text": "Yes.", "p": "Oui\\ud800"}\n{"text": "Yes.", "p": "Oui"}\n')
    result = CliRunner().invoke(cli, TRANSLATE + ["--prefix-field", "p", "--on-error", "skip", str(tmp_path / "in.jsonl"), "-"])
    assert result.exit_code == 3
    assert result.stderr == (f"Skipped: {tmp_path / 'in.jsonl'}:1: field 'p' holds a lone surrogate (\\ud800 at character 4), "
                             "half of a UTF-16 pair, which is not text.\n")
    assert json.loads(result.stdout)["translation"].startswith("Oui")


def test_a_prefix_field_needs_fields(tmp_path):
    (tmp_path / "in.txt").write_text("Yes.\n")
    result = CliRunner().invoke(cli, TRANSLATE + ["--prefix-field", "p", str(tmp_path / "in.txt"), "-"])
    assert result.exit_code == 2 and "--prefix-field needs JSONL, Parquet or CSV input" in result.output


def test_the_nbest_text_layout_names_each_rows_hypotheses_and_their_scores(tmp_path):
    """--text-layout nbest: marian's n-best lines, ROW ||| TRANSLATION ||| log_prob= LOG_PROB ||| SCORE, the row
    counted from 0, each hypothesis with the scores JSONL's --scores gives it; a failed row has no line; another
    output format is refused in one line."""
    write_jsonl(tmp_path / "in.jsonl", TEXTS + [None])
    args = TRANSLATE + ["--beam-size", "3", "--num-hypotheses", "2", "--on-error", "skip"]
    result = CliRunner().invoke(cli, args + ["--scores", str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl")])
    assert result.exit_code == 3, result.output
    result = CliRunner().invoke(cli, args + ["--text-layout", "nbest", "--output-format", "text",
                                             str(tmp_path / "in.jsonl"), str(tmp_path / "out.txt")])
    assert result.exit_code == 3, result.output
    expected = [f"{row} ||| {text} ||| log_prob= {json.dumps(log_prob)} ||| {json.dumps(score)}"
                for row, line in enumerate(rows_of(tmp_path / "out.jsonl"))
                for text, score, log_prob in zip(line["translation"], line["score"], line["log_prob"])]
    assert (tmp_path / "out.txt").read_text().splitlines() == expected and len(expected) == 2 * len(TEXTS)
    refused = CliRunner().invoke(cli, args + ["--text-layout", "nbest", str(tmp_path / "in.jsonl"), str(tmp_path / "o.jsonl")])
    assert refused.exit_code == 2 and "--text-layout nbest lays out a text output" in refused.output
