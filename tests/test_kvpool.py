"""How large the GPU engine's KV pool is made (model/engine/kvpool.py's planning, which needs no GPU), and the batch the
Translator asks it for: its sentences, the tokens they can reach under the length rules, its distinct sources'
tokens. (tests/gpu/test_engine.py checks the engine keeps, grows and splits the pool as planned.)"""

from dataclasses import replace
from pathlib import Path

import pytest

from nllbcli.model.checkpoint import read_config
from nllbcli.model.engine.kvpool import PoolPlan, activation_bytes, plan_for_job, plan_pool, rounded_up, row_bytes
from nllbcli.options import DecodeOptions
from nllbcli.model.shapes import PRESETS
from nllbcli.model.translator import load_translator

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "samples" / "model"
L, D = 24, 2048  # NLLB-200 3.3B's decoder
GIB = 1 << 30


def test_rounding_up_adds_at_most_an_eighth():
    for n in list(range(1, 300)) + [4095, 4096, 4097, 143_360, 246_001]:
        r = rounded_up(n)
        assert n <= r <= n + n // 8 + 1 and rounded_up(r) == r
    assert [rounded_up(n) for n in (16, 17, 31, 33, 4097)] == [16, 18, 32, 36, 4608]


def test_a_batch_that_fits_gets_a_pool_of_its_size():
    need = PoolPlan(slots=2048, cache_rows=41, cross_rows=2048 * 35)
    plan = plan_for_job(L, D, need, 80 * GIB, None, 1, 1026)
    assert plan.covers(need) and plan.cache_rows == 41
    assert plan.nbytes(L, D) <= need.nbytes(L, D) * 9 // 8 + row_bytes(L, D) * 41  # rounded up by an eighth at most
    assert plan.nbytes(L, D) == ((plan.slots + 1) * 41 + plan.cross_rows + 1) * L * 2 * D * 2


def test_a_pool_grows_to_cover_the_batch_and_the_pool_before():
    before = PoolPlan(slots=4096, cache_rows=41, cross_rows=100_000)
    need = PoolPlan(slots=1024, cache_rows=61, cross_rows=150_000)
    plan = plan_for_job(L, D, need, 80 * GIB, before, 1, 1026)
    assert plan.covers(need) and plan.covers(before)


def test_where_the_grown_pool_does_not_fit_the_batch_alone_does():
    before = PoolPlan(slots=8192, cache_rows=201, cross_rows=10_000)
    need = PoolPlan(slots=1024, cache_rows=41, cross_rows=40_000)
    budget = need.nbytes(L, D) + GIB  # far from the 8,192 slots of 201 rows before
    assert plan_for_job(L, D, need, budget, before, 1, 1026) == need


@pytest.mark.parametrize("beams", [1, 4])
def test_a_batch_larger_than_the_memory_gets_what_fits_in_its_proportions(beams):
    need = PoolPlan(slots=4096 * beams, cache_rows=201, cross_rows=4096 * 50)
    budget = need.nbytes(L, D) // 3
    plan = plan_for_job(L, D, need, budget, None, beams, 1026)
    assert plan.nbytes(L, D) <= budget and plan.cache_rows == 201 and plan.slots % beams == 0
    assert plan.slots / need.slots == pytest.approx(1 / 3, rel=0.01)
    assert plan.cross_rows / need.cross_rows == pytest.approx(1 / 3, rel=0.01)
    tiny = plan_for_job(L, D, need, 0, None, beams, 1026)  # no memory at all: no slot (the Translator says so)
    assert tiny.slots == 0 and tiny.cross_rows == 1026


def test_a_job_of_unknown_size_splits_the_budget_by_beams():
    for beams in (1, 4):
        plan = plan_pool(L, D, 201, 40 * GIB, 1026, beams)
        slot_bytes = plan.slots * 201 * row_bytes(L, D)
        cross_bytes = plan.cross_rows * row_bytes(L, D)
        assert slot_bytes + cross_bytes <= 40 * GIB
        assert cross_bytes / (slot_bytes + cross_bytes) == pytest.approx(1 / (1 + beams), rel=0.01)


def test_the_activations_bound_grows_with_the_batch():
    config = PRESETS["nllb-200-3.3B"].config
    encoder = activation_bytes(config, 1, 100_000, 41)
    assert encoder == 100_000 * (4 * D + 2 * 5 * D + 2 * 8192)  # the FFN's hidden layer the largest part
    decoder = activation_bytes(config, 16_384, 1, 201)
    assert decoder > 16_384 * config.vocab_size  # the output projection's partial results, a byte a column or more
    assert activation_bytes(config, 16_384, 100_000, 201) == max(encoder, decoder)


class Recording:
    """The sample model's CPU engine, recording what the Translator asks of capacity()."""

    def __init__(self, inner, rows=1 << 30, source_rows=1 << 30):
        self.inner, self.asked, self.rows, self.source_rows = inner, [], rows, source_rows

    def capacity(self, max_length, beams=1, sentences=None, source_tokens=None):
        self.asked.append((max_length, beams, sentences, source_tokens))
        return self.rows, self.source_rows

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def sample():
    return load_translator(str(SAMPLE), "cpu")


def test_the_translator_asks_for_the_batch_it_has(sample):
    engine = Recording(sample.engine)
    translator = replace(sample, engine=engine)
    a, b = sample.tokenizer.encode("Hello there.", "eng_Latn"), sample.tokenizer.encode("A longer sentence, this one.", "eng_Latn")
    translator.generate([a, a, b], ["fra_Latn", "deu_Latn", "fra_Latn"], DecodeOptions(beam_size=4, max_length=30))
    # a source's copies side by side (several targets) share their cross rows
    assert engine.asked == [(30, 4, 3, len(a) + len(b))]
    engine.asked.clear()
    translator.generate([a, b], "fra_Latn", DecodeOptions(beam_size=1, max_length=30, max_length_a=1.0, max_length_b=2))
    assert engine.asked == [(len(b) + 2, 1, 2, len(a) + len(b))]  # the longest a sentence can reach, not max_length
    engine.asked.clear()
    translator.generate([a, b], "fra_Latn", DecodeOptions(beam_size=1, max_length=30, num_hypotheses=3, sampling_topk=0, seed=1))
    assert engine.asked == [(30, 3, 2, len(a) + len(b))]


def test_the_translator_goes_in_parts_where_the_pool_falls_short(sample):
    engine = Recording(sample.engine, rows=2)
    translator = replace(sample, engine=engine)
    sources = [sample.tokenizer.encode(t, "eng_Latn") for t in ("Yes.", "No.", "Hello there.", "Good night.", "Thanks.")]
    options = DecodeOptions(beam_size=1, max_length=12)
    assert translator.generate(sources, "fra_Latn", options) == sample.generate(sources, "fra_Latn", options)


def test_info_counts_the_pool_rows_as_the_engine_does():
    from nllbcli.model.info import inspect_model

    config = read_config(SAMPLE)
    info = inspect_model(str(SAMPLE))
    assert info.cross_bytes_per_source_token == row_bytes(config.decoder_layers, config.d_model)
    assert info.kv_bytes_per_sequence == (info.max_length + 1) * row_bytes(config.decoder_layers, config.d_model)
