"""A decoder's layer GEMMs as a decode step runs them, against cuBLAS run the way a step could run it.

    python -m bench.micro.layer_gemms [--rows 64,256,1024,4096] [--layers 12] [--preset nllb-200-3.3B] [--out results.jsonl]

Three ways of timing the same GEMMs, side by side, in one run:
- kernels alone: queued behind a spin kernel, back to back, so that no host time is in them; each kind of GEMM
  with every layer's weights in turn (from HBM, as in a step), where bench/micro/gemm_variants.py repeats one
  weight matrix (left in L2 by the call before: ours at 81-101% of cuBLAS's there). Against
  cuBLAS three ways: its bare product into bf16 (less work than ours: no bias, ReLU or residual); onto the f32
  residual with beta 1 (no bias); and its bf16 product followed by the epilogue kernel doing the rest of our
  work (bias and ReLU, or bias and the add onto the residual), which is what fusing replaces.
- a single call, as the issue's and FACTS.md's cuBLAS figures were taken ("1,024 x 1,024 x 3,072 takes
  0.10 ms"): CUDA events around one call from an idle GPU, the host's launch inside; median of 20.
- a step's stack: `layers` decoder layers' four GEMMs (QKV; attention out onto the f32 residual; FFN1 with its
  bias and ReLU; FFN2 onto the residual), each layer its own weights, from the first launch to the last
  kernel's end (events, no spin kernel: the host's launches count, as in a step):
  - `cublas`: `cupy.matmul` into bf16, no bias (less work than ours), launched one by one: cuBLAS cannot be
    captured into a CUDA graph (FACTS.md), so a decode step would launch it so;
  - `cublas+epilogue`: the same with the bias, ReLU and the add onto the residual as a kernel after each;
  - `ours eager`: the engine's kernels.gemm, launched one by one (programmatic dependents, launch.py);
  - `ours graph`: the same launches captured once into a CUDA graph and replayed, as the engine's step runs.
A JSON line a row count: microseconds a stack and TFLOP/s, and a line a GEMM for its single call.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy as cp
import numpy as np

from bench.micro.engine_bench import hold_gpu
from bench.micro.gemm_variants import cublas_library, cublas_onto_residual, epilogue
from nllbcli.model.engine import kernels
from nllbcli.model.shapes import DEFAULT, PRESETS


def layer_gemms(preset: str) -> tuple:
    """A decoder layer's four GEMMs at the preset's widths: (name, K, N) each."""
    config = PRESETS[preset].config
    d, ffn = config.d_model, config.decoder_ffn_dim
    return ("QKV", d, 3 * d), ("attention out", d, d), ("FFN1", d, ffn), ("FFN2", ffn, d)


def wall(fn, repeat: int = 20, hold: float = 0.0) -> float:
    """Median seconds of fn() by CUDA events. hold 0: from an idle GPU to fn()'s last kernel's end, the host's
    launches inside. hold > 0: its kernels alone, queued behind a spin kernel of `hold` seconds (longer than the
    host takes to queue them all), so neither the host's launches nor their gaps are in the time."""
    fn(), fn()
    times = []
    for _ in range(repeat):
        cp.cuda.get_current_stream().synchronize()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        if hold:
            hold_gpu(hold)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1000)
    return float(np.median(times))


def behind(fn, hold: float) -> float:
    return wall(fn, repeat=10, hold=hold)


def cublas_gemm(what: str, a, w, bias, y, residual, with_epilogue: bool) -> None:
    """cuBLAS's product into bf16 y; with_epilogue: then the rest of our GEMM's work as a kernel (bias and ReLU,
    or bias and the add onto the residual), what fusing replaces."""
    cp.matmul(a, w.T, out=y)
    if with_epilogue and what in ("attention out", "FFN2"):
        epilogue("onto_residual", y, bias, residual)
    elif with_epilogue:
        epilogue("bias_relu", y, bias, y, np.int32(what == "FFN1"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="64,256,1024,4096")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--preset", default=DEFAULT, choices=sorted(PRESETS), help="the layers' widths")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--staging-div", type=int, help="kernels.STORE_OPTIONS's STAGING_DIV (default: its own)")
    args = parser.parse_args()
    if args.staging_div:
        kernels.STORE_OPTIONS["STAGING_DIV"] = args.staging_div
    if not kernels.wgmma_available():
        raise SystemExit("needs a Hopper GPU (the engine's wgmma GEMMs)")
    stream = cp.cuda.Stream(non_blocking=True)  # programmatic launches and captures want a stream of their own
    with stream:
        lines = measure(args, stream)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


def measure(args, stream) -> list[str]:
    GEMMS = layer_gemms(args.preset)
    D, FFN = GEMMS[0][1], GEMMS[3][1]
    rng = cp.random.default_rng(0)
    weights = [[(rng.standard_normal((n, k), dtype=cp.float32) * 0.02).astype(kernels.BF16),
                rng.standard_normal(n, dtype=cp.float32) * 0.1] for _ in range(args.layers) for _, k, n in GEMMS]
    cp.cuda.Device().synchronize()  # settled before a GEMM loads them early (kernels.gemm's weights=True)
    lines = []
    for m in map(int, args.rows.split(",")):
        x = rng.standard_normal((m, D), dtype=cp.float32).astype(kernels.BF16)  # QKV's, attention out's, FFN1's input
        h = rng.standard_normal((m, FFN), dtype=cp.float32).clip(0, None).astype(kernels.BF16)  # FFN2's
        residual = rng.standard_normal((m, D), dtype=cp.float32)
        outs = {n: cp.empty((m, n), dtype=kernels.BF16) for _, _, n in GEMMS}
        inputs = {"QKV": x, "attention out": x, "FFN1": x, "FFN2": h}
        flops = 2 * m * sum(k * n for _, k, n in GEMMS) * args.layers

        def ours():
            for i, (w, b) in enumerate(weights):
                what = GEMMS[i % 4][0]
                if what in ("attention out", "FFN2"):
                    kernels.gemm(inputs[what], w, bias=b, residual=residual, out=residual, weights=True)
                else:
                    kernels.gemm(inputs[what], w, bias=b, relu=what == "FFN1", out=outs[w.shape[0]], weights=True)

        def cublas(with_epilogue: bool):
            for i, (w, b) in enumerate(weights):
                what = GEMMS[i % 4][0]
                cublas_gemm(what, inputs[what], w, b, outs[w.shape[0]], residual, with_epilogue)

        hold = 2e-3 + 150e-6 * len(weights)  # over the host's time to queue them (~40 us a launch)
        ours(), ours()  # compiled, tensor maps made: nothing is made inside the capture
        stream.begin_capture()
        ours()
        graph = stream.end_capture()
        stack = {"cublas": wall(lambda: cublas(False)), "cublas+epilogue": wall(lambda: cublas(True)),
                 "ours eager": wall(ours), "ours graph": wall(lambda: graph.launch(stream)),
                 "cublas kernels alone": behind(lambda: cublas(False), hold),
                 "ours kernels alone": behind(ours, hold)}
        row = {"what": f"{args.layers} layers' GEMMs, {m:,} rows", "us": {k: round(v * 1e6, 1) for k, v in stack.items()},
               "tflops": {k: round(flops / v / 1e12, 1) for k, v in stack.items()},
               "ours graph / cublas": round(stack["cublas"] / stack["ours graph"], 3),
               "ours graph / cublas+epilogue": round(stack["cublas+epilogue"] / stack["ours graph"], 3),
               "ours eager / cublas": round(stack["cublas"] / stack["ours eager"], 3)}
        lines.append(json.dumps(row))
        print(lines[-1], flush=True)
        for j, (what, k, n) in enumerate(GEMMS):  # one kind, every layer's weights, back to back (as in a step:
            kind = weights[j::4]                    # the weights from HBM, not left in L2 by the last call)
            a, y, onto = inputs[what], outs[n], what in ("attention out", "FFN2")

            def ours_kind():
                for w, b in kind:
                    if onto:
                        kernels.gemm(a, w, bias=b, residual=residual, out=residual, weights=True)
                    else:
                        kernels.gemm(a, w, bias=b, relu=what == "FFN1", out=y, weights=True)

            secs = {"cublas": behind(lambda: [cp.matmul(a, w.T, out=y) for w, _ in kind], hold),
                    "ours": behind(ours_kind, hold),
                    "cublas+epilogue": behind(lambda: [cublas_gemm(what, a, w, b, y, residual, True) for w, b in kind],
                                              hold)}
            if onto and cublas_library() is not None:
                secs["cublas f32+residual"] = behind(lambda: [cublas_onto_residual(a, w, residual) for w, _ in kind], hold)
            row = {"what": f"kernels alone, {args.layers} layers' {what}, {m:,} rows", "shape": [m, k, n],
                   "tflops": {key: round(2 * m * k * n * len(kind) / v / 1e12, 1) for key, v in secs.items()},
                   "ours / cublas": round(secs["cublas"] / secs["ours"], 3),
                   "ours / cublas+epilogue": round(secs["cublas+epilogue"] / secs["ours"], 3)}
            if "cublas f32+residual" in secs:
                row["ours / cublas f32+residual"] = round(secs["cublas f32+residual"] / secs["ours"], 3)
            lines.append(json.dumps(row))
            print(lines[-1], flush=True)
        for what, k, n in GEMMS:  # each GEMM alone, a single call (the first layer's weights)
            w, b = weights[[g[0] for g in GEMMS].index(what)]
            a, y = inputs[what], outs[n]
            onto = what in ("attention out", "FFN2")
            one = {"cublas": wall(lambda: cp.matmul(a, w.T, out=y)),
                   "ours": wall(lambda: kernels.gemm(a, w, bias=b, residual=residual, out=residual, weights=True) if onto
                                else kernels.gemm(a, w, bias=b, relu=what == "FFN1", out=y, weights=True))}
            row = {"what": f"single call: {what}, {m:,} rows", "shape": [m, k, n],
                   "us": {key: round(v * 1e6, 1) for key, v in one.items()},
                   "tflops": {key: round(2 * m * k * n / v / 1e12, 1) for key, v in one.items()}}
            lines.append(json.dumps(row))
            print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    sys.exit(main())
