"""Continuous batching (search.greedy_continuous, engine.join) on the reference engine: the goldens' ids with
rows joining a running state mid-way, each group's sources released once its rows end, the pool's refusals
waited out; a joined state steps as the states apart; bench/continuous.py's forced ends."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nllbcli.search as search  # noqa: E402
from nllbcli.errors import PoolFull  # noqa: E402
from nllbcli.options import DecodeOptions  # noqa: E402
from nllbcli.search import Ready, generate, greedy_continuous  # noqa: E402
from test_search import golden, translator  # noqa: E402  (any model of tests/models, and its goldens)

MODELS = ("tiny-a", "tiny-b", "tiny-m2m")


def greedy_cases(name):
    return [case for case in golden(name)["generate"] if case["beam_size"] == 1]


def options_of(case):
    return DecodeOptions(beam_size=1, max_length=case["max_length"], repetition_penalty=case.get("repetition_penalty", 1.0),
                         no_repeat_ngram_size=case.get("no_repeat_ngram_size", 0))


class Watched:
    """The reference engine, its calls recorded: encodings made and released, joins, each step's rows' positions."""

    def __init__(self, engine):
        self.engine = engine
        self.encoded, self.released, self.joins, self.positions = [], [], 0, []
        self.released_at = []  # steps run when each encoding was released

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def encode(self, sources):
        encoded = self.engine.encode(sources)
        self.encoded.append(encoded)
        return encoded

    def release_sources(self, encoded):
        self.released.append(encoded)
        self.released_at.append(len(self.positions))
        self.engine.release_sources(encoded)

    def join(self, state, other):
        self.joins += 1
        self.engine.join(state, other)

    def step(self, encoded, state, tokens, want_logits=True):
        self.positions.append(state.t.copy())
        return self.engine.step(encoded, state, tokens, want_logits)

    def step_argmax(self, encoded, state, tokens):
        return self.step(encoded, state, tokens).argmax(axis=-1)


class DeviceIds(Ready):
    """Ids as the GPU engine hands them out: `device` is what the next step reads (the search may write into
    it), fetch() gives a copy taken when the step ran."""

    def __init__(self, ids, host=None):
        super().__init__(ids)
        self.host = self.device.copy() if host is None else host

    def fetch(self):
        return self.host

    def subset(self, rows):
        return DeviceIds(self.device[rows], self.host[rows])


class Ahead(Watched):
    """... with step_argmax_ahead, as the GPU engine has it."""

    def step_argmax_ahead(self, encoded, state, tokens):
        return DeviceIds(self.step(encoded, state, tokens).argmax(axis=-1))


@pytest.mark.parametrize("live_rows", [2, 3])
@pytest.mark.parametrize("name", MODELS)
def test_continuous_batching_gives_the_goldens_ids(name, live_rows):
    """Every greedy golden with at most 2 or 3 rows alive: groups join the running state mid-way (rows at
    different positions in one step), the outputs in the order of the sources."""
    tr = translator(name)
    joins = mixed = 0
    for case in greedy_cases(name):
        engine, stats = Watched(tr.engine), {}
        lang = tr.tokenizer.lang_id(case["tgt_lang"])
        outputs = greedy_continuous(engine, case["input_ids"], lang, tr.config, options_of(case), live_rows, stats=stats)
        assert outputs == case["output_ids"]
        assert stats["joins"] == engine.joins and stats["steps"] == len(engine.positions)
        assert max(map(len, engine.positions)) <= live_rows
        joins += engine.joins
        mixed += sum(len(set(t.tolist())) > 1 for t in engine.positions)
    assert joins and mixed


@pytest.mark.parametrize("name", ["tiny-a", "tiny-b"])
def test_continuous_batching_with_the_processors_gives_the_goldens_ids(name):
    """The repetition penalty and the n-gram ban see each row's own tokens, whatever its position."""
    tr = translator(name)
    for case in [c for c in golden(f"{name}-processors")["generate"] if c["beam_size"] == 1]:
        lang = tr.tokenizer.lang_id(case["tgt_lang"])
        assert greedy_continuous(tr.engine, case["input_ids"], lang, tr.config, options_of(case), 2) == case["output_ids"]


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_continuous_batching_gives_the_goldens_however_far_ahead_it_queues(ahead, monkeypatch):
    """Steps queued ahead on ids the host has not seen, as on the GPU (fetch() a copy, `device` fed on): the
    joined rows' language written where the next step reads it, the ended rows gone from the queued steps."""
    monkeypatch.setattr(search, "AHEAD", ahead)
    for name in ("tiny-a", "tiny-b"):
        tr = translator(name)
        for case in greedy_cases(name):
            lang = tr.tokenizer.lang_id(case["tgt_lang"])
            for live_rows in (2, 5):
                outputs = greedy_continuous(Ahead(tr.engine), case["input_ids"], lang, tr.config, options_of(case), live_rows)
                assert outputs == case["output_ids"]


def test_each_group_is_released_once_its_rows_end():
    """Every encoding is released exactly once, most of them while other rows still decode."""
    tr = translator("tiny-b")
    case = max(greedy_cases("tiny-b"), key=lambda c: len(set(map(len, c["output_ids"]))))  # ends the most spread
    engine, stats = Watched(tr.engine), {}
    lang = tr.tokenizer.lang_id(case["tgt_lang"])
    assert greedy_continuous(engine, case["input_ids"], lang, tr.config, options_of(case), 2, stats=stats) == case["output_ids"]
    assert stats["groups"] == len(engine.encoded) >= 3 and stats["joins"] >= 2
    assert sorted(map(id, engine.released)) == sorted(map(id, engine.encoded))
    assert sum(at < len(engine.positions) for at in engine.released_at) >= len(engine.encoded) - 1


class SmallPool(Watched):
    """Cross K/V room for `room` source tokens at once, as the GPU engine's pool: encode refuses past it."""

    def __init__(self, engine, room):
        super().__init__(engine)
        self.room, self.held, self.most, self.refusals = room, {}, 0, 0

    def encode(self, sources):
        need = sum(map(len, sources))
        if sum(self.held.values()) + need > self.room:
            self.refusals += 1
            raise PoolFull(f"a run of {need} cross K/V rows needed")
        encoded = super().encode(sources)
        self.held[id(encoded)] = need
        self.most = max(self.most, sum(self.held.values()))
        return encoded

    def release_sources(self, encoded):
        del self.held[id(encoded)]
        super().release_sources(encoded)


def spread_case():
    case = max(greedy_cases("tiny-a"), key=lambda c: len(set(map(len, c["output_ids"]))))
    return translator("tiny-a"), case


def test_a_full_pool_makes_admission_wait_for_a_group_to_end():
    """With room for the first group's sources alone, the next group is refused while rows decode and admitted
    once that group has ended and freed its room: the same ids, never more held than the room."""
    tr, case = spread_case()
    room = sum(sorted(map(len, case["input_ids"]), reverse=True)[:2])  # the first group: the 2 longest
    engine, stats = SmallPool(tr.engine, room), {}
    lang = tr.tokenizer.lang_id(case["tgt_lang"])
    assert greedy_continuous(engine, case["input_ids"], lang, tr.config, options_of(case), 2, stats=stats) == case["output_ids"]
    assert stats["waits"] == engine.refusals > 0 and engine.most <= room
    assert not engine.held and stats["joins"] > 0


def test_a_full_pool_with_no_row_alive_admits_fewer_sentences():
    """The first group does not fit: admission halves it (6, 3, 1) rather than wait for nothing."""
    tr, case = spread_case()
    longest = max(map(len, case["input_ids"]))
    engine, stats = SmallPool(tr.engine, longest), {}
    lang = tr.tokenizer.lang_id(case["tgt_lang"])
    assert greedy_continuous(engine, case["input_ids"], lang, tr.config, options_of(case), 6, stats=stats) == case["output_ids"]
    assert stats["waits"] >= 2 and not engine.held


def test_a_sentence_larger_than_the_pool_raises_pool_full_and_holds_nothing():
    tr, case = spread_case()
    engine = SmallPool(tr.engine, min(map(len, case["input_ids"])) - 1)
    with pytest.raises(PoolFull):
        greedy_continuous(engine, case["input_ids"], 5, tr.config, options_of(case), 2)
    assert not engine.held


def test_continuous_batching_edges():
    tr, case = spread_case()
    assert greedy_continuous(tr.engine, [], 5, tr.config, DecodeOptions(beam_size=1), 4) == []
    one = DecodeOptions(beam_size=1, max_length=1)
    assert greedy_continuous(tr.engine, case["input_ids"], 5, tr.config, one, 4) == [[]] * len(case["input_ids"])
    with pytest.raises(ValueError, match="greedy search"):
        greedy_continuous(tr.engine, case["input_ids"], 5, tr.config, DecodeOptions(beam_size=4), 4)
    with pytest.raises(ValueError, match="live rows"):
        greedy_continuous(tr.engine, case["input_ids"], 5, tr.config, DecodeOptions(beam_size=1), 0)


def test_a_group_token_budget_makes_smaller_groups():
    tr, case = spread_case()
    lang = tr.tokenizer.lang_id(case["tgt_lang"])
    engine, stats = Watched(tr.engine), {}
    longest = max(map(len, case["input_ids"]))
    outputs = greedy_continuous(engine, case["input_ids"], lang, tr.config, options_of(case), 6, max_group_tokens=2 * longest,
                                stats=stats)
    assert outputs == case["output_ids"]
    assert all(e.mask.shape[0] * e.mask.shape[1] <= 2 * longest for e in engine.encoded) and stats["groups"] >= 3


@pytest.mark.parametrize("name", MODELS)
def test_join_steps_as_the_states_apart(name):
    """Two rows four steps on, joined by three fresh rows of another encoding (longer sources): each step of the
    joined state gives the logits of the two states stepped apart (to float32 rounding: a wrong position, mask
    or source gives errors of order 1), before and after a select that drops a row of each."""
    engine = translator(name).engine
    rng = np.random.default_rng(0)
    a_sources = [[5] + rng.integers(4, 100, n).tolist() + [2] for n in (3, 11)]
    b_sources = [[5] + rng.integers(4, 100, n).tolist() + [2] for n in (7, 2, 20)]
    a_enc, b_enc = engine.encode(a_sources), engine.encode(b_sources)
    joined, a_alone = engine.start(a_enc, np.arange(2), 16), engine.start(a_enc, np.arange(2), 16)
    b, b_alone = engine.start(b_enc, np.arange(3), 12), engine.start(b_enc, np.arange(3), 12)
    a_tokens = [np.full(2, 2)] + [rng.integers(4, 100, 2) for _ in range(8)]
    b_tokens = [np.full(3, 2)] + [rng.integers(4, 100, 3) for _ in range(5)]
    for tokens in a_tokens[:4]:
        engine.step(a_enc, joined, tokens)
        engine.step(a_enc, a_alone, tokens)
    engine.join(joined, b)
    assert b.n == 0 and joined.t.tolist() == [4, 4, 0, 0, 0]
    keep_a, keep_b = np.arange(2), np.arange(3)
    for i in range(5):
        want = np.concatenate([engine.step(a_enc, a_alone, a_tokens[4 + i][keep_a]), engine.step(b_enc, b_alone, b_tokens[i][keep_b])])
        got = engine.step(None, joined, np.concatenate([a_tokens[4 + i][keep_a], b_tokens[i][keep_b]]))
        assert np.abs(got - want).max() < 1e-5 * np.abs(want).max(), i
        assert (got.argmax(axis=-1) == want.argmax(axis=-1)).all()
        if i == 2:  # the first row of each leaves
            engine.select(joined, [1, 3, 4])
            engine.select(a_alone, [1])
            engine.select(b_alone, [1, 2])
            keep_a, keep_b = np.array([1]), np.array([1, 2])
    assert joined.t.tolist() == [9, 5, 5]


def test_bench_end_at_forces_the_drawn_ends_alike_in_both_modes():
    """bench/continuous.py's EndAt: each sentence's L-th generated token (the language the first) is </s>, in
    static and continuous batching alike."""
    from bench.continuous import SMOKE, EndAt, make_engine
    from bench.harness import workload

    sources = workload(12, SMOKE)
    ends = dict(zip(map(tuple, sources), np.random.default_rng(0).integers(5, 20, len(sources)).tolist()))
    config, inner = make_engine(SMOKE, smoke=True, pool_gib=0)
    options = DecodeOptions(beam_size=1, max_length=20)
    static = generate(EndAt(inner, ends, config.eos_token_id), sources, SMOKE.tgt_lang_id, config, options)
    continuous = greedy_continuous(EndAt(inner, ends, config.eos_token_id), sources, SMOKE.tgt_lang_id, config, options, 4)
    assert static == continuous
    assert [len(o) + 2 for o in static] == [ends[tuple(s)] for s in sources]
