"""Reading and writing weights holds each tensor about once: the regressions a real-size (2.46 GB) checkpoint showed.

Measured on nllb-200-distilled-600M's layout (docs/CHECKPOINTS.md): `nllb convert` peaked 2 GB above the float32
weights (the 1 GB embedding converted to bf16 whole, through uint32 temporaries and tobytes), and reading a bf16
model.safetensors kept the whole file mapped and resident until the end (+1.2 GB of RSS). Here the same on the tiny
fixtures: numpy's allocations as tracemalloc sees them, and the file's mappings as /proc/self/maps lists them.
"""

import json
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import nllbcli.model.checkpoint as checkpoint
import nllbcli.model.torchbin as torchbin
from nllbcli.model.checkpoint import bf16_to_float32, float32_to_bf16, load_checkpoint, read_safetensors, write_safetensors
from nllbcli.model.engine.reference import bf16_round
from nllbcli.errors import NllbError

HERE = Path(__file__).parent
TINY_BIN = HERE / "models" / "tiny-bin"
TINY_BIN_SHARDED = HERE / "models" / "tiny-bin-sharded"
PAGE = 4096

linux_only = pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads /proc/self/maps")


def mapped_bytes(path: Path) -> int:
    """Bytes of `path` this process has mapped now."""
    total = 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path):
            low, high = (int(x, 16) for x in fields[0].split("-"))
            total += high - low
    return total


def peak_during(call):
    """(result, the most bytes traced at once during `call` above what was traced before it)."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak - before


def test_write_safetensors_converts_a_large_tensor_in_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "WRITE_BLOCK_ELEMENTS", 1 << 14)
    big = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)  # 4 MB
    for dtype in ("BF16", "F16", "F32"):
        _, peak = peak_during(lambda: write_safetensors(tmp_path / f"{dtype}.safetensors", {"w": big}, dtype))
        assert peak < big.nbytes / 8, (dtype, peak)  # whole: several times the tensor (uint32 temporaries, tobytes)


def test_blocks_write_the_same_bytes_as_one_conversion(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    arrays = {"a": rng.standard_normal((37, 29)).astype(np.float32) * 100, "scalar": np.float32(-2.5),
              "empty": np.zeros((0, 3), np.float32), "b": rng.standard_normal(1000).astype(np.float32)}
    for dtype in ("BF16", "F16", "F32"):
        write_safetensors(tmp_path / "whole.safetensors", arrays, dtype)
        monkeypatch.setattr(checkpoint, "WRITE_BLOCK_ELEMENTS", 7)  # blocks that straddle rows, and a short last one
        write_safetensors(tmp_path / "blocks.safetensors", arrays, dtype)
        monkeypatch.undo()
        raw = (tmp_path / "blocks.safetensors").read_bytes()
        assert raw == (tmp_path / "whole.safetensors").read_bytes(), dtype
        (length,) = struct.unpack("<Q", raw[:8])
        data = raw[8 + length :]
        expected = b"".join(
            (float32_to_bf16(a) if dtype == "BF16" else a.astype({"F16": np.float16, "F32": np.float32}[dtype])).tobytes()
            for a in arrays.values())
        assert data == expected, dtype
        back = read_safetensors(tmp_path / "blocks.safetensors")
        if dtype == "BF16":
            np.testing.assert_array_equal(back["a"], bf16_round(arrays["a"]))


def test_bf16_widening_allocates_only_its_float32_result():
    bits = float32_to_bf16(np.random.default_rng(2).standard_normal(1 << 18).astype(np.float32))
    for widen in (bf16_to_float32, lambda b: torchbin.widen_to_float32(b, "BFloat16Storage")):
        out, peak = peak_during(lambda: widen(bits))
        assert out.dtype == np.float32 and peak < 1.25 * out.nbytes, peak  # `<< 16` out of place: twice


@linux_only
def test_safetensors_are_mapped_one_tensor_at_a_time(tmp_path, monkeypatch):
    _, weights = load_checkpoint(TINY_BIN)
    path = tmp_path / "model.safetensors"
    write_safetensors(path, weights, "BF16")
    largest = max(a.size for a in weights.values()) * 2
    assert path.stat().st_size > 3 * largest
    seen = []

    def widen(bits):
        seen.append(mapped_bytes(path))
        return bf16_to_float32(bits)

    monkeypatch.setattr(checkpoint, "bf16_to_float32", widen)
    arrays = read_safetensors(path)
    assert len(seen) == len(weights) and max(seen) <= largest + 2 * PAGE, (max(seen), largest)
    assert mapped_bytes(path) == 0  # nothing of the file stays mapped (resident) once read
    for name, array in arrays.items():
        assert type(array) is np.ndarray and array.dtype == np.float32, name
        np.testing.assert_array_equal(array, bf16_round(weights[name]), err_msg=name)


@linux_only
@pytest.mark.parametrize("path", [TINY_BIN / "pytorch_model.bin", TINY_BIN_SHARDED / "pytorch_model-00001-of-00002.bin"])
def test_bin_storages_are_mapped_one_at_a_time_and_copied_once(path, monkeypatch):
    torchbin.read_torch_bin(path)  # imports and caches warmed up before tracing
    largest = max(ref.storage.numel * ref.storage.kind.dtype.itemsize
                  for ref in torchbin.open_torch_checkpoint(path).tensors.values())
    seen = []
    storage_array = torchbin.TorchCheckpoint.storage_array

    def mapped(self, storage):
        array = storage_array(self, storage)
        assert isinstance(array, np.memmap)  # stored members are mapped from the file, never read whole
        seen.append(mapped_bytes(path))
        return array

    monkeypatch.setattr(torchbin.TorchCheckpoint, "storage_array", mapped)
    torchbin.read_torch_bin(path)
    assert seen and max(seen) <= largest + 2 * PAGE, (max(seen), largest)
    assert mapped_bytes(path) == 0
    monkeypatch.undo()  # reading /proc/self/maps allocates: trace the reader alone

    # each tensor, from its storage to its float32 array: the array itself (bf16: and its 2-byte copy), no more
    array, widen = torchbin.TorchCheckpoint.array, torchbin.widen_to_float32
    steps, start = [], []

    def traced_array(self, ref):
        tracemalloc.reset_peak()
        start.append(tracemalloc.get_traced_memory()[0])
        return array(self, ref)

    def traced_widen(raw, storage_name):
        out = widen(raw, storage_name)
        steps.append((tracemalloc.get_traced_memory()[1] - start[-1], out.nbytes, storage_name))
        return out

    monkeypatch.setattr(torchbin.TorchCheckpoint, "array", traced_array)
    monkeypatch.setattr(torchbin, "widen_to_float32", traced_widen)
    arrays, peak = peak_during(lambda: torchbin.read_torch_bin(path))
    assert len(steps) == len({id(a) for a in arrays.values()})
    for step_peak, nbytes, storage_name in steps:
        assert step_peak <= nbytes * (1.5 if storage_name == "BFloat16Storage" else 1) + 16 * 1024, (step_peak, nbytes)
    distinct = {id(a): a for a in arrays.values()}.values()
    total = sum(a.nbytes for a in distinct)
    # the float32 arrays plus the index and pickle's objects: nothing else kept
    assert peak < total + max(a.nbytes for a in distinct), (peak, total)


def test_safetensors_offsets_that_do_not_fit_are_refused(tmp_path):
    header = {"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}
    encoded = json.dumps(header).encode()
    (tmp_path / "short.safetensors").write_bytes(struct.pack("<Q", len(encoded)) + encoded + bytes(32))
    with pytest.raises(NllbError, match="do not fit"):
        read_safetensors(tmp_path / "short.safetensors")
    header["w"]["shape"] = [2, 4]  # 32 bytes of elements for 64 bytes of data
    encoded = json.dumps(header).encode()
    (tmp_path / "mismatch.safetensors").write_bytes(struct.pack("<Q", len(encoded)) + encoded + bytes(64))
    with pytest.raises(NllbError, match="do not fit"):
        read_safetensors(tmp_path / "mismatch.safetensors")
