"""The CPU engine's matrix products against the others it could use, and whether each keeps a row's bits when the
rows beside it change (the engine's batch invariance): over random subsets of the rows, and in calls of a fixed
number of rows (zero-padded), a row then at another place of its call. `mlas`: the engine's (products.Products,
onnxruntime's MLAS on a packed weight); `gemm`: NumPy's matrix product of all the rows at once (BLAS's GEMM);
`rows`: a matrix-vector product a row and block of 256 KB of the weight (whose bits never depend on the rows
beside it either); `calls_of_R`: BLAS's GEMM on R rows at a time; `int8`: the engine's --compute-type int8
(products.Int8Products: the weight in int8 with a scale an output channel, each input row with a scale of its
own, MLAS's exact integer sums), with its largest error against the float32 product relative to the output's
largest size. One thread, CPU milliseconds (median of --repeats).

    .venv/bin/python -m bench.cpu_products            # about 30 seconds on 2 cores
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

from nllbcli.model.engine.products import Int8Products, Products

SHAPES = [(256, 256), (256, 1024), (1024, 256), (256, 3208), (1024, 4096)]  # (K, N): the sample model's, 600M's FFN


def by_rows(x: np.ndarray, w: np.ndarray, block_values: int = 1 << 16) -> np.ndarray:
    """x @ w.T as a matrix-vector product a row, a block of w's rows at a time (block_values values: 256 KB)."""
    rows, block = x[:, None, :], max(1, block_values // w.shape[1])
    y = np.empty((len(x), w.shape[0]), np.float32)
    for first in range(0, w.shape[0], block):
        y[:, first : first + block] = (rows @ w[first : first + block].T)[:, 0]
    return y


def in_calls(x: np.ndarray, w: np.ndarray, rows: int) -> np.ndarray:
    """x @ w.T in calls of `rows` rows each, the last zero-padded."""
    pad = -len(x) % rows
    padded = np.concatenate([x, np.zeros((pad, x.shape[1]), x.dtype)]) if pad else x
    y = np.empty((len(padded), w.shape[0]), np.float32)
    for first in range(0, len(padded), rows):
        np.matmul(padded[first : first + rows], w.T, out=y[first : first + rows])
    return y[: len(x)]


def cpu_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3


def keeps_bits(product, x: np.ndarray, rng, trials: int) -> int:
    """How many of `trials` random subsets of the rows give each row the bits the whole product gives it."""
    whole = product(x)
    kept = 0
    for _ in range(trials):
        subset = rng.permutation(len(x))[: rng.integers(1, len(x))]
        kept += np.array_equal(product(x[subset]), whole[subset])
    return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with threadpool_limits(limits=1, user_api="blas"):
        for k, n in SHAPES:
            w = rng.standard_normal((n, k), dtype=np.float32)
            x = rng.standard_normal((args.rows, k), dtype=np.float32)
            record = {"K": k, "N": n, "rows": args.rows}
            mlas, int8_products = Products(), Int8Products()
            int8 = lambda a: int8_products(a, w)  # noqa: E731
            products = {"mlas": lambda a: mlas(a, w), "int8": int8, "gemm": lambda a: a @ w.T, "rows": lambda a: by_rows(a, w),
                        **{f"calls_of_{r}": (lambda a, r=r: in_calls(a, w, r)) for r in (4, 8, 16, 64)}}
            for name, product in products.items():
                record[f"{name}_ms"] = round(cpu_ms(lambda: product(x), args.repeats), 3)
                record[f"{name}_keeps_bits"] = f"{keeps_bits(product, x, rng, args.trials)}/{args.trials}"
            exact = x @ w.T
            record["int8_error"] = float(np.abs(int8(x) - exact).max() / np.abs(exact).max())
            print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
