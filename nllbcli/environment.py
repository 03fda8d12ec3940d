"""Every NLLB_* environment variable the package reads, read here, once, when the package first needs one:
docs/ENVIRONMENT.md says what each does. The modules keep what they read as their own switches
(`kernels.TMA_STORE = ENV.tma_store`), which a test may set. The two that name a command's options
(NLLB_MODEL for -m/--model, NLLB_THREADS for --threads) are read by click with the command line; both are read
here too, for nllbcli.load.

All but NLLB_MODEL and NLLB_THREADS are for measuring the GPU engine and the job: they change speed, never a
translation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Environment:
    model: str | None = None  # NLLB_MODEL: the model nllbcli.load takes when it is given none
    threads: int | None = None  # NLLB_THREADS: the CPU engine's BLAS threads nllbcli.load takes when given none
    cuda_graphs: bool = True  # NLLB_CUDA_GRAPHS=0: the decoder step's kernels launched one by one, not as a graph
    pdl: bool = True  # NLLB_PDL=0: CuPy's plain launches instead of programmatic dependent launches
    step_halves: int = 0  # NLLB_STEP_HALVES: 1 a decoder step of many rows as two halves on two streams, 2 staggered
    gemm_sms: int | None = None  # NLLB_GEMM_SMS: the SMs a halved step's GEMMs take (None: all)
    tma_store: bool = True  # NLLB_TMA_STORE=0: Hopper GEMM results stored from the registers, not through TMA
    no_wgmma: bool = False  # NLLB_NO_WGMMA=1: Hopper runs gemm.cu's mma.sync GEMMs instead of gemm_sm90.cu's wgmma
    exact_math: bool = False  # NLLB_EXACT_MATH=1: kernels compiled without --use_fast_math
    ahead: int = 2  # NLLB_AHEAD: greedy steps queued past the one whose ids the host waits for
    finisher: bool = True  # NLLB_FINISHER=0: decoding, writing and committing on the main thread
    switch_interval: float = 0.0005  # NLLB_SWITCH_INTERVAL: seconds a thread may hold the GIL while another waits
    python_gc: bool = False  # NLLB_GC=python: Python's own collector settings while a job runs


def read(environ: Mapping[str, str] = os.environ) -> Environment:
    """The variables as set in `environ`; each unset one at its default."""
    defaults = Environment()
    on = lambda name, default: environ.get(name, "1" if default else "0") == "1"  # noqa: E731 - only "1" is on
    ahead, threads = environ.get("NLLB_AHEAD", ""), environ.get("NLLB_THREADS", "").strip()
    gemm_sms, halves = environ.get("NLLB_GEMM_SMS", "").strip(), environ.get("NLLB_STEP_HALVES", "")
    return Environment(
        model=environ.get("NLLB_MODEL") or None,
        threads=int(threads) if threads.isdigit() and int(threads) > 0 else None,
        cuda_graphs=on("NLLB_CUDA_GRAPHS", defaults.cuda_graphs),
        pdl=on("NLLB_PDL", defaults.pdl),
        step_halves=int(halves) if halves in ("1", "2") else defaults.step_halves,
        gemm_sms=int(gemm_sms) if gemm_sms.isdigit() and int(gemm_sms) > 0 else None,
        tma_store=on("NLLB_TMA_STORE", defaults.tma_store),
        no_wgmma=on("NLLB_NO_WGMMA", defaults.no_wgmma),
        exact_math=on("NLLB_EXACT_MATH", defaults.exact_math),
        ahead=int(ahead) if ahead.isdigit() else defaults.ahead,
        finisher=on("NLLB_FINISHER", defaults.finisher),
        switch_interval=float(environ.get("NLLB_SWITCH_INTERVAL", defaults.switch_interval)),
        python_gc=environ.get("NLLB_GC") == "python",
    )


ENV = read()
