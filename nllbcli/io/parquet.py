"""Parquet: rows are read batch by batch (row group by row group); the output is the input's schema plus a string
column, written one row group per chunk as the translation goes.

A Parquet row stays Arrow data from reader to writer. Only the columns the pipeline reads (the text, a row's
languages) become Python values; the output is taken from the input's batches with the translation column
added or replaced, so every other column passes through as it was, whatever its type (nanosecond timestamps,
decimals, dictionaries, nested and extension types, names that occur twice) and the schema's metadata with it.

Rows that come as Python values (JSONL) have no schema up front. A column's type follows from the rows in input
order: null goes to any type, int64 to double (unless the column holds integers a double cannot hold exactly),
a list's items and a struct's fields the same way, a struct gains the fields later rows bring, a column new in
a later row is null in the rows before. A row whose value does not go with its column's type so far fails
alone, naming the field and both types. So the schema, and which rows fail, do not depend on --chunk-rows.

Files are written in two steps so that a killed job can go on (--resume): each chunk is appended to a partial
file as an Arrow IPC stream behind its length (`frame`), and at the end the frames become the row groups of the
Parquet file, each cast to the schema of the last (a frame of a JSONL input may have been written when its
columns were narrower). A Parquet file cannot be appended to once its writer is gone; the frames can."""

from __future__ import annotations

import datetime
import functools
import io
import os
import tempfile
from collections.abc import Mapping
from itertools import groupby
from typing import BinaryIO, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import NllbError
from .records import STDIN_NAME, Added, Input, Position, RawNumber, Record, Unreadable, text_error

READ_BATCH_ROWS = 1024  # rows decoded from Parquet at a time
FRAME_HEADER = 8  # bytes of the little-endian length before each frame
EXACT_INT = 2 ** 53  # a double holds every integer up to this exactly (Arrow's casts check this range)
LIST_ITEM = None  # a path's step into a list's items (field names are strings)


def check_columns(schema: pa.Schema | None, input: str, output_format: str, fields: dict[str, str]) -> None:
    """Refuse, before any work, column names that make the job ambiguous: a column the job names (`fields`:
    option -> name) that several columns have, and for JSONL, CSV or TSV output, whose rows hold a name once, any
    name that several columns (or several fields of one struct) have."""
    if schema is None:
        return
    name = STDIN_NAME if input == "-" else input
    for option, column in fields.items():
        count = schema.names.count(column) if column else 0
        if count > 1:
            raise NllbError(f"{name}: {count} columns are named {column!r}, so which one {option} means is ambiguous: "
                            f"rename them, or name another column with {option}.")
    if output_format in ("jsonl", "csv", "tsv"):
        repeated = repeated_names(pa.struct(list(schema)), "")
        if repeated:
            names = ", ".join(repr(path) for path in repeated)
            holder = "a JSON object holds" if output_format == "jsonl" else f"a {output_format.upper()} row (its objects JSON text) holds"
            raise NllbError(f"{name}: more than one column (or struct field) is named {names}, and {holder} "
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
    """Open a Parquet file and check its text column before any row is read. It is opened by its name's bytes:
    pyarrow takes a name as UTF-8, which a Linux file name need not be."""
    try:
        parquet = pq.ParquetFile(pa.OSFile(os.fsencode(source)))
    except (pa.ArrowException, OSError) as error:
        raise NllbError(f"{name}: cannot read it as Parquet: {error}") from None
    schema = parquet.schema_arrow
    check_text_column(schema, name, field)
    return Input(read_parquet(parquet, name, field, start), parquet.metadata.num_rows, schema, start, identity)


def check_text_column(schema: pa.Schema, name: str, field: str) -> None:
    """Refuse a schema without one string column `field` to translate."""
    if field not in schema.names:
        raise NllbError(f"{name}: no column {field!r} to translate (columns: {', '.join(schema.names) or 'none'}); name the text column with --field.")
    check_columns(schema, name, "parquet", {"--field": field})
    kind = schema.field(field).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise NllbError(f"{name}: column {field!r} is {kind}, not a string.")


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
        yield from batch_records(batch, name, field, position)


def batch_records(batch: pa.RecordBatch, name: str, field: str, position: Position,
                  numbers: Sequence[int] | None = None) -> Iterator[Record]:
    """A batch's rows as Records, numbered on from `position` (which it keeps up to date), or by `numbers`, each
    row's own (from 0), where the batch holds rows of a file that are not all adjacent."""
    columns = BatchColumns(batch, name, numbers if numbers is not None else range(position.rows, position.rows + batch.num_rows))
    for row, text in enumerate(columns.values(field)):
        position.rows += 1
        index = columns.numbers[row]
        where = f"{name}: row {index + 1}"
        fields = RowFields(columns, row)
        error = None
        if isinstance(text, Unreadable):
            error = f"{where}: cannot read it: {text.reason}"
        elif not isinstance(text, str):
            error = text_error(fields, field, where)
        yield Record(index, "" if error else text, fields, error, where, batch, row)


class BatchColumns:
    """A batch's columns as Python values, each converted when a row first asks for it; `numbers` are the rows'
    own numbers in their input, from 0."""

    def __init__(self, batch: pa.RecordBatch, name: str, numbers: Sequence[int]):
        self.batch, self.name, self.numbers = batch, name, numbers
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
            where = f"{self.columns.name}: row {self.columns.numbers[self.row] + 1}"
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
    kind = array.type
    if not holds_nanoseconds(kind):  # (with pandas installed, to_pylist gives those as pandas' objects, not errors)
        try:
            return array.to_pylist()
        except (pa.ArrowException, ValueError, OverflowError, TypeError):  # UnicodeDecodeError is a ValueError
            pass
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


def holds_nanoseconds(kind: pa.DataType) -> bool:
    """Whether values of this type are, or hold, nanosecond timestamps, times or durations."""
    if isinstance(kind, pa.ExtensionType):
        return holds_nanoseconds(kind.storage_type)
    if pa.types.is_dictionary(kind):
        return holds_nanoseconds(kind.value_type)
    if pa.types.is_timestamp(kind) or pa.types.is_duration(kind) or pa.types.is_time64(kind):
        return kind.unit == "ns"
    return any(holds_nanoseconds(kind.field(i).type) for i in range(kind.num_fields))  # structs, lists, maps


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
    """The batch's rows at these (increasing) positions: a slice where they are consecutive, as most are; else
    taken, or its runs of consecutive rows joined where Arrow has no take for a column's type (string_view and
    binary_view, alone or nested)."""
    if rows[-1] - rows[0] + 1 == len(rows):
        return batch.slice(rows[0], len(rows))
    try:
        return batch.take(pa.array(rows, pa.int64()))
    except pa.ArrowNotImplementedError:
        starts = [n for n, row in enumerate(rows) if n == 0 or row != rows[n - 1] + 1] + [len(rows)]
        runs = [batch.slice(rows[a], b - a) for a, b in zip(starts, starts[1:])]
        return pa.Table.from_batches(runs, batch.schema).combine_chunks().to_batches()[0]


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


def output_schema(schema: pa.Schema, added: Added) -> pa.Schema:
    """The input schema with the added columns (the translation, the status, the scores) of their types
    (Added.types): each in place if it exists, else last."""
    for option, name in added.options:
        if schema.names.count(name) > 1:
            check_columns(schema, "the input", "parquet", {option: name})
        kind = added.types[name]
        if name in schema.names:
            schema = schema.set(schema.get_field_index(name), pa.field(name, kind))
        else:
            schema = schema.append(pa.field(name, kind))
    return schema


class Unfit(Exception):
    """Why a row's value does not go into its column, naming the field."""


BEFORE = "does not fit the Parquet schema of the rows before it"
UNWRITABLE = "cannot be written to Parquet"


SCALAR_TYPES = {type(None): pa.null(), bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}
SCALAR_KINDS = frozenset(SCALAR_TYPES)


class TableMaker:
    """Chunks of rows with their translations as Arrow tables of the output schema: a Parquet input's rows
    taken from their batches, other rows from their Python values. Without an input schema (JSONL input) the
    columns' types follow from the rows in input order (the module's docstring); a row that does not fit fails
    alone."""

    def __init__(self, schema: pa.Schema | None, added: Added, field: str):
        self.input_schema = schema
        self.added = added
        self.schema = None if schema is None else output_schema(schema, self.added)
        self.field = field
        self.empty_schema = output_schema(pa.schema([(field, pa.string())]), self.added)  # an empty input with no schema
        self.wide: set[tuple] = set()  # paths of int64 columns holding integers a double cannot hold exactly

    def table(self, records: list[Record], values: list[dict | None]) -> tuple[pa.Table | None, list[tuple[Record, str]]]:
        """The written rows (failed rows, values None, left out) and the rows that do not fit."""
        pairs = [(r, v) for r, v in zip(records, values) if v is not None]
        if not pairs:
            return None, []
        if self.input_schema is not None and all(record.batch is not None for record, _ in pairs):
            return self.taken_table(pairs), []
        rows = [{**r.fields, **added} for r, added in pairs]
        if self.input_schema is not None:
            return self.fixed_table(pairs, rows)
        try:
            return self.typed_table(rows, *self.chunk_types(rows)), []
        except (Unfit, pa.ArrowException, TypeError, ValueError, OverflowError):  # a lone surrogate is a ValueError
            return self.row_by_row(pairs, rows)

    def taken_table(self, pairs: list[tuple[Record, dict]]) -> pa.Table:
        """The rows from their batches, untouched, with the added columns (translation, status, scores) added or
        replaced."""
        batches, done, types = [], 0, self.added.types
        for batch, group in batch_groups([record for record, _ in pairs]):
            columns = take_rows(batch, [record.row for record in group]).columns
            for name in self.added.names:
                values = pa.array([added[name] for _, added in pairs[done:done + len(group)]], types[name])
                place = self.input_schema.get_field_index(name)
                if place >= 0:
                    columns[place] = values
                else:
                    columns.append(values)
            done += len(group)
            batches.append(pa.RecordBatch.from_arrays(columns, schema=self.schema))
        return pa.Table.from_batches(batches, schema=self.schema)

    def fixed_table(self, pairs: list[tuple[Record, dict]], rows: list[dict]) -> tuple[pa.Table | None, list[tuple[Record, str]]]:
        """Python rows (a text input's) in the input's own schema; a row with a field it lacks, or a value it
        cannot hold, fails."""
        names = set(self.schema.names)
        if all(name in names for row in rows for name in row):
            try:
                return pa.Table.from_pylist(rows, schema=self.schema), []
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                pass
        kept, failed = [], []
        for (record, _), row in zip(pairs, rows):
            try:
                extra = [name for name in row if name not in names]
                if extra:
                    raise Unfit(f"field {extra[0]!r} is not one of its columns")
                pa.Table.from_pylist([row], schema=self.schema)
                kept.append(row)
            except (Unfit, pa.ArrowException, TypeError, ValueError, OverflowError) as error:
                failed.append((record, f"{record.where}: does not fit the Parquet schema: {error}"))
        return (pa.Table.from_pylist(kept, schema=self.schema) if kept else None), failed

    def chunk_types(self, rows: list[dict]) -> tuple[pa.Schema, set]:
        """The running schema widened by a whole chunk, a column at a time, and the wide paths with the chunk's;
        Unfit where some row does not go with the rows before it (row_by_row then finds which)."""
        old = {f.name: f.type for f in self.schema} if self.schema is not None else {}
        names = dict.fromkeys(old)
        for row in rows:
            for name in row:
                if name not in names:
                    names = with_column(names, name, None, self.added)
        wide = set(self.wide)
        fields = []
        for name in names:
            values = [row.get(name) for row in rows]
            kinds = set(map(type, values))
            path, kind = (name,), old.get(name, pa.null())
            if SCALAR_KINDS.issuperset(kinds):
                if int in kinds:
                    note_wide_ints(values, path, wide)
                for scalar in kinds:
                    kind = unify(kind, SCALAR_TYPES[scalar], path, wide)
            else:
                for value in values:  # in row order, as row_by_row: {} then {"a": 1} fails the first
                    new = value_type(value, path, wide)
                    if new is not kind:
                        widened = unify(kind, new, path, wide)
                        if widened is not kind:
                            refuse_empty_struct(widened, path)
                            kind = widened
            fields.append(pa.field(name, kind))
        return pa.schema(fields), wide

    def typed_table(self, rows: list[dict], schema: pa.Schema, wide: set) -> pa.Table:
        """The rows as a table of `schema`, which becomes the running one (with `wide`)."""
        table = pa.Table.from_arrays([pa.array([row.get(f.name) for row in rows], type=f.type) for f in schema], schema=schema)
        self.schema, self.wide = schema, wide
        return table

    def row_by_row(self, pairs: list[tuple[Record, dict]], rows: list[dict]) -> tuple[pa.Table | None, list[tuple[Record, str]]]:
        """What each row of the chunk does in turn: widens the running schema, or fails for a value that does not
        go with it (in input order, as chunks of one row each would)."""
        fields = {f.name: f.type for f in self.schema} if self.schema is not None else {}
        wide = set(self.wide)
        kept, failed = [], []
        for (record, _), row in zip(pairs, rows):
            row_fields, row_wide = dict(fields), set(wide)
            try:
                for name, value in row.items():
                    path = (name,)
                    check_text(name, path)
                    kind = unify(row_fields.get(name, pa.null()), value_type(value, path, row_wide, checked=True), path, row_wide)
                    refuse_empty_struct(kind, path)
                    if name in row_fields:
                        row_fields[name] = kind
                    else:
                        row_fields = with_column(row_fields, name, kind, self.added)
            except Unfit as error:
                failed.append((record, f"{record.where}: {error}."))
                continue
            fields, wide = row_fields, row_wide
            kept.append(row)
        if not kept:
            return None, failed
        return self.typed_table(kept, pa.schema(list(fields.items())), wide), failed

    def take_up(self, table: pa.Table) -> None:
        """Continue after a frame an earlier run wrote (FrameSink.resume): its schema is the running one."""
        self.schema = table.schema
        for name, column in zip(table.column_names, table.columns):
            for chunk in column.chunks:
                note_wide_array(chunk, (name,), self.wide)


def with_column(columns: dict, name: str, value, added: Added) -> dict:
    """`columns` with a new one, where a schema known from the start would have had it: a field of the input
    before the added columns (translation, status) that end it (the first rows lacked the field), else last."""
    items = list(columns.items())
    place = len(items)
    while place and name not in added.names and items[place - 1][0] in added.names:
        place -= 1
    return dict(items[:place] + [(name, value)] + items[place:])


def field_name(path: tuple) -> str:
    """A path as messages name it: meta.tags[] for the items of the list `tags` in the struct `meta`."""
    text = ""
    for step in path:
        text += "[]" if step is LIST_ITEM else (f".{step}" if text else step)
    return text


def value_type(value: object, path: tuple, wide: set, checked: bool = False) -> pa.DataType:
    """The Arrow type of a Python value from JSON (integers beyond a double's exact range noted in `wide`);
    `checked` also refuses text Arrow cannot take (a lone surrogate). Lists and objects of scalars, the most
    common, are typed a whole value at a time."""
    kind = type(value)
    scalar = SCALAR_TYPES.get(kind)
    if scalar is not None:
        if kind is int:
            note_wide_ints([value], path, wide)
        elif checked and kind is str:
            check_text(value, path)
        return scalar
    if kind is list:
        item_path = path + (LIST_ITEM,)
        kinds = set(map(type, value))
        item = pa.null()
        if SCALAR_KINDS.issuperset(kinds) and not (checked and str in kinds):
            if int in kinds:
                note_wide_ints(value, item_path, wide)
            for scalar in kinds:
                item = unify(item, SCALAR_TYPES[scalar], item_path, wide)
        else:
            for element in value:
                item = unify(item, value_type(element, item_path, wide, checked), item_path, wide)
        return list_type(item)
    if kind is dict:
        kinds = tuple(map(type, value.values()))
        if not checked and SCALAR_KINDS.issuperset(kinds):
            if int in kinds:
                for name, item in value.items():
                    if type(item) is int and not -EXACT_INT <= item <= EXACT_INT:
                        note_wide_ints([item], path + (name,), wide)
            return scalar_struct_type(tuple(value), kinds)
        if checked:
            for name in value:
                check_text(name, path + (name,))
        return pa.struct([pa.field(name, value_type(item, path + (name,), wide, checked)) for name, item in value.items()])
    if isinstance(value, RawNumber):
        raise Unfit(f"{UNWRITABLE}: field {field_name(path)!r} is the number {value.describe()}, beyond what a Parquet "
                    "number holds (a 64-bit integer, a double)")
    raise Unfit(f"{UNWRITABLE}: field {field_name(path)!r} is a {type(value).__name__}, which has no Parquet type")


@functools.lru_cache(maxsize=1024)
def list_type(item: pa.DataType) -> pa.DataType:
    return pa.list_(item)


@functools.lru_cache(maxsize=1024)
def scalar_struct_type(names: tuple, kinds: tuple) -> pa.DataType:
    return pa.struct([pa.field(name, SCALAR_TYPES[kind]) for name, kind in zip(names, kinds)])


def check_text(text: str, path: tuple) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise Unfit(f"{UNWRITABLE}: field {field_name(path)!r} holds a lone surrogate (a \\ud800-\\udfff escape), which UTF-8 cannot write") from None


def note_wide_ints(values: list, path: tuple, wide: set) -> None:
    """Note `path` in `wide` if an integer among `values` is past a double's exact range; Unfit past 64 bits."""
    for value in values:
        if type(value) is int and not -EXACT_INT <= value <= EXACT_INT:
            if not -2 ** 63 <= value < 2 ** 63:
                raise Unfit(f"{UNWRITABLE}: field {field_name(path)!r} is an integer past 64 bits, which no Parquet integer holds")
            wide.add(path)


def note_wide_array(array: pa.Array, path: tuple, wide: set) -> None:
    """note_wide_ints over a frame's int64 values, at any depth."""
    kind = array.type
    if pa.types.is_int64(kind):
        bounds = pc.min_max(array)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is not None and (low < -EXACT_INT or high > EXACT_INT):
            wide.add(path)
    elif pa.types.is_struct(kind):
        for i, child in enumerate(array.flatten()):
            note_wide_array(child, path + (kind.field(i).name,), wide)
    elif pa.types.is_list(kind):
        note_wide_array(array.flatten(), path + (LIST_ITEM,), wide)


def unify(old: pa.DataType, new: pa.DataType, path: tuple, wide: set) -> pa.DataType:
    """The type that holds both a column's values so far (`old`) and a new value's (`new`), or Unfit."""
    if old is new or old == new:
        return old
    if pa.types.is_null(old):
        return new
    if pa.types.is_null(new):
        return old
    if {old, new} == {pa.int64(), pa.float64()}:
        if path in wide:
            raise Unfit(f"{BEFORE}: field {field_name(path)!r} is {new} where it was {old}, with integers a double cannot "
                        "hold exactly")
        return pa.float64()
    if pa.types.is_list(old) and pa.types.is_list(new):
        return list_type(unify(old.value_type, new.value_type, path + (LIST_ITEM,), wide))
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        fields = {f.name: f.type for f in old}
        for f in new:
            fields[f.name] = unify(fields[f.name], f.type, path + (f.name,), wide) if f.name in fields else f.type
        return pa.struct(list(fields.items()))
    raise Unfit(f"{BEFORE}: field {field_name(path)!r} is {new} where it was {old}")


def refuse_empty_struct(kind: pa.DataType, path: tuple) -> None:
    """Parquet has no struct without fields: a JSON {} fits only where earlier rows gave the object fields."""
    if pa.types.is_struct(kind):
        if kind.num_fields == 0:
            raise Unfit(f"{UNWRITABLE}: field {field_name(path)!r} is an empty object, which Parquet holds only where "
                        "the rows before it gave the object fields")
        for f in kind:
            refuse_empty_struct(f.type, path + (f.name,))
    elif pa.types.is_list(kind):
        refuse_empty_struct(kind.value_type, path + (LIST_ITEM,))


class ParquetSink:
    """Writes chunks as row groups straight into a Parquet stream (stdout). Without a schema up front (JSONL
    input) the chunks wait as frames in a temporary file until the last has set the schema."""

    def __init__(self, stream: BinaryIO, schema: pa.Schema | None, added: Added, field: str):
        self.stream = stream
        self.maker = TableMaker(schema, added, field)
        self.writer: pq.ParquetWriter | None = None
        self.spool = tempfile.NamedTemporaryFile(prefix="nllb-", suffix=".frames") if schema is None else None

    def write(self, records: list[Record], values: list[dict | None]) -> list[tuple[Record, str]]:
        table, failed = self.maker.table(records, values)
        if table is not None:
            if self.spool is not None:
                write_frame(self.spool, table)
            else:
                self.open_writer().write_table(table)
        return failed

    def open_writer(self) -> pq.ParquetWriter:
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.stream, self.maker.schema or self.maker.empty_schema)
        return self.writer

    def close(self) -> None:
        """Write the footer; an input with no rows still gives a valid file with the schema."""
        if self.spool is not None:
            self.spool.flush()
            frames_to_parquet(self.spool.name, self.stream, None, self.maker.added, self.maker.field)
            self.spool.close()
            return
        self.open_writer().close()

    def abort(self) -> None:
        """Close the writer after a failure so it does not try to finish the file later."""
        if self.spool is not None:
            self.spool.close()
        close_quietly(self.writer)


class FrameSink:
    """Writes chunks as length-prefixed Arrow IPC streams into a partial file (see the module's docstring)."""

    def __init__(self, stream: BinaryIO, schema: pa.Schema | None, added: Added, field: str):
        self.stream = stream
        self.maker = TableMaker(schema, added, field)

    def resume(self, partial: str) -> None:
        """Take up the columns' types from the frames an earlier run wrote (a JSONL input's rows set them)."""
        if self.maker.input_schema is None:
            for table in read_frames(partial):
                self.maker.take_up(table)

    def write(self, records: list[Record], values: list[dict | None]) -> list[tuple[Record, str]]:
        table, failed = self.maker.table(records, values)
        if table is not None:
            write_frame(self.stream, table)
        return failed

    def close(self) -> None:
        self.stream.flush()

    def abort(self) -> None:
        pass


def write_frame(stream: BinaryIO, table: pa.Table) -> None:
    buffer = pa.BufferOutputStream()
    with pa.ipc.new_stream(buffer, table.schema) as writer:
        writer.write_table(table)
    frame = buffer.getvalue().to_pybytes()
    stream.write(len(frame).to_bytes(FRAME_HEADER, "little") + frame)


def read_frames(partial: str) -> Iterator[pa.Table]:
    """The chunks of a partial file, one at a time."""
    with open(partial, "rb") as stream:
        while header := stream.read(FRAME_HEADER):
            frame = stream.read(int.from_bytes(header, "little"))
            yield pa.ipc.open_stream(io.BytesIO(frame)).read_all()


def last_frame_schema(partial: str) -> pa.Schema | None:
    """The schema of a partial file's last frame (the widest, for a JSONL input), reading only its headers."""
    last = None
    with open(partial, "rb") as stream:
        while header := stream.read(FRAME_HEADER):
            last = stream.tell()
            stream.seek(int.from_bytes(header, "little"), os.SEEK_CUR)
        if last is None:
            return None
        stream.seek(last)
        return pa.ipc.open_stream(stream).schema


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A frame written with a narrower schema in the final one: columns cast (null to any type, int64 to double,
    structs gaining fields), the columns it lacks as nulls."""
    if table.schema == schema:
        return table
    columns = [cast_column(table.column(f.name), f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
               for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def cast_column(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    """column.cast(kind), except where it holds lists of nulls: pyarrow (26) casts list<null> to itself, alone or
    inside a struct, into an invalid array (offsets past the end of its values), so those go through their
    Python values."""
    if column.type == kind:
        return column
    if holds_null_lists(column.type):
        return pa.chunked_array([pa.array(column.to_pylist(), type=kind)], type=kind)
    return column.cast(kind)


def holds_null_lists(kind: pa.DataType) -> bool:
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.types.is_null(kind.value_type) or holds_null_lists(kind.value_type)
    if pa.types.is_struct(kind):
        return any(holds_null_lists(kind.field(i).type) for i in range(kind.num_fields))
    return False


def frames_to_parquet(partial: str, target: BinaryIO, schema: pa.Schema | None, added: Added, field: str) -> None:
    """The Parquet file of a partial file's frames: one row group per frame, as a direct write would give."""
    maker = TableMaker(schema, added, field)
    final = maker.schema or last_frame_schema(partial) or maker.empty_schema
    writer = pq.ParquetWriter(target, final)
    try:
        for table in read_frames(partial):
            writer.write_table(conform(table, final))
    except BaseException:
        close_quietly(writer)
        raise
    writer.close()


def close_quietly(writer: pq.ParquetWriter | None) -> None:
    """Close a writer whose file is being thrown away (its footer does not matter), so it does not try to
    finish it later."""
    if writer is not None:
        try:
            writer.close()
        except Exception:  # noqa: BLE001 - the file is being thrown away
            pass
