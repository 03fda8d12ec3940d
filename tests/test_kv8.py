"""--kv-cache-type float8 on the CPU side: the NumPy model of the FP8 K/V cache (numerics.quantize_heads, the
kernels' references reference.copy_rows_e4m3 and reference.attention_e4m3), the reference engine keeping its K and V
so, its translations against the bf16 cache's, the option through the command, the API, Spark, --devices and Ray,
the job's identity (the default leaves it as it was; another setting is another job, which the command's --resume
refuses: tests/test_option_identity.py), and the pool's planning with FP8 rows. (The GPU's kernels and engine:
tests/gpu/test_kv8.py.)"""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import nllbcli
from nllbcli.cli import cli
from nllbcli.errors import NllbError
from nllbcli.job.spec import identity_of, job_identity
from nllbcli.job.state import check_same_job
from nllbcli.model.engine import numerics
from nllbcli.model.engine import reference as ref
from nllbcli.model.engine.kvpool import (CROSS_STAGING_BYTES, PoolPlan, activation_bytes, plan_for_job, plan_pool,
                                         row_bytes)
from nllbcli.model.engine.reference import ReferenceEngine, bf16_round, e4m3_heads_round
from nllbcli.model.shapes import PRESETS
from nllbcli.model.translator import Translator, load_translator
from nllbcli.options import BatchOptions, DecodeOptions, Job, ModelOptions

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"
TINY = str(ROOT / "tests" / "models" / "tiny-a")
rng = np.random.default_rng(88)


def heads_of_every_size(rows: int, heads: int, e: int) -> np.ndarray:
    """K or V rows (rows, heads * e) whose heads' sizes run from 1e-6 to 1e4, an all-zero head, and one head holding
    a single large value among small ones."""
    x = rng.normal(size=(rows, heads, e)).astype(np.float32) * (10.0 ** rng.uniform(-6, 4, (rows, heads, 1)))
    x[0, 0] = 0
    x[1, 1] = rng.normal(size=e) * 1e-3
    x[1, 1, 3] = 500
    return bf16_round(x.astype(np.float32).reshape(rows, heads * e))


@pytest.mark.parametrize("heads, e", [(4, 64), (16, 64), (2, 8), (3, 128)])
def test_quantize_heads_is_quantize_e4m3_of_each_head(heads, e):
    x = heads_of_every_size(7, heads, e)
    codes, scales = numerics.quantize_heads(x, e)
    assert codes.shape == x.shape and codes.dtype == np.uint8
    assert scales.shape == (7, heads) and scales.dtype == np.float32
    for g in range(heads):
        want_codes, want_scales = numerics.quantize_e4m3(x[:, g * e : (g + 1) * e])
        assert (codes[:, g * e : (g + 1) * e] == want_codes).all()
        assert (scales[:, g].view(np.uint32) == want_scales[:, 0].view(np.uint32)).all()
    assert scales[0, 0] == 1  # an all-zero head
    values = numerics.dequantize_heads(codes, scales)
    size = np.abs(x).reshape(7, heads, e).max(axis=2, keepdims=True)
    # E4M3 keeps 3 mantissa bits: each value within 2^-4 of itself, or below 2^-14 of its head's largest size (E4M3's
    # subnormals there, a step of 2^-9 of the scale) within 2^-18 of it (docs/GPU.md, FP8 K/V cache)
    error = np.abs(values - x).reshape(7, heads, e)
    assert (error <= np.maximum(2.0**-4 * np.abs(x).reshape(7, heads, e), 2.0**-18 * size)).all()
    assert np.array_equal(e4m3_heads_round(x, e), values)


def test_copy_rows_e4m3_quantizes_each_row_into_its_place():
    src = heads_of_every_size(5, 4, 16)
    codes, scales = np.full((9, 64), 7, np.uint8), np.full((9, 4), -1, np.float32)
    ref.copy_rows_e4m3(src, np.array([4, 0, 2]), codes, scales, np.array([8, 1, 3]))
    want_codes, want_scales = numerics.quantize_heads(src[[4, 0, 2]], 16)
    assert (codes[[8, 1, 3]] == want_codes).all() and (scales[[8, 1, 3]] == want_scales).all()
    untouched = [0, 2, 4, 5, 6, 7]
    assert (codes[untouched] == 7).all() and (scales[untouched] == -1).all()


def test_attention_e4m3_is_attention_over_the_caches_values():
    """reference.attention_e4m3 against the kernels' arithmetic, the scales taken out of the sums (a score: k's scale
    times q . codes' values; a weight times v's scale times the codes' values): the same to float32's rounding."""
    n, tk, heads, e = 3, 40, 4, 64
    q = bf16_round(rng.normal(size=(n, 1, heads * e)).astype(np.float32))
    k_codes, k_scales = numerics.quantize_heads(heads_of_every_size(n * tk, heads, e).reshape(n, tk, -1), e)
    v_codes, v_scales = numerics.quantize_heads(rng.normal(size=(n, tk, heads * e)).astype(np.float32), e)
    got = ref.attention_e4m3(q, k_codes, k_scales, v_codes, v_scales, None, heads)
    values = numerics.e4m3_values().astype(np.float64)
    kv, vv = values[k_codes].reshape(n, tk, heads, e), values[v_codes].reshape(n, tk, heads, e)
    scores = np.einsum("nkhe,nhe->nhk", kv, q.reshape(n, heads, e).astype(np.float64)) * k_scales.transpose(0, 2, 1) / 8
    p = np.exp(scores - scores.max(axis=2, keepdims=True))
    want = np.einsum("nhk,nkhe->nhe", p * v_scales.transpose(0, 2, 1), vv) / p.sum(axis=2)[..., None]
    np.testing.assert_allclose(got.reshape(n, heads, e), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


# -- the reference engine


@pytest.fixture(scope="module")
def sample():
    return load_translator(str(SAMPLE), "cpu"), load_translator(str(SAMPLE), "cpu", kv_cache_type="float8")


def test_the_reference_keeps_its_k_and_v_in_e4m3_a_head_at_a_time(sample):
    """The cross K/V at encode and a step's self-attention K/V are the bf16 cache's, rounded as numerics.quantize_heads
    rounds them (the encoder, and the first layer's first step, read no cache: their K/V are the same before it)."""
    plain, fp8 = (t.engine for t in sample)
    assert fp8.kv_float8 and not plain.kv_float8
    config = plain.config
    e = config.d_model // config.decoder_attention_heads
    sources = [sample[0].tokenizer.encode(text, "eng_Latn") for text in ("Hello.", "A cat sat on the mat.")]
    encoded, encoded8 = plain.encode(sources), fp8.encode(sources)
    for k, k8, v, v8 in zip(encoded.cross_k, encoded8.cross_k, encoded.cross_v, encoded8.cross_v):
        assert np.array_equal(k8, e4m3_heads_round(k, e)) and np.array_equal(v8, e4m3_heads_round(v, e))
    rows = np.array([0, 1])
    state, state8 = plain.start(encoded, rows, 8), fp8.start(encoded8, rows, 8)
    start = np.full(2, config.decoder_start_token_id)
    plain.step(encoded, state, start)
    fp8.step(encoded8, state8, start)
    assert np.array_equal(state8.self_k[0][:, 0], e4m3_heads_round(state.self_k[0][:, 0], e))
    assert np.array_equal(state8.self_v[0][:, 0], e4m3_heads_round(state.self_v[0][:, 0], e))
    assert not np.array_equal(state8.self_k[0][:, 0], state.self_k[0][:, 0])


@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("src, tgt", [("eng_Latn", "fra_Latn"), ("deu_Latn", "spa_Latn")])
def test_fp8_cache_translations_of_the_sample_model_agree_with_bf16s(sample, beam_size, src, tgt):
    """What bench.fp8_quality --variant kv8 measures, on 40 held-out sentences: the same translations, all but one at
    most."""
    plain, fp8 = sample
    texts = (HELDOUT / f"{src}.txt").read_text(encoding="utf-8").splitlines()[:40]
    options = DecodeOptions(beam_size=beam_size, max_length=48)
    found, want = (t.translate_sentences(texts, src, tgt, options) for t in (fp8, plain))
    assert sum(a == b for a, b in zip(found, want)) >= len(texts) - 1


def test_the_fp8_cache_goes_with_the_gpus_numbers_and_fp8_products():
    """The reference computing as the GPU does (bf16 weights and activations) with FP8 products and the FP8 cache
    together: what tests/gpu/test_kv8.py holds the GPU to."""
    from nllbcli.model.translator import quantize_matrices

    base = load_translator(str(SAMPLE), "cpu")
    weights = {name: bf16_round(w) for name, w in base.engine.w.items()}
    make = lambda w, kv8: Translator(base.config, base.tokenizer, ReferenceEngine(  # noqa: E731
        base.config, w, bf16_activations=True, kv_float8=kv8), "cpu")
    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()[:20]
    options = DecodeOptions(beam_size=1, max_length=48)
    plain = make(weights, False).translate_sentences(texts, "eng_Latn", "ita_Latn", options)
    both = make(quantize_matrices(weights), True).translate_sentences(texts, "eng_Latn", "ita_Latn", options)
    assert sum(a == b for a, b in zip(plain, both)) >= len(texts) - 1


def test_scores_with_the_fp8_cache_are_the_searchs(sample):
    """Forced decoding (nllb score) steps through the same cache as the search: a greedy translation's log-probability
    as the search gave it."""
    fp8 = sample[1]
    sources = [fp8.tokenizer.encode(t, "eng_Latn") for t in (HELDOUT / "eng_Latn.txt").read_text().splitlines()[:10]]
    found = fp8.generate_hypotheses(sources, "fra_Latn", DecodeOptions(beam_size=1, max_length=48, scores=True))
    scored = fp8.generate_hypotheses(sources, "fra_Latn", DecodeOptions(beam_size=1),
                                     targets=[h[0].ids for h in found])
    assert np.abs([a[0].log_prob - b[0].log_prob for a, b in zip(found, scored)]).max() < 1e-4


# -- the option


ARGS = ["translate", "-q", "-m", TINY, "--src", "eng_Latn", "--tgt", "fra_Latn", "--device", "cpu", "--beam-size", "1",
        "--max-length", "8"]
ROWS = [f"The green bicycle number {n} costs forty-five euros. It is blue." for n in range(30)]


def test_the_command_translates_with_the_fp8_cache_on_the_cpu(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(ROWS[:6]) + "\n")
    result = CliRunner().invoke(cli, [*ARGS, "--kv-cache-type", "float8", str(source), str(tmp_path / "out.txt")])
    assert result.exit_code == 0, result.output
    translator = nllbcli.load(TINY, "cpu", kv_cache_type="float8")
    want = nllbcli.translate(translator, ROWS[:6], "eng_Latn", "fra_Latn", DecodeOptions(beam_size=1, max_length=8))
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == [result.text for result in want]


def test_an_unknown_kv_cache_type_is_one_line(tmp_path):
    with pytest.raises(NllbError, match=r"^unknown K/V cache type 'int4': one of bfloat16, float8$"):
        load_translator(TINY, "cpu", kv_cache_type="int4")
    source = tmp_path / "in.txt"
    source.write_text("One.\n")
    result = CliRunner().invoke(cli, [*ARGS, "--kv-cache-type", "int4", str(source), str(tmp_path / "out.txt")])
    assert result.exit_code == 2 and "Invalid value for '--kv-cache-type': 'int4' is not one of 'bfloat16', 'float8'." \
        in result.output
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.parametrize("command", ["translate", "score"])
def test_the_help_names_the_option_beside_the_compute_type(command):
    result = CliRunner().invoke(cli, [command, "--help"])
    assert result.exit_code == 0
    section = result.output[result.output.index("Model, devices and batching:"):]
    at = section.index
    assert at("--compute-type") < at("--kv-cache-type [bfloat16|float8]") < at("--device ")
    assert "FP8 E4M3 with a float32 scale a head" in " ".join(section.split())


def test_the_api_spark_and_ray_data_take_the_kv_cache_type(monkeypatch):
    loaded = nllbcli.load(TINY, "cpu", kv_cache_type="float8")
    assert loaded.kv_cache_type == "float8" and loaded.engine.kv_float8
    record = nllbcli.load(ModelOptions(TINY, device="cpu", kv_cache_type="float8"))
    assert record.kv_cache_type == "float8" and record.engine.kv_float8
    assert nllbcli.load(TINY, "cpu").kv_cache_type == "bfloat16"
    with pytest.raises(TypeError, match=r"^kv_cache_type must be a str, not "):
        nllbcli.load(TINY, "cpu", kv_cache_type=8)
    from nllbcli import spark

    monkeypatch.setattr(spark, "LOADED", {})
    assert spark.loaded(TINY, "cpu", None, "auto", "float8").kv_cache_type == "float8"
    assert spark.loaded(TINY, "cpu", None, "auto").kv_cache_type == "bfloat16"  # another key: loaded apart
    ray_data = pytest.importorskip("nllbcli.ray_data")
    assert ray_data.BatchTranslator(TINY, device="cpu", kv_cache_type="float8").translator.kv_cache_type == "float8"


# -- the job's identity


def identity(kv_cache_type: str) -> dict:
    job = Job("eng_Latn", "fra_Latn", input_format="text", output_format="text")
    return identity_of(job, DecodeOptions(), BatchOptions(), ModelOptions(TINY, None, "bfloat16", "cpu", kv_cache_type))


def test_the_default_cache_leaves_a_jobs_identity_as_it_was():
    """A job's identity names the K/V cache only off the default: a state without the key
    resumes as bfloat16, and a float8 job's differs from both."""
    plain, fp8 = identity("bfloat16"), identity("float8")
    assert "kv_cache_type" not in plain and fp8 == {**plain, "kv_cache_type": "float8"}
    check_same_job(plain, identity("bfloat16"))
    with pytest.raises(NllbError, match=r"^cannot resume: the interrupted job differs in kv_cache_type \(was "
                                        r"'bfloat16', now 'float8'\); run without --resume to start over\.$"):
        check_same_job(plain, fp8)
    translator = load_translator(TINY, "cpu", kv_cache_type="float8")
    job = Job("eng_Latn", "fra_Latn", input_format="text", output_format="text")
    assert job_identity(translator, job, DecodeOptions(), BatchOptions()) == fp8


# -- the pool


L, D, H = 24, 2048, 16  # NLLB-200 3.3B's decoder
GIB = 1 << 30


def test_an_fp8_row_is_a_code_an_element_and_a_scale_a_head():
    assert row_bytes(L, D) == L * 2 * D * 2
    assert row_bytes(L, D, H) == L * 2 * (D + 4 * H)
    plan = PoolPlan(slots=100, cache_rows=41, cross_rows=5000)
    assert plan.nbytes(L, D, H) == ((100 + 1) * 41 + 5000 + 1) * row_bytes(L, D, H)


@pytest.mark.parametrize("beams", [1, 4])
def test_the_same_budget_holds_about_twice_the_rows(beams):
    plain, fp8 = (plan_pool(L, D, 201, 40 * GIB, 1026, beams, fp8_heads=h) for h in (0, H))
    assert fp8.nbytes(L, D, H) <= 40 * GIB + row_bytes(L, D, H) * 202
    ratio = row_bytes(L, D) / row_bytes(L, D, H)  # 2 x 2,048 bf16 bytes against 2,048 codes and 16 scales: 1.94
    assert fp8.slots / plain.slots == pytest.approx(ratio, rel=0.01)
    assert fp8.cross_rows / plain.cross_rows == pytest.approx(ratio, rel=0.01)
    need = PoolPlan(slots=8192 * beams, cache_rows=201, cross_rows=8192 * 50)
    budget = need.nbytes(L, D) // 3
    fits, fits8 = (plan_for_job(L, D, need, budget, None, beams, 1026, fp8_heads=h) for h in (0, H))
    assert fits8.nbytes(L, D, H) <= budget and fits8.slots / fits.slots == pytest.approx(ratio, rel=0.02)


def test_the_activations_bound_counts_the_cross_products_before_they_are_quantized():
    config = PRESETS["nllb-200-3.3B"].config
    assert activation_bytes(config, 1, 100, 41, kv_float8=True) == \
        activation_bytes(config, 1, 100, 41) + 100 * 2 * L * D * 2
    assert activation_bytes(config, 1, 100_000, 41, kv_float8=True) == \
        activation_bytes(config, 1, 100_000, 41) + CROSS_STAGING_BYTES
    assert activation_bytes(config, 16_384, 1, 201, kv_float8=True) == activation_bytes(config, 16_384, 1, 201)


# -- the runners


def test_devices_workers_keep_the_jobs_cache_and_a_job_that_names_another_is_refused(tmp_path):
    from dataclasses import replace

    from nllbcli.job.loop import translate_file
    from nllbcli.runners.devices import host_translator, open_pool

    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()[:8]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    job = Job(src="eng_Latn", tgt="fra_Latn", input=str(tmp_path / "in.txt"), output=str(tmp_path / "out.txt"),
              input_format="text", output_format="text")
    greedy = DecodeOptions(beam_size=1, max_length=32)
    one_device = load_translator(str(SAMPLE), "cpu", kv_cache_type="float8")
    translate_file(one_device, replace(job, output=str(tmp_path / "one.txt")), greedy)
    with open_pool(["cpu"], str(SAMPLE), None, 1, "auto", "float8") as pool:
        assert pool.workers[0].loaded["kv_cache_type"] == "float8"
        host = host_translator(str(SAMPLE), "cpu")
        host.compute_type, host.kv_cache_type = pool.compute_type, "float8"
        translate_file(host, job, greedy, pool=pool)
        assert (tmp_path / "out.txt").read_bytes() == (tmp_path / "one.txt").read_bytes()
        host.kv_cache_type = "bfloat16"
        with pytest.raises(NllbError, match=r"^the worker on cpu keeps its K/V cache in float8, and the job in "
                                            r"bfloat16: load every worker with the job's --kv-cache-type\.$"):
            translate_file(host, replace(job, output=str(tmp_path / "again.txt")), greedy, pool=pool)
    assert not (tmp_path / "again.txt").exists()


def test_the_command_hands_the_cache_type_to_its_devices_workers(tmp_path):
    """--devices cpu:1 --kv-cache-type float8: the one-device job's bytes, and its identity (the recorded state)."""
    import os
    import subprocess
    import sys

    (tmp_path / "in.txt").write_text("\n".join(ROWS[:4]) + "\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    base = [sys.executable, "-m", "nllbcli.cli", "translate", "-q", "-m", TINY, "--src", "eng_Latn", "--tgt",
            "fra_Latn", "--beam-size", "1", "--max-length", "8", "--kv-cache-type", "float8", "in.txt"]
    for where, output in ((["--device", "cpu"], "one.txt"), (["--devices", "cpu:1"], "workers.txt")):
        done = subprocess.run([*base, output, *where], cwd=tmp_path, capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "workers.txt").read_bytes() == (tmp_path / "one.txt").read_bytes()
    recorded = [json.loads((tmp_path / f".{name}.nllb-state.json").read_text())["job"]
                for name in ("one.txt", "workers.txt")]
    assert recorded[0]["kv_cache_type"] == recorded[1]["kv_cache_type"] == "float8"


def test_a_ray_actor_loads_the_jobs_cache_and_checks_it():
    ray = pytest.importorskip("nllbcli.runners.ray")
    model = ModelOptions(TINY, None, "bfloat16", "cpu", "float8")
    job = Job("eng_Latn", "fra_Latn", input_format="jsonl", output_format="jsonl")
    fp8 = identity_of(job, DecodeOptions(), BatchOptions(), model)
    assert ray.load_on_actor(model, None, fp8, "another host").kv_cache_type == "float8"
    plain = identity_of(job, DecodeOptions(), BatchOptions(), ModelOptions(TINY, None, "bfloat16", "cpu"))
    with pytest.raises(NllbError, match=r"^the Ray actor on cpu of .+ keeps its K/V cache in float8, and the job in "
                                        r"bfloat16: load every worker with the job's --kv-cache-type\.$"):
        ray.load_on_actor(model, None, plain, "another host")
