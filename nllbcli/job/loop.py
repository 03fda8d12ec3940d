"""The job: a file (or stream) in, its translations out, in chunks that are each translated, written and committed.

    reader (io/) -> chunks (job/reader.py, a thread ahead) -> rows' sentences, tokenized (job/rows.py) -> length-sorted
    batches -> translator.generate (job/chunks.py) -> decode, join (behind the model) -> writer (io/) -> commit
    (job/state.py); with --devices, worker processes do each chunk's work from its sentences to its joined rows
    (runners/devices.py)

Rows are read `read_chunk_rows` at a time (a chunk from a pipe also ends when the input is quiet), translated,
joined back into rows in input order, and the chunk is written and committed: the partial file fsynced and the
state saved, so that --resume continues after the last commit with the same bytes. The job checks its paths and
fields before any work, never writes over its input, and puts its finished files in place at the end.

A row that cannot be translated (unreadable, no text, an unknown language, text the tokenizer cannot take, a
sentence too large for the GPU even alone) fails alone: with --on-error fail the job stops on it; with skip it
is left out and named on stderr; with record it is left out and written to the --errors file with its input.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from contextlib import ExitStack
from dataclasses import replace
from typing import TYPE_CHECKING

from .chunks import plan_chunk, translate_prepared
from ..model.checkpoint import model_identity
from ..errors import NllbError
from ..io import STDIN_NAME, Input, Position, Record, file_identity, is_regular_file, open_input, open_sink
from ..io.parquet import check_columns
from ..io.streams import compressing
from ..options import BatchOptions, DecodeOptions, Job
from .reader import FINISHER, ChunkReader, Finisher, Inline, fewer_collections, first_chunk_rows
from .progress import Counters, Reporter
from .state import (JobFiles, NamedStream, PartialFile, Saved, converting_path, file_stamp,
                     is_stream, open_job_files, partial_paths, replaced_atomically, save_record, save_state,
                     written_by_nllb)
from .rows import Outcome, each_target, gather_targets, prepare_records, written_rows
from .signals import Stopped, critical, job_finished

if TYPE_CHECKING:
    from ..runners.devices import Pool
    from ..model.translator import Translator


def translate_file(
    translator: Translator,
    job: Job,
    decode: DecodeOptions = DecodeOptions(),
    batching: BatchOptions = BatchOptions(),
    progress: bool | str = False,
    resume: bool = False,
    summary: bool = False,
    reporter_stream=None,
    threads: int | None = None,
    pool: Pool | None = None,
) -> Counters:
    """Translate every row of the job's input into its output; returns the job's counters.

    `progress` is a mode of job/progress.py (True is "bar"); `summary` prints the summary line at the end; `resume`
    continues an interrupted job's partial output (job/state.py); `threads` holds the BLAS library's thread pool, the
    CPU engine's matrix products, to that many threads while the job runs (None: the library's own count). A `Stopped` that ends the job carries
    `resumable`: whether a commit is saved for --resume to continue from, and `rows`: the rows written (or failed)
    before it."""
    mode = {True: "bar", False: "none"}.get(progress, progress)
    check_paths(job)
    check_fields(job)
    job = replace(job, output=follow_link(job.output), errors=follow_link(job.errors))
    files = counters = None
    with ExitStack() as stack:
        try:
            identity = job_identity(translator, job, decode, batching)
            warn = lambda message: print(message, file=reporter_stream or sys.stderr, flush=True)  # noqa: E731
            files = open_job_files(job.output, job.errors if job.on_error == "record" else None, identity,
                                   resume, warn)
            stack.callback(files.close)
            if files.already:
                job_finished()
                if summary:
                    warn(f"Already finished: {job.output} holds this job's {files.saved.counters.get('rows', 0):,} "
                         "rows, and its input and options are unchanged; nothing to do.")
                return Counters()
            if files.finished:
                job_finished()
                counters = Counters(**files.saved.counters)
                Reporter(mode, None, counters, stream=reporter_stream, summary=summary).close()
                return counters
            saved = files.saved
            source = stack.enter_context(open_input(job.input, job.input_format, job.field, count=mode != "none",
                                                    start=saved.position if saved else None))
            check_columns(source.schema, job.input, job.output_format,
                          {"--field": job.field, "--output-field": job.output_field, "--src-lang-field": job.src_field,
                           "--tgt-lang-field": job.tgt_field, "--status-field": job.status_field})
            check_added_columns(source.schema, job)
            counters = Counters(**saved.counters) if saved else Counters()
            reporter = Reporter(mode, source.total, counters, stream=reporter_stream, summary=summary, label=job_label(job))
            stack.enter_context(fewer_collections())
            if threads is not None:
                from threadpoolctl import threadpool_limits

                stack.enter_context(threadpool_limits(limits=threads, user_api="blas"))
            try:
                run(translator, job, decode, batching, source, reporter, files, identity, pool, warn)
            except BaseException:
                reporter.close(summary=False)
                raise
        except BaseException as error:
            if files is not None and not files.finished:
                files.discard_uncommitted()
            if isinstance(error, Stopped):
                error.resumable = files is not None and files.resumable
                error.rows = counters.rows if counters is not None else 0
            raise
        reporter.close()
        return counters


def job_label(job: Job) -> str:
    """What the progress bar names the job by: the input's file name and the direction."""
    name = "stdin" if job.input == "-" else os.path.basename(job.input)
    src, tgt = job.src or f"each row's {job.src_field}", job.tgt or ", ".join(job.targets) or f"each row's {job.tgt_field}"
    return f"{name}: {src} → {tgt}"


def follow_link(path: str | None) -> str | None:
    """A destination that is a symbolic link is written where it points, as the shell's `>` does: the partial
    file goes beside the link's target and is renamed onto it, and the link stays."""
    if path and path != "-" and os.path.islink(path):
        return os.path.realpath(path)
    return path


def check_paths(job: Job) -> None:
    """Refuse a job that would write over its own input: OUTPUT, the errors file and the files written beside
    them (partial, state) are each another file than INPUT, and the errors file another than OUTPUT, also
    through a symbolic or hard link."""
    written = []
    if job.output != "-":
        written.append(("OUTPUT", job.output))
        if not is_stream(job.output):
            written += [*(("OUTPUT's partial file", p) for p in partial_paths(job.output)),
                        ("OUTPUT's temporary file", converting_path(job.output))]
    if job.on_error == "record" and job.errors:
        if job.errors == "-":
            raise NllbError("--errors needs a file: - is not one (--on-error skip names the failed rows on stderr).")
        if job.output != "-" and not is_stream(job.errors) and same_file(job.errors, job.output):
            raise NllbError("--errors must be another file than OUTPUT.")
        written.append(("--errors", job.errors))
        if not is_stream(job.errors):
            written.append(("--errors' partial file", partial_paths(job.errors)[0]))
    if job.input != "-":
        for what, path in written:
            if same_file(job.input, path):
                raise NllbError(f"{what} {path} is the input file {job.input}: refusing to write over the input.")
    if job.output != "-" and not job.force and not is_stream(job.output):
        check_replace(job.output)


def check_replace(output: str) -> None:
    """Refuse to replace a file at OUTPUT that nllb did not write (an empty file aside): with `nllb translate
    dir/*.txt` the shell makes the second input OUTPUT."""
    target = follow_link(output)
    stamp = file_stamp(target)
    if stamp is None or stamp["size"] == 0 or written_by_nllb(target):
        return
    raise NllbError(f"OUTPUT {output} exists and nllb did not write it: refusing to replace it. Pass --force to "
                    "replace it; to translate several files, name an output directory: -o DIR INPUT...")


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file: the same inode where both exist (links included), else the same path
    once links are resolved."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def run(translator, job: Job, decode: DecodeOptions, batching: BatchOptions, source: Input, reporter: Reporter,
        files: JobFiles, identity: dict, pool: Pool | None = None, warn=print) -> None:
    """The chunk loop: translate, write, commit; then put the finished files in place."""
    counters = reporter.counters
    saved, output, errors, state, errors_path = files.saved, files.output, files.errors, files.state, files.errors_path
    compressor = ExitStack()  # a stream's compression, ended after its last row
    if state is None:  # a stream: written as it goes
        stream = compressor.enter_context(compressing(output.stream, job.output_compression))
        sink = open_sink(stream, job.output_format, job.added, source.schema, job.field)
    else:
        sink = open_frames(output, job, source, saved)

    def commit(chunk: list[Record], outcomes: list[Outcome], position: Position) -> None:
        with critical():
            write_chunk(chunk, outcomes, sink, errors, job, reporter)
            errors_bytes = errors.sync() if errors else 0
            if state is not None:
                save_state(state, Saved(identity, position, output.sync(), errors_bytes, vars(counters).copy(),
                                        errors=errors_path, output_file=files.replaces))

    try:
        end = source.position
        if not (saved and saved.done):
            def prepare(chunk: list[Record]):  # on the reader's thread: tokenized, and cut into batches
                if pool is not None:  # the workers do it (runners/devices.py)
                    return None
                copies = each_target(chunk, job)
                outcomes, sentences = prepare_records(translator, copies, job)
                return (copies, outcomes, sentences,
                        plan_chunk(sentences, batching.max_batch_tokens, batching.max_batch_sentences))

            with ChunkReader(source, batching.read_chunk_rows, prepare, ahead=is_regular_file(job.input),
                             first=first_chunk_rows(translator, batching)) as reader, \
                    (Finisher() if FINISHER else Inline()) as finisher:
                def finish(chunk, position, prepared) -> None:
                    copies, outcomes, sentences, batches = prepared
                    finisher.wait(behind=1)  # at most one chunk waits to be committed while this one runs
                    translate_prepared(translator, copies, outcomes, sentences, job, decode, batching.max_batch_tokens,
                                       reporter.advance, finisher, batches)
                    finisher.submit(lambda: commit(chunk, gather_targets(outcomes, job), position), chunk_end=True)

                def finish_translated(chunk, position, _, result) -> None:  # a worker's chunk, in its turn
                    outcomes, rows, tokens = result
                    finisher.wait(behind=1)
                    reporter.advance(rows, tokens)
                    finisher.submit(lambda: commit(chunk, outcomes, position), chunk_end=True)

                if pool is None:
                    for chunk, position, prepared in reader:
                        finish(chunk, position, prepared)
                else:  # the workers translate, several chunks at once; finish_translated takes them in input order
                    pool.translate(reader, job, decode, (batching.max_batch_tokens, batching.max_batch_sentences),
                                   finish_translated, warn)
            end = reader.position
        with critical():
            sink.close()
            compressor.close()
            if state is not None:
                reporter.tick()
                done = Saved(identity, end, output.sync(), errors.sync() if errors else 0, vars(counters).copy(),
                             done=True, errors=errors_path, output_file=files.replaces)
                save_state(state, done)
            output.finish(finish_converter(job, source) if state else None)
            if errors is not None:
                errors.finish()
            if state is not None:
                save_record(state, done, job.output)
            job_finished()
    except BaseException:
        sink.abort()
        raise


def open_frames(output: PartialFile, job: Job, source: Input, saved: Saved | None):
    """The sink of a file output: lines straight into the partial file, Parquet as frames (io/parquet.py)."""
    from ..io import parquet

    if job.output_format != "parquet":
        return open_sink(output.stream, job.output_format, job.added, None, job.field)
    sink = parquet.FrameSink(output.stream, source.schema, job.added, job.field)
    if saved is not None:
        output.stream.flush()
        sink.resume(output.partial)
    return sink


def finish_converter(job: Job, source: Input):
    """How a finished partial file becomes OUTPUT when it is not simply renamed: Parquet written from its frames,
    and a .gz or .zst output compressed (the partial file is written plain, so that --resume can cut it back to
    a commit); None when a rename does."""
    from ..io import file_mode, parquet

    if job.output_format != "parquet" and job.output_compression is None:
        return None

    def convert(partial: str, path: str) -> None:
        """Write the file beside `path` under a fixed name, then rename it into place. The name is fixed, not
        random, so a conversion killed half-way leaves nothing that the next run does not replace."""
        with replaced_atomically(path, converting_path(path), file_mode(path)) as raw:
            target = NamedStream(raw, path)
            with compressing(target, job.output_compression) as sink:
                if job.output_format == "parquet":
                    parquet.frames_to_parquet(partial, sink, source.schema, job.added, job.field)
                else:
                    with open(partial, "rb") as lines:
                        shutil.copyfileobj(lines, sink, 1 << 20)

    return convert


def job_identity(translator, job: Job, decode: DecodeOptions, batching: BatchOptions) -> dict:
    """What shapes the output: a resumed job must match the interrupted one in all of it. (--on-error may
    change: a job that stopped on a bad row can go on with skip or record.)"""
    return {
        "input_format": job.input_format, "output_format": job.output_format, "field": job.field,
        "output_field": job.output_field, "src": job.src, "tgt": job.tgt, "src_field": job.src_field,
        "tgt_field": job.tgt_field, "split": job.split, "decode": decode.identity(),
        "read_chunk_rows": batching.read_chunk_rows, "input": input_identity(job.input),
        **model_identity(getattr(translator, "model_dir", ""), getattr(translator, "adapter", None),
                         getattr(translator, "compute_type", "bfloat16")),
        "device": getattr(translator, "device", ""),
        # only where given, so that a job started before these options existed resumes
        **({"status_field": job.status_field} if job.status_field else {}),
        **({"overwrite_field": True} if job.overwrite_field else {}),
        **({"max_input_length": job.max_input_length} if job.max_input_length else {}),
        **({"score_field": job.score_field, "log_prob_field": job.log_prob_field} if job.score_field else {}),
        **({"hypotheses": job.hypotheses} if job.hypotheses > 1 else {}),
        **({"prefix_field": job.prefix_field} if job.prefix_field else {}),
        **({"targets": list(job.targets), "targets_as": job.targets_as} if job.targets else {}),
    }


def input_identity(path: str) -> dict:
    return {"path": "-"} if path == "-" else file_identity(path)


def write_chunk(chunk: list[Record], outcomes: list[Outcome], sink, errors: PartialFile | None, job: Job,
                reporter: Reporter) -> None:
    """Write a chunk's rows; count and report the failed ones (the writer may fail a row too)."""
    counters = reporter.counters
    added = job.added
    for record, error in sink.write(*written_rows(chunk, outcomes, added)):
        if job.on_error == "fail":
            raise NllbError(error)
        outcome = outcomes[next(i for i, r in enumerate(chunk) if r is record)]
        outcome.translation, outcome.error = None, error
    failed = []
    for record, outcome in zip(chunk, outcomes):
        counters.rows += 1
        if outcome.error is not None:
            counters.failed += 1
            failed.append((record, outcome.error))
        else:
            counters.translated += 1
            counters.sentences += len(outcome.parts)
            counters.cut += outcome.cut
            counters.max_length += outcome.max_length
    if errors is not None:
        errors.stream.write(b"".join(error_line(record, error, job, source) for (record, error), source
                                     in zip(failed, failed_inputs([record for record, _ in failed], job))))
    else:
        for record, error in failed:
            reporter.warn(f"Skipped: {error}")


NO_INPUT = object()  # a failed row whose input JSON cannot hold (Parquet columns of one name)


def failed_inputs(records: list[Record], job: Job) -> list:
    """What each failed row was in the input, for the errors file: a text row's line; a JSONL or Parquet row's
    fields (Python values); a line that could not be read as a row, its text."""
    from ..io.jsonl import jsonl_fields

    readable = [r for r in records if r.raw is None and job.input_format != "text"]
    try:
        fields = list(jsonl_fields(readable, [""] * len(readable)))
    except NllbError:  # names a JSON object cannot hold each once
        fields = [NO_INPUT] * len(readable)
    fields.reverse()
    return [r.raw if r.raw is not None else (r.text if job.input_format == "text" else fields.pop()) for r in records]


def error_line(record: Record, error: str, job: Job, source) -> bytes:
    """A failed row's line in the errors file: its number, why it failed, and its input (as JSON can hold it:
    left out where a value cannot be written, a Parquet NaN say), so that it can be fixed and run again."""
    from ..io.jsonl import Unwritable, strict_json

    head = json.dumps({"row": record.index + 1, "error": error}, ensure_ascii=False)
    if source is NO_INPUT:
        return (head + "\n").encode("utf-8", "backslashreplace")
    try:
        line = head[:-1] + ', "input": ' + strict_json(source) + "}"
    except (Unwritable, RecursionError):
        line = head
    return (line + "\n").encode("utf-8", "backslashreplace")


def check_fields(job: Job) -> None:
    """Refuse, before any work, fields that clash: the translation written over the source text (unless
    --overwrite-field), the status or a score over either or each other, or a status or scores where the output
    (text) has no fields."""
    if job.prefix_field is not None and job.input_format == "text":
        raise NllbError("--prefix-field needs JSONL or Parquet input: a text input has no fields.")
    if job.targets and job.output_format == "text" and job.targets_as != "rows":
        raise NllbError("Several target languages as columns need JSONL or Parquet output: a text output has no "
                        "columns. Pass --targets-as rows for a line per target language.")
    if job.targets and job.targets_as == "rows" and job.output_format != "text" and not job.tgt_field:
        raise NllbError("--targets-as rows names each row's target language in --tgt-lang-field: give it a name.")
    named = [("--field", job.field), *((o, n) for o, n in job.added_fields
                                       if not (o == "--tgt-lang-field" and job.output_format == "text"))]
    for n, (option, name) in enumerate(named[1:], 1):
        if job.output_format == "text" and option != "--output-field":
            what = "--scores" if option in ("--score-field", "--log-prob-field") else option
            raise NllbError(f"{what} needs JSONL or Parquet output: a text output has one translation a line and no "
                            "fields.")
        # a translation over the source text is --overwrite-field's to allow, below
        clash = next((other for other, taken in named[:n]
                      if taken == name and (option, other) != ("--output-field", "--field")), None)
        if clash is not None:
            raise NllbError(f"{option} {name} is {clash}'s field too: name another.")
    translations = [name for option, name in named if option == "--output-field"]
    if job.field in translations and job.output_format != "text" and not job.overwrite_field:
        what = job.output_field if job.output_field == job.field else f"{job.output_field} writes {job.field}, which"
        raise NllbError(f"--output-field {what} is the field being translated (--field), and the "
                        "translation would replace the source text: name another with --output-field, or pass "
                        "--overwrite-field to replace it.")


def check_added_columns(schema, job: Job) -> None:
    """Refuse, before any work, an input schema with a column of the name the translation (or the status) would
    be written to, unless --overwrite-field."""
    if schema is None or job.overwrite_field or job.output_format == "text" or job.input_format == "text":
        return
    name = STDIN_NAME if job.input == "-" else job.input
    for option, column in job.added_fields:
        if column in schema.names:
            raise NllbError(f"{name}: it has a column {column!r} already, which {option} would replace: name "
                            f"another with {option}, or pass --overwrite-field to replace it.")
