"""Streaming readers and writers of Records: JSONL, Parquet and text lines, on files or stdin/stdout.

A reader yields one Record per input row, in input order; a writer takes a chunk of Records with their
translations and writes them in that order. Output files are written beside their destination and renamed
into place at the end, so a failed run never leaves a half-written file.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterator, Mapping

import pyarrow as pa

from ..errors import NllbError

FORMATS = ("jsonl", "parquet", "text")
EXTENSIONS = {".jsonl": "jsonl", ".parquet": "parquet", ".txt": "text"}
STDIN_NAME = "<stdin>"  # how stdin is named in error messages


@dataclass
class Record:
    """One input row. A row that cannot be read (malformed JSON, a missing or non-string field) is still a
    Record, with `error` set, so it keeps its place and its number."""

    index: int  # position in the input, from 0
    text: str  # the text to translate ("" for a bad row)
    fields: Mapping  # the row's fields by name, the text field included, in input order: a JSONL or text row's
    #                  own dict; a Parquet row's columns as Python values, converted from `batch` when asked for
    error: str | None = None  # why the row cannot be translated, naming it ("in.jsonl:3: not valid JSON ..."), else None
    where: str = ""  # how messages name the row: "in.jsonl:3" (file and line) or "in.parquet: row 3"
    # a Parquet row's Arrow data and its place there: the writers take the row from it, whatever its types
    batch: pa.RecordBatch | None = field(default=None, repr=False, compare=False)
    row: int = 0
    raw: str | None = None  # a line that could not be read as a row (not JSON, not UTF-8), as text, for --errors


@dataclass
class Position:
    """How far a reader has got: enough to continue after the last row it gave (for --resume)."""

    rows: int = 0  # rows read, bad ones included
    lines: int = 0  # lines read, blank ones included (text and JSONL)
    offset: int = 0  # bytes read (text and JSONL)


@dataclass
class Input:
    """An opened input: its rows, and what is known about them before they are read."""

    records: Iterator[Record]
    total: int | None  # rows in the input when they can be counted cheaply, else None
    schema: pa.Schema | None  # the Arrow schema of the rows, when the format has one
    position: Position  # just after the last row `records` gave
    identity: dict  # what --resume checks to know it is the same input: path, size and modification time


Write = Callable[[list[Record], list[str]], None]  # writes a chunk of rows with their translations


def format_of(path: str, given: str | None) -> str:
    """The format named by --input-format/--output-format, else the path's extension; `-` is text."""
    if given:
        return given
    if path == "-":
        return "text"
    extension = os.path.splitext(path)[1].lower()
    if extension not in EXTENSIONS:
        known = ", ".join(EXTENSIONS)
        raise NllbError(f"cannot tell the format of {path} from its extension (known: {known}): name it with --input-format or --output-format.")
    return EXTENSIONS[extension]


def known_extension(path: str) -> bool:
    return os.path.splitext(path)[1].lower() in EXTENSIONS


def text_error(fields: dict, field: str, where: str) -> str | None:
    """Why the row has no text to translate, naming the row and the field; None when it has one."""
    if field not in fields:
        present = ", ".join(map(str, fields)) or "none"
        return f"{where}: no field {field!r} to translate (fields: {present}); name the text field with --field."
    value = fields[field]
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        return f"{where}: field {field!r} is {kind}, not a string."
    return None


def raw_text(raw: bytes) -> str:
    """A line that is not UTF-8 as text (for the errors file): the bytes that are not as \\xNN escapes, its line
    break left out."""
    return raw.decode("utf-8", "backslashreplace").rstrip("\r\n")


def record_of(index: int, fields: dict, field: str, where: str) -> Record:
    error = text_error(fields, field, where)
    return Record(index, "" if error else fields[field], fields, error, where)


@contextmanager
def open_input(path: str, fmt: str, field: str, stdin: BinaryIO | None = None, count: bool = False,
               start: Position | None = None) -> Iterator[Input]:
    """Open a file (or stdin for `-`) as an Input; `count` asks for the row total when it is cheap to get;
    `start` continues after the rows an earlier run read (--resume)."""
    from . import jsonl, parquet, text

    name = STDIN_NAME if path == "-" else path
    start = Position(**vars(start)) if start else Position()
    identity = {"path": "-"} if path == "-" else file_identity(path)
    regular = is_regular_file(path)
    with ExitStack() as stack:
        if fmt == "parquet":
            # Parquet needs to seek: stdin, a pipe or a FIFO is spooled to a temporary file, not held in memory
            if not regular:
                stream = (stdin or sys.stdin.buffer) if path == "-" else stack.enter_context(open(path, "rb"))
                source = stack.enter_context(spool(stream, name))
            else:
                source = path
            yield parquet.open_parquet(source, name, field, start, identity)
            return
        total = None  # a stream cannot be counted without consuming it: only a regular file is read twice
        if path == "-":
            stream = stdin or sys.stdin.buffer
        else:
            if count and regular:
                total = jsonl.count_rows(path) if fmt == "jsonl" else text.count_lines(path)
            stream = stack.enter_context(open(path, "rb"))
        skip_bytes(stream, start.offset)
        if fmt == "jsonl":
            yield Input(name_read_errors(jsonl.read_jsonl(stream, name, field, start), name), total, None, start, identity)
        else:
            yield Input(name_read_errors(text.read_text(stream, name, field, start), name), total,
                        pa.schema([(field, pa.string())]), start, identity)


def name_read_errors(records: Iterator[Record], name: str) -> Iterator[Record]:
    """The records; a read error (a disk's EIO, a network file system gone) names the input."""
    try:
        yield from records
    except OSError as error:
        raise NllbError(f"cannot read {name}: {error.strerror or error}.") from None


def is_regular_file(path: str) -> bool:
    """Whether `path` names a regular file, which can be read twice (counted, then read) and seeked: not stdin
    (`-`), a pipe (`<(cmd)`, /dev/stdin), a FIFO or a device, whose bytes are gone once read."""
    if path == "-":
        return False
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def file_identity(path: str) -> dict:
    """What --resume compares to know the input is the same: a regular file's path, size and modification time;
    a stream's path alone (a pipe's or FIFO's bytes say nothing until read)."""
    if not is_regular_file(path):
        return {"path": os.path.abspath(path)}
    info = os.stat(path)
    return {"path": os.path.abspath(path), "size": info.st_size, "mtime_ns": info.st_mtime_ns}


def skip_bytes(stream: BinaryIO, count: int) -> None:
    """Move past the first `count` bytes: a seek on a file, reading them on a pipe."""
    if not count:
        return
    try:
        stream.seek(count)
        return
    except (OSError, ValueError, AttributeError):
        pass
    while count:
        block = stream.read(min(count, 1 << 20))
        if not block:
            raise NllbError(f"the input is shorter than the {count} bytes an earlier run read: it is not the same input.")
        count -= len(block)


@contextmanager
def spool(stream: BinaryIO, name: str) -> Iterator[str]:
    """Copy a stream into a temporary file ($TMPDIR), for readers that need to seek; removed afterwards."""
    with tempfile.NamedTemporaryFile(prefix="nllb-stdin-", suffix=".parquet") as temp:
        try:
            while block := stream.read(1 << 20):
                temp.write(block)
            temp.flush()
        except OSError as error:
            raise NllbError(f"cannot copy {name} to a temporary file in {tempfile.gettempdir()} (Parquet is read "
                            f"from a file): {error.strerror or error}; set TMPDIR to a directory with room.") from None
        yield temp.name


@contextmanager
def open_output(path: str, fmt: str, output_field: str, schema: pa.Schema | None, field: str,
                stdout: BinaryIO | None = None, status_field: str | None = None) -> Iterator[Write]:
    """A writer for a whole file (renamed into place when the block ends without error) or stdout for `-`.
    Rows that cannot be written raise NllbError. (The pipeline writes files through `resume.PartialOutput`.)"""
    with ExitStack() as stack:
        stream = (stdout or sys.stdout.buffer) if path == "-" else stack.enter_context(atomic_file(path))
        sink = open_sink(stream, fmt, output_field, schema, field, status_field)
        try:
            def write(records: list[Record], translations: list[str], statuses: list[str] | None = None) -> None:
                for record, error in sink.write(records, translations, statuses):
                    raise NllbError(error)

            yield write
        except BaseException:
            sink.abort()
            raise
        sink.close()
        stream.flush()


class LineSink:
    """Text or JSONL lines into a binary stream. A failed row (translation None) is left out of JSONL and is an
    empty line in text, and a line break inside a translation (of a JSONL or Parquet text that held one) is a
    space in text, so that line n of a text output is still the translation of row n of its input. JSONL rows
    gain the translation, and the row's status where `status_field` names a field for it (Added)."""

    def __init__(self, stream: BinaryIO, fmt: str, output_field: str, status_field: str | None = None):
        self.stream, self.fmt = stream, fmt
        self.added = Added(output_field, status_field)

    def write(self, records: list[Record], translations: list[str | None],
              statuses: list[str] | None = None) -> list[tuple[Record, str]]:
        """Write the rows; returns the (row, reason) pairs that could not be written."""
        from .jsonl import encode_jsonl_row, jsonl_fields

        lines: list[bytes] = []
        failed: list[tuple[Record, str]] = []
        fields = jsonl_fields(records, translations) if self.fmt == "jsonl" else iter(())
        for n, (record, translation) in enumerate(zip(records, translations)):
            if self.fmt == "text":
                lines.append(one_line(translation or "").encode("utf-8") + b"\n")
            elif translation is not None:
                line, error = encode_jsonl_row(record, next(fields), self.added.values(translation, statuses, n))
                if error:
                    failed.append((record, error))
                else:
                    lines.append(line)
        self.stream.write(b"".join(lines))
        self.stream.flush()
        return failed

    def close(self) -> None:
        self.stream.flush()

    def abort(self) -> None:
        pass


LINE_BREAKS = re.compile(r"\r\n|[\r\n]")  # what ends a line for line-oriented tools (wc -l, paste, Python's files)


def one_line(text: str) -> str:
    """The text on one line: each line break (\\r\\n, \\n or \\r) a space."""
    return LINE_BREAKS.sub(" ", text) if "\n" in text or "\r" in text else text


@dataclass(frozen=True)
class Added:
    """The fields (JSONL) or columns (Parquet) a job adds to each row: the translation, and the row's status
    where `status` names a field for it. Each replaces the input's own field of that name, in place."""

    translation: str
    status: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return (self.translation,) if self.status is None else (self.translation, self.status)

    def values(self, translation: str, statuses: list[str] | None, n: int) -> dict[str, str]:
        """Row n's added fields by name: its translation, and its status from `statuses`."""
        if self.status is None:
            return {self.translation: translation}
        return {self.translation: translation, self.status: statuses[n]}


def open_sink(stream: BinaryIO, fmt: str, output_field: str, schema: pa.Schema | None, field: str,
              status_field: str | None = None):
    """The writer of one format on a stream: `write(records, translations, statuses) -> failed rows`, `close`,
    `abort`; `statuses` (one per row) are written where `status_field` names a field for them."""
    from . import parquet

    if fmt == "parquet":
        return parquet.ParquetSink(stream, schema, output_field, field, status_field)
    return LineSink(stream, fmt, output_field, status_field)


@contextmanager
def atomic_file(path: str) -> Iterator[BinaryIO]:
    """A temporary file beside `path`, fsynced and renamed onto it at the end; removed on any failure."""
    directory, name = os.path.split(os.path.abspath(path))
    try:
        temp = tempfile.NamedTemporaryFile(dir=directory, prefix="." + name + ".", delete=False)
    except OSError as error:
        raise NllbError(f"cannot write {path}: {error.strerror or error}.") from error
    try:
        yield temp
        temp.flush()
        os.fsync(temp.fileno())
        temp.close()
        os.chmod(temp.name, file_mode(path))  # temporary files are private (0600); the output should not be
        os.replace(temp.name, path)
    except BaseException:
        temp.close()
        os.unlink(temp.name)
        raise


def file_mode(path: str) -> int:
    """The mode the output gets: the replaced file's, else what the umask allows."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
