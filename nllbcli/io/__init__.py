"""Streaming readers and writers of Records: JSONL, Parquet, CSV and TSV, and text lines, on files or
stdin/stdout, plain or gzip and zstd compressed (streams.py).

A reader yields one Record per input row, in input order; a writer takes a chunk of Records with their
translations and writes them in that order. Output files are written beside their destination and renamed
into place at the end, so a failed run never leaves a half-written file.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from typing import BinaryIO, Iterator

import pyarrow as pa

from ..errors import NllbError
from .records import STDIN_NAME, Added, Input, Position, Record  # noqa: F401 - also io's names for its users
from .streams import (READ_ERRORS, Lines, Replay, compression_in, compression_of, decompressing, describe_head,
                      is_terminal, read_error, read_magic, sniff, without_compression)

FORMATS = ("jsonl", "parquet", "text", "csv", "tsv", "po")
EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".txt": "text",
              ".csv": "csv", ".tsv": "tsv", ".po": "po", ".pot": "po"}
KNOWN = ", ".join(EXTENSIONS) + ", each optionally + .gz or .zst"  # the extensions, as messages list them
SIDES = {"input": "INPUT", "output": "OUTPUT"}


def extension_format(path: str) -> str | None:
    """The format the path's extension names (.jsonl.gz is jsonl), else None."""
    return EXTENSIONS.get(os.path.splitext(without_compression(path))[1].lower())


def format_of(path: str, given: str | None, side: str = "output") -> str:
    """The format named by --input-format/--output-format, else the path's extension; `-` is text."""
    if given:
        return given
    if path == "-":
        return "text"
    found = extension_format(path)
    if found is None:
        tried = os.path.splitext(without_compression(path))[1] or "none"
        raise NllbError(f"cannot tell the format of {SIDES[side]} {path} from its extension (tried: {tried}; known: "
                        f"{KNOWN}): name it with --{side}-format.")
    return found


def known_extension(path: str) -> bool:
    return extension_format(path) is not None


def input_format_of(path: str, given: str | None, stdin: BinaryIO | None = None) -> str:
    """The input's format: --input-format, else its extension, else found from its first bytes (streams.py);
    a terminal is text. The bytes a stream gave to be sniffed are kept for open_input. A file of JSON Lines that
    is one JSON array is refused here, before any model loads (a stream's, by its reader)."""
    named = given or (extension_format(path) if path != "-" else None)
    if named == "jsonl":
        refuse_json_array(path)
    if named:
        return named
    if path == "-" and is_terminal(stdin or sys.stdin.buffer):
        return "text"
    name = STDIN_NAME if path == "-" else path
    if is_regular_file(path):
        with open(path, "rb") as stream:
            found, compression, head = sniff(Replay(stream))
    else:
        found, compression, head = sniff(replay_of(path, stdin))
    if found == "binary":
        inside = f" ({compression}-compressed)" if compression else ""
        raise NllbError(f"cannot tell the format of INPUT {name}{inside}: it is not Parquet, JSON Lines or text "
                        f"({describe_head(head)}, and it holds a NUL byte): name it with --input-format.")
    if found == "array":
        raise NllbError(json_array_refusal(path))
    return found


def refuse_json_array(path: str) -> None:
    """Refuse a regular file to be read as JSON Lines that is one JSON array of objects (its first bytes say so:
    streams.format_of_bytes): json_array_refusal. (A stream's reader refuses it: its bytes are read once.)"""
    if not is_regular_file(path):
        return
    try:
        with open(path, "rb") as stream:
            found = sniff(Replay(stream))[0]
    except OSError:
        return  # opening the input names what is wrong with it
    if found == "array":
        raise NllbError(json_array_refusal(path))


def json_array_refusal(path: str) -> str:
    """Why an input that is one JSON array is not read as JSON Lines, with the jq command that makes it JSON
    Lines (a file of that name beside it)."""
    what = "is one JSON array, not JSON Lines (a JSON object a line)"
    if path == "-":
        return f"{STDIN_NAME} {what}: pipe it through `jq -c '.[]'` to make it JSON Lines."
    stem = os.path.splitext(without_compression(path))[0]
    target = stem + ".jsonl" if stem + ".jsonl" != without_compression(path) else stem + ".lines.jsonl"
    compression = compression_of(path)
    command = f"jq -c '.[]' {shlex.quote(path)} > {shlex.quote(target)}"
    if compression is not None:
        command = f"{'gzip' if compression == 'gzip' else 'zstd'} -dc {shlex.quote(path)} | jq -c '.[]' > {shlex.quote(target)}"
    return f"{path} {what}: `{command}` turns it into JSON Lines."


PEEKED: dict[str, tuple[object, Replay]] = {}  # the streams sniffed, by path: their bytes are read once


def replay_of(path: str, stdin: BinaryIO | None = None) -> Replay:
    """The stream at `path` (stdin for `-`) as a Replay: the one its sniffing read from, else opened now."""
    source = (stdin or sys.stdin.buffer) if path == "-" else None
    key = path if path == "-" else os.path.abspath(path)
    held = PEEKED.get(key)
    if held is not None and held[0] is source:
        return held[1]
    try:
        replay = Replay(source if path == "-" else open(path, "rb", buffering=0))
    except OSError as error:
        raise NllbError(f"cannot read {path}: {error.strerror or error}.") from None
    PEEKED[key] = (source, replay)
    return replay


def input_compression(path: str, name: str, head: bytes) -> str | None:
    """How the input is compressed, from its first bytes; an extension that says gzip or zstd must agree."""
    found = compression_in(head)
    said = compression_of(path) if path != "-" else None
    if said is not None and found != said:
        raise NllbError(f"INPUT {name} is named as {said}-compressed, but {describe_head(head)}, which is not {said}.")
    return found


@contextmanager
def open_input(path: str, fmt: str, field: str, stdin: BinaryIO | None = None, count: bool = False,
               start: Position | None = None, retranslate: bool = False) -> Iterator[Input]:
    """Open a file (or stdin for `-`) as an Input, gzip or zstd decompressed (found from its first bytes);
    `count` asks for the row total when it is cheap to get; `start` continues after the rows an earlier run
    read (--resume); `retranslate`: a PO input's translated entries are rows too (--po-overwrite)."""
    from . import delimited, jsonl, parquet, po, text

    name = STDIN_NAME if path == "-" else path
    start = Position(**vars(start)) if start else Position()
    identity = {"path": "-"} if path == "-" else file_identity(path)
    regular = is_regular_file(path)
    with ExitStack() as stack:
        if regular:
            raw = stack.enter_context(open(path, "rb"))
            compression = input_compression(path, name, raw.read(4))
            raw.seek(0)
        else:
            replay = replay_of(path, stdin)
            PEEKED.pop(path if path == "-" else os.path.abspath(path), None)
            if path != "-":
                stack.callback(replay.source.close)
            terminal = path == "-" and is_terminal(stdin or sys.stdin.buffer)
            compression = None if terminal else input_compression(path, name, read_magic(replay))
            raw = replay
        stream = decompressing(raw, compression)
        if fmt == "parquet":
            # Parquet needs to seek: a stream or a compressed file is spooled to a temporary file, not held in memory
            source = path if regular and compression is None else stack.enter_context(spool(stream, name))
            yield parquet.open_parquet(source, name, field, start, identity)
            return
        if fmt == "po":  # a catalogue is read whole: its output is written from it
            try:
                yield po.open_po(stream, name, field, start, identity, retranslate)
            except READ_ERRORS as error:
                raise read_error(name, error) from None
            return
        arrived = None
        if not regular and compression is None:
            stream = Lines(raw, rows={"jsonl": "json", "csv": "csv", "tsv": "csv"}.get(fmt, "lines"))
            arrived = stream.arrived
        total = None  # a stream cannot be counted without consuming it: only a regular file is read twice
        if count and regular:
            with open(path, "rb") as again, decompressing(again, compression) as counted:
                try:
                    if fmt in delimited.FORMATS:
                        total = delimited.count_rows(counted, fmt)
                    else:
                        total = jsonl.count_rows(counted) if fmt == "jsonl" else text.count_lines(counted)
                except READ_ERRORS as error:
                    raise read_error(name, error) from None
        seek = compression is None
        bom = False
        if fmt in delimited.FORMATS:
            skip = lambda offset, read: skip_bytes(stream, offset, name, seek, read)  # noqa: E731
            try:
                records, schema, bom = delimited.open_delimited(stream, name, field, fmt, start, skip)
            except READ_ERRORS as error:
                raise read_error(name, error) from None
        else:
            skip_bytes(stream, start.offset, name, seek)
            if fmt == "jsonl":
                records = jsonl.read_jsonl(stream, name, field, start, json_array_refusal(path))
                schema = None
            else:
                records = text.read_text(stream, name, field, start)
                schema = pa.schema([(field, pa.string())])
        yield Input(name_read_errors(records, name), total, schema, start, identity, arrived, bom)


def name_read_errors(records: Iterator[Record], name: str) -> Iterator[Record]:
    """The records; a read error (a disk's EIO, a network file system gone, a damaged gzip or zstd stream) names
    the input."""
    try:
        yield from records
    except READ_ERRORS as error:
        raise read_error(name, error) from None


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


def skip_bytes(stream: BinaryIO, count: int, name: str, seek: bool, read: int = 0) -> None:
    """Move past the first `count` bytes, `read` of them read already: a seek on a file, reading them on a pipe
    or a decompressed stream (`seek` False)."""
    if count <= read:
        return
    if seek:
        try:
            stream.seek(count)
            return
        except (OSError, ValueError, AttributeError):
            pass
    count -= read
    while count:
        block = read_block(stream, name, min(count, 1 << 20))
        if not block:
            raise NllbError(f"the input is shorter than the {count} bytes an earlier run read: it is not the same input.")
        count -= len(block)


def read_block(stream: BinaryIO, name: str, size: int = 1 << 20) -> bytes:
    try:
        return stream.read(size)
    except READ_ERRORS as error:
        raise read_error(name, error) from None


@contextmanager
def spool(stream: BinaryIO, name: str) -> Iterator[str]:
    """Copy a stream into a temporary file ($TMPDIR), for readers that need to seek; removed afterwards."""
    with tempfile.NamedTemporaryFile(prefix="nllb-stdin-", suffix=".parquet") as temp:
        try:
            while block := read_block(stream, name):
                temp.write(block)
            temp.flush()
        except OSError as error:
            raise NllbError(f"cannot copy {name} to a temporary file in {tempfile.gettempdir()} (Parquet is read "
                            f"from a file): {error.strerror or error}; set TMPDIR to a directory with room.") from None
        yield temp.name


class LineSink:
    """Text or JSONL lines into a binary stream. A failed row (values None) is left out of JSONL and is an
    empty line in text (`added.hypotheses` lines, with several hypotheses a row; none in the n-best layout,
    whose lines name their row: Added.lines), and a line break inside a
    translation (of a JSONL or Parquet text that held one) is a space in text, so that line n of a text output is
    still the translation of row n of its input (line n * hypotheses + k its k-th). JSONL rows gain the added
    fields (Added)."""

    def __init__(self, stream: BinaryIO, fmt: str, added: Added):
        self.stream, self.fmt = stream, fmt
        self.added = added

    def write(self, records: list[Record], values: list[dict | None]) -> list[tuple[Record, str]]:
        """Write the rows, each with its added fields' values (None: the row failed); returns the (row, reason)
        pairs that could not be written."""
        from .jsonl import encode_jsonl_row, jsonl_fields

        lines: list[bytes] = []
        failed: list[tuple[Record, str]] = []
        fields = jsonl_fields(records, values) if self.fmt == "jsonl" else iter(())
        for record, added in zip(records, values):
            if self.fmt == "text":
                lines += [one_line(text).encode("utf-8") + b"\n" for text in self.added.lines(added, record.index)]
            elif added is not None:
                line, error = encode_jsonl_row(record, next(fields), added)
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


def open_sink(stream: BinaryIO, fmt: str, added: Added, schema: pa.Schema | None, field: str, bom: bool = False,
              document=None):
    """The writer of one format on a stream: `write(records, values) -> failed rows`, `close`, `abort`; values
    holds each row's added fields (Added) by name, None for a failed row. `bom`: a CSV or TSV output begins with
    a byte-order mark (its input did); `document`: a PO output's catalogue (Input.document)."""
    from . import delimited, parquet, po

    if fmt == "po":
        return po.PoSink(stream, added.translation, document)
    if fmt == "parquet":
        return parquet.ParquetSink(stream, schema, added, field)
    if fmt in delimited.FORMATS:
        return delimited.DelimitedSink(stream, fmt, added, schema, field, bom)
    return LineSink(stream, fmt, added)


def file_mode(path: str) -> int:
    """The mode the output gets: the replaced file's, else what the umask allows."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
