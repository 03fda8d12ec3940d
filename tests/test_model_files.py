"""Model and adapter directories as untrusted input: a malformed config.json, tokenizer file, safetensors header,
shard index or adapter config is one `Error:` line (exit 1) from `nllb info` and from `nllb translate` alike,
never a traceback, and is refused before any weight is read. (Hostile pytorch_model.bin archives and pickles:
tests/test_torchbin.py.)"""

import json
import math
import shutil
import struct
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nllbcli.model import checkpoint
from nllbcli.model.checkpoint import (INT_RANGES, MAX_ID, MAX_POSITIONS, ModelConfig, load_checkpoint, read_safetensors,
                                read_safetensors_header, write_safetensors)
from nllbcli.cli import cli
from nllbcli.errors import NllbError

HERE = Path(__file__).parent
MODELS = HERE / "models"
TINY_A_CONFIG = json.loads((MODELS / "tiny-a" / "config.json").read_text())
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """Copies of the test models, which the directories below link to: no test can change tests/models."""
    root = tmp_path_factory.mktemp("sources")
    for name in ("tiny-a", "tiny-b", "tiny-m2m", "tiny-bin-sharded", "tiny-a-lora"):
        shutil.copytree(MODELS / name, root / name)
    return root


def linked(sources: Path, tmp_path: Path, name: str = "tiny-a") -> Path:
    """A model directory of symlinks to a copy of tests/models/NAME (as the Hugging Face cache's snapshots are
    symlinks into its blobs); a test replaces the file it corrupts."""
    model = tmp_path / name
    model.mkdir(parents=True)
    for f in (sources / name).iterdir():
        (model / f.name).symlink_to(f)
    return model


def replace(model: Path, name: str, content) -> None:
    """Put `content` (bytes, text, or a value to write as JSON) in place of the model's file NAME."""
    (model / name).unlink(missing_ok=True)
    if isinstance(content, bytes):
        (model / name).write_bytes(content)
    else:
        (model / name).write_text(content if isinstance(content, str) else json.dumps(content))


def info_and_translate(model: Path, tmp_path: Path, *options: str) -> list:
    """`nllb info MODEL` and `nllb translate --model MODEL` of a one-line file, as a user runs them."""
    (tmp_path / "in.txt").write_text("Hello world!\n")
    return [
        CliRunner().invoke(cli, ["info", str(model)]),
        CliRunner().invoke(cli, ["translate", "--model", str(model), "--device", "cpu", "--src", "eng_Latn",
                                 "--tgt", "fra_Latn", "-q", "--beam-size", "1", "--max-length", "4", *options,
                                 str(tmp_path / "in.txt"), str(tmp_path / "out.txt")]),
    ]


def one_error_line(result) -> str:
    """The one line a refused command writes: `Error: ...` on stderr, exit 1, no exception but click's exit."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert result.stdout == ""
    return lines[0]


def refused_by_both(model: Path, tmp_path: Path, *named: str) -> list[str]:
    lines = [one_error_line(result) for result in info_and_translate(model, tmp_path)]
    assert not (tmp_path / "out.txt").exists()
    for line in lines:
        for part in named:
            assert part in line, line
    return lines


# ---------------------------------------------------------------------------------------------- config.json

INT_BAD = ["64", 64.0, 1.5, True, [64], {"n": 64}, -1, MAX_ID + 1, 10**30, float("nan")]
BOOL_BAD = [1, 0, "true", 1.0, []]
# Each field's bad values: the kinds no field of its type takes, then values of the right type out of range, and
# values the engines could run but tiny-a's weights do not fit (the shapes are checked from the headers, so info
# refuses them too). A bad value is named in the message with its key, except where the weights say it is wrong.
CONFIG_BAD = {
    "vocab_size": INT_BAD + [0, 605, 607],
    "d_model": INT_BAD + [0, 1, 2, 3, 63, 128],
    "encoder_layers": INT_BAD + [0, 4],
    "decoder_layers": INT_BAD + [0, 3, 2**31 - 1],
    "encoder_attention_heads": INT_BAD + [0, 3, 128],
    "decoder_attention_heads": INT_BAD + [0, 7],
    "encoder_ffn_dim": INT_BAD + [0, 100],
    "decoder_ffn_dim": INT_BAD + [0, 128],
    "max_position_embeddings": INT_BAD + [0, 1, 2, MAX_POSITIONS + 1],
    "pad_token_id": INT_BAD + [0, 3, 606],
    "bos_token_id": INT_BAD + [606, 10**6],
    "eos_token_id": INT_BAD + [1, 606, 99999],
    "decoder_start_token_id": INT_BAD + [606],
    "scale_embedding": BOOL_BAD,
    "tie_word_embeddings": BOOL_BAD + [False],  # tiny-a stores no lm_head.weight
    "activation_function": [5, True, [], {}, "", "swish", "RELU"],
}


def test_every_field_of_model_config_is_in_the_table():
    assert set(CONFIG_BAD) == {f.name for f in fields(ModelConfig)}


@pytest.mark.parametrize("field", sorted(CONFIG_BAD))
def test_a_bad_config_value_is_one_error_line_from_info_and_translate(sources, tmp_path, field):
    model = linked(sources, tmp_path)
    for value in CONFIG_BAD[field]:
        replace(model, "config.json", {**TINY_A_CONFIG, field: value})
        for line in refused_by_both(model, tmp_path, "config.json"):
            assert field in line or "implies" in line, (value, line)


@pytest.mark.parametrize("content", ["[]", '"hello"', "5", "null", "true", "", "{", "[" * 100_000, b"\xff\xfe{}",
                                     '{"model_type": ["m2m_100"]}'])
def test_a_config_that_is_not_an_object_is_one_error_line(sources, tmp_path, content):
    model = linked(sources, tmp_path)
    replace(model, "config.json", content)
    refused_by_both(model, tmp_path, "config.json")


def test_a_json_file_too_large_is_refused_unread(sources, tmp_path, monkeypatch):
    model = linked(sources, tmp_path)
    monkeypatch.setattr(checkpoint, "MAX_JSON_BYTES", 100)
    refused_by_both(model, tmp_path, "config.json: it is over 100 bytes")


def test_null_is_the_default_as_in_transformers(sources, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "m2m_100", **{f.name: None for f in fields(ModelConfig)}}))
    assert ModelConfig.from_json(path) == ModelConfig()
    model = linked(sources, tmp_path)
    nulls = ("pad_token_id", "eos_token_id", "scale_embedding", "activation_function", "tie_word_embeddings")
    replace(model, "config.json", {**TINY_A_CONFIG, **{key: None for key in nulls}})
    assert [r.exit_code for r in info_and_translate(model, tmp_path)] == [0, 0]


def test_the_fewest_positions_translate(sources, tmp_path):
    """max_position_embeddings 3 holds [src_lang, one piece, </s>]: the source is cut to that and translated."""
    model = linked(sources, tmp_path)
    replace(model, "config.json", {**TINY_A_CONFIG, "max_position_embeddings": 3})
    assert [r.exit_code for r in info_and_translate(model, tmp_path)] == [0, 0]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
FIELD_VALUES = st.one_of(JSON_VALUES, *(st.integers(least - 2, least + 70) for least, _ in INT_RANGES.values()),
                         st.sampled_from(["relu", "gelu"]))


@SETTINGS
@given(st.dictionaries(st.sampled_from([f.name for f in fields(ModelConfig)]), FIELD_VALUES, max_size=6))
@example({"encoder_attention_heads": 0})
@example({"d_model": 3, "encoder_attention_heads": 1, "decoder_attention_heads": 1})
def test_any_config_is_refused_in_a_sentence_or_fit_to_run(tmp_path, changes):
    """Whatever config.json holds: an NllbError naming the file, or a config every engine can take."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_A_CONFIG, **changes}))
    try:
        config = ModelConfig.from_json(path)
    except NllbError as error:
        assert str(error).startswith(str(path))
        return
    for f in fields(ModelConfig):
        value = getattr(config, f.name)
        assert type(value) is {"int": int, "bool": bool, "str": str}[f.type], f.name
        least, most = INT_RANGES.get(f.name, (0, MAX_ID))
        assert f.type != "int" or least <= value <= most, f.name
    assert config.d_model % config.encoder_attention_heads == config.d_model % config.decoder_attention_heads == 0
    assert max(config.pad_token_id, config.bos_token_id, config.eos_token_id, config.decoder_start_token_id) < config.vocab_size


# -------------------------------------------------------------------------------------- safetensors headers


def safetensors_bytes(header, data: bytes = bytes(16), length: int | None = None) -> bytes:
    encoded = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(encoded) if length is None else length) + encoded + data


F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("header, named", [
    ([], "its header is the list [], not a JSON object"),
    ("x", "its header is the string"),
    (b"{", "is not a readable safetensors file"),
    (b"[" * 100_000, "is not a readable safetensors file"),
    ({"w": 5}, "tensor w is described by 5"),
    ({"w": []}, "tensor w is described by the list []"),
    ({"w": {"dtype": "F32", "shape": [2]}}, "tensor w's data_offsets must be two integers [begin, end], not null"),
    ({"w": {**F32, "dtype": 5}}, "tensor w's dtype must be a string, not 5"),
    ({"w": {**F32, "dtype": None}}, "tensor w's dtype must be a string, not null"),
    ({"w": {**F32, "shape": "2"}}, "tensor w's shape must be a list of sizes"),
    ({"w": {**F32, "shape": [2.0]}}, "tensor w's shape must be a list of sizes"),
    ({"w": {**F32, "shape": [-2]}}, "tensor w's shape must be a list of sizes"),
    ({"w": {**F32, "shape": [True, 2]}}, "tensor w's shape must be a list of sizes"),
    ({"w": {**F32, "data_offsets": [0]}}, "tensor w's data_offsets must be two integers"),
    ({"w": {**F32, "data_offsets": [0, 8, 16]}}, "tensor w's data_offsets must be two integers"),
    ({"w": {**F32, "data_offsets": [0, "8"]}}, "tensor w's data_offsets must be two integers"),
    ({"w": {**F32, "data_offsets": [0, 8.0]}}, "tensor w's data_offsets must be two integers"),
    ({"w": {**F32, "data_offsets": [8, 0]}}, "tensor w's data_offsets [8, 0] do not fit the file"),
    ({"w": {**F32, "data_offsets": [-8, 0]}}, "tensor w's data_offsets [-8, 0] do not fit the file"),
    ({"w": {**F32, "data_offsets": [16, 24]}}, "tensor w's data_offsets [16, 24] do not fit the file (16 bytes"),
    ({"w": {**F32, "data_offsets": [0, 4]}}, "tensor w's data_offsets [0, 4] do not fit its shape [2] of F32 (8 bytes)"),
    ({"w": {**F32, "shape": [2**40, 2**40]}}, "do not fit its shape"),  # the element count overflowed int64 to 0
    ({"__metadata__": [], "w": F32}, "__metadata__ must be an object of strings, not the list []"),
    ({"__metadata__": {"format": 5}, "w": F32}, "__metadata__ must be an object of strings"),
])
def test_a_bad_safetensors_header_is_one_error_line(sources, tmp_path, header, named):
    model = linked(sources, tmp_path)
    replace(model, "model.safetensors", safetensors_bytes(header))
    refused_by_both(model, tmp_path, "model.safetensors", named)


def test_a_header_longer_than_the_file_is_refused(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(safetensors_bytes({"w": F32}, length=10_000))
    with pytest.raises(NllbError, match="header length out of range"):
        read_safetensors_header(tmp_path / "x.safetensors")


ENTRY_VALUES = st.one_of(
    JSON_VALUES,
    st.sampled_from(["F32", "F16", "BF16", "I64", "F64", "X"]),
    st.lists(st.integers(-2, 40), max_size=3),
)
ENTRIES = st.fixed_dictionaries({}, optional={"dtype": ENTRY_VALUES, "shape": ENTRY_VALUES, "data_offsets": ENTRY_VALUES})


@SETTINGS
@given(st.dictionaries(st.sampled_from(["a", "b", "__metadata__"]), ENTRIES | JSON_VALUES, max_size=3) | JSON_VALUES)
@example({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})
def test_any_header_is_refused_in_a_sentence_or_read(tmp_path, header):
    """Whatever a safetensors header holds: an NllbError naming the file, or entries every reader can take."""
    path = tmp_path / "x.safetensors"
    path.write_bytes(safetensors_bytes(header, data=bytes(40)))
    try:
        entries, start = read_safetensors_header(path)
    except NllbError as error:
        assert str(error).startswith(str(path))
        return
    for entry in entries.values():
        begin, end = entry["data_offsets"]
        assert 0 <= begin <= end <= path.stat().st_size - start
        assert all(type(n) is int and n >= 0 for n in entry["shape"]) and type(entry["dtype"]) is str
    try:
        arrays = read_safetensors(path)
    except NllbError as error:  # a dtype nllbcli does not read
        assert "is supported" in str(error) or "are supported" in str(error)
    else:
        assert all(a.shape == tuple(entries[n]["shape"]) for n, a in arrays.items())


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4))
def test_a_damaged_safetensors_file_is_refused_in_a_sentence_or_read(tmp_path, damage):
    """Bytes of a small safetensors file changed anywhere (its header mostly): NllbError, or it reads."""
    path = tmp_path / "x.safetensors"
    write_safetensors(path, {"a": np.ones((2, 3), np.float32), "b": np.zeros(4, np.float32)}, "F32")
    raw = bytearray(path.read_bytes())
    for at, byte in damage:
        raw[at % len(raw)] = byte
    path.write_bytes(bytes(raw))
    try:
        arrays = read_safetensors(path)
    except NllbError:
        return
    assert sum(math.prod(a.shape) for a in arrays.values()) * 4 <= len(raw)


# -------------------------------------------------------------------------------------------- shard indexes


@pytest.mark.parametrize("weight_map, named", [
    (None, "weight_map must be an object, not null"),
    ([], "weight_map must be an object, not the list []"),
    ({}, "weight_map lists no shards"),
    ({"model.shared.weight": 5}, 'weight_map["model.shared.weight"] must be a string, not 5'),
    ({"model.shared.weight": "../../etc/passwd"}, "not a plain file name ending in .safetensors"),
    ({"model.shared.weight": "/etc/passwd"}, "not a plain file name"),
    ({"model.shared.weight": "sub/model-00001-of-00002.safetensors"}, "not a plain file name"),
    ({"model.shared.weight": "..\\model.safetensors"}, "not a plain file name"),
    ({"model.shared.weight": "config.json"}, "not a plain file name ending in .safetensors"),
])
def test_a_bad_shard_index_is_one_error_line(sources, tmp_path, weight_map, named):
    model = linked(sources, tmp_path, "tiny-b")
    replace(model, "model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})
    refused_by_both(model, tmp_path, "model.safetensors.index.json", named)


@pytest.mark.parametrize("how", ["relative", "absolute"])
@pytest.mark.parametrize("model_name, single, index", [
    ("tiny-a", "model.safetensors", "model.safetensors.index.json"),
    ("tiny-bin-sharded", "pytorch_model-00001-of-00002.bin", "pytorch_model.bin.index.json"),
])
def test_an_index_cannot_name_a_file_outside_the_model(sources, tmp_path, how, model_name, single, index):
    """A working checkpoint beside the directory, named by its index: it is never opened (it loaded before)."""
    model = linked(sources, tmp_path, model_name)
    outside = tmp_path / ("outside" + Path(single).suffix)
    shutil.copy(sources / model_name / single, outside)
    name = f"../{outside.name}" if how == "relative" else str(outside)
    for f in model.glob("*" + Path(single).suffix):
        f.unlink()
    replace(model, index, {"weight_map": {"model.shared.weight": name}})
    opened = []
    real_open = open

    def watch(file, *args, **kwargs):
        opened.append(Path(file).name)
        return real_open(file, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("builtins.open", watch)
        refused_by_both(model, tmp_path, index, "not a plain file name")
    assert outside.name not in opened


def test_shards_that_are_symlinks_out_of_the_directory_load(sources, tmp_path):
    """The Hugging Face cache's layout: every file of a snapshot is a symlink into ../../blobs."""
    model = linked(sources, tmp_path, "tiny-b")
    assert (model / "model-00001-of-00002.safetensors").is_symlink()
    _, weights = load_checkpoint(model)
    _, expected = load_checkpoint(MODELS / "tiny-b")
    assert weights.keys() == expected.keys()
    assert all(np.array_equal(weights[n], expected[n]) for n in expected)


# ------------------------------------------------------------------------------------------ tokenizer files


def tokenizer_json_with_id(old: int, new: int) -> dict:
    """tiny-a's tokenizer.json with the piece of id `old` given id `new`."""
    data = json.loads((MODELS / "tiny-a" / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab[next(piece for piece, i in vocab.items() if i == old)] = new
    return data


@pytest.mark.parametrize("content, named", [
    ("[]", "must hold a JSON object, not the list []"),
    ('{"tokenizer_class": 5}', "tokenizer_class must be a string, not 5"),
    ('{"tokenizer_class": ["NllbTokenizer"]}', "tokenizer_class must be a string"),
    ("{", "cannot read"),
    (b"\xff", "cannot read"),
])
def test_a_bad_tokenizer_config_json_is_one_error_line(sources, tmp_path, content, named):
    model = linked(sources, tmp_path)
    replace(model, "tokenizer_config.json", content)
    refused_by_both(model, tmp_path, "tokenizer_config.json", named)


@pytest.mark.parametrize("content, named", [
    ("[]", "must hold a JSON object"),
    ({"model": []}, "model must be an object, not the list []"),
    ({"model": {"vocab": 5}}, "model.vocab must be an object, not 5"),
    ({"model": {"vocab": {"<s>": "0"}}}, 'model.vocab["<s>"] must be an integer, not the string "0"'),
    ({"model": {"vocab": {"<s>": -1}}}, 'model.vocab["<s>"] must be an integer from 0'),
    ({"model": {"vocab": {"<s>": 0, "x": 1e400}}}, 'model.vocab["x"] must be an integer, not Infinity'),
    ({"model": {"vocab": [["<s>"]]}}, "model.vocab[0] must be a [piece, score] pair"),
    ({"model": {"vocab": [[5, 0.0]]}}, "model.vocab[0] must be a [piece, score] pair"),
    ({"model": {"vocab": {}}, "added_tokens": {}}, "added_tokens must be a list, not the object {}"),
    ({"model": {"vocab": {}}, "added_tokens": [5]}, "added_tokens[0] must be an object, not 5"),
    ({"model": {"vocab": {}}, "added_tokens": [{"content": 5, "id": 0}]}, "added_tokens[0].content must be a string"),
    ({"model": {"vocab": {}}, "added_tokens": [{"content": "<s>", "id": True}]}, "added_tokens[0].id must be an integer, not true"),
    (tokenizer_json_with_id(10, 5000), "the tokenizer has 5001 ids but the model's vocab_size is 606"),  # past the embedding
])
def test_a_bad_tokenizer_json_is_one_error_line(sources, tmp_path, content, named):
    model = linked(sources, tmp_path)
    replace(model, "tokenizer.json", content)
    refused_by_both(model, tmp_path, named)


def m2m_vocab_with(**changes) -> dict:
    return {**json.loads((MODELS / "tiny-m2m" / "vocab.json").read_text()), **changes}


@pytest.mark.parametrize("content, named", [
    ("[]", "vocab.json must hold a JSON object"),
    (m2m_vocab_with(**{"<pad>": True}), '"<pad>" must be an integer, not true'),  # True == 1 passed for <pad>
    (m2m_vocab_with(hello="5"), '"hello" must be an integer, not the string "5"'),
    (m2m_vocab_with(hello=1.5), '"hello" must be an integer, not 1.5'),
])
def test_a_bad_m2m_vocab_json_is_one_error_line(sources, tmp_path, content, named):
    model = linked(sources, tmp_path, "tiny-m2m")
    replace(model, "vocab.json", content)
    refused_by_both(model, tmp_path, named)


# ------------------------------------------------------------------------------------------------- adapters


@pytest.mark.parametrize("changes, named", [
    ({"r": 0}, "r must be an integer from 1"),
    ({"r": 4.0}, "r must be an integer, not 4.0"),
    ({"r": True}, "r must be an integer, not true"),
    ({"r": None}, "r must be an integer, not null"),
    ({"lora_alpha": "8"}, 'lora_alpha must be a number, not the string "8"'),
    ({"lora_alpha": True}, "lora_alpha must be a number, not true"),
    ({"lora_alpha": float("nan")}, "lora_alpha must be a number, not NaN"),
    ({"lora_alpha": -8}, "lora_alpha must be a positive number, not -8"),
    ({"use_rslora": "yes"}, "use_rslora must be true or false"),
    ({"alpha_pattern": []}, "alpha_pattern must be an object, not the list []"),
    ({"alpha_pattern": {"v_proj": "3"}}, 'alpha_pattern["v_proj"] must be a number'),
    ({"alpha_pattern": {"(": 3.0}}, "alpha_pattern's key the string \"(\" is not a regular expression"),
    ({"base_model_name_or_path": 5}, "base_model_name_or_path must be a string, not 5"),
])
def test_a_bad_adapter_config_is_one_error_line(sources, tmp_path, changes, named):
    adapter = linked(sources, tmp_path, "tiny-a-lora")
    settings_ = json.loads((sources / "tiny-a-lora" / "adapter_config.json").read_text())
    replace(adapter, "adapter_config.json", {**settings_, **changes})
    result = info_and_translate(MODELS / "tiny-a", tmp_path, "--adapter", str(adapter))[1]
    assert "adapter_config.json" in one_error_line(result) and named in result.stderr


def test_an_adapter_of_rank_0_is_one_error_line(sources, tmp_path):
    adapter = linked(sources, tmp_path, "tiny-a-lora")
    lora = read_safetensors(sources / "tiny-a-lora" / "adapter_model.safetensors")
    empty = {n: a[:0] if ".lora_A." in n else a[:, :0] for n, a in lora.items()}
    (adapter / "adapter_model.safetensors").unlink()
    write_safetensors(adapter / "adapter_model.safetensors", empty, "F32")
    result = info_and_translate(MODELS / "tiny-a", tmp_path, "--adapter", str(adapter))[1]
    assert "LoRA matrices" in one_error_line(result)  # (it divided by the rank 0)


@pytest.mark.parametrize("dtype", ["F32", "BF16", "F16"])
@pytest.mark.parametrize("value", [math.nan, -math.inf])
def test_weights_that_are_not_finite_are_one_error_line(sources, tmp_path, dtype, value):
    """A damaged checkpoint is refused at load: it computes without an error, and greedy search wrote empty
    translations while beam search failed in NumPy."""
    model = linked(sources, tmp_path)
    weights = read_safetensors(sources / "tiny-a" / "model.safetensors")
    weights["model.decoder.layers.1.fc2.weight"][3, 5] = value
    replace(model, "model.safetensors", b"")
    write_safetensors(model / "model.safetensors", weights, dtype)
    for beams in ("1", "2"):
        line = one_error_line(info_and_translate(model, tmp_path, "--beam-size", beams)[1])
        assert line == (f"Error: {model / 'model.safetensors'}: model.decoder.layers.1.fc2.weight holds NaN or infinite "
                        "values: the checkpoint is damaged (or was saved from a training run that diverged), and no "
                        "translation can come from it.")
    if dtype == "BF16":  # as the GPU engine reads it: the bits
        with pytest.raises(NllbError, match="fc2.weight holds NaN or infinite values"):
            load_checkpoint(model, bf16_bits=True)


def test_bf16_bits_and_e4m3_codes_that_are_not_finite_are_found():
    from nllbcli.model.engine.numerics import FINITE_CHECK_BLOCK, has_nonfinite

    bits = np.full(FINITE_CHECK_BLOCK + 5, 0x7F7F, np.uint16)  # bf16's largest finite number
    assert not has_nonfinite(bits) and not has_nonfinite(bits | 0x8000)
    for bad in (0x7F80, 0xFF80, 0x7FC0, 0xFFFF):  # +inf, -inf, NaNs
        bits[-1] = bad
        assert has_nonfinite(bits)
    codes = np.arange(256, dtype=np.uint8)
    assert has_nonfinite(codes, float8=True) and not has_nonfinite(np.delete(codes, [0x7F, 0xFF]), float8=True)


@pytest.mark.parametrize("scale", [math.nan, 1e30])
def test_an_adapter_that_is_not_finite_or_overflows_merged_is_one_error_line(sources, tmp_path, scale):
    adapter = linked(sources, tmp_path, "tiny-a-lora")
    lora = read_safetensors(sources / "tiny-a-lora" / "adapter_model.safetensors")
    a = next(n for n in sorted(lora) if ".lora_A." in n)
    for name in (a, a.replace(".lora_A.", ".lora_B.")):  # B @ A of 1e30 x 1e30 is past float32's range
        lora[name] = lora[name] * np.float32(scale)
    replace(adapter, "adapter_model.safetensors", b"")
    write_safetensors(adapter / "adapter_model.safetensors", lora, "F32")
    line = one_error_line(info_and_translate(MODELS / "tiny-a", tmp_path, "--adapter", str(adapter))[1])
    assert ("holds NaN or infinite values" if math.isnan(scale) else "merged weight is past float32's range") in line
