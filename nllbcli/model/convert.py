"""`nllb convert MODEL OUT`: any checkpoint nllbcli reads -> a bf16 model.safetensors with its tokenizer files.

The copy is what transformers itself would save in bf16: one `model.safetensors` in transformers' names (the tied
embedding stored once, as `model.shared.weight`), metadata {"format": "pt"}, config.json with torch_dtype
bfloat16, and the tokenizer and generation files copied unchanged. Half a float32 checkpoint's size, and read
with a memory map instead of unpickled. OUT appears only when complete: it is written beside it and renamed.

With --compute-type float8, every matrix (the projections, the FFNs and the embedding) is stored in FP8 E4M3
with a float32 scale per output channel beside it (`<name>_scale`, numerics.E4M3Matrix), the rest in bf16, and
config.json says so in its quantization_config: a quarter of a float32 checkpoint, loaded for FP8 matrix
products without quantizing again. transformers does not read this layout.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from .checkpoint import load_checkpoint, read_json_object, resolve_model_dir, write_safetensors
from ..errors import NllbError

# Files of a hub repo that are weights in some format: everything else at the top of the directory is copied.
WEIGHT_SUFFIXES = (".bin", ".safetensors", ".index.json", ".h5", ".msgpack", ".ot", ".onnx", ".pt", ".pth", ".ckpt")
EMBEDDINGS = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")


# config.json's record of an FP8 copy (nllbcli's own layout: transformers has no loader for it)
FLOAT8_CONFIG = {"quant_method": "nllbcli_float8", "weights": "float8_e4m3, a float32 scale an output channel",
                 "activations": "float8_e4m3, a scale a row, made as the model runs"}


def convert_model(model: str, out: Path, force: bool = False, float8: bool = False) -> Path:
    """Write a bf16 safetensors copy of `model` (a directory or a cached hub id) to the directory `out`; with
    float8, its matrices in FP8 E4M3 with their scales."""
    source = resolve_model_dir(model)
    out = Path(out).expanduser()
    if out.is_symlink():  # written where it points, as the shell's `>` does: the link stays
        out = out.resolve()
    if out.exists() and not out.is_dir():
        raise NllbError(f"{out} exists and is not a directory")
    if out.exists() and out.resolve() == source.resolve():
        raise NllbError(f"OUT {out} is the model directory itself: convert into another directory")
    if out.exists() and out.resolve() in source.resolve().parents:
        raise NllbError(f"OUT {out} holds the model directory {source}: replacing it would delete the model; convert "
                        "into another directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise NllbError(f"{out} is not empty: pass --force to replace it, or choose another OUT")
    # checked against config.json (a converted copy always loads); a bf16 checkpoint's weights as their bits,
    # copied as they are: half the memory of widening them to float32 and narrowing them back
    config, weights = load_checkpoint(source, bf16_bits=True, float8=float8)
    if float8:
        from .translator import quantize_matrices

        weights = quantize_matrices(weights)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it 0700; the copy is a model directory like any other
    try:
        write_safetensors(staging / "model.safetensors", stored_names(weights, config.tie_word_embeddings), "BF16",
                          metadata={"format": "pt"})
        for f in sorted(source.iterdir()):
            if f.is_file() and not f.name.startswith(".") and not f.name.endswith(WEIGHT_SUFFIXES) and f.name != "config.json":
                shutil.copyfile(f, staging / f.name)  # copyfile follows the hub cache's symlinks to the blobs
        raw_config = read_json_object(source / "config.json")  # a JSON object: load_checkpoint checked it
        raw_config["torch_dtype"] = "bfloat16"
        if "dtype" in raw_config:  # transformers 5 writes `dtype` instead
            raw_config["dtype"] = "bfloat16"
        raw_config.pop("quantization_config", None)
        if float8:
            raw_config["quantization_config"] = FLOAT8_CONFIG
        (staging / "config.json").write_text(json.dumps(raw_config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.rename(staging, out)
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise NllbError(f"cannot write {out}: {error.strerror or error}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def stored_names(weights: dict, tied: bool) -> dict:
    """The engine's names -> transformers' (`model.` prefix), with a tied embedding kept once as model.shared.weight."""
    stored = {"model.shared.weight": weights["encoder.embed_tokens.weight"]}
    if not tied:
        if weights["decoder.embed_tokens.weight"] is not weights["encoder.embed_tokens.weight"]:
            stored["model.decoder.embed_tokens.weight"] = weights["decoder.embed_tokens.weight"]
        stored["lm_head.weight"] = weights["lm_head.weight"]
    for name, array in weights.items():
        if name not in EMBEDDINGS:
            stored["model." + name] = array
    return stored
