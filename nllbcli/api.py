"""The library: load a model once, then translate lists of strings, streams of them or Arrow tables with the
CLI's semantics (docs/API.md).

    import nllbcli

    translator = nllbcli.load("data/samples/model", threads=2)   # -m's forms; None: $NLLB_MODEL, else the default
    for result in nllbcli.translate(translator, ["Hello. How are you?"], "eng_Latn", "fra_Latn"):
        print(result.text, result.status, result.error)
    table = nllbcli.translate_table(translator, table, src="eng_Latn", tgt="fra_Latn")  # failed rows: in "error"

Rows go through what `nllb translate` does to them: each is split into sentences, which are translated in
length-sorted batches and joined back, a row's own src_lang/tgt_lang fields (columns) override the languages
given, and a row that cannot be translated fails alone: `translate` and `translate_iterable` give its failure as
a value (`Result.error`), `translate_table` keeps it in place with its reason in an error column, or does what
on_error says (fail, skip). The
translations are those of the CLI's output, to the byte. The arguments are checked at the door, as the command
checks its options: one of the wrong type raises TypeError naming it, a value the command refuses ValueError (the
option records') or NllbError (a language, a table's columns).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from types import MappingProxyType

import pyarrow as pa

from .job.chunks import ChunkWorker
from .environment import ENV
from .errors import NllbError
from .io import Position, Record
from .io.parquet import batch_records, check_text_column
from .options import (MAX_THREADS, ON_ERROR, BatchOptions, DecodeOptions, Job, ModelOptions, cpu_threads, described,
                      with_flags)
from .job.reader import read_chunks
from .job.spec import check_added_columns, check_fields
from .job.progress import Reporter
from .job.commit import TableSink, commit_rows
from .job.rows import detected_value, status_of
from .model.translator import Translator, load_translator

DEFAULT_MODEL = "facebook/nllb-200-distilled-600M"
TABLE = "the table"  # what messages call the rows translate_table was given
API_NAMES = MappingProxyType({  # the arguments that messages of the job's checks (job.spec) name, as options there
    "--field": "field", "--output-field": "output_field", "--status-field": "status_field",
    "--score-field": "score_field", "--log-prob-field": "log_prob_field", "--tgt-lang-field": "tgt_field",
    "--error-field": "error_field", "--detected-field": "detected_field", "--overwrite-field": "overwrite_field=True", "--targets-as rows": "targets_as='rows'"})


class Default(str):
    """A default argument a caller can be told from one who gave the same value (compared by identity)."""


ERROR_FIELD = Default("error")  # translate_table's error column, unless on_error says otherwise


@dataclass(frozen=True)
class Result:
    """One row's translation, or why it has none."""

    text: str | None  # the translation (the best, with several hypotheses); None when the row failed
    error: str | None = None  # why the row failed, naming it ("row 3: ..."), else None
    status: str = "ok"  # ok, or the row's flags, comma-joined (--status-field's values: cut,max_length,
    #                     repetition, ..., retried); failed with an error
    hypotheses: list[str] | None = None  # decode.num_hypotheses above 1: the translations, best first
    score: float | list[float] | None = None  # decode.scores: the score (a list with several hypotheses), as --scores
    log_prob: float | list[float] | None = None  # ... and the sum of log-probabilities
    token_scores: list[float] | None = None  # score's, with token_scores=True: each token's log-probability
    detected: dict | None = None  # src "auto": the detected language, {"lang": code, "confidence": 0 to 1}, as
    #                               --detected-field writes it (lang: codes with commas between where sentences differ)


def load(model: str | ModelOptions | None = None, device: str = "auto", adapter: str | None = None,
         compute_type: str = "auto", threads: int | None = None, kv_cache_type: str = "bfloat16") -> Translator:
    """A model directory (or a hub id in the local Hugging Face cache; None: $NLLB_MODEL, else the 600M model)
    on a device (auto, cpu, cuda, cuda:N), with a PEFT LoRA adapter merged where given; compute_type auto,
    bfloat16 or float8 (FP8 matrix products on a Hopper GPU), or int8 on the CPU (load_translator). `model` may be the command's
    record of these, a ModelOptions, in place of the four (and kv_cache_type). `threads`: the BLAS threads the CPU
    engine computes with during each call, as --threads (None: $NLLB_THREADS, else half the cores, the command's
    default). kv_cache_type: the decoder's K/V cache, bfloat16 or float8 (E4M3 with a scale a head), as
    --kv-cache-type."""
    if isinstance(model, ModelOptions):
        model, device, adapter, compute_type, kv_cache_type = (model.model, model.device, model.adapter,
                                                               model.compute_type, model.kv_cache_type)
    for name, value in (("model", model), ("adapter", adapter)):
        check_type(name, value, (str, os.PathLike, type(None)), "a directory (a str or path) or None")
    for name, value in (("device", device), ("compute_type", compute_type), ("kv_cache_type", kv_cache_type)):
        check_type(name, value, str, "a str")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or not 1 <= threads <= MAX_THREADS):
        raise TypeError(f"threads must be a number of threads, 1 to {MAX_THREADS:,}, or None, not {described(threads)}.")
    translator = load_translator(str(model or ENV.model or DEFAULT_MODEL), device, adapter and str(adapter), compute_type,
                                 kv_cache_type)
    translator.threads = threads or ENV.threads or cpu_threads()
    return translator


def translate(translator: Translator, texts: Sequence[str], src: str, tgt: str,
              decode: DecodeOptions | None = None, *, split: bool = True, batching: BatchOptions | None = None,
              max_input_length: int | None = None, protect: bool = False, progress: bool = False,
              flags: Mapping | None = None) -> list[Result]:
    """Each text's Result, in order. `src` and `tgt` take what --src and --tgt take (fra_Latn, fr, fr-CA; src
    "auto": each text's language detected, in Result.detected, a text whose language cannot be detected failing);
    `decode` defaults to the command's (the model's generation_config.json, else nllb's); `batching` to the
    device's (the CLI's); `max_input_length` is --max-input-length; `protect` is --protect (placeholders and markup
    come back exactly, or the text fails); `progress` shows the bar on stderr.
    `flags`: the row flags' options by Job's names (options.with_flags: {"flags": ["repetition"], "min_score":
    -0.5, "retry_flagged": True}), each Result's status naming the flags of its row (docs/FLAGS.md)."""
    check_type("translator", translator, Translator, "a Translator, what nllbcli.load gives")
    check_options(decode, batching, progress)
    if isinstance(texts, (str, bytes, bytearray, Mapping)) or not isinstance(texts, Iterable):
        raise TypeError(f"texts must be a list of strings, not {described(texts)}"
                        + (": put one text in a list, [text]." if isinstance(texts, str) else "."))
    job = with_flags(text_job(translator, src, tgt, split, max_input_length, protect), flags)
    records = list(text_records(texts, job))
    return [result_of(o) for _, o in run_records(translator, records, job, model_decode(translator, decode), batching,
                                                 progress)]


def translate_iterable(translator: Translator, texts: Iterable[str], src: str, tgt: str,
                       decode: DecodeOptions | None = None, *, split: bool = True, batching: BatchOptions | None = None,
                       max_input_length: int | None = None, protect: bool = False,
                       flags: Mapping | None = None) -> Iterator[Result]:
    """translate's Results for a stream of texts (any iterable: a file's lines, a generator), yielded in order as
    each chunk of `batching.read_chunk_rows` texts is translated: memory holds a chunk at a time, whatever the
    stream's length. The texts are taken as the results are asked for; the arguments are checked at the call.
    `flags` as translate's."""
    check_type("translator", translator, Translator, "a Translator, what nllbcli.load gives")
    check_options(decode, batching, False)
    if isinstance(texts, (str, bytes, bytearray, Mapping)) or not isinstance(texts, Iterable):
        raise TypeError(f"texts must be an iterable of strings, not {described(texts)}.")
    job = with_flags(text_job(translator, src, tgt, split, max_input_length, protect), flags)
    decode = model_decode(translator, decode)
    chunks = chunk_outcomes(translator, text_records(texts, job), job, decode, batching, False)
    return (result_of(outcome) for _, outcomes in chunks for outcome in outcomes)


def text_job(translator: Translator, src, tgt, split: bool, max_input_length: int | None, protect: bool = False) -> Job:
    """The job of translate's texts: one row each, its text in the record's field, every failure a value."""
    from .model.langid import resolve_source
    from .model.langs import resolve_lang

    check_type("src", src, str, "a language code (a str), such as eng_Latn or en")
    if isinstance(tgt, (list, tuple)) or isinstance(tgt, str) and "," in tgt:
        raise NllbError(f"translate takes one target language, not {tgt!r}: translate_table takes several.")
    check_type("tgt", tgt, str, "a language code (a str), such as fra_Latn or fr")
    known = translator.tokenizer.lang_codes
    return Job(src=resolve_source(src, known), tgt=resolve_lang(tgt, known), split=split, on_error="skip",
               output_format="jsonl", overwrite_field=True, max_input_length=max_input_length, protect=protect)


def text_records(texts: Iterable, job: Job) -> Iterator[Record]:
    """Each text as a row (a non-string fails its row, as the command's reader fails a row of another type)."""
    for n, text in enumerate(texts):
        yield Record(n, text if isinstance(text, str) else "", {job.field: text},
                     None if isinstance(text, str) else f"row {n + 1}: {type(text).__name__}, not a string.",
                     f"row {n + 1}")


def result_of(outcome) -> Result:
    return Result(outcome.translation, outcome.error, "failed" if outcome.error else status_of(outcome),
                  outcome.hypotheses, outcome.score, outcome.log_prob, outcome.token_scores,
                  detected_value(outcome))


def score(translator: Translator, texts: Sequence[str], translations: Sequence[str], src: str, tgt: str, *,
          length_penalty: float | None = None, split: bool = False, token_scores: bool = False,
          batching: BatchOptions | None = None, max_input_length: int | None = None,
          progress: bool = False) -> list[Result]:
    """`nllb score` on lists: each (text, translation)'s Result, in order, its `text` the translation, with its
    log_prob (the sum of its tokens' log-probabilities under the model, forced decoding), its score (log_prob /
    length ** length_penalty: None takes the model's generation_config.json's, else 1), and with token_scores
    each token's log-probability (the pieces in turn, </s>'s last). `split` scores sentence by sentence (a pair
    whose sentences are not as many fails). A pair that cannot be scored fails alone (Result.error)."""
    check_type("translator", translator, Translator, "a Translator, what nllbcli.load gives")
    check_options(None, batching, progress)
    for name, value in (("texts", texts), ("translations", translations)):
        if isinstance(value, (str, bytes, bytearray, Mapping)) or not isinstance(value, Sequence):
            raise TypeError(f"{name} must be a list of strings, not {described(value)}.")
    if len(texts) != len(translations):
        raise ValueError(f"texts and translations go in pairs: {len(texts):,} texts and {len(translations):,} "
                         "translations.")
    check_type("length_penalty", length_penalty, (int, float, type(None)), "a number or None")
    job = replace(text_job(translator, src, tgt, split, max_input_length), task="score", target_field="translation",
                  score_field="score", log_prob_field="log_prob",
                  token_scores_field="token_scores" if token_scores else None)
    decode = scoring_decode(translator, length_penalty)
    records = list(text_records(texts, job))
    for record, translation in zip(records, translations):
        record.fields[job.target_field] = translation
    return [result_of(o) for _, o in run_records(translator, records, job, decode, batching, progress)]


def translate_table(translator: Translator, table: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch],
                    src: str | None = None, tgt: str | Sequence[str] | None = None,
                    decode: DecodeOptions | None = None, *,
                    field: str = "text", output_field: str = "translation", status_field: str | None = None,
                    error_field: str | None = ERROR_FIELD, src_field: str = "src_lang", tgt_field: str = "tgt_lang",
                    split: bool = True, overwrite_field: bool = False, batching: BatchOptions | None = None,
                    max_input_length: int | None = None, score_field: str = "score", log_prob_field: str = "log_prob",
                    prefix_field: str | None = None, targets_as: str = "columns", on_error: str | None = None,
                    detected_field: str | None = None, protect: bool = False,
                    progress: bool = False, flags: Mapping | None = None) -> pa.Table:
    """The table with the translation (and the status) as string columns, and with `decode.scores` the score
    and log-probability as double columns, as a Parquet output of the CLI has them (lists of them, with
    `decode.num_hypotheses` above 1). A row that cannot be translated keeps its place by default: `on_error`
    "record" (the default) keeps every row, a failed one with a null translation and its reason in the column
    `error_field` ("error"; null for the other rows); "fail" raises NllbError naming the row, as the command does;
    "skip" leaves it out. error_field=None without on_error is "fail". A table whose schema the CLI refuses
    (no text column, one named twice, a column the translation would replace without `overwrite_field`) raises
    NllbError. `prefix_field`: --prefix-field's column. `tgt` may be several languages (a list, or codes with
    commas between): each row is translated into each, as --tgt a,b does, with `targets_as` (--targets-as) columns
    (translation_fra_Latn, ...: io.target_column) or rows (each row once per target, its language in
    `tgt_field`). src="auto" (or "auto" in a row's `src_field`) detects each row's language; `detected_field`
    (--detected-field) names a struct column that gets it, {lang, confidence}. `protect`: --protect. `flags` as translate's: `status_field` gets each row's flags."""
    from .model.langid import resolve_source
    from .model.langs import resolve_targets

    check_type("translator", translator, Translator, "a Translator, what nllbcli.load gives")
    check_options(decode, batching, progress)
    schema, batches = table_batches(table)
    check_languages(src, tgt)
    known = translator.tokenizer.lang_codes
    decode = model_decode(translator, decode)
    targets = () if tgt is None else resolve_targets(tgt, known)
    job = table_job(decode, src and resolve_source(src, known), targets, field=field, output_field=output_field,
                    status_field=status_field, error_field=error_field, src_field=src_field, tgt_field=tgt_field,
                    split=split, overwrite_field=overwrite_field, max_input_length=max_input_length,
                    score_field=score_field, log_prob_field=log_prob_field, prefix_field=prefix_field,
                    targets_as=targets_as, on_error=on_error, detected_field=detected_field, protect=protect)
    return run_table(translator, schema, batches, with_flags(job, flags), decode, batching, progress)


def score_table(translator: Translator, table: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch],
                src: str | None = None, tgt: str | None = None, *, field: str = "text",
                target_field: str = "translation", score_field: str = "score", log_prob_field: str = "log_prob",
                token_scores_field: str | None = None, status_field: str | None = None,
                error_field: str | None = ERROR_FIELD, src_field: str = "src_lang", tgt_field: str = "tgt_lang",
                split: bool = False, overwrite_field: bool = False, batching: BatchOptions | None = None,
                max_input_length: int | None = None, length_penalty: float | None = None, on_error: str | None = None,
                progress: bool = False, flags: Mapping | None = None) -> pa.Table:
    """`nllb score` on a table: each row's translation (the column `target_field`) scored as the text's
    (`field`), the table given back with the score and log-probability as double columns (and each token's, a
    list of doubles, in `token_scores_field` where named), as a Parquet output of `nllb score` has them. Failed
    rows, `on_error`, `error_field`, the languages and `flags` as translate_table's; `length_penalty` as score's."""
    from .model.langid import resolve_source
    from .model.langs import resolve_lang

    check_type("translator", translator, Translator, "a Translator, what nllbcli.load gives")
    check_options(None, batching, progress)
    schema, batches = table_batches(table)
    check_languages(src, tgt)
    if isinstance(tgt, (list, tuple)) or isinstance(tgt, str) and "," in tgt:
        raise NllbError(f"score_table takes one target language, not {tgt!r}: a row's translation is in one.")
    check_type("length_penalty", length_penalty, (int, float, type(None)), "a number or None")
    known = translator.tokenizer.lang_codes
    decode = scoring_decode(translator, length_penalty)
    job = table_job(replace(decode, scores=True), src and resolve_source(src, known),
                    () if tgt is None else (resolve_lang(tgt, known),), field=field, output_field="translation",
                    status_field=status_field, error_field=error_field, src_field=src_field, tgt_field=tgt_field,
                    split=split, overwrite_field=overwrite_field, max_input_length=max_input_length,
                    score_field=score_field, log_prob_field=log_prob_field, prefix_field=None, targets_as="columns",
                    on_error=on_error, task="score", target_field=target_field, token_scores_field=token_scores_field)
    return run_table(translator, schema, batches, with_flags(job, flags), decode, batching, progress)


def run_table(translator: Translator, schema: pa.Schema, batches: list[pa.RecordBatch], job: Job,
              decode: DecodeOptions, batching: BatchOptions | None, progress: bool) -> pa.Table:
    """A table's rows through the job, committed into a table as a Parquet output's (commit.TableSink)."""
    check_text_column(schema, TABLE, job.field)
    check_added_columns(schema, job, API_NAMES)
    position = Position()
    records = [record for batch in batches for record in batch_records(batch, TABLE, job.field, position)]
    sink = TableSink(schema, job)
    run_records(translator, records, job, decode, batching, progress,
                lambda chunk, outcomes, counters: commit_rows(chunk, outcomes, sink, job, counters))
    return sink.table()


def table_job(decode: DecodeOptions, src: str | None, targets: tuple[str, ...], *, field: str, output_field: str,
              status_field: str | None, error_field: str | None, src_field: str, tgt_field: str, split: bool,
              overwrite_field: bool, max_input_length: int | None, score_field: str, log_prob_field: str,
              prefix_field: str | None, targets_as: str, on_error: str | None = None,
              detected_field: str | None = None, protect: bool = False, **score) -> Job:
    """translate_table's job from its arguments (`targets`: the model's codes of `tgt`; `score`: a score job's
    fields, score_table's), its fields checked as the command checks its options' (job.spec.check_fields): a
    field named twice, or the translation over the text without `overwrite_field`, raises NllbError.
    `error_field` takes the errors file's place: a failed row is kept (and skipped by the chunk worker)."""
    if error_field is ERROR_FIELD and on_error in ("fail", "skip"):
        error_field = None  # the default column goes with the default, record
    error_field = None if error_field is None else str(error_field)
    on_error = on_error or ("record" if error_field is not None else "fail")
    check_type("on_error", on_error, str, f"one of {', '.join(ON_ERROR)}, or None")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error is one of {', '.join(ON_ERROR)}, not {on_error!r}.")
    if (on_error == "record") != (error_field is not None):
        raise ValueError("on_error='record' keeps failed rows with their reason in error_field: give both, or "
                         "neither." if on_error == "record" else
                         f"error_field keeps every row with its reason (on_error='record'), and on_error is {on_error!r}.")
    job = Job(src=src, tgt=targets[0] if len(targets) == 1 else None, targets=targets if len(targets) > 1 else (),
              targets_as=targets_as, input=TABLE, input_format="parquet", output_format="parquet", field=field,
              output_field=output_field, src_field=src_field, tgt_field=tgt_field, split=split,
              on_error="fail" if on_error == "fail" else "skip",
              status_field=status_field, error_field=error_field, overwrite_field=overwrite_field,
              max_input_length=max_input_length, score_field=score_field if decode.scores else None,
              log_prob_field=log_prob_field if decode.scores else None, hypotheses=decode.num_hypotheses,
              prefix_field=prefix_field, detected_field=detected_field, protect=protect, **score)
    check_fields(job, API_NAMES)
    return job


def table_batches(table) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """translate_table's `table` as its schema and record batches: a Table's, a RecordBatch, or record batches of
    one schema; anything else raises TypeError (or NllbError: no batch, no columns to know)."""
    if isinstance(table, pa.Table):
        return table.schema, table.to_batches()
    if isinstance(table, pa.RecordBatch):
        return table.schema, [table]
    what = "a pyarrow Table, a RecordBatch or record batches"
    if isinstance(table, (str, bytes, Mapping)) or not isinstance(table, Iterable):
        hint = ": pyarrow.table(columns) makes a Table of a dict of columns" if isinstance(table, Mapping) else ""
        raise TypeError(f"table must be {what}, not {described(table)}{hint}.")
    batches = list(table)
    for batch in batches:
        if not isinstance(batch, pa.RecordBatch):
            raise TypeError(f"table must be {what}, not a {type(table).__name__} holding {described(batch)}.")
    if not batches:
        raise NllbError("translate_table needs a table, or at least one record batch, to know its columns.")
    for n, batch in enumerate(batches[1:], 2):
        if not batch.schema.equals(batches[0].schema, check_metadata=False):
            raise NllbError(f"{TABLE}: record batch {n} has other columns than the first: the batches of a table "
                            "share one schema.")
    return batches[0].schema, batches


def check_type(name: str, value, kinds, what: str) -> None:
    """Refuse an argument that is not of `kinds`, naming it as the caller wrote it."""
    if not isinstance(value, kinds):
        raise TypeError(f"{name} must be {what}, not {described(value)}.")


def check_options(decode, batching, progress) -> None:
    """Refuse decode, batching or progress (translate's, translate_table's) of the wrong type."""
    check_type("decode", decode, (DecodeOptions, type(None)), "a DecodeOptions (nllbcli.DecodeOptions(beam_size=...)) or None")
    check_type("batching", batching, (BatchOptions, type(None)), "a BatchOptions (nllbcli.BatchOptions(...)) or None")
    check_type("progress", progress, bool, "True or False")


def check_languages(src, tgt) -> None:
    """Refuse translate_table's src or tgt of the wrong type."""
    check_type("src", src, (str, type(None)), "a language code (a str), such as eng_Latn or en, or None")
    if not (tgt is None or isinstance(tgt, str) or
            isinstance(tgt, (list, tuple)) and all(isinstance(code, str) for code in tgt)):
        raise TypeError(f"tgt must be a language code (a str), a list of them or None, not {described(tgt)}.")


def model_decode(translator: Translator, decode: DecodeOptions | None = None) -> DecodeOptions:
    """The decoding options as the command takes its options: the fields `decode` was given
    (DecodeOptions.given), over the model's generation_config.json, over nllb's defaults."""
    from pathlib import Path

    from .model.checkpoint import decode_options

    given = {} if decode is None else {name: getattr(decode, name) for name in decode.given}
    return decode_options(Path(translator.model_dir) if translator.model_dir else None, **given)


def scoring_decode(translator: Translator, length_penalty: float | None) -> DecodeOptions:
    """A score job's decoding options: its length penalty (None: the model's generation_config.json's, else 1)."""
    return DecodeOptions(beam_size=1, length_penalty=model_decode(translator).length_penalty
                         if length_penalty is None else length_penalty)


def run_records(translator: Translator, records: list[Record], job: Job, decode: DecodeOptions,
                batching: BatchOptions | None, progress: bool, commit=None) -> list[tuple[Record, object]]:
    """Each record with its Outcome, in order: a chunk at a time, as the CLI's job translates them, each chunk
    handed to `commit(chunk, outcomes, counters)` as it is done where given (the progress bar's Counters)."""
    done = []
    for chunk, outcomes in chunk_outcomes(translator, records, job, decode, batching, progress, len(records), commit):
        done += zip(chunk, outcomes)
    return done


def chunk_outcomes(translator: Translator, records: Iterable[Record], job: Job, decode: DecodeOptions,
                   batching: BatchOptions | None, progress: bool, total: int | None = None,
                   commit=None) -> Iterator[tuple[list[Record], list]]:
    """Each chunk of the records (batching.read_chunk_rows, read as they come) with its Outcomes, in order, the
    chunk handed to `commit(chunk, outcomes, counters)` first where given; the CPU engine on the translator's BLAS
    threads (nllbcli.load's) meanwhile."""
    batching = batching or BatchOptions.for_device(translator.device)
    reporter = Reporter("bar" if progress else "none", total, summary=False)
    worker = ChunkWorker(translator, job, decode, batching)
    with ExitStack() as stack:
        stack.callback(reporter.close, summary=False)
        if translator.device == "cpu" and translator.threads is not None:
            from threadpoolctl import threadpool_limits

            stack.enter_context(threadpool_limits(limits=translator.threads, user_api="blas"))
        for chunk in read_chunks(records, batching.read_chunk_rows):
            outcomes = worker(chunk, reporter.advance)
            if commit is not None:
                commit(chunk, outcomes, reporter.counters)
            yield chunk, outcomes
