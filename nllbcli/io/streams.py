"""The bytes under the readers and writers: an input's format found from its first bytes, gzip and zstd read and
written transparently, and the lines of a pipe or terminal read as they come.

An input named by an extension nllb knows (`.jsonl`, `.ndjson`, `.json`, `.parquet`, `.txt`, `.csv`, `.tsv`, each
optionally `.gz` or `.zst`) is read as it says; stdin and any other name are sniffed: Parquet's magic `PAR1`, gzip's
`1f 8b`, zstd's `28 b5 2f fd` or a skippable frame's (as pzstd writes first), then the decompressed bytes are
sniffed again; a first non-blank character `{` for JSON Lines, a JSON array of objects for one JSON array (which
is refused, naming the jq command that makes it JSON Lines), else text; a NUL byte in the first bytes read is not
text (as grep and git tell binary files). CSV is never sniffed: a text line may hold commas.
A stream's bytes are read once: those read to sniff it are kept (Replay) and given to the reader first, so
nothing is lost. A terminal is text, without sniffing: sniffing would wait for the first line typed.
"""

from __future__ import annotations

import gzip
import io
import os
import select
import stat
import sys
import time
import zlib
from contextlib import contextmanager
from typing import BinaryIO, Iterator

import zstandard

from ..errors import NllbError
from .jsonl import json_array_start

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
MAGIC = ((b"PAR1", "parquet"), (b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"))
# a zstd stream may begin with a skippable frame (pzstd writes one first): magic 0x184D2A50 to 0x184D2A5F, whose
# little-endian bytes are 50..5f, then these
SKIPPABLE_TAIL = b"\x2a\x4d\x18"
SNIFF_BYTES = 1 << 16  # at most this much of an input is read to find its format
BLANK = b" \t\r\n"
BOM = b"\xef\xbb\xbf"
ZSTD_PIECE = 1 << 14  # compressed bytes decompressed at a time: what one piece gives is held at once
# what reading a stream may raise: a disk's EIO, a gzip or zstd stream cut short, damaged, or not one
READ_ERRORS = (OSError, EOFError, zlib.error, zstandard.ZstdError)


class Replay(io.RawIOBase):
    """A binary stream whose first bytes, read ahead to find its format, are given again before the rest. Reads
    return what one read of the source gives (a pipe's line as soon as it is written), and `ready(timeout)` says
    whether a read would return at once, where the source has a file descriptor to ask."""

    def __init__(self, source: BinaryIO):
        try:
            self.fd: int | None = source.fileno()
        except (AttributeError, OSError, ValueError):
            self.fd = None
        self.source = source
        self.head = b""  # bytes read ahead and not given yet
        self.eof = False

    def read_source(self, size: int) -> bytes:
        if self.fd is not None:
            return os.read(self.fd, size)  # one read: what the pipe holds, without waiting for more
        read = getattr(self.source, "read1", None) or self.source.read
        return read(size)

    def fill(self, size: int) -> bytes:
        """At least `size` bytes read ahead (fewer at the end of the stream); returns them all, still to be read."""
        while len(self.head) < size and not self.eof:
            block = self.read_source(SNIFF_BYTES)
            self.eof = not block
            self.head += block
        return self.head

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.head:
            count = min(len(buffer), len(self.head))
            buffer[:count] = self.head[:count]
            self.head = self.head[count:]
            return count
        block = self.read_source(len(buffer))
        buffer[: len(block)] = block
        return len(block)

    def ready(self, timeout: float) -> bool:
        """Whether bytes (or the end) are there to read, waiting at most `timeout` seconds for them."""
        if self.head or self.fd is None:
            return True
        return bool(select.select([self.fd], [], [], timeout)[0])


class Lines:
    """The lines of a Replay, each as soon as its newline has come; `arrived(timeout)` says whether the next row
    is there or came within `timeout` seconds (a pipe that went quiet: the chunk so far is translated). What a
    row is depends on `rows`: "lines", each line (text); "json", each line that is not blank (JSON Lines);
    "csv", the lines up to one that ends outside double quotes, a blank line holding none (CSV and TSV, whose
    quoted fields may hold line breaks)."""

    def __init__(self, source: Replay, rows: str = "lines"):
        self.source, self.rows = source, rows
        self.lines: list[bytes] = []  # whole lines read, given from `next` on
        self.next = 0
        self.partial: list[bytes] = []  # the pieces of a line whose newline has not come
        self.eof = False

    def __iter__(self) -> "Lines":
        return self

    def __next__(self) -> bytes:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def readline(self) -> bytes:
        while self.next == len(self.lines):
            if self.eof or not self.more():
                line = b"".join(self.partial)
                self.partial = []
                return line
        line = self.lines[self.next]
        self.lines[self.next] = b""  # given: not held here too (a long line would be held twice)
        self.next += 1
        return line

    def more(self) -> bool:
        """Read what the source gives next; False at its end."""
        block = self.source.read(SNIFF_BYTES)
        if not block:
            self.eof = True
            return False
        self.feed(block)
        return True

    def feed(self, block: bytes) -> None:
        if b"\n" not in block:
            self.partial.append(block)  # a long line's pieces, joined once when its newline comes
            return
        lines = io.BytesIO(block).readlines()  # split at each newline, kept, in C
        if self.partial:
            lines[0] = b"".join([*self.partial, lines[0]])
        self.partial = [] if lines[-1].endswith(b"\n") else [lines.pop()]
        self.lines, self.next = self.lines[self.next :] + lines, 0

    def read(self, size: int) -> bytes:
        """`size` bytes (fewer at the end), from where the lines have got to (to skip a resumed stream's rows)."""
        pending = b"".join([*self.lines[self.next :], *self.partial])
        self.lines, self.next, self.partial = [], 0, []
        while len(pending) < size and not self.eof:
            block = self.source.read(SNIFF_BYTES)
            self.eof = not block
            pending += block
        if pending[size:]:
            self.feed(pending[size:])
        return pending[:size]

    def arrived(self, timeout: float) -> bool:
        """Whether a whole row is there, or comes within `timeout` seconds: what comes meanwhile is read (a
        line's first part, blank JSON Lines lines), so the next row's read cannot wait on the input."""
        if self.eof or self.next_row():
            return True
        deadline = time.monotonic() + timeout
        while not (self.eof or self.next_row()):
            if not self.source.ready(max(0.0, deadline - time.monotonic())):
                return False
            self.more()
        return True

    def next_row(self) -> bool:
        """Whether the whole lines read already hold a row: a blank JSON Lines line holds none, and one that came
        alone does not keep the rows before it waiting; nor does a CSV record's first line whose quoted field
        goes on in lines still to come."""
        if self.rows == "lines":
            return self.next < len(self.lines)
        quoted = False  # (a quote inside an unquoted field, `5" screen`, may end a chunk early: never a row's bytes)
        for n in range(self.next, len(self.lines)):
            line = self.lines[n]
            if not quoted and not line.strip(BLANK):
                continue
            if self.rows == "json":
                return True
            quoted ^= line.count(b'"') % 2 == 1
            if not quoted:
                return True
        return False


def compression_of(path: str) -> str | None:
    """gzip or zstd when the path's extension says so, else None."""
    return COMPRESSIONS.get(os.path.splitext(path)[1].lower())


def without_compression(path: str) -> str:
    """The path without a .gz or .zst extension: what names its format."""
    return os.path.splitext(path)[0] if compression_of(path) else path


def decompressing(stream: BinaryIO, compression: str | None) -> BinaryIO:
    """The decompressed bytes of `stream`, read as they are needed."""
    if compression is None:
        return stream
    if compression == "gzip":
        return gzip.GzipFile(fileobj=stream, mode="rb")
    return io.BufferedReader(ZstdReader(stream), 1 << 16)


class ZstdReader(io.RawIOBase):
    """The decompressed bytes of a zstd stream, frame after frame, through zstandard's decompressobj: a stream
    that ends inside a frame is an error (zstandard's stream_reader ends there without one, and a cut file would
    read as a shorter one)."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.decompressor = zstandard.ZstdDecompressor()
        self.frame = None  # the frame being read; None before the first
        self.out, self.given = b"", 0  # decompressed bytes, and how many of them were read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self.given == len(self.out):
            data = self.stream.read(ZSTD_PIECE)
            if not data:
                if self.frame is not None and not self.frame.eof:
                    raise EOFError("the zstd stream ends inside a frame (the file is cut short)")
                return 0
            self.out, self.given = self.decompress(data), 0
        count = min(len(buffer), len(self.out) - self.given)
        buffer[:count] = self.out[self.given : self.given + count]
        self.given += count
        return count

    def decompress(self, data: bytes) -> bytes:
        out = []
        while data:
            if self.frame is None or self.frame.eof:
                self.frame = self.decompressor.decompressobj()
            out.append(self.frame.decompress(data))
            data = self.frame.unused_data if self.frame.eof else b""
        return b"".join(out)


@contextmanager
def compressing(stream: BinaryIO, compression: str | None) -> Iterator[BinaryIO]:
    """A writer that compresses into `stream` (left open), the compressed stream's end written when the block
    ends without error. gzip is written as `gzip -n` writes it, without a name or time, so the same rows give
    the same bytes. A flush ends a block: what was written so far can be decompressed by a reader already."""
    if compression is None:
        yield stream
        return
    if compression == "gzip":
        writer = gzip.GzipFile(fileobj=stream, mode="wb", filename="", mtime=0)
    else:
        writer = zstandard.ZstdCompressor().stream_writer(stream, closefd=False)  # its flush() ends a block
    yield writer
    writer.close()


def decompressed_head(head: bytes, compression: str) -> bytes:
    """The first decompressed bytes of a compressed prefix (up to SNIFF_BYTES of them)."""
    out = b""
    try:
        reader = decompressing(io.BytesIO(head), compression)
        while len(out) < SNIFF_BYTES and (block := reader.read(256)):
            out += block
    except Exception:  # noqa: BLE001 - a prefix ends inside the compressed stream: what came before it is enough
        pass
    return out


def format_of_bytes(head: bytes, complete: bool) -> str | None:
    """parquet, jsonl, array (one JSON array of objects), text or binary, from an input's first (decompressed)
    bytes; None when more are needed."""
    if head.startswith(b"PAR1"):
        return "parquet"
    body = head.removeprefix(BOM).lstrip(BLANK)
    if not complete and (not body or b"PAR1".startswith(head)):
        return None
    if b"\0" in head:
        return "binary"
    if body.startswith(b"["):
        array = json_array_start(body.decode("utf-8", "replace"), complete)
        if array is None:
            return None
        return "array" if array else "text"
    return "jsonl" if body.startswith(b"{") else "text"


def read_magic(replay: Replay) -> bytes:
    """The stream's first bytes, as many as tell whether one of MAGIC begins it (a pipe's first line "A\n" is
    not waited on for more)."""
    head = replay.fill(1)
    while not replay.eof and len(head) < 4 and begins_magic(head):
        head = replay.fill(len(head) + 1)
    return head


def begins_magic(head: bytes) -> bool:
    """Whether the bytes (fewer than 4) may be the beginning of a magic number."""
    skippable = 0x50 <= head[0] <= 0x5F and SKIPPABLE_TAIL.startswith(head[1:])
    return skippable or any(magic.startswith(head) for magic, _ in MAGIC)


def compression_in(head: bytes) -> str | None:
    """gzip or zstd when the bytes begin with its magic (zstd's or that of a skippable frame), else None."""
    if len(head) >= 4 and 0x50 <= head[0] <= 0x5F and head[1:4] == SKIPPABLE_TAIL:
        return "zstd"
    return next((name for magic, name in MAGIC[1:] if head.startswith(magic)), None)


def sniff(replay: Replay) -> tuple[str, str | None, bytes]:
    """(format, compression, first bytes) of a stream, the bytes read kept in `replay` to be read again."""
    head = read_magic(replay)
    compression = compression_in(head)
    while True:
        content = decompressed_head(head, compression) if compression else head
        found = format_of_bytes(content, replay.eof or len(head) >= SNIFF_BYTES)
        if found is not None:
            return found, compression, head
        head = replay.fill(len(head) + 1)


def read_error(name: str, error: BaseException) -> NllbError:
    """A read error as the message that names the input."""
    reason = getattr(error, "strerror", None) or str(error).rstrip(".") or type(error).__name__
    return NllbError(f"cannot read {name}: {reason}.")


def describe_head(head: bytes) -> str:
    shown = " ".join(f"{byte:02x}" for byte in head[:8])
    return f"its first bytes are {shown}" if head else "it is empty"


def writes_to_terminal(output: str) -> bool:
    """Whether OUTPUT is a terminal: stdout on one (`-`), or a terminal's device named."""
    if output == "-":
        return sys.stdout.isatty()
    try:
        if not stat.S_ISCHR(os.stat(output).st_mode):
            return False
        fd = os.open(output, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return os.isatty(fd)
    finally:
        os.close(fd)


def is_terminal(stream: BinaryIO) -> bool:
    try:
        return os.isatty(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False

