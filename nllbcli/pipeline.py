"""reader -> chunks -> sentences -> tokenize -> length-sorted batches -> translator.generate -> decode -> join -> writer.

Rows are read `read_chunk_rows` at a time. Within a chunk, each row is split into sentences (unless
--no-split), the sentences are grouped by target language and sorted by length so each batch pads little,
batches are cut at `max_batch_tokens`, and the translations are joined back into rows in input order before
the chunk is written and committed (resume.py). A sentence's translation does not depend on its batch, so
none of this changes the output. Reading, tokenizing and cutting a chunk into batches run one chunk ahead on
a thread (ChunkReader), so they overlap the model's work on the chunk before. Decoding each batch's ids,
joining, writing and committing a chunk run behind the model on another thread (Finisher), in order, while the
main thread drives the GPU on the next batches (NLLB_FINISHER=0: on the main thread, between batches). With
each decoder step one CUDA graph launch, the main thread needs little of the GIL, so the two threads' Python
costs the GPU little (docs/PERFORMANCE.md, Host side).

A row that cannot be translated (unreadable, no text, an unknown language, text the tokenizer cannot take, a
sentence too large for the GPU even alone) fails alone: with --on-error fail the job stops on it; with skip it
is left out and named on stderr; with record it is left out and written to the --errors file.
"""

from __future__ import annotations

import gc
import json
import os
import queue
import re
import shutil
import sys
import threading
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from .errors import NllbError
from .io import Added, Input, Position, Record, file_identity, is_regular_file, open_input, open_sink
from .io.parquet import check_columns
from .io.streams import compressing
from .langs import resolve_lang
from .options import BatchOptions, DecodeOptions
from .progress import Counters, Reporter
from .resume import (JobFiles, NamedStream, PartialFile, Saved, converting_path, create_private, file_stamp,
                     is_stream, open_job_files, partial_paths, save_record, save_state,
                     written_by_nllb)
from .signals import Stopped, critical, job_finished
from .split import join_sentences, split_text

if TYPE_CHECKING:
    from .translator import Translator

Advance = Callable[[int, int], None]  # (rows done, tokens generated) since the last call
ON_ERROR = ("fail", "skip", "record")


@dataclass(frozen=True)
class Job:
    """What to translate, from where to where."""

    src: str | None  # FLORES-200 code of the input text, e.g. eng_Latn (None: every row names its own)
    tgt: str | None  # FLORES-200 code of the translation
    input: str = "-"  # a path, or - for stdin
    output: str = "-"  # a path, or - for stdout
    input_format: str = "text"  # jsonl, parquet or text
    output_format: str = "text"
    field: str = "text"  # the JSONL field or Parquet column to translate
    output_field: str = "translation"  # the field or column the translation goes to
    src_field: str = "src_lang"  # a row's own source language, where it has this field
    tgt_field: str = "tgt_lang"  # a row's own target language, where it has this field
    split: bool = True  # translate sentence by sentence
    on_error: str = "fail"  # fail, skip or record: what a bad row does
    errors: str | None = None  # the JSONL file bad rows go to under record
    force: bool = False  # replace an OUTPUT file nllb did not write
    status_field: str | None = None  # the JSONL field or Parquet column that gets each row's status (status_of)
    overwrite_field: bool = False  # the added fields may replace a row's own fields of their names
    output_compression: str | None = None  # gzip or zstd: OUTPUT is written compressed (from its extension)

    @property
    def added(self) -> Added:
        return Added(self.output_field, self.status_field)


@dataclass
class Sentence:
    """One sentence of a row, on its way through the model."""

    row: int  # position of its row in the chunk
    ids: list[int]  # source ids, cut to the model's positions
    tgt: str  # target language


@dataclass
class Outcome:
    """What became of one row."""

    translation: str | None = None  # None when the row failed
    error: str | None = None
    cut: bool = False  # a sentence was longer than the model's positions
    max_length: bool = False  # a sentence's translation stopped at --max-length
    parts: list = field(default_factory=list)  # the sentences' translations, in order
    gaps: list | None = None  # the whitespace around the sentences (split_text), None without splitting
    tgt: str = ""


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
) -> Counters:
    """Translate every row of the job's input into its output; returns the job's counters.

    `progress` is a mode of progress.py (True is "bar"); `summary` prints the summary line at the end; `resume`
    continues an interrupted job's partial output (resume.py); `threads` holds the BLAS library's thread pool, the
    CPU engine's matrix products, to that many threads while the job runs (None: the library's own count). A `Stopped` that ends the job carries
    `resumable`: whether a commit is saved for --resume to continue from."""
    mode = {True: "bar", False: "none"}.get(progress, progress)
    if job.on_error == "record" and not job.errors:
        raise ValueError("--on-error record needs --errors FILE to record the rows in")
    check_paths(job)
    check_fields(job)
    job = replace(job, output=follow_link(job.output), errors=follow_link(job.errors))
    files = None
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
                run(translator, job, decode, batching, source, reporter, files, identity)
            except BaseException:
                reporter.close(summary=False)
                raise
        except BaseException as error:
            if files is not None and not files.finished:
                files.discard_uncommitted()
            if isinstance(error, Stopped):
                error.resumable = files is not None and files.resumable
            raise
        reporter.close()
        return counters


def job_label(job: Job) -> str:
    """What the progress bar names the job by: the input's file name and the direction."""
    name = "stdin" if job.input == "-" else os.path.basename(job.input)
    src, tgt = job.src or f"each row's {job.src_field}", job.tgt or f"each row's {job.tgt_field}"
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
        files: JobFiles, identity: dict) -> None:
    """The chunk loop: translate, write, commit; then put the finished files in place."""
    counters = reporter.counters
    saved, output, errors, state, errors_path = files.saved, files.output, files.errors, files.state, files.errors_path
    compressor = ExitStack()  # a stream's compression, ended after its last row
    if state is None:  # a stream: written as it goes
        stream = compressor.enter_context(compressing(output.stream, job.output_compression))
        sink = open_sink(stream, job.output_format, job.output_field, source.schema, job.field, job.status_field)
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
                outcomes, sentences = prepare_records(translator, chunk, job)
                return outcomes, sentences, plan_chunk(sentences, batching.max_batch_tokens)

            with ChunkReader(source, batching.read_chunk_rows, prepare, ahead=is_regular_file(job.input),
                             first=first_chunk_rows(translator, batching)) as reader, \
                    (Finisher() if FINISHER else Inline()) as finisher:
                for chunk, position, (outcomes, sentences, batches) in reader:
                    finisher.wait(behind=1)  # at most one chunk waits to be committed while this one runs
                    translate_prepared(translator, chunk, outcomes, sentences, job, decode, batching.max_batch_tokens,
                                       reporter.advance, finisher, batches)
                    finisher.submit(lambda chunk=chunk, outcomes=outcomes, position=position:
                                    commit(chunk, outcomes, position), chunk_end=True)
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


def first_chunk_rows(translator, batching: BatchOptions) -> int | None:
    """On a GPU a smaller first chunk, tokenized sooner, so the GPU starts sooner (None: as the others)."""
    if not translator.device.startswith("cuda"):
        return None
    return max(1, batching.read_chunk_rows // FIRST_CHUNK_PART)


def open_frames(output: PartialFile, job: Job, source: Input, saved: Saved | None):
    """The sink of a file output: lines straight into the partial file, Parquet as frames (io/parquet.py)."""
    from .io import parquet

    if job.output_format != "parquet":
        return open_sink(output.stream, job.output_format, job.output_field, None, job.field, job.status_field)
    sink = parquet.FrameSink(output.stream, source.schema, job.output_field, job.field, job.status_field)
    if saved is not None:
        output.stream.flush()
        sink.resume(output.partial)
    return sink


def finish_converter(job: Job, source: Input):
    """How a finished partial file becomes OUTPUT when it is not simply renamed: Parquet written from its frames,
    and a .gz or .zst output compressed (the partial file is written plain, so that --resume can cut it back to
    a commit); None when a rename does."""
    from .io import file_mode, parquet

    if job.output_format != "parquet" and job.output_compression is None:
        return None

    def convert(partial: str, path: str) -> None:
        """Write the file beside `path` under a fixed name, then rename it into place. The name is fixed, not
        random, so a conversion killed half-way leaves nothing that the next run does not replace."""
        temp = converting_path(path)
        with NamedStream(os.fdopen(create_private(temp, os.O_WRONLY), "wb"), path) as target:
            with compressing(target, job.output_compression) as sink:
                if job.output_format == "parquet":
                    parquet.frames_to_parquet(partial, sink, source.schema, job.added, job.field)
                else:
                    with open(partial, "rb") as lines:
                        shutil.copyfileobj(lines, sink, 1 << 20)
            target.flush()
            os.fsync(target.fileno())
        os.chmod(temp, file_mode(path))
        os.replace(temp, path)

    return convert


def job_identity(translator, job: Job, decode: DecodeOptions, batching: BatchOptions) -> dict:
    """What shapes the output: a resumed job must match the interrupted one in all of it. (--on-error may
    change: a job that stopped on a bad row can go on with skip or record.)"""
    return {
        "input_format": job.input_format, "output_format": job.output_format, "field": job.field,
        "output_field": job.output_field, "src": job.src, "tgt": job.tgt, "src_field": job.src_field,
        "tgt_field": job.tgt_field, "split": job.split, "decode": vars(decode).copy(),
        "read_chunk_rows": batching.read_chunk_rows, "input": input_identity(job.input), "model": str(getattr(translator, "model_dir", "")),
        "device": getattr(translator, "device", ""),
        # only where given, so that a job started before these options existed resumes
        **({"status_field": job.status_field} if job.status_field else {}),
        **({"overwrite_field": True} if job.overwrite_field else {}),
    }


def input_identity(path: str) -> dict:
    return {"path": "-"} if path == "-" else file_identity(path)


def write_chunk(chunk: list[Record], outcomes: list[Outcome], sink, errors: PartialFile | None, job: Job,
                reporter: Reporter) -> None:
    """Write a chunk's rows; count and report the failed ones (the writer may fail a row too)."""
    counters = reporter.counters
    statuses = [status_of(o) for o in outcomes] if job.status_field else None
    for record, error in sink.write(chunk, [o.translation for o in outcomes], statuses):
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


def status_of(outcome: Outcome) -> str:
    """A written row's status (--status-field): ok, or what flagged it: cut (a sentence was longer than the
    model's positions and was cut to fit), max_length (a translation stopped at --max-length), or both, as
    cut,max_length."""
    flags = [name for name, flagged in (("cut", outcome.cut), ("max_length", outcome.max_length)) if flagged]
    return ",".join(flags) or "ok"


NO_INPUT = object()  # a failed row whose input JSON cannot hold (Parquet columns of one name)


def failed_inputs(records: list[Record], job: Job) -> list:
    """What each failed row was in the input, for the errors file: a text row's line; a JSONL or Parquet row's
    fields (Python values); a line that could not be read as a row, its text."""
    from .io.jsonl import jsonl_fields

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
    from .io.jsonl import Exact, Unwritable, exact_json, to_json

    head = json.dumps({"row": record.index + 1, "error": error}, ensure_ascii=False)
    if source is NO_INPUT:
        return (head + "\n").encode("utf-8", "backslashreplace")
    try:
        try:
            body = json.dumps(source, ensure_ascii=False, allow_nan=False, default=to_json)
        except (ValueError, TypeError, Exact):  # as encode_jsonl_row: NaN, huge integers, RawNumbers
            body = exact_json(source, "")
        line = head[:-1] + ', "input": ' + body + "}"
    except (Unwritable, RecursionError):
        line = head
    return (line + "\n").encode("utf-8", "backslashreplace")


def read_chunks(records: Iterable[Record], size: int, first: int | None = None,
                arrived: Callable[[float], bool] | None = None) -> Iterator[list[Record]]:
    """Chunks of `size` records, the first of `first` (default: size). With `arrived` (a pipe or terminal's), a
    chunk also ends when its next line has not come within IDLE seconds: what came is translated while the
    input is quiet, and a fast pipe still fills whole chunks."""
    iterator = iter(records)
    take = first or size
    while True:
        chunk: list[Record] = []
        while len(chunk) < take and (not chunk or arrived is None or arrived(IDLE)):
            record = next(iterator, None)
            if record is None:
                break
            chunk.append(record)
        if not chunk:
            return
        yield chunk
        take = size


IDLE = 0.3  # seconds without a new line from a pipe or terminal that end a chunk


# seconds: how long the GIL may stay with one thread while another waits for it (NLLB_SWITCH_INTERVAL: measuring)
SWITCH_INTERVAL = float(os.environ.get("NLLB_SWITCH_INTERVAL", "0.0005"))
GC_THRESHOLD = (50_000, 20, 100)  # the cyclic collector's, while a job runs (Python's own: 700, 10, 10)
FIRST_CHUNK_PART = 4  # the first chunk is this much smaller: the GPU waited ~0.6 s for a first chunk of 8,192 rows


@contextmanager
def fewer_collections():
    """A job's objects (each chunk's rows, sentences and ids) set off Python's cyclic collector every few
    hundred allocations, and a full collection walks everything alive holding the GIL for milliseconds, while
    the thread driving the GPU waits for it (the reader's tokenizing made it wait up to ~10 ms, ~4 without the
    collector, on the CPU machine). While the job runs: what was alive before it frozen out of the collector's
    walks (gc.freeze: the modules, the tokenizer, the model's objects), and collections rarer. NLLB_GC=python
    keeps Python's settings (for measuring)."""
    if os.environ.get("NLLB_GC") == "python":
        yield
        return
    threshold = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


class ChunkReader:
    """The input's chunks, each read and prepared (`prepare(chunk)`: tokenized) on a thread one chunk ahead of
    the caller, so reading and tokenizing overlap the model's work on the chunk before. Yields (chunk, the
    reader's position just after it, prepare's result); an error of prepare's or the reader's is raised when
    its chunk's turn comes, after the chunks before it. `first`: the first chunk's size, where it differs (a
    small one gives the GPU its first batch sooner). `position`: the reader's position just after the
    last chunk taken (at the end, the input's end). At most one chunk waits ahead.

    A context manager: leaving it stops the thread and waits for it (at most the chunk it is reading), so no
    thread is inside the input when the input is closed or the interpreter exits. `ahead=False` reads and
    prepares on the caller's thread, as for stdin: a thread blocked on a pipe that has nothing to give could
    neither be waited for nor left behind (Python aborts at exit when a thread holds stdin's lock)."""

    def __init__(self, source: Input, size: int, prepare: Callable[[list[Record]], object], ahead: bool = True,
                 first: int | None = None):
        self.source, self.size, self.prepare, self.ahead, self.first = source, size, prepare, ahead, first
        self.position = replace(source.position)
        self.thread: threading.Thread | None = None
        self.turn = threading.Semaphore(0)  # a chunk may be read: one ahead of the caller
        self.stop = threading.Event()

    def close(self) -> None:
        self.stop.set()
        self.turn.release()
        if self.thread is not None:
            self.thread.join()

    def __enter__(self) -> "ChunkReader":
        # The reader thread tokenizes while the caller drives the GPU, and a thread that wants the GIL waits for
        # the switch interval (5 ms by default) before the holder lets go: the caller, back from a GPU wait,
        # would leave the GPU idle that long. A shorter interval while the reader runs.
        self.switch_interval = sys.getswitchinterval()
        if self.ahead:
            sys.setswitchinterval(min(self.switch_interval, SWITCH_INTERVAL))
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        sys.setswitchinterval(self.switch_interval)

    def __iter__(self) -> Iterator[tuple[list[Record], Position, object]]:
        if not self.ahead:
            for chunk in read_chunks(self.source.records, self.size, self.first, self.source.arrived):
                self.position = replace(self.source.position)
                yield chunk, self.position, self.prepare(chunk)
            self.position = replace(self.source.position)
            return
        ready: queue.Queue = queue.Queue()

        def work() -> None:
            try:
                for chunk in read_chunks(self.source.records, self.size, self.first, self.source.arrived):
                    position = replace(self.source.position)
                    ready.put(("chunk", chunk, position, self.prepare(chunk)))
                    self.turn.acquire()
                    if self.stop.is_set():
                        return
                ready.put(("end", None, replace(self.source.position), None))
            except BaseException as error:  # noqa: BLE001 - every error goes to the caller, in its turn
                ready.put(("error", error, None, None))

        self.thread = threading.Thread(target=work, name="nllb-reader", daemon=True)
        self.thread.start()
        while True:
            kind, chunk, position, prepared = ready.get()
            if kind == "error":
                raise chunk
            self.position = position
            if kind == "end":
                return
            self.turn.release()  # read the next chunk while the caller works on this one
            yield chunk, position, prepared


FINISHER = os.environ.get("NLLB_FINISHER", "1") == "1"  # 0: decode, write and commit on the main thread (Inline)


class Inline:
    """Finisher's calls, each task run at once on the calling thread (NLLB_FINISHER=0)."""

    def submit(self, task: Callable[[], None], chunk_end: bool = False) -> None:
        task()

    def wait(self, behind: int = 0) -> None:
        pass

    def __enter__(self) -> "Inline":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        pass


class Finisher:
    """Tasks run in order on one thread behind the main one (decoding batches, joining and committing chunks),
    so that the main thread goes on driving the GPU. The first error stops it: no task after it runs, and the
    main thread gets the error at its next submit() or wait(), or at the end of the `with` block. Leaving the
    block runs every task submitted before it (what was translated is committed), then ends the thread; where
    an error leaves the block, that error goes on. The wait is a critical section: no stop signal interrupts
    it while the finisher may be writing."""

    def __init__(self):
        self.tasks: queue.Queue = queue.Queue()
        self.error: BaseException | None = None  # the first error; no task runs after it
        self.reported = False
        self.chunk_ends = threading.Semaphore(0)  # released as each chunk-end task has run (or been skipped)
        self.submitted = self.seen = 0  # chunk-end tasks submitted, and seen run by wait()
        self.thread = threading.Thread(target=self.loop, name="nllb-finisher", daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while True:
            task, chunk_end = self.tasks.get()
            if task is None:
                return
            if self.error is None:
                try:
                    task()
                except BaseException as error:  # noqa: BLE001 - every error goes to the main thread
                    self.error = error
            if chunk_end:
                self.chunk_ends.release()

    def check(self) -> None:
        if self.error is not None and not self.reported:
            self.reported = True
            raise self.error

    def submit(self, task: Callable[[], None], chunk_end: bool = False) -> None:
        self.check()
        self.submitted += chunk_end
        self.tasks.put((task, chunk_end))

    def wait(self, behind: int = 0) -> None:
        """Until at most `behind` chunk-end tasks wait to run."""
        while self.submitted - self.seen > behind:
            self.chunk_ends.acquire()
            self.seen += 1
        self.check()

    def __enter__(self) -> "Finisher":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        with critical():
            self.tasks.put((None, False))
            self.thread.join()
        if kind is None:
            self.check()


def row_languages(record: Record, job: Job, known: tuple[str, ...]) -> tuple[str, str]:
    """The row's source and target language: its own fields where it has them, else --src and --tgt."""
    languages = []
    for name, default, option in ((job.src_field, job.src, "--src"), (job.tgt_field, job.tgt, "--tgt")):
        value = record.fields.get(name) if name else None
        if value is None:
            if default is None:
                raise NllbError(f"{record.where}: no {name!r} field and no {option} to fall back on.")
            languages.append(default)
        elif not isinstance(value, str):
            raise NllbError(f"{record.where}: field {name!r} is {type(value).__name__}, not a language code.")
        else:
            try:
                languages.append(resolve_lang(value, known))
            except NllbError as error:
                raise NllbError(f"{record.where}: field {name!r}: {error}") from None
    return languages[0], languages[1]


def check_fields(job: Job) -> None:
    """Refuse, before any work, fields that clash: the translation written over the source text (unless
    --overwrite-field), the status over either, or a status where the output (text) has no fields."""
    if job.status_field is not None:
        if job.output_format == "text":
            raise NllbError("--status-field needs JSONL or Parquet output: a text output has one translation a line "
                            "and no fields.")
        if job.status_field in (job.field, job.output_field):
            option = "--field" if job.status_field == job.field else "--output-field"
            raise NllbError(f"--status-field {job.status_field} is {option}'s field too: name another.")
    if job.output_field == job.field and job.output_format != "text" and not job.overwrite_field:
        raise NllbError(f"--output-field {job.output_field} is the field being translated (--field), and the "
                        "translation would replace the source text: name another with --output-field, or pass "
                        "--overwrite-field to replace it.")


def check_added_fields(record: Record, job: Job) -> None:
    """Refuse a row that has a field of the name the translation (or the status) would be written to: it would
    be lost."""
    for option, name in (("--output-field", job.output_field), ("--status-field", job.status_field)):
        if name is not None and name in record.fields:
            raise NllbError(f"{record.where}: the row has a field {name!r} already, which {option} would replace: "
                            f"name another with {option}, or pass --overwrite-field to replace it.")


def check_added_columns(schema, job: Job) -> None:
    """Refuse, before any work, an input schema with a column of the name the translation (or the status) would
    be written to, unless --overwrite-field."""
    if schema is None or job.overwrite_field or job.output_format == "text" or job.input_format == "text":
        return
    name = "<stdin>" if job.input == "-" else job.input
    for option, column in (("--output-field", job.output_field), ("--status-field", job.status_field)):
        if column is not None and column in schema.names:
            raise NllbError(f"{name}: it has a column {column!r} already, which {option} would replace: name "
                            f"another with {option}, or pass --overwrite-field to replace it.")


SURROGATE = re.compile("[\ud800-\udfff]")  # half of a UTF-16 pair, alone: a JSON "\\ud800" escape, not a character


def check_text(record: Record, field: str) -> None:
    """Refuse text that is not Unicode characters throughout, naming the first offender."""
    if (bad := SURROGATE.search(record.text)) is not None:
        raise NllbError(f"{record.where}: field {field!r} holds a lone surrogate (\\u{ord(bad.group()):04x} at character "
                        f"{bad.start() + 1}), half of a UTF-16 pair, which is not text.")


def translate_records(
    translator: Translator,
    records: list[Record],
    job: Job,
    decode: DecodeOptions,
    max_batch_tokens: int,
    advance: Advance = lambda rows, tokens: None,
) -> list[Outcome]:
    """What became of each row of a chunk, in the rows' order. Empty texts stay empty, without the model.

    With --on-error fail the first bad row raises NllbError before any of the chunk is translated."""
    outcomes, sentences = prepare_records(translator, records, job)
    return translate_prepared(translator, records, outcomes, sentences, job, decode, max_batch_tokens, advance)


def prepare_records(translator: Translator, records: list[Record], job: Job) -> tuple[list[Outcome], list[Sentence]]:
    """A chunk's rows split into sentences and tokenized (no model, no progress: it may run on the reader's
    thread). With --on-error fail the first bad row raises NllbError. The chunk's texts go to the tokenizer
    together (encode_many) where it has that: sentencepiece then tokenizes on its own threads, without the GIL."""
    tokenizer = translator.tokenizer
    limit = translator.config.max_position_embeddings
    known = tuple(tokenizer.lang_codes)
    outcomes = [Outcome() for _ in records]
    texts: list[tuple[int, str, str, str]] = []  # (row, text, src, tgt) of every sentence
    for position, (record, outcome) in enumerate(zip(records, outcomes)):
        try:
            if record.error:
                raise NllbError(record.error)
            if record.batch is None and not job.overwrite_field and job.output_format != "text":
                check_added_fields(record, job)
            src, tgt = row_languages(record, job, known)
            outcome.tgt = tgt
            check_text(record, job.field)
            if job.split:
                row_texts, outcome.gaps = split_text(record.text)
            else:
                row_texts = [record.text] if record.text.strip() else []
            texts += [(position, bound_text(tokenizer, text, src, limit), src, tgt) for text in row_texts]
        except NllbError as error:
            outcome.error = str(error)
    many = getattr(tokenizer, "encode_many", None)
    if many is not None:
        encoded = many([text for _, text, _, _ in texts], [src for _, _, src, _ in texts])
    else:
        encoded = []
        for _, text, src, _ in texts:
            try:
                encoded.append(tokenizer.encode(text, src))
            except Exception as error:  # noqa: BLE001 - sentencepiece's errors are no narrower than that
                encoded.append(error)
    sentences: list[Sentence] = []
    for (position, _, _, tgt), ids in zip(texts, encoded):
        outcome = outcomes[position]
        if outcome.error is not None:
            continue
        if isinstance(ids, Exception):
            reason = next(iter(str(ids).strip().splitlines()), type(ids).__name__)  # its first line: pybind11's go on for many
            outcome.error = f"{records[position].where}: the tokenizer cannot take this text: {reason}"
            continue
        outcome.cut |= len(ids) > limit
        sentences.append(Sentence(position, cut_source(ids, limit), tgt))
    if job.on_error == "fail":
        first = next((o.error for o in outcomes if o.error is not None), None)
        if first is not None:
            raise NllbError(first)
    for outcome in outcomes:
        outcome.parts = []
    return outcomes, [s for s in sentences if outcomes[s.row].error is None]


def translate_prepared(translator: Translator, records: list[Record], outcomes: list[Outcome],
                       sentences: list[Sentence], job: Job, decode: DecodeOptions, max_batch_tokens: int,
                       advance: Advance = lambda rows, tokens: None, finisher: "Finisher | None" = None,
                       batches: list[Batch] | None = None) -> list[Outcome]:
    """The prepared chunk through the model: its sentences in length-sorted batches (plan_chunk's, made here
    unless given), decoded and joined back into `outcomes` (returned), rows in input order. With a finisher,
    each batch's decoding and the joining run there, behind the next batch's generate (the outcomes are
    complete once the finisher has run them)."""
    tokenizer = translator.tokenizer
    pending = [0] * len(records)
    for sentence in sentences:
        pending[sentence.row] += 1
    done_rows = [p == 0 for p in pending]
    advance(sum(done_rows), 0)

    texts: dict[int, str] = {}
    decode_many = getattr(tokenizer, "decode_many", None) or (lambda outputs: [tokenizer.decode(i) for i in outputs])
    longest = decode.max_length - 1

    def finish_batch(batch: list[int], outputs: list) -> None:  # decoded, and the rows it finished counted
        done = [(n, ids) for n, ids in zip(batch, outputs) if ids is not None]
        texts.update(zip([n for n, _ in done], decode_many([ids for _, ids in done])))
        finished = tokens = 0
        for n, ids in zip(batch, outputs):
            row = sentences[n].row
            if ids is not None:
                tokens += len(ids)
                if len(ids) >= longest:
                    outcomes[row].max_length = True
            pending[row] -= 1
            finished += pending[row] == 0
        advance(finished, tokens)

    run = finisher.submit if finisher is not None else lambda task: task()
    for batch in plan_chunk(sentences, max_batch_tokens) if batches is None else batches:
        outputs = generate_batch(translator, batch, decode, records, outcomes, job)
        run(lambda batch=batch, outputs=outputs: finish_batch(batch.positions, outputs))
    run(lambda: join_outcomes(outcomes, sentences, texts))
    return outcomes


def join_outcomes(outcomes: list[Outcome], sentences: list[Sentence], texts: dict[int, str]) -> None:
    """Each row's translation from its sentences' texts (texts[n]: sentence n's; absent where it failed)."""
    for number, sentence in enumerate(sentences):
        outcomes[sentence.row].parts.append(texts.get(number))
    for outcome in outcomes:
        if outcome.error is not None:
            continue
        if outcome.gaps is None:
            outcome.translation = outcome.parts[0] if outcome.parts else ""
        else:
            outcome.translation = join_sentences(outcome.parts, outcome.gaps, outcome.tgt)


@dataclass
class Batch:
    """A batch of a chunk's sentences, made ready for the translator on the reader's thread."""

    positions: list[int]  # the sentences' numbers in the chunk
    sentences: list[Sentence]
    sources: list[list[int]]  # their ids
    tgt: str | list[str]  # one target language for all where it is one (a batch may mix them: the search
    #                       forces each sentence's own language token)


def plan_chunk(sentences: list[Sentence], max_batch_tokens: int) -> list[Batch]:
    """plan_batches over a chunk's sentences, each batch with what translator.generate takes."""
    batches = []
    for positions in plan_batches({n: len(s.ids) for n, s in enumerate(sentences)}, max_batch_tokens):
        batch = [sentences[n] for n in positions]
        targets = [s.tgt for s in batch]
        batches.append(Batch(positions, batch, [s.ids for s in batch],
                             targets[0] if len(set(targets)) == 1 else targets))
    return batches


def generate_batch(translator, batch: Batch, decode: DecodeOptions, records: list[Record],
                   outcomes: list[Outcome], job: Job) -> list[list[int] | None]:
    """The batch's output ids; a sentence the translator cannot take even alone fails its row (None) and the
    rest of the batch goes on."""
    from .translator import SentenceError

    sentences = batch.sentences
    outputs: list[list[int] | None] = [None] * len(sentences)
    todo = list(range(len(sentences)))
    sources, tgt = batch.sources, batch.tgt  # the whole batch, as the reader made it ready
    while todo:
        try:
            for i, ids in zip(todo, translator.generate(sources, tgt, decode)):
                outputs[i] = ids
            return outputs
        except SentenceError as error:
            bad = todo[error.position]
            row = sentences[bad].row
            message = f"{records[row].where}: {error}"
            if job.on_error == "fail":
                raise NllbError(message) from None
            outcomes[row].error = message
            todo = [i for i in todo if sentences[i].row != row]  # the row's other sentences are of no use now
            targets = [sentences[i].tgt for i in todo]
            tgt = targets[0] if len(set(targets)) == 1 else targets  # one language for all where it is one
            sources = [sentences[i].ids for i in todo]
    return outputs


PIECE_CHARS = 16  # characters per position a long sentence keeps at first: the longest piece of NLLB's vocabulary


def bound_text(tokenizer, text: str, src: str, limit: int) -> str:
    """The sentence, or a prefix of it that gives the same ids once cut to the model's `limit` positions, so that a
    huge sentence costs the tokenizer (and memory) what its first positions need, not its length (a 50 MB sentence
    takes 2.3 GB to tokenize whole). The prefix ends before a space, where the tokenizer's pieces part
    (words_apart), and is kept only when it gives at least 2 pieces more than the positions take (its last piece
    may be a lone "▁" its end adds): each piece the cut keeps is then the whole text's. A prefix of 16 characters
    a position is tried first, then ones 4 times longer, while they give too few pieces (spaces in runs, which
    the tokenizer folds into one)."""
    size = limit * PIECE_CHARS
    if len(text) <= size or not getattr(tokenizer, "words_apart", False):
        return text
    while (end := text.find(" ", size)) >= 0:
        prefix = text[:end]
        try:
            if len(tokenizer.encode(prefix, src)) > limit + 1:
                return prefix
        except Exception:  # noqa: BLE001 - the whole text goes to the tokenizer, which names what it cannot take
            return text
        size = end * 4
    return text


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
