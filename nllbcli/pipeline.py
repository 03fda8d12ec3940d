"""reader -> chunks -> tokenize -> length-sorted batches -> translator.generate -> decode -> writer.

Rows are read `read_chunk_rows` at a time. Within a chunk, sentences are sorted by length so each batch
pads little, batches are cut at `max_batch_tokens`, and the translations are put back in input order
before the chunk is written. A sentence's translation does not depend on its batch, so none of this
changes the output.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from .io import Record, open_input, open_output
from .options import BatchOptions, DecodeOptions

if TYPE_CHECKING:
    from rich.console import Console

    from .translator import Translator

Advance = Callable[[int, int], None]  # (rows done, tokens generated) since the last call


@dataclass(frozen=True)
class Job:
    """What to translate, from where to where."""

    src: str  # FLORES-200 code of the input text, e.g. eng_Latn
    tgt: str  # FLORES-200 code of the translation
    input: str = "-"  # a path, or - for stdin
    output: str = "-"  # a path, or - for stdout
    input_format: str = "text"  # jsonl, parquet or text
    output_format: str = "text"
    field: str = "text"  # the JSONL field or Parquet column to translate
    output_field: str = "translation"  # the field or column the translation goes to


def translate_file(
    translator: Translator,
    job: Job,
    decode: DecodeOptions = DecodeOptions(),
    batching: BatchOptions = BatchOptions(),
    progress: bool = False,
) -> int:
    """Translate every row of the job's input into its output; returns the number of rows."""
    rows = 0
    with (
        open_input(job.input, job.input_format, job.field, count=progress) as source,
        open_output(job.output, job.output_format, job.output_field, source.schema, job.field) as write,
        progress_display(source.total, progress) as advance,
    ):
        for chunk in read_chunks(source.records, batching.read_chunk_rows):
            write(chunk, translate_records(translator, chunk, job, decode, batching.max_batch_tokens, advance))
            rows += len(chunk)
    return rows


def read_chunks(records: Iterable[Record], size: int) -> Iterator[list[Record]]:
    iterator = iter(records)
    while chunk := list(islice(iterator, size)):
        yield chunk


def translate_records(
    translator: Translator,
    records: list[Record],
    job: Job,
    decode: DecodeOptions,
    max_batch_tokens: int,
    advance: Advance = lambda rows, tokens: None,
) -> list[str]:
    """The translations of a chunk of rows, in the rows' order. Empty texts stay empty, without the model."""
    limit = translator.config.max_position_embeddings
    sources = {
        position: cut_source(translator.tokenizer.encode(record.text, job.src), limit)
        for position, record in enumerate(records)
        if record.text.strip()
    }
    translations = [""] * len(records)
    advance(len(records) - len(sources), 0)
    for batch in plan_batches({position: len(ids) for position, ids in sources.items()}, max_batch_tokens):
        outputs = translator.generate([sources[position] for position in batch], job.tgt, decode)
        for position, ids in zip(batch, outputs):
            translations[position] = translator.tokenizer.decode(ids)
        advance(len(batch), sum(map(len, outputs)))
    return translations


def cut_source(ids: list[int], max_tokens: int) -> list[int]:
    """Keep a source within the model's positions: its first max-1 tokens (the language token first), then </s>."""
    if len(ids) <= max_tokens:
        return ids
    return ids[: max_tokens - 1] + ids[-1:]


def plan_batches(lengths: dict[int, int], max_batch_tokens: int) -> list[list[int]]:
    """Group positions longest first, each batch within rows x longest row <= max_batch_tokens.

    A row longer than the budget goes alone. Longest first, so a batch too large for memory fails early.
    """
    batches: list[list[int]] = []
    batch: list[int] = []
    for position in sorted(lengths, key=lengths.__getitem__, reverse=True):
        if batch and (len(batch) + 1) * lengths[batch[0]] > max_batch_tokens:
            batches.append(batch)
            batch = []
        batch.append(position)
    if batch:
        batches.append(batch)
    return batches


@contextmanager
def progress_display(total: int | None, enabled: bool, console: Console | None = None) -> Iterator[Advance]:
    """A rich progress line on stderr: sentences done, generated tokens/s, and the ETA when the total is known."""
    if not enabled:
        yield lambda rows, tokens: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [
        SpinnerColumn() if total is None else BarColumn(),
        MofNCompleteColumn(),
        TextColumn("sentences"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn() if total is None else TimeRemainingColumn(),
    ]
    with Progress(*columns, console=console or Console(stderr=True)) as bar:
        task = bar.add_task("translate", total=total, rate="")
        start, tokens = time.monotonic(), 0

        def advance(rows: int, new_tokens: int) -> None:
            nonlocal tokens
            tokens += new_tokens
            rate = tokens / max(time.monotonic() - start, 1e-6)
            bar.update(task, advance=rows, rate=f"{rate:,.0f} tokens/s")

        yield advance
