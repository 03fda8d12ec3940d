"""Text lines: one row per line, one translation per line, in the same order."""

from __future__ import annotations

from typing import BinaryIO, Iterator

from ..errors import NllbError
from . import Record


def read_text(stream: BinaryIO, name: str, field: str) -> Iterator[Record]:
    """One Record per line, without its trailing newline (and a carriage return before it)."""
    for index, raw in enumerate(stream):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise NllbError(f"{name}:{index + 1}: not valid UTF-8 (byte {error.start + 1}).") from None
        line = line.removesuffix("\n").removesuffix("\r")
        if index == 0:
            line = line.removeprefix("\ufeff")  # a byte-order mark is not part of the text
        yield Record(index, line, {field: line})


def count_lines(path: str) -> int:
    """Lines in a file, a final line without a newline included: what read_text will yield."""
    lines, last = 0, b"\n"
    with open(path, "rb") as stream:
        while block := stream.read(1 << 20):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def write_text(stream: BinaryIO, translations: list[str]) -> None:
    """One line per translation; written as each chunk is done so pipes see it."""
    stream.write("".join(text + "\n" for text in translations).encode("utf-8"))
    stream.flush()
