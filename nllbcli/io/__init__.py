"""Streaming readers and writers of Records: JSONL, Parquet and text lines, on files or stdin/stdout.

A reader yields one Record per input row, in input order; a writer takes a chunk of Records with their
translations and writes them in that order. Output files are written beside their destination and renamed
into place at the end, so a failed run never leaves a half-written file.
"""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

import pyarrow as pa

from ..errors import NllbError

FORMATS = ("jsonl", "parquet", "text")
EXTENSIONS = {".jsonl": "jsonl", ".parquet": "parquet", ".txt": "text"}
STDIN_NAME = "<stdin>"  # how stdin is named in error messages


@dataclass
class Record:
    """One input row."""

    index: int  # position in the input, from 0
    text: str  # the text to translate
    fields: dict  # every field of the row, the text field included, in input order


@dataclass
class Input:
    """An opened input: its rows, and what is known about them before they are read."""

    records: Iterator[Record]
    total: int | None  # rows in the input when they can be counted cheaply, else None
    schema: pa.Schema | None  # the Arrow schema of the rows, when the format has one


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


def text_of(fields: dict, field: str, where: str) -> str:
    """The row's text, or an error naming the row and the field."""
    if field not in fields:
        present = ", ".join(map(str, fields)) or "none"
        raise NllbError(f"{where}: no field {field!r} to translate (fields: {present}); name the text field with --field.")
    value = fields[field]
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        raise NllbError(f"{where}: field {field!r} is {kind}, not a string.")
    return value


@contextmanager
def open_input(path: str, fmt: str, field: str, stdin: BinaryIO | None = None, count: bool = False) -> Iterator[Input]:
    """Open a file (or stdin for `-`) as an Input; `count` asks for the row total when it is cheap to get."""
    from . import jsonl, parquet, text

    name = STDIN_NAME if path == "-" else path
    with ExitStack() as stack:
        if fmt == "parquet":
            source = pa.BufferReader((stdin or sys.stdin.buffer).read()) if path == "-" else path
            yield parquet.open_parquet(source, name, field)
            return
        total = None  # stdin cannot be counted without reading it all first
        if path == "-":
            stream = stdin or sys.stdin.buffer
        else:
            if count:
                total = jsonl.count_rows(path) if fmt == "jsonl" else text.count_lines(path)
            stream = stack.enter_context(open(path, "rb"))
        if fmt == "jsonl":
            yield Input(jsonl.read_jsonl(stream, name, field), total, None)
        else:
            yield Input(text.read_text(stream, name, field), total, pa.schema([(field, pa.string())]))


@contextmanager
def open_output(path: str, fmt: str, output_field: str, schema: pa.Schema | None, field: str,
                stdout: BinaryIO | None = None) -> Iterator[Write]:
    """A writer for a file (renamed into place when the block ends without error) or stdout for `-`."""
    from . import jsonl, parquet, text

    with ExitStack() as stack:
        stream = (stdout or sys.stdout.buffer) if path == "-" else stack.enter_context(atomic_file(path))
        if fmt == "jsonl":
            yield lambda records, translations: jsonl.write_jsonl(stream, records, translations, output_field)
        elif fmt == "text":
            yield lambda records, translations: text.write_text(stream, translations)
        else:
            sink = parquet.ParquetSink(stream, schema, output_field, field)
            try:
                yield sink.write
            except BaseException:
                sink.abort()
                raise
            sink.close()
        stream.flush()


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
