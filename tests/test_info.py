"""`nllb info`: family, dimensions, dtype, parameters and GPU memory from config.json and weight headers only."""

import json
import math
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from nllbcli.cli import cli
from nllbcli.model.info import inspect_model

HERE = Path(__file__).parent
MODELS = HERE / "models"


def test_tiny_m2m_is_described_exactly():
    result = CliRunner().invoke(cli, ["info", str(MODELS / "tiny-m2m")])
    assert result.exit_code == 0, result.output
    assert result.output == f"""\
Model:       {MODELS / "tiny-m2m"}
Family:      M2M-100 (100 languages)
Dimensions:  d_model 32, 2 encoder + 2 decoder layers, heads 4/2 (head_dim 8/16), FFN 64/48, vocab 607, 64 positions, relu
Weights:     pytorch_model.bin (263.77 KiB), stored as float32
Parameters:  60,224 (0.1M)
GPU memory:  129.56 KiB for the weights (matrices in bf16, biases and norms in float32), plus the CUDA context; 79.34 KiB with --compute-type float8 (matrices in FP8 E4M3 with a float32 scale a row)
KV pool:     on top of the weights, sized for each batch (its sentences, the tokens they can reach, their source tokens) within the GPU memory left free; each sequence (each beam) of --max-length 200 takes 50.25 KiB, each source token 256 B (31.41 KiB and 160 B with --kv-cache-type float8)
CPU memory:  235.25 KiB while loading (the weights are read as float32)
"""


@pytest.mark.parametrize("name,family,dtype,parameters", [
    ("tiny-a", "NLLB-200", "float32", 231_680),  # the tied embedding stored once
    ("tiny-b", "NLLB-200", "bfloat16", 131_936),  # stored under all four names, counted once
    ("tiny-bin", "NLLB-200", "float32", 231_680),
    ("tiny-bin-sharded", "NLLB-200", "bfloat16", 231_680),
    ("tiny-m2m", "M2M-100", "float32", 60_224),  # transformers' sum(p.numel() for p in model.parameters())
])
def test_families_dtypes_and_parameter_counts(name, family, dtype, parameters):
    facts = inspect_model(str(MODELS / name))
    assert (facts.family, facts.dtypes, facts.parameters) == (family, [dtype], parameters)


def test_info_reads_no_weights(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a weight was read")

    monkeypatch.setattr("nllbcli.model.checkpoint.read_safetensors", refuse)
    monkeypatch.setattr("nllbcli.model.torchbin.read_torch_bin", refuse)
    monkeypatch.setattr("nllbcli.model.torchbin.TorchCheckpoint.array", refuse)
    for name in ("tiny-a", "tiny-bin", "tiny-m2m"):
        assert inspect_model(str(MODELS / name)).parameters > 0


def full_size_dir(tmp_path: Path, d: int, layers: int, ffn: int, vocab: int, tokenizer_from: str) -> Path:
    """A model directory with a full-size config and a safetensors file that is a header and a hole: info must not
    need the data (the file is gigabytes long, sparse: nothing of it is written or read)."""
    shapes = {"model.shared.weight": [vocab, d]}
    for side in ("encoder", "decoder"):
        for i in range(layers):
            p = f"model.{side}.layers.{i}."
            attns = ["self_attn"] + (["encoder_attn"] if side == "decoder" else [])
            for attn in attns:
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    shapes[p + f"{attn}.{proj}.weight"], shapes[p + f"{attn}.{proj}.bias"] = [d, d], [d]
                shapes[p + f"{attn}_layer_norm.weight"], shapes[p + f"{attn}_layer_norm.bias"] = [d], [d]
            shapes[p + "fc1.weight"], shapes[p + "fc1.bias"] = [ffn, d], [ffn]
            shapes[p + "fc2.weight"], shapes[p + "fc2.bias"] = [d, ffn], [d]
            shapes[p + "final_layer_norm.weight"], shapes[p + "final_layer_norm.bias"] = [d], [d]
        shapes[f"model.{side}.layer_norm.weight"], shapes[f"model.{side}.layer_norm.bias"] = [d], [d]
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        f.truncate(8 + len(encoded) + offset)  # the data's length, as a hole: the offsets are inside the file
    config = {"model_type": "m2m_100", "vocab_size": vocab, "d_model": d, "encoder_layers": layers, "decoder_layers": layers,
              "encoder_ffn_dim": ffn, "decoder_ffn_dim": ffn, "encoder_attention_heads": 16, "decoder_attention_heads": 16}
    (tmp_path / "config.json").write_text(json.dumps(config))
    src = MODELS / tokenizer_from
    for f in src.iterdir():
        if f.name in ("sentencepiece.bpe.model", "tokenizer.json", "vocab.json", "tokenizer_config.json"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    return tmp_path


@pytest.mark.parametrize("d,layers,ffn,vocab,tokenizer,parameters,known", [
    (1024, 12, 4096, 256206, "tiny-a", 615_073_792, "nllb-200-distilled-600M"),
    (2048, 24, 8192, 256206, "tiny-a", 3_344_863_232, "nllb-200-3.3B"),
    (1024, 12, 4096, 128112, "tiny-m2m", 483_905_536, "m2m100_418M"),
])
def test_full_size_counts_match_transformers(tmp_path, d, layers, ffn, vocab, tokenizer, parameters, known):
    """Parameter counts as transformers gives them for M2M100ForConditionalGeneration of these shapes."""
    facts = inspect_model(str(full_size_dir(tmp_path, d, layers, ffn, vocab, tokenizer)))
    assert facts.parameters == parameters
    assert facts.known_as == known
    # bf16 matrices + float32 vectors + the float32 position table: a little over 2 bytes a parameter
    assert 2 * parameters < facts.gpu_weight_bytes < 2.02 * parameters
    assert facts.kv_bytes_per_sequence == layers * 2 * 201 * d * 2
    heads = facts.config["decoder_attention_heads"]
    assert facts.kv_bytes_per_sequence_float8 == layers * 2 * 201 * (d + heads * 4)  # a code an element, a scale a head


def test_600m_gpu_line(tmp_path):
    result = CliRunner().invoke(cli, ["info", str(full_size_dir(tmp_path, 1024, 12, 4096, 256206, "tiny-a"))])
    assert result.exit_code == 0, result.output
    assert "Family:      NLLB-200 (202 languages), the shape of nllb-200-distilled-600M\n" in result.output
    assert "Parameters:  615,073,792 (615.1M)\n" in result.output
    assert "GPU memory:  1.15 GiB for the weights" in result.output
    assert "each sequence (each beam) of --max-length 200 takes 9.42 MiB, each source token 48.00 KiB" in result.output


def test_json_output():
    result = CliRunner().invoke(cli, ["info", "--json", "--max-length", "100", str(MODELS / "tiny-a")])
    assert result.exit_code == 0
    facts = json.loads(result.output)
    assert facts["family"] == "NLLB-200" and facts["parameters"] == 231_680 and facts["max_length"] == 100
    assert facts["config"]["d_model"] == 64


def test_errors_are_one_line(tmp_path):
    result = CliRunner().invoke(cli, ["info", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output == f"Error: {tmp_path} has no config.json: it is not a model directory in the Hugging Face layout\n"
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    result = CliRunner().invoke(cli, ["info", str(tmp_path)])
    assert result.exit_code == 1 and "nllbcli runs NLLB-200 and M2M-100 models" in result.output
    (tmp_path / "config.json").write_text('{"model_type": "m2m_100"}')
    result = CliRunner().invoke(cli, ["info", str(tmp_path)])
    assert result.exit_code == 1 and result.output.startswith(f"Error: {tmp_path} has no weights:")
    assert "Traceback" not in result.output


def test_weights_without_a_tokenizer_are_described_with_a_note(tmp_path):
    """A directory of weights alone is described; tokenizer files that are there must load (tests/test_model_files.py)."""
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((MODELS / "tiny-a" / name).read_bytes())
    result = CliRunner().invoke(cli, ["info", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "Family:      NLLB-200 (languages unknown)\n" in result.output
    assert result.output.endswith(
        "Note:        the directory has no sentencepiece.bpe.model: the languages are unknown, and translate needs it\n")
