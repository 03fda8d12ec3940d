"""The GPU engine's KV pool sized for the batch (model/engine/kvpool.py's planning, CudaEngine.capacity): as large as the
batch needs, kept for the batches it covers, grown for one it does not, a batch the memory holds never split,
and the memory beside it within kvpool.activation_bytes."""

from pathlib import Path

import pytest

cp = pytest.importorskip("cupy")

from nllbcli.model.engine.kvpool import PoolPlan, activation_bytes, rounded_up  # noqa: E402
from nllbcli.options import DecodeOptions  # noqa: E402
from nllbcli.model.translator import Translator, load_translator  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"


@pytest.fixture
def translator():
    tr = load_translator(str(SAMPLE), "cuda")
    yield tr
    tr.engine.drop_pool()


def test_the_pool_is_the_batchs_size_kept_for_smaller_ones_and_grown_for_larger(translator):
    engine, c = translator.engine, translator.config
    rows, source_rows = engine.capacity(40, 1, sentences=5000, source_tokens=150_000)
    plan = engine.pool.plan
    assert plan == PoolPlan(rounded_up(5000), 41, rounded_up(150_000)) and (rows, source_rows) == (plan.slots, plan.cross_rows)
    assert engine.pool.nbytes == plan.nbytes(c.decoder_layers, c.d_model)
    pool = engine.pool
    assert engine.capacity(30, 4, sentences=1000, source_tokens=20_000) == (rows, source_rows)  # covered: kept
    assert engine.pool is pool
    engine.capacity(60, 1, sentences=100, source_tokens=1000)  # longer rows: remade, covering the pool before too
    assert engine.pool is not pool and engine.pool.plan.covers(PoolPlan(5000, 61, 150_000))


def test_a_batch_the_memory_holds_goes_in_one_part(translator, monkeypatch):
    """20,000 sentences at once: more than the 16,384 rows a pool of unknown size gets, and held whole."""
    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()
    sources = [translator.tokenizer.encode(texts[n % len(texts)], "eng_Latn") for n in range(20_000)]
    parts = []
    plain = Translator.generate_part

    def counted(self, part, *args, **kwargs):
        parts.append(len(part))
        return plain(self, part, *args, **kwargs)

    monkeypatch.setattr(Translator, "generate_part", counted)
    options = DecodeOptions(beam_size=1, max_length=8)
    found = translator.generate(sources, "fra_Latn", options)
    assert parts == [20_000] and translator.engine.pool.plan.slots >= 20_000
    assert found[: len(texts)] == translator.generate(sources[: len(texts)], "fra_Latn", options)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_batchs_arrays_beside_the_pool_stay_within_the_bound(translator, beam_size):
    """What CuPy's allocator holds once a batch is done, less the weights and the pool, is what the batch's own
    arrays took at most: within kvpool.activation_bytes, which the pool leaves free."""
    memory = cp.get_default_memory_pool()
    translator.engine.drop_pool()
    weights = memory.total_bytes()
    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()
    sources = [translator.tokenizer.encode(texts[n % len(texts)], "eng_Latn") for n in range(4096 // beam_size)]
    translator.generate(sources, "deu_Latn", DecodeOptions(beam_size=beam_size, max_length=24))
    cp.cuda.Device().synchronize()
    plan = translator.engine.pool.plan
    beside = memory.total_bytes() - weights - translator.engine.pool.nbytes
    bound = activation_bytes(translator.config, plan.slots, plan.cross_rows, plan.cache_rows)
    assert 0 < beside <= bound, (beside, bound)

