"""Plain option records: the CLI fills them, the pipeline and the search read them."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeOptions:
    """How each sentence is decoded: the semantics of transformers' `generate` with early_stopping=False."""

    beam_size: int = 4  # beams per sentence; 1 is greedy search
    max_length: int = 200  # generated tokens after the decoder start, language token included (max_new_tokens)
    length_penalty: float = 1.0  # finished beams are ranked by sum(log p) / length ** length_penalty
    no_repeat_ngram_size: int = 0  # no n-gram of this many tokens occurs twice in an output; 0 is off
    repetition_penalty: float = 1.0  # scores of tokens already in the output: negative ones times this, others divided; 1 is off

    @property
    def processes_scores(self) -> bool:
        """Whether the search needs each step's full scores (transformers' logits processors), not just the best."""
        return self.no_repeat_ngram_size > 0 or self.repetition_penalty != 1.0

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam size must be at least 1, not {self.beam_size}")
        if self.max_length < 1:
            raise ValueError(f"max length must be at least 1, not {self.max_length}")
        if self.no_repeat_ngram_size < 0:
            raise ValueError(f"no-repeat n-gram size must be 0 (off) or more, not {self.no_repeat_ngram_size}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition penalty must be above 0, not {self.repetition_penalty}")


@dataclass(frozen=True)
class BatchOptions:
    """How rows are grouped into batches for the engine."""

    max_batch_tokens: int = 4096  # source tokens per batch, counted as rows x longest row (padding included)
    read_chunk_rows: int = 2048  # rows read ahead, sorted by length, batched, then written and committed together

    def __post_init__(self) -> None:
        if self.max_batch_tokens < 1:
            raise ValueError(f"max batch tokens must be at least 1, not {self.max_batch_tokens}")

    @classmethod
    def for_device(cls, device: str, max_batch_tokens: int | None = None, read_chunk_rows: int | None = None) -> "BatchOptions":
        """The defaults for where the engine runs, overridden by what is given. A GPU is fast per step only with
        thousands of sentences in it at once (100,000 tokens/s at 1,024 sentences a batch,
        200,000 at 4,096; the Translator splits what its KV pool cannot hold); the CPU's reference engine gains
        nothing from large batches and would only hold more in memory."""
        default = GPU_BATCHING if device.startswith("cuda") else cls()
        return cls(max_batch_tokens or default.max_batch_tokens, read_chunk_rows or default.read_chunk_rows)


# 4,096 sentences of 64 tokens a batch; chunks of 8,192 rows (32,768 measured slower: docs/PERFORMANCE.md, "Host side")
GPU_BATCHING = BatchOptions(max_batch_tokens=262144, read_chunk_rows=8192)


def cpu_threads() -> int:
    """The CPU engine's BLAS threads by default: half the cores this process may run on, at least one. The BLAS
    threads wait for each other by spinning, so a core taken by another process (or by the job's own reader and
    writer threads) stalls them all: with a thread on every core, a job beside other work took up to 80 times as
    long as with half as many (README, Options)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // 2)
