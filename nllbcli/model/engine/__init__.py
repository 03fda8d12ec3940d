"""The engines: the NumPy float32 reference (reference.py) and the CuPy GPU engine (cuda.py).

`Engine` is what search.py asks of an engine, and both answer it, so the search runs on either. An engine's
`encoded` (what `encode` returns) and `state` (what `start` returns) are its own; a state is a `RowPositions`.
An engine may also answer `forced_log_probs` (the GPU engine's forced decoding in one pass over each given
translation); search.score_targets steps through step_log_probs where it does not.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np


class RowPositions:
    """Decoder rows that advance together: `t` (N,) on the host, the positions each row has filled."""

    t: np.ndarray

    @property
    def n(self) -> int:
        return len(self.t)

    @property
    def length(self) -> int:
        """Positions the rows have filled: what a cache must hold."""
        return int(self.t.max(initial=0))


class OnHost:
    """A step's ids (and their log-probs) already on the host, as step_argmax_ahead's answer for an engine that
    has nothing to overlap."""

    def __init__(self, ids, log_probs=None):
        self.device = np.asarray(ids)
        self.chosen = log_probs

    def fetch(self) -> np.ndarray:
        return self.device

    def log_probs(self) -> np.ndarray:
        return self.chosen

    def subset(self, rows: np.ndarray) -> "OnHost":
        return OnHost(self.device[rows], None if self.chosen is None else self.chosen[rows])


class PendingArray(Protocol):
    """A device array on its way to the host."""

    def fetch(self) -> np.ndarray: ...


class PendingStep(PendingArray, Protocol):
    """A greedy step's ids (N,): `device` feeds the next step where it lies, fetch() gives them on the host,
    log_probs() their log-probabilities (N,) where the step was asked for them."""

    device: Any

    def log_probs(self) -> np.ndarray: ...

    def subset(self, rows: np.ndarray) -> "PendingStep":
        """These rows' ids: the next step's input after engine.select(state, rows)."""


class Engine(Protocol):
    """The calls search.py makes. Arrays of tokens and parents may be on the host or in `xp`."""

    xp: Any  # numpy or cupy: where the search keeps its beam arrays

    def capacity(self, max_length: int, beams: int = 1, sentences: int | None = None,
                 source_tokens: int | None = None) -> tuple[int, int]:
        """(decoder rows, source tokens) the KV pool holds at once, made for a batch of `sentences` sentences of
        `beams` rows each, reaching max_length tokens, with `source_tokens` source tokens (None: unknown)."""

    def encode(self, sources: list[list[int]]) -> Any:
        """The encoder over the sources, and every decoder layer's cross K/V."""

    def start(self, encoded: Any, source_rows: np.ndarray, max_positions: int) -> RowPositions:
        """A decoder state with one row per sequence (per beam), row i reading source source_rows[i]."""

    def step(self, encoded: Any, state: RowPositions, tokens: Any, want_logits: bool = True) -> np.ndarray | None:
        """Feed one token per row; the next-token logits (N, V) on the host (tests, prefill), or None."""

    def step_argmax(self, encoded: Any, state: RowPositions, tokens: Any) -> np.ndarray:
        """... and each row's best next token (N,) (greedy; ties: the lower id)."""

    def step_argmax_ahead(self, encoded: Any, state: RowPositions, tokens: Any, log_probs: bool = False) -> PendingStep:
        """step_argmax without waiting for the ids: the next step can be queued before they are fetched; with
        log_probs, the ids' log-probabilities come with them."""

    def step_topk(self, encoded: Any, state: RowPositions, tokens: Any, k: int) -> tuple[Any, Any]:
        """... and each row's k best next tokens by log-probability, best first: (log-probs, ids), (N, k) each."""

    def set_keys(self, state: RowPositions, keys: np.ndarray) -> None:
        """Each row's random stream (N,) uint32 (numerics.sentence_key), for step_sample."""

    def step_sample(self, encoded: Any, state: RowPositions, tokens: Any, temperature: float,
                    banned: int | None = None, log_probs: bool = False) -> PendingStep:
        """... and each row's next token drawn from softmax(logits / temperature) over the whole vocabulary
        (`banned` left out) with the noise of the row's stream at this step (numerics.gumbel_noise), as
        step_argmax_ahead gives its ids (with their log-probs, where asked)."""

    def step_log_probs(self, encoded: Any, state: RowPositions, tokens: Any, ids: Any) -> Any:
        """... and each row's log-probability of the token ids[row] as its next (N,): forced decoding's step."""

    def last_log_probs(self, state: RowPositions, ids: Any) -> Any:
        """Each row's log-probability of the token ids[row] (N,) at the state's last step_topk."""

    def fetch_later(self, array: Any) -> PendingArray:
        """An array of `xp` on its way to the host."""

    def reorder(self, state: RowPositions, parents: Any) -> None:
        """Beams follow their parents: row i continues row parents[i]'s history (repeats allowed)."""

    def select(self, state: RowPositions, rows: Sequence[int]) -> None:
        """Keep these rows (host indices), in that order; the others' cache goes back."""

    def release(self, state: RowPositions) -> None:
        """Give the state's cache back to the pool."""

    def release_sources(self, encoded: Any) -> None:
        """Give the sources' cross K/V back to the pool."""
