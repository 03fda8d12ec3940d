"""The library: load a model once, then translate lists of strings or Arrow tables with the CLI's semantics.

    import nllbcli

    translator = nllbcli.load("data/samples/model")          # -m's forms; None: $NLLB_MODEL, else the default
    for result in nllbcli.translate(translator, ["Hello. How are you?"], "eng_Latn", "fra_Latn"):
        print(result.text, result.status, result.error)
    table = nllbcli.translate_table(translator, table, src="eng_Latn", tgt="fra_Latn", error_field="error")

Rows go through what `nllb translate` does to them: each is split into sentences, which are translated in
length-sorted batches and joined back, a row's own src_lang/tgt_lang fields (columns) override the languages
given, and a row that cannot be translated fails alone, as a value (`Result.error`, an error column), never as an
exception: the translations are those of the CLI's output, to the byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import pyarrow as pa

from .batching import translate_records
from .environment import ENV
from .errors import NllbError
from .io import Position, Record
from .io.parquet import batch_records, check_text_column
from .options import BatchOptions, DecodeOptions, Job
from .overlap import read_chunks
from .pipeline import check_added_columns, check_fields
from .progress import Reporter
from .rows import status_of, written_rows
from .translator import Translator, load_translator

DEFAULT_MODEL = "facebook/nllb-200-distilled-600M"


@dataclass(frozen=True)
class Result:
    """One row's translation, or why it has none."""

    text: str | None  # the translation (the best, with several hypotheses); None when the row failed
    error: str | None = None  # why the row failed, naming it ("row 3: ..."), else None
    status: str = "ok"  # ok, cut, max_length or cut,max_length (--status-field's values); failed with an error
    hypotheses: list[str] | None = None  # decode.num_hypotheses above 1: the translations, best first
    score: float | list[float] | None = None  # decode.scores: the score (a list with several hypotheses), as --scores
    log_prob: float | list[float] | None = None  # ... and the sum of log-probabilities


def load(model: str | None = None, device: str = "auto", adapter: str | None = None,
         compute_type: str = "auto") -> Translator:
    """A model directory (or a hub id in the local Hugging Face cache; None: $NLLB_MODEL, else the 600M model)
    on a device (auto, cpu, cuda, cuda:N), with a PEFT LoRA adapter merged where given; compute_type auto,
    bfloat16 or float8 (FP8 matrix products on a Hopper GPU: load_translator)."""
    return load_translator(model or ENV.model or DEFAULT_MODEL, device, adapter, compute_type)


def translate(translator: Translator, texts: Sequence[str], src: str, tgt: str,
              decode: DecodeOptions | None = None, *, split: bool = True, batching: BatchOptions | None = None,
              max_input_length: int | None = None, progress: bool = False) -> list[Result]:
    """Each text's Result, in order. `src` and `tgt` take what --src and --tgt take (fra_Latn, fr, fr-CA);
    `decode` defaults to the command's (the model's generation_config.json, else nllb's); `batching` to the
    device's (the CLI's); `max_input_length` is --max-input-length; `progress` shows the bar on stderr."""
    from .langs import resolve_lang

    known = translator.tokenizer.lang_codes
    if not isinstance(tgt, str) or "," in tgt:
        raise NllbError(f"translate takes one target language, not {tgt!r}: translate_table takes several.")
    job = Job(src=resolve_lang(src, known), tgt=resolve_lang(tgt, known), split=split, on_error="skip",
              output_format="jsonl", overwrite_field=True, max_input_length=max_input_length)
    records = [Record(n, text if isinstance(text, str) else "", {job.field: text},
                      None if isinstance(text, str) else f"row {n + 1}: {type(text).__name__}, not a string.",
                      f"row {n + 1}") for n, text in enumerate(texts)]
    return [Result(o.translation, o.error, "failed" if o.error else status_of(o), o.hypotheses, o.score, o.log_prob)
            for _, o in run_records(translator, records, job, decode or model_decode(translator), batching, progress)]


def translate_table(translator: Translator, table: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch],
                    src: str | None = None, tgt: str | Sequence[str] | None = None,
                    decode: DecodeOptions | None = None, *,
                    field: str = "text", output_field: str = "translation", status_field: str | None = None,
                    error_field: str | None = None, src_field: str = "src_lang", tgt_field: str = "tgt_lang",
                    split: bool = True, overwrite_field: bool = False, batching: BatchOptions | None = None,
                    max_input_length: int | None = None, score_field: str = "score", log_prob_field: str = "log_prob",
                    prefix_field: str | None = None, targets_as: str = "columns", progress: bool = False) -> pa.Table:
    """The table with the translation (and the status) as string columns, and with `decode.scores` the score
    and log-probability as double columns, as a Parquet output of the CLI has them (lists of them, with
    `decode.num_hypotheses` above 1): failed rows left out; with `error_field`, every row kept, a failed one with
    a null translation and its reason in that column (null for the others). A table whose schema the CLI refuses
    (no text column, one named twice, a column the translation would replace without `overwrite_field`) raises
    NllbError. `prefix_field`: --prefix-field's column. `tgt` may be several languages (a list, or codes with
    commas between): each row is translated into each, as --tgt a,b does, with `targets_as` (--targets-as) columns
    (translation_fra_Latn, ...: io.target_column) or rows (each row once per target, its language in
    `tgt_field`)."""
    from .langs import resolve_lang, resolve_targets

    batches = [table] if isinstance(table, pa.RecordBatch) else table.to_batches() if isinstance(table, pa.Table) else list(table)
    schema = table.schema if isinstance(table, (pa.Table, pa.RecordBatch)) else batches[0].schema if batches else None
    if schema is None:
        raise NllbError("translate_table needs a table, or at least one record batch, to know its columns.")
    known = translator.tokenizer.lang_codes
    decode = decode or model_decode(translator)
    targets = () if tgt is None else resolve_targets(tgt, known)
    job = Job(src=src and resolve_lang(src, known), tgt=targets[0] if len(targets) == 1 else None,
              targets=targets if len(targets) > 1 else (), targets_as=targets_as, input_format="parquet",
              output_format="parquet", field=field, output_field=output_field, src_field=src_field,
              tgt_field=tgt_field, split=split, on_error="skip", status_field=status_field,
              overwrite_field=overwrite_field, max_input_length=max_input_length,
              score_field=score_field if decode.scores else None, log_prob_field=log_prob_field if decode.scores else None,
              hypotheses=decode.num_hypotheses, prefix_field=prefix_field)
    check_fields(job)
    check_text_column(schema, "the table", field)
    check_added_columns(schema, job)
    added = job.added
    if error_field is not None and error_field in (field, *added.names):
        raise NllbError(f"error_field {error_field!r} is another added field's or the text's: name another.")
    position = Position()
    records = [record for batch in batches for record in batch_records(batch, "the table", field, position)]
    done = run_records(translator, records, job, decode, batching, progress)
    kept = done if error_field is not None else [(r, o) for r, o in done if o.error is None]
    outcome_of = {id(r): o for r, o in kept}
    records, rows = written_rows([r for r, _ in kept], [o for _, o in kept], added)  # each row once per target, as rows
    names, columns = list(schema.names), rows_of(schema, records)
    rows = [row or {} for row in rows]  # a failed row's added columns are null ...
    if added.target is not None:  # ... but for its target language, as rows
        for n, row in enumerate(rows):
            row.setdefault(added.target, job.targets[n % len(job.targets)])
    values = {name: ([row.get(name) for row in rows], kind) for name, kind in added.types.items()}
    if error_field is not None:
        values[error_field] = ([outcome_of[id(r)].error for r in records], pa.string())
    for name, (column, kind) in values.items():  # in place where the input has the column (overwrite_field), else last
        if name in names:
            columns[names.index(name)] = pa.array(column, kind)
        else:
            names.append(name)
            columns.append(pa.array(column, kind))
    return pa.Table.from_arrays(columns, names=names)


def rows_of(schema: pa.Schema, records: list[Record]) -> list[pa.ChunkedArray]:
    """The input columns of these rows, from their batches."""
    from .io.parquet import batch_groups, take_rows

    parts = [take_rows(batch, [r.row for r in group]) for batch, group in batch_groups(records)]
    taken = pa.Table.from_batches(parts, schema=schema) if parts else schema.empty_table()
    return taken.columns


def model_decode(translator: Translator) -> DecodeOptions:
    """The command's decoding options for the translator's model when none are given."""
    from pathlib import Path

    from .checkpoint import decode_options

    return decode_options(Path(translator.model_dir) if translator.model_dir else None)


def run_records(translator: Translator, records: list[Record], job: Job, decode: DecodeOptions,
                batching: BatchOptions | None, progress: bool) -> list[tuple[Record, object]]:
    """Each record with its Outcome, in order: a chunk at a time, as the CLI's job translates them."""
    batching = batching or BatchOptions.for_device(translator.device)
    reporter = Reporter("bar" if progress else "none", len(records), summary=False)
    done = []
    try:
        for chunk in read_chunks(records, batching.read_chunk_rows):
            outcomes = translate_records(translator, chunk, job, decode, batching.max_batch_tokens, reporter.advance,
                                         batching.max_batch_sentences)
            done += zip(chunk, outcomes)
    finally:
        reporter.close(summary=False)
    return done
