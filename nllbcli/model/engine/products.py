"""The CPU engine's matrix products, x @ weight.T + bias, by onnxruntime's MLAS on each weight packed once.

A row's result must not depend on the rows beside it (reference.py's batch invariance). OpenBLAS's GEMM changes a
row's last bits with the number of rows in the call and the row's place among them (bench/cpu_products.py), and a
matrix-vector product a row, which keeps them, runs at a third of a GEMM's speed. MLAS (onnxruntime's own linear
algebra, in its CPU wheel) multiplies by a weight it packed when the session was made: the packing cuts K in
fixed strides, and its kernels sum each output's terms of a stride in one order, one row at a time of the
vector registers, whatever the number of rows (a last row or column is masked, not summed otherwise). So a row's
bits are those of the row alone, at a GEMM's speed. tests/test_products.py holds it to that on the engine's
shapes, and bench/cpu_products.py measures it beside OpenBLAS.

One session a weight, made when the weight is first multiplied by; onnxruntime reads the weight where NumPy keeps
it (an external initializer) and packs it into its own memory. Each call runs on one thread: the engine shares a
product's output columns among its threads itself (reference.ProductThreads), each a session of its part of the
weight, whose sums are those of the whole weight (the packing's strides are those of K alone), so that the result
never follows the number of threads either, and each thread reads only its part of the weight.
"""

from __future__ import annotations

import threading

import numpy as np

GRAPH_OPSET = 13  # Gemm with an optional C input: opset 11 and later


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: int | bytes | str) -> bytes:
    """One protobuf field: a varint for an int, length-delimited bytes otherwise."""
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _float_value(name: str, dims: tuple[int | str, ...]) -> bytes:
    """ONNX ValueInfoProto of a float tensor (int dims fixed, str dims named)."""
    shape = b"".join(_field(1, _field(1, d) if isinstance(d, int) else _field(2, d)) for d in dims)
    return _field(1, name) + _field(2, _field(1, _field(1, 1) + _field(2, shape)))


def _outside(name: str, dims: tuple[int, ...]) -> bytes:
    """ONNX TensorProto of a float initializer whose values the session is given from memory
    (SessionOptions.add_external_initializers), not from the model's bytes."""
    return (b"".join(_field(1, d) for d in dims) + _field(2, 1) + _field(8, name) + _field(14, 1)
            + _field(13, _field(1, "location") + _field(2, f"{name}.bin")))


def gemm_model(n: int, k: int, bias: bool) -> bytes:
    """An ONNX model of one Gemm node, y = x @ w.T (+ b), x (M, K) with M free, w (N, K) and b (N,) initializers.
    Written as protobuf bytes here: the onnx package is not needed for one node."""
    attribute = _field(1, "transB") + _field(3, 1) + _field(20, 2)  # AttributeProto: name, i, type INT
    inputs = ("x", "w", "b") if bias else ("x", "w")
    node = b"".join(_field(1, name) for name in inputs) + _field(2, "y") + _field(4, "Gemm") + _field(5, attribute)
    graph = (_field(1, node) + _field(2, "product") + _field(5, _outside("w", (n, k)))
             + (_field(5, _outside("b", (n,))) if bias else b"")
             + _field(11, _float_value("x", ("M", k))) + _field(12, _float_value("y", ("M", n))))
    return _field(1, 8) + _field(7, graph) + _field(8, _field(1, "") + _field(2, GRAPH_OPSET))


class Products:
    """x @ weight.T + bias for the weights of one model, each by a session made at its first product (one a part,
    where a product's columns are shared among threads)."""

    def __init__(self):
        self.sessions: dict[tuple, tuple] = {}  # (session, what it reads, weight, bias)
        self.lock = threading.Lock()

    def session(self, weight: np.ndarray, bias: np.ndarray | None, columns: slice):
        key = (id(weight), None if bias is None else id(bias), columns.start, columns.stop)
        found = self.sessions.get(key)
        if found is None:
            with self.lock:
                found = self.sessions.get(key)
                if found is None:
                    part = weight[columns], None if bias is None else bias[columns]
                    found = self.sessions[key] = make_session(*part) + (weight, bias)  # ids stay theirs
        return found[0]

    def __call__(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
                 columns: slice | None = None) -> np.ndarray:
        """x (..., K) @ weight (N, K).T + bias (N,), on the calling thread; with `columns`, those output columns
        alone (weight's rows: a part packed on its own, whose sums are the whole product's, bit for bit)."""
        columns = columns or slice(0, weight.shape[0])
        rows = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
        n = columns.stop - columns.start
        if rows.shape[0] == 0:
            return np.zeros(x.shape[:-1] + (n,), np.float32)
        y = self.session(weight, bias, columns).run(None, {"x": rows})[0]
        return y.reshape(x.shape[:-1] + (n,))


def make_session(weight: np.ndarray, bias: np.ndarray | None) -> tuple[object, list[np.ndarray]]:
    """A session of gemm_model over weight and bias, and the arrays it reads (kept alive beside it)."""
    import onnxruntime as ort

    weight = np.ascontiguousarray(weight, dtype=np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # one node: nothing to fuse
    options.log_severity_level = 3  # errors only
    arrays = [weight] if bias is None else [weight, np.ascontiguousarray(bias, dtype=np.float32)]
    options.add_external_initializers(["w", "b"][: len(arrays)], [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays])
    model = gemm_model(weight.shape[0], weight.shape[1], bias is not None)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]), arrays
