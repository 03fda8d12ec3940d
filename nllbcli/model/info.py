"""What a model directory holds and what running it will take, read from config.json and the weight files'
headers (the safetensors JSON header, the pickle of a pytorch_model.bin): no weight is loaded.

GPU memory is counted as model/engine/cuda.py lays the weights out: every matrix in bf16 (the tied embedding once),
biases and LayerNorm parameters in float32, and the float32 sinusoidal position table. The KV pool comes on top:
the CUDA engine sizes it for each batch, within the memory left free (model/engine/kvpool.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .engine.kvpool import row_bytes
from .checkpoint import FLOAT8, SCALE_SUFFIX, TIED, read_config, resolve_model_dir, select_weights, stored_tensors, weight_files

BF16_BYTES, F32_BYTES = 2, 4

# The published checkpoints by shape: (family, d_model, encoder layers, decoder layers, FFN, vocab) -> names
KNOWN_SHAPES = {
    ("NLLB-200", 1024, 12, 12, 4096, 256206): "nllb-200-distilled-600M",
    ("NLLB-200", 1024, 24, 24, 8192, 256206): "nllb-200-1.3B or nllb-200-distilled-1.3B",
    ("NLLB-200", 2048, 24, 24, 8192, 256206): "nllb-200-3.3B",
    ("M2M-100", 1024, 12, 12, 4096, 128112): "m2m100_418M",
    ("M2M-100", 1024, 24, 24, 8192, 128112): "m2m100_1.2B",
}


@dataclass
class ModelInfo:
    model_dir: str
    family: str  # "NLLB-200" or "M2M-100"
    languages: int | None  # language tokens of the tokenizer; None without sentencepiece.bpe.model
    config: dict
    files: list[str]
    file_bytes: int
    dtypes: list[str]  # of the stored floating-point tensors
    parameters: int  # the tied embedding counted once; the sinusoidal positions are not parameters
    gpu_weight_bytes: int  # the CUDA engine's copy of the weights
    gpu_weight_bytes_float8: int  # the same with --compute-type float8 (matrices as E4M3 codes and a scale a row)
    kv_bytes_per_sequence: int  # self-attention K and V of one sequence (one beam) of max_length tokens
    cross_bytes_per_source_token: int  # cross-attention K and V of one source token, every decoder layer
    kv_bytes_per_sequence_float8: int  # the same two with --kv-cache-type float8 (E4M3 codes and a scale a head)
    cross_bytes_per_source_token_float8: int
    max_length: int
    known_as: str | None = None
    notes: list[str] = field(default_factory=list)


def inspect_model(model: str, max_length: int = 200) -> ModelInfo:
    """Describe a model directory (or a cached hub id) from its config and headers."""
    from .tokenizer import check_special_ids, tokenizer_family, tokenizer_from_model_dir

    model_dir = resolve_model_dir(model)
    config = read_config(model_dir)
    check_special_ids(config, model_dir)  # refused by translate whatever the tokenizer, so not a note
    family = "M2M-100" if tokenizer_family(model_dir) == "m2m100" else "NLLB-200"
    notes = []
    # a directory of weights without a tokenizer is described all the same; tokenizer files that are there must be
    # what translate would accept
    languages: int | None = None
    if (model_dir / "sentencepiece.bpe.model").is_file():
        languages = len(tokenizer_from_model_dir(model_dir, config).lang_codes)
    else:
        notes.append("the directory has no sentencepiece.bpe.model: the languages are unknown, and translate needs it")
    files = weight_files(model_dir)
    tensors: dict[str, tuple[tuple[int, ...], str]] = {}
    for path in files:
        tensors.update({name.removeprefix("model."): t for name, t in stored_tensors(path).items()})
    tensors = {name: t for name, t in tensors.items() if "embed_positions" not in name}  # sinusoidal, not learned
    float8_scales = {name + SCALE_SUFFIX for name, (_, dtype) in tensors.items() if dtype == FLOAT8}
    # the loader's own check of the headers against config.json: what loading would refuse, info refuses too
    select_weights(config, {name: shape for name, (shape, _) in tensors.items()}, model_dir)
    embedding = next(name for name in TIED if name in tensors)
    tied = set(TIED) - {embedding} if config.tie_word_embeddings else set(TIED[:3]) - {embedding}
    counted = {name: t for name, t in tensors.items() if name not in tied and name not in float8_scales}
    parameters = sum(math.prod(shape) for shape, _ in counted.values())
    positions = (config.max_position_embeddings + 2) * config.d_model * F32_BYTES  # the position table
    gpu = positions + sum(math.prod(shape) * (BF16_BYTES if len(shape) == 2 else F32_BYTES) for shape, _ in counted.values())
    gpu_float8 = positions + sum(math.prod(shape) + shape[0] * F32_BYTES if len(shape) == 2 else math.prod(shape) * F32_BYTES
                                 for shape, _ in counted.values())
    c = config
    known = KNOWN_SHAPES.get((family, c.d_model, c.encoder_layers, c.decoder_layers, c.encoder_ffn_dim, c.vocab_size))
    return ModelInfo(
        model_dir=str(model_dir), family=family, languages=languages, config=asdict(config),
        files=[p.name for p in files], file_bytes=sum(p.stat().st_size for p in files),
        dtypes=sorted({dtype for _, dtype in tensors.values()}), parameters=parameters, gpu_weight_bytes=gpu,
        gpu_weight_bytes_float8=gpu_float8,
        kv_bytes_per_sequence=(max_length + 1) * row_bytes(c.decoder_layers, c.d_model),
        cross_bytes_per_source_token=row_bytes(c.decoder_layers, c.d_model),
        kv_bytes_per_sequence_float8=(max_length + 1) * row_bytes(c.decoder_layers, c.d_model, c.decoder_attention_heads),
        cross_bytes_per_source_token_float8=row_bytes(c.decoder_layers, c.d_model, c.decoder_attention_heads),
        max_length=max_length, known_as=known, notes=notes,
    )


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def describe(info: ModelInfo) -> str:
    """The lines `nllb info` prints."""
    c = info.config
    heads = c["encoder_attention_heads"], c["decoder_attention_heads"]
    head_dims = "/".join(str(c["d_model"] // h) for h in dict.fromkeys(heads))
    ffn = c["encoder_ffn_dim"] if c["encoder_ffn_dim"] == c["decoder_ffn_dim"] else f"{c['encoder_ffn_dim']}/{c['decoder_ffn_dim']}"
    languages = "languages unknown" if info.languages is None else f"{info.languages} languages"
    lines = [
        f"Model:       {info.model_dir}",
        f"Family:      {info.family} ({languages})" + (f", the shape of {info.known_as}" if info.known_as else ""),
        f"Dimensions:  d_model {c['d_model']}, {c['encoder_layers']} encoder + {c['decoder_layers']} decoder layers, "
        f"heads {heads[0]}/{heads[1]} (head_dim {head_dims}), FFN {ffn}, vocab {c['vocab_size']:,}, "
        f"{c['max_position_embeddings']} positions, {c['activation_function']}",
        f"Weights:     {', '.join(info.files)} ({human_bytes(info.file_bytes)}), stored as {', '.join(info.dtypes)}",
        f"Parameters:  {info.parameters:,} ({info.parameters / 1e6:,.1f}M)",
        f"GPU memory:  {human_bytes(info.gpu_weight_bytes)} for the weights (matrices in bf16, biases and norms in float32),"
        f" plus the CUDA context; {human_bytes(info.gpu_weight_bytes_float8)} with --compute-type float8 (matrices in "
        "FP8 E4M3 with a float32 scale a row)",
        "KV pool:     on top of the weights, sized for each batch (its sentences, the tokens they can reach, their "
        f"source tokens) within the GPU memory left free; each sequence (each beam) of --max-length {info.max_length} takes "
        f"{human_bytes(info.kv_bytes_per_sequence)}, each source token {human_bytes(info.cross_bytes_per_source_token)} "
        f"({human_bytes(info.kv_bytes_per_sequence_float8)} and {human_bytes(info.cross_bytes_per_source_token_float8)} "
        "with --kv-cache-type float8)",
        f"CPU memory:  {human_bytes(info.parameters * F32_BYTES)} while loading (the weights are read as float32)",
    ]
    lines += [f"Note:        {note}" for note in info.notes]
    return "\n".join(lines)
