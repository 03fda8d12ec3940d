"""NumPy helpers that both engines and the search share: the position table, log-softmax, a sorted top-k, forced
decoding's packed layout, where a decoder step splits in halves and the order its halves' phases go out in.

They sit below engine/reference.py, model/engine/cuda.py and search.py, and import none of them.
"""

from __future__ import annotations

from functools import cached_property
from typing import NamedTuple

import numpy as np


def sinusoidal_positions(num_positions: int, dim: int, padding_idx: int) -> np.ndarray:
    """fairseq's (tensor2tensor's) sinusoidal table: [sin | cos] halves, row `padding_idx` zero. (P, D)"""
    half = dim // 2
    step = np.log(10000) / (half - 1)
    freqs = np.exp(np.arange(half, dtype=np.float32) * np.float32(-step))  # (D/2,)
    angles = np.arange(num_positions, dtype=np.float32)[:, None] * freqs[None, :]  # (P, D/2)
    table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    if dim % 2:
        table = np.concatenate([table, np.zeros((num_positions, 1), np.float32)], axis=1)
    table[padding_idx] = 0
    return table.astype(np.float32)


def log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def topk_desc(x, k: int):
    """The k largest values along the last axis of a 2-D array, sorted descending (ties: lower index first),
    and their indices. NumPy or CuPy arrays. Long NumPy rows are partitioned, not sorted (a full sort of
    beams x 256k candidates per step would dominate the reference engine's time), all rows in one call: each
    row's k-th largest value, then the values at or above it, found in one pass over the whole array."""
    if not isinstance(x, np.ndarray) or x.shape[-1] <= 4 * k:
        xp = np if isinstance(x, np.ndarray) else __import__("cupy")
        order = xp.argsort(-x, axis=-1, kind="stable")[:, :k] if xp is np else xp.argsort(-x, axis=-1)[:, :k]
        return xp.take_along_axis(x, order, axis=-1), order
    n, v = x.shape
    kth = np.partition(x, v - k, axis=1)[:, v - k]  # each row's k-th largest value
    flat = np.flatnonzero(x >= kth[:, None])  # row after row, each row's in id order
    counts = np.bincount(flat // v, minlength=n)
    if (counts == k).all():
        order = (flat % v).reshape(n, k)
    else:  # a row whose k-th value is shared beyond the k: the values above it, then the lowest ids of those equal
        order = np.empty((n, k), dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)])
        for r in range(n):
            ids = flat[starts[r] : starts[r + 1]] - r * v
            if ids.size > k:
                above = ids[x[r, ids] > kth[r]]
                ids = np.sort(np.concatenate([above, ids[x[r, ids] == kth[r]][: k - above.size]]))
            order[r] = ids
    order = np.take_along_axis(order, np.argsort(-np.take_along_axis(x, order, 1), axis=1, kind="stable"), 1)
    return np.take_along_axis(x, order, axis=-1), order


class ForcedPass(NamedTuple):
    """One pass of forced decoding's packed layout (forced_passes): T fed tokens of the batch rows `rows`."""

    rows: np.ndarray  # (R,) the batch rows of this pass, in order
    row_of: np.ndarray  # (T,) each fed token's row, an index into rows
    fed: np.ndarray  # (T,) the token fed: the decoder start, the language, then the given pieces
    pos: np.ndarray  # (T,) its position embedding's index (the padding index for a pad token, as a step gives it)
    key_start: np.ndarray  # (T,) the pass's index of its row's first token: its self-attention's first key
    self_len: np.ndarray  # (T,) how many keys it attends to: itself and the tokens before it
    scored: np.ndarray  # (S,) the fed tokens whose next token is scored (all but each row's decoder start)
    scored_t: np.ndarray  # (S,) the given piece each of those predicts: given[rows[row_of[scored]], scored_t]


def forced_passes(given: np.ndarray, lengths: np.ndarray, langs: np.ndarray, start_id: int, pad_id: int,
                  per_pass: int):
    """Forced decoding fed whole (an engine's forced_log_probs), in passes of at most per_pass tokens (a row
    longer than that alone): row i is fed [start_id, langs[i], given[i, : lengths[i] - 1]], its token at
    position p predicting given[i, p - 1] for p >= 1, as a step loop feeds and scores them."""
    counts = np.asarray(lengths, dtype=np.int64) + 1  # tokens fed a row
    first = 0
    while first < len(counts):
        last = first + max(1, int(np.searchsorted(np.cumsum(counts[first:]), per_pass, side="right")))
        rows = np.arange(first, last)
        first = last
        count = counts[rows]
        offsets = np.cumsum(count) - count
        row_of = np.repeat(np.arange(len(rows)), count)
        p = np.arange(int(count.sum())) - offsets[row_of]  # each fed token's position in its row
        fed = np.where(p == 0, start_id, np.asarray(langs)[rows][row_of])
        tail = p >= 2
        fed[tail] = given[rows[row_of[tail]], p[tail] - 2]
        pos = np.where(fed == pad_id, pad_id, p + pad_id + 1)
        scored = np.flatnonzero(p >= 1)
        yield ForcedPass(rows, row_of, fed, pos, offsets[row_of], p + 1, scored, p[scored] - 1)


# A decoder step over many rows in two halves, one on each of two streams (the GPU engine's step_halves): one
# half's attention, bound by memory, beside the other's GEMMs, bound by the tensor cores
HALVES_MIN_ROWS = 1024  # the fewest rows a step splits: fewer make halves of few GEMM tiles (4 row tiles at 1,024)
HALF_ROWS = 128  # each half a whole number of the step's largest GEMM tile rows (kernels.tile_rows)


def halves_at(b: int) -> int:
    """The first row of a step's second half, for a step over b rows split in two: a multiple of HALF_ROWS, the
    first half the larger by HALF_ROWS where b holds an odd number of them; 0 (no split) below HALVES_MIN_ROWS
    rows, or where the first half would take every row."""
    at = -(-b // (2 * HALF_ROWS)) * HALF_ROWS
    return at if b >= HALVES_MIN_ROWS and at < b else 0


# How a step over many rows runs (the GPU engine's step_halves, NLLB_STEP_HALVES): in one piece, as two halves side
# by side, or as two halves taking turns at the products (staggered_order)
WHOLE, HALVES, STAGGERED = 0, 1, 2

# A decoder step's phases, each a run of launches of one kind (CudaEngine.decoder_phases): products with the
# LayerNorms between them (bound by the tensor cores), an attention (bound by memory), the output projection
GEMM, ATTENTION, HEAD = "gemm", "attention", "head"


def step_phases(layers: int) -> list[str]:
    """The kinds of a decoder step's phases, in order: a layer's self-attention (its K/V copied into the pool
    first) and cross-attention are "attention"; the products between them "gemm" (the self-attention's output
    product, LayerNorm, the cross-attention's query product); a layer's cross-attention output product and
    feed-forward products run in one "gemm" phase with the next layer's LayerNorm and Q/K/V product; the final
    LayerNorm and output projection (with its argmax, top-k or draw) are "head"."""
    return [GEMM] + [ATTENTION, GEMM, ATTENTION, GEMM] * layers + [HEAD]


class Issue(NamedTuple):
    """One phase of a staggered step's half as the host issues it (staggered_order)."""

    half: int  # 0 or 1
    phase: int  # its index in the step's phases
    turn: int | None  # a products phase's turn, None for an attention
    beside: bool  # an attention of the other half may run beside it (a products phase)


def staggered_order(phases: list[str]) -> list[Issue]:
    """The order the host issues the phases of two halves of a step in when they take turns at the products
    (the GPU engine's STAGGERED step). The turns alternate, the first half's k-th products phase ("gemm" or
    "head") turn 2k and the second's turn 2k + 1, and each turn waits for the one before it to end: no two
    halves' products run at once, and the second half runs a phase behind the first, its products beside the
    first half's attention and its attention beside the first half's products. Each half's phases go out in
    their order, and a turn after the turn it waits for. A turn has an attention beside it where the other half
    has one between its turns just before and just after it (the first turn, the output projections and the
    second half's last turn before them have none)."""
    ends = [p for p, kind in enumerate(phases) if kind != ATTENTION]  # each products phase, in turn order
    order, issued = [], [0, 0]  # phases issued so far, per half
    for k, end in enumerate(ends + [len(phases) - 1]):  # (past the last turn: the attentions after it, if any)
        for half in (0, 1):
            for p in range(issued[half], end + 1):
                if phases[p] == ATTENTION:
                    order.append(Issue(half, p, None, False))
                    continue
                # the other half's turns just before and after this one: its products phases k - 1 + half, k + half
                before = ends[k - 1 + half] if k - 1 + half >= 0 else -1
                after = ends[k + half] if k + half < len(ends) else len(phases)
                beside = ATTENTION in phases[before + 1 : after]
                order.append(Issue(half, p, 2 * k + half, beside))
            issued[half] = max(issued[half], end + 1)
    return order


def to_host(a) -> np.ndarray:
    """A NumPy array as it is, a CuPy array copied to the host."""
    return a if isinstance(a, np.ndarray) else a.get()


# Sampling's random numbers: counter-based, one per (sentence, step, token), so a sentence's draws depend on the
# seed and its place in the input alone, never on its batch or on which engine draws them (gemm_epilogue.cuh's
# gumbel_noise is this, operation for operation). murmur3's 32-bit finaliser mixes the counters.
GOLDEN = 0x9E3779B9
TOKEN_MULTIPLIER, TOKEN_OFFSET = 0x27D4EB2F, 0x165667B1
MASK32 = np.uint64(0xFFFFFFFF)


def mix32(x, xp=np):
    """murmur3's finaliser of uint32 values: every input bit moves every output bit."""
    x = x ^ (x >> xp.uint32(16))
    x = x * xp.uint32(0x85EBCA6B)
    x = x ^ (x >> xp.uint32(13))
    x = x * xp.uint32(0xC2B2AE35)
    return x ^ (x >> xp.uint32(16))


def sentence_key(seed: int, row: int, sentence: int) -> int:
    """A sentence's random stream (uint32): the seed, its row's place in the input and its place in the row (and
    a last 0, the counter sample_keys folds in for the other samples of it)."""
    return int(sentence_keys(seed, [row], [sentence])[0])


def sentence_keys(seed: int, rows, sentences) -> np.ndarray:
    """sentence_key of each (rows[i], sentences[i]) (N,) uint32, at once: a batch's keys cost a few array
    operations, not a hundred microseconds a sentence."""
    rows, sentences = np.asarray(rows, dtype=np.uint64), np.asarray(sentences, dtype=np.uint64)
    key = np.zeros(len(rows), np.uint32)
    for part in (np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32 & 0xFFFFFFFF), rows & MASK32,
                 rows >> np.uint64(32), sentences & MASK32, np.uint64(0)):
        key = mix32(key + counter(part))
    return key


def sample_keys(keys, samples: int) -> np.ndarray:
    """The streams of each sentence's samples (N * samples,) uint32, a sentence's together: its j-th sample's
    key folds in j (the 0th: the sentence's own)."""
    keys = np.repeat(np.asarray(keys, dtype=np.uint32), samples)
    j = np.tile(np.arange(samples, dtype=np.uint64), len(keys) // max(samples, 1))
    return np.where(j == 0, keys, mix32(keys + counter(j)))


def counter(part) -> np.ndarray:
    """A counter's term a key is mixed with, (part * GOLDEN + 0x632BE5AB) mod 2^32, of uint64 parts below 2^32."""
    return ((np.asarray(part, dtype=np.uint64) * np.uint64(GOLDEN) + np.uint64(0x632BE5AB)) & MASK32).astype(np.uint32)


def step_keys(keys, step, xp=np):
    """The rows' stream keys (N,) uint32 at a decoder step (one for all, or each row's): what gumbel_noise reads.
    The step is the index of the token drawn after the language token (step.cu's sample_keys_kernel)."""
    steps = (xp.asarray(step, dtype=xp.uint64) * xp.uint64(GOLDEN)) & xp.uint64(0xFFFFFFFF)
    return mix32(xp.asarray(keys, dtype=xp.uint32) + steps.astype(xp.uint32), xp)


def inverse_temperature(temperature: float) -> np.float32:
    """What logits are multiplied by for sampling at a temperature, in float32 (so on both engines)."""
    return np.float32(1.0 / temperature)


def gumbel_noise(row_keys, ids, xp=np):
    """Gumbel(0, 1) draws (N, K) float32 for token ids (N, K) of rows whose step keys are row_keys (N,):
    argmax(logits / temperature + noise) samples softmax(logits / temperature). -log(E) of an Exp(1) draw E =
    -log(1 - v), v uniform in (0, 1): E from its series where v is small, so that the largest draws (those that
    win) keep their precision where a fast log (the GPU's) would lose it near 1."""
    ids = ids.astype(xp.uint32)
    h = mix32(row_keys[:, None] ^ (ids * xp.uint32(TOKEN_MULTIPLIER) + xp.uint32(TOKEN_OFFSET)), xp)
    v = ((h >> xp.uint32(9)).astype(xp.float32) + xp.float32(0.5)) * xp.float32(2.0**-23)  # in (0, 1), exactly
    small = v < xp.float32(SERIES_BELOW)
    series = v * (xp.float32(1) + v * xp.float32(0.5))
    e = xp.where(small, series, -xp.log(xp.where(small, xp.float32(0.5), xp.float32(1) - v)))
    return -xp.log(e)


SERIES_BELOW = 2.0**-8  # -log(1 - v) = v + v^2/2 + v^3/3 + ...: below this, v + v^2/2 is within 1e-8 of it
GUMBEL_MAX = 16.7  # above every draw of gumbel_noise: -log(E) of the least E, 2^-24 (the GPU skips the noise of a
#                    token whose logit / temperature is below the row's best so far by more)


# FP8 E4M3 (OCP's E4M3FN, CUDA's __nv_fp8_e4m3): a sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinity,
# NaN at S.1111.111; the largest finite value 448, the least 2^-9 (a subnormal). The NumPy model of the rounding
# that FP8 matrix products (--compute-type float8) and the FP8 K/V cache (--kv-cache-type float8) are checked against.
E4M3_MAX = 448.0


def e4m3_values() -> np.ndarray:
    """The value of each E4M3 code 0..255 (256,) float32: NaN at 0x7F and 0xFF, -0 at 0x80."""
    codes = np.arange(256)
    exponent, mantissa = (codes >> 3) & 0xF, codes & 7
    magnitude = np.where(exponent == 0, mantissa * 2.0**-9, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    magnitude = np.where((exponent == 15) & (mantissa == 7), np.nan, magnitude)
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.float32)


def e4m3_bits(x) -> np.ndarray:
    """x as E4M3 codes (uint8), as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) makes them: the
    nearest value (a tie to the even code), beyond 448 in size 448, NaN as 0x7F. From float32's bits, a block at
    a time (a whole embedding converts in a few temporaries of 16 MB): a normal size keeps its exponent and the
    top 3 of its 23 mantissa bits, rounded to nearest even; a size below 2^-6 is a multiple of 2^-9, rounded."""
    x = np.asarray(x, dtype=np.float32)
    flat, out = x.reshape(-1), np.empty(x.size, dtype=np.uint8)
    for first in range(0, flat.size, E4M3_BLOCK):
        block = flat[first : first + E4M3_BLOCK]
        size = np.abs(block)
        bits = size.view(np.uint32)
        rounded = (bits + np.uint32(0x7FFFF) + ((bits >> np.uint32(20)) & np.uint32(1))) >> np.uint32(20)
        normal = np.minimum(rounded.astype(np.int64) - (120 << 3), 0x7E)  # float32's exponent bias 127, E4M3's 7
        small = np.rint(np.minimum(size, np.float32(1)) * np.float32(512))  # units of 2^-9, exact; 8 is 2^-6, code 0x08 either way
        codes = np.where(size < np.float32(2.0**-6), small, normal).astype(np.uint8)
        codes |= np.where(np.signbit(block), np.uint8(0x80), np.uint8(0))
        out[first : first + E4M3_BLOCK] = np.where(np.isnan(block), np.uint8(0x7F), codes)
    return out.reshape(x.shape)


E4M3_BLOCK = 1 << 22


def quantize_e4m3(x: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """x (..., K) scaled to E4M3 along `axis` by its largest size: (codes uint8, scales float32 with `axis` of
    size 1), x ~ e4m3_values()[codes] * scales. A weight's per output channel (each row of (N, K)), an
    activation's per row, both with the axis of K; an all-zero slice has scale 1."""
    x = np.asarray(x, dtype=np.float32)
    top = np.max(np.abs(x), axis=axis, keepdims=True)
    scales = np.where(top > 0, top / np.float32(E4M3_MAX), np.float32(1)).astype(np.float32)
    return e4m3_bits(x / scales), scales


def dequantize_e4m3(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """quantize_e4m3's inverse, float32."""
    return e4m3_values()[codes] * scales


def quantize_heads(x: np.ndarray, head_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows x (..., W), W = G * head_size, scaled to E4M3 a head at a time: each run of head_size values
    x[..., g E : (g + 1) E] by its own largest size (quantize_e4m3 of it): codes (..., W) uint8 and scales (..., G)
    float32. What an FP8 K/V cache (--kv-cache-type float8) holds of a K or V row: a scale a (row, head)."""
    x = np.asarray(x, dtype=np.float32)
    codes, scales = quantize_e4m3(x.reshape(x.shape[:-1] + (-1, head_size)))
    return codes.reshape(x.shape), scales[..., 0]


def dequantize_heads(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """quantize_heads' inverse, float32 (..., W): each head's values times its scale."""
    heads = scales.shape[-1]
    values = e4m3_values()[codes].reshape(codes.shape[:-1] + (heads, -1)) * scales[..., None]
    return values.reshape(codes.shape)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32: the same number, exactly (shifted in place: one 4-byte array)."""
    wide = bits.astype(np.uint32)
    wide <<= 16
    return wide.view(np.float32)


FINITE_CHECK_BLOCK = 1 << 20  # elements looked at once by has_nonfinite: its temporaries stay at a few MB


def has_nonfinite(array: np.ndarray, float8: bool = False) -> bool:
    """Whether a stored tensor holds a NaN or an infinity: float values, bf16 bits (uint16: the exponent all ones)
    or, with float8, E4M3 codes (uint8: E4M3's NaN, S.1111.111; it has no infinity)."""
    flat = np.asarray(array).reshape(-1)
    for first in range(0, flat.size, FINITE_CHECK_BLOCK):
        block = flat[first : first + FINITE_CHECK_BLOCK]
        if block.dtype == np.uint16:
            bad = ((block & np.uint16(0x7FFF)) >= 0x7F80).any()
        elif block.dtype == np.uint8:
            bad = float8 and ((block & np.uint8(0x7F)) == 0x7F).any()
        else:
            bad = not np.isfinite(block).all()
        if bad:
            return True
    return False


class E4M3Matrix:
    """A weight matrix (N, K) in FP8 E4M3 with a scale per row, its output channel: values e4m3_values()[codes] *
    scales. What `--compute-type float8` multiplies by (the engines take it where a float matrix would be), and
    what `nllb convert --compute-type float8` stores: the codes as a F8_E4M3 tensor, the scales beside them as
    `<name>_scale`. An embedding table stored so gives each token's row by the same rule."""

    def __init__(self, codes: np.ndarray, scales: np.ndarray):
        self.codes = np.asarray(codes, dtype=np.uint8)  # (N, K)
        self.scales = np.asarray(scales, dtype=np.float32).reshape(-1, 1)  # (N, 1)
        if self.codes.ndim != 2 or self.scales.shape[0] != self.codes.shape[0]:
            raise ValueError(f"E4M3 codes {self.codes.shape} need a scale a row, not {self.scales.shape}")

    @classmethod
    def quantize(cls, w: np.ndarray) -> "E4M3Matrix":
        """quantize_e4m3(w), a block of rows at a time (bf16 bits widened there): the temporaries of a 256k-row
        embedding stay at a few of its blocks, not a few of its whole size."""
        codes, scales = np.empty(w.shape, np.uint8), np.empty((w.shape[0], 1), np.float32)
        step = max(1, E4M3_BLOCK // max(1, w.shape[1]))
        for first in range(0, w.shape[0], step):
            block = w[first : first + step]
            block = bf16_to_float32(block) if block.dtype == np.uint16 else block
            codes[first : first + step], scales[first : first + step] = quantize_e4m3(block)
        return cls(codes, scales)

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    def dequantize(self) -> np.ndarray:
        """The values (N, K) float32."""
        return dequantize_e4m3(self.codes, self.scales)

    @cached_property
    def values(self) -> np.ndarray:
        """dequantize(), made once (the CPU reference multiplies by it)."""
        return self.dequantize()

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` (any shape) as float32 values (ids.shape + (K,)): an embedding lookup."""
        return dequantize_e4m3(self.codes[ids], self.scales[ids])


def gemm_fp8_reference(a_codes: np.ndarray, a_scale: np.ndarray, w_codes: np.ndarray, w_scale: np.ndarray,
                       bias: np.ndarray | None = None, residual: np.ndarray | None = None,
                       relu: bool = False) -> np.ndarray:
    """The model of an FP8 matrix product (kernels.gemm_fp8): out[m, n] = relu?(a_scale[m] * w_scale[n] * sum_k
    e4m3(a_codes[m, k]) * e4m3(w_codes[n, k]) + bias[n]) + residual[m, n], (M, N) float64, before the kernel's
    rounding of its output to bf16 or f32. a_codes (M, K), w_codes (N, K) uint8; a_scale (M,) or (M, 1), w_scale
    (N,) or (N, 1). The sums are exact: every E4M3 product is a multiple of 2^-18 below 2^18 in size, so float64
    holds any sum of fewer than 2^17 of them without rounding, in any order."""
    values = e4m3_values().astype(np.float64)
    a, w = values[a_codes], values[w_codes]  # (M, K), (N, K)
    scale = np.asarray(a_scale, np.float64).reshape(-1, 1) * np.asarray(w_scale, np.float64).reshape(1, -1)
    out = (a @ w.T) * scale  # (M, N)
    if bias is not None:
        out = out + np.asarray(bias, np.float64)
    if relu:
        out = np.maximum(out, 0)
    if residual is not None:
        out = out + np.asarray(residual, np.float64)
    return out
