"""Model directory (Hugging Face layout) -> ModelConfig + named float32 weight arrays.

A directory holds `config.json` (model_type m2m_100), `model.safetensors` or shards listed in
`model.safetensors.index.json` (or PyTorch's `pytorch_model.bin` or its shards, read without PyTorch by
torchbin.py), and `sentencepiece.bpe.model`. Weights may be stored as float32, float16 or bfloat16; the tied
embedding may be stored once (`model.shared.weight`) or several times.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from .engine.numerics import E4M3Matrix, bf16_to_float32, has_nonfinite
from ..errors import NllbError
from ..options import FACTOR_RANGE, LENGTH_PENALTY_LIMIT, MAX_BEAMS, MAX_LENGTH

DEFAULT_MODEL = "facebook/nllb-200-distilled-600M"


@dataclass(frozen=True)
class ModelConfig:
    """The dimensions of an M2M-100/NLLB model; every one comes from config.json (defaults: M2M100Config's)."""

    vocab_size: int = 128112  # rows of the embedding and of the tied output projection
    d_model: int = 1024
    encoder_layers: int = 12
    decoder_layers: int = 12
    encoder_attention_heads: int = 16
    decoder_attention_heads: int = 16
    encoder_ffn_dim: int = 4096
    decoder_ffn_dim: int = 4096
    max_position_embeddings: int = 1024  # source tokens and decoder positions the model was trained for
    scale_embedding: bool = True  # token embeddings times sqrt(d_model)
    activation_function: str = "relu"
    pad_token_id: int = 1
    bos_token_id: int = 0
    eos_token_id: int = 2
    decoder_start_token_id: int = 2
    tie_word_embeddings: bool = True

    @property
    def embed_scale(self) -> float:
        return float(np.sqrt(self.d_model)) if self.scale_embedding else 1.0

    @classmethod
    def from_json(cls, path: Path) -> "ModelConfig":
        """The config of `path`, every field checked for type and range: a model directory is untrusted input, so
        a value the engines cannot run is refused here, naming the key, before anything is loaded. null means the
        default, as transformers takes it."""
        raw = read_json_object(path)
        model_type = raw.get("model_type")
        if model_type not in ("m2m_100", "m2m100"):
            named = repr(model_type) if isinstance(model_type, str) and len(model_type) <= 40 else shown(model_type)
            raise NllbError(
                f"{path} describes a {named} model; nllbcli runs NLLB-200 and M2M-100 models (model_type m2m_100)"
            )
        values = {}
        for f in fields(cls):
            value = raw.get(f.name)
            if value is None:
                continue
            if f.type == "int":
                values[f.name] = json_int(path, f.name, value, *INT_RANGES.get(f.name, (0, MAX_ID)))
            else:
                values[f.name] = json_value(path, f.name, value, {"bool": bool, "str": str}[f.type])
        config = cls(**values)
        for name in ("encoder_attention_heads", "decoder_attention_heads"):
            if config.d_model % getattr(config, name):
                raise NllbError(f"{path}: d_model {config.d_model} is not a multiple of {name} {getattr(config, name)}")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            if getattr(config, name) >= config.vocab_size:
                raise NllbError(f"{path}: {name} {getattr(config, name)} is not a token of the model's vocabulary "
                                f"(vocab_size {config.vocab_size}: ids 0 to {config.vocab_size - 1})")
        if config.activation_function not in ACTIVATIONS:
            raise NllbError(
                f"{path}: activation_function {config.activation_function!r} is not supported (use one of "
                f"{', '.join(sorted(ACTIVATIONS))})"
            )
        return config


ACTIVATIONS = ("relu", "gelu")

MAX_ID = 2**31 - 1  # sizes and token ids: the CUDA engine holds ids, positions and sizes as 32-bit integers
# A source is cut to max_position_embeddings tokens (rows.cut_source keeps the first P - 1 and </s>): it must
# hold [src_lang, one piece, </s>], and the decoder's inputs [decoder_start, tgt_lang, piece] likewise (its </s>
# is predicted, never fed). Positions start past the padding index (fairseq's offset of 2, see
# engine/reference.py) in a table of P + 2 rows, so P positions hold P tokens: the offset costs rows, not
# positions. Hence 3. The table is made whole at load, P + 2 rows of d_model floats on each engine (and the GPU
# keeps cross K/V rows for a source of P tokens), so no more than 64 times NLLB's 1,024.
MIN_POSITIONS, MAX_POSITIONS = 3, 1 << 16
# least and most value of each int field of config.json (token ids: 0 to MAX_ID, then checked against vocab_size)
INT_RANGES = {
    "vocab_size": (1, MAX_ID),
    # transformers' sinusoidal table divides by d_model // 2 - 1 (ZeroDivisionError at 2 and 3; ours gives NaN)
    "d_model": (4, MAX_ID),
    "encoder_layers": (1, MAX_ID),
    "decoder_layers": (1, MAX_ID),
    "encoder_attention_heads": (1, MAX_ID),
    "decoder_attention_heads": (1, MAX_ID),
    "encoder_ffn_dim": (1, MAX_ID),
    "decoder_ffn_dim": (1, MAX_ID),
    "max_position_embeddings": (MIN_POSITIONS, MAX_POSITIONS),
}


# ---------------------------------------------------------------------------------------------- JSON files

# a model's or adapter's JSON files (NLLB-200's tokenizer.json, the largest, is 17 MB): refused above this unread
MAX_JSON_BYTES = 100_000_000


def read_json(path: Path):
    """The JSON value a model or adapter file holds. Its files are untrusted input: one too large, not UTF-8, not
    JSON, or nested too deep for the parser (RecursionError) is an NllbError that names it."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise NllbError(f"cannot read {path}: {exc}") from None
    if len(raw) > MAX_JSON_BYTES:
        raise NllbError(f"cannot read {path}: it is over {MAX_JSON_BYTES:,} bytes, too large for a model's JSON file")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise NllbError(f"cannot read {path}: {exc}") from None


def read_json_object(path: Path) -> dict:
    """read_json's value, which must be a JSON object."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise NllbError(f"{path} must hold a JSON object, not {shown(value)}")
    return value


KIND_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list",
              dict: "an object"}


def json_value(path: Path, key: str, value, kind: type):
    """`value` (the one at `key` in the file `path`), checked to be of `kind` as JSON has it: int an integer (not
    true, not 1.0), float a finite number, bool true or false, str, list, dict; else an NllbError naming both."""
    if kind is float:
        fits = type(value) is int or (type(value) is float and math.isfinite(value))
    else:
        fits = type(value) is kind
    if not fits:
        raise NllbError(f"{path}: {key} must be {KIND_NAMES[kind]}, not {shown(value)}")
    return value


def json_int(path: Path, key: str, value, least: int = 0, most: int = MAX_ID) -> int:
    """json_value's integer, from `least` to `most`."""
    json_value(path, key, value, int)
    if not least <= value <= most:
        raise NllbError(f"{path}: {key} must be an integer from {least:,} to {most:,}, not {shown(value)}")
    return value


def shown(value) -> str:
    """A JSON value as a message names it: `the string "256"`, `1.5`, `null`, `the list [1, 2]` (cut when long;
    a long or nested list or object by its kind alone)."""
    if isinstance(value, (list, dict)):
        items = value.values() if isinstance(value, dict) else value
        if len(value) > 8 or any(isinstance(item, (list, dict)) for item in items):
            return "a list" if isinstance(value, list) else "an object"
    return {str: "the string ", list: "the list ", dict: "the object "}.get(type(value), "") + quoted(value)


def quoted(value) -> str:
    """A JSON value as JSON writes it, cut when long: `"model.shared.weight"` (a key of an object, in a message)."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def hf_cache_dir() -> Path:
    """Where the Hugging Face hub keeps downloaded models, found as transformers finds it."""
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if hub:
        return Path(hub)
    home = Path(os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface")
    return home / "hub"


def find_in_hf_cache(repo_id: str) -> Path | None:
    """The snapshot directory of a hub model already in the local cache (never downloads): the one refs/main
    names, else the newest."""
    repo = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        snapshot = snapshots / ref.read_text().strip()
        if snapshot.is_dir():
            return snapshot
    candidates = sorted((p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return candidates[-1] if candidates else None


def resolve_model_dir(model: str) -> Path:
    """A model directory from a path, or from a hub id found in the local Hugging Face cache."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise NllbError(f"--model {model}: expected a model directory, found a file")
    looks_like_hub_id = model.count("/") == 1 and not model.startswith((".", "/", "~"))
    if looks_like_hub_id:
        snapshot = find_in_hf_cache(model)
        if snapshot is not None:
            return snapshot
        # one short line: docs/CHECKPOINTS.md says where the cache is and how to fetch into it
        raise NllbError(f"no model {model} in the Hugging Face cache: pass -m DIR or set NLLB_MODEL, or run "
                        f"`{download_command(model)}`")
    raise NllbError(f"model directory {path} does not exist: pass -m DIR, a directory with config.json, the weights "
                    "and sentencepiece.bpe.model")


def download_command(repo_id: str) -> str:
    """The shell command that puts a hub model into the cache nllbcli looks in (hf_cache_dir)."""
    return f"hf download {repo_id}"  # huggingface_hub's CLI; before 0.34 it was `huggingface-cli download`


def download_patterns(files: list[str]) -> list[str]:
    """Which files of a hub repo to fetch: config, tokenizer and generation files, and one set of weights.

    safetensors when the repo has them, else pytorch_model*.bin: never both, nor TF, Flax or ONNX weights."""
    patterns = ["*.json", "*.model", "*.txt"]
    if any(f.endswith(".safetensors") for f in files):
        return patterns + ["*.safetensors"]
    return patterns + ["pytorch_model*.bin"]


def download_model(repo_id: str, local_dir: Path | None = None, revision: str | None = None) -> Path:
    """Fetch a hub model through huggingface_hub (an optional package) into the cache or `local_dir`."""
    try:
        import huggingface_hub
    except ImportError:
        raise NllbError(
            "nllb download needs the huggingface_hub package, which nllbcli does not depend on: "
            f"pip install huggingface_hub (then `nllb download {repo_id}` or `{download_command(repo_id)}`)"
        ) from None
    try:
        files = huggingface_hub.list_repo_files(repo_id, revision=revision)
        path = huggingface_hub.snapshot_download(
            repo_id, revision=revision, local_dir=None if local_dir is None else str(local_dir),
            allow_patterns=download_patterns(files),
        )
    except Exception as exc:  # no network, unknown repo, gated model: huggingface_hub's own words, on one line
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise NllbError(f"cannot download {repo_id} from the Hugging Face hub: {message}") from None
    return Path(path)


# ---------------------------------------------------------------------------------------------- safetensors

# numpy has no bfloat16: bf16 is read as uint16 and widened by hand (its bits are float32's upper half).
_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64, "F8_E4M3": np.uint8}


# bytes per element of every dtype safetensors defines: an entry's data_offsets must span its shape's elements
SAFETENSORS_ITEMSIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
                         "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit


def read_safetensors_header(path: Path) -> tuple[dict, int]:
    """The JSON header of a safetensors file, every entry checked, and the byte offset where its data starts.

    The file is untrusted input: the header must be an object whose entries are {"dtype": a string, "shape": a
    list of sizes, "data_offsets": [begin, end]} with begin <= end inside the file's data, spanning as many bytes
    as the shape's elements take (for the dtypes safetensors defines), and __metadata__ an object of strings; an
    NllbError names the file and the tensor otherwise, so that no reader of a header meets a wrong type."""
    try:
        with open(path, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            (length,) = struct.unpack("<Q", f.read(8))
            if length > min(MAX_HEADER_BYTES, file_size - 8):
                raise ValueError("header length out of range")
            header = json.loads(f.read(length))
    except (OSError, ValueError, RecursionError, struct.error) as exc:
        raise NllbError(f"{path} is not a readable safetensors file ({exc})") from None
    if not isinstance(header, dict):
        raise NllbError(f"{path} is not a readable safetensors file (its header is {shown(header)}, not a JSON object)")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise NllbError(f"{path}: __metadata__ must be an object of strings, not {shown(metadata)}")
    data_bytes = file_size - 8 - length
    for name, entry in header.items():
        check_safetensors_entry(path, name, entry, data_bytes)
    return header, 8 + length


def check_safetensors_entry(path: Path, name: str, entry, data_bytes: int) -> None:
    """One tensor's entry of a safetensors header, as read_safetensors_header says."""
    if not isinstance(entry, dict):
        raise NllbError(f"{path}: tensor {name} is described by {shown(entry)}, not an object of dtype, shape and data_offsets")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if type(dtype) is not str:
        raise NllbError(f"{path}: tensor {name}'s dtype must be a string, not {shown(dtype)}")
    if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
        raise NllbError(f"{path}: tensor {name}'s shape must be a list of sizes (integers from 0), not {shown(shape)}")
    if type(offsets) is not list or len(offsets) != 2 or not all(type(n) is int for n in offsets):
        raise NllbError(f"{path}: tensor {name}'s data_offsets must be two integers [begin, end], not {shown(offsets)}")
    begin, end = offsets
    if not 0 <= begin <= end <= data_bytes:
        raise NllbError(f"{path}: tensor {name}'s data_offsets {offsets} do not fit the file ({data_bytes} bytes of "
                        "data after the header)")
    itemsize = SAFETENSORS_ITEMSIZES.get(dtype)
    if itemsize is not None and end - begin != math.prod(shape) * itemsize:
        raise NllbError(f"{path}: tensor {name}'s data_offsets {offsets} do not fit its shape {shape} of {dtype} "
                        f"({math.prod(shape) * itemsize} bytes)")


def read_safetensors(path: Path, wanted: set[str] | None = None, bf16_bits: bool = False) -> dict[str, np.ndarray]:
    """Named float32 arrays from one safetensors file (only `wanted` names when given); bf16_bits: bf16 tensors
    as their bit patterns (uint16), as stored, for an engine that computes in bf16 (half the bytes, no widening).
    F8_E4M3 tensors come as their codes (uint8): load_checkpoint pairs them with their scales.

    Each tensor is mapped from the file on its own and the map dropped once converted: mapping the whole file
    at once kept every page read so far resident until the end (+1.2 GB of RSS for the 600M model in bf16).
    """
    header, start = read_safetensors_header(path)  # checked: offsets inside the file, spanning each shape
    arrays: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if wanted is not None and name not in wanted:
            continue
        dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise NllbError(f"{path}: tensor {name} has dtype {info['dtype']}; float32, float16, bfloat16 and float8_e4m3 "
                            "are supported")
        begin, _ = info["data_offsets"]
        shape = tuple(info["shape"])
        if math.prod(shape) == 0:
            raw = np.zeros(shape, dtype=dtype)
        else:
            raw = np.memmap(path, dtype=dtype, mode="r", offset=start + begin, shape=shape).view(np.ndarray)
        if info["dtype"] == "BF16":
            arrays[name] = np.array(raw) if bf16_bits else bf16_to_float32(raw)
        elif info["dtype"] == "F8_E4M3":
            arrays[name] = np.array(raw)
        else:
            arrays[name] = raw.astype(np.float32)
    return arrays


def float32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest, ties to even (as torch's .to(bfloat16))."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


WRITE_BLOCK_ELEMENTS = 1 << 20  # elements converted and written at once by write_safetensors (4 MB of float32)


def write_safetensors(path: Path, arrays: dict, dtype: str = "BF16", metadata: dict | None = None) -> None:
    """Write named arrays as one safetensors file of `dtype` (F32, F16 or BF16), by hand: bf16 needs no PyTorch.

    The header is known before any data (sizes follow from shapes), so each array is converted and written in
    turn: a model is never held twice in memory. uint16 arrays are bf16 bits (load_checkpoint's bf16_bits):
    written as they are in BF16, widened for the other dtypes. An E4M3Matrix is written as its codes (F8_E4M3)
    and, named `<name>_scale`, its scales (F32, a row each).
    """
    entries: list[tuple[str, np.ndarray, str]] = []
    for name, array in arrays.items():
        if isinstance(array, E4M3Matrix):
            entries += [(name, array.codes, "F8_E4M3"), (name + SCALE_SUFFIX, array.scales, "F32")]
        else:
            entries.append((name, array, dtype))
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, array, kind in entries:
        size = int(np.prod(array.shape, dtype=np.int64)) * SAFETENSORS_ITEMSIZES[kind]
        header[name] = {"dtype": kind, "shape": list(array.shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        for _, array, kind in entries:
            if kind == "F8_E4M3":
                f.write(memoryview(np.ascontiguousarray(array).reshape(-1)).cast("B"))
                continue
            numpy_dtype = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[kind]
            bits = array.dtype == np.uint16
            flat = np.ascontiguousarray(array, dtype=None if bits else np.float32).reshape(-1)
            # a block at a time: converting a 1 GB embedding whole took ~2 GB of temporaries (uint32 sums, tobytes)
            for first in range(0, flat.size, WRITE_BLOCK_ELEMENTS):
                block = flat[first : first + WRITE_BLOCK_ELEMENTS]
                if bits:
                    converted = block if kind == "BF16" else bf16_to_float32(block).astype(numpy_dtype, copy=False)
                else:
                    converted = float32_to_bf16(block) if kind == "BF16" else block.astype(numpy_dtype, copy=False)
                f.write(memoryview(converted).cast("B"))


def weight_files(model_dir: Path) -> list[Path]:
    """The weight files of a model directory, or an error that says what is missing.

    safetensors first (model.safetensors, or shards with model.safetensors.index.json), else PyTorch's
    pytorch_model.bin or its shards with pytorch_model.bin.index.json (read without PyTorch, see torchbin.py).
    """
    for single, index in (
        ("model.safetensors", "model.safetensors.index.json"),
        ("pytorch_model.bin", "pytorch_model.bin.index.json"),
    ):
        if (model_dir / single).is_file():
            return [model_dir / single]
        if (model_dir / index).is_file():
            return index_shards(model_dir / index)
    raise NllbError(
        f"{model_dir} has no weights: no model.safetensors (nor model.safetensors.index.json with its shards), "
        "no pytorch_model.bin (nor pytorch_model.bin.index.json)"
    )


def index_shards(index: Path) -> list[Path]:
    """The shard files a `*.index.json` lists, checked before any is opened.

    weight_map must be an object of tensor name -> file name, and each file a plain name (no directory, no `..`,
    not absolute) of the index's format beside the index: an index cannot make the loader open /etc/passwd or
    another model's files. A shard may be a symlink, wherever it points, as any file of a model directory may: the
    Hugging Face cache's snapshots are symlinks into its blobs; it is whoever made the directory who chose it.
    """
    weight_map = json_value(index, "weight_map", read_json_object(index).get("weight_map"), dict)
    suffix = ".safetensors" if index.name.startswith("model.safetensors") else ".bin"
    for tensor, shard in weight_map.items():
        key = f"weight_map[{quoted(tensor)}]"
        json_value(index, key, shard, str)
        if Path(shard).name != shard or not shard.endswith(suffix) or any(c in shard for c in "/\\\0"):
            raise NllbError(f"{index}: {key} is {shown(shard)}, not a plain file name ending in {suffix}: the shards "
                            "must lie beside the index")
    shards = sorted(set(weight_map.values()))
    if not shards:
        raise NllbError(f"{index}: weight_map lists no shards")
    model_dir = index.parent
    missing = [s for s in shards if not (model_dir / s).is_file()]
    if missing:
        raise NllbError(f"{model_dir} is missing {len(missing)} of the {len(shards)} shards its index lists: {', '.join(missing)}")
    return [model_dir / s for s in shards]


# safetensors dtypes -> the names `nllb info` gives them: the floating-point tensors, the only ones a model uses
# (F8_E4M3: the codes of `nllb convert --compute-type float8`'s matrices, each with its `<name>_scale` beside it)
SAFETENSORS_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "F8_E4M3": "float8_e4m3"}
FLOAT8 = "float8_e4m3"
SCALE_SUFFIX = "_scale"


def stored_tensors(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of the floating-point tensors of one weight file, from its header alone (the
    safetensors JSON header, the pickle of a .bin): no weight is read."""
    if path.name.endswith(".safetensors"):
        header, _ = read_safetensors_header(path)
        return {name: (tuple(t["shape"]), SAFETENSORS_NAMES[t["dtype"]])
                for name, t in header.items() if t["dtype"] in SAFETENSORS_NAMES}
    from .torchbin import STORAGE_NAMES, open_torch_checkpoint

    checkpoint = open_torch_checkpoint(path)  # the pickle only: the tensor data stays in the file
    return {name: (ref.shape, STORAGE_NAMES[ref.storage.kind.name]) for name, ref in checkpoint.tensors.items() if ref.floating}


def read_weights(path: Path, bf16_bits: bool = False, wanted: set[str] | None = None) -> dict[str, np.ndarray]:
    """Named float32 arrays from one weight file, safetensors or a PyTorch .bin (bf16_bits: read_safetensors';
    only the `wanted` names when given)."""
    if path.name.endswith(".safetensors"):
        return read_safetensors(path, wanted, bf16_bits=bf16_bits)
    from .torchbin import read_torch_bin

    return read_torch_bin(path, wanted)


def generation_defaults(model_dir: Path) -> dict:
    """The decoding settings a model directory's generation_config.json gives, as DecodeOptions' fields (none
    where it has no such file): num_beams, length_penalty, no_repeat_ngram_size, repetition_penalty, and the
    lengths as transformers' generate counts them: max_new_tokens, else max_length less the decoder's start token
    (NLLB's max_length 200 is 199 generated tokens, the language token included); min_new_tokens, else
    min_length less the start token. Keys that nllbcli's search does
    not take are left to transformers."""
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return {}
    found = read_json_object(path)
    given = lambda key: key in found and found[key] is not None  # noqa: E731 - transformers writes null for unset
    defaults = {}
    if given("num_beams"):
        defaults["beam_size"] = json_int(path, "num_beams", found["num_beams"], 1, MAX_BEAMS)
    if given("max_new_tokens"):
        defaults["max_length"] = json_int(path, "max_new_tokens", found["max_new_tokens"], 1, MAX_LENGTH)
    elif given("max_length"):
        defaults["max_length"] = json_int(path, "max_length", found["max_length"], 2, MAX_LENGTH + 1) - 1
    if given("length_penalty"):
        penalty = float(json_value(path, "length_penalty", found["length_penalty"], float))
        if not -LENGTH_PENALTY_LIMIT <= penalty <= LENGTH_PENALTY_LIMIT:
            raise NllbError(f"{path}: length_penalty must be from {-LENGTH_PENALTY_LIMIT} to {LENGTH_PENALTY_LIMIT}, "
                            f"not {shown(penalty)}")
        defaults["length_penalty"] = penalty
    if given("no_repeat_ngram_size"):
        defaults["no_repeat_ngram_size"] = json_int(path, "no_repeat_ngram_size", found["no_repeat_ngram_size"], 0,
                                                    MAX_LENGTH)
    if given("repetition_penalty"):
        penalty = float(json_value(path, "repetition_penalty", found["repetition_penalty"], float))
        if not FACTOR_RANGE[0] <= penalty <= FACTOR_RANGE[1]:
            raise NllbError(f"{path}: repetition_penalty must be above 0 (from {FACTOR_RANGE[0]:g} to "
                            f"{FACTOR_RANGE[1]:g}), not {shown(penalty)}")
        defaults["repetition_penalty"] = penalty
    if given("min_new_tokens"):
        defaults["min_length"] = json_int(path, "min_new_tokens", found["min_new_tokens"], 0, MAX_LENGTH)
    elif given("min_length") and found["min_length"] != 0:
        defaults["min_length"] = json_int(path, "min_length", found["min_length"], 1, MAX_LENGTH + 1) - 1
    return defaults


def decode_options(model_dir: Path | None, **given):
    """DecodeOptions: each option given (not None), else the model directory's generation_config.json's
    (generation_defaults), else nllb's own."""
    from ..options import DecodeOptions

    defaults = generation_defaults(model_dir) if model_dir is not None else {}
    return DecodeOptions(**{**defaults, **{name: value for name, value in given.items() if value is not None}})


def read_config(model_dir: Path) -> ModelConfig:
    """The model directory's config.json, checked (ModelConfig.from_json)."""
    if not (model_dir / "config.json").is_file():
        raise NllbError(f"{model_dir} has no config.json: it is not a model directory in the Hugging Face layout")
    return ModelConfig.from_json(model_dir / "config.json")


def load_checkpoint(model_dir: Path, bf16_bits: bool = False, float8: bool = False) -> tuple[ModelConfig, dict]:
    """Read a model directory: its config and every weight the model uses, as float32 arrays named as below.

    The files' headers come first: the tensors the engines use are chosen and their shapes checked against
    config.json before any data is read, and only those are read, so what is read is what the model needs, once
    each, whatever else a file holds or claims.

    bf16_bits: a checkpoint stored in bf16 throughout (`nllb convert`'s) comes as the bits of its values
    (uint16 arrays), for the GPU engine, which holds bf16: a third of the work of widening to float32 and
    uploading twice the bytes. Any other checkpoint comes as float32 all the same.

    float8: a matrix stored in F8_E4M3 (with its scales: `nllb convert --compute-type float8`) comes as a
    numerics.E4M3Matrix, as stored (the GPU engine quantizes float ones as it uploads them, translator.
    quantize_matrices on the host); without it, as its values. A tied embedding stays one object either way."""
    config = read_config(model_dir)
    files = weight_files(model_dir)
    file_of: dict[str, Path] = {}  # stored name -> its file (a name in a later file wins, as when they were merged)
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    for path in files:
        for name, (shape, dtype) in stored_tensors(path).items():
            file_of[name], shapes[name], dtypes[name] = path, shape, dtype
    chosen = select_weights(config, shapes, model_dir)
    scale_of = {name: float8_scale(model_dir, name, shapes, dtypes) for name in set(chosen.values()) if dtypes[name] == FLOAT8}
    stored: dict[str, np.ndarray] = {}
    for path in files:
        wanted = {name for name in [*chosen.values(), *scale_of.values()] if file_of[name] == path}
        if wanted:
            stored.update(read_weights(path, bf16_bits, wanted))
    check_finite(stored, file_of, dtypes)
    matrices: dict[str, E4M3Matrix] = {}
    for name, scale in scale_of.items():
        scales = stored.pop(scale)
        matrices[name] = E4M3Matrix(stored.pop(name), bf16_to_float32(scales) if scales.dtype == np.uint16 else scales)
        if not float8:
            stored[name] = matrices.pop(name).dequantize()
    if bf16_bits and any(a.dtype != np.uint16 for a in stored.values()):  # mixed: float32 for all
        stored = {name: bf16_to_float32(a) if a.dtype == np.uint16 else a for name, a in stored.items()}
    return config, {name: matrices[source] if source in matrices else stored[source] for name, source in chosen.items()}


def check_finite(arrays: dict[str, np.ndarray], file_of: dict, dtypes: dict) -> None:
    """Refuse weights that hold a NaN or an infinity, naming the first: a model computes with them without an
    error, and every translation would be empty or garbage."""
    for name, array in arrays.items():
        if has_nonfinite(array, float8=dtypes.get(name) == FLOAT8):
            raise NllbError(f"{file_of[name]}: {name} holds NaN or infinite values: the checkpoint is damaged (or was "
                            "saved from a training run that diverged), and no translation can come from it.")


def float8_scale(model_dir: Path, name: str, shapes: dict, dtypes: dict) -> str:
    """The stored name of an F8_E4M3 matrix's scales (`<name>_scale`: a float a row), checked."""
    scale = name + SCALE_SUFFIX
    rows = shapes[name][0] if len(shapes[name]) == 2 else None
    if rows is None:
        raise NllbError(f"{model_dir}: {name} is stored in float8_e4m3 but is not a matrix (shape {shapes[name]})")
    if scale not in shapes:
        raise NllbError(f"{model_dir}: {name} is stored in float8_e4m3 without its scales ({scale})")
    if dtypes[scale] == FLOAT8 or tuple(shapes[scale]) not in ((rows,), (rows, 1)):
        raise NllbError(f"{model_dir}: {scale} must hold a float a row of {name} ({rows}, 1), not {dtypes[scale]} "
                        f"{tuple(shapes[scale])}")
    return scale


TIED = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")


def select_weights(config: ModelConfig, shapes: dict[str, tuple[int, ...]], where: Path) -> dict[str, str]:
    """The stored tensor each weight of the engines comes from (`encoder.layers.0.fc1.weight` ->
    `model.encoder.layers.0.fc1.weight`), every shape checked against config.json: from the stored names and
    shapes alone, so before any weight is read (and by `nllb info`, which reads none).

    Checkpoints saved from M2M100ForConditionalGeneration prefix everything with `model.`; those saved from
    M2M100Model do not. The tied embedding may be stored as shared, as either embed_tokens, or as lm_head;
    tied, the three embedding weights come from one stored tensor, so the engines hold one 256k-row table.
    """
    names = {name.removeprefix("model."): name for name in shapes}
    shared = next((n for n in TIED if n in names), None)
    if shared is None:
        raise NllbError(f"{where}: no embedding found (looked for {', '.join(TIED)})")
    if not config.tie_word_embeddings and "lm_head.weight" not in names:
        raise NllbError(f"{where}: config.json says tie_word_embeddings false but there is no lm_head.weight")
    embeddings = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")
    chosen = {n: names[shared] if config.tie_word_embeddings else names.get(n, names[shared]) for n in embeddings}
    d = config.d_model
    expected: dict[str, tuple[int, ...]] = {"lm_head.weight": (config.vocab_size, d)}
    for side, layers, ffn in (
        ("encoder", config.encoder_layers, config.encoder_ffn_dim),
        ("decoder", config.decoder_layers, config.decoder_ffn_dim),
    ):
        # the layers held first: the names expected below grow with the layer count config.json gives, they do not
        held = {name.split(".")[2] for name in names if name.startswith(f"{side}.layers.")}
        if layers > len(held):
            raise NllbError(f"{where}: the weights do not match config.json: it says {side}_layers {layers}, the "
                            f"weights hold {len(held)} {side} layers")
        layer: dict[str, tuple[int, ...]] = {}  # a layer's modules by their weight's shape
        for attn in ("self_attn", "encoder_attn") if side == "decoder" else ("self_attn",):
            layer |= {f"{attn}.{proj}": (d, d) for proj in ("q_proj", "k_proj", "v_proj", "out_proj")}
            layer[f"{attn}_layer_norm"] = (d,)
        layer |= {"fc1": (ffn, d), "fc2": (d, ffn), "final_layer_norm": (d,)}
        modules = {f"{side}.layers.{i}.{module}": shape for i in range(layers) for module, shape in layer.items()}
        for module, shape in {**modules, f"{side}.layer_norm": (d,)}.items():
            expected[module + ".weight"], expected[module + ".bias"] = shape, shape[:1]  # a bias: one per output
    missing = [n for n in expected if n not in names and n not in chosen]
    if missing:
        shown_names = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise NllbError(f"{where}: the weights do not match config.json: missing {shown_names}")
    chosen.update({name: names[name] for name in expected if name not in chosen})
    for name, shape in [*expected.items(), *((n, (config.vocab_size, d)) for n in embeddings[:2])]:
        if tuple(shapes[chosen[name]]) != shape:
            raise NllbError(f"{where}: {name} has shape {tuple(shapes[chosen[name]])} but config.json implies {shape}")
    return chosen


# ---------------------------------------------------------------------------------------------- a job's model

# what loading reads from a model directory besides the weights: the config, the tokenizer's files (NLLB's and
# M2M-100's), the decoding defaults and a sharded checkpoint's index; and from a PEFT adapter's directory
MODEL_FILES = ("config.json", "generation_config.json", "sentencepiece.bpe.model", "tokenizer.json",
               "tokenizer_config.json", "vocab.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
HASHED_BYTES = 1 << 20  # a file up to this size is known by its content; a larger one (weights) by size and mtime
MODEL_PARTS = ("model", "adapter")  # model_identity's directories of files (changed_files says how they differ)
DEFAULT_KV_CACHE = "bfloat16"  # the K/V cache type a job's identity leaves out (options.KV_CACHE_TYPES)


def model_identity(model_dir: str | Path, adapter: str | Path | None = None, compute_type: str = "bfloat16",
                   kv_cache_type: str = "bfloat16") -> dict:
    """The model part of a job's identity (job.spec.identity_of): what the model computes
    with, so that --resume never continues a job's rows with another model's. The model's directory and files
    (MODEL_FILES and the weights), the adapter's likewise (None without one), the compute type, and the K/V cache
    type where it is not the default, bfloat16 (an identity without one means bfloat16). A translator made without
    a model directory has none (None)."""
    model = Path(model_dir) if model_dir else None
    identity = {"model": None if model is None else files_identity(model, named_files(model, MODEL_FILES) + weight_files(model)),
                "adapter": None if adapter is None else files_identity(Path(adapter), named_files(Path(adapter), ADAPTER_FILES)),
                "compute_type": compute_type}
    if kv_cache_type != DEFAULT_KV_CACHE:
        identity["kv_cache_type"] = kv_cache_type
    return identity


def named_files(directory: Path, names: tuple[str, ...]) -> list[Path]:
    return [directory / name for name in names if (directory / name).is_file()]


def files_identity(directory: Path, files: list[Path]) -> dict:
    """A directory (its absolute path, links resolved) and each of its files: its size and the SHA-256 of its
    content up to HASHED_BYTES, else its size and modification time (hashing gigabytes of weights would take
    seconds a job; writing them anew changes their time)."""
    known = {}
    for path in files:
        try:
            info = path.stat()
            if info.st_size <= HASHED_BYTES:
                known[path.name] = {"size": info.st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
            else:
                known[path.name] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns}
        except OSError as exc:
            raise NllbError(f"cannot read {path}: {exc.strerror or exc}") from None
    return {"path": str(directory.resolve()), "files": known}


def changed_files(was, now) -> str:
    """How a model (or an adapter) differs between two of model_identity's parts, in words: another directory,
    or which of its files changed."""
    if isinstance(was, str):  # a job's identity from before the files were in it
        return "an earlier nllb recorded its directory alone, not its files"
    was = was if isinstance(was, dict) else {}
    if now is None or was.get("path") != now["path"]:
        return f"was {was.get('path', 'none')}, now {now['path'] if now else 'none'}"
    files, before = now["files"], was.get("files") or {}
    names = sorted(name for name in set(files) | set(before) if files.get(name) != before.get(name))
    return f"{', '.join(names)} in {now['path']} changed"


def worker_disagreement(expected: dict, loaded: dict, same_host: bool = True) -> str | None:
    """How a worker's model (model_identity of what it loaded) differs from the job's (`expected`, the model part
    of its identity), in words; None where it computes as the job does. A worker on another host (a Ray actor)
    has its own copy of the weights, whose modification times are its own: there its files are compared by size
    and hash, not by time."""
    if loaded["compute_type"] != expected["compute_type"]:
        return f"computes in {loaded['compute_type']}, and the job in {expected['compute_type']}"
    kv_loaded, kv_expected = (part.get("kv_cache_type", DEFAULT_KV_CACHE) for part in (loaded, expected))
    if kv_loaded != kv_expected:
        return f"keeps its K/V cache in {kv_loaded}, and the job in {kv_expected}"
    for part in MODEL_PARTS:
        was, now = expected.get(part), loaded.get(part)
        if not same_host:
            was, now = without_times(was), without_times(now)
        if was != now:
            return f"has another {part} than the job: {changed_files(was, now)}"
    return None


def without_times(part):
    """A model_identity part without its files' modification times."""
    if not isinstance(part, dict):
        return part
    files = {name: {key: value for key, value in known.items() if key != "mtime_ns"} for name, known in part["files"].items()}
    return {**part, "files": files}
