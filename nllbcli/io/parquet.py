"""Parquet: rows are read batch by batch (row group by row group); the output is the input's schema plus a string
column, written one row group per chunk as the translation goes.

Files are written in two steps so that a killed job can go on (--resume): each chunk is appended to a partial
file as an Arrow IPC stream behind its length (`frame`), and at the end the frames become the row groups of the
Parquet file. A Parquet file cannot be appended to once its writer is gone; the frames can."""

from __future__ import annotations

import io
from typing import BinaryIO, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import NllbError
from . import Input, Position, Record, record_of

READ_BATCH_ROWS = 1024  # rows decoded from Parquet at a time
FRAME_HEADER = 8  # bytes of the little-endian length before each frame


def open_parquet(source: str, name: str, field: str, start: Position, identity: dict) -> Input:
    """Open a Parquet file and check its text column before any row is read."""
    try:
        parquet = pq.ParquetFile(source)
    except (pa.ArrowException, OSError) as error:
        raise NllbError(f"{name}: cannot read it as Parquet: {error}") from None
    schema = parquet.schema_arrow
    if field not in schema.names:
        raise NllbError(f"{name}: no column {field!r} to translate (columns: {', '.join(schema.names) or 'none'}); name the text column with --field.")
    kind = schema.field(field).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise NllbError(f"{name}: column {field!r} is {kind}, not a string.")
    return Input(read_parquet(parquet, name, field, start), parquet.metadata.num_rows, schema, start, identity)


def read_parquet(parquet: pq.ParquetFile, name: str, field: str, position: Position) -> Iterator[Record]:
    """Rows from `position.rows` on: the row groups before it are not read at all."""
    first_group, skip = 0, position.rows
    while first_group < parquet.num_row_groups and skip >= parquet.metadata.row_group(first_group).num_rows:
        skip -= parquet.metadata.row_group(first_group).num_rows
        first_group += 1
    groups = list(range(first_group, parquet.num_row_groups))
    batches = parquet.iter_batches(batch_size=READ_BATCH_ROWS, row_groups=groups) if groups else iter(())
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as error:
            raise NllbError(f"{name}: cannot read rows after row {position.rows}: {error}") from None
        if batch is None:
            return
        if skip:
            batch, skip = batch.slice(min(skip, batch.num_rows)), skip - min(skip, batch.num_rows)
        for fields, error in rows_of(batch):
            position.rows += 1
            where = f"{name}: row {position.rows}"
            if error:
                yield Record(position.rows - 1, "", {}, f"{where}: cannot read it: {error}", where)
            else:
                yield record_of(position.rows - 1, fields, field, where)


def rows_of(batch: pa.RecordBatch) -> Iterator[tuple[dict, str | None]]:
    """Each row as a dict; a row Python cannot hold (text that is not UTF-8, a date out of range) as its error."""
    try:
        yield from ((row, None) for row in batch.to_pylist())
        return
    except (pa.ArrowException, ValueError, OverflowError) as error:  # UnicodeDecodeError is a ValueError
        first_error = error
    for i in range(batch.num_rows):
        try:
            yield batch.slice(i, 1).to_pylist()[0], None
        except (pa.ArrowException, ValueError, OverflowError) as error:
            yield {}, str(error or first_error)


def output_schema(schema: pa.Schema, output_field: str) -> pa.Schema:
    """The input schema with the translation as a string column: in place if it exists, else last."""
    if output_field in schema.names:
        return schema.set(schema.get_field_index(output_field), pa.field(output_field, pa.string()))
    return schema.append(pa.field(output_field, pa.string()))


class TableMaker:
    """Chunks of rows with their translations as Arrow tables of the output schema. Without an input schema
    (JSONL input) the first rows set it; a row that does not fit it fails alone."""

    def __init__(self, schema: pa.Schema | None, output_field: str, field: str):
        self.schema = None if schema is None else output_schema(schema, output_field)
        self.output_field = output_field
        self.empty_schema = output_schema(pa.schema([(field, pa.string())]), output_field)  # an empty input with no schema

    def table(self, records: list[Record], translations: list[str | None]) -> tuple[pa.Table | None, list[tuple[Record, str]]]:
        """The written rows (failed rows, translation None, left out) and the rows that do not fit."""
        pairs = [(r, t) for r, t in zip(records, translations) if t is not None]
        if not pairs:
            return None, []
        rows = [{**r.fields, self.output_field: t} for r, t in pairs]
        if self.schema is None:
            self.schema = infer_schema(rows)
        try:
            return pa.Table.from_pylist(rows, schema=self.schema), []
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass
        kept, failed = [], []
        for (record, _), row in zip(pairs, rows):
            try:
                pa.Table.from_pylist([row], schema=self.schema)
                kept.append(row)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
                failed.append((record, f"{record.where}: does not fit the Parquet schema of the first rows: {error}"))
        return (pa.Table.from_pylist(kept, schema=self.schema) if kept else None), failed


def infer_schema(rows: list[dict]) -> pa.Schema:
    """The schema of the first rows, or of the first row that has one alone when they disagree."""
    try:
        return pa.Table.from_pylist(rows).schema
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    for row in rows:
        try:
            return pa.Table.from_pylist([row]).schema
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            continue
    return pa.schema([(name, pa.string()) for name in rows[0]])


class ParquetSink:
    """Writes chunks as row groups straight into a Parquet stream (stdout)."""

    def __init__(self, stream: BinaryIO, schema: pa.Schema | None, output_field: str, field: str):
        self.stream = stream
        self.maker = TableMaker(schema, output_field, field)
        self.writer: pq.ParquetWriter | None = None

    def write(self, records: list[Record], translations: list[str | None]) -> list[tuple[Record, str]]:
        table, failed = self.maker.table(records, translations)
        if table is not None:
            self.open_writer().write_table(table)
        return failed

    def open_writer(self) -> pq.ParquetWriter:
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.stream, self.maker.schema or self.maker.empty_schema)
        return self.writer

    def close(self) -> None:
        """Write the footer; an input with no rows still gives a valid file with the schema."""
        self.open_writer().close()

    def abort(self) -> None:
        """Close the writer after a failure so it does not try to finish the file later."""
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # the file is being thrown away; its footer does not matter
                pass


class FrameSink:
    """Writes chunks as length-prefixed Arrow IPC streams into a partial file (see the module's docstring)."""

    def __init__(self, stream: BinaryIO, schema: pa.Schema | None, output_field: str, field: str):
        self.stream = stream
        self.maker = TableMaker(schema, output_field, field)

    def resume(self, partial: str) -> None:
        """Take the schema from the frames an earlier run wrote (a JSONL input's first rows set it)."""
        for table in read_frames(partial):
            self.maker.schema = table.schema
            return

    def write(self, records: list[Record], translations: list[str | None]) -> list[tuple[Record, str]]:
        table, failed = self.maker.table(records, translations)
        if table is not None:
            buffer = pa.BufferOutputStream()
            with pa.ipc.new_stream(buffer, table.schema) as writer:
                writer.write_table(table)
            frame = buffer.getvalue().to_pybytes()
            self.stream.write(len(frame).to_bytes(FRAME_HEADER, "little") + frame)
        return failed

    def close(self) -> None:
        self.stream.flush()

    def abort(self) -> None:
        pass


def read_frames(partial: str) -> Iterator[pa.Table]:
    """The chunks of a partial file, one at a time."""
    with open(partial, "rb") as stream:
        while header := stream.read(FRAME_HEADER):
            frame = stream.read(int.from_bytes(header, "little"))
            yield pa.ipc.open_stream(io.BytesIO(frame)).read_all()


def frames_to_parquet(partial: str, target: BinaryIO, schema: pa.Schema | None, output_field: str, field: str) -> None:
    """The Parquet file of a partial file's frames: one row group per frame, as a direct write would give."""
    writer = None
    for table in read_frames(partial):
        if writer is None:
            writer = pq.ParquetWriter(target, table.schema)
        writer.write_table(table)
    if writer is None:
        maker = TableMaker(schema, output_field, field)
        writer = pq.ParquetWriter(target, maker.schema or maker.empty_schema)
    writer.close()
