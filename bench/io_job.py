"""What reading and writing cost per pair of formats, over 100k rows of mixed columns (Parquet->Parquet,
JSONL->JSONL, Parquet->JSONL, JSONL->Parquet): a whole job with the tests' fake translator (which reverses each
text, so that the model costs nothing), then the reader alone and the writer alone. A Parquet row's columns
become Python values when the writer needs them, so compare readers and writers together across versions.
Prints rows/s, the best of --repeat runs. A few minutes.

    python -m bench.io_job [--rows 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import FakeTranslator  # the tests' stand-in model (run from the repository root)

from nllbcli.io import Added, open_input, open_sink
from nllbcli.options import BatchOptions
from nllbcli.options import Job
from nllbcli.job.loop import translate_file

WORDS = "the red car is in garden on monday it was there tuesday too number of my uncle went to rome friday".split()


def make_rows(n: int) -> list[dict]:
    start = datetime.datetime(2024, 5, 1, tzinfo=datetime.timezone.utc)
    return [{"id": i, "text": " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(8 + i % 20)).capitalize() + ".",
             "score": i / 7, "tags": ["a", "b"][: i % 3], "when": start + datetime.timedelta(seconds=i),
             "meta": {"source": "web", "len": i % 50}} for i in range(n)]


def write_inputs(directory: Path, rows: list[dict]) -> None:
    pq.write_table(pa.Table.from_pylist(rows), directory / "in.parquet", row_group_size=16384)
    with open(directory / "in.jsonl", "w") as stream:
        for row in rows:
            stream.write(json.dumps({**row, "when": row["when"].isoformat()}) + "\n")


def time_job(directory: Path, source: str, target: str) -> float:
    job = Job("eng_Latn", "fra_Latn", input=str(directory / source), output=str(directory / target),
              input_format=source.split(".")[1], output_format=target.split(".")[1])
    start = time.perf_counter()
    translate_file(FakeTranslator(), job, batching=BatchOptions(read_chunk_rows=2048))
    return time.perf_counter() - start


def time_io(directory: Path, source: str, fmt: str) -> tuple[float, float]:
    """The reader alone, then the sink alone: every chunk of the input, translated as its own text, into
    /dev/null."""
    with open_input(str(directory / source), source.split(".")[1], "text") as opened, open("/dev/null", "wb") as null:
        start = time.perf_counter()
        records = list(opened.records)
        for record in records:
            record.fields.get("tgt_lang")  # as the pipeline asks
        read = time.perf_counter() - start
        sink = open_sink(null, fmt, Added("translation"), opened.schema, "text")
        start = time.perf_counter()
        for first in range(0, len(records), 2048):
            chunk = records[first:first + 2048]
            sink.write(chunk, [{"translation": r.text} for r in chunk])
        sink.close()
        return read, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        directory = Path(work)
        write_inputs(directory, make_rows(args.rows))
        for source, target in (("in.parquet", "out.parquet"), ("in.jsonl", "out.jsonl"), ("in.parquet", "out.jsonl"), ("in.jsonl", "out.parquet")):
            job = min(time_job(directory, source, target) for _ in range(args.repeat))
            timings = [time_io(directory, source, target.split(".")[1]) for _ in range(args.repeat)]
            read, write = min(t[0] for t in timings), min(t[1] for t in timings)
            print(f"{source} -> {target}: job {args.rows / job:,.0f} rows/s; reading {args.rows / read:,.0f} rows/s, "
                  f"writing {args.rows / write:,.0f} rows/s, both {args.rows / (read + write):,.0f} rows/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
