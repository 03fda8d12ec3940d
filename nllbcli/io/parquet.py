"""Parquet: rows are read batch by batch; the output is the input's schema plus a string column,
written one row group per chunk as the translation goes."""

from __future__ import annotations

from typing import BinaryIO, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import NllbError
from . import Input, Record, text_of

READ_BATCH_ROWS = 1024  # rows decoded from Parquet at a time


def open_parquet(source: str | pa.BufferReader, name: str, field: str) -> Input:
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
    return Input(read_parquet(parquet, name, field), parquet.metadata.num_rows, schema)


def read_parquet(parquet: pq.ParquetFile, name: str, field: str) -> Iterator[Record]:
    index = 0
    batches = parquet.iter_batches(batch_size=READ_BATCH_ROWS)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as error:
            raise NllbError(f"{name}: cannot read rows after row {index}: {error}") from None
        if batch is None:
            return
        for fields in batch.to_pylist():
            yield Record(index, text_of(fields, field, f"{name}: row {index + 1}"), fields)
            index += 1


def output_schema(schema: pa.Schema, output_field: str) -> pa.Schema:
    """The input schema with the translation as a string column: in place if it exists, else last."""
    if output_field in schema.names:
        return schema.set(schema.get_field_index(output_field), pa.field(output_field, pa.string()))
    return schema.append(pa.field(output_field, pa.string()))


class ParquetSink:
    """Writes chunks as row groups. Without an input schema (JSONL input) the first chunk sets it."""

    def __init__(self, stream: BinaryIO, schema: pa.Schema | None, output_field: str, field: str):
        self.stream = stream
        self.schema = None if schema is None else output_schema(schema, output_field)
        self.output_field = output_field
        self.empty_schema = pa.schema([(field, pa.string())])  # for an empty input with no schema
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0

    def write(self, records: list[Record], translations: list[str]) -> None:
        if not records:
            return
        rows = [record.fields for record in records]
        try:
            if self.schema is None:
                self.schema = output_schema(pa.Table.from_pylist(rows).schema, self.output_field)
            table = pa.Table.from_pylist(
                [{**row, self.output_field: text} for row, text in zip(rows, translations)], schema=self.schema
            )
        except (pa.ArrowException, TypeError, ValueError) as error:
            first, last = self.rows + 1, self.rows + len(rows)
            raise NllbError(f"rows {first}-{last} do not fit the Parquet schema of the first rows: {error}") from None
        self.open_writer().write_table(table)
        self.rows += len(rows)

    def open_writer(self) -> pq.ParquetWriter:
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.stream, self.schema)
        return self.writer

    def close(self) -> None:
        """Write the footer; an input with no rows still gives a valid file with the schema."""
        if self.schema is None:
            self.schema = output_schema(self.empty_schema, self.output_field)
        self.open_writer().close()

    def abort(self) -> None:
        """Close the writer after a failure so it does not try to finish the file later."""
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # the file is being thrown away; its footer does not matter
                pass
