"""The KV pool of the GPU engine, its allocators, and how large it is made.

Allocated before a batch, as large as the batch needs where memory allows (plan_for_job), and kept for the
batches after it as long as they fit; remade larger only when one does not. It holds:
- self-attention K and V, per decoder layer, as `[slots, cache_rows, D]` (stored flat as
  `(slots * cache_rows, D)`): a slot per live sequence (per beam), claimed when it starts, freed the
  moment it ends, so the next sentence can reuse it;
- cross-attention K/V as rows of `(cross_rows, 2 * layers * D)`: a source token's K and V for every
  decoder layer in one row (layer l's K at columns 2lD.., its V at 2lD+D..), written once at prefill
  because they depend only on the encoder output. Each source claims a contiguous run of rows, as long
  as the source, instead of a fixed `max_source_len` run: short sources then cost no padding.
- one more slot and cross row, for the padding rows of a decoder step (scratch_slot, scratch_cross).

Each is bf16, or with --kv-cache-type float8 (fp8_heads: the decoder's heads) FP8: every K and V row as E4M3 codes
with a float32 scale a head (kernels.Fp8Rows, numerics.quantize_heads), quantized on its way in (kernels.copy_rows),
2 D + 8 H bytes a layer's K and V instead of 4 D: at head size 64 the same memory holds 1.88x the rows.

Running out is an error that names the option to change, never a crash. The planning needs no CuPy (the
CPU tests check it); the pool itself does.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import PoolFull  # defined in errors.py, where the search (no CuPy) catches it

BF16_BYTES = 2
F32_BYTES = 4
CROSS_STAGING_BYTES = 256 << 20  # an FP8 pool's cross K/V products, in bf16, made at most this many bytes at a time
#                                   before they are quantized into it (engine.cuda's encode)
MAX_SLOTS = 1 << 16  # the pool's bounds, whatever the memory: slot and row numbers stay well inside int32
MAX_CROSS_ROWS = 1 << 23


class SlotAllocator:
    """Slot numbers 0..size-1, handed out and taken back."""

    def __init__(self, size: int):
        self.size = size
        self.free = list(range(size - 1, -1, -1))  # a stack: the lowest numbers go first

    @property
    def available(self) -> int:
        return len(self.free)

    def claim(self, n: int) -> list[int]:
        if n > len(self.free):
            raise PoolFull(f"{n} cache slots needed, {len(self.free)} of {self.size} free")
        return [self.free.pop() for _ in range(n)]

    def release(self, slots) -> None:
        self.free.extend(int(s) for s in slots)


class RunAllocator:
    """Contiguous runs of rows out of `size` (first fit), for the cross K/V of each source."""

    def __init__(self, size: int):
        self.size = size
        self.free: list[tuple[int, int]] = [(0, size)]  # (start, length), sorted by start

    @property
    def available(self) -> int:
        return sum(n for _, n in self.free)

    def claim(self, n: int) -> int:
        for i, (start, length) in enumerate(self.free):
            if length >= n:
                self.free[i : i + 1] = [(start + n, length - n)] if length > n else []
                return start
        raise PoolFull(f"a run of {n} cross K/V rows needed, the longest free run is {max((n for _, n in self.free), default=0)}")

    def release(self, starts, lengths) -> None:
        """Give back the runs starts[i] .. starts[i] + lengths[i] - 1 (a batch's sources at once: one sort)."""
        self.free.extend((int(s), int(n)) for s, n in zip(starts, lengths))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for s, length in self.free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((s, length))
        self.free = merged


@dataclass(frozen=True)
class PoolPlan:
    slots: int  # live sequences (beams) at once
    cache_rows: int  # decoder positions per slot: the decoder start plus the tokens a sequence can reach
    cross_rows: int  # source tokens at once, all sources together

    def covers(self, other: "PoolPlan") -> bool:
        return self.slots >= other.slots and self.cache_rows >= other.cache_rows and self.cross_rows >= other.cross_rows

    def nbytes(self, layers: int, d_model: int, fp8_heads: int = 0) -> int:
        """The pool's memory: the slots' self-attention K/V and the cross rows, with the scratch slot and row."""
        return ((self.slots + 1) * self.cache_rows + self.cross_rows + 1) * row_bytes(layers, d_model, fp8_heads)


def row_bytes(layers: int, d_model: int, fp8_heads: int = 0) -> int:
    """One position's K and V in every decoder layer: a slot's cache row, or a source token's cross row. bf16, or
    where fp8_heads (an FP8 pool's heads) is given a code an element and a float32 scale a head."""
    if fp8_heads:
        return layers * 2 * (d_model + fp8_heads * F32_BYTES)
    return layers * 2 * d_model * BF16_BYTES


def rounded_up(n: int) -> int:
    """n up to the next of 8, 9, .., 15 times a power of two (at most 1/8 more): a pool grown to it is grown
    again only after batches 1/8 larger."""
    if n <= 16:
        return max(n, 1)
    shift = n.bit_length() - 4
    return -(-n >> shift) << shift


def plan_pool(layers: int, d_model: int, cache_rows: int, budget_bytes: int, max_source: int, beams: int = 1,
              fp8_heads: int = 0) -> PoolPlan:
    """A budget split between slots and cross rows for a job of unknown size: a sentence takes `beams` slots of
    cache_rows rows each, and a cross row per source token, taken to be about cache_rows too (a translation is
    about as long as its source). So the cross rows get 1 / (1 + beams) of the budget: half for greedy search,
    a fifth for 4 beams. At most 16,384 slots and 2M cross rows: the pool a small model's tests get. fp8_heads: an
    FP8 pool's (row_bytes)."""
    row = row_bytes(layers, d_model, fp8_heads)
    cross_bytes = budget_bytes // (1 + beams)
    slots = max(beams, min(16384, (budget_bytes - cross_bytes) // (cache_rows * row)))
    cross_rows = max(max_source, min(1 << 21, cross_bytes // row))
    return PoolPlan(int(slots), int(cache_rows), int(cross_rows))


def plan_for_job(layers: int, d_model: int, need: PoolPlan, budget_bytes: int, current: PoolPlan | None,
                 beams: int, max_source: int, fp8_heads: int = 0) -> PoolPlan:
    """The pool for a batch that needs `need` (its sentences' slots, the positions they can reach, its source
    tokens), within `budget_bytes`, given the pool there is (`current`, None for none; the caller keeps it where
    it covers the need). Grown to cover both the need and the pool there was, rounded up, where the budget
    allows; else the need alone; else as much of the need as fits, slots and cross rows in the need's
    proportion (the batch then goes in parts), whole sentences' beams (none, where not one sentence's fit: the
    caller says which option to lower), and at least `max_source` cross rows. fp8_heads: an FP8 pool's (row_bytes)."""
    size = lambda plan: plan.nbytes(layers, d_model, fp8_heads)  # noqa: E731
    grown = need if current is None else PoolPlan(max(need.slots, current.slots), max(need.cache_rows, current.cache_rows),
                                                  max(need.cross_rows, current.cross_rows))
    grown = PoolPlan(min(MAX_SLOTS, rounded_up(grown.slots)), grown.cache_rows, min(MAX_CROSS_ROWS, rounded_up(grown.cross_rows)))
    for plan in (grown, need):
        if size(plan) <= budget_bytes:
            return plan
    scratch = size(PoolPlan(0, need.cache_rows, 0))
    fraction = max(0, budget_bytes - scratch) / (size(need) - scratch)
    slots = int(need.slots * fraction) // beams * beams
    cross_rows = max(min(max_source, need.cross_rows), int(need.cross_rows * fraction))
    return PoolPlan(slots, need.cache_rows, cross_rows)


def activation_bytes(config, rows: int, source_tokens: int, cache_rows: int, kv_float8: bool = False) -> int:
    """An upper bound on the memory a batch's arrays take beside the pool: the encoder's over all its source tokens
    at once (the f32 residual stream, the bf16 LayerNorm output, q/k/v, attention output and FFN hidden layer; for
    an FP8 pool, kv_float8, the cross K/V products before they are quantized into it, CROSS_STAGING_BYTES at most),
    or the decoder step's over its rows (the same per row, the cache-row table, and the output projection's
    partial results: at most 8 candidates, each a float and an index, a 64 columns), whichever is larger."""
    d = config.d_model
    encoder = source_tokens * (4 * d + 2 * (d + 3 * d + d) + 2 * config.encoder_ffn_dim)
    if kv_float8:
        encoder += min(source_tokens * 2 * config.decoder_layers * d * BF16_BYTES, CROSS_STAGING_BYTES)
    decoder = rows * (4 * d + 2 * (d + 3 * d + d + d) + 2 * config.decoder_ffn_dim + 4 * cache_rows
                      + 8 * -(-config.vocab_size // 64) * 8)
    return max(encoder, decoder)


class KVPool:
    def __init__(self, layers: int, d_model: int, plan: PoolPlan, fp8_heads: int = 0):
        import cupy as cp

        from .kernels import Fp8Rows

        self.plan = plan
        self.d, self.heads, self.float8 = d_model, fp8_heads, bool(fp8_heads)
        # Past the last slot and the last cross row, zeroed and never handed out: a scratch slot and cross row,
        # for the padding rows of a decoder step rounded up to a bucket of rows (engine.cuda), so they need
        # nothing of their own, read finite values and corrupt nothing.
        self.scratch_slot, self.scratch_cross = plan.slots, plan.cross_rows
        rows = (plan.slots + 1) * plan.cache_rows

        def rows_of(n: int, width: int):  # n rows of `width` elements: bf16, or FP8 codes and a scale a head
            if not self.float8:
                return cp.empty((n, width), dtype=cp.dtype("bfloat16"))
            heads = width // d_model * fp8_heads
            return Fp8Rows(cp.empty((n, width), dtype=cp.uint8), cp.empty((n, heads), dtype=cp.float32))

        self.self_k = [rows_of(rows, d_model) for _ in range(layers)]
        self.self_v = [rows_of(rows, d_model) for _ in range(layers)]
        self.cross = rows_of(plan.cross_rows + 1, 2 * layers * d_model)
        for a in self.arrays:
            a[plan.slots * plan.cache_rows :] = 0
        for a in self.arrays_of(self.cross):
            a[plan.cross_rows :] = 0
        self.slots = SlotAllocator(plan.slots)
        self.cross_runs = RunAllocator(plan.cross_rows)

    @staticmethod
    def arrays_of(rows) -> list:
        return [rows.codes, rows.scales] if hasattr(rows, "codes") else [rows]

    @property
    def arrays(self) -> list:
        """The self-attention K and V arrays (an FP8 pool's codes and scales apart)."""
        return [a for rows in self.self_k + self.self_v for a in self.arrays_of(rows)]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays + self.arrays_of(self.cross))

    def cross_k(self, layer: int):
        return self.cross_columns(2 * layer)

    def cross_v(self, layer: int):
        return self.cross_columns(2 * layer + 1)

    def cross_columns(self, part: int):
        """The cross rows' part-th D columns (layer l's K: part 2l, its V: 2l + 1), with their scales in FP8."""
        d = self.d
        if not self.float8:
            return self.cross[:, part * d : (part + 1) * d]
        from .kernels import Fp8Rows

        h = self.heads
        return Fp8Rows(self.cross.codes[:, part * d : (part + 1) * d], self.cross.scales[:, part * h : (part + 1) * h])
