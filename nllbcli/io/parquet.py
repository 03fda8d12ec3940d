"""Parquet: rows are read batch by batch (row group by row group); the output is the input's schema plus a string
column, written one row group per chunk as the translation goes.

A Parquet row stays Arrow data from reader to writer. Only the columns the pipeline reads (the text, a row's
languages) become Python values; the output is taken from the input's batches with the translation column
added or replaced, so every other column passes through as it was, whatever its type (nanosecond timestamps,
decimals, dictionaries, nested and extension types, names that occur twice) and the schema's metadata with it.

Files are written in two steps so that a killed job can go on (--resume): each chunk is appended to a partial
file as an Arrow IPC stream behind its length (`frame`), and at the end the frames become the row groups of the
Parquet file. A Parquet file cannot be appended to once its writer is gone; the frames can."""

from __future__ import annotations

import datetime
import io
from collections.abc import Mapping
from itertools import groupby
from typing import BinaryIO, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import NllbError
from . import STDIN_NAME, Input, Position, Record, text_error
from .jsonl import Unreadable

READ_BATCH_ROWS = 1024  # rows decoded from Parquet at a time
FRAME_HEADER = 8  # bytes of the little-endian length before each frame


def check_columns(schema: pa.Schema | None, input: str, output_format: str, fields: dict[str, str]) -> None:
    """Refuse, before any work, column names that make the job ambiguous: a column the job names (`fields`:
    option -> name) that several columns have, and for JSONL output, whose objects hold a name once, any name
    that several columns (or several fields of one struct) have."""
    if schema is None:
        return
    name = STDIN_NAME if input == "-" else input
    for option, column in fields.items():
        count = schema.names.count(column) if column else 0
        if count > 1:
            raise NllbError(f"{name}: {count} columns are named {column!r}, so which one {option} means is ambiguous: "
                            f"rename them, or name another column with {option}.")
    if output_format == "jsonl":
        repeated = repeated_names(pa.struct(list(schema)), "")
        if repeated:
            names = ", ".join(repr(path) for path in repeated)
            raise NllbError(f"{name}: more than one column (or struct field) is named {names}, and a JSON object holds "
                            "each name once: rename them, or write Parquet, which keeps them.")


def repeated_names(kind: pa.DataType, path: str) -> list[str]:
    """The paths of the field names that occur more than once in a struct, at any depth."""
    if isinstance(kind, pa.ExtensionType):
        return repeated_names(kind.storage_type, path)
    if pa.types.is_dictionary(kind):
        return repeated_names(kind.value_type, path)
    if pa.types.is_map(kind):
        return repeated_names(kind.key_type, path + "[]") + repeated_names(kind.item_type, path + "[]")
    if pa.types.is_struct(kind):
        names = [kind.field(i).name for i in range(kind.num_fields)]
        repeated = [f"{path}.{n}" if path else n for n in dict.fromkeys(names) if names.count(n) > 1]
        for i, child in enumerate(names):
            repeated += repeated_names(kind.field(i).type, f"{path}.{child}" if path else child)
        return repeated
    if hasattr(kind, "value_type"):  # lists of every kind
        return repeated_names(kind.value_type, path + "[]")
    return []


def open_parquet(source: str, name: str, field: str, start: Position, identity: dict) -> Input:
    """Open a Parquet file and check its text column before any row is read."""
    try:
        parquet = pq.ParquetFile(source)
    except (pa.ArrowException, OSError) as error:
        raise NllbError(f"{name}: cannot read it as Parquet: {error}") from None
    schema = parquet.schema_arrow
    if field not in schema.names:
        raise NllbError(f"{name}: no column {field!r} to translate (columns: {', '.join(schema.names) or 'none'}); name the text column with --field.")
    check_columns(schema, name, "parquet", {"--field": field})
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
        columns = BatchColumns(batch, name, position.rows)
        for row, text in enumerate(columns.values(field)):
            position.rows += 1
            where = f"{name}: row {position.rows}"
            fields = RowFields(columns, row)
            error = None
            if isinstance(text, Unreadable):
                error = f"{where}: cannot read it: {text.reason}"
            elif not isinstance(text, str):
                error = text_error(fields, field, where)
            yield Record(position.rows - 1, "" if error else text, fields, error, where, batch, row)


class BatchColumns:
    """A batch's columns as Python values, each converted when a row first asks for it."""

    def __init__(self, batch: pa.RecordBatch, name: str, rows_before: int):
        self.batch, self.name, self.rows_before = batch, name, rows_before
        self.converted: dict[str, list] = {}

    def values(self, column: str) -> list | None:
        """None where the batch has no such column (or several: check_columns refuses those the job names)."""
        values = self.converted.get(column)
        if values is None:
            index = self.batch.schema.get_field_index(column)
            if index < 0:
                return None
            values = self.converted[column] = python_values(self.batch.column(index))
        return values


class RowFields(Mapping):
    """One Parquet row's columns by name, as Python values (python_values), converted as they are asked for."""

    __slots__ = ("columns", "row")

    def __init__(self, columns: BatchColumns, row: int):
        self.columns, self.row = columns, row

    def __getitem__(self, name: str) -> object:
        values = self.columns.values(name)
        if values is None:
            raise KeyError(name)
        value = values[self.row]
        if isinstance(value, Unreadable):
            where = f"{self.columns.name}: row {self.columns.rows_before + self.row + 1}"
            raise NllbError(f"{where}: cannot read column {name!r}: {value.reason}")
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns.batch.schema.names)

    def __len__(self) -> int:
        return self.columns.batch.num_columns


def python_values(array: pa.Array) -> list:
    """An Arrow array's values as Python objects: what to_pylist gives, where it can. Where it cannot, value by
    value: a nanosecond timestamp, time or duration that is not whole microseconds (to_pylist leaves those to
    pandas) is the ISO 8601 text of its microseconds with three more digits (a duration: Python's text of a
    timedelta, likewise); a value Python cannot hold (a date past year 9999) is Arrow's text of it; one that
    Arrow cannot give either (text that is not UTF-8) is an Unreadable with the reason."""
    try:
        return array.to_pylist()
    except (pa.ArrowException, ValueError, OverflowError, TypeError):  # UnicodeDecodeError is a ValueError
        pass
    kind = array.type
    if isinstance(array, pa.ExtensionArray):
        return python_values(array.storage)
    if pa.types.is_dictionary(kind):
        dictionary = python_values(array.dictionary)
        return [None if i is None else dictionary[i] for i in array.indices.to_pylist()]
    if pa.types.is_struct(kind):
        names = [kind.field(i).name for i in range(kind.num_fields)]
        if len(set(names)) < len(names):
            unreadable = Unreadable("it holds several fields of one name, which a JSON object cannot")
            return [unreadable if valid else None for valid in array.is_valid().to_pylist()]
        children = [python_values(child) for child in array.flatten()]
        return [dict(zip(names, values)) if valid else None
                for valid, *values in zip(array.is_valid().to_pylist(), *children)]
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        items = python_values(array.values)
        if pa.types.is_map(kind):
            items = [None if item is None else tuple(item.values()) for item in items]
        offsets = array.offsets.to_pylist()
        return [items[start:end] if valid else None
                for valid, start, end in zip(array.is_valid().to_pylist(), offsets, offsets[1:])]
    if pa.types.is_fixed_size_list(kind):
        items, size = python_values(array.flatten()), kind.list_size
        return [items[n * size:(n + 1) * size] if valid else None for n, valid in enumerate(array.is_valid().to_pylist())]
    if (pa.types.is_timestamp(kind) or pa.types.is_duration(kind) or pa.types.is_time64(kind)) and kind.unit == "ns":
        return nanosecond_values(array)
    return [scalar_value(array, n) for n in range(len(array))]


def scalar_value(array: pa.Array, n: int) -> object:
    try:
        return array[n].as_py()
    except (pa.ArrowException, ValueError, OverflowError, TypeError) as error:
        reason = str(error)
    try:
        return pc.cast(array.slice(n, 1), pa.string())[0].as_py()
    except (pa.ArrowException, ValueError, OverflowError, TypeError):
        return Unreadable(reason)


def nanosecond_values(array: pa.Array) -> list:
    """Nanosecond timestamps, times and durations as their microseconds in Python, with the nanoseconds left
    over written out (see python_values); whole microseconds stay Python objects, as to_pylist gives them."""
    kind = array.type
    if pa.types.is_timestamp(kind):
        micro_type = pa.timestamp("us", kind.tz)
    else:
        micro_type = pa.duration("us") if pa.types.is_duration(kind) else pa.time64("us")
    counts = array.cast(pa.int64()).to_pylist()
    micros = python_values(pa.array([None if n is None else n // 1000 for n in counts], pa.int64()).cast(micro_type))
    return [value if n is None or n % 1000 == 0 else with_nanoseconds(value, n % 1000) for value, n in zip(micros, counts)]


def with_nanoseconds(value: object, extra: int) -> object:
    if isinstance(value, datetime.timedelta):
        return f"{value}{extra:03d}" if value.microseconds else f"{value}.000000{extra:03d}"
    if isinstance(value, (datetime.datetime, datetime.time)):
        text = value.isoformat(timespec="microseconds")
        end = text.index(".") + 7
        return f"{text[:end]}{extra:03d}{text[end:]}"
    return value  # Arrow's text of a value Python cannot hold, or an Unreadable


def take_rows(batch: pa.RecordBatch, rows: list[int]) -> pa.RecordBatch:
    """The batch's rows at these (increasing) positions: a slice where they are consecutive, as most are."""
    if rows[-1] - rows[0] + 1 == len(rows):
        return batch.slice(rows[0], len(rows))
    return batch.take(pa.array(rows, pa.int64()))


def batch_groups(records: list[Record]) -> Iterator[tuple[pa.RecordBatch | None, list[Record]]]:
    """The records in runs that share a batch (None for rows without one), in order."""
    for _, group in groupby(records, key=lambda record: id(record.batch)):
        group = list(group)
        yield group[0].batch, group


def python_rows(records: list[Record]) -> list[dict]:
    """Each row as a dict of Python values (python_values), converted a column at a time."""
    rows: list[dict] = []
    for batch, group in batch_groups(records):
        if batch is None:
            rows += [dict(record.fields) for record in group]
            continue
        taken = take_rows(batch, [record.row for record in group])
        names = taken.schema.names
        if len(set(names)) < len(names):  # check_columns refuses these jobs before they start
            check_columns(taken.schema, "the input", "jsonl", {})
        rows += [dict(zip(names, values)) for values in zip(*(python_values(column) for column in taken.columns))]
    return rows


def output_schema(schema: pa.Schema, output_field: str) -> pa.Schema:
    """The input schema with the translation as a string column: in place if it exists, else last."""
    if schema.names.count(output_field) > 1:
        check_columns(schema, "the input", "parquet", {"--output-field": output_field})
    if output_field in schema.names:
        return schema.set(schema.get_field_index(output_field), pa.field(output_field, pa.string()))
    return schema.append(pa.field(output_field, pa.string()))


class TableMaker:
    """Chunks of rows with their translations as Arrow tables of the output schema: a Parquet input's rows
    taken from their batches, other rows from their Python values. Without an input schema (JSONL input) the
    first rows set it; a row that does not fit it fails alone."""

    def __init__(self, schema: pa.Schema | None, output_field: str, field: str):
        self.input_schema = schema
        self.schema = None if schema is None else output_schema(schema, output_field)
        self.output_field = output_field
        self.empty_schema = output_schema(pa.schema([(field, pa.string())]), output_field)  # an empty input with no schema

    def table(self, records: list[Record], translations: list[str | None]) -> tuple[pa.Table | None, list[tuple[Record, str]]]:
        """The written rows (failed rows, translation None, left out) and the rows that do not fit."""
        pairs = [(r, t) for r, t in zip(records, translations) if t is not None]
        if not pairs:
            return None, []
        if self.input_schema is not None and all(record.batch is not None for record, _ in pairs):
            return self.taken_table(pairs), []
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

    def taken_table(self, pairs: list[tuple[Record, str]]) -> pa.Table:
        """The rows from their batches, untouched, with the translation column added or replaced."""
        place = self.input_schema.get_field_index(self.output_field)
        batches, done = [], 0
        for batch, group in batch_groups([record for record, _ in pairs]):
            columns = take_rows(batch, [record.row for record in group]).columns
            translations = pa.array([t for _, t in pairs[done:done + len(group)]], pa.string())
            done += len(group)
            if place >= 0:
                columns[place] = translations
            else:
                columns.append(translations)
            batches.append(pa.RecordBatch.from_arrays(columns, schema=self.schema))
        return pa.Table.from_batches(batches, schema=self.schema)


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
