"""The decode-step attention kernel alone at the harness's shapes: GB/s of keys and values read.

    python -m bench.micro.attention_bench [--rows 4096] [--min-blocks 1,10,12]

Cross-attention (each row reads its source's run of 10-60 cross K/V rows, as a batch sorted by length) and
self-attention through a row table (every row at 20 and at 40 positions), NLLB-600M's 16 heads of 64, for
each value of the kernel's DECODE_MIN_BLOCKS (__launch_bounds__'s blocks an SM: caps its registers).
"""

from __future__ import annotations

import argparse
import json
import sys

import cupy as cp
import numpy as np

from bench.micro.engine_bench import timed
from nllbcli.model.engine import kernels


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--min-blocks", default="1,10,12")  # attention.cu's default: 10
    args = parser.parse_args()
    rows, heads, e = args.rows, 16, 64
    d = heads * e
    rng = np.random.default_rng(0)
    gen = cp.random.default_rng(0)
    lengths = np.sort(rng.integers(10, 61, rows)).astype(np.int32)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
    cross_kv = gen.standard_normal((int(lengths.sum()), 2 * d), dtype=cp.float32).astype("bfloat16")
    q = gen.standard_normal((rows, d), dtype=cp.float32).astype("bfloat16")
    cache_rows = 48
    self_kv = gen.standard_normal((rows * cache_rows, 2 * d), dtype=cp.float32).astype("bfloat16")
    table = cp.asarray((np.arange(rows)[:, None] * cache_rows + np.arange(cache_rows)).astype(np.int32))
    out = cp.empty((rows, d), dtype="bfloat16")
    cases = [("cross", cross_kv, cp.asarray(starts), None, cp.asarray(lengths), int(lengths.max()))]
    for t in (20, 40):
        cases.append((f"self {t}", self_kv, None, table, cp.full(rows, t, dtype=cp.int32), t))
    for blocks in map(int, args.min_blocks.split(",")):
        fn = kernels.module("attention.cu", (("DECODE_MIN_BLOCKS", blocks),)).get_function(f"attention_decode_{e}_kernel")
        row = {"min_blocks": blocks, "num_regs": fn.num_regs}
        for name, kv, start, tab, length, _ in cases:
            k, v = kv[:, :d], kv[:, d:]
            args_ = (q, cp.int32(d), k, v, cp.int32(2 * d), start if start is not None else kernels.NULL, length,
                     tab if tab is not None else kernels.NULL, cp.int32(cache_rows if tab is not None else 0), out,
                     cp.int32(rows), cp.int32(heads), cp.float32(e**-0.5))
            seconds = timed(lambda: fn((-(-rows * heads // 4),), (128,), args_), repeat=20, inner=10)
            moved = int(cp.asnumpy(length).sum()) * d * 2 * 2
            row[f"{name}_us"], row[f"{name}_tbps"] = seconds * 1e6, moved / seconds / 1e12
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
