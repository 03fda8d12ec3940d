"""The CPU engine's matrix products against the others it could use, and whether each keeps a row's bits when the
rows beside it change (the engine's batch invariance): over random subsets of the rows, and in calls of a fixed
number of rows (zero-padded), a row then at another place of its call. `mlas`: the engine's (products.Products,
onnxruntime's MLAS on a packed weight); `gemm`: NumPy's matrix product of all the rows at once (BLAS's GEMM);
`rows`: a matrix-vector product a row and block of 256 KB of the weight (what the engine used before MLAS, whose
bits never depend on the rows beside it either); `calls_of_R`: BLAS's GEMM on R rows at a time; `int8`: what an
int8 compute type would take (issue 46, item 3): the weight in int8 with a scale an output channel, each input row
quantized with a scale of its own, MLAS's integer product (onnxruntime's MatMulInteger, both sides as uint8 less
128: its u8u8 kernels sum in 32 bits without the 16-bit saturation of its u8s8 ones, so the sums are exact) and the
scales applied in float32, with its largest error against the float32 product relative to the output's largest
size. One thread, CPU milliseconds (median of --repeats).

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

from nllbcli.model.engine.products import Products, _field, _float_value, _outside

SHAPES = [(256, 256), (256, 1024), (1024, 256), (256, 3208), (1024, 4096)]  # (K, N): the sample model's, 600M's FFN


def by_rows(x: np.ndarray, w: np.ndarray, block_values: int = 1 << 16) -> np.ndarray:
    """x @ w.T as a matrix-vector product a row, a block of w's rows at a time (block_values values: 256 KB)."""
    rows, block = x[:, None, :], max(1, block_values // w.shape[1])
    y = np.empty((len(x), w.shape[0]), np.float32)
    for first in range(0, w.shape[0], block):
        y[:, first : first + block] = (rows @ w[first : first + block].T)[:, 0]
    return y


def int8_model(n: int, k: int) -> bytes:
    """ONNX MatMulInteger y = (x - 128) @ (w - 128), x (M, K) and w (K, N) uint8, y int32."""
    def tensor(name, dims, elem):
        shape = b"".join(_field(1, _field(1, d) if isinstance(d, int) else _field(2, d)) for d in dims)
        return _field(1, name) + _field(2, _field(1, _field(1, elem) + _field(2, shape)))

    node = b"".join(_field(1, name) for name in ("x", "w", "xz", "wz")) + _field(2, "y") + _field(4, "MatMulInteger")
    weight = _outside("w", (k, n)).replace(_field(2, 1), _field(2, 2), 1)  # data type 2: uint8
    graph = (_field(1, node) + _field(2, "int8") + _field(5, weight) + _field(11, tensor("x", ("M", k), 2))
             + _field(11, tensor("xz", (), 2)) + _field(11, tensor("wz", (), 2)) + _field(12, tensor("y", ("M", n), 6)))
    return _field(1, 8) + _field(7, graph) + _field(8, _field(1, "") + _field(2, 13))


def int8_product(w: np.ndarray):
    """x -> x @ w.T through int8 (int8_model), the weight quantized once."""
    import onnxruntime as ort

    w_scale = np.maximum(np.abs(w).max(axis=1), np.float32(1e-30)) / np.float32(127)  # (N,)
    codes = np.ascontiguousarray((np.rint(w / w_scale[:, None]) + 128).astype(np.uint8).T)  # (K, N)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.add_external_initializers(["w"], [ort.OrtValue.ortvalue_from_numpy(codes)])
    session = ort.InferenceSession(int8_model(w.shape[0], w.shape[1]), options, providers=["CPUExecutionProvider"])
    zero = np.array(128, np.uint8)

    def product(x: np.ndarray) -> np.ndarray:
        x_scale = np.maximum(np.abs(x).max(axis=1), np.float32(1e-30)) / np.float32(127)  # (M,)
        q = (np.rint(x / x_scale[:, None]) + 128).astype(np.uint8)
        sums = session.run(None, {"x": q, "xz": zero, "wz": zero})[0]
        return sums.astype(np.float32) * (x_scale[:, None] * w_scale[None, :])

    product.codes = codes  # the session reads them
    return product


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
            mlas, int8 = Products(), int8_product(w)
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
