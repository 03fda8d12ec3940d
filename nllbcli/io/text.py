"""Text lines: one row per line, one translation per line, in the same order."""

from __future__ import annotations

from typing import BinaryIO, Iterator

from .records import Position, Record, raw_text


def read_text(stream: BinaryIO, name: str, field: str, position: Position) -> Iterator[Record]:
    """One Record per line, without its trailing newline (and a carriage return before it), from `position` on."""
    for raw in stream:
        first = position.offset == 0
        position.lines += 1
        position.rows += 1
        position.offset += len(raw)
        where = f"{name}:{position.lines}"
        end = len(raw) - raw.endswith(b"\n")
        end -= raw.endswith(b"\r", 0, end)
        try:
            line = str(memoryview(raw)[:end], "utf-8")  # without the line's end, and without copying a long line
        except UnicodeDecodeError as error:
            yield Record(position.rows - 1, "", {}, f"{where}: not valid UTF-8 (byte {error.start + 1}).", where,
                         raw=raw_text(raw))
            continue
        if first:
            line = line.removeprefix("\ufeff")  # a byte-order mark is not part of the text
        yield Record(position.rows - 1, line, {field: line}, None, where)


def count_lines(stream: BinaryIO) -> int:
    """Lines in a file's bytes, a final line without a newline included: what read_text will yield."""
    lines, last = 0, b"\n"
    while block := stream.read(1 << 20):
        lines += block.count(b"\n")
        last = block[-1:]
    return lines + (last != b"\n")
