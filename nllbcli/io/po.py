"""gettext PO (and POT) catalogues, through polib: each untranslated entry's texts as rows, and the catalogue
written back with their translations.

Reading: an entry is a row (a plural entry two: its msgid, then its msgid_plural) when it is not obsolete, is
not the header, and has no translation yet (msgstr, and every msgstr[n], empty); entries already translated,
fuzzy ones included, are left as they are unless --po-overwrite translates them again. A row's fields: the text (--field's name), msgctxt, and where it
goes (po_entry: the entry's number in the catalogue, po_form: msgid or msgid_plural). An entry flagged
python-format, c-format or another *-format is protected (Record.protect): its placeholders come back exactly.

Writing: the rows' translations go to the output as frames (a JSON line each: entry, form, translation), the
partial file a file output commits and --resume continues; the catalogue is written whole at the end
(fill_catalogue), beside OUTPUT and renamed into place. An entry gets its translation only when each of its
texts has one (a failed row leaves its entry untranslated, named on stderr or in --errors), and is marked
fuzzy: machine translations are for a translator's review. Comments, context, flags, references, previous
msgids, obsolete entries and the header are kept.

Plural forms: the singular's translation goes to msgstr[0] and the plural's to msgstr[1] ... msgstr[n-1], n
the header's Plural-Forms nplurals (2 without one); a language of one form (nplurals=1: Japanese, Chinese,
...) gets the plural's.
"""

from __future__ import annotations

import json
import re
from typing import BinaryIO, Iterator

from ..errors import NllbError
from .records import Input, Position, Record

FORMS = ("msgid", "msgid_plural")
CHARSET = re.compile(rb"charset=([A-Za-z0-9_.:-]+)")
NPLURALS = re.compile(r"nplurals\s*=\s*(\d+)")


def read_catalogue(data: bytes, name: str):
    """The catalogue (polib.POFile) in a PO file's bytes, decoded by the charset its header names (UTF-8 without
    one)."""
    import polib

    found = CHARSET.search(data[:4096])
    charset = found.group(1).decode("ascii") if found and found.group(1).upper() != b"CHARSET" else "utf-8"
    try:
        text = data.decode(charset)
    except (LookupError, UnicodeDecodeError) as error:
        raise NllbError(f"{name} is not a PO file in its charset {charset}: {error}.") from None
    try:
        return polib.pofile(text, wrapwidth=78)
    except (OSError, ValueError) as error:
        raise NllbError(f"{name} is not a PO file: {error}") from None


def to_translate(entry, retranslate: bool = False) -> bool:
    """Whether the entry is one to translate: not obsolete, not the header, and no translation in any form
    (`retranslate`: translated or not)."""
    if entry.obsolete or entry.msgid == "":
        return False
    return retranslate or (not entry.msgstr and not any(entry.msgstr_plural.values()))


def protected(entry) -> bool:
    """Whether the entry's flags say its text holds placeholders (python-format, c-format, ...)."""
    return any(flag.endswith("-format") and not flag.startswith("no-") for flag in entry.flags)


def catalogue_records(catalogue, name: str, field: str, position: Position, retranslate: bool = False) -> Iterator[Record]:
    """The rows of the catalogue's entries to translate (to_translate), after the `position.rows` an earlier
    run read."""
    rows = 0
    for number, entry in enumerate(catalogue):
        if not to_translate(entry, retranslate):
            continue
        for form in FORMS[:1 + bool(entry.msgid_plural)]:
            rows += 1
            if rows <= position.rows:
                continue
            position.rows += 1
            where = f"{name}: entry {number + 1} (line {entry.linenum})" + (", msgid_plural" if form != "msgid" else "")
            text = getattr(entry, form)
            fields = {field: text, "msgctxt": entry.msgctxt, "po_entry": number, "po_form": form}
            yield Record(position.rows - 1, text, fields, None, where, protect=protected(entry))


def open_po(stream: BinaryIO, name: str, field: str, start: Position, identity: dict,
            retranslate: bool = False) -> Input:
    """A PO file's rows (catalogue_records) as an Input, its catalogue kept for the output (Input.document)."""
    catalogue = read_catalogue(stream.read(), name)
    total = sum(1 + bool(entry.msgid_plural) for entry in catalogue if to_translate(entry, retranslate))
    records = catalogue_records(catalogue, name, field, start, retranslate)
    return Input(records, total, None, start, identity, document=catalogue)


def frame_lines(records: list[Record], values: list[dict | None], translation: str) -> list[bytes]:
    """Each translated row's frame: a JSON line with its entry, its form and its translation (the best one)."""
    lines = []
    for record, added in zip(records, values):
        if added is None or added.get(translation) is None:
            continue
        text = added[translation]
        text = text[0] if isinstance(text, list) else text
        frame = {"entry": record.fields["po_entry"], "form": record.fields["po_form"], "translation": text}
        lines.append(json.dumps(frame, ensure_ascii=False).encode("utf-8") + b"\n")
    return lines


def plural_count(catalogue) -> int:
    """nplurals of the catalogue's Plural-Forms header, else 2 (English's, and most languages')."""
    found = NPLURALS.search(catalogue.metadata.get("Plural-Forms", ""))
    return max(1, int(found.group(1))) if found else 2


def fill_catalogue(catalogue, frames: Iterator[bytes]) -> bytes:
    """The catalogue's bytes with the frames' translations filled in (each entry whose texts all have one,
    marked fuzzy), in its own encoding. Frames name only entries that were rows (catalogue_records)."""
    found: dict[int, dict[str, str]] = {}
    for line in frames:
        if line.strip():
            frame = json.loads(line)
            found.setdefault(frame["entry"], {})[frame["form"]] = frame["translation"]
    count = plural_count(catalogue)
    for number, entry in enumerate(catalogue):
        forms = found.get(number)
        if forms is None or any(form not in forms for form in FORMS[:1 + bool(entry.msgid_plural)]):
            continue
        if entry.msgid_plural:
            texts = [forms["msgid_plural"]] if count == 1 else [forms["msgid"]] + [forms["msgid_plural"]] * (count - 1)
            entry.msgstr_plural = dict(enumerate(texts))
        else:
            entry.msgstr = forms["msgid"]
        if "fuzzy" not in entry.flags:
            entry.flags.insert(0, "fuzzy")  # first, as msgmerge writes it
    charset = catalogue.encoding or "utf-8"
    try:
        return str(catalogue).encode(charset)
    except (LookupError, UnicodeEncodeError) as error:
        raise NllbError(f"the catalogue's charset {charset} cannot hold its translations ({error}): convert it to "
                        "UTF-8 first (msgconv -t UTF-8).") from None


class PoSink:
    """A PO output: the rows' frames (frame_lines) into `stream`, where a file output's partial file keeps them
    for fill_catalogue at the end; on a stream (stdout), the frames are held and the catalogue written at close."""

    def __init__(self, stream: BinaryIO, translation: str, catalogue=None):
        self.stream, self.translation, self.catalogue = stream, translation, catalogue
        self.held: list[bytes] | None = [] if catalogue is not None else None

    def write(self, records: list[Record], values: list[dict | None]) -> list[tuple[Record, str]]:
        lines = frame_lines(records, values, self.translation)
        if self.held is not None:
            self.held += lines
        else:
            self.stream.write(b"".join(lines))
            self.stream.flush()
        return []

    def close(self) -> None:
        if self.held is not None:
            self.stream.write(fill_catalogue(self.catalogue, iter(self.held)))
            self.held = []
        self.stream.flush()

    def abort(self) -> None:
        pass
