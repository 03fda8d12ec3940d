"""Peak memory does not grow with the input: JSONL and Parquet are streamed, chunk by chunk, to a file output.

Each job runs in a subprocess with the fake translator of conftest.py (the model is not what is measured), once on
an input and once on one ten times larger; the peak resident memory may differ by little."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

HERE = Path(__file__).parent
SCRIPT = """
import resource, sys
sys.path.insert(0, {tests!r})
from fakes import FakeTranslator
import nllbcli.cli as cli
translator = FakeTranslator()
translator.generate = lambda sources, tgt, options: [ids[1:-1][::-1] for ids in sources]  # keeps no history
cli.load_model = lambda model, device: translator
cli.load_tokenizer = lambda model: translator.tokenizer
try:
    cli.main()
finally:
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""
ROW = "The red car is in the garden on Monday. It was there on Tuesday too, number {}."


def make_input(path: Path, fmt: str, rows: int) -> None:
    if fmt == "jsonl":
        with path.open("w") as stream:
            for i in range(rows):
                stream.write(json.dumps({"id": i, "text": ROW.format(i), "meta": {"k": [i, i + 1]}}) + "\n")
    else:
        with pq.ParquetWriter(path, pa.schema([("id", pa.int64()), ("text", pa.string())])) as writer:
            for start in range(0, rows, 5000):
                ids = list(range(start, min(rows, start + 5000)))
                writer.write_table(pa.table({"id": ids, "text": [ROW.format(i) for i in ids]}), row_group_size=1000)


def peak_kib(tmp_path: Path, fmt: str, rows: int) -> int:
    source, target = tmp_path / f"in-{rows}.{fmt}", tmp_path / f"out-{rows}.{fmt}"
    make_input(source, fmt, rows)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tests=str(HERE)), "translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn",
         "--chunk-rows", "1000", str(source), str(target)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert (pq.read_metadata(target).num_rows if fmt == "parquet" else sum(1 for _ in target.open())) == rows
    return int(result.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_peak_memory_does_not_grow_with_the_input(tmp_path, fmt):
    small = peak_kib(tmp_path, fmt, 8_000)
    large = peak_kib(tmp_path, fmt, 80_000)  # ~7 MB of text: held whole, it would take ~60 MB as Python rows
    assert large - small < 20 * 1024, (small, large)
