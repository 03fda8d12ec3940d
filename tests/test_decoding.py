"""The decoding controls against transformers' `generate` (tests/golden/decoding.json,
tools/make_decoding_goldens.py): each sentence's hypotheses (--num-hypotheses), their scores (--scores),
min_new_tokens (--min-length) and a length limit per sentence (--max-length-a/b), on tiny-a and the sample
model, with the CPU engine."""

import json
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from nllbcli.model.engine.numerics import sentence_keys
from nllbcli.options import DecodeOptions
from nllbcli.model.search import generate
from nllbcli.model.translator import load_translator

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"tiny-a": ROOT / "tests" / "models" / "tiny-a", "sample": ROOT / "data" / "samples" / "model"}
CASES = json.loads((ROOT / "tests" / "golden" / "decoding.json").read_text(encoding="utf-8"))["cases"]
# The sample model's scores within 1e-4 (measured: 1.6e-5 at most). tiny-a's random weights (std 0.5) give logits
# of a few hundred, where one float32 ulp is 3e-5 and NumPy's and PyTorch's sums of a dozen log-probs part by
# up to 3e-4.
SCORE_TOLERANCE = {"sample": 1e-4, "tiny-a": 1e-3}


@lru_cache(maxsize=None)
def translator(name):
    return load_translator(str(MODELS[name]), "cpu")


def case_id(case):
    return (f"{case['model']}-" + ",".join(f"{k}={v}" for k, v in case["settings"].items() if k != "scores")
            + ("-prefixes" if case.get("prefixes") else ""))


def hypotheses_of(case):
    tr = translator(case["model"])
    options = DecodeOptions(**case["settings"])
    return generate(tr.engine, case["input_ids"], tr.tokenizer.lang_id(case["tgt_lang"]), tr.config, options,
                    prefixes=case.get("prefixes")), options


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_hypotheses_and_scores_match_transformers(case):
    got, options = hypotheses_of(case)
    assert [[h.ids for h in hs] for hs in got] == [[h["ids"] for h in hs] for hs in case["hypotheses"]]
    # greedy scores under min_length: transformers renormalises over the tokens left; nllb's are the model's
    if options.scores and not (options.beam_size == 1 and options.min_length):
        for hs, want in zip(got, case["hypotheses"]):
            tolerance = SCORE_TOLERANCE[case["model"]]
            assert np.allclose([h.log_prob for h in hs], [w["log_prob"] for w in want], atol=tolerance, rtol=0)
            assert np.allclose([h.score for h in hs], [w["score"] for w in want], atol=tolerance, rtol=0)


def test_the_cases_exercise_what_they_test():
    """The goldens are not vacuous: min_length and the limits change outputs, n-best lists differ within."""
    limited = [c for c in CASES if "max_length_a" in c["settings"]]
    assert any(len(h[0]["ids"]) + 2 < c["settings"]["max_length"] for c in limited for h in c["hypotheses"])
    short = min(len(hs[0]["ids"]) for c in CASES if not c["settings"].get("min_length") for hs in c["hypotheses"])
    assert short + 2 < max(c["settings"].get("min_length", 0) for c in CASES)
    assert any(len({tuple(h["ids"]) for h in hs}) == len(hs) > 1 for c in CASES for hs in c["hypotheses"])
    prefixed = [c for c in CASES if c.get("prefixes")]
    assert prefixed and all(h["ids"][: len(p)] == p for c in prefixed for p, hs in zip(c["prefixes"], c["hypotheses"])
                            for h in hs)
    assert any(len(p) > 1 for c in prefixed for p in c["prefixes"]) and any(not p for c in prefixed for p in c["prefixes"])


@pytest.mark.parametrize("beam_size", [1, 4])
def test_min_length_keeps_eos_away(beam_size):
    tr = translator("sample")
    sources = [tr.tokenizer.encode(t, "eng_Latn") for t in ["Yes.", "Hello!", "The meeting is on the twentieth."]]
    options = DecodeOptions(beam_size=beam_size, max_length=30, min_length=14, num_hypotheses=beam_size)
    for hypotheses in tr.generate_hypotheses(sources, "fra_Latn", options):
        for h in hypotheses:
            assert len(h.ids) + 1 >= 14  # the language token and the ids before </s>


@pytest.mark.parametrize("topk", [1, 0, 5])
def test_a_logits_processor_that_bans_nothing_changes_no_score_under_min_length(topk):
    """--min-length's log-probabilities are the model's before </s> is banned, with or without another processor:
    an n-gram ban longer than any output (it bans nothing) leaves tokens and scores as they were (greedy search,
    and draws over the whole vocabulary or the top 5)."""
    tr = translator("sample")
    sources = [tr.tokenizer.encode(t, "eng_Latn") for t in ["Yes.", "Hello!", "The meeting is on the twentieth."]]
    options = DecodeOptions(beam_size=1, max_length=30, min_length=14, scores=True, sampling_topk=topk)
    keys = sentence_keys(3, np.arange(len(sources)), np.zeros(len(sources)))
    plain = tr.generate_hypotheses(sources, "fra_Latn", options, keys)
    banning_nothing = tr.generate_hypotheses(sources, "fra_Latn", replace(options, no_repeat_ngram_size=30), keys)
    assert [h.ids for hs in banning_nothing for h in hs] == [h.ids for hs in plain for h in hs]
    assert np.allclose([h.log_prob for hs in banning_nothing for h in hs], [h.log_prob for hs in plain for h in hs],
                       atol=1e-5, rtol=0)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_limit_per_sentence_is_its_length_alone(beam_size):
    """With --max-length-a/b a batch's sentences stop at their own limits, as each alone with that max_length."""
    tr = translator("sample")
    texts = ["Yes.", "We will meet at the station at seven o'clock in the evening, not at eight.", "Hello!"]
    sources = [tr.tokenizer.encode(t, "eng_Latn") for t in texts]
    options = DecodeOptions(beam_size=beam_size, max_length=40, max_length_a=0.5, max_length_b=1, scores=True)
    together = tr.generate_hypotheses(sources, "fra_Latn", options)
    for source, hypotheses in zip(sources, together):
        alone = tr.generate_hypotheses([source], "fra_Latn", replace(options, max_length_a=None, max_length_b=None,
                                                                     max_length=options.length_limit(len(source))))
        assert [(h.ids, h.log_prob) for h in hypotheses] == [(h.ids, h.log_prob) for h in alone[0]]
        assert len(hypotheses[0].ids) + 1 <= options.length_limit(len(source))


def test_length_limit():
    assert DecodeOptions(max_length=200).length_limit(10) == 200
    assert DecodeOptions(max_length=200, max_length_a=1.5, max_length_b=4).length_limit(10) == 19
    assert DecodeOptions(max_length=12, max_length_a=1.5, max_length_b=4).length_limit(10) == 12
    assert DecodeOptions(max_length=200, max_length_b=7).length_limit(100) == 7
    assert DecodeOptions(max_length=200, max_length_a=0.0, max_length_b=0).length_limit(10) == 1


def test_a_sentence_limited_to_the_language_token_has_an_empty_translation():
    tr = translator("tiny-a")
    options = DecodeOptions(beam_size=2, max_length=20, max_length_a=0.0, max_length_b=1, num_hypotheses=2)
    assert tr.generate_hypotheses([tr.tokenizer.encode("Hello!", "eng_Latn")], "fra_Latn", options)[0] == \
        [generate.__globals__["Hypothesis"]([], 0.0, 0.0)] * 2


@pytest.mark.parametrize("bad,message", [
    ({"beam_size": 2, "num_hypotheses": 3}, "1 to the beam size"),
    ({"min_length": -1}, "min_length must be from 0"),
    ({"max_length_a": -0.5}, "max_length_a must be from 0"),
])
def test_bad_decoding_options_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        DecodeOptions(**bad)
