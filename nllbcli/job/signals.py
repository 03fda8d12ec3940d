"""SIGINT and SIGTERM stop a job between two safe points: never in the middle of a commit.

The handlers raise `Stopped` where the job is, unless it is inside `critical()` (writing a chunk and its state,
or renaming the finished output); there the signal waits for the section to end. Whatever `Stopped` interrupts
is work that was not committed yet, which --resume does again, exactly as after `kill -9`. A second stop signal
while the job stops ends the process at once, as `kill -9` would. Once the job's output is in place
(`job_finished()`), a stop signal has nothing left to stop: the job ends as finished, with its summary and exit
code, not as a stopped one that --resume would do again.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """A stop signal arrived. A BaseException, as KeyboardInterrupt, so that no `except Exception` swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum  # 130 for SIGINT, 143 for SIGTERM, as shells report them


_shielded = 0  # depth of critical() sections (of every thread: the pipeline commits on its finisher thread)
_pending: int | None = None  # a signal that arrived inside one
_finished = False  # the job's output is in place: stop signals are ignored until the command exits
_stopping = False  # a stop signal was acted on (or waits for a critical section): the job is stopping
_active = False  # inside stop_on_signals: the handlers are the job's
_lock = threading.Lock()


def _handle(signum, frame) -> None:
    global _pending, _stopping
    if _finished:
        return
    if _stopping:
        exit_at_once(signum)
    _stopping = True
    if _shielded:
        _pending = signum
        return
    raise Stopped(signum)


def exit_at_once(signum: int) -> None:
    """A second stop signal while the job stops (it may wait on a write that does not end, to a FIFO nobody reads):
    end the process now, as kill -9 would. Every commit is whole, so --resume continues from the last one."""
    name = signal.Signals(signum).name
    try:
        os.write(2, f"Stopped by {name} again: exiting at once; the last commit is kept for --resume.\n".encode())
    except OSError:
        pass
    os._exit(128 + signum)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into `Stopped` for the duration of the block (main thread only)."""
    global _pending, _finished, _stopping, _active
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _pending, _finished, _stopping, _active = None, False, False, True
    previous = {s: signal.signal(s, _handle) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        _active = False
        for s, handler in previous.items():
            signal.signal(s, handler)


def reclaim_signals() -> None:
    """Make SIGINT and SIGTERM the job's again, inside stop_on_signals, after a library set handlers of its own
    (ray.init sets one for SIGTERM that exits with 15, and Ray's core worker a native one that prints a stack dump)."""
    if _active and threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            signal.signal(s, _handle)


def act_on_signal(signum: int) -> None:
    """A stop signal that a library's own handler took (ray.init's, while it starts Ray) acted on as the job's
    handler acts on it, inside stop_on_signals; outside, nothing is done."""
    if _active:
        _handle(signum, None)


@contextmanager
def critical() -> Iterator[None]:
    """A section no stop signal interrupts; one that arrived meanwhile stops the job when it ends."""
    global _shielded, _pending
    with _lock:
        _shielded += 1
    try:
        yield
    finally:
        with _lock:
            _shielded -= 1
            signum = _pending if not _shielded and not _finished else None
            if signum is not None:
                _pending = None
    if signum is not None:
        raise Stopped(signum)


def job_finished() -> None:
    """The job's output is in place: a stop signal from now on (or one waiting for a critical section to end)
    is ignored."""
    global _finished, _pending
    with _lock:
        _finished, _pending = True, None
