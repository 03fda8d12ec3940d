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


def _outside(name: str, dims: tuple[int, ...], data_type: int = 1) -> bytes:
    """ONNX TensorProto of an initializer (data_type 1: float32, 2: uint8) whose values the session is given from
    memory (SessionOptions.add_external_initializers), not from the model's bytes."""
    return (b"".join(_field(1, d) for d in dims) + _field(2, data_type) + _field(8, name) + _field(14, 1)
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

    # multiply-adds from which a product's columns are worth sharing among threads: handing a part to another thread
    # costs ~150 us on a 2-core machine, and a float32 product of 4 x 1,024 x 1,024 took 2.5x as long shared, one of
    # 4 x 4,096 x 1,024 0.84x (bench/cpu_spread.py)
    spread_work = 1 << 24

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
                    found = self.sessions[key] = self.make(*part) + (weight, bias)  # ids stay theirs
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

    def make(self, weight: np.ndarray, bias: np.ndarray | None) -> tuple[object, list[np.ndarray]]:
        return make_session(weight, bias)


def session_options(ort):
    """One thread a call, the graph run as written (nothing to fuse: a fusion could change the arithmetic), only
    errors logged."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return options


def make_session(weight: np.ndarray, bias: np.ndarray | None) -> tuple[object, list[np.ndarray]]:
    """A session of gemm_model over weight and bias, and the arrays it reads (kept alive beside it)."""
    import onnxruntime as ort

    weight = np.ascontiguousarray(weight, dtype=np.float32)
    options = session_options(ort)
    arrays = [weight] if bias is None else [weight, np.ascontiguousarray(bias, dtype=np.float32)]
    options.add_external_initializers(["w", "b"][: len(arrays)], [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays])
    model = gemm_model(weight.shape[0], weight.shape[1], bias is not None)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]), arrays


# --compute-type int8 on the CPU: each weight in int8 with a scale an output channel, each input row quantized with
# a scale of its own, MLAS's integer product, the scales applied after; all in one onnxruntime graph.
INT8_GRAPH_OPSET = 13  # ReduceMax with its axes an attribute, Round, MatMulInteger


def _node(op: str, inputs: tuple[str, ...], output: str, **attributes: int) -> bytes:
    """An ONNX NodeProto; integer attributes (type INT) or one list of ints given as a tuple (type INTS)."""
    body = b"".join(_field(1, name) for name in inputs) + _field(2, output) + _field(4, op)
    for name, value in attributes.items():
        if isinstance(value, tuple):
            body += _field(5, _field(1, name) + b"".join(_field(8, v) for v in value) + _field(20, 7))
        else:
            body += _field(5, _field(1, name) + _field(3, value) + _field(20, 2))
    return _field(1, body)


def _scalar(name: str, data_type: int, raw: bytes) -> bytes:
    """An ONNX TensorProto initializer of one value, its bytes given (little-endian)."""
    return _field(5, _field(2, data_type) + _field(8, name) + _field(9, raw))


def int8_model(n: int, k: int, bias: bool) -> bytes:
    """y = (q(x) - 128) @ (w - 128) * x_scale * w_scale (+ b): x (M, K) float32 with M free; w (K, N) uint8 codes
    (int8 values plus 128) and w_scale (1, N), b (N,) float32 initializers. x_scale (M, 1) is each row's largest
    size / 127 (a row of zeros: 1), q(x) its values / x_scale rounded to even, plus 128. MatMulInteger's u8u8
    kernels sum exactly in 32 bits (its u8s8 ones may saturate pairs in 16 bits on AVX2 without VNNI)."""
    import struct

    nodes = (_node("Abs", ("x",), "size") + _node("ReduceMax", ("size",), "top", axes=(1,), keepdims=1)
             + _node("Div", ("top", "c127"), "ratio") + _node("Equal", ("ratio", "zero"), "empty")
             + _node("Where", ("empty", "one", "ratio"), "x_scale")
             + _node("Div", ("x", "x_scale"), "scaled") + _node("Round", ("scaled",), "rounded")
             + _node("Add", ("rounded", "c128"), "shifted") + _node("Cast", ("shifted",), "q", to=2)
             + _node("MatMulInteger", ("q", "w", "z128", "z128"), "sums") + _node("Cast", ("sums",), "wide", to=1)
             + _node("Mul", ("wide", "x_scale"), "rows") + _node("Mul", ("rows", "w_scale"), "y" if not bias else "yb")
             + (_node("Add", ("yb", "b"), "y") if bias else b""))
    f32 = lambda value: struct.pack("<f", value)  # noqa: E731
    initializers = (_field(5, _outside("w", (k, n), data_type=2)) + _field(5, _outside("w_scale", (1, n)))
                    + (_field(5, _outside("b", (n,))) if bias else b"")
                    + _scalar("c127", 1, f32(127.0)) + _scalar("c128", 1, f32(128.0)) + _scalar("zero", 1, f32(0.0))
                    + _scalar("one", 1, f32(1.0)) + _scalar("z128", 2, bytes([128])))
    graph = (nodes + _field(2, "int8_product") + initializers + _field(11, _float_value("x", ("M", k)))
             + _field(12, _float_value("y", ("M", n))))
    return _field(1, 8) + _field(7, graph) + _field(8, _field(1, "") + _field(2, INT8_GRAPH_OPSET))


def quantize_int8(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A weight (N, K) as int8 codes plus 128, (K, N) uint8, and its scales (1, N) float32: each output channel's
    largest size / 127 (a channel of zeros: 1), the values divided by it and rounded to even."""
    weight = np.asarray(weight, dtype=np.float32)
    scale = np.abs(weight).max(axis=1) / np.float32(127)
    scale = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
    codes = (np.rint(weight / scale[:, None]) + np.float32(128)).astype(np.uint8)
    return np.ascontiguousarray(codes.T), scale.reshape(1, -1)


class Int8Products(Products):
    """Products with the weights in int8 (--compute-type int8): int8_model's session a weight (or a part)."""

    # its products take half float32's time or less: sharing 4 x 4,096 x 1,024 took 1.31x as long, 16 x 4,096 x
    # 1,024 0.78x (bench/cpu_spread.py)
    spread_work = 1 << 25

    def make(self, weight: np.ndarray, bias: np.ndarray | None) -> tuple[object, list[np.ndarray]]:
        import onnxruntime as ort

        codes, scale = quantize_int8(weight)
        arrays = [codes, scale] + ([] if bias is None else [np.ascontiguousarray(bias, dtype=np.float32)])
        options = session_options(ort)
        options.add_external_initializers(["w", "w_scale", "b"][: len(arrays)],
                                          [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays])
        model = int8_model(weight.shape[0], weight.shape[1], bias is not None)
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]), arrays
