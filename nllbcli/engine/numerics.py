"""NumPy helpers that both engines and the search share: the position table, log-softmax, a sorted top-k.

They sit below engine/reference.py, engine/cuda.py and search.py, and import none of them.
"""

from __future__ import annotations

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
    and their indices. NumPy or CuPy arrays. Partition first on long NumPy rows: a full sort of
    beams x 256k candidates per step would dominate the reference engine's time."""
    if not isinstance(x, np.ndarray) or x.shape[-1] <= 4 * k:
        xp = np if isinstance(x, np.ndarray) else __import__("cupy")
        order = xp.argsort(-x, axis=-1, kind="stable")[:, :k] if xp is np else xp.argsort(-x, axis=-1)[:, :k]
        return xp.take_along_axis(x, order, axis=-1), order
    order = np.empty((x.shape[0], k), dtype=np.int64)
    for r, row in enumerate(x):
        kth = np.partition(row, row.size - k)[row.size - k]  # the k-th largest value
        above = np.flatnonzero(row > kth)
        picked = np.concatenate([above, np.flatnonzero(row == kth)[: k - above.size]])
        order[r] = picked[np.lexsort((picked, -row[picked]))]
    return np.take_along_axis(x, order, axis=-1), order


def to_host(a) -> np.ndarray:
    """A NumPy array as it is, a CuPy array copied to the host."""
    return a if isinstance(a, np.ndarray) else a.get()
