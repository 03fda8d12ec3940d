"""LoRA adapters (--adapter): a PEFT adapter for tiny-a merged at load, against PeftModel's `generate` with the
adapter unmerged (goldens: tools/make_lora_fixtures.py)."""

import json
import shutil
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from nllbcli.model.checkpoint import load_checkpoint, read_safetensors, write_safetensors
from nllbcli.cli import cli
from nllbcli.errors import NllbError
from nllbcli.model.lora import merge_lora
from nllbcli.options import DecodeOptions
from nllbcli.model.translator import load_translator

HERE = Path(__file__).parent
BASE = HERE / "models" / "tiny-a"
ADAPTER = HERE / "models" / "tiny-a-lora"


@lru_cache(maxsize=None)
def golden():
    return json.loads((HERE / "golden" / "tiny-a-lora.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def translator():
    return load_translator(str(BASE), "cpu", str(ADAPTER))


@pytest.mark.parametrize("index", range(len(golden()["generate"])), ids=lambda i: f"case{i}")
def test_merged_adapter_matches_peft_generate(index):
    case = golden()["generate"][index]
    tr = translator()
    sources = [tr.tokenizer.encode(t, case["src_lang"]) for t in case["texts"]]
    outputs = tr.generate(sources, case["tgt_lang"], DecodeOptions(beam_size=case["beam_size"], max_length=case["max_length"]))
    assert outputs == case["output_ids"]


def test_the_adapter_changes_the_translations():
    case = golden()["generate"][0]
    base = load_translator(str(BASE), "cpu")
    sources = [base.tokenizer.encode(t, case["src_lang"]) for t in case["texts"]]
    assert base.generate(sources, case["tgt_lang"], DecodeOptions(beam_size=1, max_length=24)) != case["output_ids"]


def test_merge_follows_rank_and_alpha_patterns():
    config, weights = load_checkpoint(BASE)
    merged = merge_lora(config, weights, ADAPTER)
    lora = read_safetensors(ADAPTER / "adapter_model.safetensors")
    prefix = "base_model.model.model."
    for module, scale in (("encoder.layers.0.fc1", 8 / 2),  # rank_pattern fc1: 2
                          ("decoder.layers.1.encoder_attn.v_proj", 3.0 / 4),  # alpha_pattern encoder_attn.v_proj: 3
                          ("decoder.layers.1.self_attn.v_proj", 8 / 4)):  # the defaults, r 4 and alpha 8
        a, b = lora[prefix + module + ".lora_A.weight"], lora[prefix + module + ".lora_B.weight"]
        np.testing.assert_allclose(merged[module + ".weight"], weights[module + ".weight"] + scale * (b @ a), rtol=1e-6, atol=1e-6)
    assert merged["lm_head.weight"] is weights["lm_head.weight"]  # untouched weights are not copied
    assert merged["encoder.layers.0.fc1.bias"] is weights["encoder.layers.0.fc1.bias"]


def test_translate_with_adapter_through_the_cli():
    case = golden()["generate"][0]
    tr = translator()
    expected = [tr.tokenizer.decode(ids) for ids in case["output_ids"]]
    result = CliRunner().invoke(cli, ["translate", "-q", "--device", "cpu", "--model", str(BASE), "--adapter", str(ADAPTER),
                                      "--src", "en", "--tgt", "fr", "--beam-size", "1", "--max-length", "24", "--no-split"],
                                input="".join(t + "\n" for t in case["texts"]))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == expected


def copy_adapter(tmp_path: Path, **changes) -> Path:
    out = tmp_path / "adapter"
    shutil.copytree(ADAPTER, out)
    config = json.loads((out / "adapter_config.json").read_text())
    config.update(changes)
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("changes,message", [
    ({"peft_type": "IA3"}, "peft_type is 'IA3'; nllbcli applies LoRA adapters (peft_type LORA) only"),
    ({"use_dora": True}, "the adapter uses DoRA (use_dora), which nllbcli does not apply"),
    ({"bias": "all"}, "the adapter uses trained biases (bias/lora_bias), which nllbcli does not apply"),
    ({"modules_to_save": ["lm_head"]}, "the adapter uses modules_to_save, which nllbcli does not apply"),
])
def test_unsupported_adapters_are_refused(tmp_path, changes, message):
    adapter = copy_adapter(tmp_path, **changes)
    result = CliRunner().invoke(cli, ["translate", "--device", "cpu", "--model", str(BASE), "--adapter", str(adapter),
                                      "--src", "en", "--tgt", "fr"], input="Hello\n")
    assert result.exit_code == 1
    assert message in result.output and len(result.output.splitlines()) == 1
    assert "Traceback" not in result.output


def test_an_adapter_for_another_model_is_refused(tmp_path):
    with pytest.raises(NllbError, match=r"do not fit its weight \(32, 32\): the adapter was trained for a model of other dimensions"):
        load_translator(str(HERE / "models" / "tiny-m2m"), "cpu", str(ADAPTER))


def test_a_module_the_model_lacks_is_refused(tmp_path):
    adapter = copy_adapter(tmp_path)
    lora = read_safetensors(adapter / "adapter_model.safetensors")
    lora = {k.replace("encoder.layers.0.fc1", "encoder.layers.7.fc1"): v for k, v in lora.items()}
    write_safetensors(adapter / "adapter_model.safetensors", lora, "F32")
    with pytest.raises(NllbError, match=r"changes encoder.layers.7.fc1, which this model does not have"):
        load_translator(str(BASE), "cpu", str(adapter))


def test_missing_adapter_files(tmp_path):
    result = CliRunner().invoke(cli, ["translate", "--device", "cpu", "--model", str(BASE), "--adapter", str(tmp_path),
                                      "--src", "en", "--tgt", "fr"], input="Hello\n")
    assert result.exit_code == 1
    assert result.output == f"Error: --adapter {tmp_path} has no adapter_config.json: it is not a PEFT adapter directory\n"
    (tmp_path / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4, "lora_alpha": 8}')
    result = CliRunner().invoke(cli, ["translate", "--device", "cpu", "--model", str(BASE), "--adapter", str(tmp_path),
                                      "--src", "en", "--tgt", "fr"], input="Hello\n")
    assert result.output == f"Error: --adapter {tmp_path} has no adapter_model.safetensors (nor adapter_model.bin)\n"
