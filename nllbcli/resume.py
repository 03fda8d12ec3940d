"""Output files that survive a killed job, and the state that lets --resume continue it.

A file output is written as `.NAME.nllb-partial` beside it. After each chunk of rows the partial file (and the
errors file's) is fsynced, then `.NAME.nllb-state.json` is replaced atomically (write, fsync, rename) with how far
the input was read, how many bytes of each partial file are committed, and the counters. Whatever happens after
that (a crash, `kill -9`, a full disk) leaves at most uncommitted bytes after the committed ones; `--resume`
cuts them off, seeks the input past the committed rows and goes on. Chunks are the same whether a job runs
straight through or is resumed, and a row's translation does not depend on its batch, so the finished output is
byte-identical. At the end the partial file is renamed onto NAME and the state removed.

A state also records what shapes the output (input identity, formats, fields, languages, decoding options,
model, device); resuming with any of them changed is refused rather than mixing two jobs in one file.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Callable

from .errors import NllbError
from .io import Position, file_mode

STATE_VERSION = 1


def partial_paths(output: str) -> tuple[str, str]:
    """The partial file and the state file of an output path."""
    directory, name = os.path.split(os.path.abspath(output))
    return os.path.join(directory, f".{name}.nllb-partial"), os.path.join(directory, f".{name}.nllb-state.json")


@dataclass
class Saved:
    """What a state file holds."""

    job: dict  # what shapes the output; a resumed job must have the same
    position: Position = field(default_factory=Position)  # where the input continues
    output_bytes: int = 0  # committed bytes of the output's partial file
    errors_bytes: int = 0  # committed bytes of the errors file's partial file
    counters: dict = field(default_factory=dict)  # the summary's counters so far
    done: bool = False  # every row is written; only the renames were left


def load_state(path: str, job: dict) -> Saved | None:
    """The state of an interrupted job, if there is one; an error if it belongs to another job."""
    try:
        with open(path, encoding="utf-8") as stream:
            data = json.load(stream)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise NllbError(f"cannot read the resume state {path}: {error}; run without --resume to start over.") from None
    if data.get("version") != STATE_VERSION:
        raise NllbError(f"{path} was written by another version of nllb; run without --resume to start over.")
    changed = sorted(key for key in set(job) | set(data["job"]) if job.get(key) != data["job"].get(key))
    if changed:
        what = ", ".join(f"{key} (was {data['job'].get(key)!r}, now {job.get(key)!r})" for key in changed[:3])
        raise NllbError(f"cannot resume: the interrupted job differs in {what}; run without --resume to start over.")
    return Saved(job, Position(**data["position"]), data["output_bytes"], data["errors_bytes"], data["counters"], data["done"])


def save_state(path: str, saved: Saved) -> None:
    """Replace the state file atomically: a reader sees the old state or the new one, never a mix."""
    temp = path + ".tmp"
    with open(temp, "w", encoding="utf-8") as stream:
        json.dump({"version": STATE_VERSION, **asdict(saved)}, stream, ensure_ascii=False)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temp, path)
    sync_directory(path)


def remove_state(path: str) -> None:
    for name in (path, path + ".tmp"):
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass
    sync_directory(path)


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


class PartialFile:
    """A file being written as its partial beside it: appended to, committed, renamed into place at the end.

    `committed` None starts it empty; a number cuts it to that many bytes (what the last commit wrote) and
    appends after them. The partial file stays locked while it is open, so two jobs never write one output."""

    def __init__(self, path: str, committed: int | None = None):
        self.path = path
        self.partial = partial_paths(path)[0]
        try:
            fd = os.open(self.partial, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as error:
            raise NllbError(f"cannot write {path}: {error.strerror or error}.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise NllbError(f"another nllb job is writing {path} (its partial file {self.partial} is locked).") from None
        self.stream = os.fdopen(fd, "r+b")
        size = os.fstat(fd).st_size
        if committed is not None and size < committed:
            self.stream.close()
            raise NllbError(f"cannot resume: {self.partial} holds {size} bytes, fewer than the {committed} committed; run without --resume to start over.")
        self.stream.truncate(committed or 0)
        self.stream.seek(committed or 0)
        self.closed = False

    def sync(self) -> int:
        """Make everything written so far durable; returns the committed length."""
        self.stream.flush()
        os.fsync(self.stream.fileno())
        return self.stream.tell()

    def finish(self, convert: Callable[[str, str], None] | None = None) -> None:
        """Put the finished file in place: rename the partial onto it, or have `convert(partial, path)` write it."""
        self.sync()
        if convert is None:
            os.chmod(self.partial, file_mode(self.path))  # the partial file is private (0600); the output should not be
            os.replace(self.partial, self.path)
        else:
            convert(self.partial, self.path)
            os.unlink(self.partial)
        sync_directory(self.path)
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.stream.close()  # closing the descriptor releases the lock
            self.closed = True

    def discard(self) -> None:
        """Remove the partial file (a job that committed nothing leaves nothing behind)."""
        self.close()
        try:
            os.unlink(self.partial)
        except FileNotFoundError:
            pass
