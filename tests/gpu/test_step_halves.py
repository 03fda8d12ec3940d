"""A decoder step in two halves on two streams (CudaEngine.step_halves, its GEMMs on fewer SMs: gemm_sms), side by
side or staggered (taking turns at the products: CudaEngine.take_turns), gives every row the bits of the step in one
piece: the same ids, log-probabilities and scores, with graphs and without.

    python -m pytest -q -m gpu tests/gpu/test_step_halves.py      # on a GPU machine; skipped elsewhere
"""

import dataclasses
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from nllbcli.model.engine import kernels, numerics  # noqa: E402
from nllbcli.model.engine.cuda import CudaEngine  # noqa: E402
from nllbcli.model.engine.numerics import HALVES, STAGGERED, WHOLE, sentence_keys  # noqa: E402
from nllbcli.model.search import generate  # noqa: E402
from nllbcli.model.shapes import model_config, random_weights  # noqa: E402
from nllbcli.model.translator import load_translator  # noqa: E402
from nllbcli.options import DecodeOptions  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"

SEARCHES = {  # greedy with its scores, beam 4 with two hypotheses, draws over the whole vocabulary with their scores
    "greedy": DecodeOptions(beam_size=1, scores=True),
    "beam4": DecodeOptions(beam_size=4, num_hypotheses=2),
    "sampling": DecodeOptions(beam_size=1, sampling_topk=0, seed=1, scores=True),
}


MODES = pytest.mark.parametrize("mode", [HALVES, STAGGERED], ids=["halves", "staggered"])


def results(engine: CudaEngine, sources: list[list[int]], lang: int, options: DecodeOptions,
            mode: int, sms: int | None = None) -> list[tuple]:
    """Every hypothesis of every source as (ids, log-probability, score), the step in one piece (WHOLE) or in
    halves of that mode."""
    engine.step_halves, engine.gemm_sms = mode, sms
    engine.capacity(options.max_length, options.rows_per_sentence, len(sources), sum(map(len, sources)))
    keys = sentence_keys(options.seed, np.arange(len(sources)), np.zeros(len(sources))) if options.sampling else None
    found = generate(engine, sources, lang, engine.config, options, keys)
    return [(h.ids, h.log_prob, h.score) for hypotheses in found for h in hypotheses]


def record_halves(engine: CudaEngine, monkeypatch) -> list[tuple[int, int] | str]:
    """The row ranges each step's layers run over from now on (lo, hi), as the engine launches them, and a
    "turns" for each step whose halves took turns (take_turns)."""
    ranges, row_phases, take_turns = [], engine.row_phases, engine.take_turns

    def recorded(ws, lo, hi, *args):
        ranges.append((lo, hi))
        return row_phases(ws, lo, hi, *args)

    def turns(*args):
        ranges.append("turns")
        return take_turns(*args)

    monkeypatch.setattr(engine, "row_phases", recorded)
    monkeypatch.setattr(engine, "take_turns", turns)
    return ranges


def check_halves(engine: CudaEngine, ranges: list, mode: int) -> None:
    """The steps ran in halves of that mode, every step's graph captured."""
    assert any(r != "turns" and r[0] > 0 for r in ranges), ranges
    assert ("turns" in ranges) == (mode == STAGGERED)
    assert engine.capture_error is None, engine.capture_error


# ------------------------------------------------------------------------------------------------ the sample model


@lru_cache(maxsize=None)
def sample_translator():
    return load_translator(str(SAMPLE), "cuda")


@MODES
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "launches"])
@pytest.mark.parametrize("search", list(SEARCHES))
def test_halved_steps_of_the_sample_model_give_the_same_bits(search, graphs, mode, monkeypatch):
    """Every step of 150 held-out sentences in halves (a half at every 16 rows, whatever the rows: each bucket
    of the graphs, and the live rows alone without them), the GEMMs on half the SMs."""
    monkeypatch.setattr(numerics, "HALVES_MIN_ROWS", 2)
    monkeypatch.setattr(numerics, "HALF_ROWS", 16)
    tr = sample_translator()
    engine, options = tr.engine, dataclasses.replace(SEARCHES[search], max_length=48)
    engine.use_graphs = graphs
    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()[:150]
    sources = [tr.tokenizer.encode(t, "eng_Latn") for t in texts]
    lang = tr.tokenizer.lang_id("fra_Latn")
    try:
        whole = results(engine, sources, lang, options, WHOLE)
        ranges = record_halves(engine, monkeypatch)
        halved = results(engine, sources, lang, options, mode, sms=kernels.multiprocessors() // 2)
        again = results(engine, sources, lang, options, mode, sms=kernels.multiprocessors() // 2)
    finally:
        engine.use_graphs, engine.step_halves, engine.gemm_sms = True, WHOLE, None
    check_halves(engine, ranges, mode)
    assert halved == whole
    assert again == whole  # (with graphs: now replayed from the captured ones)


# ------------------------------------------------------------------------------------------------ many rows

LANG = 32000  # any id serves as a language token here


@lru_cache(maxsize=None)
def random_engine(float8: bool = False) -> CudaEngine:
    """Two layers of head size 64, a vocabulary of 32,768 whose last id is </s> (random weights never pick it, so
    every row runs every step), an output projection of its own (tied, the token fed would dominate each row);
    float8: its matrices in FP8 (--compute-type float8), each product's input quantized into the step's arrays."""
    config = model_config(vocab_size=32768, d_model=512, layers=2, ffn=2048, heads=8)
    config = dataclasses.replace(config, eos_token_id=config.vocab_size - 1)
    weights = random_weights(config, seed=11, scale=0.1, embed_scale=0.05, tied=False)
    return CudaEngine(config, weights, float8=float8)


@MODES
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "launches"])
@pytest.mark.parametrize("search,sentences,float8", [("greedy", 1100, False), ("beam4", 300, False),
                                                     ("sampling", 1100, False), ("greedy", 1100, True)],
                         ids=["greedy", "beam4", "sampling", "greedy-fp8"])
def test_halved_steps_of_many_rows_give_the_same_bits(search, sentences, float8, graphs, mode, monkeypatch):
    """Steps of 1,100 and 1,200 rows, where the engine's own halves start (numerics.HALVES_MIN_ROWS): with
    graphs, buckets of 1,152 rows (halves of 640 and 512) and 1,280 (640 and 640); the GEMMs on every SM, then
    on 16 fewer."""
    engine = random_engine(float8)
    engine.use_graphs = graphs
    rng = np.random.default_rng(sentences)
    sources = [[LANG] + rng.integers(4, 30000, n).tolist() + [2] for n in rng.integers(5, 40, sentences)]
    options = dataclasses.replace(SEARCHES[search], max_length=10)
    try:
        whole = results(engine, sources, LANG + 1, options, WHOLE)
        ranges = record_halves(engine, monkeypatch)
        halved = results(engine, sources, LANG + 1, options, mode)
        capped = results(engine, sources, LANG + 1, options, mode, sms=kernels.multiprocessors() - 16)
    finally:
        engine.use_graphs, engine.step_halves, engine.gemm_sms = True, WHOLE, None
    assert len({tuple(ids) for ids, _, _ in whole}) >= 100  # the outputs depend on the source
    check_halves(engine, ranges, mode)
    assert all(lo % numerics.HALF_ROWS == 0 for lo, _ in (r for r in ranges if r != "turns"))
    assert halved == whole
    assert capped == whole
