"""The fixed KV pool of the GPU engine and its allocators.

Preallocated once and never grown:
- self-attention K and V, per decoder layer, as `[slots, cache_rows, D]` (stored flat as
  `(slots * cache_rows, D)`): a slot per live sequence (per beam), claimed when it starts, freed the
  moment it ends, so the next sentence can reuse it;
- cross-attention K/V as rows of `(cross_rows, 2 * layers * D)`: a source token's K and V for every
  decoder layer in one row (layer l's K at columns 2lD.., its V at 2lD+D..), written once at prefill
  because they depend only on the encoder output. Each source claims a contiguous run of rows, as long
  as the source, instead of a fixed `max_source_len` run: short sources then cost no padding.
- one more slot and cross row, for the padding rows of a decoder step (scratch_slot, scratch_cross).

Running out is an error that names the option to change, never a crash.
"""

from __future__ import annotations

from dataclasses import dataclass

import cupy as cp

from ..errors import PoolFull  # defined in errors.py, where the search (no CuPy) catches it

BF16 = cp.dtype("bfloat16")


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
    cache_rows: int  # decoder positions per slot: the decoder start plus max_length tokens
    cross_rows: int  # source tokens at once, all sources together
    beams: int = 1  # the beam size the split was made for


def plan_pool(layers: int, d_model: int, cache_rows: int, budget_bytes: int, max_source: int, beams: int = 1) -> PoolPlan:
    """Split a memory budget between self-attention slots and cross K/V rows as a job uses them: a sentence
    takes `beams` slots of cache_rows rows each, and a cross row per source token, taken to be about
    cache_rows too (a translation is about as long as its source). So the cross rows get 1 / (1 + beams) of
    the budget: half for greedy search, a fifth for 4 beams."""
    per_slot = layers * 2 * cache_rows * d_model * BF16.itemsize
    per_cross_row = layers * 2 * d_model * BF16.itemsize
    cross_bytes = budget_bytes // (1 + beams)
    slots = max(1, min(16384, (budget_bytes - cross_bytes) // per_slot))
    cross_rows = max(max_source, min(1 << 21, cross_bytes // per_cross_row))
    return PoolPlan(int(slots), int(cache_rows), int(cross_rows), beams)


class KVPool:
    def __init__(self, layers: int, d_model: int, plan: PoolPlan):
        self.plan = plan
        self.d = d_model
        # Past the last slot and the last cross row, zeroed and never handed out: a scratch slot and cross row,
        # for the padding rows of a decoder step rounded up to a bucket of rows (engine.cuda), so they need
        # nothing of their own, read finite values and corrupt nothing.
        self.scratch_slot, self.scratch_cross = plan.slots, plan.cross_rows
        rows = (plan.slots + 1) * plan.cache_rows
        self.self_k = [cp.empty((rows, d_model), dtype=BF16) for _ in range(layers)]
        self.self_v = [cp.empty((rows, d_model), dtype=BF16) for _ in range(layers)]
        self.cross = cp.empty((plan.cross_rows + 1, 2 * layers * d_model), dtype=BF16)
        for a in self.self_k + self.self_v:
            a[plan.slots * plan.cache_rows :] = 0
        self.cross[plan.cross_rows :] = 0
        self.slots = SlotAllocator(plan.slots)
        self.cross_runs = RunAllocator(plan.cross_rows)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.self_k + self.self_v) + self.cross.nbytes

    def cross_k(self, layer: int) -> cp.ndarray:
        return self.cross[:, 2 * layer * self.d : (2 * layer + 1) * self.d]

    def cross_v(self, layer: int) -> cp.ndarray:
        return self.cross[:, (2 * layer + 1) * self.d : (2 * layer + 2) * self.d]
