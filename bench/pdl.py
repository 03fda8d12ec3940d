"""Programmatic dependent launches (PDL) of the wgmma GEMM kernels through cuLaunchKernelEx, for measuring.

A kernel launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may begin (its blocks scheduled,
their set-up run) while the kernel before it in the stream is finishing; gemm_sm90.cu compiled with PDL=1 waits
(griddepcontrol.wait) before it reads or writes anything the kernel before may touch. `launch` has
kernels.gemm_launch's LAUNCH signature: set kernels.LAUNCH = pdl.launch, and PDL=1 in the tile's defines.
"""

from __future__ import annotations

import ctypes

import cupy as cp
import numpy as np

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_uint), ("value", ctypes.c_ubyte * 64)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_driver = None


def _launch_kernel_ex():
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
        _driver.restype = ctypes.c_int
    return _driver


def _param(arg):
    """A kernel argument as the bytes the kernel's parameter takes."""
    if isinstance(arg, cp.ndarray):
        return ctypes.c_uint64(arg.data.ptr)
    if isinstance(arg, np.void):  # a TensorMap (kernels.TENSOR_MAP), by value
        return ctypes.create_string_buffer(arg.tobytes(), len(arg.tobytes()))
    if isinstance(arg, (np.uint64,)):
        return ctypes.c_uint64(int(arg))
    if isinstance(arg, (np.int32, cp.int32)):
        return ctypes.c_int32(int(arg))
    raise TypeError(f"no kernel parameter for {type(arg)}")


def launch(kernel, grid, block, args, smem) -> None:
    params = [_param(a) for a in args]
    pointers = (ctypes.c_void_p * len(params))(*[ctypes.cast(ctypes.pointer(p) if not isinstance(p, ctypes.Array)
                                                              else p, ctypes.c_void_p) for p in params])
    attr = LaunchAttribute(PROGRAMMATIC_STREAM_SERIALIZATION, 0)
    attr.value[0] = 1  # programmaticStreamSerializationAllowed
    grid = tuple(grid) + (1,) * (3 - len(grid))
    block = tuple(block) + (1,) * (3 - len(block))
    config = LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), smem,
                          ctypes.c_void_p(cp.cuda.get_current_stream().ptr), ctypes.pointer(attr), 1)
    rc = _launch_kernel_ex()(ctypes.byref(config), ctypes.c_void_p(kernel.kernel.ptr), pointers, None)
    if rc:
        raise RuntimeError(f"cuLaunchKernelEx: CUresult {rc}")
