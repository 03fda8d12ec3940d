"""A chunk's commit: its rows written through the output's sink in input order, the failed ones counted and
recorded (the --errors file, or a line on stderr), and the sinks of a file output and the conversion of its
finished partial file."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa

from ..errors import NllbError
from ..io import Input, Record, open_sink
from ..io.parquet import TableMaker, output_schema
from ..io.streams import compressing
from ..options import Job
from .progress import Counters, Reporter
from .rows import Outcome, flag_names, written_rows
from .state import NamedStream, PartialFile, Saved, converting_path, replaced_atomically

class TableSink:
    """The written rows as one Arrow table of the output's schema (io.parquet.TableMaker, a chunk at a time): the
    sink of a job whose output is a table in memory (the API's translate_table, a --ray block of Parquet)."""

    def __init__(self, schema: pa.Schema, job: Job):
        self.maker = TableMaker(schema, job.added, job.field)
        self.schema = output_schema(schema, job.added)
        self.tables: list[pa.Table] = []

    def write(self, records: list[Record], values: list[dict | None]) -> list[tuple[Record, str]]:
        table, failed = self.maker.table(records, values)
        if table is not None:
            self.tables.append(table)
        return failed

    def table(self) -> pa.Table:
        """Every row written, in order."""
        if not self.tables:
            return self.schema.empty_table()
        return pa.concat_tables(self.tables).select(self.schema.names).cast(self.schema)


def write_chunk(chunk: list[Record], outcomes: list[Outcome], sink, errors: PartialFile | None, job: Job,
                reporter: Reporter) -> None:
    """Write a chunk's rows; count and report the failed ones (the writer may fail a row too)."""
    failed = commit_rows(chunk, outcomes, sink, job, reporter.counters)
    if errors is not None:
        errors.stream.write(b"".join(error_lines(failed, job) + flagged_lines(chunk, outcomes, job)))
    else:
        for record, error in failed:
            reporter.warn(skipped(error))


def skipped(error: str) -> str:
    """The line on stderr of a row left out without an errors file (--on-error skip)."""
    return f"Skipped: {error}"


def commit_rows(chunk: list[Record], outcomes: list[Outcome], sink, job: Job, counters: Counters) -> list[tuple[Record, str]]:
    """Write a chunk's rows through `sink` (`write(records, values) -> failed rows`) and count them into
    `counters`; returns the failed rows with why, in input order. A row the writer fails is failed in `outcomes`
    too; with --on-error fail it raises NllbError."""
    for record, error in sink.write(*written_rows(chunk, outcomes, job.added)):
        if job.on_error == "fail":
            raise NllbError(error)
        outcome = outcomes[next(i for i, r in enumerate(chunk) if r is record)]
        outcome.translation, outcome.error = None, error
    failed = []
    for record, outcome in zip(chunk, outcomes):
        counters.rows += 1
        counters.tokens += outcome.tokens
        if outcome.error is not None:
            counters.failed += 1
            failed.append((record, outcome.error))
        else:
            counters.translated += 1
            counters.sentences += len(outcome.parts)
            counters.cut += outcome.cut
            counters.max_length += outcome.max_length
            counters.flagged += bool(flag_names(outcome))
            for name in outcome.flags:
                setattr(counters, name, getattr(counters, name) + 1)
            counters.retried += outcome.retried
    return failed


def flagged_lines(chunk: list[Record], outcomes: list[Outcome], job: Job) -> list[bytes]:
    """With --on-flag record, each written row that has flags as a line of the errors file, after the chunk's
    failed rows: its number, its flags (a list), its translation and its input, as a failed row's
    (error_line)."""
    if job.on_flag != "record":
        return []
    flagged = [(record, outcome) for record, outcome in zip(chunk, outcomes)
               if outcome.error is None and flag_names(outcome)]
    sources = failed_inputs([record for record, _ in flagged], job)
    return [error_line(record, None, job, source,
                       {"flags": flag_names(outcome) + ["retried"] * outcome.retried, "translation": outcome.translation})
            for (record, outcome), source in zip(flagged, sources)]


def error_lines(failed: list[tuple[Record, str]], job: Job) -> list[bytes]:
    """Each failed row's line in the errors file (error_line), in order."""
    sources = failed_inputs([record for record, _ in failed], job)
    return [error_line(record, error, job, source) for (record, error), source in zip(failed, sources)]


NO_INPUT = object()  # a failed row whose input JSON cannot hold (Parquet columns of one name)


def failed_inputs(records: list[Record], job: Job) -> list:
    """What each failed row was in the input, for the errors file: a text row's line; a JSONL, Parquet or CSV
    row's fields (Python values); a line (or CSV record) that could not be read as a row, its text."""
    from ..io.jsonl import jsonl_fields

    readable = [r for r in records if r.raw is None and job.input_format != "text"]
    try:
        fields = list(jsonl_fields(readable, [""] * len(readable)))
    except NllbError:  # names a JSON object cannot hold each once
        fields = [NO_INPUT] * len(readable)
    fields.reverse()
    return [r.raw if r.raw is not None else (r.text if job.input_format == "text" else fields.pop()) for r in records]


def error_line(record: Record, error: str | None, job: Job, source, flagged: dict | None = None) -> bytes:
    """A failed row's line in the errors file: its number, why it failed, and its input (as JSON can hold it:
    left out where a value cannot be written, a Parquet NaN say), so that it can be fixed and run again. A
    flagged row's (flagged_lines): its flags and translation in place of the error."""
    from ..io.jsonl import Unwritable, strict_json

    head = json.dumps({"row": record.index + 1, **(flagged or {"error": error})}, ensure_ascii=False)
    if source is NO_INPUT:
        return (head + "\n").encode("utf-8", "backslashreplace")
    try:
        line = head[:-1] + ', "input": ' + strict_json(source) + "}"
    except (Unwritable, RecursionError):
        line = head
    return (line + "\n").encode("utf-8", "backslashreplace")


def open_frames(output: PartialFile, job: Job, source: Input, saved: Saved | None):
    """The sink of a file output: lines straight into the partial file, Parquet as frames (io/parquet.py); a
    resumed CSV or TSV output goes on under the header its partial file holds."""
    from ..io import delimited, parquet

    if job.output_format in delimited.FORMATS:
        sink = open_sink(output.stream, job.output_format, job.added, source.schema, job.field, source.bom)
        if saved is not None and saved.output_bytes > 0:
            output.stream.flush()
            sink.resume(output.partial)
        return sink
    if job.output_format != "parquet":  # a PO output's frames too (io/po.py): written whole by finish_converter
        return open_sink(output.stream, job.output_format, job.added, None, job.field)
    sink = parquet.FrameSink(output.stream, source.schema, job.added, job.field)
    if saved is not None:
        output.stream.flush()
        sink.resume(output.partial)
    return sink


def finish_converter(job: Job, source: Input):
    """How a finished partial file becomes OUTPUT when it is not simply renamed: Parquet written from its frames,
    a PO catalogue from its input's and the frames' translations, and a .gz or .zst output compressed (the
    partial file is written plain, so that --resume can cut it back to a commit); None when a rename does."""
    from ..io import file_mode, parquet, po

    if job.output_format not in ("parquet", "po") and job.output_compression is None:
        return None

    def convert(partial: str, path: str) -> None:
        """Write the file beside `path` under a fixed name, then rename it into place. The name is fixed, not
        random, so a conversion killed half-way leaves nothing that the next run does not replace."""
        with replaced_atomically(path, converting_path(path), file_mode(path)) as raw:
            target = NamedStream(raw, path)
            with compressing(target, job.output_compression) as sink:
                if job.output_format == "parquet":
                    parquet.frames_to_parquet(partial, sink, source.schema, job.added, job.field)
                elif job.output_format == "po":
                    with open(partial, "rb") as frames:
                        sink.write(po.fill_catalogue(source.document, frames))
                else:
                    with open(partial, "rb") as lines:
                        shutil.copyfileobj(lines, sink, 1 << 20)

    return convert
