"""The threads that keep the GPU busy while the host works: the next chunk is read, split, tokenized and cut
into batches on a reader thread (ChunkReader) while the model translates the chunk before; each batch's ids are
decoded, and each chunk joined, written and committed, on a finisher thread (Finisher) behind the model, in
order, while the main thread drives the GPU on the next batches. With each decoder step one CUDA graph launch,
the main thread needs little of the GIL, so the threads' Python costs the GPU little (docs/PERFORMANCE.md, Host
side). None of this changes what is written, or when a commit is saved.
"""

from __future__ import annotations

import gc
import queue
import sys
import threading
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Iterable, Iterator

from ..environment import ENV
from ..io import Input, Position, Record
from ..options import BatchOptions
from .signals import critical

IDLE = 0.3  # seconds without a new line from a pipe or terminal that end a chunk
# seconds: how long the GIL may stay with one thread while another waits for it (NLLB_SWITCH_INTERVAL: measuring)
SWITCH_INTERVAL = ENV.switch_interval
GC_THRESHOLD = (50_000, 20, 100)  # the cyclic collector's, while a job runs (Python's own: 700, 10, 10)
FIRST_CHUNK_PART = 4  # the first chunk is this much smaller: the GPU waited ~0.6 s for a first chunk of 8,192 rows
FINISHER = ENV.finisher  # NLLB_FINISHER=0: decode, write and commit on the main thread (Inline)


def first_chunk_rows(translator, batching: BatchOptions) -> int | None:
    """On a GPU a smaller first chunk, tokenized sooner, so the GPU starts sooner (None: as the others)."""
    if not translator.device.startswith("cuda"):
        return None
    return max(1, batching.read_chunk_rows // FIRST_CHUNK_PART)


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


@contextmanager
def fewer_collections():
    """A job's objects (each chunk's rows, sentences and ids) set off Python's cyclic collector every few
    hundred allocations, and a full collection walks everything alive holding the GIL for milliseconds, while
    the thread driving the GPU waits for it (the reader's tokenizing made it wait up to ~10 ms, ~4 without the
    collector, on the CPU machine). While the job runs: what was alive before it frozen out of the collector's
    walks (gc.freeze: the modules, the tokenizer, the model's objects), and collections rarer. NLLB_GC=python
    keeps Python's settings (for measuring)."""
    if ENV.python_gc:
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

    def quiet(self) -> bool:
        """Whether taking the next chunk would wait on the input: a pipe or terminal, read on the caller's thread,
        whose next row has not come (what has come meanwhile is read)."""
        return not self.ahead and self.source.arrived is not None and not self.source.arrived(0)

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
