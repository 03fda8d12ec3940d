"""JSON Lines: one object per line; the output keeps every field in its order and adds the translation."""

from __future__ import annotations

import base64
import datetime
import json
from typing import BinaryIO, Iterator

from ..errors import NllbError
from . import Record, text_of


def read_jsonl(stream: BinaryIO, name: str, field: str) -> Iterator[Record]:
    """One Record per non-blank line; errors name the file and line."""
    index = 0
    for number, raw in enumerate(stream, start=1):
        where = f"{name}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise NllbError(f"{where}: not valid UTF-8 (byte {error.start + 1}).") from None
        if number == 1:
            line = line.removeprefix("\ufeff")  # a byte-order mark is not part of the JSON
        if not line.strip():
            continue  # blank lines (a trailing one, say) hold no row
        try:
            fields = json.loads(line.rstrip("\r\n"))
        except json.JSONDecodeError as error:
            raise NllbError(f"{where}: not valid JSON: {error.msg} (column {error.colno}).") from None
        if not isinstance(fields, dict):
            raise NllbError(f"{where}: expected a JSON object, not {type(fields).__name__}.")
        yield Record(index, text_of(fields, field, where), fields)
        index += 1


def count_rows(path: str) -> int:
    """Non-blank lines in a file: the rows read_jsonl will yield if every line is valid."""
    with open(path, "rb") as stream:
        return sum(1 for line in stream if line.strip())


def write_jsonl(stream: BinaryIO, records: list[Record], translations: list[str], output_field: str) -> None:
    """Each row's fields plus the translation, one object per line, key order kept."""
    lines = []
    for record, translation in zip(records, translations):
        row = dict(record.fields)
        row[output_field] = translation
        lines.append(json.dumps(row, ensure_ascii=False, default=to_json) + "\n")
    stream.write("".join(lines).encode("utf-8"))
    stream.flush()


def to_json(value: object) -> object:
    """Values a Parquet row can hold that JSON has no type for: dates as ISO 8601, bytes as base64."""
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)  # Decimal, timedelta, ...
