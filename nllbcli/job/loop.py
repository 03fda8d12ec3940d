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

import sys
from contextlib import ExitStack
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Protocol

from ..errors import NllbError
from ..io import STDIN_NAME, Input, Position, Record, is_regular_file, open_input, open_sink
from ..io.parquet import check_columns
from ..io.streams import compressing
from ..options import BatchOptions, DecodeOptions, Job
from .chunks import ChunkWorker
from .commit import finish_converter, open_frames, write_chunk
from .progress import Counters, Reporter
from .reader import FINISHER, ChunkReader, Finisher, Inline, fewer_collections, first_chunk_rows
from .rows import Outcome
from .signals import Stopped, critical, job_finished
from .spec import check_added_columns, check_fields, check_paths, follow_link, job_identity, job_label
from .state import JobFiles, Saved, open_job_files, remove_state, save_record, save_state

if TYPE_CHECKING:
    from ..model.translator import Translator


class Pool(Protocol):
    """Workers that translate a job's chunks elsewhere (runners/devices.py's Pool): each chunk's rows through
    their ChunkWorker, `finish(chunk, position, prepared, outcomes)` called in input order, `advance(rows, tokens)`
    as their batches end."""

    def translate(self, chunks: Iterable[tuple], job: Job, decode: DecodeOptions, batching: BatchOptions,
                  finish: Callable[..., None], advance: Callable[[int, int], None],
                  warn: Callable[[str], None]) -> None: ...

    def check(self, identity: dict) -> None:
        """Refuse a job whose identity names another model than the workers loaded."""


def output_name(job: Job) -> str:
    """The output as the summary names it."""
    return "stdout" if job.output == "-" else job.output


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
    where: str = "",
) -> Counters:
    """Translate every row of the job's input into its output; returns the job's counters.

    `progress` is a mode of job/progress.py (True is "bar"); `summary` prints the summary line at the end; `resume`
    continues an interrupted job's partial output (job/state.py); `threads` holds the BLAS library's thread pool, the
    CPU engine's matrix products, to that many threads while the job runs (None: the library's own count); `where`
    says in the summary where the job ran (progress.Reporter). A `Stopped` that ends the job carries
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
            if pool is not None:
                pool.check(identity)
            warn = lambda message: print(message, file=reporter_stream or sys.stderr, flush=True)  # noqa: E731
            files = open_job_files(job.output, job.errors if job.records_errors else None, identity,
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
                Reporter(mode, None, counters, stream=reporter_stream, summary=summary, output=output_name(job),
                         where=where).close()
                return counters
            saved = files.saved
            source = stack.enter_context(open_input(job.input, job.input_format, job.field, count=mode != "none",
                                                    start=saved.position if saved else None,
                                                    retranslate=job.po_overwrite))
            check_columns(source.schema, job.input, job.output_format,
                          {"--field": job.field, "--output-field": job.output_field, "--src-lang-field": job.src_field,
                           "--tgt-lang-field": job.tgt_field, "--status-field": job.status_field})
            check_added_columns(source.schema, job)
            if job.target_file is not None:
                source = paired_lines(stack, source, job, saved.position.rows if saved else 0)
            counters = Counters(**saved.counters) if saved else Counters()
            reporter = Reporter(mode, source.total, counters, stream=reporter_stream, summary=summary, label=job_label(job),
                                output=output_name(job), where=where, finished_as=job.finished_as)
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


def paired_lines(stack: ExitStack, source: Input, job: Job, done: int) -> Input:
    """A score job's text input with its translations from job.target_file, line by line: each row gets the line of
    the same number in the field job.target_field (a row past the file's end fails alone). Two regular files of
    different line counts are refused before any work; `done`: the rows an earlier run read (--resume), whose
    lines are skipped."""
    targets = stack.enter_context(open_input(job.target_file, "text", job.target_field, count=True))
    total = source.total
    if total is None and is_regular_file(job.input):
        total = stack.enter_context(open_input(job.input, "text", job.field, count=True)).total
    if targets.total is not None and total is not None and targets.total != total:
        raise NllbError(f"{job.target_file} has {targets.total:,} lines and {job.input} {total:,}: the "
                        "translations to score go a line each, the line of the text's own number.")
    lines = iter(targets.records)
    for _ in range(done):
        next(lines, None)

    def paired() -> Iterator[Record]:
        for record in source.records:
            target = next(lines, None)
            if record.error is None and (target is None or target.error is not None):
                record.error = (target.error if target is not None else
                                f"{record.where}: {job.target_file} has no line {record.index + 1} to score as its "
                                "translation.")
            elif record.error is None:
                record.fields[job.target_field] = target.text
            yield record
        if next(lines, None) is not None:  # a stream's lines could not be counted before
            raise NllbError(f"{job.target_file} has more lines than {STDIN_NAME if job.input == '-' else job.input}: "
                            "the translations to score go a line each, the line of the text's own number.")

    return replace(source, records=paired())


def run(translator, job: Job, decode: DecodeOptions, batching: BatchOptions, source: Input, reporter: Reporter,
        files: JobFiles, identity: dict, pool: Pool | None = None, warn=print) -> None:
    """The chunk loop: translate, write, commit; then put the finished files in place."""
    counters = reporter.counters
    saved, output, errors, state, errors_path = files.saved, files.output, files.errors, files.state, files.errors_path
    compressor = ExitStack()  # a stream's compression, ended after its last row
    if state is None:  # a stream: written as it goes
        stream = compressor.enter_context(compressing(output.stream, job.output_compression))
        sink = open_sink(stream, job.output_format, job.added, source.schema, job.field, source.bom, source.document)
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
            worker = ChunkWorker(translator, job, decode, batching)
            # on the reader's thread: tokenized, and cut into batches (with --devices the workers do it)
            prepare = worker.prepare if pool is None else lambda chunk: None
            with ChunkReader(source, batching.read_chunk_rows, prepare, ahead=is_regular_file(job.input),
                             first=first_chunk_rows(translator, batching)) as reader, \
                    (Finisher() if FINISHER else Inline()) as finisher:
                def finish(chunk, position, prepared) -> None:
                    finisher.wait(behind=1)  # at most one chunk waits to be committed while this one runs
                    worker.translate(prepared, reporter.advance, finisher)
                    finisher.submit(lambda: commit(chunk, worker.outcomes(prepared), position), chunk_end=True)

                def finish_translated(chunk, position, _, outcomes) -> None:  # a worker's chunk, in its turn
                    finisher.wait(behind=1)
                    finisher.submit(lambda: commit(chunk, outcomes, position), chunk_end=True)

                if pool is None:
                    for chunk, position, prepared in reader:
                        finish(chunk, position, prepared)
                else:  # the workers translate, several chunks at once; finish_translated takes them in input order
                    pool.translate(reader, job, decode, batching, finish_translated, reporter.advance, warn)
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
            if state is not None and job.record:
                save_record(state, done, job.output)
            elif state is not None:
                remove_state(state)
            job_finished()
    except BaseException:
        sink.abort()
        raise


