"""Model directories: config.json, safetensors in every supported form, and what users are told when it is wrong."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from nllbcli.model.checkpoint import ModelConfig, load_checkpoint, read_safetensors, resolve_model_dir, write_safetensors
from nllbcli.errors import NllbError
from nllbcli.options import DecodeOptions
from nllbcli.model.translator import load_translator

HERE = Path(__file__).parent
TINY_A = HERE / "models" / "tiny-a"
TINY_B = HERE / "models" / "tiny-b"


def copy_model(src: Path, dst: Path, weights: dict | None = None, dtype: str = "F32") -> Path:
    """A copy of a test model's directory, its weights rewritten as one safetensors file of `dtype`."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if "safetensors" not in f.name:
            shutil.copy(f, dst)
    if weights is None:
        weights = {}
        for f in src.glob("*.safetensors"):
            weights.update(read_safetensors(f))
    write_safetensors(dst / "model.safetensors", weights, dtype)
    return dst


def stored_weights(model_dir: Path) -> dict:
    weights = {}
    for f in model_dir.glob("*.safetensors"):
        weights.update(read_safetensors(f))
    return weights


def test_every_dimension_comes_from_config_json():
    config, weights = load_checkpoint(TINY_B)
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (48, 1, 3)
    assert (config.encoder_attention_heads, config.decoder_attention_heads) == (2, 6)
    assert (config.encoder_ffn_dim, config.decoder_ffn_dim) == (80, 112)
    assert weights["decoder.layers.2.fc1.weight"].shape == (112, 48)
    assert weights["encoder.layers.0.fc1.weight"].shape == (80, 48)
    assert all(w.dtype == np.float32 for w in weights.values())


def test_bfloat16_shards_load_exactly():
    """tiny-b is stored as bfloat16 in two shards: every value must come back exactly as float32."""
    _, weights = load_checkpoint(TINY_B)
    index = json.loads((TINY_B / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2
    for name, w in weights.items():
        assert not (w.view(np.uint32) & 0xFFFF).any(), name  # bf16 values have empty low halves


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_float32_float16_and_bfloat16_checkpoints_load_the_same_values(tmp_path, dtype):
    """The same weights stored three ways load to the same floats (after rounding) and the loader keeps them."""
    _, reference = load_checkpoint(TINY_B)  # bf16 values: exact in every one of the three dtypes
    stored = {k: v for k, v in stored_weights(TINY_B).items()}
    model = copy_model(TINY_B, tmp_path / dtype, stored, dtype)
    _, loaded = load_checkpoint(model)
    for name in reference:
        if dtype == "F16":
            np.testing.assert_allclose(loaded[name], reference[name], rtol=1e-3, atol=1e-4)
        else:
            np.testing.assert_array_equal(loaded[name], reference[name])


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_bf16_bits_for_the_gpu_from_a_bf16_checkpoint_only(tmp_path, dtype):
    """load_checkpoint(bf16_bits=True): a bf16 checkpoint's weights as their bits (uint16), the values of the
    float32 load exactly, the tied embedding still one array; any other checkpoint as float32, as without."""
    from nllbcli.model.checkpoint import bf16_to_float32

    _, reference = load_checkpoint(TINY_B)
    model = copy_model(TINY_B, tmp_path / dtype, stored_weights(TINY_B), dtype)
    _, loaded = load_checkpoint(model, bf16_bits=True)
    _, floats = load_checkpoint(model)
    assert loaded.keys() == reference.keys()
    for name, array in loaded.items():
        assert array.dtype == (np.uint16 if dtype == "BF16" else np.float32), name
        np.testing.assert_array_equal(bf16_to_float32(array) if dtype == "BF16" else array, floats[name])
    if dtype == "BF16":
        _, tied = load_checkpoint(TINY_A, bf16_bits=True)  # F32 on disk: floats
        assert tied["lm_head.weight"].dtype == np.float32


def test_bf16_bits_of_a_mixed_checkpoint_are_floats(tmp_path):
    """A checkpoint holding bf16 and float32 tensors comes as float32 throughout, even asked for bits."""
    from nllbcli.model.checkpoint import read_safetensors_header

    model = copy_model(TINY_B, tmp_path / "m", stored_weights(TINY_B), "BF16")
    names = sorted(read_safetensors_header(model / "model.safetensors")[0])
    (model / "model.safetensors").unlink()
    weights = stored_weights(TINY_B)
    shards = {"a.safetensors": ("F32", names[: len(names) // 2]), "b.safetensors": ("BF16", names[len(names) // 2 :])}
    for file, (dtype, part) in shards.items():
        write_safetensors(model / file, {n: weights[n] for n in part}, dtype)
    index = {"weight_map": {n: file for file, (_, part) in shards.items() for n in part}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    _, loaded = load_checkpoint(model, bf16_bits=True)
    assert {a.dtype for a in loaded.values()} == {np.dtype(np.float32)}


def test_tied_embedding_stored_once_or_under_every_name():
    _, once = load_checkpoint(TINY_A)
    assert "model.shared.weight" in json.dumps(list(stored_weights(TINY_A)))
    assert not any("embed_tokens" in n or "lm_head" in n for n in stored_weights(TINY_A))
    assert once["lm_head.weight"] is once["encoder.embed_tokens.weight"] is once["decoder.embed_tokens.weight"]
    names = set(stored_weights(TINY_B))
    assert {"model.shared.weight", "lm_head.weight", "model.encoder.embed_tokens.weight"} <= names


def test_names_without_the_model_prefix_load(tmp_path):
    """Checkpoints saved from M2M100Model (not ...ForConditionalGeneration) have no `model.` prefix."""
    weights = {k.removeprefix("model."): v for k, v in stored_weights(TINY_A).items()}
    model = copy_model(TINY_A, tmp_path / "bare", weights)
    options = DecodeOptions(beam_size=2, max_length=8)
    texts = ["Hello world!"]
    assert load_translator(str(model), "cpu").translate_sentences(texts, "eng_Latn", "fra_Latn", options) == \
        load_translator(str(TINY_A), "cpu").translate_sentences(texts, "eng_Latn", "fra_Latn", options)


def test_missing_config_is_explained(tmp_path):
    with pytest.raises(NllbError, match="no config.json"):
        load_checkpoint(tmp_path)


def test_pytorch_only_directory_loads_and_a_bad_bin_is_explained(tmp_path):
    """A directory with only pytorch_model.bin loads (tests/test_torchbin.py); one that is not a checkpoint says so."""
    shutil.copy(TINY_A / "config.json", tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"\0")
    with pytest.raises(NllbError, match=r"pytorch_model.bin is not a PyTorch checkpoint"):
        load_checkpoint(tmp_path)


def test_no_weights_is_explained(tmp_path):
    shutil.copy(TINY_A / "config.json", tmp_path)
    with pytest.raises(NllbError, match="no model.safetensors"):
        load_checkpoint(tmp_path)


def test_missing_shard_is_named(tmp_path):
    shutil.copytree(TINY_B, tmp_path / "m")
    (tmp_path / "m" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(NllbError, match="model-00002-of-00002.safetensors"):
        load_checkpoint(tmp_path / "m")


def test_missing_tensor_is_named(tmp_path):
    weights = stored_weights(TINY_A)
    del weights["model.decoder.layers.1.fc2.bias"]
    with pytest.raises(NllbError, match="decoder.layers.1.fc2.bias"):
        load_checkpoint(copy_model(TINY_A, tmp_path / "m", weights))


def test_config_that_does_not_match_the_weights_is_refused(tmp_path):
    model = copy_model(TINY_A, tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    config["decoder_ffn_dim"] = 100
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(NllbError, match=r"fc1.weight has shape \(96, 64\) but config.json implies \(100, 64\)"):
        load_checkpoint(model)


def test_other_architectures_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(NllbError, match="'t5' model"):
        load_checkpoint(tmp_path)


def test_corrupt_safetensors_is_explained(tmp_path):
    model = copy_model(TINY_A, tmp_path / "m")
    (model / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(NllbError, match="not a readable safetensors file"):
        load_checkpoint(model)


def test_config_defaults_are_m2m100s():
    assert ModelConfig().vocab_size == 128112 and ModelConfig().scale_embedding
    assert ModelConfig(d_model=1024).embed_scale == 32.0


def test_hub_id_is_found_in_the_local_cache_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--facebook--nllb-tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    shutil.copytree(TINY_A, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    assert resolve_model_dir("facebook/nllb-tiny") == snapshot
    with pytest.raises(NllbError, match=r"^no model facebook/nllb-other in the Hugging Face cache: pass -m DIR"):
        resolve_model_dir("facebook/nllb-other")


def test_missing_directory_is_explained(tmp_path):
    with pytest.raises(NllbError, match="does not exist"):
        resolve_model_dir(str(tmp_path / "nowhere"))
