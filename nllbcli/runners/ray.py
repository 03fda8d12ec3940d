"""--ray: files, directories or globs of JSONL or Parquet translated on a Ray cluster, through Ray Data.

    files -> Source (read tasks: every row with an id, its file's number << 40 | its line or row)
      -> blocks of --chunk-rows rows -> Translating (actors, one per GPU, each with the model loaded once: a
      block's rows prepared, translated and written out as the CLI writes a chunk's) -> Sink (a part file per
      run of adjacent input rows a write task has, and their failed rows' errors lines) in a staging directory
      -> promoted onto OUTPUT

The staging directory `.OUTPUT.nllb-staging` beside OUTPUT holds the job (job.json), Ray's checkpoint of the ids
written (a two-phase commit: a part counts once its checkpoint is committed, and the part of a write that died
before that is deleted when the job resumes), the parts, each named by its task, its first row and its row count,
and each input's row count, which its read task records as it reaches the file's end. A job that fails, is
stopped or is killed leaves it for --resume, which reads only the rows whose ids are not checkpointed. When every
row is written, the parts' rows are counted (from their names) against each input's, and the plan of the
promotion recorded (promotion.json); then the parts are renamed by their first rows (part-FFFFF-RRRRRRRRRRRR: the
file's number, as many digits as the job's last file needs, and the line or row), so that name order is input
order, the errors file written, and the directory renamed onto OUTPUT with a _SUCCESS file that records the job.
Each step of the promotion can be done again, so a promotion that was stopped or killed is finished by --resume
from its plan, without Ray. A row is read, prepared, translated, written and counted by the CLI's own functions
(io/, job/rows.py, job/chunks.py, job/commit.py), so its translation is the CLI's to the byte, and its counts the
CLI's (each write task stages its blocks' counts beside its parts, so that a resumed job counts every run's rows).

Ray Data is taken through what it publishes: read_datasource, repartition, map_batches with ActorPoolStrategy and
write_datasink (@PublicAPI); a Datasource (@PublicAPI) of ReadTasks and BlockMetadata (@DeveloperAPI); a
BlockBasedFileDatasink (@DeveloperAPI) named by a FilenameProvider (@PublicAPI alpha), the extension points its
docs name; CheckpointConfig (@PublicAPI beta) and DataContext (@DeveloperAPI; configure refuses a setting this Ray
lacks). What it does not publish, and the job cannot do without, is named in INTERNALS, which a job checks as it
starts (check_internals) and a test checks further: Ray Data's two-phase write checkpoint, which holds only for a
file datasink and knows a task's files as those whose names start with the task's file name (the contract
FilenameProvider's docs state), so that an uncommitted part is deleted on resume (without it a resumed job would
stage a row twice, and its promotion refuse it); and, of Ray itself, how the cluster recorded on this machine is
found (running_here, check_answers) and the processes of a Ray the job started (keep_local_ray), which Ray gives no
public way to ask for.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import glob
import importlib
import io
import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Generator, Iterator, Mapping, TextIO

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import ray
from ray.data import ActorPoolStrategy, DataContext
from ray.data.block import BlockAccessor, BlockMetadata
from ray.data.checkpoint import CheckpointConfig
from ray.data.datasource import BlockBasedFileDatasink, Datasource, FilenameProvider, ReadTask

from ..job.chunks import ChunkWorker
from ..errors import NllbError
from ..io import (LineSink, Position, Record, extension_format, file_identity, input_compression, name_read_errors,
                  refuse_json_array)
from ..io.jsonl import is_blank_line, line_record
from ..io.parquet import batch_records, open_parquet
from ..io.streams import Lines, Replay, decompressing, read_error
from ..model.lora import read_adapter_config
from ..options import GPU_BATCHING, BatchOptions, DecodeOptions, Job, ModelOptions
from ..job.reader import SWITCH_INTERVAL, fewer_collections
from ..job.commit import TableSink, commit_rows, error_lines, skipped
from ..job.progress import Counters, Reporter
from ..job.spec import (check_added_columns, check_fields, check_paths, check_worker, identity_of, job_label,
                        loaded_identity)
from ..job.state import PartialFile, StreamFile, differences, is_stream, replaced_atomically, sync_directory
from ..job.rows import Outcome
from ..job.signals import Stopped, act_on_signal, critical, job_finished, reclaim_signals
from ..model.translator import check_kv_cache_type, expected_compute_type

ID, ROW, LINE = "__nllb_id", "__nllb_row", "__nllb_line"  # a row's id, its number in its file, a JSONL line
ERROR, ERROR_LINE, WORKER = "__nllb_error", "__nllb_error_line", "__nllb_worker"  # a failed row's; who ran it
COUNTED = "__nllb_counted"  # a block's counts (Counters), on its first row: a block is one write task's
INTERNAL = (ID, ROW, LINE, ERROR, ERROR_LINE, WORKER, COUNTED)
FILE_BITS = 40  # an id is file number << 40 | line (JSONL, from 1) or row (Parquet, from 0)
ROW_MASK = (1 << FILE_BITS) - 1
READ_ROWS = 8192  # rows a read task yields at a time
WRITING = "writing"  # the staging's folder of the write tasks writing parts now (writing, wait_for_writes)
WRITES_END_S = 60.0  # how long a failed or resumed job waits for write tasks still writing
LINE_DIGITS = 12  # a part's first line (JSONL) or row (Parquet) in its name; later ones in a file are refused
LAST_LINE = 10 ** LINE_DIGITS - 1
MAX_FILES = 1 << (63 - FILE_BITS)  # the file numbers an id holds
STAGED = re.compile(rf"-(\d{{5,}})-(\d{{{LINE_DIGITS}}})-(\d+)(\.errors\.jsonl|\.jsonl|\.parquet)$")  # file, line, rows
ROWS = "rows"  # the staging's folder of each input's row count, a file named NUMBER-ROWS (Source)
PLAN = "promotion.json"  # the staging's plan of the promotion (promote)
ACTORS = "actors.json"  # the staging's record of where the actors compute (record_actors)
SUCCESS = "_SUCCESS"
TASK_RETRIES = 5  # tries of a block whose actor died or whose batch function raised, before the job fails
CONNECT_TIMEOUT = 10  # seconds a cluster's address has to take a connection
KEEPER_END_S = 10.0  # how long a job that ends waits for the keeper of its Ray to end what is left of it
LOCAL_CPUS = 4  # at least this many logical CPUs for a Ray started here: Ray's checkpoint filter and read tasks
#                 each take one, and with fewer the pipeline waited on them for good (2-core machines)

# The keeper of a Ray the job started (keep_local_ray): a process of its own session, given the pids of that Ray's
# processes, which waits for the job's process to end (its stdin, a pipe from it, closes however it ends: kill -9
# too), then kills those processes and every process they started that is still there. Ray ends its GCS and raylet
# with the driver (PR_SET_PDEATHSIG), and a worker ends with its raylet, but the raylet's agents, once it is gone,
# try for a minute to tell the dead GCS before they exit. The processes are followed (their children every second)
# by their start times, so that a pid the system has given to another process since is never killed.
KEEPER = """
import os, select, signal, sys

def processes():
    found = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            found[int(entry)] = (int(fields[1]), fields[19])  # parent, start time
        except (OSError, ValueError, IndexError):
            continue
    return found

def follow(now):  # the children of the processes kept, theirs, and so on
    grown = True
    while grown:
        grown = False
        for pid, (parent, start) in now.items():
            if pid not in kept and parent in now and kept.get(parent) == now[parent][1]:
                kept[pid], grown = start, True

now = processes()
kept = {pid: now[pid][1] for pid in map(int, sys.argv[1:]) if pid in now}
while not (select.select([0], [], [], 1.0)[0] and not os.read(0, 1)):
    follow(now)
    now = processes()
now = processes()
follow(now)
for pid, start in kept.items():
    if pid in now and now[pid][1] == start:
        os.kill(pid, signal.SIGKILL)
"""

# What the runner needs of Ray that Ray does not publish (the module's docstring says why), by module; the tests
# check that each is there (test_the_ray_internals_the_runner_relies_on_are_there)
INTERNALS = {
    "ray._private.services": ("canonicalize_bootstrap_address", "find_bootstrap_address", "find_gcs_addresses"),
    "ray._private.worker": ("_global_node",),  # keep_local_ray
    "ray.data._internal.planner.checkpoint.plan_write_op": ("plan_write_op_with_checkpoint_writer",),  # TaskName
}


@dataclass(frozen=True)
class RayOptions:
    """Where and how a --ray job runs."""

    address: str | None = None  # ray.init's; None: $RAY_ADDRESS's, else the one `ray start` ran here, else a new one
    actors: int | None = None  # translating actors; None: one per GPU of the cluster, else one
    threads: int | None = None  # each CPU actor's BLAS threads


@dataclass
class Outcomes:
    """What a --ray job did: its counts (every run of a resumed job's rows, and this run's time), and this run's
    actors ("GPU 0", "CPU")."""

    counters: Counters = field(default_factory=Counters)
    workers: tuple[str, ...] = ()
    already: bool = False  # the job had finished before; nothing was run

    @property
    def rows(self) -> int:
        return self.counters.rows

    @property
    def translated(self) -> int:
        return self.counters.translated

    @property
    def failed(self) -> int:  # rows failed: the command exits 3 with any
        return self.counters.failed


def staging_path(output: str) -> str:
    directory, name = os.path.split(os.path.abspath(output))
    return os.path.join(directory, f".{name}.nllb-staging")


def file_digits(files: int) -> int:
    """The width of an input's number in the part names of a job of `files` inputs: its last file's (at least 5),
    the same in every name of the job, so that name order is input order."""
    return max(5, len(str(files - 1)))


def staged_name(task: str, file: int, line: int, rows: int, digits: int, suffix: str) -> str:
    """A part as its write task names it: the task (Ray's checkpoint finds an uncommitted part by it), the file's
    number, the part's first line (JSONL, from 1) or row (Parquet, from 0), and how many rows it holds."""
    return f"{task}-{file:0{digits}d}-{line:0{LINE_DIGITS}d}-{rows}{suffix}"


def parse_staged(name: str) -> tuple[int, int, int, str] | None:
    """The file number, first line (or row), rows and suffix of a staged part's name; None for another name."""
    match = STAGED.search(name)
    return None if match is None else (int(match[1]), int(match[2]), int(match[3]), match[4])


def final_name(file: int, line: int, digits: int, suffix: str) -> str:
    """A part as OUTPUT names it: by its file's number and its first line (or row), in input order by name."""
    return f"part-{file:0{digits}d}-{line:0{LINE_DIGITS}d}{suffix}"


def expand_inputs(paths: list[str]) -> list[str]:
    """The input files: each file named, every JSONL or Parquet file under a directory named (hidden ones, and
    Spark's and Ray's _ files, left out), every file a glob pattern matches; sorted, each once. A name that is not
    a file (a dangling link, a FIFO) is kept, for check_inputs to refuse with its reason."""
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(os.path.join(top, name) for top, dirs, names in os.walk(path) for name in names
                           if extension_format(name) in ("jsonl", "parquet") and not hidden(os.path.relpath(os.path.join(top, name), path)))
            if not found:
                raise NllbError(f"{path}: the directory holds no .jsonl, .ndjson, .json or .parquet file.")
        elif glob.has_magic(path):
            found = sorted(p for p in glob.glob(path, recursive=True) if not os.path.isdir(p))
            if not found:
                raise NllbError(f"{path}: the pattern matches no file.")
        elif os.path.lexists(path):
            found = [path]
        else:
            raise NllbError(f"{path}: no such file or directory.")
        files += found
    files = list(dict.fromkeys(files))
    if len(files) > MAX_FILES:
        raise NllbError(f"--ray numbers at most {MAX_FILES:,} input files, and these are {len(files):,}: translate "
                        "them in several jobs.")
    return files


def check_names(paths: list[str]) -> None:
    """The paths Ray Data reads and writes are UTF-8: pyarrow's file systems take no other name, where a Linux
    file name may be any bytes."""
    for path in paths:
        try:
            os.path.abspath(path).encode("utf-8")
        except UnicodeEncodeError:
            raise NllbError(f"{path}: --ray reads and writes files by UTF-8 names (through pyarrow), and this path is "
                            "not UTF-8: rename it, or translate without --ray.") from None


def hidden(relative: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative.split(os.sep))


def inputs_format(files: list[str], given: str | None) -> str:
    """The one format of every input: JSONL or Parquet."""
    if given is None:
        unknown = next((f for f in files if extension_format(f) is None), None)
        if unknown is not None:
            raise NllbError(f"{unknown}: its extension names no format; give it with --input-format.")
    formats = {given or extension_format(f) for f in files}
    if len(formats) > 1:
        raise NllbError(f"--ray reads inputs of one format, and these are {' and '.join(sorted(formats))}.")
    fmt = formats.pop()
    if fmt not in ("jsonl", "parquet"):
        raise NllbError(f"--ray reads JSONL and Parquet, not {fmt}.")
    return fmt


def check_inputs(files: list[str], fmt: str, job: Job) -> tuple[list[str | None], pa.Schema | None]:
    """Each input opened before any work, as the command opens it: one that cannot be read (a dangling link, no
    permission, not a regular file), whose first bytes are not the compression its name says, or JSONL that is one
    JSON array, is refused, named, here and not by a read task once the job runs. Returns each input's compression, found from its first bytes
    as the command finds it, and the Parquet inputs' one schema."""
    compressions = []
    for path in files:
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO's bytes are read once, and by one read task
                raise NllbError(f"cannot read {path}: it is not a regular file, and --ray reads files.")
            with open(path, "rb") as stream:
                head = stream.read(4)
        except OSError as error:
            raise read_error(path, error) from None
        compressions.append(input_compression(path, path, head))
        if fmt == "jsonl":
            refuse_json_array(path)
    return compressions, check_parquet_inputs(files, job) if fmt == "parquet" else None


def check_parquet_inputs(files: list[str], job: Job) -> pa.Schema:
    """Every Parquet input has one schema, with the text column and no column an added one would replace (as the
    command checks them): the parts of one output share it."""
    schema = None
    for path in files:
        found = open_parquet(path, path, job.field, Position(), {}).schema
        check_added_columns(found, replace(job, input=path))
        if any(name in INTERNAL for name in found.names):
            raise NllbError(f"{path}: a column's name starts with __nllb_, which --ray keeps for its own.")
        if schema is None:
            schema = found
        elif not found.equals(schema, check_metadata=False):
            raise NllbError(f"{path}: its columns are not those of {files[0]}, and the parts of one output share "
                            "one schema: translate it into another OUTPUT.")
    return schema


def ray_identity(files: list[str], job: Job, decode: DecodeOptions, batching: BatchOptions | Mapping,
                 model: ModelOptions) -> dict:
    """What shapes the output (the command's job.spec.identity_of), the inputs each by its name and identity;
    `batching` as given, the device's defaults picked once the cluster is joined."""
    return identity_of(job, decode, batching, model, input=[dict(file_identity(f), name=f) for f in files])


class Source(Datasource):
    """The inputs for Ray Data: JSONL as each non-blank line's bytes, Parquet as its columns, every row with its
    id and its number in its file (its row, from 0). A read task reads a run of the inputs, each whole and in
    order; once through a file it records the file's rows in the staging's ROWS folder. A read error names the
    file, as the command's does."""

    def __init__(self, files: list[str], names: list[str], fmt: str, compressions: list[str | None], staging: str):
        super().__init__()
        self.inputs = [InputFile(path, name, compression, number)
                       for number, (path, name, compression) in enumerate(zip(files, names, compressions))]
        self.fmt, self.staging = fmt, staging

    def estimate_inmemory_data_size(self) -> int | None:
        return None  # a compressed file's rows are many times its bytes; Ray plans without the estimate

    def get_read_tasks(self, parallelism: int, **options) -> list[ReadTask]:
        """A read task for each of at most `parallelism` runs of adjacent inputs. `options` (a row limit, Ray's
        context) are not used: the job reads every row."""
        tasks, count = [], min(max(1, parallelism), len(self.inputs))
        for n in range(count):
            inputs = self.inputs[n * len(self.inputs) // count:(n + 1) * len(self.inputs) // count]
            metadata = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None,
                                     input_files=[i.path for i in inputs])
            tasks.append(ReadTask(functools.partial(read_inputs, inputs, self.fmt, self.staging), metadata))
        return tasks


@dataclass(frozen=True)
class InputFile:
    """An input as a read task takes it: its absolute path, its name in messages, its compression, its number."""

    path: str
    name: str
    compression: str | None
    number: int


def read_inputs(inputs: list[InputFile], fmt: str, staging: str) -> Iterator[pa.Table]:
    """A read task's inputs' rows, file after file (jsonl_tables, parquet_tables); each file's row count recorded."""
    read = parquet_tables if fmt == "parquet" else jsonl_tables
    files = pafs.LocalFileSystem()  # its streams have no file descriptor: Lines reads a stream by its reads
    for source in inputs:
        try:
            if fmt == "parquet":  # Parquet reads its footer first: a file, not a stream
                raw = files.open_input_file(source.path)
            else:
                raw = files.open_input_stream(source.path, compression=None)
        except OSError as error:
            raise read_error(source.name, plain(error)) from None
        with raw:
            # .gz and .zst decompressed as the CLI does them (gzip members, zstd frames, a cut file an error)
            stream = raw if fmt == "parquet" else decompressing(raw, source.compression)
            rows = yield from read(stream, source.number, source.name)
        open(os.path.join(staging, ROWS, f"{source.number}-{rows}"), "wb").close()


def jsonl_tables(f, number: int, name: str) -> Generator[pa.Table, None, int]:
    """A JSONL file's non-blank lines, READ_ROWS at a time; returns how many there were."""
    base, ids, lines, row = number << FILE_BITS, [], [], 0
    for line, raw in enumerate(name_read_errors(Lines(Replay(f)), name), 1):  # lines end at \n alone, as the CLI's
        if is_blank_line(raw, line):
            continue
        if line > LAST_LINE:
            raise NllbError(f"{name}: more than {LAST_LINE:,} lines, the most --ray numbers in a file.")
        ids.append(base | line)
        lines.append(raw)
        if len(ids) == READ_ROWS:
            yield lines_table(ids, row, lines)
            row += len(ids)
            ids, lines = [], []
    if ids:
        yield lines_table(ids, row, lines)
    return row + len(ids)


def parquet_tables(f, number: int, name: str) -> Generator[pa.Table, None, int]:
    """A Parquet file's rows, READ_ROWS at a time; returns how many there were."""
    base, start = number << FILE_BITS, 0
    try:
        batches = pq.ParquetFile(f).iter_batches(batch_size=READ_ROWS)
    except (pa.ArrowException, OSError) as error:
        raise NllbError(f"{name}: cannot read it as Parquet: {error}") from None
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as error:
            raise NllbError(f"{name}: cannot read rows after row {start}: {error}") from None
        if batch is None:
            return start
        if start + batch.num_rows > LAST_LINE + 1:
            raise NllbError(f"{name}: more than {LAST_LINE + 1:,} rows, the most --ray numbers in a file.")
        ids = pa.array(range(base | start, base | (start + batch.num_rows)), pa.int64())
        yield pa.Table.from_batches([batch]).append_column(ID, ids)
        start += batch.num_rows


def plain(error: OSError) -> OSError:
    """An error of pyarrow's file system as the system's own: its errno's reason alone, without the sentence that
    pyarrow writes around it (the path, which the message names already)."""
    return OSError(error.errno, os.strerror(error.errno)) if error.errno else error


def lines_table(ids: list[int], first_row: int, lines: list[bytes]) -> pa.Table:
    return pa.table({ID: pa.array(ids, pa.int64()), ROW: pa.array(range(first_row, first_row + len(ids)), pa.int64()),
                     LINE: pa.array(lines, pa.binary())})


class Translating:
    """A Ray actor's translator: the model loaded once; each block's rows prepared on Ray's threads (two blocks
    at once) while one engine thread runs the model, so that the host's work overlaps the GPU's as in the CLI.

    Every row comes back: a translated one with its output (a JSONL line, or its Parquet columns with the
    translation), a failed one with its error and its errors-file line; the Sink applies --on-error. A model that
    does not load fails each call with the error that says why: Ray keeps a call's error whole for the job's
    line, and an actor's constructor's as text only (ray_error)."""

    def __init__(self, load: Callable, names: list[str], job: Job, decode: DecodeOptions,
                 max_batch_tokens: int | None, schema: pa.Schema | None, max_batch_sentences: int | None = None,
                 progress=None):
        self.progress = progress  # the job's ProgressCounter actor, told of each batch's rows and tokens (or None)
        self.engine = ThreadPoolExecutor(1, thread_name_prefix="nllb-engine")  # every call of the model on one thread
        try:
            self.translator, self.failure = self.engine.submit(load).result(), None
        except Exception as error:  # noqa: BLE001 - whatever the load raised is the job's error
            self.failure = error
            return
        # the engine thread waits for the GIL behind the threads preparing and finishing blocks, as the CLI's
        # main thread does behind its reader and finisher: the same settings as a job's (job/reader.py)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        self.collections = fewer_collections()
        self.collections.__enter__()  # for the actor's life
        self.names, self.decode, self.schema = names, decode, schema
        self.batching = BatchOptions.for_device(self.translator.device, max_batch_tokens,
                                                max_batch_sentences=max_batch_sentences)
        self.job = replace(job, on_error="skip", errors=None)  # failures are marked here and judged by the Sink
        self.chunks = ChunkWorker(self.translator, self.job, decode, self.batching,
                                  lambda task: self.engine.submit(task).result())
        gpus = ray.get_gpu_ids()
        self.worker = f"GPU {','.join(map(str, gpus))}" if gpus else "CPU"

    def __call__(self, block: pa.Table) -> pa.Table:
        if self.failure is not None:
            raise self.failure
        ids = block.column(ID).to_pylist()
        records = self.records(block, ids)
        outcomes = self.chunks(records, self.advance)
        return self.output(records, outcomes, ids)

    def advance(self, rows: int, tokens: int) -> None:
        """A batch's rows and tokens to the driver's progress, without waiting for it."""
        if self.progress is not None and (rows or tokens):
            self.progress.add.remote(rows, tokens)

    def records(self, block: pa.Table, ids: list[int]) -> list[Record]:
        if self.job.input_format == "jsonl":
            return [line_record(raw, i & ROW_MASK, row, self.names[i >> FILE_BITS], self.job.field)
                    for raw, i, row in zip(block.column(LINE).to_pylist(), ids, block.column(ROW).to_pylist())]
        data, records, start = block.drop_columns([ID]), [], 0
        while start < len(ids):  # a run of one file's rows at a time
            file = ids[start] >> FILE_BITS
            end = next((n for n in range(start, len(ids)) if ids[n] >> FILE_BITS != file), len(ids))
            for batch in data.slice(start, end - start).combine_chunks().to_batches():
                numbers = [i & ROW_MASK for i in ids[start:start + batch.num_rows]]
                records += batch_records(batch, self.names[file], self.job.field, Position(), numbers)
                start += batch.num_rows
        return records

    def output(self, records: list[Record], outcomes: list[Outcome], ids: list[int]) -> pa.Table:
        """The block's rows as the job commits a chunk's (commit.commit_rows, error_lines): the written ones
        (their output and id), then the failed ones (nulls, their id, error and errors line); the block's counts
        (Counters, as JSON) on its first row."""
        job = self.job
        counters = Counters()
        rows = BlockRows(job, self.schema)
        failed = commit_rows(records, outcomes, rows, job, counters)
        kept = [n for n, o in enumerate(outcomes) if o.error is None]
        lost = [n for n, o in enumerate(outcomes) if o.error is not None]
        written = rows.table()
        table = pa.concat_tables([written, pa.table({f.name: pa.nulls(len(lost), f.type) for f in written.schema},
                                                    schema=written.schema)])
        order = kept + lost
        counted = [json.dumps(counted_fields(counters))] + [None] * (len(order) - 1)
        for name, values, kind in (
                (ID, [ids[n] for n in order], pa.int64()), (ROW, [records[n].index for n in order], pa.int64()),
                (ERROR, [None] * len(kept) + [error for _, error in failed], pa.string()),
                (ERROR_LINE, [None] * len(kept) + error_lines(failed, job), pa.binary()),
                (WORKER, [self.worker] * len(order), pa.string()), (COUNTED, counted, pa.string())):
            table = table.append_column(name, pa.array(values, kind))
        return table


class BlockRows:
    """A block's written rows as the job's writers make them (the sink that commit.commit_rows writes through):
    JSONL lines by io's LineSink, one a row (JSON escapes a line break), or a Parquet table (commit.TableSink), in
    the input's schema."""

    def __init__(self, job: Job, schema: pa.Schema | None):
        self.added = job.added
        self.lines = io.BytesIO() if job.output_format == "jsonl" else None
        self.tables = TableSink(schema, job) if self.lines is None else None

    def write(self, records: list[Record], values: list[dict | None]) -> list[tuple[Record, str]]:
        if self.tables is None:
            return LineSink(self.lines, "jsonl", self.added).write(records, values)
        return self.tables.write(records, values)

    def table(self) -> pa.Table:
        """The written rows: a JSONL line each (LINE), or the output's Parquet columns."""
        if self.tables is None:
            lines = self.lines.getvalue().split(b"\n")[:-1]
            return pa.table({LINE: pa.array([line + b"\n" for line in lines], pa.binary())})
        return self.tables.table()


class ProgressCounter:
    """A Ray actor that adds up the rows and tokens the translating actors finish, for the driver's progress
    (follow_progress): rows as they are translated, before their block is written."""

    def __init__(self):
        self.rows = self.tokens = 0

    def add(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens

    def read(self) -> tuple[int, int]:
        return self.rows, self.tokens


@contextlib.contextmanager
def follow_progress(reporter: Reporter | None, every: float = 0.5) -> Iterator[object]:
    """While the block runs: a ProgressCounter actor for the translating actors (its handle; None without a
    reporter), and a thread that hands what it has counted to `reporter` every `every` seconds, and once more at
    the end."""
    if reporter is None:
        yield None
        return
    counter = ray.remote(num_cpus=0)(ProgressCounter).remote()
    stop, seen = threading.Event(), [0, 0]

    def take() -> None:
        try:
            rows, tokens = ray.get(counter.read.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - a late answer is taken on the next turn; the job does not wait on it
            return
        if (rows, tokens) != tuple(seen):
            reporter.advance(rows - seen[0], tokens - seen[1])
            seen[:] = rows, tokens

    def follow() -> None:
        while not stop.wait(every):
            take()

    thread = threading.Thread(target=follow, name="nllb-ray-progress", daemon=True)
    thread.start()
    try:
        yield counter
    finally:
        stop.set()
        thread.join()
        take()
        with contextlib.suppress(Exception):  # a Ray gone with the job's error: that error is the job's line
            ray.kill(counter)


def counted_fields(counters: Counters) -> dict:
    """What a block or a write task counted: the Counters' counts, without the time (the job's own)."""
    return {name: value for name, value in asdict(counters).items() if name != "seconds"}


class TaskName(FilenameProvider):
    """A write task's name, its write's and its number's, without an extension: Ray's two-phase checkpoint knows a
    task's files as those whose names start with it (a name without an extension is its own base), so that the
    parts of a task whose checkpoint was not committed are deleted when the job resumes. Ray asks for it as the
    task starts to write; `task` holds it then."""

    task = ""

    def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
        self.task = f"{write_uuid}_{task_index:06}"
        return self.task


class Sink(BlockBasedFileDatasink):
    """The staged parts: a write task's rows sorted by id, the translated ones in a part named by its first row
    and its row count, the failed ones' errors lines beside it, and the file Ray opens for the task (named by it
    alone: TaskName) holding what its rows counted. With --on-error fail a failed row fails the task, and the
    job. `digits`: the width of the file numbers in the names (file_digits)."""

    def __init__(self, path: str, fmt: str, on_error: str, digits: int):
        super().__init__(path, filename_provider=TaskName())
        self.fmt, self.on_error, self.digits = fmt, on_error, digits
        self.workers: set[str] = set()
        self.returned: dict | None = None

    def write(self, blocks, ctx) -> dict | None:
        """The task's rows written (write_block_to_file); returns the actors that translated them."""
        self.returned = None
        super().write(blocks, ctx)  # Ray names the task (TaskName), opens its file and calls write_block_to_file
        return self.returned

    def write_block_to_file(self, block: BlockAccessor, file) -> None:
        self.returned = self.write_parts(block.to_arrow(), self.filename_provider.task, file)

    def write_parts(self, table: pa.Table, task: str, record) -> dict:
        """The rows of the task named `task` into its parts, and what they counted into `record` (a binary
        stream) as JSON; returns the actors that translated them."""
        table = table.sort_by(ID)
        errors = table.column(ERROR)
        if self.on_error == "fail" and errors.null_count < table.num_rows:
            raise NllbError(errors.drop_null()[0].as_py())
        with writing(os.path.dirname(self.path), task):
            for start, end in runs(table.column(ID).to_pylist(), table.column(ROW).to_pylist()):
                run = table.slice(start, end - start)
                first = run.column(ID)[0].as_py()
                failed = run.column(ERROR).is_valid()
                kept, lost = run.filter(pa.compute.invert(failed)), run.filter(failed)
                for rows, suffix in ((kept, f".{self.fmt}"), (lost, ".errors.jsonl")):
                    if rows.num_rows:
                        name = staged_name(task, first >> FILE_BITS, first & ROW_MASK, rows.num_rows, self.digits, suffix)
                        self.write_part(f"{self.path}/{name}", rows, suffix == ".errors.jsonl")
            counted = Counters()
            for block in table.column(COUNTED).drop_null().to_pylist():
                add_counts(counted, json.loads(block))
            record.write(json.dumps(counted_fields(counted)).encode())
        return {"workers": sorted(set(table.column(WORKER).to_pylist()))}

    def write_part(self, path: str, rows: pa.Table, errors: bool) -> None:
        """A part's rows (translated: their output; failed: their errors lines) into the file at `path`."""
        try:
            with self.open_output_stream(path) as stream:
                if errors:
                    stream.write(b"".join(rows.column(ERROR_LINE).to_pylist()))
                elif self.fmt == "jsonl":
                    stream.write(b"".join(rows.column(LINE).to_pylist()))
                else:
                    pq.write_table(rows.drop_columns([c for c in INTERNAL if c in rows.column_names]), stream)
        except OSError as error:
            raise write_error(path, error) from None

    def open_output_stream(self, path: str):
        """A file of the task's (a part, or the one Ray opens for the task), or the NllbError that names it."""
        try:
            return super().open_output_stream(path)
        except OSError as error:
            raise write_error(path, error) from None

    def on_write_complete(self, write_result) -> None:
        self.workers = {w for r in write_result.write_returns if r for w in r["workers"]}
        super().on_write_complete(write_result)


def write_error(path: str, error: OSError) -> NllbError:
    return NllbError(f"cannot write {path}: {plain(error).strerror or error}.")


def add_counts(counters: Counters, counted: dict) -> None:
    """Add what a block or a task counted (counted_fields) to `counters`."""
    for name, value in counted.items():
        setattr(counters, name, getattr(counters, name) + value)


@contextlib.contextmanager
def writing(staging: str, task: str):
    """A file in the staging's WRITING folder while a write task writes its parts (wait_for_writes), naming the
    task's process: its host, pid and start time."""
    marker = os.path.join(staging, WRITING, task)
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    with open(marker, "w", encoding="utf-8") as f:
        json.dump({"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid())}, f)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker)


def process_start(pid: int) -> str | None:
    """When a process of this host started (its start time in clock ticks since boot), None where it is gone: a
    pid with another start time is another process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def still_writing(marker: str) -> bool:
    """Whether the write task of a WRITING file may still be writing: not where it names a process of this host
    that has ended (a kill -9, a job stopped with the Ray it started); a task of another host may."""
    try:
        with open(marker, encoding="utf-8") as f:
            task = json.load(f)
        if task["host"] != socket.gethostname() or task["start"] is None:
            return True
        return process_start(int(task["pid"])) == task["start"]
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError, TypeError):
        return True


def wait_for_writes(staging: str, timeout: float = WRITES_END_S) -> None:
    """Return once no write task is writing parts into the staging (none holds a file in WRITING but a task of
    this host that has ended), or after `timeout` seconds. Ray reports a failed job while its other write tasks
    may still be writing; a part one of them wrote after a resume had cleaned up the uncommitted parts would hold
    rows the resume writes again (two parts starting at the same row). A task of another host killed while it
    wrote leaves its file: the timeout ends the wait."""
    folder = os.path.join(staging, WRITING)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not any(still_writing(os.path.join(folder, name)) for name in os.listdir(folder)):
                return
        except FileNotFoundError:
            return
        time.sleep(0.05)


def runs(ids: list[int], rows: list[int]) -> Iterator[tuple[int, int]]:
    """The (start, end) of each run of adjacent input rows (one file, row numbers one after another) in rows
    sorted by id: a part holds one run, so that the parts in name order hold the rows in input order, whatever
    rows a write task was given (those a resumed job had left, blocks that finished out of order)."""
    start = 0
    for n in range(1, len(ids) + 1):
        if n == len(ids) or ids[n] >> FILE_BITS != ids[n - 1] >> FILE_BITS or rows[n] != rows[n - 1] + 1:
            yield start, n
            start = n


def translate_with_ray(paths: list[str], output: str, job: Job, decode: DecodeOptions, model: ModelOptions,
                       options: RayOptions = RayOptions(), *,
                       batching: Mapping[str, int | None] = MappingProxyType({}), resume: bool = False,
                       input_format: str | None = None, output_format: str | None = None, progress: str = "none",
                       warn: Callable[[str], None] = print, load: Callable[[], object] | None = None) -> Outcomes:
    """Translate the inputs (files, directories, globs) into the directory OUTPUT on Ray (the module's docstring).
    `job` holds the fields, languages, --on-error and --force (its paths and formats are not read); `model` the
    model directory, adapter, compute type, K/V cache type and device (auto, cpu or cuda: Ray gives each actor its
    GPU); `batching` BatchOptions' fields as given, each left out (or None) the device's (the CLI's),
    max_batch_sentences none; `load` makes an actor's Translator, in the actor (default: load_on_actor, the model
    loaded on the actor's GPU, or on the CPU with `options.threads`); `progress` a mode of job/progress.py (bar,
    json or none: the rows as the actors translate them)."""
    chunk_rows, max_batch_tokens, max_batch_sentences = (
        batching.get(name) for name in ("read_chunk_rows", "max_batch_tokens", "max_batch_sentences"))
    files = expand_inputs(paths)
    check_names([*files, output])
    fmt = inputs_format(files, input_format)
    if output_format is not None and output_format != fmt:
        raise NllbError(f"--ray writes the inputs' format ({fmt}), not {output_format}.")
    job = replace(job, input_format=fmt, output_format=fmt)
    if job.targets and job.targets_as == "rows":
        raise NllbError("--ray writes a row for each input row: several target languages go to columns there "
                        "(--targets-as columns), not rows.")
    check_fields(job)
    check_internals()
    if model.adapter is not None:  # the actors load it: what the command checks before any work, checked here
        read_adapter_config(Path(model.adapter))
    compressions, schema = check_inputs(files, fmt, job)
    check_output(output, files, job, job.force)
    check_kv_cache_type(model.kv_cache_type)
    computes = replace(model, compute_type=expected_compute_type(model.compute_type, model.device != "cpu", model.model))
    identity = ray_identity(files, job, decode, batching, computes)
    staging = staging_path(output)
    if resume and finished_job(output) == identity:
        remove_path(staging)
        return Outcomes(already=True)
    started = time.monotonic()
    errors = open_errors(job)
    workers: tuple[str, ...] = ()
    try:
        prepare_staging(staging, identity, resume, warn)
        if not os.path.exists(os.path.join(staging, PLAN)):  # a promotion under way: every row is written
            load = load or functools.partial(load_on_actor, model, options.threads, identity, socket.gethostname())
            reporter = None
            if progress != "none":
                total = None if saved_any(staging) else input_rows(files, compressions, fmt)
                label = job_label(replace(job, input=files[0] if len(files) == 1 else f"{len(files):,} files"))
                reporter = Reporter(progress, total, summary=False, label=label)
            try:
                with local_ray(options.address):
                    workers = run_dataset(files, compressions, staging, job, decode, model.device, options, schema,
                                          load, chunk_rows, max_batch_tokens, max_batch_sentences, reporter)
            finally:
                if reporter is not None:
                    reporter.close(summary=False)
        outcomes = promote(staging, output, files, job, identity, errors, warn)
    except BaseException as error:
        if errors is not None:
            errors.discard()
        if isinstance(error, Stopped):
            error.resumable = saved_any(staging)
        raise
    outcomes.workers = workers
    outcomes.counters.seconds = time.monotonic() - started
    return outcomes


def input_rows(files: list[str], compressions: list[str | None], fmt: str) -> int | None:
    """The rows of the inputs where their files say it without being read (Parquet's footers), else None."""
    if fmt != "parquet" or any(compressions):
        return None
    return sum(pq.ParquetFile(path).metadata.num_rows for path in files)


def report(outcomes: Outcomes, output: str, summary: bool = True, stream: TextIO | None = None,
           mode: str = "none", finished_as: str = "translated") -> None:
    """A --ray job's summary on stderr (or `stream`), unless not `summary`: the command's line (progress.Reporter;
    a JSON object in `mode` json) over the job's counts, naming the actors that ran it (`finished_as`: what it
    calls a row done, Job.finished_as); or that the job had finished before."""
    count = len(outcomes.workers)
    where = (f"{count} Ray actor{'s' if count > 1 else ''} ({', '.join(outcomes.workers)})" if count else
             "no Ray actor this run (every row had been written)")
    reporter = Reporter(mode, counters=outcomes.counters, stream=stream, summary=summary, output=output, where=where,
                        live=False, finished_as=finished_as)
    if outcomes.already:
        if summary:
            reporter.write(f"Already finished: {output} holds this job's rows, and its inputs and options are "
                           "unchanged; nothing to do.")
        return
    reporter.close()


def open_errors(job: Job) -> PartialFile | StreamFile | None:
    """The errors file of --on-error record, opened before any work as the command opens it (a partial file beside
    it, locked, or a stream): one that cannot be written is refused before the job runs. The promotion writes it."""
    if job.on_error != "record" or not job.errors:
        return None
    return StreamFile(job.errors) if is_stream(job.errors) else PartialFile(job.errors)


def saved_any(staging: str) -> bool:
    """Whether a stopped job left anything for --resume to continue from: a part, or a promotion's plan."""
    try:
        return os.path.exists(os.path.join(staging, PLAN)) or bool(os.listdir(os.path.join(staging, "data")))
    except OSError:
        return False


def load_on_actor(model: ModelOptions, threads: int | None, identity: dict, host: str):
    """An actor's Translator: on the GPU Ray gave it (device auto or cuda), else on the CPU with `threads`. It
    computes with the model the job's identity names (job.spec.check_worker: its files, its K/V cache type, and on a
    GPU its compute type; the driver's `host` tells whether the files are the driver's own), or an NllbError: a
    job's bytes must not depend on which actor took a block."""
    from ..model.translator import load_translator

    translator = load_translator(model.model, model.device, model.adapter, model.compute_type, model.kv_cache_type)
    loaded = loaded_identity(translator)
    if translator.device == "cpu":  # the CPU computes in float32 whatever the job's GPUs would
        loaded["compute_type"] = identity["compute_type"]
    check_worker(identity, loaded, f"the Ray actor on {translator.device} of {socket.gethostname()}",
                 same_host=socket.gethostname() == host)
    if threads is not None and translator.device == "cpu":
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads, user_api="blas")
    return translator


def check_output(output: str, files: list[str], job: Job, force: bool) -> None:
    """OUTPUT is a directory nllb wrote (or an empty one, or none yet), no input lies in it, and the errors file
    is none of the inputs (the command's checks of it, OUTPUT aside: here a directory, checked above)."""
    if os.path.exists(output) and not os.path.isdir(output):
        raise NllbError(f"OUTPUT {output} is a file, and --ray writes a directory of parts: name a directory.")
    if os.path.isdir(output) and os.listdir(output) and finished_job(output) is None and not force:
        raise NllbError(f"OUTPUT {output} is a directory nllb did not write: refusing to replace it (pass --force "
                        "to replace it).")
    top = os.path.realpath(output)
    if job.errors and os.path.realpath(job.errors).startswith(top + os.sep):
        raise NllbError(f"--errors {job.errors} lies in OUTPUT {output}, which the finished parts replace: name a "
                        "file outside it.")
    for path in files:
        if os.path.realpath(path).startswith(top + os.sep):
            raise NllbError(f"the input {path} lies in OUTPUT {output}: refusing to replace it.")
        check_paths(replace(job, input=path, output="-"))


def finished_job(output: str) -> dict | None:
    """The job a finished output directory records in its _SUCCESS file; None where it has none."""
    try:
        with open(os.path.join(output, SUCCESS), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record.get("job") if isinstance(record, dict) and record.get("nllb") == 1 else None


def prepare_staging(staging: str, identity: dict, resume: bool, warn: Callable[[str], None]) -> None:
    """The staging directory of this job: kept with --resume when it holds the same job, else made anew."""
    path = os.path.join(staging, "job.json")
    if os.path.isdir(staging) and not os.path.islink(staging):
        try:
            with open(path, encoding="utf-8") as f:
                stored = json.load(f)
        except (OSError, ValueError):
            stored = None
        if resume and stored == identity:
            wait_for_writes(staging)  # the interrupted job's tasks that are still writing, on a cluster
            remove_path(os.path.join(staging, WRITING))  # files of tasks killed while they wrote
            return
        if resume and stored is not None:
            raise NllbError(f"--resume: the interrupted job in {staging} differs in "
                            f"{differences(stored if isinstance(stored, dict) else {}, identity)}; run without "
                            "--resume to start afresh.")
        if resume:
            warn(f"Starting afresh: {staging} holds no job to continue.")
    elif resume:
        warn("Starting afresh: there is no interrupted job to continue.")
    remove_path(staging)
    os.makedirs(os.path.join(staging, "data"))
    os.makedirs(os.path.join(staging, ROWS))
    write_json(path, identity)


def record_actors(staging: str, device: str) -> None:
    """Record where the job's actors compute (cuda or cpu: with --device auto, the cluster's GPUs decide) beside
    its staged parts, or refuse a resumed job whose actors would compute elsewhere than those that staged them: a
    GPU computes in bf16, the CPU in float32, and one output must not mix their rows."""
    path = os.path.join(staging, ACTORS)
    try:
        with open(path, encoding="utf-8") as f:
            staged = json.load(f).get("device")
    except (OSError, ValueError, AttributeError):
        staged = None
    if staged is None:
        write_json(path, {"device": device})
    elif staged != device:
        where = {"cuda": "GPUs", "cpu": "the CPU"}
        raise NllbError(f"--resume: the interrupted job's actors computed on {where.get(staged, staged)}, and this "
                        f"cluster's would on {where[device]}; resume where it ran (--device), or run without --resume "
                        "to start afresh.")


def remove_path(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def write_json(path: str, value: dict) -> None:
    """A small JSON file written beside its name, fsynced and renamed into place; ASCII, as the command's state
    (state.save_state): a name that is not UTF-8 (the model's directory) is kept as escapes."""
    temp = f"{path}.tmp"
    remove_path(temp)
    with replaced_atomically(path, temp) as f:  # (its directory synced)
        f.write(json.dumps(value).encode())


@contextlib.contextmanager
def local_ray(address: str | None) -> Iterator[None]:
    """Ray for the job (start_ray): a Ray this call connected to is disconnected as the job ends, however it ends
    (a Ray it started ends with that), and a Ray it started ends soon after a kill -9 of this process too (KEEPER)."""
    if not start_ray(address):
        yield
        return
    keeper = keep_local_ray()
    try:
        yield
    finally:
        ray.shutdown()
        if keeper is not None:
            keeper.stdin.close()  # the keeper ends what ray.shutdown left, and then itself
            with contextlib.suppress(subprocess.TimeoutExpired):
                keeper.wait(timeout=KEEPER_END_S)


def keep_local_ray() -> subprocess.Popen | None:
    """The keeper (KEEPER) of the Ray this process started, given its processes' pids; None for a Ray it joined."""
    node = ray._private.worker._global_node
    pids = [str(info.process.pid) for infos in (node.all_processes.values() if node else ()) for info in infos]
    if not pids:
        return None
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", KEEPER, *pids], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def start_ray(address: str | None) -> bool:
    """Ray joined (address, $RAY_ADDRESS, or the one running here) or started here; whether this call connected
    (and so disconnects, which ends a Ray it started)."""
    # Ray's notes on what it does (token auth, progress bars off) and its tracebacks of a failed task are not the
    # job's: the error that ends the job is its one line (Ray keeps its own logs in its session's directory)
    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    if ray.is_initialized():
        return False
    # the driver's core worker writes a line for every actor whose constructor's arguments are in the object store
    # (Ray Data's are, always), and one as it starts to say what RAY_BACKEND_LOG_LEVEL set; the job's own errors
    # come as exceptions
    quiet = "RAY_BACKEND_LOG_LEVEL" not in os.environ
    if quiet:
        os.environ["RAY_BACKEND_LOG_LEVEL"] = "fatal"
    # and the driver prints each failed try of a task that is tried again (a batch function that raised, an actor
    # that died) on stdout, with its traceback: the job's own error is its line, once the tries are spent
    os.environ.setdefault("RAY_enable_output_error_log_if_still_retry", "false")
    if address is None:
        address = os.environ.get("RAY_ADDRESS") or running_here()
    if address not in (None, "local"):
        check_answers(address)
    try:
        with (silent_stderr() if quiet else contextlib.nullcontext()):
            if address in (None, "local"):  # "local": a new Ray, whatever a stopped one's record says
                cpus = max(LOCAL_CPUS, os.cpu_count() or 1)
                ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=logging.ERROR,
                         log_to_driver=False)
            else:
                ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    except SystemExit as exit:  # ray.init's own SIGTERM handler, in force while it starts Ray, exits with 15
        ray.shutdown()
        if exit.code == signal.SIGTERM:
            act_on_signal(signal.SIGTERM)
        raise
    finally:
        # ray.init sets a SIGTERM handler of its own (it exits with 15), and the driver's core worker a native one
        # that prints a stack dump: the job's stop signals are the job's again (job/signals.py)
        reclaim_signals()
    return True


def check_answers(address: str) -> None:
    """The cluster's address takes connections: ray.init waits for good on one that does not (a typo, a stopped
    cluster, a firewall)."""
    from ray._private import services

    try:
        found = address if address.startswith("ray://") else services.canonicalize_bootstrap_address(address)
    except ConnectionError:
        raise NllbError(f"Ray cluster {address}: no Ray runs on this machine (start one with `ray start --head`, "
                        "or name one with --ray-address).") from None
    except ValueError as error:
        raise NllbError(f"Ray cluster {address}: {str(error).splitlines()[0]}.") from None
    host, _, port = found.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT).close()
    except (OSError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error) or "no answer"
        raise NllbError(f"Ray cluster {address}: nothing answers at {found} ({reason}).") from None


@contextlib.contextmanager
def silent_stderr():
    """File descriptor 2 on /dev/null for a while: what Ray's C++ code writes there, not sys.stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def running_here() -> str | None:
    """The address "auto" where the Ray that `ray start` started on this machine still runs (ray.init() joins it
    as well, but it also follows the record of one that has stopped, and waits for it for good). "auto", not its
    address: Ray finds the cluster's token (token authentication is on by default) only for "auto"."""
    from ray._private import services

    recorded = services.find_bootstrap_address(None)  # $RAY_TMPDIR/ray/ray_current_cluster, else /tmp/ray's
    return "auto" if recorded and recorded in services.find_gcs_addresses() else None


def run_dataset(files: list[str], compressions: list[str | None], staging: str, job: Job, decode: DecodeOptions,
                device: str, options: RayOptions, schema: pa.Schema | None, load: Callable, chunk_rows: int | None,
                max_batch_tokens: int | None, max_batch_sentences: int | None,
                reporter: Reporter | None = None) -> tuple[str, ...]:
    """The pipeline: read, blocks of chunk_rows rows, the actors, the staged parts; the actors' names. `reporter`
    shows the rows as the actors translate them (follow_progress); Ray Data's own progress bars stay off."""
    context = DataContext.get_current()
    context.execution_options.preserve_order = False  # the parts' names keep the order (Sink)
    configure(context, enable_progress_bars=False, print_on_execution_start=False,
              actor_task_retry_on_errors=True,  # with max_task_retries: a batch function that raised runs again
              raise_original_map_exception=True,  # what it raised reaches the job's error (ray_error), not a wrapper
              checkpoint_config=CheckpointConfig(id_column=ID, checkpoint_path=os.path.join(staging, "checkpoint"),
                                                 delete_checkpoint_on_success=False))
    gpus = int(ray.cluster_resources().get("GPU", 0)) if device != "cpu" else 0
    if device == "cuda" and not gpus:
        raise NllbError("--device cuda: the Ray cluster has no GPU.")
    actors = options.actors or max(1, gpus)
    if gpus and actors > gpus:
        raise NllbError(f"--ray-actors {actors}: the Ray cluster has {gpus} GPU(s), one an actor.")
    record_actors(staging, "cuda" if gpus else "cpu")
    cpus = int(ray.cluster_resources().get("CPU", 0))
    if actors > cpus:  # an actor takes a CPU: more would wait for ever for theirs
        raise NllbError(f"--ray-actors {actors}: the Ray cluster has {cpus} CPU(s), one an actor.")
    defaults = GPU_BATCHING if gpus else BatchOptions()
    chunk_rows = chunk_rows or defaults.read_chunk_rows
    names = list(files)  # as messages name them; the read tasks, on any node, get them whole
    dataset = ray.data.read_datasource(Source([os.path.abspath(f) for f in files], names, job.input_format,
                                              compressions, staging))
    # strict: every block chunk_rows rows but the last; else each read block leaves a small one of its own, which
    # an actor takes as one call with little for the GPU to do while its next block is prepared
    dataset = dataset.repartition(target_num_rows_per_block=chunk_rows, strict=True)
    with follow_progress(reporter) as counter:
        return translate_dataset(dataset, files, staging, job, decode, load, names, schema, gpus, actors, chunk_rows,
                                 max_batch_tokens, max_batch_sentences, counter)


def translate_dataset(dataset, files: list[str], staging: str, job: Job, decode: DecodeOptions, load: Callable,
                      names: list[str], schema: pa.Schema | None, gpus: int, actors: int, chunk_rows: int,
                      max_batch_tokens: int | None, max_batch_sentences: int | None, counter) -> tuple[str, ...]:
    """The blocks through the actors (Translating) into the staged parts (Sink); the actors' names."""
    # two blocks at once on an actor (one prepared while the other is on the engine): max_concurrency, the actor's
    # option of ray.remote, which every Ray Data since 2.55 takes (its ActorPoolStrategy's own has changed name);
    # max_task_retries is an option of ray.remote too, not one of map_batches' named parameters
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*")
        dataset = dataset.map_batches(
            Translating, fn_constructor_kwargs={"load": load, "names": names, "job": job, "decode": decode,
                                                "max_batch_tokens": max_batch_tokens, "schema": schema,
                                                "max_batch_sentences": max_batch_sentences, "progress": counter},
            batch_size=chunk_rows, batch_format="pyarrow", num_gpus=1 if gpus else 0, num_cpus=1,
            compute=ActorPoolStrategy(size=actors, enable_true_multi_threading=True), max_concurrency=2,
            max_task_retries=TASK_RETRIES)
    sink = Sink(os.path.join(staging, "data"), job.input_format, job.on_error, file_digits(len(files)))
    failure = None
    try:
        with warnings.catch_warnings():  # Ray Data's advice on its settings (fewer blocks than actors) is not the job's
            warnings.filterwarnings("ignore", category=UserWarning, module=r"ray\.data\.")
            dataset.write_datasink(sink)
    except Exception as error:  # noqa: BLE001 - Ray wraps what the tasks raised
        failure = ray_error(error)
    if failure is not None:
        # the failed execution's objects (in cycles through its traceback) hold its actors, and with them their
        # GPUs, until they are collected: a job run next in this process would wait for them
        del dataset, sink
        gc.collect()
        wait_for_writes(staging)  # nothing of this job lands after it has ended: a resume may start at once
        raise NllbError(f"{failure.rstrip('.')} (the rows written so far are kept: run the same command with --resume "
                        "to continue)")
    return tuple(sorted(sink.workers))


def configure(context: DataContext, **settings) -> None:
    """Set Ray Data's settings, each one this Ray has: a setting it has renamed or dropped would be set in vain
    (a dataclass takes any attribute), and the job would run otherwise than it says."""
    for name, value in settings.items():
        if not hasattr(context, name):
            raise NllbError(f"--ray: Ray {ray.__version__}'s DataContext has no {name}, which the job sets: install a "
                            "Ray that nllbcli supports (its ray extra: pip install '.[ray]' in nllbcli's checkout).")
        setattr(context, name, value)


def check_internals() -> None:
    """Refuse, in one line and before any work, a Ray that lacks what the job needs of it beyond what it
    publishes (INTERNALS)."""
    for module, names in INTERNALS.items():
        try:
            found = importlib.import_module(module)
        except ImportError:
            found, names = None, names[:1]
        for name in names:
            if not hasattr(found, name):
                raise NllbError(f"--ray: Ray {ray.__version__} has no {module}.{name}, which the job needs (runners/"
                                "ray.py's INTERNALS): install a Ray that nllbcli supports (its ray extra: pip install "
                                "'.[ray]' in nllbcli's checkout).")


def ray_error(error: BaseException) -> str:
    """What a failed Ray job's error says: the NllbError a task raised, else the first line of the cause."""
    seen, last = set(), error
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        cause = getattr(error, "cause", None)  # a RayTaskError's: what the task raised
        if isinstance(cause, BaseException) and cause is not error:
            error = cause
            continue
        if isinstance(error, NllbError):  # (Ray adds lines of its own to what a task raised)
            return str(error).splitlines()[0]
        if str(error).strip():  # Ray Data's own exception around a failed job's cause says nothing itself
            last = error
        error = error.__cause__
    text = str(last).strip().splitlines()
    return f"Ray: {type(last).__name__}: {text[0] if text else 'the job failed'}"


def promote(staging: str, output: str, files: list[str], job: Job, identity: dict,
            errors: PartialFile | StreamFile | None, warn: Callable[[str], None]) -> Outcomes:
    """Every row written: the parts renamed in input order, the failed rows recorded (into `errors`) or named
    (skip), and the parts' directory renamed onto OUTPUT with its _SUCCESS. The steps follow the plan (PLAN,
    recorded once the parts' rows are counted against the inputs'), and each can be done again: a promotion
    stopped, failed or killed at any point is finished by --resume, to the same bytes."""
    data, plan_path = os.path.join(staging, "data"), os.path.join(staging, PLAN)
    if os.path.exists(plan_path):
        with open(plan_path, encoding="utf-8") as f:
            plan = json.load(f)
    else:
        plan = plan_promotion(staging, files)
        write_json(plan_path, plan)
    for name in plan["tasks"]:  # the tasks' counts, in the plan now
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(data, name))
    for staged, final in plan["parts"]:
        move(os.path.join(data, staged), os.path.join(data, final))
    failed = os.path.join(staging, "errors")  # the errors parts, out of what becomes OUTPUT, until the end
    os.makedirs(failed, exist_ok=True)
    for staged, final in plan["errors"]:
        move(os.path.join(data, staged), os.path.join(failed, final))
    failed_parts = [os.path.join(failed, final) for _, final in plan["errors"]]
    if errors is not None:
        errors.start(0)
        for path in failed_parts:
            with open(path, "rb") as source:
                shutil.copyfileobj(source, errors.stream)
        errors.finish()
    else:
        for path in failed_parts:
            with open(path, encoding="utf-8") as lines:
                for line in lines:
                    warn(skipped(json.loads(line)["error"]))
    counts = plan["counts"]
    write_json(os.path.join(data, SUCCESS), {"nllb": 1, "job": identity, **counts})
    with critical():  # OUTPUT is never left gone by a stop signal: the old one replaced, then the new in place
        if os.path.isdir(output):
            replaced = os.path.join(staging, "replaced")
            remove_path(replaced)
            os.rename(output, replaced)
        os.rename(data, output)
        job_finished()
    sync_directory(output)  # the renames in OUTPUT's directory
    shutil.rmtree(staging)
    return Outcomes(Counters(**counts))


def plan_promotion(staging: str, files: list[str]) -> dict:
    """The promotion's plan: each staged part's final name, in input order (the errors parts apart), the files of
    the write tasks' counts (Sink), and the job's counts (counted_fields): the rows, translated and failed from the
    parts' names, the rest summed from the tasks'. The parts' rows must be each input's, as its read task counted
    them: a part lost, a row written twice or an input changed while the job read it is refused, nothing promoted."""
    counted = counted_rows(staging, files)
    digits, held, translated = file_digits(len(files)), [0] * len(files), 0
    parts: dict[str, str] = {}
    failed: dict[str, str] = {}
    tasks, counters = [], Counters()
    data = os.path.join(staging, "data")
    for name in os.listdir(data):
        found = parse_staged(name)
        if found is None:
            if "." not in name:  # a write task's counts (TaskName)
                tasks.append(name)
                try:
                    with open(os.path.join(data, name), encoding="utf-8") as f:
                        add_counts(counters, json.load(f))
                except (OSError, ValueError, TypeError, AttributeError) as error:
                    raise NllbError(f"{staging}: the counts of the write task {name} cannot be read ({error}): "
                                    "refusing to finish the job; run it again without --resume.") from None
            continue
        file, line, rows, suffix = found
        if file >= len(files):
            raise NllbError(f"{staging}: the part {name} is of an input this job does not have: refusing to finish "
                            "the job; run it again without --resume.")
        final = final_name(file, line, digits, suffix)
        group = failed if suffix == ".errors.jsonl" else parts
        if final in group:
            raise NllbError(f"{staging}: two parts start at the same row ({group[final]} and {name}): refusing to "
                            "finish a job that would write a row twice; run it again without --resume.")
        group[final] = name
        held[file] += rows
        translated += rows if group is parts else 0
    for number, name in enumerate(files):
        if held[number] != counted.get(number):
            have = "were not counted" if number not in counted else f"are {counted[number]:,}"
            raise NllbError(f"{staging}: the parts hold {held[number]:,} rows of {name}, whose rows {have}: refusing "
                            "to finish the job; run it again without --resume.")
    counters.rows, counters.translated, counters.failed = sum(held), translated, sum(held) - translated
    return {"parts": [[parts[final], final] for final in sorted(parts)],
            "errors": [[failed[final], final] for final in sorted(failed)], "tasks": sorted(tasks),
            "counts": counted_fields(counters)}


def counted_rows(staging: str, files: list[str]) -> dict[int, int]:
    """Each input's rows by its number, as the read tasks recorded them (ROWS); an input read twice (a task run
    again, a resumed job) must have had the same rows each time."""
    counted: dict[int, int] = {}
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(os.path.join(staging, ROWS)):
            number, _, rows = name.partition("-")
            if not (number.isdigit() and rows.isdigit() and int(number) < len(files)):
                continue  # not a record of this job's (a file system's own file, say)
            number, rows = int(number), int(rows)
            if counted.setdefault(number, rows) != rows:
                raise NllbError(f"{files[number]} changed while the job read it ({counted[number]:,} rows, then "
                                f"{rows:,}): run the job again without --resume.")
    return counted


def move(source: str, target: str) -> None:
    """Rename `source` onto `target`, unless an earlier run of the promotion did."""
    if os.path.lexists(source):
        os.rename(source, target)
    elif not os.path.lexists(target):
        raise NllbError(f"{source} is gone: refusing to finish the job without its rows; run it again without "
                        "--resume.")
