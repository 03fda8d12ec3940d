"""`pytorch_model.bin` without PyTorch: torch's zip checkpoints read with a pickle that can build nothing but tensors.

Since PyTorch 1.6, `torch.save` writes a zip archive (stored, not compressed):

    NAME/data.pkl        the pickled state dict: an OrderedDict of tensors
    NAME/data/KEY        the raw bytes of each storage, little-endian
    NAME/byteorder       "little"

In `data.pkl` each tensor is `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)`,
where `storage` is a persistent id `('storage', torch.FloatStorage, KEY, 'cpu', numel)`. Unpickling a file normally
calls whatever globals it names, so a .bin file can run any code: here `find_class` hands out only harmless
stand-ins for the few globals a state dict needs and refuses every other one, so no code from the file ever runs.
Tensor data is never read whole: each storage is a view of the zip member mapped from disk.

The archive is untrusted input as much as the pickle: every member must be stored as torch.save stores them
(a compressed or encrypted member is refused before anything is read, so nothing is ever inflated), the central
directory and data.pkl are bounded in size before zipfile or the unpickler sees them, and every tensor must lie
inside a member that lies inside the file. What a checkpoint claims then costs at most what its bytes are.
"""

from __future__ import annotations

import _compat_pickle
import io
import math
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import NllbError

# numpy has no bfloat16: bf16 storages are read as uint16 and widened by hand (float32's upper 16 bits).
STORAGE_DTYPES = {
    "FloatStorage": np.dtype("<f4"),
    "HalfStorage": np.dtype("<f2"),
    "BFloat16Storage": np.dtype("<u2"),
    "DoubleStorage": np.dtype("<f8"),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
}
# the floating-point storages (the only ones a model's weights use) and the names `nllb info` gives them
STORAGE_NAMES = {"FloatStorage": "float32", "HalfStorage": "float16", "BFloat16Storage": "bfloat16", "DoubleStorage": "float64"}

# The zip's central directory is parsed whole by zipfile (~500 bytes of memory a member): torch writes ~70 bytes
# a member, one member a storage (509 for nllb-200-distilled-600M, ~35 KB), so 4 MiB is some 60,000 storages.
MAX_DIRECTORY_BYTES = 4 << 20
# data.pkl is read whole and unpickled: the index of the tensors, ~160 bytes a tensor (the 600M model's ~80 KB)
MAX_PICKLE_BYTES = 100_000_000
ZIP_METHODS = {zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma"}


@dataclass(frozen=True)
class StorageType:
    """What `torch.FloatStorage` and its kin unpickle to: a name, never a callable that builds anything."""

    name: str

    @property
    def dtype(self) -> np.dtype:
        return STORAGE_DTYPES[self.name]


@dataclass(frozen=True)
class Storage:
    kind: StorageType
    key: str  # the member name under NAME/data/
    numel: int


@dataclass(frozen=True)
class TensorRef:
    """A tensor of a checkpoint, not yet read: where its elements are in which storage."""

    storage: Storage
    offset: int  # in elements, from the start of the storage
    shape: tuple[int, ...]
    stride: tuple[int, ...]  # in elements

    @property
    def floating(self) -> bool:
        return self.storage.kind.name in STORAGE_NAMES


def rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, metadata=None):
    return make_ref(storage, storage_offset, size, stride)


def rebuild_parameter(data, requires_grad=False, backward_hooks=None):
    """nn.Parameter saved whole (torch.save(model.named_parameters())): the tensor inside is all we keep."""
    if not isinstance(data, TensorRef):
        raise pickle.UnpicklingError("torch._utils._rebuild_parameter applied to something that is not a tensor")
    return data


def make_ref(storage, offset, size, stride) -> TensorRef:
    """torch._utils._rebuild_tensor, which _rebuild_tensor_v2 comes to: a TensorRef that lies inside its storage."""
    if not isinstance(storage, Storage):
        raise pickle.UnpicklingError("a tensor is rebuilt from something that is not a storage")
    try:
        shape = tuple(int(n) for n in size)
        strides = tuple(int(n) for n in stride)
        offset = int(offset)
    except (TypeError, ValueError):
        raise pickle.UnpicklingError("a tensor has a malformed size, stride or offset") from None
    if len(shape) != len(strides) or offset < 0 or any(n < 0 for n in shape) or any(s < 0 for s in strides):
        raise pickle.UnpicklingError(f"a tensor has a malformed size {shape} or stride {strides}")
    last = offset + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else offset - 1
    if last >= storage.numel:
        raise pickle.UnpicklingError(f"a tensor of shape {shape} reaches past the end of its storage ({storage.numel} elements)")
    # each tensor is copied out: one of more elements than its storage (an expanded tensor, stride 0) would cost
    # more memory than the file holds
    if math.prod(shape) > storage.numel:
        raise pickle.UnpicklingError(f"a tensor of shape {shape} has more elements than its storage ({storage.numel}): "
                                     "an expanded tensor (stride 0), which a state dict of weights does not hold")
    return TensorRef(storage, offset, shape, strides)


# The only globals a state dict may name, and what each one becomes here.
ALLOWED_GLOBALS = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor"): make_ref,
    ("torch._utils", "_rebuild_parameter"): rebuild_parameter,
    **{("torch", name): StorageType(name) for name in STORAGE_DTYPES},
}


class StateDictUnpickler(pickle.Unpickler):
    """An Unpickler that can build an OrderedDict of TensorRefs and nothing else."""

    def find_class(self, module: str, name: str):
        # protocol 2 (torch's) spells Python 3 names the Python 2 way (__builtin__.eval): name them as Python 3 does
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"it names the global {module}.{name}, which a PyTorch state dict never needs (only "
                "collections.OrderedDict, torch._utils._rebuild_tensor_v2 and the torch.*Storage types are allowed); "
                "nothing was run"
            ) from None

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unknown persistent id {str(pid)[:80]}")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, StorageType):
            raise pickle.UnpicklingError(f"a storage of type {kind!r}, not one of the torch.*Storage types")
        numel = int(numel)
        if numel < 0:
            raise pickle.UnpicklingError(f"a storage of {numel} elements")
        return Storage(kind, str(key), numel)


@dataclass
class TorchCheckpoint:
    """An open torch zip checkpoint: its tensors by name, read from the mapped file one at a time."""

    path: Path
    tensors: dict[str, TensorRef]
    members: dict[str, tuple[int, int]]  # storage key -> (data offset in the file, size), inside the file
    prefix: str

    def array(self, ref: TensorRef) -> np.ndarray:
        """The tensor's elements in their stored dtype (bf16 as uint16), copied out in the tensor's shape."""
        storage = self.storage_array(ref.storage)
        itemsize = storage.itemsize
        if math.prod(ref.shape) == 0:
            return np.zeros(ref.shape, dtype=storage.dtype)
        view = np.lib.stride_tricks.as_strided(
            storage[ref.offset :], shape=ref.shape, strides=tuple(s * itemsize for s in ref.stride), writeable=False
        )
        return view.copy(order="C")  # a plain array of the default strides (np.ascontiguousarray makes 0-d 1-d)

    def storage_array(self, storage: Storage) -> np.memmap:
        """The storage's elements, mapped from the file (open_torch_checkpoint checked that they are there)."""
        start, _ = self.members[storage.key]
        return np.memmap(self.path, dtype=storage.kind.dtype, mode="r", offset=start, shape=(storage.numel,))


def open_torch_checkpoint(path: Path) -> TorchCheckpoint:
    """Read the tensor index of a `torch.save` zip file (without any of the tensor data), every tensor checked
    to lie inside a stored member that lies inside the file."""
    path = Path(path)
    try:
        is_zip = zipfile.is_zipfile(path)
        if not is_zip:
            with open(path, "rb") as f:
                head = f.read(2)
    except OSError as exc:
        raise NllbError(f"cannot read {path}: {exc.strerror or exc}") from None
    except zipfile.BadZipFile as exc:  # an end record is there but names several disks: is_zipfile lets it out
        raise NllbError(f"cannot read {path}: {exc}") from None
    if not is_zip:
        if head[:1] == b"\x80":
            raise NllbError(
                f"{path} is in PyTorch's legacy (pre-1.6, non-zip) format, which nllbcli does not read: re-save it "
                "where PyTorch is installed with torch.save(torch.load(FILE), FILE), or convert it to safetensors"
            )
        raise NllbError(f"{path} is not a PyTorch checkpoint (not a zip archive written by torch.save)")
    try:
        with open(path, "rb") as raw:
            file_size = os.fstat(raw.fileno()).st_size
            # the end record, as zipfile reads it, before zipfile parses the directory it points to
            end = zipfile._EndRecData(raw)
            if end is None:
                raise zipfile.BadZipFile("no end of central directory record")
            if end[zipfile._ECD_SIZE] > MAX_DIRECTORY_BYTES:
                raise NllbError(f"{path}: the zip's central directory is {end[zipfile._ECD_SIZE]:,} bytes, more than "
                                f"a checkpoint's ({MAX_DIRECTORY_BYTES:,} at most): not a file torch.save wrote")
            with zipfile.ZipFile(raw) as archive:
                infos = archive.infolist()
                for info in infos:
                    refuse_packed(path, info)
                pickles = [i for i in infos if i.filename.endswith("data.pkl") and i.filename.count("/") <= 1]
                if len(pickles) != 1:
                    raise NllbError(f"{path} is a zip archive but not one written by torch.save (no NAME/data.pkl)")
                prefix = pickles[0].filename[: -len("data.pkl")]
                spans = {info.filename: member_span(path, raw, info, file_size) for info in infos
                         if info.filename.startswith(prefix) and not info.filename.endswith("/")}
                if pickles[0].file_size > MAX_PICKLE_BYTES:
                    raise NllbError(f"{path}: its data.pkl is {pickles[0].file_size:,} bytes, more than a state dict's "
                                    f"index of tensors ({MAX_PICKLE_BYTES:,} at most)")
                if prefix + "byteorder" in spans:
                    order = archive.open(prefix + "byteorder").read(16).decode("ascii", "replace").strip()
                    if order != "little":
                        raise NllbError(f"{path} was saved on a {order}-endian machine; nllbcli reads little-endian checkpoints")
                pickled = archive.read(pickles[0])
    # (ValueError: a member name that is not the UTF-8 its flag says; RuntimeError: what zipfile cannot read)
    except (OSError, EOFError, ValueError, RuntimeError, zipfile.BadZipFile, struct.error) as exc:
        raise NllbError(f"cannot read {path}: {exc}") from None
    members = {name[len(prefix + "data/") :]: span for name, span in spans.items() if name.startswith(prefix + "data/")}
    try:
        state = StateDictUnpickler(io.BytesIO(pickled)).load()
    except NllbError:
        raise
    except Exception as exc:  # the pickle is the attacker's: any failure in it is a refusal, never a crash
        raise NllbError(f"refusing to load {path}: {exc}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]  # a training checkpoint that wraps the weights
    if not isinstance(state, dict):
        raise NllbError(f"{path} holds a {type(state).__name__}, not a state dict of named tensors")
    tensors = {str(name): ref for name, ref in state.items() if isinstance(ref, TensorRef)}
    for ref in {ref.storage for ref in tensors.values()}:
        if ref.key not in members:
            raise NllbError(f"{path}: the archive has no data/{ref.key} for a tensor that uses it")
        size = members[ref.key][1]
        if ref.numel * ref.kind.dtype.itemsize > size:
            raise NllbError(f"{path}: data/{ref.key} holds {size} bytes, fewer than its {ref.numel} elements need")
    return TorchCheckpoint(path, tensors, members, prefix)


def refuse_packed(path: Path, info: zipfile.ZipInfo) -> None:
    """torch.save stores every member as it is: a compressed member (a zip bomb inflates a few MB into GBs) or an
    encrypted one is refused before any member is read."""
    if info.flag_bits & 0x1:
        raise NllbError(f"{path}: the archive member {info.filename} is encrypted; torch.save never encrypts, so this "
                        "is not a checkpoint it wrote")
    if info.compress_type != zipfile.ZIP_STORED:
        method = ZIP_METHODS.get(info.compress_type, f"method {info.compress_type}")
        raise NllbError(f"{path}: the archive member {info.filename} is compressed ({method}); torch.save stores "
                        "its members uncompressed and nllbcli inflates none: re-save the checkpoint with torch.save, "
                        "or convert it to safetensors")


def member_span(path: Path, raw, info: zipfile.ZipInfo, file_size: int) -> tuple[int, int]:
    """(offset in the file, size) of a stored member's data, which must lie inside the file."""
    raw.seek(info.header_offset)
    local = raw.read(30)
    if local[:4] != b"PK\x03\x04" or info.compress_size != info.file_size:
        raise NllbError(f"{path}: the zip entry of {info.filename} is damaged")
    name_length, extra_length = struct.unpack("<HH", local[26:30])
    start = info.header_offset + 30 + name_length + extra_length
    if start + info.file_size > file_size:
        raise NllbError(f"{path}: the zip entry of {info.filename} claims {info.file_size:,} bytes, past the end of the file")
    return start, info.file_size


def read_torch_bin(path: Path, wanted: set[str] | None = None) -> dict[str, np.ndarray]:
    """Named float32 arrays of every floating-point tensor in a `torch.save` state dict (integer buffers are skipped).

    Tensors that are the same view of the same storage (a tied embedding saved under several names) come back as
    one array, so a 256k-row table is held once.
    """
    checkpoint = open_torch_checkpoint(path)
    arrays: dict[str, np.ndarray] = {}
    seen: dict[TensorRef, np.ndarray] = {}
    for name, ref in checkpoint.tensors.items():
        if (wanted is not None and name not in wanted) or not ref.floating:
            continue
        if ref not in seen:
            seen[ref] = widen_to_float32(checkpoint.array(ref), ref.storage.kind.name)
        arrays[name] = seen[ref]
    return arrays


def widen_to_float32(raw: np.ndarray, storage_name: str) -> np.ndarray:
    if storage_name == "BFloat16Storage":
        wide = raw.astype(np.uint32)
        wide <<= 16  # in place: one 4-byte array, not two
        return wide.view(np.float32)
    return raw.astype(np.float32, copy=False)  # array() already copied it out of the file
