"""Greedy and beam search on the reference engine against transformers' `generate` (goldens kept in the repo)."""

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nllbcli.options import DecodeOptions
from nllbcli.model.engine import OnHost, reference
from nllbcli.model.engine.numerics import sentence_keys
from nllbcli.model.search import generate, generate_ids
from nllbcli.model.translator import load_translator

from test_decoding import translator as decoding_translator

HERE = Path(__file__).parent
MODELS = ("tiny-a", "tiny-b")


@lru_cache(maxsize=None)
def translator(name):
    return load_translator(str(HERE / "models" / name), "cpu")


@lru_cache(maxsize=None)
def golden(name):
    return json.loads((HERE / "golden" / f"{name}.json").read_text(encoding="utf-8"))


def cases():
    for name in MODELS:
        for i, case in enumerate(golden(name)["generate"]):
            label = f"{name}-{case['src_lang']}-{case['tgt_lang']}-beam{case['beam_size']}-lp{case['length_penalty']}-max{case['max_length']}"
            yield pytest.param(name, i, id=label)


@pytest.mark.parametrize("name,index", list(cases()))
def test_generate_matches_transformers(name, index):
    case = golden(name)["generate"][index]
    tr = translator(name)
    sources = [tr.tokenizer.encode(text, case["src_lang"]) for text in case["texts"]]
    assert sources == case["input_ids"]
    options = DecodeOptions(beam_size=case["beam_size"], max_length=case["max_length"], length_penalty=case["length_penalty"])
    outputs = tr.generate(sources, case["tgt_lang"], options)
    assert outputs == case["output_ids"]
    assert [tr.tokenizer.decode(o) for o in outputs] == case["output_texts"]


def test_goldens_cover_both_endings():
    """The goldens must test sentences that end with </s> and sentences cut at max_length, in both searches."""
    for beam in (1, 4):
        lengths = [
            len(out)
            for name in MODELS
            for case in golden(name)["generate"]
            if case["beam_size"] == beam and case["max_length"] > 5
            for out in case["output_ids"]
        ]
        longest = max(c["max_length"] for name in MODELS for c in golden(name)["generate"]) - 1
        assert any(n < longest for n in lengths) and any(n == longest for n in lengths)


@pytest.mark.parametrize("beam_size", [1, 3, 4])
def test_translation_does_not_depend_on_the_batch(beam_size):
    tr = translator("tiny-a")
    texts = [c["texts"] for c in golden("tiny-a")["generate"]][0]
    options = DecodeOptions(beam_size=beam_size, max_length=16)
    together = tr.translate_sentences(texts, "eng_Latn", "deu_Latn", options)
    alone = [tr.translate_sentences([t], "eng_Latn", "deu_Latn", options)[0] for t in texts]
    reversed_batch = tr.translate_sentences(texts[::-1], "eng_Latn", "deu_Latn", options)[::-1]
    assert together == alone == reversed_batch


# Sources of varied lengths (a word or two to two sentences) and the decodings the property below draws among
HELDOUT = (HERE.parent / "data" / "samples" / "heldout" / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()
BATCH_TEXTS = [HELDOUT[i] + " " + HELDOUT[i + 1] if i % 4 == 0 else " ".join(HELDOUT[i].split()[: 1 + i % 7])
               for i in range(16)]
DECODINGS = {
    "greedy": DecodeOptions(beam_size=1, max_length=12, scores=True),
    "beam": DecodeOptions(beam_size=4, max_length=12, scores=True, num_hypotheses=2),
    "sampling": DecodeOptions(beam_size=1, max_length=12, scores=True, sampling_topk=0, seed=7),
    "top-k": DecodeOptions(beam_size=1, max_length=12, scores=True, sampling_topk=5, seed=7),
    "processors": DecodeOptions(beam_size=3, max_length=12, scores=True, min_length=4, no_repeat_ngram_size=2,
                                repetition_penalty=1.3),
    "greedy-processors": DecodeOptions(beam_size=1, max_length=12, scores=True, min_length=4, repetition_penalty=1.3),
}


def decode_batch(model: str, decoding: str, batch: list[tuple[int, str]]) -> list[list[tuple]]:
    """Each (text, target) of the batch's hypotheses as (ids, log_prob, score), from one call of the search;
    sampling draws from each text's own stream (its index is its row)."""
    tr, options = decoding_translator(model), DECODINGS[decoding]
    sources = [tr.tokenizer.encode(BATCH_TEXTS[i], "eng_Latn") for i, _ in batch]
    langs = [tr.tokenizer.lang_id(tgt) for _, tgt in batch]
    keys = sentence_keys(options.seed, [i for i, _ in batch], np.zeros(len(batch))) if options.sampling else None
    return [[(h.ids, h.log_prob, h.score) for h in hypotheses]
            for hypotheses in generate(tr.engine, sources, langs, tr.config, options, keys)]


@lru_cache(maxsize=None)
def decoded_alone(model: str, decoding: str, text: int, tgt: str) -> list[tuple]:
    return decode_batch(model, decoding, [(text, tgt)])[0]


@settings(max_examples=36, deadline=None)
@given(model=st.sampled_from(["tiny-a", "sample"]), decoding=st.sampled_from(sorted(DECODINGS)),
       batch=st.lists(st.tuples(st.integers(0, len(BATCH_TEXTS) - 1), st.sampled_from(["fra_Latn", "deu_Latn"])),
                      min_size=1, max_size=8))
def test_a_sentences_tokens_and_scores_are_those_it_has_alone_in_any_batch(model, decoding, batch):
    """Bit for bit: the neighbours, their number, lengths (the padding they bring), order and targets, and the
    rows that end before it (greedy) change nothing of a sentence's hypotheses and scores."""
    got = decode_batch(model, decoding, batch)
    assert got == [decoded_alone(model, decoding, i, tgt) for i, tgt in batch]


@pytest.mark.parametrize("sharing", ["rows", "columns", "as the engine chooses"])
@pytest.mark.parametrize("decoding", sorted(DECODINGS))
def test_a_sentences_tokens_and_scores_do_not_depend_on_the_threads(monkeypatch, decoding, sharing):
    """Bit for bit at 1, 2 and 3 threads (--threads, a --devices worker's share of it, or the library's own),
    a step's rows shared out among the threads, or every product's output columns."""
    from threadpoolctl import threadpool_limits

    from nllbcli.model.engine.products import Products

    if sharing == "rows":
        monkeypatch.setattr(reference, "ROWS_A_THREAD", 1)
    elif sharing == "columns":
        monkeypatch.setattr(reference, "ROWS_A_THREAD", 1 << 30)
        monkeypatch.setattr(Products, "spread_work", 0)
    batch = [(i, "fra_Latn") for i in range(len(BATCH_TEXTS))]
    runs = []
    for threads in (1, 2, 3):
        with threadpool_limits(limits=threads, user_api="blas"):
            runs.append(decode_batch("sample", decoding, batch))
    assert runs[1:] == runs[:1] * 2


class AheadEngine:
    """The reference engine with step_argmax_ahead as the GPU engine has it: ids handed out for the next step
    at once, fetched later. Logs the order of queueing and fetching."""

    def __init__(self, engine):
        self.engine, self.log = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def step_argmax_ahead(self, encoded, state, tokens):
        step = state.length
        ids = self.engine.step_argmax(encoded, state, tokens)
        self.log.append(("queue", step, len(ids)))
        return Logged(ids, step, self.log)


class Logged(OnHost):
    def __init__(self, ids, step, log):
        super().__init__(ids)
        self.step, self.log = step, log

    def fetch(self):
        self.log.append(("fetch", self.step, len(self.device)))
        return self.device

    def subset(self, rows):
        return Logged(self.device[rows], self.step, self.log)


def test_greedy_queues_the_next_steps_before_it_looks_at_this_one():
    """Steps t + 1 .. t + AHEAD are queued before step t's ids are fetched, and the outputs are the goldens'
    (sentences that end early leave the batch AHEAD steps late)."""
    from nllbcli.model.search import AHEAD

    tr = translator("tiny-a")
    case = next(c for c in golden("tiny-a")["generate"] if c["beam_size"] == 1 and len(set(map(len, c["output_ids"]))) > 1)
    engine = AheadEngine(tr.engine)
    langs = [tr.tokenizer.lang_id(case["tgt_lang"])] * len(case["input_ids"])
    outputs = generate_ids(engine, case["input_ids"], langs, tr.config, DecodeOptions(beam_size=1, max_length=case["max_length"]))
    assert outputs == case["output_ids"]
    at = {(kind, step): i for i, (kind, step, _) in reversed(list(enumerate(engine.log)))}  # first occurrence
    fetched = sorted(step for kind, step in at if kind == "fetch")
    assert fetched == list(range(fetched[0], fetched[0] + len(fetched)))
    assert AHEAD >= 1
    for step in fetched:  # the next AHEAD steps (those there were) went in before this one came out
        for later in range(step + 1, step + AHEAD + 1):
            if ("queue", later) in at:
                assert at["queue", later] < at["fetch", step]
    assert ("queue", fetched[0] + AHEAD) in at
    assert len({n for _, _, n in engine.log}) > 1  # the batch shrank as sentences ended


def test_max_length_one_gives_only_the_language_token():
    tr = translator("tiny-b")
    for beam_size in (1, 4):
        assert tr.translate_sentences(["Hello!"], "eng_Latn", "fra_Latn", DecodeOptions(beam_size=beam_size, max_length=1)) == [""]


def test_generate_with_no_sources_returns_nothing():
    assert translator("tiny-a").generate([], "fra_Latn", DecodeOptions()) == []


@pytest.mark.parametrize("kwargs", [{"beam_size": 0}, {"max_length": 0}])
def test_decode_options_reject_impossible_values(kwargs):
    with pytest.raises(ValueError):
        DecodeOptions(**kwargs)


def processor_cases():
    for name in MODELS:
        for i, case in enumerate(golden(f"{name}-processors")["generate"]):
            label = f"{name}-{case['tgt_lang']}-beam{case['beam_size']}-rp{case['repetition_penalty']}-ngram{case['no_repeat_ngram_size']}"
            yield pytest.param(name, i, id=label)


def processor_options(case):
    return DecodeOptions(beam_size=case["beam_size"], max_length=case["max_length"],
                         repetition_penalty=case["repetition_penalty"], no_repeat_ngram_size=case["no_repeat_ngram_size"])


@pytest.mark.parametrize("name,index", list(processor_cases()))
def test_repetition_penalty_and_ngram_ban_match_transformers(name, index):
    case = golden(f"{name}-processors")["generate"][index]
    tr = translator(name)
    sources = [tr.tokenizer.encode(text, case["src_lang"]) for text in case["texts"]]
    assert sources == case["input_ids"]
    assert tr.generate(sources, case["tgt_lang"], processor_options(case)) == case["output_ids"]


def test_processor_goldens_change_the_output():
    """Each setting changes some output and every n-gram golden is free of repeated n-grams: the cases test something."""
    for name in MODELS:
        for case in golden(f"{name}-processors")["generate"]:
            tr = translator(name)
            plain = DecodeOptions(beam_size=case["beam_size"], max_length=case["max_length"])
            assert tr.generate(case["input_ids"], case["tgt_lang"], plain) != case["output_ids"]
            n = case["no_repeat_ngram_size"]
            for out in case["output_ids"]:
                if n:
                    seq = [2, tr.tokenizer.lang_id(case["tgt_lang"]), *out]
                    grams = [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]
                    assert len(grams) == len(set(grams))


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_greedy_gives_the_goldens_however_far_ahead_it_queues(ahead, monkeypatch):
    """NLLB_AHEAD (search.AHEAD) changes when the host looks at each step's ids, never the ids; with 0 nothing
    is queued ahead and each step is fed the ids the host fetched."""
    import nllbcli.model.search as search

    monkeypatch.setattr(search, "AHEAD", ahead)
    for name in MODELS:
        tr = translator(name)
        for case in golden(name)["generate"]:
            if case["beam_size"] == 1:
                langs = [tr.tokenizer.lang_id(case["tgt_lang"])] * len(case["input_ids"])
                options = DecodeOptions(beam_size=1, max_length=case["max_length"])
                assert generate_ids(AheadEngine(tr.engine), case["input_ids"], langs, tr.config, options) == case["output_ids"]


def test_a_source_twice_in_a_batch_is_encoded_once():
    """A sentence repeated in a batch (or one sentence into several target languages) goes through the encoder
    once; each copy is still translated as it is alone."""
    tr = translator("tiny-a")
    seen = []
    encode = tr.engine.encode

    class Counting:
        def __getattr__(self, name):
            return getattr(tr.engine, name)

        def encode(self, sources):
            seen.append([list(s) for s in sources])
            return encode(sources)

    a, b = (tr.tokenizer.encode(t, "eng_Latn") for t in ("Hello!", "The quick brown fox."))
    fra, deu = tr.tokenizer.lang_id("fra_Latn"), tr.tokenizer.lang_id("deu_Latn")
    for beam_size in (1, 3):
        options = DecodeOptions(beam_size=beam_size, max_length=8)
        seen.clear()
        together = generate_ids(Counting(), [a, b, a, a], [fra, fra, deu, fra], tr.config, options)
        assert seen == [[a, b]]
        assert together == [generate_ids(tr.engine, [s], lang, tr.config, options)[0]
                            for s, lang in ((a, fra), (b, fra), (a, deu), (a, fra))]
