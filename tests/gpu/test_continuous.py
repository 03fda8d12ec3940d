"""Continuous batching on the GPU engine: search.greedy_continuous against static batches, and CudaEngine.join
(rows of two encodings at different positions in one step) against the states stepped apart."""

from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from nllbcli.options import DecodeOptions  # noqa: E402
from nllbcli.search import generate, greedy_continuous  # noqa: E402
from nllbcli.translator import load_translator  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODELS = {"tiny-b": ROOT / "tests" / "models" / "tiny-b", "sample": ROOT / "data" / "samples" / "model"}
HELDOUT = ROOT / "data" / "samples" / "heldout"


@lru_cache(maxsize=None)
def gpu(name):
    return load_translator(str(MODELS[name]), "cuda")


def heldout_sources(tr, count: int) -> list[list[int]]:
    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()[:count]
    return [tr.tokenizer.encode(t, "eng_Latn") for t in texts]


def assert_pool_free(engine) -> None:
    assert engine.pool.slots.available == engine.pool.plan.slots
    assert engine.pool.cross_runs.available == engine.pool.plan.cross_rows
    assert engine.bound is None


@pytest.mark.parametrize("live_rows", [8, 40])
@pytest.mark.parametrize("graphs", [True, False])
def test_continuous_batching_gives_the_static_batchs_ids(live_rows, graphs):
    """The 100 held-out sentences of the sample model, greedy, max_length 64: greedy_continuous with 8 or 40 rows
    alive (groups joining mid-way, rows at different positions and of different encodings in one step, CUDA
    graphs over buckets of rows on or off) gives the ids of one static batch, and leaves the pool as it found it."""
    tr = gpu("sample")
    engine = tr.engine
    sources = heldout_sources(tr, 100)
    lang = tr.tokenizer.lang_id("fra_Latn")
    options = DecodeOptions(beam_size=1, max_length=64)
    engine.capacity(options.max_length)
    engine.use_graphs = graphs
    try:
        static = generate(engine, sources, lang, tr.config, options)
        stats = {}
        continuous = greedy_continuous(engine, sources, lang, tr.config, options, live_rows, stats=stats)
        again = greedy_continuous(engine, sources, lang, tr.config, options, live_rows)  # graphs now replayed
    finally:
        engine.use_graphs = True
    assert continuous == static and again == static
    assert stats["joins"] >= 3 and stats["groups"] >= 4
    assert_pool_free(engine)
    if graphs:
        assert engine.ws.graphs, "the steps ran as CUDA graphs"


@pytest.mark.parametrize("name", list(MODELS))
def test_join_steps_as_the_states_apart(name):
    """Two rows four steps on, joined by 70 fresh rows of another encoding (more than the first state's workspace
    holds: it grows, its graphs captured again): every step's logits of the joined state are those of the two
    states stepped apart, to the bit (a row's numbers never depend on the rows beside it), before and after a
    select that drops a row of each; the pool free after."""
    tr = gpu(name)
    engine = tr.engine
    rng = np.random.default_rng(3)
    lang = tr.tokenizer.lang_id("eng_Latn")
    a_sources = [[lang] + rng.integers(4, 300, n).tolist() + [2] for n in (3, 17)]
    b_sources = [[lang] + rng.integers(4, 300, n).tolist() + [2] for n in rng.integers(1, 40, 70)]
    a_tokens = [np.full(2, 2)] + [rng.integers(4, 300, 2) for _ in range(9)]
    b_tokens = [np.full(70, 2)] + [rng.integers(4, 300, 70) for _ in range(5)]
    engine.capacity(20)

    def alone(sources, tokens, select_after: int, keep_after: np.ndarray) -> list[np.ndarray]:
        """Logits of each step of one state over `sources`, only rows `keep_after` after step `select_after`."""
        encoded = engine.encode(sources)
        state = engine.start(encoded, np.arange(len(sources)), 20)
        assert state.graphs
        logits, keep = [], np.arange(len(sources))
        for i, step_tokens in enumerate(tokens):
            logits.append(engine.step(encoded, state, step_tokens[keep]))
            if i == select_after:
                engine.select(state, keep_after)
                keep = keep_after
        engine.release(state)
        engine.release_sources(encoded)
        return logits

    # the joined state: a's steps 0-3 alone, then a's 4-9 beside b's 0-5; the first row of each leaves after
    # the joined state's fourth step (a's step 7, b's step 3)
    want_a = alone(a_sources, a_tokens, 7, np.array([1]))
    want_b = alone(b_sources, b_tokens, 3, np.arange(1, 70))

    a_encoded, b_encoded = engine.encode(a_sources), engine.encode(b_sources)
    engine.ws = None  # a workspace as small as the first state's (64 rows): the join must grow it
    joined = engine.start(a_encoded, np.arange(2), 20)
    assert joined.graphs and joined.ws.capacity < 72
    for tokens, want in zip(a_tokens[:4], want_a[:4]):
        assert np.array_equal(engine.step(a_encoded, joined, tokens), want)
    b = engine.start(b_encoded, np.arange(70), 20)
    assert not b.graphs  # the engine's workspace is the running state's
    engine.join(joined, b)
    assert b.n == 0 and joined.n == 72 and joined.ws.capacity >= 72 and engine.ws is joined.ws
    assert joined.t.tolist() == [4, 4] + [0] * 70
    keep_a, keep_b = np.arange(2), np.arange(70)
    for i in range(6):
        got = engine.step(None, joined, np.concatenate([a_tokens[4 + i][keep_a], b_tokens[i][keep_b]]))
        want = np.concatenate([want_a[4 + i], want_b[i]])
        assert np.array_equal(got, want), (i, float(np.abs(got - want).max()))
        if i == 3:
            engine.select(joined, np.concatenate([[1], 2 + np.arange(1, 70)]))
            keep_a, keep_b = np.array([1]), np.arange(1, 70)
    engine.release(joined)
    engine.release_sources(a_encoded)
    engine.release_sources(b_encoded)
    assert_pool_free(engine)
