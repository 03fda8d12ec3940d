"""Make the PyTorch-format (`pytorch_model.bin`) test fixtures under tests/models/, with PyTorch itself.

Run where PyTorch and transformers are installed (nllbcli reads these files without them):

    python tools/make_bin_fixtures.py      # writes tests/models/tiny-bin, tiny-bin-sharded, torch-tensors

tiny-bin: tests/models/tiny-a's weights as a hub repo of the 600M model has them: one float32
pytorch_model.bin written by torch.save from the model's state_dict (transformers' names, the tied embedding
under all four names sharing one storage, which torch writes once), with config.json, generation_config.json,
tokenizer_config.json and sentencepiece.bpe.model beside it (no tokenizer.json, to keep the fixture small).

tiny-bin-sharded: the same weights in bfloat16, as two shards with pytorch_model.bin.index.json, the layout of
the 3.3B model's repo (the tied embedding's storage is written into both shards, as transformers' sharding does).

torch-tensors: tensors.bin with the tensor layouts a state dict may hold (transposed strides, storage offsets,
two views of one storage, float16, bfloat16, float64, an int64 buffer, a 0-d and an empty tensor), expected.npz
with their values as NumPy arrays (bfloat16 widened to float32), and legacy.bin in the pre-1.6 non-zip format.
"""

from __future__ import annotations

import json
import shutil
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from transformers import M2M100ForConditionalGeneration

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "models"
TINY_A = MODELS / "tiny-a"
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "sentencepiece.bpe.model")


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def copy_side_files(dst: Path, dtype: str) -> None:
    for name in SIDE_FILES:
        if (TINY_A / name).is_file():
            shutil.copy(TINY_A / name, dst / name)
    config = json.loads((dst / "config.json").read_text())
    config["torch_dtype"] = dtype
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def make_tiny_bin(model: M2M100ForConditionalGeneration) -> None:
    out = fresh_dir(MODELS / "tiny-bin")
    state = model.state_dict()
    assert state["model.shared.weight"].data_ptr() == state["lm_head.weight"].data_ptr()
    torch.save(state, out / "pytorch_model.bin")
    copy_side_files(out, "float32")


def make_tiny_bin_sharded(model: M2M100ForConditionalGeneration) -> None:
    out = fresh_dir(MODELS / "tiny-bin-sharded")
    state = model.to(torch.bfloat16).state_dict()
    names = list(state)
    sizes = [state[n].numel() * state[n].element_size() for n in names]
    half, total, cut = sum(sizes) / 2, 0, len(names)
    for i, size in enumerate(sizes):
        total += size
        if total >= half:
            cut = i + 1
            break
    shards = [names[:cut], names[cut:]]
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        filename = f"pytorch_model-{i:05d}-of-{len(shards):05d}.bin"
        torch.save(OrderedDict((n, state[n]) for n in shard), out / filename)
        weight_map.update({n: filename for n in shard})
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    (out / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2) + "\n")
    copy_side_files(out, "bfloat16")


def make_torch_tensors() -> None:
    out = fresh_dir(MODELS / "torch-tensors")
    g = torch.Generator().manual_seed(7)
    base = torch.randn(6, 5, generator=g)
    flat = torch.randn(40, generator=g)
    tensors = OrderedDict(
        plain=torch.randn(3, 4, generator=g),
        transposed=base.t(),  # strides (1, 5): not the default
        offset_slice=flat[7:19].view(3, 4),  # storage offset 7
        second_view=flat[20:30],  # the same storage as offset_slice, another offset
        every_other=base[:, ::2],  # strides (5, 2)
        half=torch.randn(2, 3, generator=g).half(),
        bfloat16=torch.randn(4, 3, generator=g).bfloat16(),
        bfloat16_transposed=torch.randn(3, 4, generator=g).bfloat16().t(),
        double=torch.randn(5, generator=g).double(),
        scalar=torch.tensor(3.25),
        empty=torch.zeros(0, 4),
        int_buffer=torch.arange(6, dtype=torch.int64).view(2, 3),
    )
    torch.save(tensors, out / "tensors.bin")
    expected = {
        name: (t.float() if t.dtype == torch.bfloat16 else t).contiguous().numpy() for name, t in tensors.items()
    }
    np.savez(out / "expected.npz", **expected)
    torch.save(OrderedDict(plain=tensors["plain"]), out / "legacy.bin", _use_new_zipfile_serialization=False)


def main() -> None:
    model = M2M100ForConditionalGeneration.from_pretrained(TINY_A).eval()
    make_tiny_bin(model)
    make_tiny_bin_sharded(model)
    make_torch_tensors()
    for d in ("tiny-bin", "tiny-bin-sharded", "torch-tensors"):
        size = sum(f.stat().st_size for f in (MODELS / d).iterdir())
        print(f"tests/models/{d}: {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
