"""What the readers give and the writers take: a row as a Record, how far a reader has got (Position), an opened
Input, the fields a job adds to each row (Added), and the values a reader keeps as they were written
(RawNumber) or could not read (Unreadable). Every module of io imports these; this one imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

import pyarrow as pa

STDIN_NAME = "<stdin>"  # how stdin is named in error messages
SHOWN_DIGITS = 20  # how much of a long number a message shows


@dataclass
class Record:
    """One input row. A row that cannot be read (malformed JSON, a missing or non-string field) is still a
    Record, with `error` set, so it keeps its place and its number."""

    index: int  # position in the input, from 0
    text: str  # the text to translate ("" for a bad row)
    fields: Mapping  # the row's fields by name, the text field included, in input order: a JSONL or text row's
    #                  own dict; a Parquet row's columns as Python values, converted from `batch` when asked for
    error: str | None = None  # why the row cannot be translated, naming it ("in.jsonl:3: not valid JSON ..."), else None
    where: str = ""  # how messages name the row: "in.jsonl:3" (file and line), "in.parquet: row 3" or
    #                  "in.csv: row 3 (line 4)"
    # a Parquet row's Arrow data and its place there: the writers take the row from it, whatever its types
    batch: pa.RecordBatch | None = field(default=None, repr=False, compare=False)
    row: int = 0
    raw: str | None = None  # a line that could not be read as a row (not JSON, not UTF-8), as text, for --errors
    tgt: str | None = None  # the target language the job gives this copy of the row (one of several: --tgt a,b)
    protect: bool = False  # its placeholders and markup are kept out of the model's hands (job/protect.py) without
    #                        --protect: a PO entry flagged python-format or c-format


@dataclass
class Position:
    """How far a reader has got: enough to continue after the last row it gave (for --resume)."""

    rows: int = 0  # rows read, bad ones included
    lines: int = 0  # lines read, blank ones included (text, JSONL, CSV and TSV)
    offset: int = 0  # bytes read (text, JSONL, CSV and TSV: the end of the last record given, header included)


@dataclass
class Input:
    """An opened input: its rows, and what is known about them before they are read."""

    records: Iterator[Record]
    total: int | None  # rows in the input when they can be counted cheaply, else None
    schema: pa.Schema | None  # the Arrow schema of the rows, when the format has one
    position: Position  # just after the last row `records` gave
    identity: dict  # what --resume checks to know it is the same input: path, size and modification time
    # for a pipe or terminal, whether its next line is there or comes within a timeout (seconds); else None
    arrived: Callable[[float], bool] | None = None
    bom: bool = False  # it began with a UTF-8 byte-order mark, which a CSV or TSV output keeps (Excel's files have one)
    document: object = None  # a PO input's catalogue (polib.POFile), which a PO output is written from


def record_of(index: int, fields: dict, field: str, where: str) -> Record:
    error = text_error(fields, field, where)
    return Record(index, "" if error else fields[field], fields, error, where)


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


def target_column(name: str, code: str) -> str:
    """The field (column) of one target language's value when a job translates into several as columns."""
    return f"{name}_{code}"


@dataclass(frozen=True)
class Added:
    """The fields (JSONL) or columns (Parquet) a job adds to each row: the translation, and where named its
    status, its score and its log-probability (--scores). Each replaces the input's own field of that name, in
    place. With `hypotheses` above 1 (--num-hypotheses) the translation, score and log-probability are lists
    of that many, best first. With several target languages, either each of these fields comes once per
    target, named target_column(name, code), field by field (`targets`), or each row comes once per target
    with its target language in the field `target` (--targets-as rows). With `error` named (the API's
    error_field), a failed row is kept, its reason in that field and the others null (null for the other rows)."""

    translation: str
    status: str | None = None
    score: str | None = None
    log_prob: str | None = None
    hypotheses: int = 1
    targets: tuple[str, ...] = ()  # the target languages, as columns
    target: str | None = None  # the field naming each row's target language, as rows
    error: str | None = None  # the field that gets a failed row's reason, every row kept
    nbest: bool = False  # a text output's lines in marian's n-best layout (lines), with the row and the scores
    token_scores: str | None = None  # a score job's: the field of each token's log-probability, </s>'s last
    detected: str | None = None  # the field that gets the row's detected source language (--detected-field), once
    #                              a row whatever its targets

    @property
    def single(self) -> Added:
        """The fields of one target language's translation."""
        return Added(self.translation, self.status, self.score, self.log_prob, self.hypotheses)

    @property
    def options(self) -> tuple[tuple[str, str], ...]:
        """(option, name) of each added field, for messages."""
        named = (("--output-field", self.translation), ("--status-field", self.status), ("--score-field", self.score),
                 ("--log-prob-field", self.log_prob), ("--token-scores", self.token_scores))
        named = tuple((option, name) for option, name in named if name is not None)
        error = (("--error-field", self.error),) if self.error is not None else ()  # the API's alone
        row = (("--detected-field", self.detected),) if self.detected is not None else ()  # once a row
        if self.targets:
            return (tuple((option, target_column(name, code)) for option, name in named for code in self.targets) + row
                    + error)
        return ((("--tgt-lang-field", self.target),) if self.target is not None else ()) + named + row + error

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for _, name in self.options)

    @property
    def types(self) -> dict:
        """Each added column's Arrow type."""
        import pyarrow as pa

        many = self.hypotheses > 1
        text, number = (pa.list_(pa.string()), pa.list_(pa.float64())) if many else (pa.string(), pa.float64())
        kinds = {self.translation: text, self.status: pa.string(), self.score: number, self.log_prob: number,
                 self.error: pa.string(), self.token_scores: pa.list_(pa.float64()),
                 self.detected: pa.struct([("lang", pa.string()), ("confidence", pa.float64())])}
        if self.targets:
            return {**{target_column(name, code): kinds[name] for name in self.single.names for code in self.targets},
                    **{name: kinds[name] for name in (self.detected, self.error) if name is not None}}
        if self.target is not None:
            kinds = {self.target: pa.string(), **kinds}
        return {name: kinds[name] for name in self.names}

    def lines(self, values: dict | None, row: int = 0) -> list[str]:
        """A row's translations as a text output has them: one, or `hypotheses` lines (empty for a failed row). In
        the n-best layout (`nbest`), each `ROW ||| TRANSLATION ||| log_prob= LOG_PROB ||| SCORE`, ROW counting
        the input's rows from 0, the numbers as JSON writes them; none for a failed row."""
        if values is None:
            return [] if self.nbest else [""] * self.hypotheses
        if self.translation is None:  # a score job's: LOG_PROB, SCORE and the tokens' log-probabilities, tab apart
            import json

            numbers = [json.dumps(values[self.log_prob]), json.dumps(values[self.score])]
            if self.token_scores is not None:
                numbers.append(" ".join(map(json.dumps, values[self.token_scores])))
            return ["\t".join(numbers)]
        many = self.hypotheses > 1
        texts = list(values[self.translation]) if many else [values[self.translation]]
        if not self.nbest:
            return texts
        import json

        scores, log_probs = ((values[name] if many else [values[name]]) for name in (self.score, self.log_prob))
        return [f"{row} ||| {text} ||| log_prob= {json.dumps(log_prob)} ||| {json.dumps(score)}"
                for text, score, log_prob in zip(texts, scores, log_probs)]


class RawNumber:
    """A JSON number kept as its text, because int or float would change it."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RawNumber) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"RawNumber({self.text!r})"

    def describe(self) -> str:
        """The number in a message: huge ones shortened."""
        if len(self.text) <= SHOWN_DIGITS:
            return self.text
        return f"{self.text[:SHOWN_DIGITS]}... ({len(self.text)} characters)"


class Unreadable:
    """A value a reader could not turn into Python (text that is not UTF-8, say), with why: a writer that needs
    the value fails the row with that reason."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason

    def __repr__(self) -> str:
        return f"Unreadable({self.reason!r})"
