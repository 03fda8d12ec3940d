"""Every NLLB-200 and M2M-100 size on the GPU engine (issue 7).

- Full size: each published shape of bench/shapes.py (NLLB-200 distilled-600M, 1.3B, distilled-1.3B, 3.3B;
  M2M-100 418M, 1.2B) with random weights (no checkpoint needed) translates with greedy and beam search into
  ids of its vocabulary, and a sentence's translation does not depend on its batch.
- Numbers: tiny models with the two head sizes of those shapes (64, and nllb-200-3.3B's 128, which takes
  attention_decode_128_kernel at every decoder step) against the CPU reference: logits and greedy outputs.
- Formats: a pytorch_model.bin model, an M2M-100 model and a LoRA adapter, through the CLI on the GPU,
  against the CPU.

    python -m pytest -q -m gpu tests/gpu/test_sizes.py      # on a GPU machine; skipped elsewhere
"""

import gc
import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

ROOT = Path(__file__).resolve().parents[2]

from nllbcli.model.checkpoint import ModelConfig  # noqa: E402
from nllbcli.model.engine import kernels  # noqa: E402
from nllbcli.model.engine.cuda import CudaEngine  # noqa: E402
from nllbcli.model.engine.reference import ReferenceEngine, bf16_round  # noqa: E402
from nllbcli.options import DecodeOptions  # noqa: E402
from nllbcli.job.rows import cut_source  # noqa: E402
from nllbcli.model.search import generate_ids  # noqa: E402
from nllbcli.model.shapes import PRESETS, random_weights  # noqa: E402
from nllbcli.model.translator import load_translator  # noqa: E402

from checks import teacher_forced_errors  # noqa: E402

POOL_BYTES = 1 << 30  # a few sentences at a time: the KV pool need not take half the GPU


def release_gpu_memory() -> None:
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()


def pool_is_free(engine: CudaEngine) -> bool:
    pool = engine.pool
    return pool.slots.available == pool.plan.slots and pool.cross_runs.available == pool.plan.cross_rows


# ------------------------------------------------------------------------------------------------ full size


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_size_translates_on_the_gpu(name):
    """The full shape on the device (3.3B: 6.7 GB of bf16 weights), four short sources, greedy and 4 beams."""
    preset = PRESETS[name]
    config = preset.config
    weights = random_weights(config, seed=0, scale=0.02, embed_scale=0.02, share_layers=True)
    engine = CudaEngine(config, weights, pool_bytes=POOL_BYTES)
    del weights
    try:
        rng = np.random.default_rng(3)
        sources = [[preset.src_lang_id] + rng.integers(4, preset.pieces, n).tolist() + [config.eos_token_id]
                   for n in (6, 13, 3, 9)]
        for beams in (1, 4):
            options = DecodeOptions(beam_size=beams, max_length=8)
            engine.capacity(options.max_length, beams)
            together = generate_ids(engine, sources, preset.tgt_lang_id, config, options)
            alone = generate_ids(engine, sources[:1], preset.tgt_lang_id, config, options)
            assert len(together) == len(sources)
            for output in together:
                assert isinstance(output, list) and len(output) <= options.max_length - 1, output
                assert all(type(t) is int and 0 <= t < config.vocab_size for t in output), output
                assert config.eos_token_id not in output, output
            assert alone[0] == together[0], (beams, alone[0], together[0])
            assert pool_is_free(engine)
        # the logits themselves: finite over the whole vocabulary after the language token
        encoded = engine.encode(sources[:1])
        state = engine.start(encoded, np.arange(1), 4)
        try:
            engine.step(encoded, state, np.array([config.decoder_start_token_id]), want_logits=False)
            logits = engine.step(encoded, state, np.array([preset.tgt_lang_id]))
        finally:
            engine.release(state)
            engine.release_sources(encoded)
        assert logits.shape == (1, config.vocab_size) and np.isfinite(logits).all()
    finally:
        del engine
        release_gpu_memory()


# ------------------------------------------------------------------------------------------------ numbers


def tiny_config(head_size: int) -> ModelConfig:
    d = 2 * head_size  # two heads
    return ModelConfig(vocab_size=512, d_model=d, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                       decoder_attention_heads=2, encoder_ffn_dim=2 * d, decoder_ffn_dim=2 * d,
                       max_position_embeddings=64)


TINY_LANG = 500  # any id serves as a language token here


@lru_cache(maxsize=None)
def tiny(head_size: int):
    """The reference with the GPU's numbers (bf16 weights, activations rounded where the GPU rounds) and the GPU.

    Each layer its own weights (a layer mixed up with another shows). Weights of deviation 0.1 and an output
    projection of its own: with the embedding tied, the token just fed dominates the residual stream and every
    sentence repeats its language token, which would make the greedy comparison below say nothing."""
    config = tiny_config(head_size)
    weights = random_weights(config, seed=head_size, scale=0.1, embed_scale=0.05, tied=False)
    reference = ReferenceEngine(config, weights, bf16_activations=True)
    return config, reference, CudaEngine(config, weights, pool_bytes=POOL_BYTES)


# Largest logit error relative to the largest logit, as in test_engine.py. Emulated on the CPU (the reference
# again with float64 GEMM sums, rounded at the same places, and with 0 to 64 f32 ulps of noise on every softmax
# and LayerNorm output for the GPU's fast-math): 1e-7 where no bf16 rounding flips, else 3e-3 to 6e-3 over the
# 6 steps, both head sizes. A wrong head split, position, mask, slot or reorder gives errors of order 1. The
# bound is the sample model's in test_engine.py.
TINY_TOLERANCE = 3e-2


@pytest.mark.parametrize("head_size", [64, 128])
def test_head_sizes_logits_match_reference(head_size):
    """Teacher-forced decoder steps over a padded batch, a beam reorder in the middle: test_engine.py's check."""
    config, ref, gpu = tiny(head_size)
    rng = np.random.default_rng(5)
    sources = [[TINY_LANG] + rng.integers(4, 480, n).tolist() + [2] for n in (3, 17, 9)]
    teacher_forced_errors(ref, gpu, sources, rng, 4, 480, f"head size {head_size}", TINY_TOLERANCE)


# The reference's first choice (the token after the language token) is clear when its best logit leads the
# second by a margin. Later choices are not held to one: errors grow over the steps of a random model (tiny-a's
# std-0.5 weights turn one flipped bf16 rounding into 0.2 of the largest logit within five steps,
# test_engine.py), so whole outputs are held to a share of the sentences instead. Emulated as above, first
# choices changed only where the lead was below 0.003 for the tiny models here, and below 0.18 for the
# std-0.5 checkpoints further down (with 64 ulps of noise; below 0.1 with 16).
TINY_MARGIN = 0.05
CHECKPOINT_MARGIN = 0.25


def first_choice_lead(reference: ReferenceEngine, config: ModelConfig, source: list[int], lang: int) -> float:
    """How far the reference's best first token leads the second, in logits."""
    encoded = reference.encode([source])
    state = reference.start(encoded, np.arange(1), 2)
    reference.step(encoded, state, np.array([config.decoder_start_token_id]), want_logits=False)
    top2 = np.sort(reference.step(encoded, state, np.array([lang]))[0])[-2:]
    return float(top2[1] - top2[0])


def check_agreement(reference, config: ModelConfig, sources, lang: int, want, got, margin: float,
                    share: float) -> None:
    """The GPU's outputs `got` against the reference's `want`: the same first token (</s> for an empty output)
    wherever the reference's first choice leads by `margin`, and the same whole output on `share` of them."""

    def first(ids: list[int]) -> int:
        return ids[0] if ids else config.eos_token_id

    clear = []
    for i, (source, a, b) in enumerate(zip(sources, want, got)):
        if first(a) != first(b):
            lead = first_choice_lead(reference, config, source, lang)
            print(f"sentence {i}: first tokens {first(a)} (reference), {first(b)} (GPU); reference lead {lead:.4f}")
            clear += [(i, round(lead, 4))] if lead >= margin else []
    same = sum(a == b for a, b in zip(want, got))
    print(f"{same} of {len(want)} outputs the same")
    assert not clear, f"first tokens differ where the reference's choice was clear (sentence, lead): {clear}"
    assert same >= share * len(want), [(a, b) for a, b in zip(want, got) if a != b][:5]


@pytest.mark.parametrize("head_size", [64, 128])
def test_head_sizes_greedy_translations_match_reference(head_size, monkeypatch):
    """32 sources, 11 generated tokens each: the decode attention kernel of the head size runs at every one."""
    config, ref, gpu = tiny(head_size)
    launched = set()
    lookup = kernels.function

    def function(file, kernel, *args, **defines):  # every launcher looks its kernel up through this
        launched.add(kernel)
        return lookup(file, kernel, *args, **defines)

    monkeypatch.setattr(kernels, "function", function)
    rng = np.random.default_rng(7)
    sources = [[TINY_LANG] + rng.integers(4, 480, n).tolist() + [2] for n in rng.integers(3, 30, 32)]
    options = DecodeOptions(beam_size=1, max_length=12)
    gpu.capacity(options.max_length)
    want = generate_ids(ref, sources, TINY_LANG + 1, config, options)
    got = generate_ids(gpu, sources, TINY_LANG + 1, config, options)
    assert len({tuple(w) for w in want}) > len(want) // 2  # the outputs depend on the source
    # Emulated on the CPU: 32 and 30 of 32 the same (head sizes 64 and 128), 29 at worst with noise.
    # test_engine.py asks 99% of a trained model's translations; random ones have more near-ties, hence 75%.
    check_agreement(ref, config, sources, TINY_LANG + 1, want, got, margin=TINY_MARGIN, share=0.75)
    assert pool_is_free(gpu)
    assert f"attention_decode_{head_size}_kernel" in launched, sorted(launched)


# ------------------------------------------------------------------------------------------------ formats

MODELS = ROOT / "tests" / "models"
HELDOUT = ROOT / "data" / "samples" / "heldout"
MAX_LENGTH = 8

FORMATS = [  # model, adapter, --src, --tgt
    ("tiny-bin", None, "eng_Latn", "fra_Latn"),  # pytorch_model.bin (float32), read without PyTorch
    ("tiny-m2m", None, "en", "fr"),  # M2M-100: vocab.json tokenizer, __xx__ language tokens, 4 and 2 heads
    ("tiny-a", "tiny-a-lora", "eng_Latn", "fra_Latn"),  # a PEFT LoRA adapter merged at load (--adapter)
]


def load_with_gpu_numbers(model: str, adapter: str | None):
    """The CPU translator the CLI would load (load_translator: checkpoint, adapter merge, tokenizer), its
    reference engine given the GPU's numbers: bf16 weights, activations rounded where the GPU rounds."""
    translator = load_translator(model, "cpu", adapter)
    rounded = {name: bf16_round(w) for name, w in translator.engine.w.items()}
    translator.engine = ReferenceEngine(translator.config, rounded, bf16_activations=True)
    return translator


def gpu_matrices(engine: CudaEngine) -> dict[str, np.ndarray]:
    """The weight matrices the GPU engine holds, under their checkpoint names (the fused ones split)."""
    host = lambda a: cp.asnumpy(a.astype(cp.float32))  # noqa: E731
    out = {}
    for side, layers in (("encoder", engine.encoder), ("decoder", engine.decoder)):
        for i, layer in enumerate(layers):
            p = f"{side}.layers.{i}."
            for proj, w in zip("qkv", np.split(host(layer["self_qkv_w"]), 3)):
                out[f"{p}self_attn.{proj}_proj.weight"] = w
            out[p + "self_attn.out_proj.weight"] = host(layer["self_out_w"])
            out[p + "fc1.weight"], out[p + "fc2.weight"] = host(layer["fc1_w"]), host(layer["fc2_w"])
            if side == "decoder":
                out[p + "encoder_attn.q_proj.weight"] = host(layer["cross_q_w"])
                out[p + "encoder_attn.out_proj.weight"] = host(layer["cross_out_w"])
    for i, (k, v) in enumerate(zip(*[iter(np.split(host(engine.cross_w), 2 * len(engine.decoder)))] * 2)):
        out[f"decoder.layers.{i}.encoder_attn.k_proj.weight"], out[f"decoder.layers.{i}.encoder_attn.v_proj.weight"] = k, v
    return out


# tiny-a's family (tiny-bin holds its weights as a .bin; tiny-a-lora adapts it) has float32 weights of std 0.5:
# rounded to bf16 it is another model, and it is chaotic: on the CPU, noise of 1e-7 on its weights moves the
# first step's logits by 0.2-4% of the largest; the GPU's (another summation order, fast-math exp and rsqrt)
# by 4-30%, the same before and after this session's kernel changes (H200, 2026-11-30). So its GPU
# translations are not held to the CPU's: first tokens differed on 14 of 48 held-out sentences, some with a
# lead of 0.35 on the CPU. What is held is exact: the .bin gives the GPU the very translations tiny-a's
# safetensors give it, and every matrix the adapter touches reaches the GPU merged, as the CPU merges it.


@pytest.mark.parametrize("model,adapter,src,tgt", FORMATS)
def test_checkpoint_formats_translate_on_the_gpu(model, adapter, src, tgt, tmp_path):
    """Greedy translations of 48 held-out sentences on the GPU, loaded as the CLI loads (load_translator,
    --adapter merged): tiny-m2m against the CPU with the GPU's numbers (check_agreement); tiny-bin exactly as
    tiny-a (the same weights); tiny-a with its adapter through the matrices the GPU holds (see above). And `nllb
    translate --device cuda` writes exactly the GPU's translations."""
    from click.testing import CliRunner

    from nllbcli.cli import cli

    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()[:48]
    model_dir, adapter_dir = str(MODELS / model), adapter and str(MODELS / adapter)
    options = DecodeOptions(beam_size=1, max_length=MAX_LENGTH)
    gpu = load_translator(model_dir, "cuda", adapter_dir)
    cpu = load_with_gpu_numbers(model_dir, adapter_dir)
    sources = [cut_source(cpu.tokenizer.encode(t, src), cpu.config.max_position_embeddings) for t in texts]
    got = gpu.generate(sources, tgt, options)
    lang = cpu.tokenizer.lang_id(tgt)
    if model == "tiny-m2m":
        want = cpu.generate(sources, tgt, options)
        check_agreement(cpu.engine, cpu.config, sources, lang, want, got, margin=CHECKPOINT_MARGIN, share=0.5)
    elif model == "tiny-bin":
        same_weights = load_translator(str(MODELS / "tiny-a"), "cuda")
        assert same_weights.generate(sources, tgt, options) == got
        del same_weights
    else:
        held = gpu_matrices(gpu.engine)
        plain = load_translator(model_dir, "cpu").engine.w
        assert held.keys() <= cpu.engine.w.keys()
        for name, w in held.items():
            assert np.array_equal(w, cpu.engine.w[name]), name  # the CPU's merge, rounded to bf16 as the GPU holds it
        adapted = [name for name in held if not np.array_equal(cpu.engine.w[name], bf16_round(plain[name]))]
        assert len(adapted) >= 4, adapted  # the adapter changes the matrices it targets

    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"  # JSONL: a translation may hold any character
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    args = ["translate", "--src", src, "--tgt", tgt, "--model", model_dir, "--device", "cuda", "--beam-size", "1",
            "--max-length", str(MAX_LENGTH), "--no-split", "-q", str(source), str(output)]
    result = CliRunner().invoke(cli, args + (["--adapter", adapter_dir] if adapter else []))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in output.read_text(encoding="utf-8").split("\n") if line]
    assert [row["text"] for row in rows] == texts
    # the CLI batches by length, and a translation does not depend on its batch (test_engine.py): the same ids
    assert [row["translation"] for row in rows] == [gpu.tokenizer.decode(ids) for ids in got]
    del gpu
    release_gpu_memory()
