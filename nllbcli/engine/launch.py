"""Programmatic dependent launches (PDL) of the wgmma GEMM kernels, through the driver's cuLaunchKernelEx.

A kernel launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may be launched, its blocks placed
and their set-up run, while the kernel before it in the stream finishes; gemm_sm90.cu (PDL) waits for that
kernel (griddepcontrol.wait: done, its writes seen) before it reads or writes any array, so results are those
of launches one after the other. Back to back, a GEMM's launch and set-up hide behind the last kernel's tail:
~0.5-0.8 us a GEMM, 10-15% of a 64-row GEMM's time (docs/PERF.md, ninth session). Stream capture records the
dependency into CUDA graphs. CuPy's RawKernel has no way to ask for it, hence ctypes. NLLB_PDL=0: CuPy's launches.
"""

from __future__ import annotations

import ctypes
import os

import cupy as cp
import numpy as np

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID
ENABLED = os.environ.get("NLLB_PDL", "1") == "1"


class LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding, a 64-byte value
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_uint), ("value", ctypes.c_ubyte * 64)]


class LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_launch_kernel_ex = None
_failed: str | None = None  # why programmatic launches were given up, if they were


def parameter(arg):
    """A kernel argument as the ctypes object holding the bytes its parameter takes: arrays and absent pointers
    (NULL, a numpy uint64) as 8-byte pointers, numpy int32s as ints, TMA maps (kernels.TENSOR_MAP) by value."""
    if isinstance(arg, cp.ndarray):
        return ctypes.c_uint64(arg.data.ptr)
    if isinstance(arg, np.void):
        return ctypes.create_string_buffer(arg.tobytes(), arg.dtype.itemsize)
    if isinstance(arg, np.uint64):
        return ctypes.c_uint64(int(arg))
    if isinstance(arg, np.int32):
        return ctypes.c_int32(int(arg))
    raise TypeError(f"no kernel parameter for {type(arg).__name__}")


def available() -> bool:
    global _launch_kernel_ex, _failed
    if not ENABLED or _failed:
        return False
    if _launch_kernel_ex is None:
        try:
            # PyDLL: the call keeps the GIL (a few microseconds). Through CDLL each launch let the GIL go and waited
            # to take it back from the pipeline's reader thread: C, 267,000 -> 262,000 tokens/s (PERF.md, ninth)
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
    params = [parameter(a) for a in args]
    pointers = (ctypes.c_void_p * len(params))(*[ctypes.cast(p, ctypes.c_void_p) if isinstance(p, ctypes.Array)
                                                  else ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in params])
    attr = LaunchAttribute(PROGRAMMATIC_STREAM_SERIALIZATION, 0)
    attr.value[0] = 1  # programmaticStreamSerializationAllowed
    grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
    config = LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), smem,
                          ctypes.c_void_p(cp.cuda.get_current_stream().ptr), ctypes.pointer(attr), 1)
    try:
        function = kernel.kernel.ptr  # the RawKernel's CUfunction
    except AttributeError as error:  # a CuPy without it
        _failed = f"no CUfunction: {error}"
        kernel(grid, block, args, shared_mem=smem)
        return
    rc = _launch_kernel_ex(ctypes.byref(config), ctypes.c_void_p(function), pointers, None)
    if rc:
        _failed = f"cuLaunchKernelEx: CUresult {rc}"
        kernel(grid, block, args, shared_mem=smem)
