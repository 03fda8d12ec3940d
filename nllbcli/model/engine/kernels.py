"""Loads kernels_cu/*.cu once per process (cupy.RawModule) and launches them: one launcher per kernel.

Each launcher checks its preconditions and computes the grid and block; the kernel sources say what they
compute, their layouts and launch shapes. CuPy compiles for the GPU in hand (NVRTC, -arch=sm_XY) and caches
the binary on disk keyed by the source text and options, so `common.cuh` is pasted into each source rather
than included by path: a change to the header then changes the key.

Letters: M rows, N output columns, K reduction length, D d_model, H heads, E head size.
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import cupy as cp
import numpy as np

from ...environment import ENV
from . import launch
from .numerics import inverse_temperature

PACKAGE = Path(__file__).resolve().parents[2]  # nllbcli/
KERNEL_DIR = PACKAGE.parent / "kernels_cu"
INCLUDE = re.compile(r'^#include "([\w.]+)"\s*$', re.MULTILINE)


def kernel_dir() -> Path:
    """The kernel sources: beside the package in a checkout, or installed inside it as nllbcli/kernels_cu."""
    installed = PACKAGE / "kernels_cu"
    return installed if installed.is_dir() else KERNEL_DIR


def read_source(name: str) -> str:
    """A kernel file with its local includes pasted in."""
    folder = kernel_dir()
    text = (folder / name).read_text(encoding="utf-8")
    return INCLUDE.sub(lambda m: (folder / m.group(1)).read_text(encoding="utf-8"), text)


@lru_cache(maxsize=None)
def arch() -> str:
    return f"sm_{cp.cuda.Device().compute_capability}"  # "90" on an H100 or H200


@lru_cache(maxsize=None)
def module(name: str, defines: tuple[tuple[str, int], ...] = (), target: str | None = None) -> cp.RawModule:
    """Compile (or fetch from CuPy's cache) one kernel file for this GPU, with `-D` defines. target: an
    architecture other than the GPU's own, as "sm_90a" for Hopper's wgmma."""
    fast = () if ENV.exact_math else ("--use_fast_math",)  # NLLB_EXACT_MATH=1: exact exp, rsqrt, division
    options = ("-std=c++17", f"-arch={target or arch()}") + fast + tuple(f"-D{k}={v}" for k, v in defines)
    return cp.RawModule(code=read_source(name), options=options)


@lru_cache(maxsize=None)
def function(file: str, kernel: str, target: str | None = None, **defines: int):
    """A compiled kernel, looked up once per (file, kernel, target, defines): launchers call this per launch."""
    return module(file, tuple(sorted(defines.items())), target).get_function(kernel)


_smem_allowed: dict[int, int] = {}


def allow_smem(kernel, smem: int) -> None:
    """Let `kernel` take `smem` bytes of dynamic shared memory (over 48 KB needs the attribute): set once per
    kernel and size, not per launch, so a launch inside a CUDA graph capture makes no driver call but its own."""
    if smem > 48 * 1024 and _smem_allowed.get(id(kernel), 0) < smem:
        kernel.max_dynamic_shared_size_bytes = smem
        _smem_allowed[id(kernel)] = smem


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def check_array(name: str, a: cp.ndarray, dtype, shape: tuple | None = None) -> None:
    """The messages are made only on failure: launchers call this thousands of times per batch."""
    if a.dtype != dtype:
        raise ValueError(f"{name} must be {cp.dtype(dtype).name}, not {a.dtype}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if shape is not None and a.shape != shape:
        raise ValueError(f"{name} has shape {a.shape}, expected {shape}")


BF16 = cp.dtype("bfloat16")
F32 = cp.dtype(cp.float32)
U8 = cp.dtype(cp.uint8)  # FP8 E4M3 codes
NULL = np.uint64(0)  # an absent pointer argument


# ------------------------------------------------------------------------------------------------ quantize.cu

def quantize_rows(x: cp.ndarray, codes: cp.ndarray | None = None,
                  scales: cp.ndarray | None = None) -> tuple[cp.ndarray, cp.ndarray]:
    """Each row of x (M, K) bf16 or f32 to FP8 E4M3 by its largest size: codes (M, K) uint8, scales (M,) f32,
    x ~ e4m3(codes) * scales; numerics.quantize_e4m3's bits (an all-zero row has scale 1)."""
    m, k = x.shape
    check(x.dtype in (BF16, F32), f"quantize_rows takes bf16 or f32, not {x.dtype}")
    check_array("x", x, x.dtype)
    codes = cp.empty((m, k), dtype=U8) if codes is None else codes
    scales = cp.empty((m,), dtype=F32) if scales is None else scales
    check_array("codes", codes, U8, (m, k))
    check_array("scales", scales, F32, (m,))
    vectors = x.dtype == BF16 and k % 8 == 0 and k > 0 and x.data.ptr % 16 == 0 and x.strides[0] % 16 == 0 \
        and codes.data.ptr % 8 == 0
    if m and vectors:  # a warp a row, 16-byte loads (the same bits)
        function("quantize.cu", "quantize_rows_warp_kernel")((-(-m // 8),), (256,), (x, codes, scales, cp.int32(m), cp.int32(k)))
    elif m:  # an empty row (K = 0) has scale 1
        function("quantize.cu", "quantize_rows_kernel")((m,), (256,), (x, codes, scales, cp.int32(k),
                                                                        cp.int32(1 if x.dtype == F32 else 0)))
    return codes, scales


# ------------------------------------------------------------------------------------------------ gemm.cu

GEMM_TILES = {
    # gemm.cu, mma.sync: any GPU from sm_80
    "large": dict(kind="mma", BM=128, BN=128, WM=64, WN=32, STAGES=2),
    "small": dict(kind="mma", BM=64, BN=64, WM=32, WN=32, STAGES=2),
    # (deeper pipelines and wider warp tiles, large3 / wide3 / small4, were never clearly faster than the best of
    # the others at the engine's GEMM shapes: docs/PERFORMANCE.md, "Tried and rejected")
    # gemm_sm90.cu, TMA + wgmma: Hopper only; BM = 64 * CONSUMERS
    "wg256": dict(kind="sm90", BN=256, CONSUMERS=2, STAGES=4),
    "wg128": dict(kind="sm90", BN=128, CONSUMERS=2, STAGES=6),
    "wg64": dict(kind="sm90", BN=128, CONSUMERS=1, STAGES=8),
    "wg64w": dict(kind="sm90", BN=256, CONSUMERS=1, STAGES=5),  # 64 x 256: the output projection of <= 64 rows
    "wg192": dict(kind="sm90", BN=192, CONSUMERS=2, STAGES=4),  # 128 x 192: a wave of tiles where 128 x 256 leaves SMs idle
    # several k-steps a stage, by 3-D boxes (KSTEPS; where 64 | K, else one): a one-consumer tile's pace is its
    # stages', ~220 ns each whatever their bytes (docs/PERFORMANCE.md, "GEMM tiles"). The narrow ones (64 x 32,
    # 64 x 8, as cuBLAS's at 64 rows) have the store epilogue only, from the registers (stores_only); with one
    # k-step a stage they were no faster than 64 x 64 (bench/micro/gemm_variants.py's wg64n).
    "wg64nk4": dict(kind="sm90", BN=64, CONSUMERS=1, STAGES=3, KSTEPS=4),
    "wg64k2": dict(kind="sm90", BN=128, CONSUMERS=1, STAGES=4, KSTEPS=2),
    "wg64n32k4": dict(kind="sm90", BN=32, CONSUMERS=1, STAGES=4, KSTEPS=4),
    "wg64n8k4": dict(kind="sm90", BN=8, CONSUMERS=1, STAGES=6, KSTEPS=4),  # 6 stages: 2-6% faster than 5
    "wg128k2": dict(kind="sm90", BN=128, CONSUMERS=2, STAGES=3, KSTEPS=2),
    # (128-row consumers, ping-pong consumers and clusters sharing tiles by TMA multicast were measured and
    # rejected: docs/PERFORMANCE.md, "Tried and rejected")
}
EPILOGUE_STORE, EPILOGUE_ARGMAX, EPILOGUE_TOPK, EPILOGUE_STAT = 0, 1, 2, 3


@lru_cache(maxsize=None)
def wgmma_available() -> bool:
    """Hopper (compute capability 9.0) runs gemm_sm90.cu; NLLB_NO_WGMMA=1 keeps gemm.cu everywhere."""
    try:
        return arch() == "sm_90" and not ENV.no_wgmma
    except cp.cuda.runtime.CUDARuntimeError:  # no GPU here
        return False


def available_tiles() -> list[str]:
    return [t for t, c in GEMM_TILES.items() if c["kind"] == "mma" or wgmma_available()]


@lru_cache(maxsize=None)
def multiprocessors() -> int:
    return cp.cuda.Device().attributes["MultiProcessorCount"]


_gemm_limit = threading.local()  # gemm_sms's limit, for the launches of the thread that set it


@contextmanager
def gemm_sms(limit: int | None):
    """The wgmma GEMMs launched inside spread their tiles over at most `limit` SMs (None: every SM): their
    persistent grids, a block an SM, then leave the other SMs to kernels of another stream (the GPU engine's
    step halves: one half's attention beside the other's GEMMs). Each output's sum runs in the same order
    whatever the grid, so the results are the same bits."""
    before = getattr(_gemm_limit, "sms", None)
    _gemm_limit.sms = limit
    try:
        yield
    finally:
        _gemm_limit.sms = before


def gemm_multiprocessors() -> int:
    """The SMs a wgmma GEMM launched now spreads its tiles over (gemm_sms)."""
    limit = getattr(_gemm_limit, "sms", None)
    return min(limit, multiprocessors()) if limit else multiprocessors()


# The wgmma tiles' cost a wave: a fixed part in microseconds (loads in flight, epilogue) and a rate in flops per
# microsecond per SM (with a bias, the engine's stores), fitted to every tile at every decode GEMM (64 to 4,096
# rows) and the encoder's on the H200 (docs/PERFORMANCE.md, "GEMM tiles"). A larger tile computes faster once there
# are tiles enough for every SM; a smaller one makes more tiles where there are not, and several k-steps a stage
# (KSTEPS) make its loads cheaper.
TILE_COSTS = {"wg256": (4.34, 6.18e6), "wg192": (3.70, 6.22e6), "wg128k2": (3.05, 5.63e6), "wg64k2": (2.47, 4.31e6),
              "wg64nk4": (1.42, 2.75e6), "wg64n32k4": (2.52, 1.83e6), "wg64n8k4": (0.96, 0.56e6)}


@lru_cache(maxsize=4096)
def gemm_tile(m: int, n: int, k: int = 1024, sms: int | None = None) -> str:
    """The default tile for an (m x k) @ (k x n) product, on `sms` SMs (None: every SM).

    On Hopper, the wgmma tile with the least time by a count of waves: ceil(tiles / SMs) waves, each costing
    TILE_COSTS's fixed part plus the tile's flops at its rate. Fitted to and checked against the H200's times
    at each decode GEMM with 64 to 4,096 rows and the encoder's, it picks the fastest of ten tiles at every one
    (docs/PERFORMANCE.md, "GEMM tiles"). Every tile sums each output in the same order (the same bits), so the
    choice changes no result. Elsewhere mma.sync: large tiles once they make a full wave of blocks, else small
    ones (measured on the H200: large is 1.05-1.4x small at 1,024 rows x 3,072-4,096 columns, small is 1.3x
    large at 256 rows x 1,024 columns)."""
    if wgmma_available():
        sms = sms or multiprocessors()

        def time(tile: str) -> float:
            bm, bn = tile_rows(tile), GEMM_TILES[tile]["BN"]
            fixed, rate = TILE_COSTS[tile]
            return -(-(-(-m // bm) * -(-n // bn)) // sms) * (fixed + 2 * k * bm * bn / rate)

        return min(TILE_COSTS, key=time)
    return "large" if -(-m // 128) * -(-n // 128) >= multiprocessors() else "small"


# TMA tensor maps (cuTensorMapEncodeTiled, from the driver through ctypes): 2-D bf16, f32 or uint8, box 128 bytes x
# rows, 128-byte swizzle, zeros past the edges. Cached by (address, shape, row stride, box rows, dtype), which fix them.
TENSOR_MAP = np.dtype([("bits", np.uint64, (16,))])
_maps: OrderedDict = OrderedDict()
MAX_MAPS = 4096


@lru_cache(maxsize=None)
def _encode_tiled():
    fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn


def tensor_map(a: cp.ndarray, box_rows: int, steps: int = 1):
    """The TMA map of a 2-D bf16, f32 or uint8 (FP8 codes) array whose rows are contiguous (a row slice of a wider
    array will do): boxes of 128 bytes (64 bf16, 32 f32, 128 uint8) x box_rows. steps > 1 (128 bytes | a row): a
    3-D map of the array seen as (cols / (128 bytes), rows, 128 bytes), boxes of `steps` such 2-D boxes, one after
    another (gemm_sm90.cu's KSTEPS, and its OUT_3D)."""
    rows, cols = a.shape
    key = (a.data.ptr, rows, cols, a.strides[0], box_rows, a.dtype.char, steps)
    found = _maps.get(key)
    if found is not None:
        _maps.move_to_end(key)
        return found
    raw = np.zeros(TENSOR_MAP.itemsize + 64, np.uint8)  # the driver wants the map 64-byte aligned
    offset = -raw.ctypes.data % 64
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    U8_TYPE, F32_TYPE, BF16_TYPE, SWIZZLE_128B, L2_PROMOTE_128B = 0, 7, 9, 3, 2  # CU_TENSOR_MAP_DATA_TYPE_UINT8, ...
    data_type = F32_TYPE if a.dtype == F32 else U8_TYPE if a.dtype == U8 else BF16_TYPE
    if steps > 1:
        inner = 128 // a.itemsize
        check(cols % inner == 0, "a 3-D tensor map needs rows of whole 128-byte steps")
        rc = _encode_tiled()(raw.ctypes.data + offset, data_type, 3, a.data.ptr, (u64 * 3)(inner, rows, cols // inner),
                             (u64 * 2)(a.strides[0], 128), (u32 * 3)(inner, box_rows, steps), (u32 * 3)(1, 1, 1), 0,
                             SWIZZLE_128B, L2_PROMOTE_128B, 0)
    else:
        rc = _encode_tiled()(raw.ctypes.data + offset, data_type, 2, a.data.ptr, (u64 * 2)(cols, rows),
                             (u64 * 1)(a.strides[0]), (u32 * 2)(128 // a.itemsize, box_rows), (u32 * 2)(1, 1), 0,
                             SWIZZLE_128B, L2_PROMOTE_128B, 0)
    if rc:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {rc}) for a {rows} x {cols} array")
    made = raw[offset:offset + TENSOR_MAP.itemsize].view(TENSOR_MAP)[0]  # a kernel parameter, passed by value
    _maps[key] = made
    if len(_maps) > MAX_MAPS:
        _maps.popitem(last=False)
    return made


def tile_rows(name: str) -> int:
    """BM, the rows of a GEMM tile."""
    tile = GEMM_TILES[name]
    if tile["kind"] == "mma":
        return tile["BM"]
    return 64 * tile["CONSUMERS"]


def stores_only(name: str) -> bool:
    """A tile whose kernel has the store epilogue alone (gemm), not the logits' (argmax, top-k)."""
    return GEMM_TILES[name]["BN"] % 64 != 0


# A wgmma GEMM's bf16 outputs without a residual, and its f32 outputs onto their residual in place (out is
# residual), leave through shared memory and the TMA unit (gemm_sm90.cu's TMA_STORE 1 and 2), while the consumers
# go on with their next tile (0: stored from the registers, for measuring)
TMA_STORE = ENV.tma_store  # NLLB_TMA_STORE
# How a TMA_STORE epilogue leaves (gemm_sm90.cu; a tile's entry overrides): OUT_3D, one copy a chunk of boxes (a
# 3-D map of out); EPI_CHUNKS, copies a pass (at most: a divisor of its boxes), each out while the next part is
# written; STMATRIX (bf16), the tile into shared memory by stmatrix. All three: the epilogue of a 128 x 256 bf16
# tile ~2.4 -> ~1.4 us, the decode GEMMs at 4,096 rows +1-3% (docs/PERFORMANCE.md, "GEMM tiles")
# STAGING_DIV: where a tile's stages would not all fit beside whole-pass staging buffers, the buffers up to that
# many times smaller, the tile leaving in as many times the passes (gemm_sm90.cu's EPI_PASSES): 128 x 256 keeps
# its 4 stages (3 beside whole buffers), +5-8% at 4,096 rows and on the encoder's GEMMs;
# STAGING_ALWAYS (for testing) divides them whether needed or not.
STORE_OPTIONS = {"OUT_3D": 1, "EPI_CHUNKS": 4, "STMATRIX": 1, "STAGING_DIV": 2, "STAGING_ALWAYS": 0}
KERNEL_DEFAULTS = {"OUT_3D": 0, "EPI_CHUNKS": 1, "STMATRIX": 0, "OUT_BOXES": 1}  # gemm_sm90.cu's
SMEM_LIMIT = 227 * 1024  # dynamic shared memory a block may take on sm_90
SMEM_STATIC = 1024  # gemm_sm90_kernel's own (ptxas)


def aligned16(*arrays: cp.ndarray) -> bool:
    """Every array starts, and every row of it starts, on 16 bytes: what 16-byte loads and TMA need."""
    return all(a.data.ptr % 16 == 0 and a.strides[0] % 16 == 0 for a in arrays)


def tma_ready(a: cp.ndarray) -> bool:
    return aligned16(a) and a.strides[1] == a.itemsize


def in_place(out: cp.ndarray | None, residual: cp.ndarray | None) -> bool:
    """out is residual: the same f32 elements (a GEMM adding onto the residual stream where it lies)."""
    return (out is not None and residual is not None and out.dtype == F32 and residual.dtype == F32
            and out.data.ptr == residual.data.ptr and out.shape == residual.shape and out.strides == residual.strides)


def gemm_launch(name: str, a: cp.ndarray, w: cp.ndarray, *, epilogue: int, bias=None, residual=None, out=None,
                part_val=None, part_idx=None, part_stat=None, relu: bool = False, out_f32: bool = False, thresh=None,
                needed=None, w_early=False, noise=None, a_scale=None, w_scale=None, **defines) -> None:
    """Launch gemm_kernel (gemm.cu) or gemm_sm90_kernel (gemm_sm90.cu) with a tile configuration; threads, grid
    and dynamic shared memory follow from it. Each epilogue is compiled into a kernel of its own (EPILOGUE_KIND):
    the one with all four was 2.7x the code, and a third of its stalls were instruction fetches. Absent arrays
    are None. needed: a byte per tile (tiles_m, tiles_n), 0 for a tile to skip; thresh: EPILOGUE_TOPK's per-row
    thresholds; noise: the rows' step keys of a SAMPLE argmax (gemm_epilogue.cuh). w_early (wgmma): w is constant, written by no kernel since the device last synchronized, so the
    kernel loads its first stages before waiting for the kernel before (gemm_sm90.cu). a and w uint8: FP8 E4M3
    codes with their rows' scales a_scale (M,) and w_scale (N,) f32 (gemm_sm90.cu's FP8; wgmma tiles only)."""
    tile = dict(GEMM_TILES[name])
    kind = tile.pop("kind")
    fp8 = a.dtype == U8
    if fp8:
        check(wgmma_available(), FP8_NEEDS_HOPPER)
        check(kind == "sm90", f"the {name} tile has no FP8 products: a wgmma tile has")
    m, k = a.shape
    n = w.shape[0]
    ptr = lambda x: NULL if x is None else x
    tail = (ptr(bias), ptr(residual), ptr(out), ptr(part_val), ptr(part_idx), cp.int32(m), cp.int32(n), cp.int32(k),
            cp.int32(1 if relu else 0), cp.int32(epilogue), cp.int32(1 if out_f32 else 0), ptr(part_stat))
    skips = (ptr(thresh), ptr(needed))
    check(epilogue == EPILOGUE_STORE or not stores_only(name), f"the {name} tile computes plain products only")
    if needed is not None:
        check(needed.dtype == cp.uint8 and needed.shape == (-(-m // tile_rows(name)), -(-n // tile["BN"])),
              "needed must be a uint8 byte per tile")
    if kind == "mma":
        kernel = function("gemm.cu", "gemm_kernel", **{**tile, "EPILOGUE_KIND": epilogue, **defines})
        threads = 32 * (tile["BM"] // tile["WM"]) * (tile["BN"] // tile["WN"])
        smem = tile["STAGES"] * (tile["BM"] + tile["BN"]) * 40 * 2
        grid, args = (-(-n // tile["BN"]), -(-m // tile["BM"])), (a, w) + tail + skips + (ptr(noise),)
    else:
        check(wgmma_available(), f"the {name} GEMM tile needs a Hopper GPU (sm_90)")
        check(tma_ready(a) and tma_ready(w), "TMA needs 16-byte aligned rows")
        bm, bn = tile_rows(name), tile["BN"]
        threads = 128 * (tile["CONSUMERS"] + 1)  # one warpgroup loads, the others compute
        # k-steps a stage (3-D boxes: whole 128-byte steps)
        steps = tile.pop("KSTEPS", 1) if k * a.itemsize % 128 == 0 else 1
        tile.pop("KSTEPS", None)
        if steps > 1:  # compiled in only then: the one-k-step kernels stay as they were
            tile["KSTEPS"] = steps
        stage_bytes = (bm + bn) * 128 * steps  # rows of 128 bytes: 64 bf16 or 128 E4M3 of k a step
        map_a = tensor_map(a, bm, steps)
        out_map, staging = map_a, 0  # map_a a placeholder: map_out is read only by TMA_STORE
        store_options = {key: tile.pop(key, value) for key, value in STORE_OPTIONS.items()}
        if TMA_STORE and epilogue == EPILOGUE_STORE and bn % 64 == 0 and out is not None:
            store = 1 if residual is None and not out_f32 else 2 if in_place(out, residual) else 0
            if store and tma_ready(out) and (bias is None or bias.data.ptr % 8 == 0):
                box_cols, passes = (64, 1) if store == 1 else (32, 2)  # bf16 in one pass, f32 in two by default
                boxes_a_pass = bn // box_cols // passes
                for div in (d for d in range(1, store_options["STAGING_DIV"] + 1) if boxes_a_pass % d == 0):
                    staging = bm * bn // (passes * div) * (2 if store == 1 else 4)  # whole boxes a pass
                    if tile["STAGES"] * stage_bytes + 1024 + staging + SMEM_STATIC <= SMEM_LIMIT and \
                            not (store_options["STAGING_ALWAYS"] and div < store_options["STAGING_DIV"]):
                        break  # the least division that keeps the tile's stages
                if div > 1:
                    passes *= div
                    tile["EPI_PASSES"] = passes
                pass_cols = bn // passes
                tile["STAGES"] = min(tile["STAGES"], (SMEM_LIMIT - SMEM_STATIC - 1024 - staging) // stage_bytes)
                tile["TMA_STORE"] = store
                per_pass = pass_cols // box_cols  # boxes a pass
                chunks = max(c for c in range(1, store_options["EPI_CHUNKS"] + 1) if per_pass % c == 0)
                boxes = pass_cols // chunks // box_cols  # boxes a copy
                out_3d = store_options["OUT_3D"] and boxes > 1 and n % box_cols == 0
                chosen = dict(OUT_3D=int(out_3d), EPI_CHUNKS=chunks, STMATRIX=int(store == 1 and store_options["STMATRIX"]),
                              OUT_BOXES=boxes if out_3d else 1)
                # the kernel's own defaults stay out of its defines (one compiled kernel for one configuration)
                tile.update({key: value for key, value in chosen.items() if value != KERNEL_DEFAULTS[key]})
                out_map = tensor_map(out, 64, boxes if out_3d else 1)
        smem = tile["STAGES"] * stage_bytes + 1024 + staging
        if fp8:  # compiled in only then: the bf16 kernels stay as they were
            tile["FP8"] = 1
        kernel = function("gemm_sm90.cu", "gemm_sm90_kernel", target="sm_90a",
                          **{**tile, "EPILOGUE_KIND": epilogue, "PDL": 1, **defines})
        m_fastest = m <= n  # consecutive tiles share the W tile; A, the smaller operand, stays in L2
        tiles = -(-m // bm) * -(-n // bn)
        grid = (min(tiles, gemm_multiprocessors()),)  # persistent: a block an SM walks the tiles
        args = (map_a, tensor_map(w, bn, steps), out_map) + tail + (cp.int32(1 if m_fastest else 0),) + skips + \
            (cp.int32(1 if w_early else 0), ptr(noise)) + ((a_scale, w_scale) if fp8 else ())
    if smem + (SMEM_STATIC if kind == "sm90" else 0) > SMEM_LIMIT:
        raise ValueError(f"the {name} tile takes {smem:,} bytes of shared memory, more than a block may have")
    allow_smem(kernel, smem)
    if kind == "sm90":  # compiled with PDL: a programmatic dependent launch (launch.py) where the driver has them
        launch.launch(kernel, grid, (threads,), args, smem)
    else:
        kernel(grid, (threads,), args, shared_mem=smem)


def gemm(a: cp.ndarray, w: cp.ndarray, bias: cp.ndarray | None = None, residual: cp.ndarray | None = None,
         relu: bool = False, out: cp.ndarray | None = None, out_dtype=BF16, tile: str | None = None,
         weights: bool = False) -> cp.ndarray:
    """out = relu?(a @ w.T + bias) + residual. a (M, K) bf16, w (N, K) bf16 (nn.Linear's layout), bias (N,)
    f32, residual (M, N) f32; out (M, N) bf16 or f32, fp32 accumulation. K % 8 == 0. out may be residual
    itself (in place: the fastest way onto the residual stream on Hopper); it may overlap no other operand.
    weights: w is a model's weight matrix, written by no kernel since the device last synchronized (the
    engine's, synchronized after its load): on Hopper its first stages load under the kernel before's tail."""
    k, n = a.shape[1], w.shape[0]
    check_array("a", a, BF16)
    check_array("w", w, BF16, (n, k))
    check(k % 8 == 0, f"gemm needs K % 8 == 0 (16-byte rows), got K={k}")
    return stored_product("gemm", a, w, k, bias, residual, relu, out, out_dtype, tile, weights)


def stored_product(name: str, a: cp.ndarray, w: cp.ndarray, tile_k: int, bias, residual, relu: bool, out, out_dtype,
                   tile: str | None, weights: bool, **scales) -> cp.ndarray:
    """gemm's and gemm_fp8's store epilogue: bias, residual and out checked, out made where not given, the
    launch with the tile for (M, N, tile_k) unless one is given; `scales` are gemm_fp8's a_scale and w_scale."""
    m, n = a.shape[0], w.shape[0]
    if bias is not None:
        check_array("bias", bias, F32, (n,))
    if residual is not None:
        check_array("residual", residual, F32, (m, n))
    if out is None:
        out = cp.empty((m, n), dtype=out_dtype)
    check(out.dtype in (BF16, F32), f"{name} writes bf16 or f32")
    check_array("out", out, out.dtype, (m, n))
    if m:
        gemm_launch(tile or gemm_tile(m, n, tile_k, gemm_multiprocessors()), a, w, epilogue=EPILOGUE_STORE, bias=bias,
                    residual=residual, out=out, relu=relu, out_f32=out.dtype == F32, w_early=weights, **scales)
    return out


FP8_NEEDS_HOPPER = "--compute-type float8 needs a Hopper GPU (sm_90)"  # FP8 products are wgmma's


def check_scales(name: str, scales: cp.ndarray, rows: int) -> None:
    """A scale a row, f32, (rows,) or numerics.quantize_e4m3's (rows, 1); 8-byte aligned (gemm_sm90.cu reads w's
    two at a time)."""
    check_array(name, scales, F32)
    check(scales.shape in ((rows,), (rows, 1)), f"{name} has shape {scales.shape}, expected ({rows},)")
    check(scales.data.ptr % 8 == 0, f"{name} must be 8-byte aligned")


def gemm_fp8(a_codes: cp.ndarray, a_scale: cp.ndarray, w_codes: cp.ndarray, w_scale: cp.ndarray,
             bias: cp.ndarray | None = None, residual: cp.ndarray | None = None, relu: bool = False,
             out: cp.ndarray | None = None, out_dtype=BF16, tile: str | None = None,
             weights: bool = False) -> cp.ndarray:
    """gemm's out = relu?(a @ w.T + bias) + residual with FP8 E4M3 operands: a = e4m3(a_codes) * a_scale[:, None],
    w = e4m3(w_codes) * w_scale[:, None]. a_codes (M, K) and w_codes (N, K) uint8 (quantize_rows; a weight's once,
    numerics.quantize_e4m3), a_scale (M,), w_scale (N,) f32; the rest as gemm's. K % 16 == 0 (16-byte rows for
    TMA). Hopper only (wgmma); the products are summed with FP8 wgmma's precision (tests/gpu/test_fp8_kernels.py)."""
    m, k = a_codes.shape
    n = w_codes.shape[0]
    check(wgmma_available(), FP8_NEEDS_HOPPER)
    check_array("a_codes", a_codes, U8)
    check_array("w_codes", w_codes, U8, (n, k))
    check_scales("a_scale", a_scale, m)
    check_scales("w_scale", w_scale, n)
    check(k % 16 == 0, f"gemm_fp8 needs K % 16 == 0 (16-byte rows), got K={k}")
    # FP8 products at twice bf16's rate: bf16's tile for half the k
    return stored_product("gemm_fp8", a_codes, w_codes, max(k // 2, 1), bias, residual, relu, out, out_dtype, tile,
                          weights, a_scale=a_scale, w_scale=w_scale)


@dataclass(frozen=True)
class Fp8Weight:
    """A weight matrix (N, K) as FP8 E4M3 codes (uint8) and a scale a row (N,) f32 (numerics.quantize_e4m3). The
    logits launchers take one in place of a bf16 matrix: h is then quantized per row (quantize_rows) and the
    product runs in FP8 (gemm_fp8's)."""
    codes: cp.ndarray
    scales: cp.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape


def logits_operands(h: cp.ndarray, w, take) -> tuple[cp.ndarray, cp.ndarray, dict]:
    """h (M, D) and w (V, D) as the logits' GEMM takes them, and its scales: bf16 as they are; w an Fp8Weight, h's
    rows quantized into `take`'s arrays."""
    m, d = h.shape
    n = w.shape[0]
    check_array("h", h, BF16)
    check(d % 8 == 0, f"logits need D % 8 == 0, got D={d}")
    if not isinstance(w, Fp8Weight):
        check_array("w", w, BF16, (n, d))
        return h, w, {}
    check(wgmma_available(), FP8_NEEDS_HOPPER)
    check_array("w codes", w.codes, U8, (n, d))
    check_scales("w scales", w.scales, n)
    check(d % 16 == 0, f"FP8 logits need D % 16 == 0, got D={d}")
    codes, scales = quantize_rows(h, take("fp8 h codes", (m, d), U8), take("fp8 h scales", (m,), F32))
    return codes, w.codes, {"a_scale": scales, "w_scale": w.scales}


def new_array(name: str, shape: tuple, dtype) -> cp.ndarray:
    """The default `take` of the launchers below: a fresh array each call. A decoder step passes its
    workspace's instead (engine.cuda.Workspace.take), which hands back the same memory every step, so that the
    step allocates nothing and can be captured in a CUDA graph."""
    return cp.empty(shape, dtype=dtype)


def logits_argmax(h: cp.ndarray, w: cp.ndarray, tile: str | None = None, ids: cp.ndarray | None = None,
                  values: cp.ndarray | None = None, take=new_array, noise: cp.ndarray | None = None,
                  temperature: float = 1.0, banned: int | None = None,
                  logprob: cp.ndarray | None = None) -> tuple[cp.ndarray, cp.ndarray]:
    """The greedy choice without writing the logits: argmax_n (h @ w.T)[m] and its value, per row.
    h (M, D) bf16, w (V, D) bf16 or an Fp8Weight (FP8 products) -> (M,) int32 ids, (M,) f32 logits. Ties go to
    the lower id. take(name, shape, dtype): where the partial results and absent outputs go. With noise, the
    rows' step keys (M,) uint32: a draw from softmax(logits / temperature) per row (token `banned` left out), by
    the Gumbel-max trick, the value logit / temperature + its noise (numerics.gumbel_noise). Without noise, and
    with logprob (M,) f32, also each id's log-probability (log_softmax of the row's logits at the id), in the same
    pass over w (the ARGMAX_LSE epilogue: one exponential a logit)."""
    m, n = h.shape[0], w.shape[0]
    a, b, scales = logits_operands(h, w, take)
    # wgmma: 64 x 256 tiles up to 64 rows (the weights at 3.9 TB/s against 3.2 with 128 x 256), else 128 x 256
    # (1.45x 128 x 128 at 4,096 rows); mma.sync: 1.8x faster with large tiles at 1,024+ rows
    if tile is None:
        tile = ("wg64w" if m <= 64 else "wg256") if wgmma_available() else gemm_tile(m, n)
    blocks_n = -(-n // GEMM_TILES[tile]["BN"])
    part_val = take("argmax part_val", (m, blocks_n), F32)
    part_idx = take("argmax part_idx", (m, blocks_n), cp.int32)
    sample = {}
    if noise is not None:
        check_array("noise", noise, cp.uint32, (m,))
        inverse = float(inverse_temperature(temperature))  # the reference's float32
        sample = {"SAMPLE": 1, "SAMPLE_INV_TEMP": f"{inverse.hex()}f", "SAMPLE_BANNED": -1 if banned is None else banned}
    part_sum = None
    if logprob is not None:
        check(noise is None, "a draw's log-probability is not its value's: logits_lse gives the log-sum-exp")
        check_array("logprob", logprob, F32, (m,))
        part_sum, sample = take("argmax part_sum", (m, blocks_n), F32), {"ARGMAX_LSE": 1}
    if m:
        gemm_launch(tile, a, b, epilogue=EPILOGUE_ARGMAX, part_val=part_val, part_idx=part_idx, part_stat=part_sum,
                    noise=noise, **sample, **scales)
    ids = take("argmax ids", (m,), cp.int32) if ids is None else ids
    values = take("argmax values", (m,), F32) if values is None else values
    check_array("ids", ids, cp.int32, (m,))
    check_array("values", values, F32, (m,))
    if m:
        function("gemm.cu", "argmax_reduce_kernel")((m,), (128,), (part_val, part_idx, values, ids, cp.int32(blocks_n),
                                                                    NULL if part_sum is None else part_sum,
                                                                    NULL if logprob is None else logprob))
    return ids, values


def logits_topk(h: cp.ndarray, w: cp.ndarray, k: int, logprob: cp.ndarray | None = None,
                ids: cp.ndarray | None = None, tile: str | None = None,
                select_tile: str | None = None, take=new_array) -> tuple[cp.ndarray, cp.ndarray]:
    """Beam search's choice without writing the logits: the k largest log_softmax(h @ w.T) per row, best
    first (ties: lower id). h (M, D) bf16, w (V, D) bf16 or an Fp8Weight -> (M, k) f32 log-probs, (M, k) int32 ids.

    Two passes over w (gemm.cu says why they agree with one over every column): `tile` computes each row's
    max and sum of exponentials per part of columns, a part as wide as `select_tile`'s tiles; a row's
    threshold is its k-th largest part max; `select_tile` recomputes only the tiles where a row's part max
    reaches its threshold and lists the candidates there. The statistics have the same bits whatever the
    first tile, so the result does not depend on it. take: as logits_argmax's."""
    m, n = h.shape[0], w.shape[0]
    a, b, scales = logits_operands(h, w, take)
    check(1 <= k <= 32 and k <= n, f"top-k needs 1 <= k <= 32 and k <= V, got k={k}")
    hopper = wgmma_available()
    if select_tile is None:  # wgmma: the lists live in registers, beside 64 (wg128) or 32 (wg64) accumulators a thread
        mma = tile is not None and GEMM_TILES[tile]["kind"] == "mma"
        select_tile = ("wg128" if k <= 8 else "wg64") if hopper and not mma else (tile or "small")
    if tile is None:  # the first pass keeps no lists: the widest tile, its statistics per part of the second's width
        tile = "wg256" if hopper else select_tile
    part = GEMM_TILES[select_tile]["BN"]
    bn = GEMM_TILES[tile]["BN"]
    check(bn % part == 0 and (GEMM_TILES[tile]["kind"] == "sm90" or bn == part),
          f"top-k's first pass ({tile}) cannot give statistics per {part} columns")
    parts = -(-n // part)
    logprob = take("topk logprob", (m, k), F32) if logprob is None else logprob
    ids = take("topk ids", (m, k), cp.int32) if ids is None else ids
    check_array("logprob", logprob, F32, (m, k))
    check_array("ids", ids, cp.int32, (m, k))
    if not m:
        return logprob, ids
    stat = take("topk stat", (m, parts, 2), F32)
    gemm_launch(tile, a, b, epilogue=EPILOGUE_STAT, part_stat=stat, **({"PART": part} if part < bn else {}), **scales)
    lse, thresh = take("topk lse", (m,), F32), take("topk thresh", (m,), F32)
    rows = tile_rows(select_tile)
    needed = take("topk needed", (-(-m // rows), parts), cp.uint8)
    needed.fill(0)
    function("gemm.cu", "topk_threshold_kernel", TOPK=k)((m,), (256,), (stat, lse, thresh, needed, cp.int32(parts),
                                                                       cp.int32(rows)))
    part_val = take("topk part_val", (m, parts, k), F32)
    part_idx = take("topk part_idx", (m, parts, k), cp.int32)
    gemm_launch(select_tile, a, b, epilogue=EPILOGUE_TOPK, part_val=part_val, part_idx=part_idx, thresh=thresh,
                needed=needed, TOPK=k, **scales)
    function("gemm.cu", "topk_select_kernel", TOPK=k)((-(-m // 8),), (256,), (
        stat, part_val, part_idx, lse, thresh, logprob, ids, cp.int32(m), cp.int32(parts)))
    return logprob, ids


def logits_lse(h: cp.ndarray, w: cp.ndarray, take=new_array) -> cp.ndarray:
    """Each row's log-sum-exp of h @ w.T, (M,) f32 (w bf16 or an Fp8Weight), without writing the logits:
    logits_topk's first pass (the per-part statistics, then topk_threshold_kernel). take: as logits_argmax's."""
    m, n = h.shape[0], w.shape[0]
    a, b, scales = logits_operands(h, w, take)
    tile = "wg256" if wgmma_available() else "small"
    parts = -(-n // GEMM_TILES[tile]["BN"])
    lse = take("lse", (m,), F32)
    if m:
        stat = take("lse stat", (m, parts, 2), F32)
        gemm_launch(tile, a, b, epilogue=EPILOGUE_STAT, part_stat=stat, **scales)
        thresh, needed = take("lse thresh", (m,), F32), take("lse needed", (m, parts), cp.uint8)
        function("gemm.cu", "topk_threshold_kernel", TOPK=1)((m,), (256,), (stat, lse, thresh, needed, cp.int32(parts),
                                                                           cp.int32(1)))
    return lse


ROWS_TOPK_MAX = 1024  # topk.cu's TOPK_MAX


def rows_topk(x: cp.ndarray, k: int, lse: cp.ndarray | None = None, values: cp.ndarray | None = None,
              ids: cp.ndarray | None = None) -> tuple[cp.ndarray, cp.ndarray, cp.ndarray]:
    """Each row's k largest log-probabilities from logits written whole (topk.cu's radix selection): x (M, V)
    f32 -> lse (M,) f32, values (M, k) f32 (x - lse, best first, ties: lower id), ids (M, k) int32. 1 <= k <=
    min(V, ROWS_TOPK_MAX)."""
    m, n = x.shape
    check_array("x", x, F32, (m, n))
    check(1 <= k <= min(n, ROWS_TOPK_MAX), f"rows_topk needs 1 <= k <= min(V, {ROWS_TOPK_MAX}), got k={k}, V={n}")
    lse = cp.empty((m,), F32) if lse is None else lse
    values = cp.empty((m, k), F32) if values is None else values
    ids = cp.empty((m, k), cp.int32) if ids is None else ids
    check_array("lse", lse, F32, (m,))
    check_array("values", values, F32, (m, k))
    check_array("ids", ids, cp.int32, (m, k))
    if m:
        function("topk.cu", "rows_topk_kernel")((m,), (1024,), (x, cp.int32(n), cp.int32(k), lse, values, ids))
    return lse, values, ids


# ------------------------------------------------------------------------------------------------ the rest

def layernorm(x: cp.ndarray, weight: cp.ndarray, bias: cp.ndarray, eps: float = 1e-5, out: cp.ndarray | None = None) -> cp.ndarray:
    """LayerNorm of the f32 residual stream x (M, D) with f32 weight and bias -> bf16 (M, D)."""
    m, d = x.shape
    check_array("x", x, F32)
    check_array("weight", weight, F32, (d,))
    check_array("bias", bias, F32, (d,))
    out = cp.empty((m, d), dtype=BF16) if out is None else out
    check_array("out", out, BF16, (m, d))
    if m:
        function("layernorm.cu", "layernorm_kernel")((-(-m // 8),), (256,), (x, weight, bias, out, cp.int32(m), cp.int32(d),
                                                                        cp.float32(eps)))
    return out


def layernorm_e4m3(x: cp.ndarray, weight: cp.ndarray, bias: cp.ndarray, eps: float = 1e-5, codes: cp.ndarray | None = None,
                   scales: cp.ndarray | None = None) -> tuple[cp.ndarray, cp.ndarray]:
    """quantize_rows(layernorm(x, weight, bias)) in one kernel, bit for bit: the LayerNorm's bf16 output as FP8 E4M3
    codes (M, D) uint8 and a scale a row (M,) f32, for an FP8 GEMM (gemm_fp8)."""
    m, d = x.shape
    check_array("x", x, F32)
    check_array("weight", weight, F32, (d,))
    check_array("bias", bias, F32, (d,))
    codes = cp.empty((m, d), dtype=U8) if codes is None else codes
    scales = cp.empty((m,), dtype=F32) if scales is None else scales
    check_array("codes", codes, U8, (m, d))
    check_array("scales", scales, F32, (m,))
    if m:
        function("layernorm.cu", "layernorm_e4m3_kernel")((-(-m // 8),), (256,), (x, weight, bias, codes, scales,
                                                                                 cp.int32(m), cp.int32(d), cp.float32(eps)))
    return codes, scales


def embed(ids: cp.ndarray, pos: cp.ndarray, table, positions: cp.ndarray, scale: float,
          out: cp.ndarray | None = None) -> cp.ndarray:
    """table[ids] * scale + positions[pos]: ids, pos (M,) int32; table (V, D) bf16 or an Fp8Weight (its rows'
    values); positions (P, D) f32 -> f32 (M, D)."""
    (m,), d = ids.shape, table.shape[1]
    check_array("ids", ids, cp.int32)
    check_array("pos", pos, cp.int32, (m,))
    fp8 = isinstance(table, Fp8Weight)
    if fp8:
        check_array("table codes", table.codes, U8)
        check_scales("table scales", table.scales, table.shape[0])
    else:
        check_array("table", table, BF16)
    check_array("positions", positions, F32)
    check(positions.shape[1] == d, "positions and table differ in width")
    out = cp.empty((m, d), dtype=F32) if out is None else out
    check_array("out", out, F32, (m, d))
    if m and fp8:
        function("embed.cu", "embed_e4m3_kernel")((m,), (128,), (ids, pos, table.codes, table.scales, positions, out,
                                                                 cp.int32(d), cp.float32(scale)))
    elif m:
        function("embed.cu", "embed_kernel")((m,), (128,), (ids, pos, table, positions, out, cp.int32(d), cp.float32(scale)))
    return out


@dataclass(frozen=True)
class Fp8Rows:
    """Rows of an FP8 K/V cache (--kv-cache-type float8): E4M3 codes (rows, W) uint8 and a scale a head of each row
    (rows, W / E) f32, numerics.quantize_heads' layout; each may be a column slice of a wider array (a row's codes
    contiguous, its scales too). kernels.copy_rows quantizes rows into one; kernels.attention reads K and V from two."""
    codes: cp.ndarray
    scales: cp.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    def check(self, name: str) -> None:
        check(self.codes.dtype == U8 and self.scales.dtype == F32, f"{name} must be uint8 codes and f32 scales")
        check(self.codes.ndim == 2 and self.scales.ndim == 2 and self.scales.shape[0] == self.codes.shape[0]
              and self.scales.shape[1] > 0 and self.codes.shape[1] % self.scales.shape[1] == 0,
              f"{name} needs a scale for each head of each row")
        check(self.codes.strides[1] == 1 and self.scales.strides[1] == 4, f"{name} needs contiguous rows")


def attention(q: cp.ndarray, k, v, start: cp.ndarray | None, length: cp.ndarray, heads: int,
              out: cp.ndarray | None = None, table: cp.ndarray | None = None, max_keys: int | None = None,
              together: bool = False) -> cp.ndarray:
    """Query r attends to key rows start[r] .. start[r] + length[r] - 1 (or, with a table, to rows
    table[r, 0 .. length[r] - 1]), per head: the decoder's self- and cross-attention, one query per row.

    q (R, D) bf16, or a column slice of a wider array whose rows hold D contiguous values (a fused QKV);
    k and v likewise (rows, D) views with the same row stride, or both Fp8Rows (an FP8 cache's codes with a scale
    a head: attention_e4m3_kernel, attention_decode_e4m3_*); start, length (R,) int32, length >= 1;
    table (R, T) int32. max_keys: the largest length, when the caller knows it (it picks the warp-per-row
    kernel for head sizes 64 and 128). together: that kernel's blocks each take one head of 4 consecutive rows,
    not 4 heads of one row, so that rows reading the same keys (a sentence's beams or samples, its copies for
    several targets, in cross-attention) read them once from memory into the SM's L1; the same results.
    -> (R, D) bf16."""
    r, d = q.shape
    fp8 = isinstance(k, Fp8Rows)
    check(q.dtype == BF16 and q.strides[1] == 2, "q must be bf16 with contiguous rows")
    if fp8:
        check(isinstance(v, Fp8Rows), "k and v must both be Fp8Rows, or both bf16")
        k.check("k")
        v.check("v")
        check(k.shape[1] == d and v.shape == k.shape and k.codes.strides == v.codes.strides
              and k.scales.shape == v.scales.shape and k.scales.strides == v.scales.strides
              and k.scales.shape[1] == heads, "k and v must be alike, D wide, with a scale a head")
    else:
        check(k.dtype == BF16 and v.dtype == BF16, "q, k and v must be bf16")
        check(k.strides[1] == v.strides[1] == 2, "q, k and v need contiguous rows")
        check(k.shape[1] == d and v.shape == k.shape and k.strides == v.strides, "k and v must be alike, D wide")
    check((start is None) != (table is None), "give start or table, not both")
    if start is not None:
        check_array("start", start, cp.int32, (r,))
    else:
        check(table.dtype == cp.int32 and table.ndim == 2 and table.shape[0] == r and table.strides[1] == 4,
              "table must be (R, T) int32 with contiguous rows")
    check_array("length", length, cp.int32, (r,))
    e = d // heads
    check(d % heads == 0 and e <= 256, f"head size {e} must divide D and be at most 256")
    out = cp.empty((r, d), dtype=BF16) if out is None else out
    check_array("out", out, BF16, (r, d))
    if not r:
        return out
    if fp8:
        keys = (k.codes, v.codes, cp.int32(k.codes.strides[0]), k.scales, v.scales, cp.int32(k.scales.strides[0] // 4))
        aligned, kind = aligned16(q, k.codes, v.codes), "e4m3_"
    else:
        keys, aligned, kind = (k, v, cp.int32(k.strides[0] // 2)), aligned16(q, k, v), ""
    common = (q, cp.int32(q.strides[0] // 2)) + keys + (start if start is not None else NULL, length,
              table if table is not None else NULL, cp.int32(table.strides[0] // 4 if table is not None else 0), out)
    if e in (64, 128) and max_keys is not None and max_keys <= DECODE_MAX_KEYS and aligned:
        blocks = -(-r // 4) * heads if together else -(-r * heads // 4)
        function("attention.cu", f"attention_decode_{kind}{e}_kernel")((blocks,), (128,), common + (
            cp.int32(r), cp.int32(heads), cp.float32(e**-0.5), cp.int32(1 if together else 0)))
    else:
        function("attention.cu", f"attention_{kind}kernel")((r, heads), (128,), common + (cp.int32(e),
                                                                                           cp.float32(e**-0.5)))
    return out


DECODE_MAX_KEYS = 1024  # attention_decode keeps a warp's scores in shared memory
PREFILL_SMEM_LIMIT = 200 * 1024  # bytes of shared memory the prefill kernel may ask for (the H100/H200 give 227 KB)
PREFILL_MMA = True  # encoder self-attention on the tensor cores (attention_prefill_mma_*) wherever it applies
PREFILL_MMA_WARPS = 4  # attention.cu's MMA_WARPS


def prefill_mma_smem(e: int, max_len: int) -> int:
    """Bytes of shared memory attention_prefill_mma takes: K and V for max_len rounded up to 16 rows and a
    16-row query tile per warp, rows of e + 8 bf16 (at most PREFILL_SMEM_LIMIT: max_len 672 at e 64, 336 at 128)."""
    return (2 * (-(-max_len // 16) * 16) + 16 * PREFILL_MMA_WARPS) * (e + 8) * 2


def attention_prefill(q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, seq_start: cp.ndarray, seq_len: cp.ndarray,
                      rows_per_seq: int, max_len: int, heads: int, out: cp.ndarray | None = None) -> cp.ndarray:
    """Encoder self-attention: sequence b's queries, keys and values are rows seq_start[b] .. seq_start[b] +
    seq_len[b] - 1 of q, k and v, and each query attends to its own sequence. rows_per_seq > 0: sequences
    padded to that many rows each (the padded rows hold nothing meaningful); 0: packed without padding.
    q, k, v (rows, D) bf16 views (column slices of a fused QKV do); seq_start, seq_len (B,) int32;
    max_len >= every seq_len. -> (rows, D). On the tensor cores (attention_prefill_mma_*) where PREFILL_MMA, the
    head size is 64 or 128, every array is 16-byte aligned and max_len fits prefill_mma_smem; else the CUDA-core
    kernels (attention_prefill_*), and past their shared memory the general attention kernel."""
    rows, d = q.shape
    (b,) = seq_len.shape
    e = d // heads
    check_array("seq_start", seq_start, cp.int32, (b,))
    check_array("seq_len", seq_len, cp.int32, (b,))
    check(k.shape[1] == d and v.shape == k.shape and k.strides == v.strides, "k and v must be alike, D wide")
    out = cp.empty((rows, d), dtype=BF16) if out is None else out
    check_array("out", out, BF16, (rows, d))
    args = (q, cp.int32(q.strides[0] // 2), k, v, cp.int32(k.strides[0] // 2), seq_start, seq_len, cp.int32(rows_per_seq),
            out, cp.int32(d), cp.int32(e), cp.float32(e**-0.5), cp.int32(max_len))
    smem = prefill_mma_smem(e, max_len)
    if PREFILL_MMA and e in (64, 128) and smem <= PREFILL_SMEM_LIMIT and aligned16(q, k, v, out):
        kernel = function("attention.cu", f"attention_prefill_mma_{e}_kernel")
        allow_smem(kernel, smem)
        kernel((b, heads), (32 * PREFILL_MMA_WARPS,), args, shared_mem=smem)
        return out
    smem = 2 * max_len * (e + 2) * 2 + 8 * e * 4 + 8 * max_len * 4
    if smem > PREFILL_SMEM_LIMIT or e % 2:
        # too long to hold in shared memory: the general kernel, one block per query
        starts, lens = cp.asnumpy(seq_start), cp.asnumpy(seq_len)
        repeats = np.full(b, rows_per_seq) if rows_per_seq else lens
        query_rows = np.concatenate([s + np.arange(n) for s, n in zip(starts, repeats)])
        attention(q[query_rows[0] : query_rows[-1] + 1], k, v, cp.asarray(np.repeat(starts, repeats).astype(np.int32)),
                  cp.asarray(np.repeat(lens, repeats).astype(np.int32)), heads, out=out[query_rows[0] : query_rows[-1] + 1])
        return out
    aligned = aligned16(q, k, v)
    name = f"attention_prefill_{e}_kernel" if e in (64, 128) and aligned else "attention_prefill_kernel"
    kernel = function("attention.cu", name)
    allow_smem(kernel, smem)
    kernel((b, heads), (256,), args, shared_mem=smem)
    return out


def copy_rows(src: cp.ndarray, src_rows: cp.ndarray, dst, dst_rows: cp.ndarray) -> None:
    """dst[dst_rows[r]] = src[src_rows[r]]: 2-D bf16 arrays or column slices of equal width (a multiple of 8). dst
    an Fp8Rows (an FP8 K/V cache): each row quantized a head at a time as it is copied (copy_rows_e4m3_kernel,
    numerics.quantize_heads' codes and scales), its width a multiple of the head size, which is even."""
    (r,), width = src_rows.shape, src.shape[1]
    check_array("src_rows", src_rows, cp.int32)
    check_array("dst_rows", dst_rows, cp.int32, (r,))
    if isinstance(dst, Fp8Rows):
        dst.check("dst")
        e = width // dst.scales.shape[1]
        check(src.dtype == BF16 and src.strides[1] == 2, "copy_rows quantizes bf16 rows with contiguous elements")
        check(dst.shape[1] == width and e % 2 == 0, "src and dst rows must be equally wide, of heads of an even size")
        check(src.data.ptr % 4 == 0 and src.strides[0] % 4 == 0 and dst.codes.data.ptr % 2 == 0
              and dst.codes.strides[0] % 2 == 0, "copy_rows into FP8 rows needs src rows 4-byte, codes 2-byte aligned")
        if r:
            function("cache.cu", "copy_rows_e4m3_kernel")((r,), (128,), (
                src, cp.int64(src.strides[0] // 2), src_rows, dst.codes, cp.int64(dst.codes.strides[0]), dst.scales,
                cp.int64(dst.scales.strides[0] // 4), dst_rows, cp.int32(width), cp.int32(e)))
        return
    check(src.dtype == BF16 and dst.dtype == BF16, "copy_rows moves bf16 rows")
    check(dst.shape[1] == width and width % 8 == 0, "src and dst rows must be equally wide, a multiple of 8")
    check(src.strides[1] == dst.strides[1] == 2, "rows must be contiguous")
    check(src.strides[0] % 16 == 0 and dst.strides[0] % 16 == 0 and src.data.ptr % 16 == 0 and dst.data.ptr % 16 == 0,
          "copy_rows needs 16-byte aligned rows")
    if r:
        function("cache.cu", "copy_rows_kernel")((r,), (128,), (
            src, cp.int64(src.strides[0] // 2), src_rows, dst, cp.int64(dst.strides[0] // 2), dst_rows, cp.int32(width),
        ))


def sample_keys(key: cp.ndarray, self_len: cp.ndarray, noise: cp.ndarray) -> None:
    """Each row's stream key at this step (numerics.step_keys of its key and step, the step being self_len - 2,
    step_prep's key count less the decoder start and the language token): key, noise (N,) uint32, self_len
    (N,) int32."""
    (n,) = key.shape
    check_array("key", key, cp.uint32, (n,))
    check_array("self_len", self_len, cp.int32, (n,))
    check_array("noise", noise, cp.uint32, (n,))
    if n:
        function("step.cu", "sample_keys_kernel")((-(-n // 256),), (256,), (key, self_len, noise, cp.int32(n)))


def step_prep(tokens: cp.ndarray, row_t: cp.ndarray, slot_base: cp.ndarray, table: cp.ndarray, pos: cp.ndarray,
              new_rows: cp.ndarray, self_len: cp.ndarray, pad: int) -> None:
    """A decoder step's per-row bookkeeping on the device (step.cu): each row's embedding position, the cache
    row its K/V go to (entered in its table), its key count; then its position advances. tokens, row_t,
    slot_base, pos, new_rows, self_len (N,) int32; table (N, cache_rows) int32 with contiguous rows."""
    (n,) = tokens.shape
    for name, a in (("tokens", tokens), ("row_t", row_t), ("slot_base", slot_base), ("pos", pos), ("new_rows", new_rows),
                    ("self_len", self_len)):
        check_array(name, a, cp.int32, (n,))
    check(table.dtype == cp.int32 and table.ndim == 2 and table.shape[0] == n and table.strides[1] == 4,
          "table must be (N, cache_rows) int32 with contiguous rows")
    if n:
        function("step.cu", "step_prep_kernel")((-(-n // 256),), (256,), (
            tokens, row_t, slot_base, table, cp.int32(table.strides[0] // 4), pos, new_rows, self_len, cp.int32(n),
            cp.int32(table.shape[1]), cp.int32(pad)))
