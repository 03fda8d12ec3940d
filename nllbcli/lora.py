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

import json
import math
import re
from pathlib import Path

import numpy as np

from .checkpoint import ModelConfig, read_weights
from .errors import NllbError

LORA_TENSOR = re.compile(r"^(?:base_model\.model\.)?(?:model\.)?(.+)\.lora_([AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")


def read_adapter_config(adapter_dir: Path) -> dict:
    path = adapter_dir / "adapter_config.json"
    if not adapter_dir.is_dir():
        raise NllbError(f"--adapter {adapter_dir}: not a directory (expected adapter_config.json and adapter_model.safetensors)")
    if not path.is_file():
        raise NllbError(f"--adapter {adapter_dir} has no adapter_config.json: it is not a PEFT adapter directory")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise NllbError(f"cannot read {path}: {exc}") from None
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise NllbError(f"{path}: peft_type is {peft_type!r}; nllbcli applies LoRA adapters (peft_type LORA) only")
    unsupported = [
        (config.get("use_dora"), "DoRA (use_dora)"),
        (config.get("bias", "none") != "none" or config.get("lora_bias"), "trained biases (bias/lora_bias)"),
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
    for key in ("r", "lora_alpha"):
        if not isinstance(config.get(key), (int, float)) or config[key] <= 0:
            raise NllbError(f"{path}: {key} is {config.get(key)!r}, not a positive number")
    return config


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
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for name, array in read_weights(path).items():
        match = LORA_TENSOR.match(name)
        if match is None:
            what = "embedding LoRA" if "lora_embedding" in name else "a tensor that is not a LoRA A or B matrix"
            raise NllbError(f"{path}: {name} is {what}; nllbcli merges LoRA on linear layers only")
        pairs.setdefault(match.group(1), {})[match.group(2)] = array
    if not pairs:
        raise NllbError(f"{path} holds no LoRA weights")
    merged = dict(weights)
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise NllbError(f"{path}: {module} has lora_{next(iter(ab))} without its lora_{'B' if 'A' in ab else 'A'}")
        target = module + ".weight"
        if target not in weights:
            raise NllbError(f"--adapter {adapter_dir} changes {module}, which this model does not have: the adapter was "
                            f"trained for another model ({settings.get('base_model_name_or_path') or 'unknown base'})")
        a, b, w = ab["A"], ab["B"], weights[target]
        rank = a.shape[0]
        if a.ndim != 2 or b.ndim != 2 or b.shape[1] != rank or (b.shape[0], a.shape[1]) != w.shape:
            raise NllbError(f"--adapter {adapter_dir}: {module}'s LoRA matrices {tuple(b.shape)} x {tuple(a.shape)} do not fit "
                            f"its weight {tuple(w.shape)}: the adapter was trained for a model of other dimensions")
        peft_name = "model." + module  # the module name PEFT matched its patterns against
        alpha = pattern_value(settings.get("alpha_pattern"), peft_name, settings["lora_alpha"])
        scale = alpha / math.sqrt(rank) if settings.get("use_rslora") else alpha / rank
        # in float64, then rounded once: the merged weight is W + scale * B @ A as exactly as float32 holds it
        merged[target] = (w.astype(np.float64) + scale * (b.astype(np.float64) @ a.astype(np.float64))).astype(np.float32)
    return merged
