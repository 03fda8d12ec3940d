"""--compute-type float8 on the CPU side: `nllb convert --compute-type float8` stores every matrix in E4M3 with its
scales, a converted model loads without quantizing again, the reference engine's FP8 products, the choice of
compute type (auto, bfloat16, float8) and its one-line refusals, the resume identity, `nllb info`'s figure.
(The GPU's FP8 kernels and engine: tests/gpu/test_fp8_kernels.py, tests/gpu/test_float8_engine.py.)"""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from nllbcli.model import translator as translator_module
from nllbcli.model.checkpoint import load_checkpoint, read_safetensors_header
from nllbcli.cli import cli
from nllbcli.model.convert import FLOAT8_CONFIG, convert_model
from nllbcli.model.engine import numerics
from nllbcli.model.engine.numerics import E4M3Matrix, dequantize_e4m3, quantize_e4m3
from nllbcli.model.engine.reference import ReferenceEngine, linear
from nllbcli.errors import NllbError
from nllbcli.options import DecodeOptions
from nllbcli.model.translator import Translator, expected_compute_type, load_translator, quantize_matrices, uses_float8

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"
TINY = ROOT / "tests" / "models" / "tiny-b"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return convert_model(str(SAMPLE), tmp_path_factory.mktemp("fp8") / "model", float8=True)


def test_a_converted_model_stores_every_matrix_in_e4m3_with_its_scales(converted):
    header, _ = read_safetensors_header(converted / "model.safetensors")
    matrices = {name for name, t in header.items() if len(t["shape"]) == 2 and not name.endswith("_scale")}
    assert matrices and all(header[name]["dtype"] == "F8_E4M3" for name in matrices)
    assert "model.shared.weight" in matrices and "lm_head.weight" not in header  # the tied embedding once
    for name in matrices:
        rows = header[name]["shape"][0]
        assert header[name + "_scale"] == {**header[name + "_scale"], "dtype": "F32", "shape": [rows, 1]}
    assert {t["dtype"] for name, t in header.items() if name not in matrices and not name.endswith("_scale")} == {"BF16"}
    config = json.loads((converted / "config.json").read_text())
    assert config["quantization_config"] == FLOAT8_CONFIG
    assert (converted / "model.safetensors").stat().st_size < 0.55 * (SAMPLE / "model.safetensors").stat().st_size


def test_a_converted_model_loads_its_codes_without_quantizing_again(converted, monkeypatch):
    _, original = load_checkpoint(SAMPLE)
    monkeypatch.setattr(numerics, "quantize_e4m3", lambda *a, **k: pytest.fail("quantized again"))
    config, weights = load_checkpoint(converted, float8=True)
    monkeypatch.undo()
    for name, w in weights.items():
        if isinstance(w, E4M3Matrix):
            codes, scales = quantize_e4m3(original[name])  # what the conversion made from the float weights
            assert (w.codes == codes).all() and (w.scales == scales).all(), name
    assert all(isinstance(w, E4M3Matrix) == (np.ndim(original[name]) == 2) for name, w in weights.items())
    assert weights["encoder.embed_tokens.weight"] is weights["decoder.embed_tokens.weight"] is weights["lm_head.weight"]
    _, values = load_checkpoint(converted)  # without float8: the matrices' values, as float32
    fc1 = "encoder.layers.0.fc1.weight"
    assert values[fc1].dtype == np.float32 and np.array_equal(values[fc1], weights[fc1].dequantize())


def test_a_float_checkpoint_quantized_on_the_host_is_what_convert_stores(converted):
    _, stored = load_checkpoint(converted, float8=True)
    _, floats = load_checkpoint(SAMPLE, bf16_bits=True)
    made = quantize_matrices(floats)
    for name, w in made.items():
        if isinstance(w, E4M3Matrix):
            assert (w.codes == stored[name].codes).all() and (w.scales == stored[name].scales).all()
    assert made["encoder.embed_tokens.weight"] is made["lm_head.weight"]
    _, unconverted = load_checkpoint(SAMPLE, float8=True)  # float matrices stay floats: the GPU quantizes them
    assert not any(isinstance(w, E4M3Matrix) for w in unconverted.values())


FC1, FC2 = "model.encoder.layers.0.fc1.weight_scale", "model.encoder.layers.0.fc2.weight_scale"


@pytest.mark.parametrize("renames, message", [
    ({FC1: FC1[:-1] + "X"}, "without its scales"),
    ({FC1: FC2, FC2: FC1}, "must hold a float a row"),  # fc2's 256 scales named fc1's, whose matrix has 1,024 rows
])
def test_an_e4m3_matrix_without_its_scales_is_refused_in_one_line(tmp_path, converted, renames, message):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in converted.iterdir():
        data = f.read_bytes()
        if f.name == "model.safetensors":  # names of the same length: the header keeps its size
            placeholders = {old: f"@{n}@".ljust(len(old), "@") for n, old in enumerate(renames)}
            for old, mark in placeholders.items():
                data = data.replace(f'"{old}"'.encode(), f'"{mark}"'.encode(), 1)
            for old, mark in placeholders.items():
                data = data.replace(f'"{mark}"'.encode(), f'"{renames[old]}"'.encode(), 1)
        (broken / f.name).write_bytes(data)
    with pytest.raises(NllbError, match=message):
        load_checkpoint(broken, float8=True)


def test_the_reference_fp8_product_rounds_its_input_a_row_at_a_time():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 64)).astype(np.float32) * rng.uniform(0.01, 100, size=(2, 5, 1)).astype(np.float32)
    w = E4M3Matrix.quantize(rng.normal(size=(48, 64)).astype(np.float32))
    bias = rng.normal(size=48).astype(np.float32)
    rows = x.reshape(10, 64)
    codes, scales = quantize_e4m3(rows)
    want = dequantize_e4m3(codes, scales) @ w.dequantize().T + bias
    # float32 sums of 64 terms of up to a few hundred, in another order than NumPy's: within 1e-3
    assert np.allclose(linear(x, w, bias).reshape(10, 48), want, rtol=1e-5, atol=1e-3)
    plain = rows @ w.dequantize().T + bias
    assert not np.allclose(linear(x, w, bias).reshape(10, 48), plain, rtol=1e-5, atol=1e-3)  # the input was rounded


def test_fp8_translations_of_the_sample_model_agree_with_bf16s():
    """bench.fp8_quality's measure on a few sentences: the same translations, but for at most one."""
    base = load_translator(str(SAMPLE), "cpu")
    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()[:20]
    fp8 = Translator(base.config, base.tokenizer, ReferenceEngine(base.config, quantize_matrices(base.engine.w), True), "cpu")
    options = DecodeOptions(beam_size=1, max_length=48)
    plain = base.translate_sentences(texts, "eng_Latn", "deu_Latn", options)
    found = fp8.translate_sentences(texts, "eng_Latn", "deu_Latn", options)
    assert sum(a == b for a, b in zip(plain, found)) >= len(texts) - 1


def test_the_compute_type_chosen(converted, monkeypatch):
    assert uses_float8("bfloat16", "cpu", converted) is False
    assert uses_float8("auto", "cpu", converted) is False  # the CPU computes in float32
    assert uses_float8("auto", "cuda:0", SAMPLE) is False  # a bf16 model stays bf16 by default
    with pytest.raises(NllbError, match="float8 runs on a Hopper GPU"):
        uses_float8("float8", "cpu", SAMPLE)
    with pytest.raises(NllbError, match="unknown compute type 'int4'"):
        uses_float8("int4", "cpu", SAMPLE)
    assert uses_float8("int8", "cpu", SAMPLE) is False  # the CPU's int8 (tests/test_int8.py)
    monkeypatch.setattr(translator_module, "float8_missing", lambda where: None)  # a Hopper GPU
    assert uses_float8("auto", "cuda:0", converted) is True and uses_float8("float8", "cuda:0", SAMPLE) is True
    monkeypatch.setattr(translator_module, "float8_missing", lambda where: "needs a Hopper GPU (compute capability 9.0)")
    assert uses_float8("auto", "cuda:0", converted) is False  # auto falls back to bf16 where the GPU has no FP8
    with pytest.raises(NllbError, match="needs a Hopper GPU"):
        uses_float8("float8", "cuda:0", converted)
    assert expected_compute_type("auto", True, converted) == "float8"
    assert expected_compute_type("auto", False, converted) == expected_compute_type("auto", True, SAMPLE) == "bfloat16"
    assert expected_compute_type("float8", True, SAMPLE) == "float8"


def test_float8_on_the_cpu_is_one_line_and_a_non_zero_exit(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("One.\n")
    result = CliRunner().invoke(cli, ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn", "-m", str(SAMPLE),
                                      "--device", "cpu", "--compute-type", "float8", str(source), str(tmp_path / "out.txt")])
    assert result.exit_code != 0 and result.output.count("\n") == 1
    assert "--compute-type float8 runs on a Hopper GPU" in result.output and not (tmp_path / "out.txt").exists()


def test_a_converted_model_translates_on_the_cpu_as_its_values_say(converted, tmp_path):
    """auto on the CPU: the matrices' FP8 values, computed in float32 (the same as the reference with them)."""
    source = tmp_path / "in.txt"
    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()[:5]
    source.write_text("\n".join(texts) + "\n")
    result = CliRunner().invoke(cli, ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn", "-m", str(converted),
                                      "--device", "cpu", "-q", str(source), str(tmp_path / "out.txt")])
    assert result.exit_code == 0, result.output
    config, values = load_checkpoint(converted)
    base = load_translator(str(converted), "cpu")
    want = Translator(config, base.tokenizer, ReferenceEngine(config, values), "cpu").translate_sentences(
        texts, "eng_Latn", "fra_Latn", DecodeOptions())
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == want


def test_convert_on_the_command_line(tmp_path):
    result = CliRunner().invoke(cli, ["convert", str(TINY), str(tmp_path / "out"), "--compute-type", "float8"])
    assert result.exit_code == 0, result.output
    header, _ = read_safetensors_header(tmp_path / "out" / "model.safetensors")
    assert "F8_E4M3" in {t["dtype"] for t in header.values()}
    info = CliRunner().invoke(cli, ["info", "--json", str(tmp_path / "out")])
    facts = json.loads(info.output)
    assert facts["parameters"] == json.loads(CliRunner().invoke(cli, ["info", "--json", str(TINY)]).output)["parameters"]
    assert facts["gpu_weight_bytes_float8"] < 0.7 * facts["gpu_weight_bytes"]


def test_a_float8_job_is_not_resumed_by_a_bf16_one(monkeypatch):
    from nllbcli.options import BatchOptions, Job
    from nllbcli.job.spec import job_identity

    base = load_translator(str(SAMPLE), "cpu")
    job = Job(src="eng_Latn", tgt="fra_Latn", input="in.txt", output="out.txt", input_format="text", output_format="text")
    plain = job_identity(base, job, DecodeOptions(), BatchOptions())
    fp8 = job_identity(Translator(base.config, base.tokenizer, base.engine, "cuda:0", base.model_dir, "float8"), job,
                       DecodeOptions(), BatchOptions())
    assert plain["compute_type"] == "bfloat16" and fp8["compute_type"] == "float8"
