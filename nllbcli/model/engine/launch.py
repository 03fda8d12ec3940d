"""Programmatic dependent launches (PDL) of the wgmma GEMM kernels, through the driver's cuLaunchKernelEx.

A kernel launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may be launched, its blocks placed
and their set-up run, while the kernel before it in the stream finishes; gemm_sm90.cu (PDL) waits for that
kernel (griddepcontrol.wait: done, its writes seen) before it reads or writes any array, so results are those
of launches one after the other. Back to back, a GEMM's launch and set-up hide behind the last kernel's tail:
~0.5-0.8 us a GEMM, 10-15% of a 64-row GEMM's time (docs/PERFORMANCE.md). Stream capture records the
dependency into CUDA graphs. CuPy's RawKernel has no way to ask for it, hence ctypes. NLLB_PDL=0: CuPy's launches.
"""

from __future__ import annotations

import ctypes
import struct
import threading

import cupy as cp
import numpy as np

from ...environment import ENV

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID
ENABLED = ENV.pdl  # NLLB_PDL


class LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding, a 64-byte value
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_uint), ("value", ctypes.c_ubyte * 64)]


class LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_launch_kernel_ex = None
_failed: str | None = None  # why programmatic launches were given up, if they were


def layout(arg) -> tuple[str, int]:
    """A kernel argument's parameter as (struct format, alignment): arrays and absent pointers (NULL, a numpy
    uint64) as 8-byte pointers, numpy int32s as ints, TMA maps (kernels.TENSOR_MAP) by value (64-byte aligned, as a
    CUtensorMap). launch() packs the values: a pointer, the map's bytes, or the integer."""
    if isinstance(arg, (cp.ndarray, np.uint64)):
        return "Q", 8
    if isinstance(arg, np.void):
        return f"{arg.dtype.itemsize}s", 64
    if isinstance(arg, np.int32):
        return "i", 4
    raise TypeError(f"no kernel parameter for {type(arg).__name__}")


class Prepared:
    """What a kernel's launches from one thread share: a buffer its parameters are packed into (struct.pack_into,
    one call), the array of pointers into it that the driver reads, and the launch config. The driver copies the
    parameters at the launch, so the next launch may overwrite them. Made once: built per launch from ~40 ctypes
    objects, an eager GEMM took 127 us of the host's time, 39 us so."""

    def __init__(self, kernel, args: tuple, function: int):
        self.kernel = kernel  # held, so that its id (the cache's key) is never another kernel's
        self.function = ctypes.c_void_p(function)
        fmt, offsets, at = "=", [], 0
        for code, align in map(layout, args):
            pad = -at % align
            fmt += "x" * pad + code
            offsets.append(at + pad)
            at += pad + struct.calcsize("=" + code)
        self.format = fmt
        self.buffer = ctypes.create_string_buffer(max(at, 1) + 64)
        base = ctypes.addressof(self.buffer)
        self.shift = -base % 64  # the maps' 64-byte alignment holds in memory too
        self.pointers = (ctypes.c_void_p * len(args))(*[base + self.shift + o for o in offsets])
        self.attr = LaunchAttribute(PROGRAMMATIC_STREAM_SERIALIZATION, 0)
        self.attr.value[0] = 1  # programmaticStreamSerializationAllowed
        self.config = LaunchConfig((ctypes.c_uint * 3)(1, 1, 1), (ctypes.c_uint * 3)(1, 1, 1), 0, None,
                                   ctypes.pointer(self.attr), 1)


_prepared: dict[tuple, Prepared] = {}


def available() -> bool:
    global _launch_kernel_ex, _failed
    if not ENABLED or _failed:
        return False
    if _launch_kernel_ex is None:
        try:
            # PyDLL: the call keeps the GIL (a few microseconds). Through CDLL each launch let the GIL go and waited
            # to take it back from the pipeline's reader thread: C, 267,000 -> 262,000 tokens/s
            _launch_kernel_ex = ctypes.PyDLL("libcuda.so.1").cuLaunchKernelEx
            _launch_kernel_ex.restype = ctypes.c_int
        except (OSError, AttributeError) as error:  # an old driver
            _failed = str(error)
            return False
    return True


def launch(kernel, grid: tuple, block: tuple, args: tuple, smem: int) -> None:
    """kernel(grid, block, args, shared_mem=smem) as a programmatic dependent of the kernel before it on the
    current stream; where the driver refuses, CuPy's launch, and programmatic launches are given up."""
    global _failed
    if not available():
        kernel(grid, block, args, shared_mem=smem)
        return
    key = (id(kernel), cp.cuda.runtime.getDevice(), threading.get_ident())  # kernels live as long as the process
    prepared = _prepared.get(key)
    if prepared is None:
        try:
            function = kernel.kernel.ptr  # the RawKernel's CUfunction on this device
        except AttributeError as error:  # a CuPy without it
            _failed = f"no CUfunction: {error}"
            kernel(grid, block, args, shared_mem=smem)
            return
        prepared = _prepared[key] = Prepared(kernel, args, function)
    struct.pack_into(prepared.format, prepared.buffer, prepared.shift, *[
        a.data.ptr if isinstance(a, cp.ndarray) else a.tobytes() if isinstance(a, np.void) else int(a) for a in args])
    config = prepared.config
    config.grid[0], config.grid[1], config.grid[2] = tuple(grid) + (1,) * (3 - len(grid))
    config.block[0], config.block[1], config.block[2] = tuple(block) + (1,) * (3 - len(block))
    config.smem, config.stream = smem, cp.cuda.get_current_stream().ptr
    rc = _launch_kernel_ex(ctypes.byref(config), prepared.function, prepared.pointers, None)
    if rc:
        _failed = f"cuLaunchKernelEx: CUresult {rc}"
        kernel(grid, block, args, shared_mem=smem)
