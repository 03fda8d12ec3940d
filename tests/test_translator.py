"""Translator.generate: GPU out-of-memory split-and-retry, and per-sentence target languages.

The CPU machine has no CuPy: a stand-in exception plays cupy.cuda.memory.OutOfMemoryError, raised by an engine
wrapper for batches above a size, in front of the real reference engine of the tiny test model."""

from dataclasses import replace
from pathlib import Path

import pytest

from nllbcli.io import Record
from nllbcli.options import BatchOptions, DecodeOptions
from nllbcli.job.chunks import ChunkWorker
from nllbcli.options import Job
from nllbcli.model.translator import SentenceError, load_translator

TINY = str(Path(__file__).parent / "models" / "tiny-a")
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello!", "We will meet at the station at seven.",
         "Combien de personnes vivent dans cette ville ?", "Мы встретимся на вокзале.", "我们晚上七点在车站见面。", "a b c"]
OPTIONS = DecodeOptions(beam_size=2, max_length=10)


class StandInOutOfMemory(Exception):
    pass


class ShortOfMemory:
    """An engine that runs out of memory (`error`: the GPU's stand-in, or NumPy's MemoryError) when a batch holds
    more than `most` sentences, or one longer than `longest`."""

    def __init__(self, engine, most: int, longest: int = 10**9, error: type[Exception] = StandInOutOfMemory):
        self.engine, self.most, self.longest, self.error = engine, most, longest, error
        self.batches = []

    def encode(self, sources):
        self.batches.append(len(sources))
        if len(sources) > self.most or max(map(len, sources)) > self.longest:
            raise self.error("out of memory allocating 1,073,741,824 bytes")
        return self.engine.encode(sources)

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.fixture(scope="module")
def tiny():
    return load_translator(TINY, "cpu")


@pytest.fixture
def gpu_like(tiny, monkeypatch):
    monkeypatch.setattr("nllbcli.model.translator.out_of_memory_errors", lambda: (StandInOutOfMemory,))

    def make(most, longest=10**9):
        return replace(tiny, engine=ShortOfMemory(tiny.engine, most, longest), device="cuda:0")

    return make


def test_out_of_memory_halves_the_batch_until_it_fits(tiny, gpu_like):
    sources = [tiny.tokenizer.encode(t, "eng_Latn") for t in TEXTS]
    expected = tiny.generate(sources, "fra_Latn", OPTIONS)
    short = gpu_like(most=2)
    assert short.generate(sources, "fra_Latn", OPTIONS) == expected
    assert short.engine.batches == [7, 3, 1, 2, 4, 2, 2]  # 7 -> 3 + 4; 3 -> 1 + 2; 4 -> 2 + 2


def test_a_sentence_too_large_even_alone_names_itself(tiny, gpu_like):
    sources = [tiny.tokenizer.encode(t, "eng_Latn") for t in TEXTS]
    short = gpu_like(most=8, longest=12)
    with pytest.raises(SentenceError, match=r"the GPU ran out of memory on this sentence alone \(\d+ source tokens\)") as caught:
        short.generate(sources, "fra_Latn", OPTIONS)
    position = caught.value.position
    assert len(sources[position]) > 12 and all(len(s) <= 12 for s in sources[:position])
    assert f"({len(sources[position])} source tokens)" in str(caught.value)


def test_without_a_gpu_out_of_memory_is_not_caught(tiny, monkeypatch):
    monkeypatch.setattr("nllbcli.model.translator.out_of_memory_errors", lambda: (StandInOutOfMemory,))
    cpu = replace(tiny, engine=ShortOfMemory(tiny.engine, most=1))
    with pytest.raises(StandInOutOfMemory):
        cpu.generate([[5, 6, 2], [5, 7, 2]], "fra_Latn", OPTIONS)


def test_the_cpu_out_of_memory_halves_the_batch_then_names_the_sentence_and_the_beams(tiny):
    """NumPy's MemoryError (a wide beam under a memory limit) is split and retried as the GPU's is, and a sentence
    too large alone fails its row naming its beams (or samples) and what to lower."""
    cpu = replace(tiny, engine=ShortOfMemory(tiny.engine, most=2, longest=12, error=MemoryError))
    records = [Record(i, t, {}, where=f"in:{i + 1}") for i, t in enumerate(TEXTS)]
    outcomes = ChunkWorker(cpu, Job("eng_Latn", "fra_Latn", on_error="skip", split=False), OPTIONS, BatchOptions(max_batch_tokens=1000))(records)
    expected = tiny.translate_sentences(TEXTS, "eng_Latn", "fra_Latn", OPTIONS)
    for record, outcome, translation in zip(records, outcomes, expected):
        tokens = len(tiny.tokenizer.encode(record.text, "eng_Latn"))
        assert (outcome.translation, outcome.error) == ((translation, None) if tokens <= 12 else (None, (
            f"{record.where}: the CPU ran out of memory on this sentence alone ({tokens} source tokens) with 2 beams "
            "of up to 10 tokens: lower --beam-size or --max-length")))
    assert None in [o.translation for o in outcomes]
    sampling = replace(OPTIONS, beam_size=1, sampling_topk=0, num_hypotheses=3, seed=1)
    with pytest.raises(SentenceError, match=r"\) with 3 samples of up to 10 tokens: lower --num-hypotheses or "):
        cpu.generate_hypotheses([tiny.tokenizer.encode(TEXTS[0], "eng_Latn")], "fra_Latn", sampling)


@pytest.mark.parametrize("on_error", ["skip", "fail"])
def test_the_pipeline_fails_only_the_row_of_a_sentence_too_large(tiny, gpu_like, on_error):
    short = gpu_like(most=3, longest=12)
    records = [Record(i, t, {}, where=f"in:{i + 1}") for i, t in enumerate(TEXTS)]
    job = Job("eng_Latn", "fra_Latn", on_error=on_error, split=False)
    if on_error == "fail":
        with pytest.raises(Exception, match=r"^in:\d: the GPU ran out of memory on this sentence alone"):
            ChunkWorker(short, job, OPTIONS, BatchOptions(max_batch_tokens=1000))(records)
        return
    outcomes = ChunkWorker(short, job, OPTIONS, BatchOptions(max_batch_tokens=1000))(records)
    lengths = [len(tiny.tokenizer.encode(t, "eng_Latn")) for t in TEXTS]
    expected = tiny.translate_sentences(TEXTS, "eng_Latn", "fra_Latn", OPTIONS)
    for outcome, length, translation in zip(outcomes, lengths, expected):
        if length > 12:
            assert outcome.translation is None and "ran out of memory" in outcome.error
        else:
            assert outcome.translation == translation


def test_one_batch_may_mix_target_languages(tiny):
    sources = [tiny.tokenizer.encode(t, "eng_Latn") for t in TEXTS]
    targets = ["fra_Latn", "deu_Latn", "fra_Latn", "zho_Hans", "deu_Latn", "fra_Latn", "zho_Hans"]
    mixed = tiny.generate(sources, targets, OPTIONS)
    assert mixed == [tiny.generate([s], t, OPTIONS)[0] for s, t in zip(sources, targets)]


@pytest.mark.parametrize("beam_size", [1, 3])
def test_mixed_targets_share_one_engine_batch(tiny, beam_size):
    """The search forces each sentence's own language token, so mixed targets need no regrouping."""
    sources = [tiny.tokenizer.encode(t, "eng_Latn") for t in TEXTS]
    targets = ["fra_Latn", "deu_Latn", "zho_Hans", "fra_Latn", "deu_Latn", "fra_Latn", "zho_Hans"]
    options = DecodeOptions(beam_size=beam_size, max_length=12)
    calls = []
    encode = tiny.engine.encode
    tiny.engine.encode = lambda batch: calls.append(len(batch)) or encode(batch)
    try:
        mixed = tiny.generate(sources, targets, options)
    finally:
        tiny.engine.encode = encode
    assert calls == [len(sources)]
    assert mixed == [tiny.generate([s], t, options)[0] for s, t in zip(sources, targets)]
