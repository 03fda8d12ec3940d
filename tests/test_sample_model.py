"""The trained sample model (data/samples/model) on the CPU: real translations, and transformers' exact output."""

import itertools
import json
from functools import lru_cache
from pathlib import Path

import pytest

from nllbcli.options import DecodeOptions
from nllbcli.translator import load_translator

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"
LANGS = ["eng_Latn", "fra_Latn", "deu_Latn", "spa_Latn", "ita_Latn"]
FIRST = 20  # held-out sentences checked per direction


@lru_cache(maxsize=None)
def translator():
    return load_translator(str(MODEL), "cpu")


@lru_cache(maxsize=None)
def heldout(lang):
    return (HELDOUT / f"{lang}.txt").read_text(encoding="utf-8").splitlines()


@lru_cache(maxsize=None)
def golden():
    return json.loads((ROOT / "tests" / "golden" / "sample.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("src,tgt", list(itertools.permutations(LANGS, 2)))
def test_greedy_translates_held_out_sentences_exactly(src, tgt):
    """Sentences training never saw come out as the reference translation, in all 20 directions."""
    got = translator().translate(heldout(src)[:FIRST], src, tgt, DecodeOptions(beam_size=1, max_length=64))
    assert got == heldout(tgt)[:FIRST]


@pytest.mark.parametrize("src,tgt", [("eng_Latn", "deu_Latn"), ("ita_Latn", "fra_Latn"), ("deu_Latn", "spa_Latn")])
def test_beam_search_translates_held_out_sentences_exactly(src, tgt):
    got = translator().translate(heldout(src)[:FIRST], src, tgt, DecodeOptions(beam_size=4, max_length=64))
    assert got == heldout(tgt)[:FIRST]


def test_examples_a_reader_can_check():
    tr = translator()
    greedy = DecodeOptions(beam_size=1, max_length=64)
    assert tr.translate(["My uncle went to Rome on Friday."], "eng_Latn", "fra_Latn", greedy) == ["Mon oncle est allé à Rome vendredi."]
    assert tr.translate(["The green bicycle costs forty-five euros."], "eng_Latn", "deu_Latn", greedy) == \
        ["Das grüne Fahrrad kostet fünfundvierzig Euro."]


@pytest.mark.parametrize("index", range(len(golden()["generate"])), ids=lambda i: f"case{i}")
def test_reference_model_matches_transformers_on_the_sample_model(index):
    case = golden()["generate"][index]
    tr = translator()
    sources = [tr.tokenizer.encode(t, case["src_lang"]) for t in case["texts"]]
    options = DecodeOptions(beam_size=case["beam_size"], max_length=case["max_length"])
    outputs = tr.generate(sources, case["tgt_lang"], options)
    assert outputs == case["output_ids"]
    assert [tr.tokenizer.decode(o) for o in outputs] == case["output_texts"]


@pytest.mark.parametrize("on_error", ["skip", "fail"])
def test_tokenizing_in_a_process_of_its_own_gives_the_same_job(tmp_path, monkeypatch, on_error):
    """NLLB_READER=process (the chunks after the first tokenized and planned in a process of its own): the same
    output file, row for row, as the reader thread, with rows naming their own languages, a row that is not
    JSON and (with --on-error fail) a row naming a language the model lacks, whose error stops the job the
    same way in either mode."""
    from click.testing import CliRunner

    from nllbcli import pipeline
    from nllbcli.cli import cli

    rows = [{"text": t} for t in heldout("eng_Latn")[:7]]
    rows[2]["tgt_lang"] = "deu_Latn"
    rows[4] = {"text": heldout("fra_Latn")[4], "src_lang": "fra_Latn", "tgt_lang": "ita_Latn"}
    lines = [json.dumps(row) for row in rows]
    if on_error == "skip":
        lines.insert(5, "{not json")
    else:  # the error comes from the process's chunk
        lines.insert(5, json.dumps({"text": "Hello.", "tgt_lang": "xxx_Latn"}))
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    results, sent = {}, []
    call = pipeline.ProcessPrepare.__call__

    def counted(self, chunk):
        sent.append(self.first is None)  # a chunk for the process (the first is prepared here)
        return call(self, chunk)

    monkeypatch.setattr(pipeline.ProcessPrepare, "__call__", counted)
    for reader in ("thread", "process"):
        monkeypatch.setattr(pipeline, "READER", reader)
        out = tmp_path / f"{reader}.jsonl"
        result = CliRunner().invoke(cli, ["translate", "-q", "--model", str(MODEL), "--device", "cpu", "--src", "eng_Latn",
                                          "--tgt", "fra_Latn", "--chunk-rows", "3", "--max-length", "24",
                                          "--on-error", on_error, str(tmp_path / "in.jsonl"), str(out)])
        results[reader] = (result.exit_code, result.output, out.read_text(encoding="utf-8") if out.exists() else None)
    assert results["process"] == results["thread"]
    assert sent.count(True) >= 1  # chunks went through the process
    if on_error == "skip":
        assert results["thread"][0] == 3 and len(results["thread"][2].splitlines()) == 7  # 3: rows were skipped
    else:
        assert results["thread"][0] != 0 and results["thread"][2] is None and "in.jsonl:6" in results["thread"][1]
