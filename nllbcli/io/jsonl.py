"""JSON Lines: one object per line; the output keeps every field in its order and adds the translation."""

from __future__ import annotations

import base64
import datetime
import json
from typing import BinaryIO, Iterator

from . import Position, Record, record_of


JSON_SPACE = " \t\r\n"  # JSON's whitespace: a line of other "space" (\x1c, U+2028, ...) is a bad row, not a blank one


def read_jsonl(stream: BinaryIO, name: str, field: str, position: Position) -> Iterator[Record]:
    """One Record per non-blank line, from `position` on (which it keeps up to date); a line that is not a JSON
    object with a string field is a Record with an error naming the file and line."""
    for raw in stream:
        position.lines += 1
        position.offset += len(raw)
        where = f"{name}:{position.lines}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            yield bad_row(position, f"{where}: not valid UTF-8 (byte {error.start + 1}).", where)
            continue
        if position.lines == 1:
            line = line.removeprefix("\ufeff")  # a byte-order mark is not part of the JSON
        if not line.strip(JSON_SPACE):
            continue  # blank lines (a trailing one, say) hold no row
        try:
            fields = json.loads(line.rstrip("\r\n"))
        except json.JSONDecodeError as error:
            yield bad_row(position, f"{where}: not valid JSON: {error.msg} (column {error.colno}).", where)
            continue
        except RecursionError:
            yield bad_row(position, f"{where}: JSON nested too deeply to read.", where)
            continue
        if not isinstance(fields, dict):
            yield bad_row(position, f"{where}: expected a JSON object, not {type(fields).__name__}.", where)
            continue
        position.rows += 1
        yield record_of(position.rows - 1, fields, field, where)


def bad_row(position: Position, error: str, where: str) -> Record:
    position.rows += 1
    return Record(position.rows - 1, "", {}, error, where)


def count_rows(path: str) -> int:
    """Non-blank lines in a file: the rows read_jsonl will yield."""
    blank = JSON_SPACE.encode()
    with open(path, "rb") as stream:
        return sum(1 for n, line in enumerate(stream) if (line.removeprefix(b"\xef\xbb\xbf") if n == 0 else line).strip(blank))


def encode_jsonl_row(record: Record, translation: str, output_field: str) -> tuple[bytes, str | None]:
    """The row's fields plus the translation as one UTF-8 line, key order kept; or the reason it cannot be one."""
    row = dict(record.fields)
    row[output_field] = translation
    try:
        return (json.dumps(row, ensure_ascii=False, default=to_json) + "\n").encode("utf-8"), None
    except UnicodeEncodeError:
        return b"", f"{record.where}: holds a lone surrogate (a \\ud800-\\udfff escape), which UTF-8 cannot write."
    except (TypeError, ValueError, RecursionError) as error:
        return b"", f"{record.where}: cannot be written as JSON: {error}."


def to_json(value: object) -> object:
    """Values a Parquet row can hold that JSON has no type for: dates as ISO 8601, bytes as base64."""
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)  # Decimal, timedelta, ...
