"""The GPU engine: the M2M-100/NLLB model on CuPy with the project's kernels (kernels_cu/), bf16 weights.

Same calls as the reference engine, so the search code runs on either. Numbers: weights and GEMM inputs in
bf16, accumulation, LayerNorm statistics, softmax and the residual stream in f32. The encoder runs once per
sentence and writes its cross K/V into the pool; each decoder step feeds one token per live sequence and
reads its slot's cache. The output projection is fused with the argmax for greedy search. The GEMMs that end
a sublayer add onto the residual stream in place. A decoder step runs as a CUDA graph replayed over arrays of
fixed addresses (Workspace), its per-row bookkeeping done on the device, so the host launches one graph a
step instead of ~250 kernels. With step_halves, a step of many rows runs as two halves of its rows on two streams,
one half's attention beside the other's GEMMs, the halves side by side or taking turns at the products
(step_launches). With kv_float8 (--kv-cache-type float8) the pool holds K and V as E4M3 codes with a float32 scale
a (row, head), quantized as they go in, and attention reads them there (kvpool, kernels.Fp8Rows).

Letters: B sources, T their tokens together, N decoder rows, D d_model, V vocabulary, L decoder layers.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator

import cupy as cp
import cupyx
import numpy as np

from ..checkpoint import ModelConfig
from ...environment import ENV
from ...errors import NllbError
from . import RowPositions, kernels
from .kvpool import CROSS_STAGING_BYTES, KVPool, PoolFull, PoolPlan, activation_bytes, plan_for_job, plan_pool
from .numerics import (ATTENTION, GEMM, HALVES, HEAD, STAGGERED, E4M3Matrix, bf16_to_float32, e4m3_values,
                       forced_passes, gumbel_noise, halves_at, inverse_temperature, sinusoidal_positions,
                       staggered_order, step_phases, topk_desc)

BF16 = cp.dtype("bfloat16")
F32 = cp.dtype(cp.float32)
# The memory the pool leaves free beside a batch's own arrays (kvpool.activation_bytes): for what the CUDA
# context, CuPy's allocator and the graphs take as the job goes on
SPARE_BYTES, SPARE_FRACTION = 1 << 30, 0.03  # 1 GiB and 3% of the GPU's memory


def to_bf16(a: np.ndarray) -> cp.ndarray:
    """A weight on the device in bf16, from float32 values or from bf16 bits (uint16: load_checkpoint's
    bf16_bits, uploaded as they are)."""
    if isinstance(a, E4M3Matrix):
        raise NllbError("an FP8 weight among bf16 ones: a model's matrices are all in FP8 or none")
    if a.dtype == np.uint16:
        return cp.asarray(a).view(BF16)
    return cp.asarray(a, dtype=cp.float32).astype(BF16)


def to_matrix(w, float8: bool = False) -> "cp.ndarray | kernels.Fp8Weight":
    """A weight matrix on the device: bf16 (to_bf16), or in FP8: an E4M3Matrix's codes and scales as they are, a
    float matrix quantized there, a row at a time (kernels.quantize_rows: numerics.quantize_e4m3's bits)."""
    if isinstance(w, E4M3Matrix):
        return kernels.Fp8Weight(cp.asarray(w.codes), cp.asarray(w.scales.reshape(-1)))
    if float8:
        values = to_bf16(w) if w.dtype == np.uint16 else cp.asarray(w, dtype=cp.float32)
        return kernels.Fp8Weight(*kernels.quantize_rows(values))
    return to_bf16(w)


def stacked(matrices: list) -> "np.ndarray | E4M3Matrix":
    """Matrices one above another (their rows, their output channels, concatenated): a scale an output channel
    stays its channel's, so quantizing the stack a row at a time quantizes each matrix as alone."""
    if any(isinstance(m, E4M3Matrix) for m in matrices):
        matrices = [m if isinstance(m, E4M3Matrix) else E4M3Matrix.quantize(m) for m in matrices]
        return E4M3Matrix(np.concatenate([m.codes for m in matrices]), np.concatenate([m.scales for m in matrices]))
    return np.concatenate(matrices)


def to_f32(a: np.ndarray) -> cp.ndarray:
    if a.dtype == np.uint16:  # bf16 bits (biases and LayerNorms: small, widened here)
        a = bf16_to_float32(a)
    return cp.asarray(a, dtype=cp.float32)


def i32(a) -> cp.ndarray:
    return cp.asarray(np.asarray(a, dtype=np.int32))


@dataclass
class CudaEncoded:
    """Each source's run of cross K/V rows in the pool."""

    start: np.ndarray  # (B,) first cross row
    length: np.ndarray  # (B,) source tokens
    released: bool = False


ROW_ARRAYS = ("tokens", "row_t", "slot_base", "table", "cross_start", "cross_len")  # a decoder row's state
GRAPHS = ENV.cuda_graphs  # the decoder step as CUDA graphs (NLLB_CUDA_GRAPHS=0: launched one by one)
STEP_HALVES = ENV.step_halves  # a step of many rows in one piece, in halves, or staggered halves (NLLB_STEP_HALVES)
GEMM_SMS = ENV.gemm_sms  # the SMs a halved step's GEMMs take, None all (NLLB_GEMM_SMS)
FUSED_TOPK = 32  # the most candidates a row kernels.logits_topk lists; step_topk writes the logits for more
FORCED_TOKENS = 32768  # tokens forced_log_probs feeds in one pass (its activations: ~1 GB at 600M)
UNFUSED_LOGITS_BYTES = 1 << 30  # the logits step_topk writes for more at a time: bounded, whatever the beams


def bucket(n: int) -> int:
    """The rows a step over n live rows runs, in a CUDA graph: n rounded up so that few graphs serve every n and
    the padding costs at most one more row of GEMM tiles (their rows: 64 or 128, kernels.gemm_tile; the output
    projection takes 64 rows a tile up to 64 rows, 128 above)."""
    if n <= 64:
        return 64
    return -(-n // 64) * 64 if n <= 256 else -(-n // 128) * 128


class Workspace:
    """The device arrays of a decoder step, reused from step to step, and the CUDA graphs captured over them.

    Arrays are made `capacity` rows long, one per (name, row shape, dtype), and handed out as views of their
    first rows (or of the rows from `start` on: a halved step's second half), so a step over b <= capacity rows
    finds its arrays where the previous step left them and allocates nothing: a graph captured over them stays
    valid for as long as the workspace lives (it holds them). Among them the rows' state (ROW_ARRAYS): each row's
    next token, its position, its slot's first cache row, its table of cache rows, its source's cross K/V rows.
    Rows past a state's live ones are padding: they read and write only the pool's scratch slot and cross row
    (KVPool)."""

    def __init__(self, capacity: int, pool: KVPool, pad: int):
        self.capacity, self.cache_rows, self.pad = capacity, pool.plan.cache_rows, pad
        self.scratch_row, self.scratch_cross = pool.scratch_slot * pool.plan.cache_rows, pool.scratch_cross
        self.arrays: dict[tuple, cp.ndarray] = {}
        self.graphs: dict[tuple, cp.cuda.graph.Graph] = {}
        self.seen: set[tuple] = set()  # graph keys run eagerly once, their first capture having failed
        self.failed: set[tuple] = set()  # graph keys whose capture the driver refused: launched one by one
        self.every = cp.arange(capacity, dtype=cp.int32)
        self.pad_rows(0, capacity)

    def take(self, name: str, shape: tuple, dtype, start: int = 0) -> cp.ndarray:
        """Rows start .. start + shape[0] - 1 of the array `name` of that row shape and dtype."""
        tail, dtype, stop = tuple(shape[1:]), cp.dtype(dtype), start + shape[0]
        if stop > self.capacity:
            raise ValueError(f"{name}: rows up to {stop} asked of a workspace of {self.capacity}")
        key = (name, tail, dtype)
        a = self.arrays.get(key)
        if a is None:  # (inside a graph capture, engine.capture's allocator refuses)
            a = self.arrays[key] = cp.empty((self.capacity,) + tail, dtype=dtype)
        return a[start:stop]

    def rows(self, name: str, n: int, start: int = 0) -> cp.ndarray:
        return self.take(name, (n, self.cache_rows) if name == "table" else (n,), cp.int32, start)

    def pad_rows(self, lo: int, hi: int) -> None:
        """Rows lo .. hi - 1 become padding."""
        if hi <= lo:
            return
        values = {"tokens": self.pad, "row_t": 0, "slot_base": self.scratch_row, "table": self.scratch_row,
                  "cross_start": self.scratch_cross, "cross_len": 1}
        for name, value in values.items():
            self.rows(name, hi)[lo:].fill(value)

    def gather(self, n: int, rows: cp.ndarray, names=ROW_ARRAYS) -> None:
        """Row i of the first len(rows) takes row rows[i]'s state (each of `names`), of the first n."""
        for name in names:
            a = self.rows(name, n)
            a[: len(rows)] = a[rows]


@dataclass
class CudaState(RowPositions):
    """Decoder rows at position t (RowPositions). Row i writes its K/V for position t into cache
    row slots[i] * cache_rows + t (its own slot, for as long as it lives) and reads positions 0..t through its
    table row: after a beam reorder, a beam's history lies in its parent's rows, and only the table row is
    copied (re-pointing, not moving, the cache). The rows' state lies in the first `n` rows of the workspace
    `ws` (the device's copy of each row's position is its row_t there; `t` is the host's): the engine's own,
    whose steps run as CUDA graphs (`graphs`), or, for a state started while another holds that one, a
    workspace of its own, its steps launched one by one."""

    slots: np.ndarray  # (N,) self-attention cache slot, where the row writes
    ws: Workspace
    graphs: bool
    cross_keys: int  # the longest source's length: picks the cross-attention kernel
    t: np.ndarray | None = None  # (N,) positions filled, per row (None: all 0)
    keys: np.ndarray | None = None  # (N,) uint32 each row's random stream, for sampling (set_keys)
    together: bool = False  # rows side by side mostly share a source (beams, samples, targets): kernels.attention(together=)

    def __post_init__(self) -> None:
        if self.t is None:
            self.t = np.zeros(len(self.slots), np.int64)

    @property
    def run_rows(self) -> int:
        """Rows a step computes: the live ones, rounded up to a bucket when it runs as a graph."""
        return bucket(self.n) if self.graphs else self.n


def no_allocation(size: int):
    raise RuntimeError("a decoder step captured in a CUDA graph allocated device memory")


# Copies to the host that may not have landed, with their pinned buffers: a buffer goes back to CuPy's pinned
# pool only once its copy is done. A copy whose fetch() nobody calls (the steps greedy search queued ahead, when
# every row has ended) would otherwise free its buffer at once, and the pool could hand it to CuPy's staging of
# an upload (cp.asarray of a NumPy array fills a pinned buffer, then copies it to the device behind the queued
# work): the late copy would land in the staged bytes before they go up, and the device would get another
# array's values (ids, rows, positions out of range: an illegal memory access, or wrong translations).
IN_FLIGHT: deque = deque()
IN_FLIGHT_LOCK = threading.Lock()


def copy_to_host_later(a: cp.ndarray):
    """Start copying a contiguous device array to pinned host memory; the returned fetch() waits for that copy
    alone (not for the work queued after it) and gives the NumPy array. The pinned buffer outlives the copy
    (IN_FLIGHT), whether or not fetch() is called."""
    host = cupyx.empty_pinned(a.shape, a.dtype)
    cp.cuda.runtime.memcpyAsync(host.ctypes.data, a.data.ptr, a.nbytes, cp.cuda.runtime.memcpyDeviceToHost,
                                cp.cuda.get_current_stream().ptr)
    copied = cp.cuda.Event(disable_timing=True)
    copied.record()
    with IN_FLIGHT_LOCK:
        while IN_FLIGHT and IN_FLIGHT[0][0].done:  # copies land in the order they were queued
            IN_FLIGHT.popleft()
        IN_FLIGHT.append((copied, host))

    def fetch() -> np.ndarray:
        copied.synchronize()
        return host

    return fetch


class Later:
    """A device array on its way to the host (engine.fetch_later)."""

    def __init__(self, a: cp.ndarray):
        self.fetch = copy_to_host_later(cp.ascontiguousarray(a))


class PendingIds:
    """A greedy step's ids (N,) int32 on the device, on their way to the host: `device` can feed the next
    step at once, fetch() waits for the copy alone (not for steps queued after it). `device` is the state's
    own token array, where the step wrote them: the next step reads them there. `log_probs`: the ids'
    log-probabilities (N,) f32 on the device, copied with them, where the step made them."""

    def __init__(self, device: cp.ndarray, fetch=None, log_probs: cp.ndarray | None = None, fetch_log_probs=None):
        self.device = device
        if fetch is None:
            copied = copy_to_host_later(device)
            fetch = lambda: copied().astype(np.int64)  # noqa: E731
            if log_probs is not None:
                fetch_log_probs = copy_to_host_later(log_probs)
        self.fetch = fetch
        self.fetch_log_probs = fetch_log_probs

    def log_probs(self) -> np.ndarray:
        return self.fetch_log_probs()

    def subset(self, rows: np.ndarray) -> "PendingIds":
        """Rows `rows` of these ids (host indices): the next step's input after engine.select(state, rows),
        which has already moved them to the front of the state's token array with the rest of the rows' state."""
        log_probs = self.fetch_log_probs and (lambda: self.fetch_log_probs()[rows])
        return PendingIds(self.device[: len(rows)], lambda: self.fetch()[rows], fetch_log_probs=log_probs)


class CudaEngine:
    xp = cp  # the search keeps its beam arrays where the engine's results are

    def __init__(self, config: ModelConfig, weights: dict[str, np.ndarray], device: int = 0, pool_bytes: int | None = None,
                 float8: bool = False, kv_float8: bool = False):
        if config.activation_function != "relu":
            raise NllbError(f"the GPU engine runs ReLU models (M2M-100, NLLB), not {config.activation_function}: use --device cpu")
        if kv_float8 and (config.d_model // config.decoder_attention_heads) % 2:
            raise NllbError("--kv-cache-type float8 needs an even head size (codes go in pairs), and this model's is "
                            f"{config.d_model // config.decoder_attention_heads}: use bfloat16")
        self.config = config
        # --kv-cache-type float8: the pool's K and V as E4M3 codes with a scale a (row, head) (kvpool.KVPool)
        self.kv_float8 = kv_float8
        self.fp8_heads = config.decoder_attention_heads if kv_float8 else 0
        self.device = cp.cuda.Device(device)
        self.device.use()
        self.pool_bytes = pool_bytes
        self.pool: KVPool | None = None
        self.pool_for_any = False  # the pool was made for a batch of unknown size (capacity)
        self.ws: Workspace | None = None  # the decoder steps' arrays and graphs, for the pool in use
        self.bound: CudaState | None = None  # the state whose steps use self.ws
        self.capture_stream = cp.cuda.Stream(non_blocking=True)
        self.use_graphs = GRAPHS
        self.step_halves, self.gemm_sms = STEP_HALVES, GEMM_SMS  # numerics.WHOLE, HALVES or STAGGERED
        # a halved step's second stream, the events that fork it from the step's stream and join it back, and
        # the end of each turn at the products of a staggered step (take_turns): made once, as nothing may be
        # made while a step is captured
        self.side_stream = cp.cuda.Stream(non_blocking=True)
        self.forked, self.joined = cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True)
        self.phases = step_phases(config.decoder_layers)  # a step's, the same for each half
        self.staggered = staggered_order(self.phases)  # both halves' phases in the order take_turns issues them
        self.turn_ended = [cp.cuda.Event(disable_timing=True) for issue in self.staggered if issue.turn is not None]
        self.capture_error: str | None = None  # why a step's graph capture failed, if one did
        c, w, d = config, weights, config.d_model
        # --compute-type float8 (float8, or matrices given as E4M3Matrix): every matrix held as FP8 codes and scales
        # (kernels.Fp8Weight), each product's input quantized a row at a time as it runs (CudaEngine.linear)
        self.float8 = float8 = float8 or isinstance(w["lm_head.weight"], E4M3Matrix)
        if float8 and not kernels.wgmma_available():
            raise NllbError(kernels.FP8_NEEDS_HOPPER)
        to_device = functools.partial(to_matrix, float8=float8)
        self.embed_table = to_device(w["encoder.embed_tokens.weight"])
        plain = lambda a: not isinstance(w[a], E4M3Matrix)  # noqa: E731
        same = lambda a, b: w[a] is w[b] or (plain(a) and plain(b) and np.array_equal(w[a], w[b]))  # noqa: E731
        self.decoder_table = self.embed_table if same("decoder.embed_tokens.weight", "encoder.embed_tokens.weight") else to_device(w["decoder.embed_tokens.weight"])
        self.lm_head = self.decoder_table if same("lm_head.weight", "decoder.embed_tokens.weight") else to_device(w["lm_head.weight"])
        self.positions = to_f32(sinusoidal_positions(c.max_position_embeddings + 2, d, c.pad_token_id))

        def attention(prefix: str) -> dict:
            qkv_w = stacked([w[prefix + f"{p}_proj.weight"] for p in "qkv"])  # (3D, D): one GEMM for q, k, v
            qkv_b = np.concatenate([w[prefix + f"{p}_proj.bias"] for p in "qkv"])
            return {"self_qkv_w": to_device(qkv_w), "self_qkv_b": to_f32(qkv_b),
                    "self_out_w": to_device(w[prefix + "out_proj.weight"]), "self_out_b": to_f32(w[prefix + "out_proj.bias"])}

        def common(p: str) -> dict:
            return {
                "self_attn_norm_w": to_f32(w[p + "self_attn_layer_norm.weight"]),
                "self_attn_norm_b": to_f32(w[p + "self_attn_layer_norm.bias"]),
                "ffn_norm_w": to_f32(w[p + "final_layer_norm.weight"]), "ffn_norm_b": to_f32(w[p + "final_layer_norm.bias"]),
                "fc1_w": to_device(w[p + "fc1.weight"]), "fc1_b": to_f32(w[p + "fc1.bias"]),
                "fc2_w": to_device(w[p + "fc2.weight"]), "fc2_b": to_f32(w[p + "fc2.bias"]),
                **attention(p + "self_attn."),
            }

        self.encoder = [common(f"encoder.layers.{i}.") for i in range(c.encoder_layers)]
        self.decoder = []
        cross_w, cross_b = [], []
        for i in range(c.decoder_layers):
            p = f"decoder.layers.{i}."
            layer = common(p)
            layer.update({
                "cross_attn_norm_w": to_f32(w[p + "encoder_attn_layer_norm.weight"]),
                "cross_attn_norm_b": to_f32(w[p + "encoder_attn_layer_norm.bias"]),
                "cross_q_w": to_device(w[p + "encoder_attn.q_proj.weight"]), "cross_q_b": to_f32(w[p + "encoder_attn.q_proj.bias"]),
                "cross_out_w": to_device(w[p + "encoder_attn.out_proj.weight"]),
                "cross_out_b": to_f32(w[p + "encoder_attn.out_proj.bias"]),
            })
            self.decoder.append(layer)
            cross_w += [w[p + "encoder_attn.k_proj.weight"], w[p + "encoder_attn.v_proj.weight"]]
            cross_b += [w[p + "encoder_attn.k_proj.bias"], w[p + "encoder_attn.v_proj.bias"]]
        # every layer's cross K and V in one GEMM at prefill: (2 L D, D), row layout as the pool's cross rows
        self.cross_w, self.cross_b = to_device(stacked(cross_w)), to_f32(np.concatenate(cross_b))
        self.enc_ln = (to_f32(w["encoder.layer_norm.weight"]), to_f32(w["encoder.layer_norm.bias"]))
        self.dec_ln = (to_f32(w["decoder.layer_norm.weight"]), to_f32(w["decoder.layer_norm.bias"]))
        # every weight on the device and settled before any GEMM: the GEMMs load their first stages of weights
        # before waiting for the kernel before them (kernels.gemm's `weights`)
        self.device.synchronize()

    # -- the pool

    def capacity(self, max_length: int, beams: int = 1, sentences: int | None = None,
                 source_tokens: int | None = None) -> tuple[int, int]:
        """(decoder rows, source tokens) the pool holds at once, for a batch of `sentences` sentences of `beams`
        rows each reaching at most max_length tokens, with `source_tokens` source tokens in all.

        The pool there is serves where it covers the batch; else it is remade (kvpool.plan_for_job) as large as
        the batch and the pool before it need together, where the memory free beside the batch's own arrays
        allows, else as much as fits (the batch then goes in parts). `pool_bytes` given to the engine bounds it
        instead of the free memory. A batch of unknown size (sentences None) gets all that memory, split for
        `beams` (kvpool.plan_pool)."""
        c = self.config
        cache_rows, longest = max_length + 1, c.max_position_embeddings + 2
        need = None if sentences is None else PoolPlan(max(1, sentences) * beams, cache_rows, max(1, source_tokens or 0))
        current = None if self.pool is None else self.pool.plan
        if current is not None and (current.covers(need) if need is not None else
                                    self.pool_for_any and current.cache_rows >= cache_rows):
            return current.slots, current.cross_rows
        self.drop_pool()
        free, total = self.device.mem_info
        room = free - SPARE_BYTES - int(total * SPARE_FRACTION)
        heads = self.fp8_heads  # a row's bytes: bf16, or FP8 codes and scales (kvpool.row_bytes)
        if need is None:
            budget = self.pool_bytes or max(0, room) // 2
            plan = plan_pool(c.decoder_layers, c.d_model, cache_rows, budget, longest, beams, fp8_heads=heads)
        else:
            beside = activation_bytes(c, need.slots, need.cross_rows, cache_rows, self.kv_float8)
            budget = self.pool_bytes or max(0, room - beside)
            plan = plan_for_job(c.decoder_layers, c.d_model, need, budget, current, beams, longest, fp8_heads=heads)
        self.pool, self.pool_for_any = KVPool(c.decoder_layers, c.d_model, plan, heads), need is None
        needed_rows = max(c.max_position_embeddings, max_length) + 3
        if self.positions.shape[0] < needed_rows:
            self.positions = to_f32(sinusoidal_positions(needed_rows, c.d_model, c.pad_token_id))
        return plan.slots, plan.cross_rows

    def linear(self, x, w, bias: cp.ndarray | None = None, take=kernels.new_array, **options) -> cp.ndarray:
        """kernels.gemm's product with a weight on the device (to_matrix): bf16, or FP8 with x's rows quantized
        first into `take`'s arrays (a decoder step's workspace: nothing allocated inside a graph), unless x comes
        quantized already, as (codes, scales) from normed."""
        if not isinstance(w, kernels.Fp8Weight):
            return kernels.gemm(x, w, bias, **options)
        if isinstance(x, tuple):
            codes, scales = x
        else:
            m, k = x.shape
            codes, scales = kernels.quantize_rows(x, take("fp8 codes", (m, k), cp.uint8), take("fp8 scales", (m,), F32))
        return kernels.gemm_fp8(codes, scales, w.codes, w.scales, bias, **options)

    def normed(self, h: cp.ndarray, weight: cp.ndarray, bias: cp.ndarray, take=kernels.new_array):
        """LayerNorm of the residual stream as the next product takes it: bf16 (M, D) into take's "x", or in FP8
        its rows quantized in the same kernel, (codes, scales) (kernels.layernorm_e4m3)."""
        m, d = h.shape
        if self.float8:
            return kernels.layernorm_e4m3(h, weight, bias, codes=take("fp8 codes", (m, d), cp.uint8),
                                          scales=take("fp8 scales", (m,), F32))
        return kernels.layernorm(h, weight, bias, out=take("x", (m, d), BF16))

    def drop_pool(self) -> None:
        """Give the pool's memory back to the GPU (the next batch makes one again)."""
        self.pool = self.ws = None  # the graphs hold the pool's addresses: they go with it
        cp.get_default_memory_pool().free_all_blocks()

    # -- encoder

    def encode(self, sources: list[list[int]]) -> CudaEncoded:
        """The encoder over the batch; each source's cross K/V (every decoder layer) into its run of pool rows."""
        c = self.config
        pool = self.pool
        if pool is None:
            raise RuntimeError("call capacity() before encode()")
        # Packed: the sources one after another, no padding rows (every GEMM row is a real token).
        # (no NumPy call per source: at 4,096 sources those took 20-30 ms of host time before the GPU started)
        lengths = np.fromiter(map(len, sources), dtype=np.int64, count=len(sources))
        total = int(lengths.sum())
        ids = np.fromiter(itertools.chain.from_iterable(sources), dtype=np.int32, count=total)
        if (ids == c.pad_token_id).any():
            raise ValueError("a source holds the padding id: sources are token ids without padding")
        offsets = np.cumsum(lengths) - lengths
        pos = np.arange(total) - np.repeat(offsets, lengths) + c.pad_token_id + 1  # past the padding index
        h = kernels.embed(i32(ids), i32(pos), self.embed_table, self.positions, c.embed_scale)  # (T, D)
        seq_start, seq_len = i32(offsets), i32(lengths)
        longest = int(lengths.max())
        d = c.d_model
        for layer in self.encoder:
            x = self.normed(h, layer["self_attn_norm_w"], layer["self_attn_norm_b"])
            qkv = self.linear(x, layer["self_qkv_w"], layer["self_qkv_b"], weights=True)  # (T, 3D)
            a = kernels.attention_prefill(qkv[:, :d], qkv[:, d : 2 * d], qkv[:, 2 * d :], seq_start, seq_len, 0, longest,
                                          c.encoder_attention_heads)
            h = self.linear(a, layer["self_out_w"], layer["self_out_b"], residual=h, out=h, weights=True)
            x = self.normed(h, layer["ffn_norm_w"], layer["ffn_norm_b"])
            f = self.linear(x, layer["fc1_w"], layer["fc1_b"], relu=True, weights=True)
            h = self.linear(f, layer["fc2_w"], layer["fc2_b"], residual=h, out=h, weights=True)
        x = self.normed(h, *self.enc_ln)
        if pool.float8:
            return self.cross_e4m3(x, lengths, offsets)
        try:  # one run for the whole batch: the GEMM writes every layer's cross K/V straight into the pool
            first = pool.cross_runs.claim(len(ids))
        except PoolFull:  # the free rows are fragmented: a run per source, through a copy
            first = None
        if first is not None:
            self.linear(x, self.cross_w, self.cross_b, out=pool.cross[first : first + len(ids)], weights=True)  # (T, 2 L D)
            return CudaEncoded(first + offsets, lengths)
        kv = self.linear(x, self.cross_w, self.cross_b, weights=True)
        starts = self.claim_runs(lengths)
        src_rows = np.arange(len(ids))
        dst_rows = np.concatenate([np.arange(n) + st for st, n in zip(starts, lengths)])
        kernels.copy_rows(kv, i32(src_rows), pool.cross, i32(dst_rows))
        return CudaEncoded(starts, lengths)

    def claim_runs(self, lengths: np.ndarray) -> np.ndarray:
        """A run of cross rows for each source (B,) first rows, or PoolFull with none claimed."""
        starts = []
        try:
            for n in lengths:
                starts.append(self.pool.cross_runs.claim(int(n)))
        except PoolFull:
            self.pool.cross_runs.release(starts, lengths)  # the runs claimed so far (zip stops with them)
            raise
        return np.array(starts)

    def cross_e4m3(self, x, lengths: np.ndarray, offsets: np.ndarray) -> CudaEncoded:
        """Every layer's cross K/V of the batch's T tokens (x: the encoder's output as the product takes it) into an
        FP8 pool's rows: a run for the batch, else one a source. The product goes into a bf16 staging array a part
        of the tokens at a time (CROSS_STAGING_BYTES at most, kvpool.activation_bytes counts it), each part
        quantized a head at a time into its rows (kernels.copy_rows into Fp8Rows)."""
        pool, total = self.pool, int(lengths.sum())
        try:
            first = pool.cross_runs.claim(total)
            starts, dst_rows = first + offsets, np.arange(total) + first
        except PoolFull:  # the free rows are fragmented
            starts = self.claim_runs(lengths)
            dst_rows = np.concatenate([np.arange(n) + st for st, n in zip(starts, lengths)])
        width = self.cross_w.shape[0]  # 2 L D
        # whole tiles of 64 rows a part (each part's rows and FP8 scales then start aligned, as the product needs)
        part = min(total, max(64, CROSS_STAGING_BYTES // (2 * width) // 64 * 64))
        staging, src_rows = cp.empty((part, width), BF16), i32(np.arange(part))
        for lo in range(0, total, part):
            hi = min(total, lo + part)
            rows = tuple(a[lo:hi] for a in x) if isinstance(x, tuple) else x[lo:hi]  # FP8 codes and scales, or bf16
            kv = self.linear(rows, self.cross_w, self.cross_b, out=staging[: hi - lo], weights=True)  # (part, 2 L D)
            kernels.copy_rows(kv, src_rows[: hi - lo], pool.cross, i32(dst_rows[lo:hi]))
        return CudaEncoded(np.asarray(starts), lengths)

    # -- decoder

    def start(self, encoded: CudaEncoded, source_rows: np.ndarray, max_positions: int) -> CudaState:
        pool, c = self.pool, self.config
        if max_positions > pool.plan.cache_rows:
            raise PoolFull(f"{max_positions} decoder positions needed, the pool's slots hold {pool.plan.cache_rows}")
        source_rows = np.asarray(source_rows)
        n = len(source_rows)
        graphs = self.use_graphs and self.bound is None
        rows = bucket(n) if graphs else max(n, 1)
        # the workspace first: running out of memory there (the caller retries with fewer rows) claims no slot
        if graphs and (self.ws is None or self.ws.capacity < rows):
            self.ws = None  # its arrays and graphs go back before the larger ones are made
            self.ws = Workspace(rows, pool, c.pad_token_id)
        ws = self.ws if graphs else Workspace(rows, pool, c.pad_token_id)
        ws.pad_rows(0, ws.capacity)
        ws.rows("cross_start", n)[:] = i32(encoded.start[source_rows])
        ws.rows("cross_len", n)[:] = i32(encoded.length[source_rows])
        slots = np.array(pool.slots.claim(n))
        try:
            ws.rows("slot_base", n)[:] = i32(slots * pool.plan.cache_rows)
        except BaseException:
            pool.slots.release(slots)
            raise
        # a sentence's beams, samples or copies for several targets lie side by side and read one source's cross
        # K/V: the cross-attention then takes rows 4 at a time a block, one head, so they share it (kernels.attention)
        together = n > 1 and 2 * np.count_nonzero(source_rows[1:] == source_rows[:-1]) >= n
        state = CudaState(slots, ws, graphs, int(encoded.length[source_rows].max(initial=1)), together=bool(together))
        if graphs:
            self.bound = state
        return state

    def run_step(self, state: CudaState, tokens, head: str, k: int = 0, sample: tuple = ()) -> None:
        """One decoder step of every row of `state`, feeding `tokens` (on the host or the device; the state's
        own token array, as a PendingIds leaves it, is read where it lies), with head "none" (the final hidden
        states, in the workspace's "final"), "argmax" (the ids into the token array), "argmax log-prob" (the same,
        and their log-probs into "chosen logprob"), "topk" (k per row,
        into "topk logprob" and "topk ids") or "sample" (a token drawn per row into the token array, its value
        into "sample value"; `sample`: the temperature, the token left out or None, whether "lse" is wanted). With
        step_halves, a step over at least numerics.HALVES_MIN_ROWS rows runs in two halves, side by side or staggered
        (step_launches). A state of the engine's own workspace runs the step as a CUDA graph, one per (head, k, rows,
        cross kernel, halves, their mode and SMs), captured the first time that key comes (as rows end, a batch meets
        many row counts); where that capture needs a kernel compiled or an array made, which a capture may not, the
        step's launches run one by one first, and the capture is made the next time. A key whose capture the driver
        refuses twice runs one by one from
        then on (capture_error says why): slower, the same results."""
        if state.length >= self.pool.plan.cache_rows:
            raise PoolFull(f"step {state.length + 1} asked of slots of {self.pool.plan.cache_rows} positions")
        ws, n, b = state.ws, state.n, state.run_rows
        feed = ws.rows("tokens", n)
        if not (isinstance(tokens, cp.ndarray) and tokens.data.ptr == feed.data.ptr and len(tokens) == n):
            feed[:] = cp.asarray(tokens)
        cross_fast = state.cross_keys <= kernels.DECODE_MAX_KEYS
        split = halves_at(b) if self.step_halves else 0
        mode = int(self.step_halves) if split else 0

        def launches():
            self.step_launches(ws, b, cross_fast, head, k, sample, state.together, split, mode)

        key = (head, k, b, cross_fast, sample, state.together, split, mode, self.gemm_sms if split else None)
        graph = ws.graphs.get(key) if state.graphs else None
        if graph is None and state.graphs and key not in ws.failed:
            try:
                graph = ws.graphs[key] = self.capture(launches)
            except cp.cuda.runtime.CUDARuntimeError as error:
                if key in ws.seen:  # a GPU or driver that cannot capture this step: the same launches one by one
                    ws.failed.add(key)  # from now on (slower, the same results)
                    self.capture_error = f"CUDA graph capture failed ({error}): decoder steps launch kernel by kernel"
            except Exception:  # a first use that compiles a kernel or makes an array: once launched, captured
                if key in ws.seen:
                    raise
        if graph is not None:
            graph.launch(cp.cuda.get_current_stream())
        else:
            ws.seen.add(key)
            launches()
        state.t = state.t + 1

    def capture(self, launches) -> cp.cuda.graph.Graph:
        """`launches` recorded into a CUDA graph (not run). Any allocation meanwhile is an error: an array
        made during the capture would go back to CuPy's pool after it, while the graph goes on using it."""
        stream = self.capture_stream
        with cp.cuda.using_allocator(no_allocation), stream:
            stream.begin_capture()
            try:
                launches()
            except BaseException:
                try:
                    stream.end_capture()
                except cp.cuda.runtime.CUDARuntimeError:
                    pass
                raise
            return stream.end_capture()

    def step_launches(self, ws: Workspace, b: int, cross_fast: bool, head: str, k: int, sample: tuple = (),
                      together: bool = False, split: int = 0, mode: int = HALVES) -> None:
        """The kernels of one decoder step over the workspace's first b rows (see run_step). split > 0: the rows
        from `split` on go through the layers and the output projection as a second half, on side_stream, beside
        the first half on the step's stream, so that one half's attention (bound by memory) runs beside the
        other's GEMMs (bound by the tensor cores). mode HALVES: each half launched whole, the two side by side,
        the GEMMs of both on at most gemm_sms SMs (kernels.gemm_sms); STAGGERED: the halves take turns at the
        products, the second a phase behind the first (take_turns). Each half works in its own rows of the step's
        arrays (row_phases): the two share no array they write, and each row's results are the same bits as in a
        step in one piece."""
        c, d, rows = self.config, self.config.d_model, ws.rows
        tokens, pos = rows("tokens", b), rows("pos", b)
        kernels.step_prep(tokens, rows("row_t", b), rows("slot_base", b), rows("table", b), pos, rows("new_rows", b),
                          rows("self_len", b), c.pad_token_id)
        kernels.embed(tokens, pos, self.decoder_table, self.positions, c.embed_scale, out=ws.take("h", (b, d), F32))
        if not split:
            self.step_rows(ws, 0, b, cross_fast, head, k, sample, together)
            return
        # the second stream waits for the step's (a graph capture follows it there) and the step's waits for it
        # before the step ends, a launch failing or not: a capture must end with its streams joined
        stream = cp.cuda.get_current_stream()
        self.forked.record(stream)
        self.side_stream.wait_event(self.forked)
        try:
            if mode == STAGGERED:
                self.take_turns(self.row_phases(ws, 0, split, cross_fast, head, k, sample, together),
                                self.row_phases(ws, split, b, cross_fast, head, k, sample, together), stream)
            else:
                with kernels.gemm_sms(self.gemm_sms):
                    self.step_rows(ws, 0, split, cross_fast, head, k, sample, together)
                    with self.side_stream:
                        self.step_rows(ws, split, b, cross_fast, head, k, sample, together)
        finally:
            self.joined.record(self.side_stream)
            stream.wait_event(self.joined)

    def take_turns(self, first: Iterator[str], second: Iterator[str], stream: cp.cuda.Stream) -> None:
        """Two halves of a step (row_phases), the first on `stream`, the second on side_stream, launched a phase at
        a time in numerics.staggered_order: a products phase first waits for the other half's products phase
        before it in turn to end, then records its own end (turn_ended), so that no two halves' products run at
        once and one half's attention runs beside the other's products. A "gemm" phase that an attention of the
        other half may run beside takes at most gemm_sms SMs for its GEMMs, leaving the others to that attention;
        the rest (the first turn, the second half's last before the output projections, the output projections
        themselves) take every SM. In a graph capture each record and wait becomes an edge of the graph; launched one
        by one, a wait holds for the record issued last before it: either way the same events serve every step."""
        halves, streams = (first, second), (stream, self.side_stream)
        on = (contextlib.nullcontext, lambda: self.side_stream)  # each half's stream as the current one
        phases, kinds = self.phases, []
        for half in (0, 1):  # each half's first phase (nothing launched yet: the half's arrays taken)
            with on[half]():
                kinds.append(next(halves[half]))
        for half, phase, turn, beside in self.staggered:
            if kinds[half] != phases[phase]:
                raise RuntimeError(f"a step's half went to a {kinds[half]} phase where numerics.step_phases has "
                                   f"a {phases[phase]} phase (its phase {phase})")
            with on[half](), kernels.gemm_sms(self.gemm_sms if beside else None):
                if turn:
                    streams[half].wait_event(self.turn_ended[turn - 1])
                kinds[half] = next(halves[half], None)
                if turn is not None:
                    self.turn_ended[turn].record(streams[half])
        if kinds != [None, None]:
            raise RuntimeError(f"a step's halves have phases past numerics.step_phases' {len(phases)}")

    def step_rows(self, ws: Workspace, lo: int, hi: int, cross_fast: bool, head: str, k: int, sample: tuple,
                  together: bool) -> None:
        """row_phases' launches, one after another."""
        for _ in self.row_phases(ws, lo, hi, cross_fast, head, k, sample, together):
            pass

    def row_phases(self, ws: Workspace, lo: int, hi: int, cross_fast: bool, head: str, k: int, sample: tuple,
                   together: bool) -> Iterator[str]:
        """A decoder step's layers and output projection over its rows lo .. hi - 1, their embeddings in the
        workspace's "h" (step_launches): every array, the scratch of the launchers included (`take`), is rows
        lo .. hi - 1 of the step's own, so each row's results land where the search reads them. A generator of
        the step's phases (numerics.step_phases), yielding each one's kind before its launches: the layers'
        (decoder_phases), then the final LayerNorm and output projection, "head"."""
        c, pool, d, m = self.config, self.pool, self.config.d_model, hi - lo
        take = functools.partial(ws.take, start=lo)
        tokens, table, new_rows = ws.rows("tokens", m, lo), ws.rows("table", m, lo), ws.rows("new_rows", m, lo)
        self_len, cross_start, cross_len = (ws.rows(name, m, lo) for name in ("self_len", "cross_start", "cross_len"))
        h, a = take("h", (m, d), F32), take("a", (m, d), BF16)
        qkv, q = take("qkv", (m, 3 * d), BF16), take("q", (m, d), BF16)
        f = take("f", (m, c.decoder_ffn_dim), BF16)
        every = ws.every[:m]  # each row's own in qkv, for the copies into the pool
        self_keys = pool.plan.cache_rows  # picks the kernel; each row's own count is in self_len
        cross_keys = kernels.DECODE_MAX_KEYS if cross_fast else kernels.DECODE_MAX_KEYS + 1

        def attend_self(i: int, qkv: cp.ndarray) -> cp.ndarray:  # the step's K/V into the pool, the query over them
            kernels.copy_rows(qkv[:, d : 2 * d], every, pool.self_k[i], new_rows)
            kernels.copy_rows(qkv[:, 2 * d :], every, pool.self_v[i], new_rows)
            return kernels.attention(qkv[:, :d], pool.self_k[i], pool.self_v[i], None, self_len,
                                     c.decoder_attention_heads, out=a, table=table, max_keys=self_keys)

        def attend_source(i: int, q: cp.ndarray) -> cp.ndarray:
            return kernels.attention(q, pool.cross_k(i), pool.cross_v(i), cross_start, cross_len,
                                     c.decoder_attention_heads, out=a, max_keys=cross_keys, together=together)

        yield from self.decoder_phases(h, attend_self, attend_source, take, qkv=qkv, q=q, f=f)
        yield HEAD
        final = kernels.layernorm(h, *self.dec_ln, out=take("final", (m, d), BF16))
        if head == "argmax":  # the ids into the token array, where the next step reads them
            kernels.logits_argmax(final, self.lm_head, ids=tokens, take=take)
        elif head == "argmax log-prob":  # the same ids, and their log-probs from the same pass
            kernels.logits_argmax(final, self.lm_head, ids=tokens, logprob=take("chosen logprob", (m,), F32), take=take)
        elif head == "sample":  # a draw per row, by the Gumbel-max trick, with the rows' stream keys at this step
            temperature, banned, lse = sample
            noise = take("noise", (m,), cp.uint32)
            kernels.sample_keys(take("sample key", (m,), cp.uint32), self_len, noise)
            kernels.logits_argmax(final, self.lm_head, ids=tokens, values=take("sample value", (m,), F32), take=take,
                                  noise=noise, temperature=temperature, banned=banned)
            if lse:
                kernels.logits_lse(final, self.lm_head, take=take)
        elif head == "topk":  # into the workspace's "topk logprob" and "topk ids" (step_topk reads them there)
            kernels.logits_topk(final, self.lm_head, k, take=take)
        elif head == "lse":  # each row's log-sum-exp into "lse" (step_log_probs reads it there)
            kernels.logits_lse(final, self.lm_head, take=take)

    def decoder_layers(self, h: cp.ndarray, attend_self: Callable[[int, cp.ndarray], cp.ndarray],
                       attend_source: Callable[[int, cp.ndarray], cp.ndarray], take=kernels.new_array,
                       qkv: cp.ndarray | None = None, q: cp.ndarray | None = None, f: cp.ndarray | None = None) -> None:
        """decoder_phases' launches, one after another."""
        for _ in self.decoder_phases(h, attend_self, attend_source, take, qkv, q, f):
            pass

    def decoder_phases(self, h: cp.ndarray, attend_self: Callable[[int, cp.ndarray], cp.ndarray],
                       attend_source: Callable[[int, cp.ndarray], cp.ndarray], take=kernels.new_array,
                       qkv: cp.ndarray | None = None, q: cp.ndarray | None = None,
                       f: cp.ndarray | None = None) -> Iterator[str]:
        """The decoder's layers over the residual stream h (M, D) float32, in place: a decoder step's (one
        position a row, its K/V into the pool) and forced decoding's (every position of a row at once) alike.
        attend_self(layer, qkv (M, 3D)) and attend_source(layer, q (M, D)) give each layer's attention outputs
        (M, D) bf16; qkv, q and f are the products' outputs where given (a step's workspace), else new arrays.
        A generator of phases: before each run of launches of one kind it yields the kind, in numerics.step_phases'
        order (less the final "head"), so that a staggered step can launch two halves' phases in turns
        (take_turns); decoder_layers launches them all at once."""
        yield GEMM
        for i, layer in enumerate(self.decoder):
            x = self.normed(h, layer["self_attn_norm_w"], layer["self_attn_norm_b"], take)
            projected = self.linear(x, layer["self_qkv_w"], layer["self_qkv_b"], out=qkv, weights=True, take=take)
            yield ATTENTION
            a = attend_self(i, projected)
            yield GEMM
            self.linear(a, layer["self_out_w"], layer["self_out_b"], residual=h, out=h, weights=True, take=take)
            x = self.normed(h, layer["cross_attn_norm_w"], layer["cross_attn_norm_b"], take)
            query = self.linear(x, layer["cross_q_w"], layer["cross_q_b"], out=q, weights=True, take=take)
            yield ATTENTION
            a = attend_source(i, query)
            yield GEMM
            self.linear(a, layer["cross_out_w"], layer["cross_out_b"], residual=h, out=h, weights=True, take=take)
            x = self.normed(h, layer["ffn_norm_w"], layer["ffn_norm_b"], take)
            inner = self.linear(x, layer["fc1_w"], layer["fc1_b"], relu=True, out=f, weights=True, take=take)
            self.linear(inner, layer["fc2_w"], layer["fc2_b"], residual=h, out=h, weights=True, take=take)

    def decode(self, encoded: CudaEncoded, state: CudaState, tokens) -> cp.ndarray:
        """Feed one token per row, each at its own position; return the final hidden states (N, D) bf16, a view
        of the workspace that the next step overwrites. `tokens` may be on the host or the device. (`encoded`
        is not read: each row's cross K/V rows are in the workspace.)"""
        self.run_step(state, tokens, "none")
        return state.ws.take("final", (state.n, self.config.d_model), BF16)

    def step(self, encoded: CudaEncoded, state: CudaState, tokens: np.ndarray, want_logits: bool = True):
        """Next-token logits (N, V) f32 on the host (for tests; the search uses the fused calls below)."""
        x = self.decode(encoded, state, tokens)
        if not want_logits:
            return None
        return cp.asnumpy(self.linear(x, self.lm_head, out_dtype=kernels.F32))

    def step_argmax(self, encoded: CudaEncoded, state: CudaState, tokens) -> np.ndarray:
        return self.step_argmax_ahead(encoded, state, tokens).fetch()

    def step_argmax_ahead(self, encoded: CudaEncoded, state: CudaState, tokens, log_probs: bool = False) -> PendingIds:
        """step_argmax without waiting: the ids stay on the device for the next step (`tokens` may be a
        PendingIds' device array) while they are copied to the host, so the search can queue step t + 1
        before it looks at step t's ids and the GPU never waits for the host. With log_probs, the ids'
        log-probabilities are copied with them."""
        if not log_probs:
            self.run_step(state, tokens, "argmax")
            return PendingIds(state.ws.rows("tokens", state.n))
        self.run_step(state, tokens, "argmax log-prob")
        n = state.n
        return PendingIds(state.ws.rows("tokens", n), log_probs=state.ws.take("chosen logprob", (n,), F32))

    def step_topk(self, encoded: CudaEncoded, state: CudaState, tokens, k: int) -> tuple[cp.ndarray, cp.ndarray]:
        """Each row's k best next tokens by log-probability, best first (ties: lower id), on the device: the
        output projection, log-softmax and top-k in one pass over the embedding, without writing the logits
        (kernels.logits_topk, whose lists hold FUSED_TOPK); more than that (beam search's 2 x beams above 16
        beams, sampling's top-k above 32) from the logits written whole. Copies, which the next step does not
        overwrite."""
        if k > FUSED_TOPK:
            return self.unfused_topk(state, tokens, k)
        self.run_step(state, tokens, "topk", k)
        n, take = state.n, state.ws.take
        return take("topk logprob", (n, k), F32).copy(), take("topk ids", (n, k), cp.int32).astype(cp.int64)

    def unfused_topk(self, state: CudaState, tokens, k: int) -> tuple[cp.ndarray, cp.ndarray]:
        """step_topk's k best from the logits written whole, float32, UNFUSED_LOGITS_BYTES of rows at a time: each
        row's log-sum-exp kept where last_log_probs reads the fused pass's, its k best log-probabilities by
        kernels.rows_topk (past ROWS_TOPK_MAX, by numerics.topk_desc)."""
        x = self.decode(None, state, tokens)
        n, vocab = state.n, self.lm_head.shape[0]
        lse = state.ws.take("topk lse", (n,), F32)
        values, ids = cp.empty((n, k), F32), cp.empty((n, k), cp.int32)
        rows = max(1, min(n, UNFUSED_LOGITS_BYTES // (4 * vocab)))
        logits = cp.empty((rows, vocab), F32)
        for start in range(0, n, rows):
            part = slice(start, min(n, start + rows))
            chunk = logits[: part.stop - start]
            self.linear(x[part], self.lm_head, out_dtype=kernels.F32, out=chunk)
            if k <= kernels.ROWS_TOPK_MAX:
                kernels.rows_topk(chunk, k, lse[part], values[part], ids[part])
                continue
            top = chunk.max(axis=1, keepdims=True)
            lse[part] = top[:, 0] + cp.log(cp.exp(chunk - top).sum(axis=1))
            values[part], ids[part] = topk_desc(chunk - lse[part, None], k)
        return values, ids.astype(cp.int64)

    def last_log_probs(self, state: CudaState, ids) -> cp.ndarray:
        """Each row's log-probability of ids[row] (N,) at the state's last step_topk, on the device (token_log_probs
        with the log-sum-exp the top-k's first pass left)."""
        return self.token_log_probs(state, ids, state.ws.take("topk lse", (state.n,), F32))

    def step_log_probs(self, encoded: CudaEncoded, state: CudaState, tokens, ids) -> cp.ndarray:
        """Feed one token per row; each row's log-probability of ids[row] as its next token (N,), on the device:
        forced decoding's step, one pass over the embedding for the log-sum-exp (kernels.logits_lse, the logits
        never written), then the given tokens' logits (token_log_probs)."""
        self.run_step(state, tokens, "lse")
        return self.token_log_probs(state, ids, state.ws.take("lse", (state.n,), F32))

    def token_log_probs(self, state: CudaState, ids, lse: cp.ndarray) -> cp.ndarray:
        """Each row's log-probability of ids[row] (N,) after the state's last step (given_log_probs)."""
        return self.given_log_probs(state.ws.take("final", (state.n, self.config.d_model), BF16), ids, lse)

    def given_log_probs(self, final: cp.ndarray, ids, lse: cp.ndarray) -> cp.ndarray:
        """Each row's log-probability of ids[row] (N,) from its final hidden state (N, D) bf16: the token's logit
        (the hidden state against its embedding row, in float32) less the row's log-sum-exp `lse`. In FP8, the
        logit as the FP8 product takes its operands: the hidden state rounded to E4M3 with its row's scale, the
        embedding row's values."""
        ids = cp.asarray(ids)
        if self.float8:
            codes, scales = kernels.quantize_rows(final)
            values = cp.asarray(e4m3_values())
            hidden = values[codes] * scales[:, None]
            rows = values[self.lm_head.codes[ids]] * self.lm_head.scales[ids][:, None]
        else:
            hidden, rows = final.astype(F32), self.lm_head[ids].astype(F32)
        logits = (hidden * rows).sum(axis=1)
        return logits - lse

    def forced_log_probs(self, encoded: CudaEncoded, source_rows: np.ndarray, langs: np.ndarray, given: np.ndarray,
                         lengths: np.ndarray) -> np.ndarray:
        """Forced decoding in one pass over each given translation, no step loop: row i is fed [decoder start,
        langs[i], given[i, : lengths[i] - 1]] at once, each position attending to the ones before it (the
        decoder's self-attention over its own K/V, causal by each query's key count), and out[i, t] (N, L)
        float64 is the log-probability of given[i, t] after position t + 1, for t < lengths[i]: what
        step_log_probs gives step by step. No cache slot is taken. A pass takes at most FORCED_TOKENS fed tokens,
        and at most half the batch's source tokens (but 2,048): the memory beside the pool holds the encoder's
        arrays for those (kvpool.activation_bytes), and a fed token takes less than twice a source token's."""
        c, d, pool = self.config, self.config.d_model, self.pool
        per_pass = min(FORCED_TOKENS, max(2048, int(encoded.length.sum()) // 2))
        out = np.zeros(given.shape, dtype=np.float64)
        pending = []
        for part in forced_passes(given, lengths, langs, c.decoder_start_token_id, c.pad_token_id, per_pass):
            h = kernels.embed(i32(part.fed), i32(part.pos), self.decoder_table, self.positions, c.embed_scale)
            key_start, self_len = i32(part.key_start), i32(part.self_len)
            sources = source_rows[part.rows][part.row_of]
            cross_start, cross_len = i32(encoded.start[sources]), i32(encoded.length[sources])
            longest, cross_keys = int(part.self_len.max()), int(encoded.length[sources].max())

            fresh = self.fresh_kv(len(part.fed))

            def attend_self(i: int, qkv: cp.ndarray) -> cp.ndarray:  # each position over its row's positions so far
                k, v = qkv[:, d : 2 * d], qkv[:, 2 * d :]
                if fresh is not None:  # an FP8 pool: K and V rounded to E4M3 as a step stores them
                    rows, k8, v8 = fresh
                    kernels.copy_rows(k, rows, k8, rows)
                    kernels.copy_rows(v, rows, v8, rows)
                    k, v = k8, v8
                return kernels.attention(qkv[:, :d], k, v, key_start, self_len, c.decoder_attention_heads,
                                         max_keys=longest)

            def attend_source(i: int, q: cp.ndarray) -> cp.ndarray:
                return kernels.attention(q, pool.cross_k(i), pool.cross_v(i), cross_start, cross_len,
                                         c.decoder_attention_heads, max_keys=cross_keys, together=True)

            self.decoder_layers(h, attend_self, attend_source)
            final = kernels.layernorm(h[cp.asarray(part.scored)], *self.dec_ln)
            at_row = part.rows[part.row_of[part.scored]]
            ids = given[at_row, part.scored_t]
            lse = kernels.logits_lse(final, self.lm_head)
            pending.append((at_row, part.scored_t, Later(self.given_log_probs(final, ids, lse))))
        for at_row, at_t, later in pending:
            out[at_row, at_t] = later.fetch()
        return out

    def fresh_kv(self, tokens: int) -> tuple | None:
        """Where forced decoding's self-attention takes a pass's K and V of `tokens` fed tokens from, with an FP8
        pool: (rows 0 .. tokens - 1, K and V as Fp8Rows), every layer's in turn; None with a bf16 pool (they are
        read from the product as they are)."""
        if not self.kv_float8:
            return None
        d, heads = self.config.d_model, self.config.decoder_attention_heads
        made = lambda: kernels.Fp8Rows(cp.empty((tokens, d), cp.uint8), cp.empty((tokens, heads), F32))  # noqa: E731
        return i32(np.arange(tokens)), made(), made()

    def set_keys(self, state: CudaState, keys: np.ndarray) -> None:
        """Each row's random stream (N,) uint32, for step_sample: kept with the state (select keeps its rows')
        and copied to the workspace's "sample key", where the step makes each row's key at that step."""
        state.keys = np.asarray(keys, dtype=np.uint32)
        state.ws.take("sample key", (state.n,), cp.uint32)[:] = cp.asarray(state.keys)

    def step_sample(self, encoded: CudaEncoded, state: CudaState, tokens, temperature: float,
                    banned: int | None = None, log_probs: bool = False) -> PendingIds:
        """Sampling over the whole vocabulary in the output projection: each row's token drawn from
        softmax(logits / temperature) (`banned` left out) by the Gumbel-max trick with the noise of its stream at
        this step (set_keys; the step keys made on the device, step.cu), the logits never written
        (kernels.logits_argmax). Like step_argmax_ahead, the ids stay on the device for the next step while they
        are copied to the host. With log_probs, a second pass gives each row's log-sum-exp, and the token's
        log-probability is its logit (its value less its noise, times the temperature) less that."""
        self.run_step(state, tokens, "sample", sample=(float(temperature), banned, bool(log_probs)))
        n, ws = state.n, state.ws
        ids = ws.rows("tokens", n)
        if not log_probs:
            return PendingIds(ids)
        noise = gumbel_noise(ws.take("noise", (n,), cp.uint32), ids[:, None], cp)[:, 0]
        logits = (ws.take("sample value", (n,), F32) - noise) / inverse_temperature(temperature)
        return PendingIds(ids, log_probs=logits - ws.take("lse", (n,), F32))

    def fetch_later(self, a: cp.ndarray) -> Later:
        """A device array copied to the host behind the work queued so far: .fetch() waits for it alone."""
        return Later(a)

    def reorder(self, state: CudaState, parents) -> None:
        """Beams follow their parents: row i continues row parents[i]'s history (parents on the host or the
        device, repeats allowed). Only the table rows move; each row keeps writing into its own slot."""
        state.ws.gather(state.n, cp.asarray(parents).astype(cp.int32), ("row_t", "table", "cross_start", "cross_len"))

    def select(self, state: CudaState, rows: np.ndarray) -> None:
        """Keep decoder rows `rows` (host indices, each at most once), in that order, their state (the next
        token included) moved to the front; the others' slots go back to the pool, for the next sentence."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(np.unique(rows)) != len(rows):
            raise ValueError("select keeps each row at most once: use reorder for beams that share a parent")
        dropped = np.setdiff1d(np.arange(state.n), rows)
        self.pool.slots.release(state.slots[dropped])
        n = state.n
        state.ws.gather(n, i32(rows))
        state.ws.pad_rows(len(rows), n)
        state.slots = state.slots[rows]
        state.t = state.t[rows]
        if state.keys is not None:
            self.set_keys(state, state.keys[rows])

    def release(self, state: CudaState) -> None:
        self.pool.slots.release(state.slots)
        state.slots, state.t = state.slots[:0], state.t[:0]
        if self.bound is state:
            self.bound = None

    def release_sources(self, encoded: CudaEncoded) -> None:
        if not encoded.released:
            self.pool.cross_runs.release(encoded.start, encoded.length)
            encoded.released = True
