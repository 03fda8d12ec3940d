"""pytorch_model.bin without PyTorch: the fixtures torch wrote, every tensor layout, and pickles that must not run."""

import io
import json
import os
import pickle
import re
import shutil
import struct
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nllbcli.model.checkpoint import load_checkpoint, weight_files, write_safetensors
from nllbcli.cli import cli
from nllbcli.model.engine.reference import bf16_round
from nllbcli.errors import NllbError
from nllbcli.options import DecodeOptions
from nllbcli.model import torchbin
from nllbcli.model.torchbin import open_torch_checkpoint, read_torch_bin
from nllbcli.model.translator import load_translator

HERE = Path(__file__).parent
TINY_A = HERE / "models" / "tiny-a"
TINY_BIN = HERE / "models" / "tiny-bin"  # tiny-a's weights, float32, torch.save'd by tools/make_bin_fixtures.py
TINY_BIN_SHARDED = HERE / "models" / "tiny-bin-sharded"  # the same in bfloat16, two shards and an index
TENSORS = HERE / "models" / "torch-tensors"
EXPECTED = dict(np.load(TENSORS / "expected.npz"))


def test_bin_loads_exactly_the_arrays_of_the_safetensors_model():
    config_a, a = load_checkpoint(TINY_A)
    config_b, b = load_checkpoint(TINY_BIN)
    assert config_a == config_b
    assert set(a) == set(b)
    for name in a:
        assert b[name].dtype == np.float32, name
        np.testing.assert_array_equal(b[name], a[name], err_msg=name)


def test_sharded_bfloat16_bin_loads_the_bfloat16_rounding():
    assert [p.name for p in weight_files(TINY_BIN_SHARDED)] == [
        "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
    _, a = load_checkpoint(TINY_A)
    _, b = load_checkpoint(TINY_BIN_SHARDED)
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_array_equal(b[name], bf16_round(a[name]), err_msg=name)


def test_tied_embedding_saved_under_four_names_is_read_once():
    """torch.save writes the one storage once; the loader must not make four copies of the table."""
    checkpoint = open_torch_checkpoint(TINY_BIN / "pytorch_model.bin")
    names = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")
    assert len({checkpoint.tensors[n] for n in names}) == 1
    stored = read_torch_bin(TINY_BIN / "pytorch_model.bin")
    assert all(stored[n] is stored[names[0]] for n in names)
    _, weights = load_checkpoint(TINY_BIN)
    assert weights["lm_head.weight"] is weights["encoder.embed_tokens.weight"] is weights["decoder.embed_tokens.weight"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_tensor_layout_reads_exactly(name):
    """Transposed and sliced views, storage offsets, shared storages, every dtype, 0-d and empty tensors."""
    checkpoint = open_torch_checkpoint(TENSORS / "tensors.bin")
    ref = checkpoint.tensors[name]
    array = checkpoint.array(ref)
    if ref.storage.kind.name == "BFloat16Storage":
        assert array.dtype == np.uint16
        array = (array.astype(np.uint32) << 16).view(np.float32)
    assert array.shape == EXPECTED[name].shape
    assert array.dtype == EXPECTED[name].dtype
    assert array.flags.c_contiguous
    np.testing.assert_array_equal(array, EXPECTED[name])


def test_strided_views_are_what_torch_saved():
    """The fixture really holds non-default strides and offsets (else the test above proves little)."""
    tensors = open_torch_checkpoint(TENSORS / "tensors.bin").tensors
    assert tensors["transposed"].stride == (1, 5)
    assert tensors["every_other"].stride == (5, 2)
    assert tensors["offset_slice"].offset == 7 and tensors["second_view"].offset == 20
    assert tensors["offset_slice"].storage == tensors["second_view"].storage


def test_floating_tensors_become_float32_and_integer_buffers_are_skipped():
    arrays = read_torch_bin(TENSORS / "tensors.bin")
    assert "int_buffer" not in arrays
    assert set(arrays) == set(EXPECTED) - {"int_buffer"}
    assert all(a.dtype == np.float32 for a in arrays.values())
    np.testing.assert_array_equal(arrays["half"], EXPECTED["half"].astype(np.float32))


def test_bin_model_translates_like_the_safetensors_model():
    options = DecodeOptions(beam_size=2, max_length=12)
    texts = ["Hello world!", "The quick brown fox jumps over the lazy dog."]
    expected = load_translator(str(TINY_A), "cpu").translate_sentences(texts, "eng_Latn", "fra_Latn", options)
    assert load_translator(str(TINY_BIN), "cpu").translate_sentences(texts, "eng_Latn", "fra_Latn", options) == expected


def test_translate_command_reads_a_bin_directory(tmp_path):
    (tmp_path / "in.txt").write_text("Hello world!\n")
    runner = CliRunner()
    results = [
        runner.invoke(cli, ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn", "--model", str(model), "--device", "cpu",
                            "-q", str(tmp_path / "in.txt"), "-"])
        for model in (TINY_A, TINY_BIN)
    ]
    assert [r.exit_code for r in results] == [0, 0]
    assert results[1].output == results[0].output != ""


def test_safetensors_are_preferred_when_both_are_there(tmp_path):
    model = tmp_path / "both"
    shutil.copytree(TINY_BIN, model)
    _, a = load_checkpoint(TINY_A)
    write_safetensors(model / "model.safetensors", {"model.shared.weight": a["lm_head.weight"] * 2,
                      **{"model." + k: v for k, v in a.items() if "embed" not in k and "lm_head" not in k}}, "F32")
    assert weight_files(model) == [model / "model.safetensors"]
    _, loaded = load_checkpoint(model)
    np.testing.assert_array_equal(loaded["lm_head.weight"], a["lm_head.weight"] * 2)


def test_legacy_non_zip_format_is_refused_with_what_to_do():
    with pytest.raises(NllbError, match=r"legacy \(pre-1.6, non-zip\) format.*torch.save"):
        read_torch_bin(TENSORS / "legacy.bin")


def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"<html>404</html>")
    with pytest.raises(NllbError, match="not a PyTorch checkpoint"):
        read_torch_bin(tmp_path / "pytorch_model.bin")


def test_missing_bin_shard_is_named(tmp_path):
    shutil.copytree(TINY_BIN_SHARDED, tmp_path / "m")
    (tmp_path / "m" / "pytorch_model-00002-of-00002.bin").unlink()
    with pytest.raises(NllbError, match="missing 1 of the 2 shards.*pytorch_model-00002-of-00002.bin"):
        load_checkpoint(tmp_path / "m")


# ------------------------------------------------------------------------------------------- hostile pickles


def torch_zip(path: Path, pickled: bytes, storages: dict[str, bytes] | None = None) -> Path:
    """A file in torch.save's zip layout (archive/data.pkl, archive/data/KEY, byteorder) around any pickle."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/byteorder", "little")
        for key, raw in (storages or {}).items():
            archive.writestr(f"archive/data/{key}", raw)
        archive.writestr("archive/version", "3\n")
    return path


def model_dir_with_bin(tmp_path: Path, pickled: bytes) -> Path:
    """tiny-a's config and tokenizer, with a pytorch_model.bin holding `pickled`."""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "sentencepiece.bpe.model", "tokenizer_config.json"):
        shutil.copy(TINY_A / name, model)
    torch_zip(model / "pytorch_model.bin", pickled)
    return model


class RunsCommand:
    """A pickle that runs a shell command when loaded by an unrestricted unpickler (torch.load(weights_only=False))."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class Evaluates:
    def __init__(self, source):
        self.source = source

    def __reduce__(self):
        return (eval, (self.source,))


def test_pickle_that_runs_a_command_is_refused_and_nothing_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "PWNED"
    pickled = pickle.dumps({"model.shared.weight": RunsCommand(f"touch {marker}")}, protocol=2)
    assert b"system" in pickled
    model = model_dir_with_bin(tmp_path, pickled)
    with pytest.raises(NllbError, match=r"refusing to load .*pytorch_model.bin: it names the global (posix|os|nt)\.system.*nothing was run"):
        load_checkpoint(model)
    assert not marker.exists()


def test_the_malicious_pickle_does_run_its_command_when_unpickled_normally(tmp_path):
    """So the refusals above are not vacuous: an ordinary pickle.loads (as torch.load(weights_only=False)) runs it."""
    marker = tmp_path / "PWNED"
    pickle.loads(pickle.dumps({"model.shared.weight": RunsCommand(f"touch {marker}")}, protocol=2))
    assert marker.exists()


def test_translate_refuses_the_malicious_model_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "PWNED"
    model = model_dir_with_bin(tmp_path, pickle.dumps(RunsCommand(f"touch {marker}"), protocol=4))
    (tmp_path / "in.txt").write_text("Hello\n")
    result = CliRunner().invoke(cli, ["translate", "--src", "en", "--tgt", "fr", "--model", str(model), "--device", "cpu",
                                      "-q", "in.txt", "out.txt"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: refusing to load ") and result.output.count("\n") == 1
    assert "global posix.system" in result.output or "global os.system" in result.output
    assert "Traceback" not in result.output
    assert not marker.exists() and not (tmp_path / "out.txt").exists()


def test_pickle_that_names_builtins_eval_is_refused(tmp_path):
    marker = tmp_path / "PWNED"
    pickled = pickle.dumps(Evaluates(f"open({str(marker)!r}, 'w')"), protocol=2)
    with pytest.raises(NllbError, match=r"global builtins\.eval, which a PyTorch state dict never needs"):
        read_torch_bin(torch_zip(tmp_path / "evil.bin", pickled))
    assert not marker.exists()


@pytest.mark.parametrize("module, name", [("torch", "load"), ("torch.serialization", "_get_restore_location"),
                                          ("numpy", "frombuffer"), ("collections", "defaultdict"), ("subprocess", "Popen")])
def test_only_the_globals_of_a_state_dict_are_allowed(tmp_path, module, name):
    pickled = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b")R."  # GLOBAL module.name, called with ()
    with pytest.raises(NllbError, match=rf"global {module}\.{name}, which"):
        read_torch_bin(torch_zip(tmp_path / "x.bin", pickled))


class StorageId:
    """Pickles as a persistent id, as torch.save writes storages."""

    def __init__(self, pid):
        self.pid = pid


class TensorLike:
    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, size, stride, False, {})

    def __reduce__(self):
        from nllbcli.model import torchbin  # stands in for torch._utils, renamed in the bytes below

        return (torchbin.rebuild_tensor_v2, self.args)


def pickle_state(state) -> bytes:
    """A state dict pickled the way torch.save does it, without torch: storages as persistent ids."""
    buffer = io.BytesIO()

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return obj.pid if isinstance(obj, StorageId) else None

    Pickler(buffer, protocol=2).dump(state)
    raw = buffer.getvalue()
    # point the globals at the names torch writes
    raw = raw.replace(b"cnllbcli.model.torchbin\nrebuild_tensor_v2\n", b"ctorch._utils\n_rebuild_tensor_v2\n")
    raw = re.sub(rb"c[\w.]+\nFloatStorage\n", b"ctorch\nFloatStorage\n", raw)
    assert b"ctorch\nFloatStorage\n" in raw and b"ctorch._utils\n_rebuild_tensor_v2\n" in raw
    return raw


class FloatStorage:
    """Pickled as a global, as torch.FloatStorage is (renamed to it in the bytes)."""


def hand_made(tmp_path, size, stride, numel=6, data=np.arange(6, dtype=np.float32), offset=0):
    pid = ("storage", FloatStorage, "0", "cpu", numel)
    pickled = pickle_state({"w": TensorLike(StorageId(pid), offset, size, stride)})
    return torch_zip(tmp_path / "hand.bin", pickled, {"0": data.tobytes()})


def test_a_hand_made_state_dict_reads(tmp_path):
    """The hostile-pickle tests below build files this way: check the way itself first."""
    np.testing.assert_array_equal(read_torch_bin(hand_made(tmp_path, (2, 3), (3, 1)))["w"],
                                  np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(read_torch_bin(hand_made(tmp_path, (3, 2), (1, 3)))["w"],
                                  np.arange(6, dtype=np.float32).reshape(2, 3).T)


@pytest.mark.parametrize("size, stride, numel, offset, message", [
    ((2, 4), (4, 1), 6, 0, "reaches past the end of its storage"),
    ((2, 3), (3, 1), 6, 1, "reaches past the end of its storage"),
    ((2, 3), (3,), 6, 0, "malformed size"),
    ((2, 3), (3, 1), 1000, 0, "holds 24 bytes, fewer than its 1000 elements need"),
    ((1000, 1000), (0, 0), 6, 0, "more elements than its storage"),  # expanded: 4 MB copied out of 24 bytes
    ((6,), (1,), -1, 0, "a storage of -1 elements"),
])
def test_tensors_outside_their_storage_are_refused(tmp_path, size, stride, numel, offset, message):
    with pytest.raises(NllbError, match=message):
        read_torch_bin(hand_made(tmp_path, size, stride, numel=numel, offset=offset))


def test_broken_json_index_is_explained(tmp_path):
    shutil.copytree(TINY_BIN_SHARDED, tmp_path / "m")
    (tmp_path / "m" / "pytorch_model.bin.index.json").write_text(json.dumps({"weights": {}}))
    with pytest.raises(NllbError, match="pytorch_model.bin.index.json: weight_map must be an object, not null"):
        load_checkpoint(tmp_path / "m")


# ------------------------------------------------------------------------------------------- hostile archives

BOMB_BYTES = 256 << 20  # zeros, deflated into ~260 KB (the bug report's bomb: 3 GiB in 14 MB)


def bomb_pickle(numel: int) -> bytes:
    """A state dict of one float tensor, named as no model weight is, over all of storage 0."""
    pid = ("storage", FloatStorage, "0", "cpu", numel)
    return pickle_state({"unused.weight": TensorLike(StorageId(pid), 0, (numel,), (1,))})


@pytest.fixture(scope="module")
def bomb_model(tmp_path_factory) -> Path:
    """tiny-a's config and tokenizer with a pytorch_model.bin of well under 1 MB whose data/0 is a deflated
    member of BOMB_BYTES (made once: deflating takes ~1 s)."""
    model = tmp_path_factory.mktemp("bomb") / "model"
    model.mkdir()
    for name in ("config.json", "sentencepiece.bpe.model", "tokenizer_config.json"):
        shutil.copy(TINY_A / name, model)
    with zipfile.ZipFile(model / "pytorch_model.bin", "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", bomb_pickle(BOMB_BYTES // 4))
        archive.writestr("archive/byteorder", "little")
        member = zipfile.ZipInfo("archive/data/0")
        member.compress_type = zipfile.ZIP_DEFLATED
        with archive.open(member, "w") as stream:
            for _ in range(BOMB_BYTES >> 20):
                stream.write(bytes(1 << 20))
    assert (model / "pytorch_model.bin").stat().st_size < 1 << 20
    return model


def traced(call):
    """(the NllbError `call` raises, the most bytes allocated at once meanwhile, seconds it took)."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(NllbError) as raised:
            call()
        return raised.value, tracemalloc.get_traced_memory()[1], time.perf_counter() - started
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("read", [read_torch_bin, open_torch_checkpoint], ids=["read_torch_bin", "open_torch_checkpoint"])
def test_a_deflated_member_is_refused_before_anything_is_inflated(bomb_model, read):
    error, peak, seconds = traced(lambda: read(bomb_model / "pytorch_model.bin"))
    assert "the archive member archive/data/0 is compressed (deflate); torch.save stores its members uncompressed" in str(error)
    assert peak < 2 << 20 and seconds < 2, (peak, seconds)  # inflated, it took 256 MiB


def test_the_zip_bomb_is_one_error_line_from_translate_and_info(bomb_model, tmp_path):
    (tmp_path / "in.txt").write_text("Hello\n")
    for args in (["info", str(bomb_model)],
                 ["translate", "--model", str(bomb_model), "--device", "cpu", "--src", "en", "--tgt", "fr", "-q",
                  str(tmp_path / "in.txt"), str(tmp_path / "out.txt")]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
        assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
        assert "is compressed (deflate)" in result.stderr


def test_a_compressed_data_pkl_is_refused(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", bomb_pickle(4))
        archive.writestr("archive/data/0", bytes(16))
    with pytest.raises(NllbError, match=r"archive/data.pkl is compressed \(deflate\)"):
        open_torch_checkpoint(path)


def test_real_checkpoints_are_stored_throughout():
    """What torch.save writes (the fixtures): every member stored, so refusing compressed ones refuses none of them."""
    for path in [TINY_BIN / "pytorch_model.bin", *sorted(TINY_BIN_SHARDED.glob("*.bin")), TENSORS / "tensors.bin"]:
        with zipfile.ZipFile(path) as archive:
            assert {info.compress_type for info in archive.infolist()} == {zipfile.ZIP_STORED}, path
        assert open_torch_checkpoint(path).tensors


def patch_directory_entry(path: Path, member: str, offset: int, fmt: str, value: int) -> None:
    """Overwrite a field of `member`'s central directory entry (offsets as in APPNOTE.TXT 4.3.12)."""
    raw = bytearray(path.read_bytes())
    name, at = member.encode(), 0
    while True:
        at = raw.index(b"PK\x01\x02", at + 1)
        (length,) = struct.unpack_from("<H", raw, at + 28)
        if raw[at + 46 : at + 46 + length] == name:
            break
    struct.pack_into(fmt, raw, at + offset, value)
    path.write_bytes(bytes(raw))


def test_a_member_that_claims_more_bytes_than_the_file_is_refused(tmp_path):
    path = hand_made(tmp_path, (2, 3), (3, 1))
    for offset in (20, 24):  # compressed and uncompressed size: both say 1 GB
        patch_directory_entry(path, "archive/data/0", offset, "<I", 1 << 30)
    with pytest.raises(NllbError, match="archive/data/0 claims 1,073,741,824 bytes, past the end of the file"):
        read_torch_bin(path)


def test_an_encrypted_member_is_refused(tmp_path):
    path = hand_made(tmp_path, (2, 3), (3, 1))
    patch_directory_entry(path, "archive/data.pkl", 8, "<H", 0x1)
    with pytest.raises(NllbError, match="archive/data.pkl is encrypted"):
        read_torch_bin(path)


def test_the_directory_and_the_pickle_are_bounded_before_they_are_read(tmp_path, monkeypatch):
    """zipfile parses the whole central directory (~500 bytes of memory a member) and data.pkl is read whole: both
    sizes are checked first, from the end record and the directory, so no member count or size an archive
    claims costs more than the bound."""
    path = hand_made(tmp_path, (2, 3), (3, 1))
    monkeypatch.setattr(torchbin, "MAX_DIRECTORY_BYTES", 100)
    with pytest.raises(NllbError, match=r"the zip's central directory is [0-9,]+ bytes, more than a checkpoint's \(100 at most\)"):
        read_torch_bin(path)
    monkeypatch.undo()
    monkeypatch.setattr(torchbin, "MAX_PICKLE_BYTES", 10)
    with pytest.raises(NllbError, match=r"its data.pkl is [0-9,]+ bytes, more than a state dict's index of tensors"):
        read_torch_bin(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4))
def test_a_damaged_checkpoint_is_refused_in_a_sentence_or_read(tmp_path, damage):
    """Bytes of torch's tensors.bin changed anywhere (the zip's records, the pickle, the data): an NllbError, or
    arrays no larger than the file could hold (each tensor at most its storage, in float32)."""
    raw = bytearray((TENSORS / "tensors.bin").read_bytes())
    for at, byte in damage:
        raw[at % len(raw)] = byte
    path = tmp_path / "damaged.bin"
    path.write_bytes(bytes(raw))
    try:
        arrays = read_torch_bin(path)
    except NllbError:
        return
    assert sum(a.nbytes for a in arrays.values()) <= 4 * len(raw) * len(arrays)
