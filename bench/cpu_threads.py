"""What `--threads` (the CPU engine's product threads: the BLAS limit a job sets through threadpoolctl, which the
engine spreads its one-thread BLAS products over, engine/reference.ProductThreads) does to it, alone on the machine
and beside processes that spin on cores of their own (another job sharing the machine). JSON lines: one per run,
seconds of Translator.generate over the same sources, in the same process for every setting.

    python -m bench.cpu_threads [--model data/samples/model] [--rows 300] [--beam-size 4] [--threads 1,2,0]
                                [--loads 0,1] [--repeats 3]

--threads 0 is the BLAS library's own count (one per core), which the engine takes as its threads; --loads counts
the spinning processes. The sample model's 300 rows at beam 4 take ~5 s a run on a 2-core machine, about 2-3
minutes for the defaults.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from threadpoolctl import threadpool_info, threadpool_limits

from nllbcli.options import DecodeOptions
from nllbcli.job.chunks import plan_batches
from nllbcli.model.translator import load_translator

HELDOUT = ROOT / "data" / "samples" / "heldout" / "eng_Latn.txt"


def spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "data" / "samples" / "model"))
    parser.add_argument("--rows", type=int, default=300, help="held-out English lines, repeated as needed")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=200)
    parser.add_argument("--max-batch-tokens", type=int, default=4096)
    parser.add_argument("--threads", default="1,2,0", help="BLAS threads to try; 0: the library's own")
    parser.add_argument("--loads", default="0,1", help="spinning processes beside the job")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    translator = load_translator(args.model, "cpu")
    lines = HELDOUT.read_text(encoding="utf-8").splitlines()
    sources = [translator.tokenizer.encode(lines[i % len(lines)], "eng_Latn") for i in range(args.rows)]
    batches = plan_batches(dict(enumerate(map(len, sources))), args.max_batch_tokens)
    options = DecodeOptions(args.beam_size, args.max_length)
    blas = [(i["internal_api"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"]
    print(json.dumps({"cores": os.cpu_count(), "blas": blas, "rows": args.rows, "batches": len(batches),
                      "beam_size": args.beam_size, "model": args.model}), flush=True)
    for load in map(int, args.loads.split(",")):
        spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(load)]
        for process in spinners:
            process.start()
        try:
            for repeat in range(args.repeats):
                for threads in map(int, args.threads.split(",")):
                    with threadpool_limits(limits=threads or None, user_api="blas"):
                        start = time.perf_counter()
                        for batch in batches:
                            translator.generate([sources[i] for i in batch], "fra_Latn", options)
                        seconds = time.perf_counter() - start
                    print(json.dumps({"load": load, "threads": threads or "default", "repeat": repeat,
                                      "seconds": round(seconds, 2)}), flush=True)
        finally:
            for process in spinners:
                process.terminate()


if __name__ == "__main__":
    main()
