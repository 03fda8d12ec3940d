"""`nllb convert` (a bf16 safetensors copy), and hub ids: the not-found message and `nllb download`'s errors."""

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from nllbcli.model.checkpoint import (download_patterns, float32_to_bf16, load_checkpoint, read_safetensors,
                                read_safetensors_header, resolve_model_dir, write_safetensors)
from nllbcli.cli import cli
from nllbcli.model.engine.reference import ReferenceEngine, bf16_round
from nllbcli.errors import NllbError
from nllbcli.options import DecodeOptions
from nllbcli.model.translator import Translator, load_translator

HERE = Path(__file__).parent
TINY_A = HERE / "models" / "tiny-a"
TINY_BIN = HERE / "models" / "tiny-bin"


def convert(*args):
    return CliRunner().invoke(cli, ["convert", *map(str, args)])


def test_convert_bin_writes_bf16_safetensors_in_transformers_layout(tmp_path):
    out = tmp_path / "bf16"
    result = convert(TINY_BIN, out)
    assert result.exit_code == 0, result.output
    assert result.output == f"Wrote {out}\n"
    assert sorted(f.name for f in out.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "sentencepiece.bpe.model", "tokenizer_config.json"]
    assert list(tmp_path.iterdir()) == [out]  # no staging directory left beside it
    for name in ("generation_config.json", "sentencepiece.bpe.model", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (TINY_BIN / name).read_bytes()
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"
    assert {k: v for k, v in config.items() if k != "torch_dtype"} == \
        {k: v for k, v in json.loads((TINY_BIN / "config.json").read_text()).items() if k != "torch_dtype"}
    raw = (out / "model.safetensors").read_bytes()
    (length,) = np.frombuffer(raw[:8], dtype="<u8")
    assert json.loads(raw[8 : 8 + length])["__metadata__"] == {"format": "pt"}
    header, _ = read_safetensors_header(out / "model.safetensors")
    assert {info["dtype"] for info in header.values()} == {"BF16"}
    assert "model.shared.weight" in header
    assert not [n for n in header if "embed_tokens" in n or "lm_head" in n]  # the tied embedding once
    assert all(n.startswith("model.encoder.") or n.startswith("model.decoder.") for n in header if n != "model.shared.weight")
    assert (out / "model.safetensors").stat().st_size < 0.55 * (TINY_BIN / "pytorch_model.bin").stat().st_size


def test_converted_weights_are_the_bf16_rounding_of_the_source(tmp_path):
    assert convert(TINY_BIN, tmp_path / "bf16").exit_code == 0
    _, source = load_checkpoint(TINY_BIN)
    config, converted = load_checkpoint(tmp_path / "bf16")
    assert set(converted) == set(source)
    for name in source:
        np.testing.assert_array_equal(converted[name], bf16_round(source[name]), err_msg=name)
    assert converted["lm_head.weight"] is converted["encoder.embed_tokens.weight"]


def test_a_bf16_checkpoint_is_copied_as_its_bits(tmp_path, monkeypatch):
    """Converting nllb convert's own output again writes the same file, and never widens a weight to float32 (a
    bf16 checkpoint's bits are copied: half the memory)."""
    assert convert(TINY_BIN, tmp_path / "once").exit_code == 0
    import nllbcli.model.checkpoint as checkpoint

    def widened(bits):
        raise AssertionError("a bf16 weight was widened to float32")

    monkeypatch.setattr(checkpoint, "bf16_to_float32", widened)
    result = convert(tmp_path / "once", tmp_path / "twice")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "twice" / "model.safetensors").read_bytes() == (tmp_path / "once" / "model.safetensors").read_bytes()


def test_bf16_bits_write_as_bits_or_widened(tmp_path):
    values = np.array([[1.5, -2.25, 3.0e-3], [1000.0, -0.0, 7.0e-6]], np.float32)
    bits = float32_to_bf16(values)
    for dtype in ("BF16", "F32", "F16"):
        write_safetensors(tmp_path / "bits.safetensors", {"x": bits}, dtype)
        write_safetensors(tmp_path / "floats.safetensors", {"x": bf16_round(values)}, dtype)
        assert (tmp_path / "bits.safetensors").read_bytes() == (tmp_path / "floats.safetensors").read_bytes(), dtype


def test_converted_model_translates_like_the_source_rounded_to_bf16(tmp_path):
    """The converted directory, loaded as users load it, against the source loaded from its .bin with every weight
    rounded to bf16 here in memory: the same translations. (Not against the float32 source: bf16 weights may
    change a tiny random model's output.)"""
    assert convert(TINY_BIN, tmp_path / "bf16").exit_code == 0
    source = load_translator(str(TINY_BIN), "cpu")
    _, weights = load_checkpoint(TINY_BIN)
    rounded = {name: bf16_round(w) for name, w in weights.items()}
    expected_translator = Translator(source.config, source.tokenizer, ReferenceEngine(source.config, rounded), "cpu")
    options = DecodeOptions(beam_size=2, max_length=12)
    texts = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "Wie geht es dir?"]
    expected = expected_translator.translate_sentences(texts, "eng_Latn", "fra_Latn", options)
    assert load_translator(str(tmp_path / "bf16"), "cpu").translate_sentences(texts, "eng_Latn", "fra_Latn", options) == expected
    assert all(expected)


def test_convert_copies_every_tokenizer_file(tmp_path):
    """tiny-a ships tokenizer.json too: it goes along, byte for byte; the source weights do not."""
    assert convert(TINY_A, tmp_path / "out").exit_code == 0
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (TINY_A / "tokenizer.json").read_bytes()
    assert sorted(f.name for f in (tmp_path / "out").iterdir()) == sorted(f.name for f in TINY_A.iterdir())


def test_convert_refuses_a_non_empty_out_without_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = convert(TINY_BIN, out)
    assert result.exit_code == 1
    assert result.output == f"Error: {out} is not empty: pass --force to replace it, or choose another OUT\n"
    assert (out / "notes.txt").read_text() == "mine"
    result = convert(TINY_BIN, out, "--force")
    assert result.exit_code == 0, result.output
    assert not (out / "notes.txt").exists() and (out / "model.safetensors").is_file()


def test_convert_into_an_empty_directory(tmp_path):
    (tmp_path / "out").mkdir()
    assert convert(TINY_BIN, tmp_path / "out").exit_code == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_convert_refuses_to_write_over_its_source(tmp_path):
    result = convert(TINY_BIN, TINY_BIN, "--force")
    assert result.exit_code == 1
    assert "is the model directory itself" in result.output
    assert (TINY_BIN / "pytorch_model.bin").is_file()


def test_convert_refuses_an_out_that_holds_its_source(tmp_path):
    """--force replaces OUT: an OUT above the model directory would have been deleted with the model in it."""
    import shutil

    shutil.copytree(TINY_BIN, tmp_path / "models" / "tiny")
    (tmp_path / "models" / "other.txt").write_text("mine")
    result = convert(tmp_path / "models" / "tiny", tmp_path / "models", "--force")
    assert result.exit_code == 1
    assert result.output == (f"Error: OUT {tmp_path / 'models'} holds the model directory {tmp_path / 'models' / 'tiny'}: "
                             "replacing it would delete the model; convert into another directory\n")
    assert (tmp_path / "models" / "tiny" / "pytorch_model.bin").is_file() and (tmp_path / "models" / "other.txt").is_file()


def test_convert_writes_through_a_symlinked_out(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    assert convert(TINY_BIN, tmp_path / "link").exit_code == 0
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real" / "model.safetensors").is_file()


def test_a_full_disk_while_converting_names_out(tmp_path, monkeypatch):
    import errno
    import os

    import nllbcli.model.convert

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(nllbcli.model.convert, "write_safetensors", full)
    result = convert(TINY_BIN, tmp_path / "out")
    assert result.exit_code == 1
    assert result.output == f"Error: cannot write {tmp_path / 'out'}: No space left on device\n"
    assert list(tmp_path.iterdir()) == []


def test_a_failed_convert_leaves_nothing_behind(tmp_path):
    model = tmp_path / "broken"
    model.mkdir()
    (model / "config.json").write_bytes((TINY_A / "config.json").read_bytes())
    (model / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")  # a legacy, non-zip pickle
    result = convert(model, tmp_path / "out")
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and "legacy" in result.output and result.output.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken"]


@pytest.mark.parametrize("values", [
    np.array([1.0, -2.5, 3.0e-39, 65504.0, np.inf, -np.inf, 0.0, -0.0], dtype=np.float32),
    np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20], dtype=np.float32),  # ties to even, and past the tie
    np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 1e3,
])
def test_bf16_writer_rounds_like_the_reference(values):
    widened = (float32_to_bf16(values).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(widened, bf16_round(values))


def test_written_safetensors_read_back(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones((0, 4), np.float32), "c": np.float32([0.1])}
    for dtype in ("F32", "F16", "BF16"):
        write_safetensors(tmp_path / f"{dtype}.safetensors", arrays, dtype)
        back = read_safetensors(tmp_path / f"{dtype}.safetensors")
        assert {k: v.shape for k, v in back.items()} == {k: v.shape for k, v in arrays.items()}
        np.testing.assert_array_equal(back["a"], arrays["a"])


# ------------------------------------------------------------------------------------------------- hub ids


def test_a_hub_id_not_in_the_cache_says_the_exact_download_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(NllbError) as error:
        resolve_model_dir("facebook/nllb-200-distilled-600M")
    assert str(error.value).endswith(", or run `hf download facebook/nllb-200-distilled-600M`")


def test_translate_with_an_uncached_hub_id_fails_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "in.txt").write_text("Hello\n")
    result = CliRunner().invoke(cli, ["translate", "--src", "en", "--tgt", "fr", "--model", "facebook/nllb-200-3.3B",
                                      str(tmp_path / "in.txt"), "-"])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "`hf download facebook/nllb-200-3.3B`" in result.output


def test_download_without_huggingface_hub_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import huggingface_hub raises ImportError
    result = CliRunner().invoke(cli, ["download", "facebook/nllb-200-distilled-600M"])
    assert result.exit_code == 1
    assert result.output == (
        "Error: nllb download needs the huggingface_hub package, which nllbcli does not depend on: pip install "
        "huggingface_hub (then `nllb download facebook/nllb-200-distilled-600M` or "
        "`hf download facebook/nllb-200-distilled-600M`)\n"
    )


def test_download_offline_fails_in_one_line(monkeypatch):
    """A stand-in huggingface_hub whose calls fail as the real one does offline (no network in tests)."""
    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files,\nand couldn't find them in the cache.")

    fake = types.SimpleNamespace(list_repo_files=offline, snapshot_download=offline)
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    result = CliRunner().invoke(cli, ["download", "facebook/nllb-200-distilled-600M"])
    assert result.exit_code == 1
    assert result.output == (
        "Error: cannot download facebook/nllb-200-distilled-600M from the Hugging Face hub: We couldn't connect to "
        "'https://huggingface.co' to load the files, and couldn't find them in the cache.\n"
    )


def test_download_asks_for_one_set_of_weights(monkeypatch, tmp_path):
    calls = {}

    def snapshot_download(repo_id, revision=None, local_dir=None, allow_patterns=None):
        calls.update(repo_id=repo_id, revision=revision, local_dir=local_dir, allow_patterns=allow_patterns)
        return str(tmp_path)

    files = ["config.json", "pytorch_model.bin", "model.safetensors", "tf_model.h5", "sentencepiece.bpe.model"]
    fake = types.SimpleNamespace(list_repo_files=lambda repo_id, revision=None: files, snapshot_download=snapshot_download)
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    result = CliRunner().invoke(cli, ["download", "org/model", "--local-dir", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert result.output == f"{tmp_path}\n"
    assert calls == {"repo_id": "org/model", "revision": None, "local_dir": str(tmp_path / "m"),
                     "allow_patterns": ["*.json", "*.model", "*.txt", "*.safetensors"]}
    assert download_patterns(["config.json", "pytorch_model-00001-of-00003.bin"])[-1] == "pytorch_model*.bin"


def test_converted_directory_has_the_usual_permissions(tmp_path):
    """Not mkdtemp's 0700: the copy is a model directory like any other (the umask decides)."""
    import os

    umask = os.umask(0o022)
    try:
        out = tmp_path / "converted"
        assert convert(TINY_BIN, out).exit_code == 0
        assert out.stat().st_mode & 0o777 == 0o755
    finally:
        os.umask(umask)
