"""What sharing a product's output columns between 2 threads gains at the 600M shape's products and few rows (a CPU
beam's 4 to 16): reference.linear on the calling thread, then with a Spread of 2 threads (each a session of its
columns, as the engine's ProductThreads hand them out), float32 and --compute-type int8, microseconds a product
(mean of many). Below the break-even, handing a part to the other thread costs more than the part.

    .venv/bin/python -m bench.cpu_spread            # about a minute on 2 cores (the output projection's packing)
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from nllbcli.model.engine.products import Int8Products, Products
from nllbcli.model.engine.reference import ALONE, Spread, linear

SHAPES = {"1,024 x 1,024 (attention)": (1024, 1024), "4,096 x 1,024 (fc1)": (4096, 1024),
          "256,206 x 1,024 (output projection)": (256206, 1024)}  # (N, K)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="4,16")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    pool = ThreadPoolExecutor(2)
    two = Spread(2, pool.map)
    print("| product | compute | rows | one thread, us | 2 threads, us | 2 / 1 |\n|---|---|---|---|---|---|")
    for name, (n, k) in SHAPES.items():
        weight = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        for kind, products in (("float32", Products()), ("int8", Int8Products())):
            for rows in map(int, args.rows.split(",")):
                x = rng.standard_normal((rows, 1, k)).astype(np.float32)
                for spread in (ALONE, two):  # the sessions made and packed before timing
                    linear(x, weight, None, products, spread)
                repeats = 5 if n * k > 1 << 26 else 300
                times = []
                for spread in (ALONE, two):
                    start = time.perf_counter()
                    for _ in range(repeats):
                        linear(x, weight, None, products, spread)
                    times.append((time.perf_counter() - start) / repeats * 1e6)
                print(f"| {name} | {kind} | {rows} | {times[0]:,.0f} | {times[1]:,.0f} | {times[1] / times[0]:.2f} |",
                      flush=True)
    pool.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
