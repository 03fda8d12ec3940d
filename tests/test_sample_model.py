"""The trained sample model (data/samples/model) on the CPU: real translations, and transformers' exact output."""

import itertools
import json
from functools import lru_cache
from pathlib import Path

import pytest

from nllbcli.options import DecodeOptions
from nllbcli.model.translator import load_translator

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
    got = translator().translate_sentences(heldout(src)[:FIRST], src, tgt, DecodeOptions(beam_size=1, max_length=64))
    assert got == heldout(tgt)[:FIRST]


@pytest.mark.parametrize("src,tgt", [("eng_Latn", "deu_Latn"), ("ita_Latn", "fra_Latn"), ("deu_Latn", "spa_Latn")])
def test_beam_search_translates_held_out_sentences_exactly(src, tgt):
    got = translator().translate_sentences(heldout(src)[:FIRST], src, tgt, DecodeOptions(beam_size=4, max_length=64))
    assert got == heldout(tgt)[:FIRST]


def test_examples_a_reader_can_check():
    tr = translator()
    greedy = DecodeOptions(beam_size=1, max_length=64)
    assert tr.translate_sentences(["My uncle went to Rome on Friday."], "eng_Latn", "fra_Latn", greedy) == ["Mon oncle est allé à Rome vendredi."]
    assert tr.translate_sentences(["The green bicycle costs forty-five euros."], "eng_Latn", "deu_Latn", greedy) == \
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

