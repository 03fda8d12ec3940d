"""JSON Lines: one object per line; the output keeps every field in its order and adds the translation.

Input and output are strict JSON (RFC 8259), and an object's names are unique (a name given twice is a bad row:
one of its values would be lost). A number that Python's int and float cannot hold as it is written
(an integer of more digits than int() takes, a literal beyond a double's range such as 1e400) is read as a
RawNumber and written back as its own text; NaN and Infinity are not JSON, so a line holding them is a bad row,
and a value JSON has no number for (a Parquet NaN) fails its row rather than being written as one.
"""

from __future__ import annotations

import base64
import datetime
import json
import math
import re
from typing import BinaryIO, Iterator, Mapping

from ..errors import NllbError
from .records import Position, RawNumber, Record, Unreadable, raw_text, record_of


JSON_SPACE = " \t\r\n"  # JSON's whitespace: a line of other "space" (\x1c, U+2028, ...) is a bad row, not a blank one
JSON_SPACE_BYTES = JSON_SPACE.encode()
LINE_END = b"\r\n"
BOM_BYTES = b"\xef\xbb\xbf"
LEADING_SPACE = re.compile(b"[ \t\r\n]*")


class NotJson(Exception):
    """A literal Python's json module takes that RFC 8259 does not (NaN, Infinity, -Infinity)."""


class RepeatedName(Exception):
    """An object that gives one name twice: a dict keeps one of the values."""


def exact_float(text: str) -> float | RawNumber:
    value = float(text)
    if math.isinf(value) or (value == 0 and any(c in "123456789" for c in text.split("e")[0].split("E")[0])):
        return RawNumber(text)  # beyond a double's range: overflow to infinity, underflow to zero
    return value


def exact_int(text: str) -> int | RawNumber:
    try:
        return int(text)
    except ValueError:  # more digits than int() takes (sys.get_int_max_str_digits)
        return RawNumber(text)


def refuse_constant(name: str) -> None:
    raise NotJson(f"{name} is not a JSON value (RFC 8259)")


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """An object's pairs as a dict, refusing a name given twice: a dict would keep the last value and lose the
    other without a word (~0.2 us an object)."""
    fields = dict(pairs)
    if len(fields) != len(pairs):
        seen: set[str] = set()
        twice = next(name for name, _ in pairs if name in seen or seen.add(name))
        raise RepeatedName(f"the name {json.dumps(twice, ensure_ascii=False)} appears twice in one object, and "
                           "only one of its values could be kept")
    return fields


# parse_float is the hook that sees 1e400; parse_int costs more and is needed only past int()'s digit limit
DECODER = json.JSONDecoder(parse_float=exact_float, parse_constant=refuse_constant, object_pairs_hook=unique_keys)
LONG_INT_DECODER = json.JSONDecoder(parse_float=exact_float, parse_int=exact_int, parse_constant=refuse_constant,
                                    object_pairs_hook=unique_keys)


def parse_json(text: str) -> object:
    try:
        return DECODER.decode(text)
    except json.JSONDecodeError:
        raise
    except ValueError:  # an integer longer than int() takes: read it again, keeping such numbers as their text
        return LONG_INT_DECODER.decode(text)


def read_jsonl(stream: BinaryIO, name: str, field: str, position: Position, refusal: str | None = None) -> Iterator[Record]:
    """One Record per non-blank line, from `position` on (which it keeps up to date); a line that is not a JSON
    object with a string field is a Record with an error naming the file and line. An input that begins as one
    JSON array of objects is refused with NllbError(`refusal`) before its first row, where `refusal` is given."""
    lines = iter(stream)
    if refusal is not None and position.offset == 0:
        lines = refusing_an_array(lines, refusal)
    for raw in lines:
        position.lines += 1
        position.offset += len(raw)
        record = line_record(raw, position.lines, position.rows, name, field)
        if record is not None:
            position.rows += 1
            yield record


ARRAY_LOOKAHEAD = 1 << 16  # characters read past an input's opening `[` to tell a JSON array of objects


def json_array_start(text: str, complete: bool) -> bool | None:
    """Whether an input's first characters begin one JSON array of objects (`[`, an object, then `,` or `]`),
    as a file that is one JSON array does, not JSON Lines; None when they end before it is known, unless
    `complete` (they are the whole input). A JSON Lines row that is a list (`[1, 2]`, `[]`) is not one: a bad
    row as before."""
    body = text.removeprefix("\ufeff").lstrip(JSON_SPACE)
    if not body.startswith("["):
        return False
    start = len(body) - len(body[1:].lstrip(JSON_SPACE))
    if start == len(body):
        return None if not complete else False
    if body[start] != "{":
        return False
    try:
        _, end = PLAIN_DECODER.raw_decode(body, start)
    except json.JSONDecodeError as error:
        # the object may go on in lines not read yet when it breaks off on the last line (a JSON string holds no
        # line break, so one begun on an earlier line has broken off for good)
        last_line = body.rstrip("\r\n").rfind("\n") + 1
        return None if not complete and error.pos >= last_line else False
    except (ValueError, RecursionError):  # an integer longer than int() takes, nesting too deep: a bad row
        return False
    after = body[end:].lstrip(JSON_SPACE)
    if not after:
        return None if not complete else False
    return after[0] in ",]"


PLAIN_DECODER = json.JSONDecoder()


def refusing_an_array(lines: Iterator[bytes], refusal: str) -> Iterator[bytes]:
    """The lines, unless the first ones begin one JSON array of objects (json_array_start): NllbError(refusal)."""
    held: list[bytes] = []
    text = ""
    for raw in lines:
        held.append(raw)
        if not text:  # (a long first line is neither copied nor decoded unless it begins with `[`)
            first = LEADING_SPACE.match(raw, len(BOM_BYTES) if len(held) == 1 and raw.startswith(BOM_BYTES) else 0).end()
            if first == len(raw):
                continue  # a blank line
            if raw[first:first + 1] != b"[":
                break
        text += raw.decode("utf-8", "replace")
        found = json_array_start(text, complete=False)
        if found is None and len(text) < ARRAY_LOOKAHEAD:
            continue
        if found:
            raise NllbError(refusal)
        break
    else:
        if text and json_array_start(text, complete=True):
            raise NllbError(refusal)
    yield from held
    yield from lines


def line_record(raw: bytes, line: int, index: int, name: str, field: str) -> Record | None:
    """The row of line number `line` (from 1, its end included or not) as row `index`; None for a blank line."""
    where = f"{name}:{line}"
    end = len(raw)
    while end and raw[end - 1] in LINE_END:
        end -= 1
    try:
        text = str(memoryview(raw)[:end], "utf-8")  # without the line's end, and without copying a long line
    except UnicodeDecodeError as error:
        return bad_row(index, f"{where}: not valid UTF-8 (byte {error.start + 1}).", where, raw_text(raw))
    if line == 1:
        text = text.removeprefix("\ufeff")  # a byte-order mark is not part of the JSON
    if not text.lstrip(JSON_SPACE):
        return None  # blank lines (a trailing one, say) hold no row
    try:
        fields = parse_json(text)
    except json.JSONDecodeError as error:
        return bad_row(index, f"{where}: not valid JSON: {error.msg} (column {error.colno}).", where, text)
    except (NotJson, RepeatedName) as error:
        return bad_row(index, f"{where}: {'not valid JSON: ' if isinstance(error, NotJson) else ''}{error}.", where, text)
    except RecursionError:
        return bad_row(index, f"{where}: JSON nested too deeply to read.", where, text)
    if not isinstance(fields, dict):
        return bad_row(index, f"{where}: expected a JSON object, not {type(fields).__name__}.", where, text)
    return record_of(index, fields, field, where)


def bad_row(index: int, error: str, where: str, line: str) -> Record:
    """A line that is not a row, kept as its text (without its line break) for the errors file."""
    return Record(index, "", {}, error, where, raw=line.rstrip("\r\n"))


def is_blank_line(raw: bytes, line: int) -> bool:
    """Whether line_record finds no row in the line (from its bytes alone: a line that is not UTF-8 is a row)."""
    return not (raw.removeprefix(b"\xef\xbb\xbf") if line == 1 else raw).strip(JSON_SPACE_BYTES)


def count_rows(stream: BinaryIO) -> int:
    """Non-blank lines in a file's bytes: the rows read_jsonl will yield."""
    return sum(1 for n, line in enumerate(stream, 1) if not is_blank_line(line, n))


def jsonl_fields(records: list[Record], values: list) -> Iterator[Mapping]:
    """The fields of each row to be written (its added values not None), in order: a Parquet row's from its
    Arrow data, converted a chunk at a time."""
    from .parquet import python_rows

    written = [r for r, v in zip(records, values) if v is not None]
    if any(r.batch is not None for r in written):
        return iter(python_rows(written))
    return (r.fields for r in written)


def encode_jsonl_row(record: Record, fields: Mapping, added: Mapping) -> tuple[bytes, str | None]:
    """The row's fields plus the added ones (the translation, its status, scores) as one UTF-8 line of strict JSON, key
    order kept; or the reason it cannot be one."""
    row = dict(fields)
    row.update(added)
    try:
        return (strict_json(row) + "\n").encode("utf-8"), None
    except UnicodeEncodeError:
        return b"", f"{record.where}: holds a lone surrogate (a \\ud800-\\udfff escape), which UTF-8 cannot write."
    except Unwritable as error:
        return b"", f"{record.where}: {error}"
    except RecursionError:
        return b"", f"{record.where}: nested too deeply to write as JSON."


def strict_json(value: object) -> str:
    """A value as strict JSON text, the same as json.dumps's where json.dumps can write it exactly; Unwritable
    (naming the field) for what JSON has no form for, RecursionError for what is nested too deeply."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, default=to_json)
    except (ValueError, TypeError, Exact):  # NaN, an int past str()'s digit limit, a RawNumber, ...
        return exact_json(value, "")


class Exact(Exception):
    """Raised by to_json for values only exact_json writes (json.dumps cannot write raw text)."""


class Unwritable(Exception):
    """Why a value cannot be written as JSON, naming its field."""


def to_json(value: object) -> object:
    """Values a Parquet row can hold that JSON has no type for: dates as ISO 8601, bytes as base64."""
    if isinstance(value, (RawNumber, Unreadable)):
        raise Exact
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)  # Decimal, timedelta, ...


def exact_json(value: object, path: str) -> str:
    """json.dumps's text of `value` (the same separators), with what json.dumps cannot write: RawNumbers as
    their text and integers past str()'s digit limit in full; NaN, infinities and unreadable values raise
    Unwritable naming the field (`path`)."""
    if isinstance(value, RawNumber):
        return value.text
    if isinstance(value, Unreadable):
        raise Unwritable(f"field {path!r} cannot be read: {value.reason}")
    if isinstance(value, float) and not math.isfinite(value):
        name = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        raise Unwritable(f"field {path!r} is {name}, which JSON has no number for.")
    if isinstance(value, int) and not isinstance(value, bool):
        return int_text(value)
    if isinstance(value, dict):
        return "{" + ", ".join(json.dumps(key if isinstance(key, str) else json.dumps(key), ensure_ascii=False) + ": "
                               + exact_json(item, f"{path}.{key}" if path else str(key)) for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(exact_json(item, f"{path}[{n}]") for n, item in enumerate(value)) + "]"
    return json.dumps(value, ensure_ascii=False, default=to_json)


INT_PIECE = 10 ** 4000  # within str()'s digit limit


def int_text(value: int) -> str:
    """An integer's decimal digits, however many (str() refuses more than sys.get_int_max_str_digits)."""
    try:
        return str(value)
    except ValueError:
        pass
    pieces, rest = [], abs(value)
    while rest:
        rest, piece = divmod(rest, INT_PIECE)
        pieces.append(piece)
    head, *tail = reversed(pieces)
    return ("-" if value < 0 else "") + str(head) + "".join(str(piece).zfill(4000) for piece in tail)
