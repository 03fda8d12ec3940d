"""PEFT LoRA adapters, merged into the weights at load: W' = W + scale * B @ A, so the engines run unchanged.

An adapter directory is what PEFT's `save_pretrained` writes: `adapter_config.json` (peft_type LORA, r,
lora_alpha, target_modules, and per-module rank_pattern / alpha_pattern) and `adapter_model.safetensors` (or
the older `adapter_model.bin`, read without PyTorch), with tensors named
`base_model.model.<module>.lora_A.weight` (r, in) and `...lora_B.weight` (out, r). The scale is lora_alpha / r,
or lora_alpha / sqrt(r) with use_rslora, alpha taken from alpha_pattern where a pattern matches the module name
the way PEFT matches it. Any linear layer of the model may be targeted (q/k/v/out_proj of the three attentions,
fc1, fc2). Adapters that change more than linear weights (DoRA, trained biases, modules_to_save, embedding
LoRA) are refused with a sentence that says what is not supported, never applied halfway.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from .checkpoint import (ModelConfig, check_finite, json_int, json_value, quoted, read_json_object, read_weights,
                         shown, stored_tensors)
from .engine.numerics import has_nonfinite
from ..errors import NllbError

LORA_TENSOR = re.compile(r"^(?:base_model\.model\.)?(?:model\.)?(.+)\.lora_([AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")


def read_adapter_config(adapter_dir: Path) -> dict:
    path = adapter_dir / "adapter_config.json"
    if not adapter_dir.is_dir():
        raise NllbError(f"--adapter {adapter_dir}: not a directory (expected adapter_config.json and adapter_model.safetensors)")
    if not path.is_file():
        raise NllbError(f"--adapter {adapter_dir} has no adapter_config.json: it is not a PEFT adapter directory")
    config = read_json_object(path)
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        named = repr(peft_type) if isinstance(peft_type, str) and len(peft_type) <= 40 else shown(peft_type)
        raise NllbError(f"{path}: peft_type is {named}; nllbcli applies LoRA adapters (peft_type LORA) only")
    unsupported = [
        (config.get("use_dora"), "DoRA (use_dora)"),
        (config.get("bias") not in (None, "none") or config.get("lora_bias"), "trained biases (bias/lora_bias)"),
        (config.get("modules_to_save"), "modules_to_save"),
        (config.get("fan_in_fan_out"), "fan_in_fan_out"),
        (config.get("layer_replication"), "layer_replication"),
        (config.get("trainable_token_indices"), "trainable_token_indices"),
        (config.get("target_parameters"), "target_parameters"),
    ]
    refused = [what for flag, what in unsupported if flag]
    if refused:
        raise NllbError(f"{path}: the adapter uses {', '.join(refused)}, which nllbcli does not apply: merge it with PEFT "
                        "(merge_and_unload) and pass the merged model as --model")
    # the keys the merge reads, checked as the untrusted input they are (the optional ones may be null)
    json_int(path, "r", config.get("r"), least=1)
    positive_number(path, "lora_alpha", config.get("lora_alpha"))
    for key, kind in (("use_rslora", bool), ("base_model_name_or_path", str), ("alpha_pattern", dict)):
        if config.get(key) is not None:
            json_value(path, key, config[key], kind)
    for pattern, alpha in (config.get("alpha_pattern") or {}).items():
        positive_number(path, f"alpha_pattern[{quoted(pattern)}]", alpha)
        try:
            re.compile(rf"(.*\.)?({pattern})$")  # as pattern_value matches it
        except re.error as exc:
            raise NllbError(f"{path}: alpha_pattern's key {shown(pattern)} is not a regular expression ({exc})") from None
    return config


def positive_number(path: Path, key: str, value) -> float:
    if json_value(path, key, value, float) <= 0:
        raise NllbError(f"{path}: {key} must be a positive number, not {shown(value)}")
    return value


def adapter_file(adapter_dir: Path) -> Path:
    for name in ("adapter_model.safetensors", "adapter_model.bin"):
        if (adapter_dir / name).is_file():
            return adapter_dir / name
    raise NllbError(f"--adapter {adapter_dir} has no adapter_model.safetensors (nor adapter_model.bin)")


def pattern_value(patterns: dict, module: str, default):
    """PEFT's get_pattern_key: the first pattern that matches the end of the module name, at a dot."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def merge_lora(config: ModelConfig, weights: dict[str, np.ndarray], adapter_dir: Path) -> dict[str, np.ndarray]:
    """The weights with the adapter merged in (a new dict; merged matrices are new arrays, the rest shared)."""
    adapter_dir = Path(adapter_dir)
    settings = read_adapter_config(adapter_dir)
    path = adapter_file(adapter_dir)
    # names and shapes from the file's header first: every tensor is checked to be half of a LoRA pair that fits
    # the model before any is read, so what is read is what the merge needs
    pairs: dict[str, dict[str, str]] = {}  # module -> "A"/"B" -> stored name
    shapes = {name: shape for name, (shape, _) in stored_tensors(path).items()}
    for name in shapes:
        match = LORA_TENSOR.match(name)
        if match is None:
            what = "embedding LoRA" if "lora_embedding" in name else "a tensor that is not a LoRA A or B matrix"
            raise NllbError(f"{path}: {name} is {what}; nllbcli merges LoRA on linear layers only")
        pairs.setdefault(match.group(1), {})[match.group(2)] = name
    if not pairs:
        raise NllbError(f"{path} holds no LoRA weights")
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise NllbError(f"{path}: {module} has lora_{next(iter(ab))} without its lora_{'B' if 'A' in ab else 'A'}")
        target = module + ".weight"
        if target not in weights:
            raise NllbError(f"--adapter {adapter_dir} changes {module}, which this model does not have: the adapter was "
                            f"trained for another model ({settings.get('base_model_name_or_path') or 'unknown base'})")
        a, b, w = shapes[ab["A"]], shapes[ab["B"]], weights[target].shape
        if len(a) != 2 or len(b) != 2 or b[1] != a[0] or (b[0], a[1]) != w or a[0] == 0:  # rank 0: nothing to scale
            raise NllbError(f"--adapter {adapter_dir}: {module}'s LoRA matrices {tuple(b)} x {tuple(a)} do not fit "
                            f"its weight {tuple(w)}: the adapter was trained for a model of other dimensions")
    arrays = read_weights(path)
    check_finite(arrays, dict.fromkeys(arrays, path), {})
    merged = dict(weights)
    for module, ab in sorted(pairs.items()):
        target = module + ".weight"
        a, b, w = arrays[ab["A"]], arrays[ab["B"]], weights[target]
        rank = a.shape[0]
        peft_name = "model." + module  # the module name PEFT matched its patterns against
        alpha = pattern_value(settings.get("alpha_pattern"), peft_name, settings["lora_alpha"])
        scale = alpha / math.sqrt(rank) if settings.get("use_rslora") else alpha / rank
        # in float64, then rounded once: the merged weight is W + scale * B @ A as exactly as float32 holds it
        with np.errstate(over="ignore"):  # a value past float32's range is refused below
            merged[target] = (w.astype(np.float64) + scale * (b.astype(np.float64) @ a.astype(np.float64))).astype(np.float32)
        if has_nonfinite(merged[target]):
            raise NllbError(f"--adapter {adapter_dir}: {module}'s merged weight is past float32's range: the adapter "
                            "does not fit this model")
    return merged
