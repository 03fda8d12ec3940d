"""Output files that survive a killed job, and the state that lets --resume continue it.

A file output is written as `.NAME.nllb-partial` beside it. After each chunk of rows the partial file (and the
errors file's) is fsynced, then `.NAME.nllb-state.json` is replaced atomically (write, fsync, rename) with how far
the input was read, how many bytes of each partial file are committed, and the counters. Whatever happens after
that (a crash, `kill -9`, a full disk) leaves at most uncommitted bytes after the committed ones; `--resume`
cuts them off, seeks the input past the committed rows and goes on. Chunks are the same whether a job runs
straight through or is resumed, and a row's translation does not depend on its batch, so the finished output is
byte-identical. At the end the partial file is renamed onto NAME and the state is kept as the job's record: it
says the job finished and which file it wrote (its device, inode, size and modification time). A `--resume` of
the same job finds its output finished and does nothing; any job may replace an output nllb wrote, while a
file nllb did not write (another job's input, say) is replaced only with --force.

The state and the partial files change together: a state only ever describes bytes its partial files hold. A
job that starts afresh removes the old state (durably) before it empties the old partial files, and a state
whose partial files hold fewer bytes than it says (damaged from outside) is reported and the job starts afresh,
so that a `--resume` in cron is never stuck on it.

A state's temporary file is removed when its write is interrupted (a stop signal, a full disk); one a kill -9
left is removed by the next run, even one that finds the job finished (with the empty partial files of a run
killed before its first state).

A state also records what shapes the output (input identity, formats, fields, languages, decoding options,
the model and adapter with their files, compute type, device: job.spec.identity_of); resuming with any of them
changed is refused rather than mixing two jobs in one file. It also names the errors file the failed rows went
to: a resume that would leave the rows recorded there behind (another --errors, or none) is refused.

Partial, state and temporary files are created exclusively and never through a link: a symbolic link, a hard
link, a FIFO or another user's file planted under one of their names is removed (its name only, never what it
points to) and the file created anew.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import BinaryIO, Callable, Iterator

from ..model.checkpoint import DEFAULT_KV_CACHE, MODEL_PARTS, changed_files
from ..errors import NllbError
from ..io import Position, file_mode

STATE_VERSION = 2
NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def partial_paths(output: str) -> tuple[str, str]:
    """The partial file and the state file of an output path."""
    directory, name = os.path.split(os.path.abspath(output))
    return os.path.join(directory, f".{name}.nllb-partial"), os.path.join(directory, f".{name}.nllb-state.json")


def converting_path(output: str) -> str:
    """Where a Parquet output is written from its frames before it is renamed onto `output`."""
    directory, name = os.path.split(os.path.abspath(output))
    return os.path.join(directory, f".{name}.nllb-converting")


@dataclass
class Saved:
    """What a state file holds."""

    job: dict  # what shapes the output; a resumed job must have the same
    position: Position = field(default_factory=Position)  # where the input continues
    output_bytes: int = 0  # committed bytes of the output's partial file
    errors_bytes: int = 0  # committed bytes of the errors file's partial file
    counters: dict = field(default_factory=dict)  # the summary's counters so far
    done: bool = False  # every row is written; only the renames were left
    errors: str | None = None  # the errors file (absolute path) the failed rows were recorded in, if any
    finished: bool = False  # the output is in place and `output_file` is it: the state is the job's record
    output_file: dict | None = None  # the file at OUTPUT this job may replace (file_stamp): the one there when it
    #                                  started, or none; once finished, the one it wrote


class StaleState(NllbError):
    """A state file that cannot be used (unreadable, another version's, or describing bytes its partial files
    no longer hold): the job starts afresh instead, saying why."""


def read_state(path: str) -> Saved | None:
    """The state file's contents, whatever job they describe; None when there is none, StaleState when they
    cannot be used."""
    try:
        fd = os.open(path, os.O_RDONLY | NO_FOLLOW)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise StaleState(f"cannot read the resume state {path} ({error.strerror or error})") from None
    try:
        with os.fdopen(fd, encoding="utf-8") as stream:
            data = json.load(stream)
        if data.get("version") != STATE_VERSION:
            raise StaleState(f"{path} was written by another version of nllb")
        saved = Saved(data["job"], Position(**data["position"]), data["output_bytes"], data["errors_bytes"],
                      data["counters"], data["done"], data["errors"], data.get("finished", False),
                      data.get("output_file"))
        if not isinstance(saved.job, dict) or not isinstance(saved.output_bytes, int) or not isinstance(saved.errors_bytes, int):
            raise TypeError("a value of the wrong type")
    except StaleState:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise StaleState(f"cannot read the resume state {path} ({error})") from None
    return saved


def changed_keys(stored_job: dict, job: dict) -> list[str]:
    return sorted(key for key in set(job) | set(stored_job) if job.get(key) != stored_job.get(key))


def check_same_job(stored_job: dict, job: dict) -> None:
    if changed_keys(stored_job, job):
        raise NllbError(f"cannot resume: the interrupted job differs in {differences(stored_job, job)}; run without "
                        "--resume to start over.")


# what an identity without the key stands for (checkpoint.model_identity leaves the default out)
LEFT_OUT = {"kv_cache_type": DEFAULT_KV_CACHE}


def differences(stored_job: dict, job: dict) -> str:
    """How a job differs from the interrupted one, for a refusal: up to three of what differs, each with what it
    was and is (a model or an adapter: another directory, or which of its files changed)."""
    described = []
    for key in changed_keys(stored_job, job)[:3]:
        was, now = (identity.get(key, LEFT_OUT.get(key)) for identity in (stored_job, job))
        described.append(f"{key} ({changed_files(was, now) if key in MODEL_PARTS else f'was {was!r}, now {now!r}'})")
    return ", ".join(described)


def file_stamp(path: str) -> dict | None:
    """What tells one version of a regular file from another: device, inode, size and modification time (None
    when there is no regular file at `path`)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return {"dev": info.st_dev, "ino": info.st_ino, "size": info.st_size, "mtime_ns": info.st_mtime_ns}


def written_by_nllb(output: str) -> bool:
    """Whether the file at `output` is one nllb may replace without --force: the file the job recorded beside it
    wrote, or found there when it started (and was allowed to replace), or put in place just before it was
    stopped (its state says done, and its partial file is gone)."""
    partial, state = partial_paths(output)
    try:
        saved = read_state(state)
    except StaleState:
        return False
    if saved is None:
        return False
    return saved.output_file == file_stamp(output) or (saved.done and not saved.finished and not os.path.lexists(partial))


def save_state(path: str, saved: Saved) -> None:
    """Replace the state file atomically: a reader sees the old state or the new one, never a mix. It is ASCII
    JSON: a path whose name is not UTF-8 (its bytes surrogate-escaped, as Python gives them) is kept as \\udcXX
    escapes, which read back as the same path."""
    try:
        with replaced_atomically(path, path + ".tmp") as stream:
            stream.write(json.dumps({"version": STATE_VERSION, **asdict(saved)}).encode())
    except OSError as error:
        raise NllbError(f"cannot save the resume state {path}: {error.strerror or error}.") from None
    sync_directory(path)


@contextmanager
def replaced_atomically(path: str, temp: str, mode: int | None = None) -> Iterator[BinaryIO]:
    """A binary file written under `temp` (created anew, private), fsynced, given `mode` and renamed onto `path`
    when the block ends; removed instead when the block, or any of that, fails (a full disk, a stop signal), so
    that nothing half-written stays beside `path`."""
    fd = create_private(temp, os.O_WRONLY)
    try:
        with os.fdopen(fd, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        if mode is not None:
            os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        remove_name(temp)
        raise


def remove_state(path: str) -> None:
    for name in (path, path + ".tmp"):
        remove_name(name)
    sync_directory(path)


def remove_name(path: str) -> None:
    """Remove a directory entry (a link itself, never what it points to), if there is one."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def create_private(path: str, flags: int) -> int:
    """Create `path` anew, exclusively, readable by this user alone: whatever had that name (a leftover of a
    killed run, or a link planted there) is removed first, and the new file never follows a link."""
    remove_name(path)
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL | NO_FOLLOW, 0o600)
    except FileExistsError:
        raise NllbError(f"{path} was created again by someone else while nllb was making it; refusing to write through it.") from None


def sync_directory(path: str) -> None:
    """Make a rename or a new file in `path`'s directory durable."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_own(path: str) -> int | None:
    """An existing file nllb wrote under `path` (opened read-write), or None when there is none. Anything else
    under that name (a symbolic or hard link, a FIFO, another user's file) is not trusted with the job's data: its
    name is removed, and None returned."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | NO_FOLLOW)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EACCES, errno.EPERM):
            raise
        fd = None
    if fd is not None:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and info.st_uid == os.getuid():
            os.set_blocking(fd, True)
            return fd
        os.close(fd)
    try:
        os.unlink(path)
    except IsADirectoryError:
        raise NllbError(f"{path} is a directory, in the way of nllb's own file of that name; remove it.") from None
    return None


def close_quietly(stream) -> None:
    """Close a file whose last flush can only fail after an error already told (sync() flushes before every
    commit and rename): a second report of a full disk would replace the first, which names the file."""
    try:
        stream.close()
    except OSError:
        pass


class NamedStream:
    """A file object whose write errors name the file the user knows (the output, not its partial file): a full
    disk reads `cannot write out.jsonl: No space left on device`."""

    def __init__(self, stream, name: str):
        self.raw, self.name = stream, name

    def write(self, data) -> int:
        try:
            return self.raw.write(data)
        except OSError as error:
            raise self.error(error) from None

    def flush(self) -> None:
        try:
            self.raw.flush()
        except OSError as error:
            raise self.error(error) from None

    def error(self, error: OSError) -> BaseException:
        if isinstance(error, BrokenPipeError):
            return error
        return NllbError(f"cannot write {self.name}: {error.strerror or error}.")

    def __getattr__(self, name):
        return getattr(self.raw, name)

    def __enter__(self) -> "NamedStream":
        return self

    def __exit__(self, *exc) -> None:
        self.raw.close()


class PartialFile:
    """A file being written as its partial beside it: appended to, committed, renamed into place at the end.

    Opening it takes the partial file's lock (two jobs never write one output) and keeps what it holds;
    `start(committed)` then cuts it to that many bytes (what the last commit wrote; 0 to start afresh) and
    appends after them."""

    def __init__(self, path: str):
        self.path = path
        self.partial = partial_paths(path)[0]
        self.closed = True
        try:
            fd = open_own(self.partial)
            self.created = fd is None
            if fd is None:
                fd = create_private(self.partial, os.O_RDWR)
        except OSError as error:
            raise NllbError(f"cannot write {path}: {error.strerror or error}.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise NllbError(f"another nllb job is writing {path} (its partial file {self.partial} is locked).") from None
        self.stream = NamedStream(os.fdopen(fd, "r+b"), path)
        self.closed = False

    @property
    def size(self) -> int:
        return os.fstat(self.stream.fileno()).st_size

    def start(self, committed: int = 0) -> None:
        """Keep the first `committed` bytes (a commit's) and write after them."""
        self.stream.truncate(committed)
        self.stream.seek(committed)

    def sync(self) -> int:
        """Make everything written so far durable; returns the committed length."""
        self.stream.flush()
        try:
            os.fsync(self.stream.fileno())
        except OSError as error:
            raise self.stream.error(error) from None
        return self.stream.tell()

    def finish(self, convert: Callable[[str, str], None] | None = None) -> None:
        """Put the finished file in place: rename the partial onto it, or have `convert(partial, path)` write it."""
        self.sync()
        try:
            if convert is None:
                os.chmod(self.partial, file_mode(self.path))  # the partial file is private (0600); the output should not be
                os.replace(self.partial, self.path)
            else:
                convert(self.partial, self.path)
                os.unlink(self.partial)
        except OSError as error:
            raise NllbError(f"cannot write {self.path}: {error.strerror or error}.") from None
        sync_directory(self.path)
        self.close()

    def close(self) -> None:
        if not self.closed:
            close_quietly(self.stream)  # closing the descriptor releases the lock
            self.closed = True

    def discard(self) -> None:
        """Remove the partial file (a job that committed nothing leaves nothing behind)."""
        if not self.closed:
            remove_name(self.partial)  # while the lock is held: no other job has it open
        self.close()


def is_stream(path: str) -> bool:
    """Whether a destination is written as a stream, as it goes: stdout (`-`), or an existing FIFO, terminal or
    other device (`/dev/stderr`, `/dev/null`, a FIFO). What went to a stream cannot be taken back, so it has no
    partial file, no state and no --resume; and a partial file renamed onto a device would replace it."""
    if path == "-":
        return True
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)  # through links: /dev/stderr is one
    except FileNotFoundError:
        return False


class StreamFile:
    """A destination that is a stream (is_stream), behind PartialFile's calls: written as it goes, nothing to
    commit, cut back or rename."""

    created = True
    size = 0

    def __init__(self, path: str):
        if path == "-":
            raw, name, self.owned = sys.stdout.buffer, "standard output", False
        else:
            try:
                raw, name, self.owned = os.fdopen(os.open(path, os.O_WRONLY | os.O_CLOEXEC), "wb"), path, True
            except OSError as error:
                raise NllbError(f"cannot write {path}: {error.strerror or error}.") from None
        self.stream = NamedStream(raw, name)
        self.closed = False

    def start(self, committed: int = 0) -> None:
        pass

    def sync(self) -> int:
        self.stream.flush()
        return 0

    def finish(self, convert=None) -> None:
        self.sync()
        self.close()

    def close(self) -> None:
        if not self.closed and self.owned:
            close_quietly(self.stream)
        self.closed = True

    discard = close


@dataclass
class JobFiles:
    """A job's destinations: the output and the errors file, each a locked partial file or a stream, and where
    the state goes (None when the output is a stream: nothing can be resumed)."""

    output: PartialFile | StreamFile | None
    errors: PartialFile | StreamFile | None
    state: str | None
    saved: Saved | None  # the interrupted job this one continues; None: it starts afresh
    finished: bool = False  # the job's output is in place: nothing is left to do
    errors_path: str | None = None  # the errors file as the state names it (absolute), when it is a partial file
    replaces: dict | None = None  # file_stamp of the file at OUTPUT when the job opened it, which it may replace
    already: bool = False  # finished by an earlier run of this same job, its output unchanged since

    @property
    def resumable(self) -> bool:
        """Whether a commit is saved for --resume to continue from."""
        if self.state is None:
            return False
        try:
            saved = read_state(self.state)
        except StaleState:
            return False
        return saved is not None and not saved.finished and (saved.position.rows > 0 or saved.done)

    def close(self) -> None:
        for partial in (self.output, self.errors):
            if partial is not None:
                partial.close()

    def discard_uncommitted(self) -> None:
        """After a failure: remove the partial files when no state refers to them (nothing was committed), and
        those this job created and wrote nothing to."""
        resumable = self.resumable
        for partial in (self.output, self.errors):
            if partial is not None and (not resumable or (not partial.closed and partial.created and partial.size == 0)):
                partial.discard()


def open_job_files(output: str, errors: str | None, job: dict, resume: bool, warn: Callable[[str], None]) -> JobFiles:
    """Open the job's destinations (partial files locked) and find where it starts: the interrupted job's state
    with --resume (each partial file cut back to its last commit), else afresh (the old state removed before its
    partial files are emptied). A stale state is reported through `warn` and the job starts afresh."""
    errors_path = os.path.abspath(errors) if errors and not is_stream(errors) else None
    if is_stream(output):
        files = JobFiles(StreamFile(output), None, None, None, errors_path=errors_path)
        state = None
    else:
        state = partial_paths(output)[1]
        saved = None
        if resume:
            try:
                saved = read_state(state)
            except StaleState as error:
                warn(f"Starting afresh: {error}.")
        if saved is not None and saved.finished:
            if saved.job == job and saved.output_file == file_stamp(output):
                clear_leftovers(output, errors_path, state)
                return JobFiles(None, None, state, saved, finished=True, already=True)
            warn(f"Starting afresh: {output} {changed_since(saved, job)}.")
            saved = None
        elif saved is not None:
            check_same_job(saved.job, job)
            saved.job = job
        if saved is not None and saved.done and finish_leftovers(output, saved, state):
            return JobFiles(None, None, state, saved, finished=True)
        files = JobFiles(PartialFile(output), None, state, None, errors_path=errors_path, replaces=file_stamp(output))
    try:
        if errors is not None:
            files.errors = StreamFile(errors) if is_stream(errors) else PartialFile(errors)
        if state is None:
            if files.errors is not None:
                files.errors.start(0)
            return files
        if saved is not None:
            saved = check_saved(files, saved, errors_path, warn)
        if saved is None:
            start_afresh(files, errors_path, job)
        else:
            files.output.start(saved.output_bytes)
            if files.errors is not None:
                files.errors.start(saved.errors_bytes)
            files.saved = saved
    except BaseException:
        files.discard_uncommitted()
        files.close()
        raise
    return files


def clear_leftovers(output: str, errors: str | None, state: str) -> None:
    """Beside a finished job's record, what a later run killed (kill -9) before it saved its first state left:
    its empty partial files and the state's temporary file. Nothing is touched while a job holds OUTPUT's
    partial file, and an errors file's partial only when it is empty and no job holds it (it may be shared)."""
    if not discard_if_empty(output):
        return  # another job is writing OUTPUT: the files beside it are that job's
    remove_name(state + ".tmp")
    if errors is not None:
        discard_if_empty(errors)


def discard_if_empty(path: str) -> bool:
    """Remove `path`'s partial file if it is empty and no job holds it; whether there is none now."""
    if not os.path.lexists(partial_paths(path)[0]):
        return True
    try:
        partial = PartialFile(path)
    except NllbError:
        return False
    if partial.size > 0:
        partial.close()
        return False
    partial.discard()
    return True


def check_saved(files: JobFiles, saved: Saved, errors: str | None, warn: Callable[[str], None]) -> Saved | None:
    """The state, if its partial files still hold what it committed; a refusal if resuming would leave rows
    recorded in another errors file behind."""
    if saved.errors != errors and saved.errors is not None and saved.errors_bytes > 0:
        rows = recorded_rows(partial_paths(saved.errors)[0], saved.errors_bytes)
        raise NllbError(f"cannot resume: the interrupted job recorded {rows} failed row{'s' * (rows != 1)} in "
                        f"{saved.errors}; resume with --errors {saved.errors}, or run without --resume to start over.")
    short = [(partial, committed) for partial, committed in ((files.output, saved.output_bytes),
                                                            (files.errors, saved.errors_bytes if saved.errors else 0))
             if partial is not None and partial.size < committed]
    if short:
        partial, committed = short[0]
        warn(f"Starting afresh: the resume state {files.state} says {committed} bytes of {partial.partial} are "
             f"committed, but it holds {partial.size}.")
        return None
    if saved.errors != errors and saved.errors is not None:
        discard_partial_of(saved.errors)  # it recorded nothing: of no use to anyone
    return saved


def recorded_rows(partial: str, committed: int) -> int:
    try:
        with open(partial, "rb") as stream:
            return stream.read(committed).count(b"\n")
    except OSError:
        return 0


def changed_since(saved: Saved, job: dict) -> str:
    """How a finished job's record differs from this job: why its output is made anew."""
    if saved.job != job:
        return f"was finished by a job that differs in {', '.join(changed_keys(saved.job, job)[:3])}"
    return "has changed since its job finished"


def start_afresh(files: JobFiles, errors: str | None, job: dict) -> None:
    """Replace the old state first, then empty the partial files: a kill in between leaves partial files no state
    refers to, which the next run starts afresh from, never a state whose bytes are gone. Where a file is at
    OUTPUT already, the new state records it at once (nothing committed yet), so that it stays a file this job
    may replace, whenever the job is stopped."""
    try:
        with os.fdopen(os.open(files.state, os.O_RDONLY | NO_FOLLOW), "rb") as stream:
            old_errors = json.load(stream).get("errors")
    except (OSError, ValueError, AttributeError):
        old_errors = None
    if files.replaces is None:
        remove_state(files.state)
    else:
        save_state(files.state, Saved(job, output_file=files.replaces))
    files.output.start(0)
    if files.errors is not None:
        files.errors.start(0)
    if isinstance(old_errors, str) and old_errors != errors:
        discard_partial_of(old_errors)


def discard_partial_of(path: str) -> None:
    """Remove the partial file of an errors file this job does not write, unless another job holds it."""
    if not os.path.lexists(partial_paths(path)[0]):
        return
    try:
        partial = PartialFile(path)
    except NllbError:
        return
    partial.discard()


def finish_leftovers(output: str, saved: Saved, state: str) -> bool:
    """A job killed while it put its finished files in place (its state says done): if the output is already
    in place (its partial file gone), finish what is left, the errors file and the state, and say so."""
    if os.path.lexists(partial_paths(output)[0]) or not os.path.exists(output):
        return False  # the output is not in place yet: the usual path finishes it
    if saved.errors is not None and os.path.lexists(partial_paths(saved.errors)[0]):
        partial = PartialFile(saved.errors)
        if partial.size < saved.errors_bytes:
            partial.close()
            return False
        partial.start(saved.errors_bytes)
        partial.finish()
    save_record(state, saved, output)
    return True


def save_record(state: str, saved: Saved, output: str) -> None:
    """The finished job's record: its state, marked finished, naming the file it wrote."""
    save_state(state, replace(saved, done=True, finished=True, output_file=file_stamp(output)))
