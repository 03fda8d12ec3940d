"""How far FP8 (--compute-type float8, --kv-cache-type float8, or both: --variant) moves the logits from bf16's at a
published shape (default NLLB-600M), on the CPU reference engine, which computes as each GPU engine does (bf16
weights, GEMM inputs and K/V rounded to bf16: bf16_activations; for FP8 products, every matrix in E4M3 with a scale
an output channel and each product's input in E4M3 with a scale a row; for the FP8 cache, every K and V kept in
E4M3 with a scale a row and head): random weights of standard deviation 0.02 (bench.harness.normal_weights),
sources of random pieces, teacher-forced steps of random tokens. Prints per step the largest difference of a logit
as a fraction of the largest logit, the mean difference as a fraction of the logits' mean size, and how many rows'
top token is the same.

    python -m bench.fp8_logits [--preset nllb-200-distilled-600M] [--sources 8] [--steps 6] [--variant fp8|kv8|fp8kv8]
    # a few minutes
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from bench.fp8_quality import VARIANTS
from bench.harness import normal_weights, workload
from nllbcli.model.engine.reference import ReferenceEngine, bf16_round
from nllbcli.model.shapes import DEFAULT, PRESETS
from nllbcli.model.translator import quantize_matrices


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default=DEFAULT, choices=sorted(PRESETS))
    parser.add_argument("--sources", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="fp8",
                        help="FP8 products (fp8), the FP8 K/V cache (kv8), or both (fp8kv8), against bf16")
    args = parser.parse_args()
    products, cache = VARIANTS[args.variant]
    preset = PRESETS[args.preset]
    config = preset.config
    weights = {name: bf16_round(w) for name, w in normal_weights(config).items()}
    engines = {"bf16": ReferenceEngine(config, weights, bf16_activations=True),
               "fp8": ReferenceEngine(config, quantize_matrices(weights) if products else weights, bf16_activations=True,
                                      kv_float8=cache)}
    sources = workload(args.sources, preset, seed=3)
    rows = np.arange(len(sources))
    rng = np.random.default_rng(4)
    tokens = [np.full(len(rows), config.decoder_start_token_id)] + [
        rng.integers(4, min(250000, preset.pieces), len(rows)) for _ in range(args.steps - 1)]
    logits = {}
    for name, engine in engines.items():
        encoded = engine.encode(sources)
        state = engine.start(encoded, rows, args.steps + 1)
        logits[name] = [engine.step(encoded, state, t) for t in tokens]
    for step, (plain, fp8) in enumerate(zip(logits["bf16"], logits["fp8"])):
        difference = np.abs(fp8 - plain)
        print(json.dumps({"step": step, "largest_error_of_largest_logit": float(difference.max() / np.abs(plain).max()),
                          "mean_error_of_mean_logit": float(difference.mean() / np.abs(plain).mean()),
                          "same_top_token": int((fp8.argmax(1) == plain.argmax(1)).sum()), "rows": len(rows)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
