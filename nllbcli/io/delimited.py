"""CSV and TSV: a header that names the columns, then a row per record; the output keeps every column and adds the
job's (the translation, and where asked its status and scores).

Records are RFC 4180's, read and written by Python's csv module: fields apart by commas (tabs in TSV), a field in
double quotes where it holds the separator, a double quote (written twice) or a line break; records end with LF
or CRLF. Reading is strict: a quoted field followed by anything but the separator or the record's end, or a quote
still open at the end of the input, is a bad row. CSV has no types: every value is a string, written back as the
same text, in quotes only where RFC 4180 needs them (a field quoted without need loses its quotes, never a
character); records are written ending with LF. A UTF-8 byte-order mark before the header (Excel writes one) is
kept in the output. A blank line holds no row.

The first record is the header: --field names one of its columns, each named once. A record with another number
of fields than the header, or that is not UTF-8, or that does not parse, fails alone, named by its row and the
line it begins on ("in.csv: row 3 (line 4): ..."). A record may span lines (a quoted line break), so a reader's
position is the byte offset of the end of the last record it gave: --resume reads the header again, then goes
on from there.

The output's header is the input's columns, then the job's columns that are not among them; one the input has is
replaced in place (--overwrite-field), as a JSONL field is. Rows of JSON Lines (whose columns the first row
written names) or Parquet are written as text: strings as they are, null as an empty field, numbers and booleans
as JSON writes them, lists and objects as JSON text, dates in ISO 8601; with --num-hypotheses above 1 the lists of
translations and scores are JSON text too.
"""

from __future__ import annotations

import csv
import json
from types import SimpleNamespace
from typing import BinaryIO, Callable, Iterator, Mapping

import pyarrow as pa

from ..errors import NllbError
from .jsonl import Exact, Unwritable, exact_json, jsonl_fields, to_json
from .records import Added, Position, RawNumber, Record, Unreadable, raw_text

FORMATS = ("csv", "tsv")
SEPARATORS = {"csv": ",", "tsv": "\t"}
BOM = b"\xef\xbb\xbf"
FIELD_LIMIT = 2**31 - 1  # characters in a field: the csv module's own limit (131,072) is less than a long document's


def reading(fmt: str) -> dict:
    """The csv module's dialect for reading: RFC 4180's quotes, strictly."""
    if csv.field_size_limit() < FIELD_LIMIT:
        csv.field_size_limit(FIELD_LIMIT)
    return {"delimiter": SEPARATORS[fmt], "quotechar": '"', "doublequote": True, "strict": True}


class RecordLines:
    """An input's lines for csv.reader, decoded as UTF-8 (bytes that are not UTF-8 escaped, and noted), keeping
    the record being read: `take` gives its lines and its size in bytes, and starts the next record. The lines
    are kept as text, not bytes, so that a long line is held once besides what the csv module makes of it."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.lines: list[str] = []  # the record's lines so far
        self.size = 0  # their bytes
        self.bad: int | None = None  # where the record's first byte that is not UTF-8 is (from 1), else None
        self.first = True  # the next line is the input's first: a byte-order mark there is not text
        self.bom = False  # the input began with one

    def __iter__(self) -> RecordLines:
        return self

    def __next__(self) -> str:
        raw = self.stream.readline()
        if not raw:
            raise StopIteration
        size = len(raw)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            if self.bad is None:
                self.bad = self.size + error.start + 1
            line = raw.decode("utf-8", "surrogateescape")
        del raw
        if self.first:
            self.first = False
            self.bom = line.startswith("\ufeff")
            line = line.removeprefix("\ufeff")
        self.lines.append(line)
        self.size += size
        return line

    def take(self) -> tuple[list[str], int, int | None]:
        """The record's lines, its bytes, and where its first byte that is not UTF-8 is."""
        taken = self.lines, self.size, self.bad
        self.lines, self.size, self.bad = [], 0, None
        return taken


def line_text(lines: list[str]) -> str:
    """A record's lines as one text for the errors file: bytes that are not UTF-8 as \\xNN, its line break left
    out (records.raw_text)."""
    return raw_text("".join(lines).encode("utf-8", "surrogateescape"))


def parsed(reader, lines: RecordLines) -> Iterator[tuple[list[str] | None, str | None, list[str], int, int | None]]:
    """Each record: its fields (None where it does not parse), why not, its lines, its bytes, and where its first
    byte that is not UTF-8 is. A record that does not parse ends with the line its error is on."""
    while True:
        try:
            fields, error = next(reader), None
        except StopIteration:
            return
        except csv.Error as failure:
            fields, error = None, parse_error(str(failure))
        yield (fields, error, *lines.take())


def parse_error(message: str) -> str:
    """The csv module's error as what is wrong with the record."""
    if message.startswith("new-line character seen in unquoted field"):
        return "holds a carriage return outside quotes (a line break in a field is written in quotes)"
    if message == "unexpected end of data":
        return "a quote opened in it is still open at the end of the input"
    if message.endswith("expected after '\"'"):
        return "a quoted field goes on after its closing quote (a quote in a quoted field is written twice)"
    return f"cannot be read: {message}"


def read_header(reader, lines: RecordLines, name: str, position: Position) -> list[str] | None:
    """The first record that is not blank, counted into `position`; None for an input of blank lines or
    none. One that cannot be read is NllbError: the rows have no columns without it."""
    for fields, error, taken, size, bad in parsed(reader, lines):
        line = position.lines + 1
        position.lines += len(taken)
        position.offset += size
        if error is None and bad is not None:
            error = f"not valid UTF-8 (byte {bad})"
        if error is not None:
            raise NllbError(f"{name}: line {line}: cannot read the header: {error}.")
        if fields:
            return fields
    return None


def check_header(header: list[str], name: str, field: str) -> None:
    """Refuse a header without the column to translate, or that names a column twice (a row holds each once)."""
    if field not in header:
        raise NllbError(f"{name}: no column {field!r} to translate (columns: {', '.join(map(repr, header))}); name "
                        "the text column with --field.")
    twice = next((column for n, column in enumerate(header) if column in header[:n]), None)
    if twice is not None:
        raise NllbError(f"{name}: the header names the column {twice!r} more than once, and a row holds each column "
                        "once: rename one.")


def open_delimited(stream: BinaryIO, name: str, field: str, fmt: str, start: Position,
                   skip: Callable[[int, int], None]) -> tuple[Iterator[Record], pa.Schema, bool]:
    """The rows of a CSV or TSV input after its header, from `start` on (which it keeps up to date); the
    header's columns as an Arrow schema of strings; whether the input began with a byte-order mark. The header is
    read (and checked) first, also when the job resumes: `skip(offset, read)` then moves the stream on to the
    byte `offset`, `read` bytes of it read already."""
    lines = RecordLines(stream)
    reader = csv.reader(lines, **reading(fmt))
    head = Position()
    header = read_header(reader, lines, name, head)
    if header is None:  # no header: no rows (an empty input's output has the text column and the job's)
        return iter(()), pa.schema([(field, pa.string())]), lines.bom
    check_header(header, name, field)
    if start.offset > head.offset:
        skip(start.offset, head.offset)
    else:
        start.lines, start.offset = head.lines, head.offset
    schema = pa.schema([(column, pa.string()) for column in header])
    return read_rows(reader, lines, header, name, field, start), schema, lines.bom


def read_rows(reader, lines: RecordLines, header: list[str], name: str, field: str,
              position: Position) -> Iterator[Record]:
    """One Record per record that is not blank, counted into `position`."""
    width = len(header)
    for fields, error, taken, size, bad in parsed(reader, lines):
        line = position.lines + 1
        position.lines += len(taken)
        position.offset += size
        if fields == []:
            continue  # a blank line holds no row
        position.rows += 1
        where = f"{name}: row {position.rows} (line {line})"
        if error is None and bad is not None:
            error = f"not valid UTF-8 (byte {bad})"
        elif error is None and len(fields) != width:
            error = f"has {len(fields)} field{'s' * (len(fields) != 1)} where the header has {width}"
        if error is not None:
            yield Record(position.rows - 1, "", {}, f"{where}: {error}.", where, raw=line_text(taken))
            continue
        row = dict(zip(header, fields))
        yield Record(position.rows - 1, row[field], row, None, where)


def count_rows(stream: BinaryIO, fmt: str) -> int:
    """The rows read_rows will give from a file's bytes: the records that are not blank, less the header."""
    def lines() -> Iterator[str]:
        # as Latin-1, which any byte is: the separators, quotes and line ends are ASCII, and part records as in UTF-8
        for n, raw in enumerate(stream):
            yield (raw.removeprefix(BOM) if n == 0 else raw).decode("latin-1")

    reader = csv.reader(lines(), **reading(fmt))
    count = 0
    while True:
        try:
            count += bool(next(reader))
        except StopIteration:
            return max(0, count - 1)
        except csv.Error:
            count += 1


def output_columns(names: list[str], added: Added) -> list[str]:
    """The output's columns: the input's, then the added ones that are not among them (those are replaced in place)."""
    return list(names) + [name for name in added.names if name not in names]


class Unfit(Exception):
    """Why a row does not go into the output's columns."""


class DelimitedSink:
    """CSV or TSV rows into a binary stream: the header first (after a byte-order mark where the input began with
    one), then a record per written row; a failed row (values None) is left out. Without an input schema (JSON
    Lines) the first row written names the columns, and a later row with a field they lack fails alone."""

    def __init__(self, stream: BinaryIO, fmt: str, added: Added, schema: pa.Schema | None, field: str,
                 bom: bool = False):
        self.stream, self.fmt, self.added, self.field, self.bom = stream, fmt, added, field, bom
        self.columns: list[str] | None = None
        self.known: set[str] = set()  # the columns, to look up
        self.headed = False  # the header is written
        if schema is not None:
            self.columns = output_columns(schema.names, added)
            self.known = set(self.columns)
        self.pending: list[str] = []
        # each record is written ending with CRLF, so that the csv module quotes a CR in a field as it does a LF,
        # then ends with LF (record_text)
        self.writer = csv.writer(SimpleNamespace(write=self.pending.append), delimiter=SEPARATORS[fmt], quotechar='"',
                                 doublequote=True, quoting=csv.QUOTE_MINIMAL, lineterminator="\r\n")

    def use(self, columns: list[str]) -> None:
        """The header, of these columns, is written (or was, by an earlier run)."""
        self.columns, self.known, self.headed = columns, set(columns), True

    def record_text(self, cells: list[str]) -> str:
        self.writer.writerow(cells)
        return self.pending.pop()[:-2] + "\n"

    def header(self, columns: list[str]) -> bytes:
        return (BOM if self.bom else b"") + self.record_text(columns).encode("utf-8")

    def write(self, records: list[Record], values: list[dict | None]) -> list[tuple[Record, str]]:
        """Write the rows, each with its added fields' values (None: the row failed); returns the (row, reason)
        pairs that could not be written."""
        out: list[bytes] = []
        failed: list[tuple[Record, str]] = []
        if not self.headed and self.columns is not None:
            out.append(self.header(self.columns))
            self.use(self.columns)
        fields = jsonl_fields(records, values)
        for record, added in zip(records, values):
            if added is None:
                continue
            row = dict(next(fields))
            row.update(added)
            try:
                if self.columns is None:  # JSON Lines: the first row written names the columns
                    out.append(self.header(list(row)))
                    self.use(list(row))
                out.append(self.row_bytes(row))
            except UnicodeEncodeError:
                failed.append((record, f"{record.where}: holds a lone surrogate (a \\ud800-\\udfff escape), which "
                                       "UTF-8 cannot write."))
            except (Unfit, Unwritable) as error:
                failed.append((record, f"{record.where}: {error}"))
            except RecursionError:
                failed.append((record, f"{record.where}: nested too deeply to write as JSON."))
        self.stream.write(b"".join(out))
        self.stream.flush()
        return failed

    def row_bytes(self, row: Mapping) -> bytes:
        if not self.known.issuperset(row):
            extra = next(name for name in row if name not in self.known)
            raise Unfit(f"field {extra!r} is not one of the {self.fmt.upper()} output's columns, which the first row "
                        f"written named ({', '.join(self.columns)}): write JSONL or Parquet, which keep every row's "
                        "fields.")
        return self.record_text([cell_text(row.get(name), name) for name in self.columns]).encode("utf-8")

    def resume(self, partial: str) -> None:
        """Continue after the rows an earlier run wrote to `partial`, whose header names the columns."""
        with open(partial, "rb") as stream:
            lines = RecordLines(stream)
            columns = read_header(csv.reader(lines, **reading(self.fmt)), lines, partial, Position())
        if columns is not None:
            self.use(columns)

    def close(self) -> None:
        if not self.headed:  # no row written: the header of the columns known, else of the text's and the job's
            self.stream.write(self.header(self.columns or output_columns([self.field], self.added)))
            self.headed = True
        self.stream.flush()

    def abort(self) -> None:
        pass


def cell_text(value: object, name: str) -> str:
    """A value as a CSV field's text: a string as it is, null as an empty field, a float as JSON writes it (NaN
    and Infinity too: the field is text), other numbers, booleans, lists and objects as JSON text, dates in ISO
    8601 and bytes in base64 (jsonl.to_json). Unwritable where JSON text cannot hold a value inside a list or
    object."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, float):
        return json.dumps(value)
    if isinstance(value, (bool, int, dict, list, tuple, RawNumber, Unreadable)):
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False, default=to_json)
        except (ValueError, TypeError, Exact):
            return exact_json(value, name)
    return str(to_json(value))
