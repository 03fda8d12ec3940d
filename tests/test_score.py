"""nllb score: forced decoding of given translations, against transformers' forward pass with labels
(tests/golden/score.json, tools/make_score_goldens.py), and the job promises of nllb translate."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from nllbcli.cli import cli
from nllbcli.model.translator import load_translator
from nllbcli.options import DecodeOptions

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = json.loads((ROOT / "tests" / "golden" / "score.json").read_text(encoding="utf-8"))["cases"]
MODELS = {"tiny-a": ROOT / "tests" / "models" / "tiny-a", "tiny-m2m": ROOT / "tests" / "models" / "tiny-m2m",
          "sample": ROOT / "data" / "samples" / "model"}
SAMPLE = str(MODELS["sample"])
# Within 1e-4 (measured: the sample model 3e-6 a token, tiny-m2m 9e-6). tiny-a's random weights (std 0.5) give
# logits of a few hundred, where one float32 ulp is 3e-5: NumPy's and PyTorch's float32 sums part by up to 1.5e-4
# a token (2.2e-5 of its log-probability), 3.1e-4 over a translation, so its tolerance is relative.
TOLERANCE = {"sample": {"abs": 1e-4}, "tiny-m2m": {"abs": 1e-4}, "tiny-a": {"rel": 1e-4, "abs": 1e-6}}
HELDOUT = ROOT / "data" / "samples" / "heldout"


@lru_cache(maxsize=None)
def translator(name: str):
    return load_translator(str(MODELS[name]), "cpu")


def test_the_golden_log_probabilities_are_the_forward_pass_loss():
    """The goldens' per-label log-probabilities give back the loss transformers' pass computed with them."""
    for name in MODELS:
        cases = [case for case in GOLDEN if case["model"] == name]
        total = sum(sum(case["label_log_probs"]) for case in cases)
        assert -total / cases[0]["batch_labels"] == pytest.approx(cases[0]["batch_loss"], rel=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("length_penalty", [1.0, 0.6])
def test_score_matches_transformers_forward_pass_with_labels(name, length_penalty):
    cases = [case for case in GOLDEN if case["model"] == name]
    model = translator(name)
    tgt = cases[0]["tgt_lang"]
    assert all(case["labels"][0] == model.tokenizer.lang_id(tgt) for case in cases)
    found = model.generate_hypotheses([case["input_ids"] for case in cases], tgt,
                                      DecodeOptions(beam_size=1, length_penalty=length_penalty),
                                      targets=[case["labels"][1:-1] for case in cases])
    for case, (hypothesis,) in zip(cases, found):
        expected = case["label_log_probs"][1:]  # the language token is forced, not scored
        assert hypothesis.token_log_probs == pytest.approx(expected, **TOLERANCE[name])
        assert hypothesis.log_prob == pytest.approx(sum(expected), **TOLERANCE[name])
        assert hypothesis.score == pytest.approx(sum(expected) / len(case["labels"]) ** length_penalty,
                                                 **TOLERANCE[name])


def run(args: list[str], input: str | None = None):
    return CliRunner().invoke(cli, args, input=input, catch_exceptions=False)


def sample_pairs(count: int = 4) -> list[dict]:
    english = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()[:count]
    french = (HELDOUT / "fra_Latn.txt").read_text(encoding="utf-8").splitlines()[:count]
    return [{"id": n, "text": en, "translation": fr} for n, (en, fr) in enumerate(zip(english, french))]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_nllb_score_adds_each_rows_scores_as_transformers_gives_them(here):
    """The command tokenizes the texts as transformers' tokenizer does, and scores them as its forward pass."""
    golden = [case for case in GOLDEN if case["model"] == "sample"]
    rows = sample_pairs(8)
    rows[5]["translation"], rows[6]["translation"] = rows[6]["translation"], rows[5]["translation"]
    write_jsonl(here / "pairs.jsonl", rows)
    result = run(["score", "-m", SAMPLE, "--src", "eng_Latn", "--tgt", "fra_Latn", "--token-scores", "pairs.jsonl",
                  "scored.jsonl"])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("Done: 8 rows into scored.jsonl (8 scored, 0 failed")
    scored = read_jsonl(here / "scored.jsonl")
    for row, written, case in zip(rows, scored, golden):
        assert list(written) == ["id", "text", "translation", "score", "log_prob", "token_scores"]
        assert {k: written[k] for k in row} == row
        expected = case["label_log_probs"][1:]
        assert written["token_scores"] == pytest.approx(expected, abs=1e-4)
        assert written["log_prob"] == pytest.approx(sum(expected), abs=1e-4)
        assert written["score"] == pytest.approx(sum(expected) / len(case["labels"]), abs=1e-4)
    # the swapped translations score far below the true ones
    assert max(scored[5]["score"], scored[6]["score"]) < min(r["score"] for n, r in enumerate(scored) if n not in (5, 6))


def test_a_translation_scores_what_the_search_gave_it(here):
    """nllb translate --scores, then nllb score on its output: the same log-probability and score, beam search's
    and greedy search's (whose score is its log-probability; on the CPU the same bits)."""
    write_jsonl(here / "in.jsonl", [{"text": row["text"]} for row in sample_pairs(3)])
    for beams in ("4", "1"):
        result = run(["translate", "-m", SAMPLE, "--src", "eng_Latn", "--tgt", "fra_Latn", "--beam-size", beams,
                      "--scores", "--score-field", "search_score", "--log-prob-field", "search_log_prob", "in.jsonl",
                      "out.jsonl", "--force"])
        assert result.exit_code == 0, result.output
        result = run(["score", "-m", SAMPLE, "--src", "eng_Latn", "--tgt", "fra_Latn", "out.jsonl", "scored.jsonl",
                      "--force"])
        assert result.exit_code == 0, result.output
        for row in read_jsonl(here / "scored.jsonl"):
            if beams == "4":  # beam search sums its float32 log-probabilities as it goes
                assert row["log_prob"] == pytest.approx(row["search_log_prob"], abs=1e-5)
                assert row["score"] == pytest.approx(row["search_score"], abs=1e-5)
            else:  # greedy search's are the same arithmetic, summed alike: to the bit
                assert row["log_prob"] == row["search_log_prob"]


def test_two_text_files_are_scored_line_by_line(here):
    rows = sample_pairs(3)
    (here / "en.txt").write_text("".join(r["text"] + "\n" for r in rows), encoding="utf-8")
    (here / "fr.txt").write_text("".join(r["translation"] + "\n" for r in rows), encoding="utf-8")
    write_jsonl(here / "pairs.jsonl", rows)
    result = run(["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "en.txt", "--target-file", "fr.txt",
                  "--token-scores"])
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert run(["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "pairs.jsonl", "scored.jsonl"]).exit_code == 0
    for (log_prob, score, tokens), row in zip(lines, read_jsonl(here / "scored.jsonl")):
        assert (float(log_prob), float(score)) == (row["log_prob"], row["score"])
        assert sum(map(float, tokens.split(" "))) == pytest.approx(row["log_prob"], abs=1e-6)
    (here / "short.txt").write_text(rows[0]["translation"] + "\n", encoding="utf-8")
    result = run(["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "en.txt", "--target-file", "short.txt"])
    assert result.exit_code == 1
    assert result.stderr == ("Error: short.txt has 1 lines and en.txt 3: the translations to score go a line each, the "
                             "line of the text's own number.\n")
    result = run(["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "en.txt"])
    assert result.exit_code == 2
    assert result.stderr == ("Error: A text INPUT has no fields: name the file of its translations, a line each, with "
                             "--target-file.\n")


def test_a_row_without_its_translation_fails_alone(here):
    rows = sample_pairs(3)
    del rows[1]["translation"]
    rows[2]["translation"] = None
    write_jsonl(here / "pairs.jsonl", rows)
    result = run(["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "pairs.jsonl", "scored.jsonl",
                  "--errors", "bad.jsonl"])
    assert result.exit_code == 3, result.output
    assert [row["id"] for row in read_jsonl(here / "scored.jsonl")] == [0]
    reasons = [row["error"] for row in read_jsonl(here / "bad.jsonl")]
    assert reasons == ["pairs.jsonl:2: no field 'translation' with the translation to score (fields: id, text); name "
                       "it with --target-field.",
                       "pairs.jsonl:3: field 'translation' is null, not a translation to score."]


def test_split_scores_sentence_pairs_and_refuses_rows_whose_sentences_differ(here):
    rows = sample_pairs(4)
    write_jsonl(here / "one.jsonl", rows[:2])
    joined = [{"text": rows[0]["text"] + " " + rows[1]["text"], "translation": rows[0]["translation"] + " " +
               rows[1]["translation"]},
              {"text": rows[2]["text"] + " " + rows[3]["text"], "translation": rows[2]["translation"]}]
    write_jsonl(here / "two.jsonl", joined)
    assert run(["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "one.jsonl", "one.out.jsonl"]).exit_code == 0
    result = run(["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "--split", "--on-error", "skip", "two.jsonl",
                  "two.out.jsonl"])
    assert result.exit_code == 3
    assert "two.jsonl:2: the text has 2 sentence(s) and its translation 1: score the row whole (without --split)." in result.stderr
    alone, (both,) = read_jsonl(here / "one.out.jsonl"), read_jsonl(here / "two.out.jsonl")
    assert both["log_prob"] == pytest.approx(alone[0]["log_prob"] + alone[1]["log_prob"], abs=1e-9)
    assert both["score"] == pytest.approx((alone[0]["score"] + alone[1]["score"]) / 2, abs=1e-9)


def test_a_score_job_resumes_and_is_not_run_twice(here):
    write_jsonl(here / "pairs.jsonl", sample_pairs(5))
    args = ["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "pairs.jsonl", "scored.parquet", "--chunk-rows", "2"]
    assert run(args).exit_code == 0
    table = pq.read_table(here / "scored.parquet")
    assert table.column_names == ["id", "text", "translation", "score", "log_prob"]
    result = run(args + ["--resume"])
    assert result.exit_code == 0
    assert result.stderr.startswith("Already finished: scored.parquet holds this job's 5 rows")
    result = run(args + ["--resume", "--length-penalty", "0.5"])  # another job: scored again
    assert result.exit_code == 0
    assert result.stderr.startswith("Starting afresh: scored.parquet was finished by a job that differs in decode.\nDone: 5 rows")
    assert pq.read_table(here / "scored.parquet").column("score").to_pylist() != table.column("score").to_pylist()


def test_the_target_field_is_not_the_text_and_no_output_replaces_an_input(here):
    write_jsonl(here / "pairs.jsonl", sample_pairs(1))
    (here / "en.txt").write_text("a\n", encoding="utf-8")
    result = run(["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "--target-field", "text", "pairs.jsonl", "o.jsonl"])
    assert result.exit_code == 2
    assert result.stderr == "Error: --target-field text is --field's too: the translation to score is another field than the text.\n"
    (here / "fr.txt").write_text("b\n", encoding="utf-8")
    result = run(["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "en.txt", "--target-file", "fr.txt", "fr.txt",
                  "--force"])
    assert result.exit_code == 2
    assert result.stderr == "Error: OUTPUT fr.txt is --target-file fr.txt: refusing to write over the input.\n"


def test_the_api_scores_lists_as_the_command_does(here):
    import nllbcli

    rows = sample_pairs(3)
    write_jsonl(here / "pairs.jsonl", rows)
    assert run(["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "--token-scores", "pairs.jsonl",
                "scored.jsonl"]).exit_code == 0
    model = nllbcli.load(SAMPLE, device="cpu")
    texts, translations = [r["text"] for r in rows] + [7], [r["translation"] for r in rows] + ["x"]
    results = nllbcli.score(model, texts, translations, "eng_Latn", "fra", token_scores=True)
    for result, row in zip(results, read_jsonl(here / "scored.jsonl")):
        assert (result.text, result.status, result.error) == (row["translation"], "ok", None)
        assert (result.log_prob, result.score, result.token_scores) == (row["log_prob"], row["score"], row["token_scores"])
    assert (results[3].text, results[3].error) == (None, "row 4: int, not a string.")
    with pytest.raises(ValueError, match="texts and translations go in pairs: 1 texts and 2 translations."):
        nllbcli.score(model, ["a"], ["b", "c"], "en", "fr")


def test_devices_workers_score_what_one_process_scores(here):
    write_jsonl(here / "pairs.jsonl", sample_pairs(6))
    args = ["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "--chunk-rows", "2", "pairs.jsonl"]
    assert run(args + ["one.jsonl"]).exit_code == 0
    result = run(args + ["two.jsonl", "--devices", "cpu:2"])
    assert result.exit_code == 0, result.output
    assert "(6 scored, 0 failed" in result.stderr and "on 2 CPU workers" in result.stderr
    assert (here / "two.jsonl").read_bytes() == (here / "one.jsonl").read_bytes()


def test_a_stream_scored_against_a_file_of_more_lines_is_refused_at_its_end(here):
    rows = sample_pairs(3)
    (here / "fr.txt").write_text("".join(r["translation"] + "\n" for r in rows), encoding="utf-8")
    text = "".join(r["text"] + "\n" for r in rows[:2])
    result = run(["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "-", "--target-file", "fr.txt"], input=text)
    assert result.exit_code == 1
    assert result.stderr.endswith("Error: fr.txt has more lines than <stdin>: the translations to score go a line each, "
                                  "the line of the text's own number.\n")
    result = run(["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "-", "--target-file", "fr.txt", "--on-error",
                  "skip"], input=text + rows[2]["text"] + "\n" + "One line more.\n")
    assert result.exit_code == 3
    assert "<stdin>:4: fr.txt has no line 4 to score as its translation." in result.stderr


def test_a_score_job_flags_the_pairs_not_to_trust(here):
    """The row flags on given translations: a copy, another language, a cut, all unlikely; --on-flag record lists
    them in --errors."""
    text = "They will find twelve yellow umbrellas on the third of November."
    translations = ["Ils trouveront douze parapluies jaunes le trois novembre.", text,
                    "Sie werden am dritten November zwölf gelbe Regenschirme finden.", "Ils trouveront."]
    write_jsonl(here / "pairs.jsonl", [{"text": text, "translation": t} for t in translations])
    result = run(["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "--flags", "copy,wrong_language,length_ratio,"
                  "low_score", "--min-score", "-0.5", "--status-field", "status", "--on-flag", "record", "--errors",
                  "flagged.jsonl", "pairs.jsonl", "scored.jsonl"])
    assert result.exit_code == 0, result.output
    assert [row["status"] for row in read_jsonl(here / "scored.jsonl")] == [
        "ok", "wrong_language,low_score,copy", "wrong_language,low_score", "length_ratio,low_score"]
    assert [row["row"] for row in read_jsonl(here / "flagged.jsonl")] == [2, 3, 4]
    assert "(4 scored, 0 failed, 3 flagged:" in result.stderr


def test_score_table_gives_the_commands_parquet_rows(here):
    import pyarrow as pa

    import nllbcli

    rows = sample_pairs(4)
    rows[2]["translation"] = None
    write_jsonl(here / "pairs.jsonl", rows)
    result = run(["score", "-m", SAMPLE, "--src", "en", "--tgt", "fr", "--token-scores", "--on-error", "skip",
                  "--status-field", "status", "pairs.jsonl", "scored.parquet"])
    assert result.exit_code == 3, result.output
    model = nllbcli.load(SAMPLE, device="cpu")
    table = nllbcli.score_table(model, pa.Table.from_pylist(rows), "en", "fr", token_scores_field="token_scores",
                                status_field="status", on_error="skip")
    assert table.to_pylist() == pq.read_table(here / "scored.parquet").to_pylist()
    kept = nllbcli.score_table(model, pa.Table.from_pylist(rows), "en", "fr")  # failed rows kept, with their reason
    assert kept.column_names == ["id", "text", "translation", "score", "log_prob", "error"]
    assert kept.column("error").to_pylist() == [None, None, "the table: row 3: field 'translation' is null, not a "
                                                            "translation to score.", None]


@pytest.mark.parametrize("per_pass", [1, 7, 12, 1000])
def test_forced_passes_feed_and_score_what_the_step_loop_does(per_pass):
    """The GPU's one-pass forced decoding lays the batch out by numerics.forced_passes: each row fed [start, its
    language, its pieces], in passes of at most per_pass tokens (a longer row alone), each token attending to its
    row's tokens up to itself and scoring the next given piece (then </s>), as search.stepped_log_probs does."""
    import numpy as np

    from nllbcli.model.engine.numerics import forced_passes

    targets = [[5, 6, 7], [], [8], [9, 10, 11, 12, 13], [1, 14]]  # 1: the pad id, positioned as a step would
    lengths = np.array([len(t) + 1 for t in targets])
    given = np.full((len(targets), lengths.max()), 2)
    for row, target in enumerate(targets):
        given[row, : len(target)] = target
    langs = np.array([100, 101, 100, 102, 103])
    seen, fed_rows = [], {}
    for part in forced_passes(given, lengths, langs, 2, 1, per_pass):
        assert len(part.fed) <= per_pass or len(part.rows) == 1
        seen += part.rows.tolist()
        for n, row in enumerate(part.rows):
            mine = np.flatnonzero(part.row_of == n)
            assert (part.key_start[mine] == mine[0]).all()
            assert (part.self_len[mine] == np.arange(1, len(mine) + 1)).all()
            fed_rows[row] = (part.fed[mine].tolist(), part.pos[mine].tolist())
        at_row = part.rows[part.row_of[part.scored]]
        for row in set(at_row.tolist()):
            assert part.scored_t[at_row == row].tolist() == list(range(lengths[row]))
            assert given[row, part.scored_t[at_row == row]].tolist() == targets[row] + [2]
    assert seen == list(range(len(targets)))
    for row, target in enumerate(targets):
        fed = [2, langs[row]] + target
        assert fed_rows[row][0] == fed
        assert fed_rows[row][1] == [1 if token == 1 else t + 2 for t, token in enumerate(fed)]
