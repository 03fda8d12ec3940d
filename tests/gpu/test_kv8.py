"""The FP8 K/V cache (--kv-cache-type float8) on the GPU: its kernels against their NumPy references with the output
poisoned first (kernels.copy_rows into Fp8Rows bit for bit against reference.copy_rows_e4m3; kernels.attention over
Fp8Rows, every kernel the decoder uses, against reference.attention_e4m3), and the engine with the FP8 cache against
the CPU reference keeping its K/V alike: teacher-forced logits, the sample model's held-out translations (greedy and
beam 4) and their log-probabilities, forced decoding's one pass against its steps, the pool's size. The goldens of
the default (bf16) cache: tests/gpu/test_outputs_unchanged.py."""

from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from nllbcli.model.checkpoint import load_checkpoint  # noqa: E402
from nllbcli.model.engine import cuda, kernels, numerics  # noqa: E402
from nllbcli.model.engine import reference as ref  # noqa: E402
from nllbcli.model.engine.cuda import CudaEngine  # noqa: E402
from nllbcli.model.engine.kvpool import PoolFull, RunAllocator, row_bytes  # noqa: E402
from nllbcli.model.engine.reference import ReferenceEngine, bf16_round  # noqa: E402
from nllbcli.model.tokenizer import NllbTokenizer  # noqa: E402
from nllbcli.model.translator import Translator, load_translator, quantize_matrices  # noqa: E402
from nllbcli.options import DecodeOptions  # noqa: E402

from checks import teacher_forced_errors  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"
MODELS = {"tiny-b": ROOT / "tests" / "models" / "tiny-b", "sample": SAMPLE}
BF16 = "bfloat16"
NAN_CODE = 0x7F  # E4M3's NaN: the codes' poison
SCORE_TOLERANCE = 0.15  # a translation's log-probability, a sum of ~20 (tests/gpu/test_score.py's)
rng = np.random.default_rng(8008)
bf16 = bf16_round  # the values as the device will hold them


def to_device_bf16(a: np.ndarray):
    return cp.asarray(a, dtype=cp.float32).astype(BF16)


def poisoned_rows(rows: int, width: int, heads: int, spare: int = 0) -> tuple[kernels.Fp8Rows, cp.ndarray, cp.ndarray]:
    """Fp8Rows of `rows` rows, codes NaN and scales NaN, as column slices of wider arrays (`spare` more columns on each
    side, as a layer's part of the pool's cross rows); -> (the rows, the whole codes, the whole scales)."""
    codes = cp.full((rows, width + 2 * spare * 8), NAN_CODE, cp.uint8)
    scales = cp.full((rows, heads + 2 * spare), np.nan, cp.float32)
    return kernels.Fp8Rows(codes[:, spare * 8 : spare * 8 + width], scales[:, spare : spare + heads]), codes, scales


def kv_values(rows: int, heads: int, e: int) -> np.ndarray:
    """K or V rows (rows, heads * e) of bf16 values, heads of sizes from 1e-6 to 1e4; among them an all-zero head, a
    head of one large value among small ones, and (where e > 2) a head whose scale is 1 holding halfway values between
    E4M3 neighbours (ties: the even code) and 448."""
    x = rng.normal(size=(rows, heads, e)).astype(np.float32) * (10.0 ** rng.uniform(-6, 4, (rows, heads, 1)))
    x[0, 0] = 0
    if rows > 1:
        x[1, -1] = rng.normal(size=e) * 1e-4
        x[1, -1, e // 2] = -3000
    if rows > 2 and e > 2:
        values = numerics.e4m3_values()[:127].astype(np.float64)
        halfway = ((values[:-1] + values[1:]) / 2).astype(np.float32)  # exact in bf16 too
        x[2, 0, : e - 1] = rng.choice(halfway, e - 1) * np.where(rng.random(e - 1) < 0.5, 1, -1)
        x[2, 0, e - 1] = numerics.E4M3_MAX
    return bf16_round(x.astype(np.float32).reshape(rows, heads * e))


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    assert not np.isnan(got).any()
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


# ------------------------------------------------------------------------------------------------ the kernels


@pytest.mark.parametrize("e, heads, parts", [(64, 16, 1), (64, 4, 6), (128, 8, 2), (8, 8, 1), (16, 2, 4), (2, 3, 1)])
def test_copy_rows_e4m3_matches_reference_bit_for_bit(e, heads, parts):
    """A step's K (the middle third of a fused QKV) or the encoder's cross K/V (parts: every layer's K and V, each
    `heads` heads wide) into scattered rows of a column slice of wider codes and scales, each head quantized as
    numerics.quantize_heads does; the rows not written keep their poison."""
    width, n, pool_rows = parts * heads * e, 37, 90
    values = kv_values(n, parts * heads, e)
    qkv = np.zeros((n, 3 * width), np.float32)
    qkv[:, width : 2 * width] = values
    src = to_device_bf16(qkv)[:, width : 2 * width]
    src_rows = rng.permutation(n)[:29].astype(np.int32)
    dst_rows = rng.choice(pool_rows, 29, replace=False).astype(np.int32)
    dst, codes, scales = poisoned_rows(pool_rows, width, parts * heads, spare=2)
    kernels.copy_rows(src, cp.asarray(src_rows), dst, cp.asarray(dst_rows))
    want_codes = np.full((pool_rows, width), NAN_CODE, np.uint8)
    want_scales = np.full((pool_rows, parts * heads), np.nan, np.float32)
    ref.copy_rows_e4m3(values, src_rows, want_codes, want_scales, dst_rows)
    assert (cp.asnumpy(dst.codes) == want_codes).all()
    assert (cp.asnumpy(dst.scales).view(np.uint32) == want_scales.view(np.uint32)).all()
    assert (cp.asnumpy(codes[:, :16]) == NAN_CODE).all() and (cp.asnumpy(codes[:, 16 + width :]) == NAN_CODE).all()
    assert np.isnan(cp.asnumpy(scales[:, :2])).all() and np.isnan(cp.asnumpy(scales[:, 2 + parts * heads :])).all()


def test_copy_rows_into_fp8_rows_checks_its_arguments():
    src = cp.zeros((4, 64), BF16)
    rows = cp.arange(4, dtype=cp.int32)
    with pytest.raises(ValueError, match="heads of an even size"):
        kernels.copy_rows(src, rows, kernels.Fp8Rows(cp.zeros((4, 64), cp.uint8), cp.zeros((4, 64), cp.float32)), rows)
    with pytest.raises(ValueError, match="bf16"):
        kernels.copy_rows(src.astype(cp.float32), rows, kernels.Fp8Rows(cp.zeros((4, 64), cp.uint8),
                                                                        cp.zeros((4, 2), cp.float32)), rows)


def fp8_keys(keys: int, d: int, heads: int):
    """K and V of `keys` rows as an FP8 cache holds them, in one array each of codes and scales (K's columns, then
    V's, as the pool's cross rows lie): -> (k, v) Fp8Rows on the device, and (k codes, k scales, v codes, v scales)
    on the host."""
    e = d // heads
    k_codes, k_scales = numerics.quantize_heads(kv_values(keys, heads, e) * np.float32(1e-2), e)
    v_codes, v_scales = numerics.quantize_heads(bf16_round(rng.normal(size=(keys, d)).astype(np.float32)), e)
    codes = cp.asarray(np.concatenate([k_codes, v_codes], axis=1))
    scales = cp.asarray(np.concatenate([k_scales, v_scales], axis=1))
    k = kernels.Fp8Rows(codes[:, :d], scales[:, :heads])
    v = kernels.Fp8Rows(codes[:, d:], scales[:, heads:])
    return (k, v), (k_codes, k_scales, v_codes, v_scales)


def reference_rows(q: np.ndarray, host, key_rows: list[np.ndarray], heads: int) -> np.ndarray:
    """reference.attention_e4m3 of each query q[r] over its key rows key_rows[r], in float64."""
    k_codes, k_scales, v_codes, v_scales = host
    return np.stack([
        ref.attention_e4m3(q[r][None, None].astype(np.float64), k_codes[rows][None],
                           k_scales[rows][None].astype(np.float64), v_codes[rows][None],
                           v_scales[rows][None].astype(np.float64), None, heads)[0, 0]
        for r, rows in enumerate(key_rows)
    ])


# None: the general kernel (attention_e4m3_kernel); 64: the warp-per-row one where the head size is 64 or 128
@pytest.mark.parametrize("max_keys", [None, 64])
@pytest.mark.parametrize("heads,d", [(16, 1024), (2, 48), (8, 64), (4, 256), (8, 1024)])
def test_attention_e4m3_matches_reference(heads, d, max_keys):
    """Queries (a column slice of a fused QKV) over runs of FP8 key rows (column slices of codes and scales)."""
    rows, keys = 9, 60
    qkv = bf16(rng.normal(size=(rows, 3 * d)).astype(np.float32))
    (k, v), host = fp8_keys(keys, d, heads)
    start = rng.integers(0, keys // 2, rows).astype(np.int32)
    length = np.array([rng.integers(1, keys - s + 1) for s in start], dtype=np.int32)
    out = cp.full((rows, d), np.nan, BF16)
    kernels.attention(to_device_bf16(qkv)[:, :d], k, v, cp.asarray(start), cp.asarray(length), heads, out=out,
                      max_keys=max_keys)
    want = reference_rows(qkv[:, :d], host, [np.arange(s, s + n) for s, n in zip(start, length)], heads)
    assert rel_err(cp.asnumpy(out.astype(cp.float32)), want) < 1e-2


@pytest.mark.parametrize("t", [9, 300])  # the decode kernel takes keys 32 at a time: one run, and several
@pytest.mark.parametrize("heads,d", [(4, 64), (4, 256), (8, 1024), (2, 48)])
def test_attention_e4m3_reads_keys_through_a_row_table(heads, d, t):
    """Decoder self-attention over the pool: each query's keys are the cache rows its table lists, in table order."""
    rows, pool_rows = 6, 400
    (k, v), host = fp8_keys(pool_rows, d, heads)
    q = bf16(rng.normal(size=(rows, d)).astype(np.float32))
    table = rng.integers(0, pool_rows, (rows, t)).astype(np.int32)
    length = rng.integers(1, t + 1, rows).astype(np.int32)
    out = cp.full((rows, d), np.nan, BF16)
    kernels.attention(to_device_bf16(q), k, v, None, cp.asarray(length), heads, out=out, table=cp.asarray(table),
                      max_keys=t)
    want = reference_rows(q, host, [table[r, :n] for r, n in enumerate(length)], heads)
    assert rel_err(cp.asnumpy(out.astype(cp.float32)), want) < 1e-2


@pytest.mark.parametrize("rows", [4, 9, 13])
@pytest.mark.parametrize("heads,d", [(16, 1024), (4, 256)])
def test_attention_e4m3_of_rows_together_is_the_same_bits(heads, d, rows):
    """together (a block: one head of 4 rows, as a sentence's beams read one source) changes which warps run
    together, not what any computes."""
    keys = 200
    (k, v), _ = fp8_keys(keys, d, heads)
    q = to_device_bf16(bf16(rng.normal(size=(rows, d)).astype(np.float32)))
    for start in (np.repeat(rng.integers(0, 100, -(-rows // 4)), 4)[:rows], rng.integers(0, 100, rows)):
        start = cp.asarray(start.astype(np.int32))
        length = cp.asarray(rng.integers(1, 100, rows).astype(np.int32))
        apart, together = cp.full((rows, d), np.nan, BF16), cp.full((rows, d), np.nan, BF16)
        kernels.attention(q, k, v, start, length, heads, out=apart, max_keys=100)
        kernels.attention(q, k, v, start, length, heads, out=together, max_keys=100, together=True)
        assert (apart.view(cp.uint16) == together.view(cp.uint16)).all()


def test_attention_e4m3_past_the_decode_kernels_keys():
    """More keys than the warp-per-row kernel holds (a --max-length past DECODE_MAX_KEYS): the general kernel, through
    a table as a step reads its cache."""
    heads, d, rows, t = 16, 1024, 3, kernels.DECODE_MAX_KEYS + 300
    (k, v), host = fp8_keys(t + 50, d, heads)
    q = bf16(rng.normal(size=(rows, d)).astype(np.float32))
    table = np.stack([rng.permutation(t + 50)[:t] for _ in range(rows)]).astype(np.int32)
    length = np.array([t, t - 7, 1100], np.int32)
    out = cp.full((rows, d), np.nan, BF16)
    kernels.attention(to_device_bf16(q), k, v, None, cp.asarray(length), heads, out=out, table=cp.asarray(table),
                      max_keys=t)
    want = reference_rows(q, host, [table[r, :n] for r, n in enumerate(length)], heads)
    assert rel_err(cp.asnumpy(out.astype(cp.float32)), want) < 1e-2


# ------------------------------------------------------------------------------------------------ the engine


# The reference with the GPU's weights and roundings (bf16_activations) and the same FP8 cache. Beside the bf16 engine's
# differences (f32 summation order moving a value across a bf16 boundary now and then: tests/gpu/test_engine.py), a K
# or V element a bf16 ulp apart may round to the neighbouring E4M3 code (a step of 1/16 of itself) and carry that
# through the layers and steps. Bounds set before a GPU measured them, from the CPU: the FP8 cache moved the sample
# model's teacher-forced logits 2-4 times as far as the bf16 cache did under a far larger difference (float32 against
# bf16 activations); a wrong position, mask, slot, scale or reorder gives errors of order 1.
TOLERANCE = {"tiny-b": 2e-2, "sample": 0.15}


@lru_cache(maxsize=None)
def engines(name):
    config, weights = load_checkpoint(MODELS[name])
    rounded = {k: bf16_round(v) for k, v in weights.items()}
    return (config, ReferenceEngine(config, rounded, bf16_activations=True, kv_float8=True),
            CudaEngine(config, weights, pool_bytes=1 << 30, kv_float8=True))


@pytest.mark.parametrize("name", list(MODELS))
def test_fp8_cache_logits_match_the_reference(name):
    """Teacher-forced steps over a padded batch with a beam reorder, as the bf16 engine is checked."""
    config, reference, gpu = engines(name)
    lang = NllbTokenizer.from_model_dir(MODELS[name]).lang_id("eng_Latn")
    rng_steps = np.random.default_rng(5)
    sources = [[lang] + rng_steps.integers(4, 300, n).tolist() + [2] for n in (3, 17, 9)]
    teacher_forced_errors(reference, gpu, sources, rng_steps, 4, 300, f"kv8 {name}", TOLERANCE[name])
    assert isinstance(gpu.pool.self_k[0], kernels.Fp8Rows) and gpu.pool.float8


@lru_cache(maxsize=None)
def translators():
    """The GPU with the FP8 cache, and the CPU reference computing as it does (its weights, roundings and cache)."""
    gpu = load_translator(str(SAMPLE), "cuda", kv_cache_type="float8")
    cpu = load_translator(str(SAMPLE), "cpu")
    rounded = {k: bf16_round(v) for k, v in cpu.engine.w.items()}
    reference = Translator(cpu.config, cpu.tokenizer, ReferenceEngine(cpu.config, rounded, bf16_activations=True,
                                                                      kv_float8=True), "cpu", kv_cache_type="float8")
    return gpu, reference


@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("src,tgt", [("eng_Latn", "fra_Latn"), ("deu_Latn", "ita_Latn"), ("spa_Latn", "deu_Latn")])
def test_fp8_cache_translations_agree_with_the_cpus(beam_size, src, tgt):
    """The best translation of at least 99% of the held-out sentences the reference's, and where they are the same,
    its log-probability within SCORE_TOLERANCE."""
    gpu, reference = translators()
    assert gpu.kv_cache_type == "float8" and gpu.engine.kv_float8
    texts = (HELDOUT / f"{src}.txt").read_text(encoding="utf-8").splitlines()
    sources = [gpu.tokenizer.encode(text, src) for text in texts]
    options = DecodeOptions(beam_size=beam_size, max_length=64, scores=True)
    found, want = (t.generate_hypotheses(sources, tgt, options) for t in (gpu, reference))
    same = [(a[0], b[0]) for a, b in zip(found, want) if a[0].ids == b[0].ids]
    errors = [abs(a.log_prob - b.log_prob) for a, b in same]
    print(f"{src}->{tgt} beam {beam_size}: {len(same)}/{len(texts)} the same, log-prob error at most {max(errors):.3g}")
    assert len(same) >= 0.99 * len(texts)
    assert max(errors) < SCORE_TOLERANCE


@pytest.mark.parametrize("beam_size", [1, 4])
def test_fp8_cache_translation_does_not_depend_on_the_batch(beam_size):
    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()[:24]
    tr, options = translators()[0], DecodeOptions(beam_size=beam_size, max_length=64)
    together = tr.translate_sentences(texts, "eng_Latn", "fra_Latn", options)
    alone = [tr.translate_sentences([t], "eng_Latn", "fra_Latn", options)[0] for t in texts]
    assert together == alone == tr.translate_sentences(texts[::-1], "eng_Latn", "fra_Latn", options)[::-1]


@pytest.mark.parametrize("beam_size", [1, 4])
def test_cuda_graphs_change_no_fp8_cache_translation(beam_size):
    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()[:100]
    options = DecodeOptions(beam_size=beam_size, max_length=64)
    tr = load_translator(str(SAMPLE), "cuda", kv_cache_type="float8")
    tr.engine.use_graphs = False
    eager = tr.translate_sentences(texts, "eng_Latn", "fra_Latn", options)
    tr.engine.use_graphs = True
    first = tr.translate_sentences(texts, "eng_Latn", "fra_Latn", options)
    again = tr.translate_sentences(texts, "eng_Latn", "fra_Latn", options)
    assert len(tr.engine.ws.graphs) >= 2 and first == again == eager


def test_cross_rows_in_parts_or_a_source_at_a_time_change_nothing(monkeypatch):
    """The encoder's cross K/V quantized into the pool a few tokens at a time (a small staging array), or into a run
    of rows a source where the free rows are fragmented: the translations of one run in one part."""
    texts = (HELDOUT / "deu_Latn.txt").read_text(encoding="utf-8").splitlines()[:40]
    tr, options = translators()[0], DecodeOptions(beam_size=2, max_length=48)
    whole = tr.translate_sentences(texts, "deu_Latn", "eng_Latn", options)
    monkeypatch.setattr(cuda, "CROSS_STAGING_BYTES", 1)  # parts of 64 tokens
    assert tr.translate_sentences(texts, "deu_Latn", "eng_Latn", options) == whole
    claim = RunAllocator.claim

    def fragmented(self, n: int) -> int:
        if n > 200:  # no run for the batch (40 sentences): a run a source (each shorter)
            raise PoolFull("fragmented")
        return claim(self, n)

    monkeypatch.setattr(RunAllocator, "claim", fragmented)
    assert tr.translate_sentences(texts, "deu_Latn", "eng_Latn", options) == whole


def test_one_pass_scores_what_the_fp8_cache_steps_score(monkeypatch):
    """forced_log_probs (every position at once, its own K/V rounded as a step stores them) against the step loop
    through the pool, as tests/gpu/test_score.py checks the bf16 cache; and a greedy translation scored as the
    search scored it."""
    tr = translators()[0]
    tokenizer = tr.tokenizer
    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()[:30]
    sources = [tokenizer.encode(text, "eng_Latn") for text in texts]
    found = tr.generate_hypotheses(sources, "fra_Latn", DecodeOptions(beam_size=1, max_length=64, scores=True))
    targets = [h[0].ids for h in found]
    options = DecodeOptions(beam_size=1)
    one_pass = [h[0] for h in tr.generate_hypotheses(sources, "fra_Latn", options, targets=targets)]
    assert max(abs(a[0].log_prob - b.log_prob) for a, b in zip(found, one_pass)) < 1e-3
    monkeypatch.setattr(cuda, "FORCED_TOKENS", 100)  # a few rows a pass
    parts = [h[0] for h in tr.generate_hypotheses(sources, "fra_Latn", options, targets=targets)]
    monkeypatch.delattr(cuda.CudaEngine, "forced_log_probs")  # score_targets then steps
    stepped = [h[0] for h in tr.generate_hypotheses(sources, "fra_Latn", options, targets=targets)]
    for a, b, c in zip(one_pass, stepped, parts):
        np.testing.assert_allclose(a.token_log_probs, b.token_log_probs, atol=0.02)
        np.testing.assert_allclose(a.token_log_probs, c.token_log_probs, atol=1e-3)
    assert max(abs(a.log_prob - b.log_prob) for a, b in zip(one_pass, stepped)) < SCORE_TOLERANCE


def test_the_fp8_pool_holds_about_twice_the_rows_in_the_same_memory():
    config, weights = load_checkpoint(SAMPLE)
    layers, d, heads = config.decoder_layers, config.d_model, config.decoder_attention_heads
    budget = 64 << 20
    plain, fp8 = (CudaEngine(config, weights, pool_bytes=budget, kv_float8=kv) for kv in (False, True))
    (rows, source_rows), (rows8, source_rows8) = (e.capacity(64, 1) for e in (plain, fp8))
    ratio = row_bytes(layers, d) / row_bytes(layers, d, heads)
    assert rows8 / rows == pytest.approx(ratio, rel=0.02)
    assert source_rows8 / source_rows == pytest.approx(ratio, rel=0.02)
    assert fp8.pool.nbytes == fp8.pool.plan.nbytes(layers, d, heads) <= budget + 66 * row_bytes(layers, d, heads)
    assert isinstance(fp8.pool.cross_k(1), kernels.Fp8Rows) and fp8.pool.cross_k(1).scales.shape[1] == heads


def test_the_command_translates_with_the_fp8_cache_on_the_gpu(tmp_path):
    from click.testing import CliRunner

    from nllbcli.cli import cli

    source = ROOT / "data" / "samples" / "demo.eng_Latn.txt"
    texts = source.read_text(encoding="utf-8").splitlines()
    result = CliRunner().invoke(cli, ["translate", "--src", "eng_Latn", "--tgt", "ita_Latn", "--model", str(SAMPLE),
                                      "--device", "cuda", "--kv-cache-type", "float8", str(source),
                                      str(tmp_path / "out.txt")])
    assert result.exit_code == 0, result.output
    got = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    assert got == translators()[0].translate_sentences(texts, "eng_Latn", "ita_Latn", DecodeOptions())


@pytest.mark.skipif(not kernels.wgmma_available(), reason="FP8 products need a Hopper GPU")
def test_fp8_products_with_the_fp8_cache_agree_with_the_cpus(monkeypatch):
    """--compute-type float8 --kv-cache-type float8 (the encoder's output as FP8 codes and scales, sliced into the
    staging's parts) against the reference doing both, as tests/gpu/test_float8_engine.py checks FP8 products alone."""
    gpu = load_translator(str(SAMPLE), "cuda", compute_type="float8", kv_cache_type="float8")
    assert gpu.engine.float8 and gpu.engine.kv_float8
    cpu = load_translator(str(SAMPLE), "cpu")
    quantized = quantize_matrices({k: bf16_round(v) for k, v in cpu.engine.w.items()})
    reference = Translator(cpu.config, cpu.tokenizer, ReferenceEngine(cpu.config, quantized, bf16_activations=True,
                                                                      kv_float8=True), "cpu")
    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()
    for beam_size in (1, 4):
        options = DecodeOptions(beam_size=beam_size, max_length=64)
        found = gpu.translate_sentences(texts, "eng_Latn", "fra_Latn", options)
        same = sum(a == b for a, b in zip(found, reference.translate_sentences(texts, "eng_Latn", "fra_Latn", options)))
        print(f"FP8 products and cache, beam {beam_size}: GPU = CPU {same}/{len(texts)}")
        assert same >= 0.98 * len(texts)
    options = DecodeOptions(beam_size=2, max_length=48)
    whole = gpu.translate_sentences(texts[:40], "eng_Latn", "fra_Latn", options)
    monkeypatch.setattr(cuda, "CROSS_STAGING_BYTES", 1)  # parts of 64 tokens
    assert gpu.translate_sentences(texts[:40], "eng_Latn", "fra_Latn", options) == whole
