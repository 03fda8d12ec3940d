"""--devices: one worker process per device, each with the model loaded once, running the chunks' batches.

The main process reads the chunks' rows (job/reader.py's ChunkReader) and hands each chunk, as soon as it is read,
to a worker that is free (two a worker at most, so that a worker has its next chunk when it ends one); while a
pipe is quiet, it writes the chunks that end meanwhile instead of waiting for the pipe's next row. A worker does
the rest of a chunk's work (job/chunks.py's ChunkWorker, as every runner): it splits and tokenizes the rows on one
thread while its model runs another chunk on another, then decodes and joins the translations, and sends back each
row's Outcome; the rows and tokens done go to the main process's progress as each batch ends.
So the main process's share of a row (reading it, handing it over, writing it) stays small as workers are added.
It writes and commits the chunks strictly in input order, so the output, the errors file and the resume state
are those of a one-device job, whatever the number of workers and whichever chunk ends first.

A worker that dies (kill -9, out of memory) is named in one line and its chunks go to the others; when none is
left, the job stops with what was committed saved for --resume. The workers ignore SIGINT (a terminal's Ctrl-C
reaches the whole process group; the main process stops the job) and end when the main process's end of their
pipe closes, so none outlives it, kill -9 included.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Callable, Iterable, Iterator

from ..errors import NllbError
from ..options import BatchOptions, DecodeOptions, Job
from ..job.reader import SWITCH_INTERVAL, ChunkReader, fewer_collections
from ..job.spec import check_worker, loaded_identity

AHEAD = 2  # chunks given to a worker at once: the one it runs, and the next
POLL = 0.05  # seconds between looks at a quiet pipe while chunks are out, their results taken meanwhile
PROGRESS_EVERY = 0.2  # seconds at least between a worker's progress messages within a chunk


def parse_devices(text: str) -> list[str]:
    """The workers' devices from --devices: GPU numbers (0,1,3: the job's GPUs, cuda:0 being the first that an
    inherited CUDA_VISIBLE_DEVICES names), all (every GPU the job may use), or cpu:N (N CPU workers, at most one
    a core this process may run on: more only share the cores and each holds a copy of the model)."""
    from ..options import usable_cores
    from ..model.translator import gpu_count, visible_gpus

    text = text.strip()
    if text.startswith("cpu:"):
        count, cores = text[4:], usable_cores()
        if not re.fullmatch("[0-9]+", count) or int(count) < 1:
            raise NllbError(f"--devices {text}: cpu:N needs a number of CPU workers, at least 1 (cpu:2).")
        if int(count) > cores:
            raise NllbError(f"--devices {text}: at most {cores} CPU worker(s), one a core this process may run on "
                            f"(cpu:{cores}).")
        return ["cpu"] * int(count)
    option = f"--devices {text}"
    if text == "all":
        count = gpu_count(option)
        if not count:
            raise NllbError(f"{option}: {visible_gpus(count)}; cpu:N runs N workers on the CPU.")
        return [f"cuda:{n}" for n in range(count)]
    numbers = text.split(",")
    if not all(re.fullmatch("[0-9]+", n.strip()) for n in numbers):
        raise NllbError(f"{option}: name GPUs by number (0,1,3), all, or cpu:N for N CPU workers.")
    indices = [int(n) for n in numbers]
    named = set()
    for index in indices:
        if index in named:
            raise NllbError(f"{option}: GPU {index} is named twice.")
        named.add(index)
    count = gpu_count(option)
    for index in indices:
        if index >= count:
            raise NllbError(f"{option}: GPU {index} asked for, but {visible_gpus(count)}.")
    return [f"cuda:{index}" for index in indices]


def worker_gpu(device: str) -> str:
    """The CUDA_VISIBLE_DEVICES of the worker on the job's GPU `device` (cuda:N): that GPU as the job's own
    CUDA_VISIBLE_DEVICES names it (its Nth entry), else N."""
    from ..model.translator import inherited_gpus

    index, given = int(device.split(":")[1]), inherited_gpus()
    return str(index) if given is None else given[index]


def host_translator(model: str, device: str, adapter: str | None = None):
    """What the main process needs of the model to prepare chunks and name the job (tokenizer, config, where
    it runs, the adapter): no weights, which only the workers load. `device` is the first worker's, so that the job's
    identity, and with it --resume, is a one-device job's; its compute_type is the workers' (Pool.compute_type)."""
    from ..model.checkpoint import ModelConfig, resolve_model_dir
    from ..model.tokenizer import tokenizer_from_model_dir
    from ..model.translator import Translator

    model_dir = resolve_model_dir(model)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise NllbError(f"{model_dir} has no config.json: it is not a model directory in the Hugging Face layout")
    config = ModelConfig.from_json(config_path)
    return Translator(config, tokenizer_from_model_dir(model_dir, config), None, device, str(model_dir), adapter=adapter)


@dataclass(eq=False)
class Worker:
    """A worker process and the main process's end of its pipe."""

    device: str
    process: multiprocessing.process.BaseProcess
    connection: Connection
    chunks: list[int]  # the numbers of the chunks it was given and has not sent back
    loaded: dict | None = None  # the model it loaded, as a job's identity names it (job.spec.loaded_identity)


@contextmanager
def open_pool(devices: list[str], model: str, adapter: str | None, threads: int | None,
              compute_type: str = "auto", kv_cache_type: str = "bfloat16") -> Iterator["Pool"]:
    """The workers, started and each with its model loaded (a worker that cannot load it is an NllbError);
    every worker ended when the block is left."""
    pool = Pool(devices, model, adapter, threads, compute_type, kv_cache_type)
    try:
        pool.ready()
        yield pool
    finally:
        pool.close()


class Pool:
    """The worker processes of --devices (spawned: CUDA and BLAS do not survive a fork), one per device."""

    def __init__(self, devices: list[str], model: str, adapter: str | None, threads: int | None,
                 compute_type: str = "auto", kv_cache_type: str = "bfloat16"):
        context = multiprocessing.get_context("spawn")
        share = None if threads is None else max(1, threads // len(devices))  # the CPU workers' --threads
        self.workers: list[Worker] = []
        self.taken = 0  # chunks numbered so far, over every job: a result is known by its chunk's number
        self.compute_type = "bfloat16"  # the workers' (ready)
        for device in devices:
            mine, theirs = context.Pipe()
            gpu = None if device == "cpu" else worker_gpu(device)
            process = context.Process(target=work, args=(theirs, "cpu" if gpu is None else "cuda:0", model, adapter,
                                                         share, compute_type, kv_cache_type),
                                      name=f"nllb-worker-{device}", daemon=True)
            with spawning(gpu):
                process.start()
            theirs.close()
            self.workers.append(Worker(device, process, mine, []))

    def ready(self) -> None:
        """Wait for every worker's model to load, and take the compute type they loaded it with (compute_type): the
        same on every worker, or an NllbError, since a job's outputs must not depend on which worker took a chunk
        (--compute-type auto takes float8 for a model stored in FP8 only on a GPU that has FP8)."""
        types = {}
        for worker in self.workers:
            try:
                kind, message = worker.connection.recv()
            except EOFError:
                worker.process.join(timeout=5)
                raise NllbError(f"the worker on {worker.device} ended before its model loaded "
                                f"({ended(worker.process)}).") from None
            if kind != "ready":
                raise NllbError(f"the worker on {worker.device} could not load the model: {message}")
            worker.loaded = message
            types[worker.device] = message["compute_type"]
        if len(set(types.values())) > 1:
            raise NllbError("the devices would compute differently (" + ", ".join(f"{device} in {kind}" for device, kind in types.items())
                            + "): give --compute-type bfloat16, or only devices with FP8 (Hopper GPUs).")
        self.compute_type = next(iter(types.values()), "bfloat16")

    def check(self, identity: dict) -> None:
        """Refuse a job whose identity names another model than every worker loaded (job.spec.check_worker)."""
        for worker in self.workers:
            check_worker(identity, worker.loaded, f"the worker on {worker.device}")

    def close(self) -> None:
        for worker in self.workers:
            worker.connection.close()  # the worker ends as its end of the pipe closes
        for worker in self.workers:
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()

    def translate(self, chunks: Iterable[tuple], job: Job, decode: DecodeOptions, batching: BatchOptions,
                  finish: Callable[..., None], advance: Callable[[int, int], None],
                  warn: Callable[[str], None]) -> None:
        """Every chunk through the workers (`chunks`: a ChunkReader, or its items, each chunk's rows first), and
        `finish(chunk, position, prepared, outcomes)` for each chunk in input order, `outcomes` being its rows'
        (ChunkWorker's); `advance(rows, tokens)` as the workers report them, taken back for the chunks of a worker
        that died. Each chunk goes to a worker as it is read, and is finished as soon as it
        and those before it are done: the next chunk of a quiet pipe is waited for only when none is out. A chunk
        of a worker that died goes to another; with none left, an NllbError. A chunk's error (--on-error fail's
        first bad row, the reader's) is raised in its turn, after the chunks before it are finished. A job that
        ends on an error may leave chunks in the workers: their results come later and are dropped (no chunk of
        another job has their numbers)."""
        if not self.workers:
            raise NllbError("no --devices worker is left (they died in an earlier job): nothing can be translated.")
        quiet = chunks.quiet if isinstance(chunks, ChunkReader) else lambda: False
        chunks = iter(chunks)
        task = (job, decode, batching)
        self.advance = advance
        self.progressed: dict[int, list[int]] = {}  # the rows and tokens each chunk out has reported
        waiting: dict[int, tuple] = {}  # taken from `chunks` and not finished yet
        results: dict[int, tuple | BaseException] = {}
        todo: deque[int] = deque()  # chunks for the next free worker, a dead worker's first
        next_finish, exhausted = self.taken, False
        try:
            while True:
                while next_finish in results:
                    result = results.pop(next_finish)
                    if isinstance(result, BaseException):  # in its chunk's turn, as a one-device job raises it
                        raise result
                    self.progressed.pop(next_finish, None)
                    finish(*waiting.pop(next_finish), result)
                    next_finish += 1
                paused = False  # the input is quiet while chunks are out: look at it again after POLL seconds
                while not exhausted and len(waiting) < AHEAD * len(self.workers):
                    number = self.taken
                    try:
                        if waiting and quiet():
                            paused = True
                            break
                        item = next(chunks, None)
                    except Exception as error:  # noqa: BLE001 - the reader's, raised after the chunks before it
                        waiting[number], results[number], exhausted = None, error, True
                        self.taken += 1
                        continue
                    if item is None:
                        exhausted = True
                        continue
                    waiting[number] = item
                    todo.append(number)
                    self.taken += 1
                    self.hand_out(todo, waiting, task)
                if exhausted and not waiting:
                    return
                self.hand_out(todo, waiting, task)
                if next_finish not in results:  # (the reader's error, with no chunk out, is raised at once)
                    self.receive(results, todo, warn, POLL if paused else None)
        finally:
            for worker in self.workers:
                worker.chunks.clear()

    def hand_out(self, todo: deque[int], waiting: dict[int, tuple], task: tuple) -> None:
        while todo:
            worker = min(self.workers, key=lambda w: len(w.chunks))
            if len(worker.chunks) >= AHEAD:
                return
            number = todo.popleft()
            worker.chunks.append(number)
            try:
                worker.connection.send((number, waiting[number][0], *task))
            except OSError:  # it died: receive() hands its chunks out again
                pass

    def receive(self, results: dict[int, list], todo: deque[int], warn: Callable[[str], None],
                timeout: float | None = None) -> None:
        """Wait for a worker's chunk (or its death), at most `timeout` seconds (None: as long as it takes)."""
        by_handle = {w.connection: w for w in self.workers} | {w.process.sentinel: w for w in self.workers}
        for handle in wait(list(by_handle), timeout):
            worker = by_handle[handle]
            if worker not in self.workers:
                continue
            try:
                if handle is not worker.connection:
                    raise EOFError
                kind, number, *value = worker.connection.recv()
            except (EOFError, OSError):
                self.lose(worker, todo, warn)
                continue
            if number not in worker.chunks:  # a chunk of a job that ended on an error
                continue
            if kind == "advance":  # rows and tokens done within the chunk
                done = self.progressed.setdefault(number, [0, 0])
                done[0], done[1] = done[0] + value[0], done[1] + value[1]
                self.advance(*value)
            else:  # the chunk's Outcomes, or the error that stopped it
                worker.chunks.remove(number)
                results[number] = value[0]

    def lose(self, worker: Worker, todo: deque[int], warn: Callable[[str], None]) -> None:
        worker.process.join(timeout=5)
        if worker.process.is_alive():  # its pipe broke, and it lives on: of no use now
            worker.process.kill()
            worker.process.join()
        self.workers.remove(worker)
        worker.connection.close()
        redone = sorted(worker.chunks)
        for number in redone:  # counted again as another worker does them
            if number in self.progressed:
                rows, tokens = self.progressed.pop(number)
                self.advance(-rows, -tokens)
        if not self.workers:
            raise NllbError(f"the worker on {worker.device} {ended(worker.process)}, and it was the last one: the "
                            "rows committed so far are saved; run the same command with --resume to continue.")
        warn(f"nllb: the worker on {worker.device} {ended(worker.process)}; its {len(redone)} chunk(s) go to the "
             f"{len(self.workers)} left.")
        todo.extendleft(reversed(redone))


def ended(process) -> str:
    """How a worker process ended, in words."""
    code = process.exitcode
    if code is not None and code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


@contextmanager
def spawning(gpu: str | None) -> Iterator[None]:
    """While a worker starts: CUDA_VISIBLE_DEVICES its GPU (the child's environment is the parent's as it starts,
    so it holds before anything there imports CuPy), and SIGINT ignored, which the child keeps (Python then
    never turns a Ctrl-C there into a KeyboardInterrupt); a SIGINT meanwhile waits, blocked, for the parent's
    handler."""
    previous = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    main = threading.current_thread() is threading.main_thread()
    if main:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        if gpu is not None:
            if previous is None:
                del os.environ["CUDA_VISIBLE_DEVICES"]
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = previous
        if main:
            signal.signal(signal.SIGINT, handler)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def work(connection: Connection, device: str, model: str, adapter: str | None, threads: int | None,
         compute_type: str = "auto", kv_cache_type: str = "bfloat16") -> None:
    """A worker: the model loaded once, on the thread that runs it; then each chunk that comes through a
    ChunkWorker on a thread of its own (two at once: one chunk is split and tokenized, or decoded, while the model
    runs the other), its progress and its result (or the error that stopped it) sent back, until the main process
    closes its end of the pipe. This thread only takes the chunks as they come, so the main process never waits
    to hand one over."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from concurrent.futures import ThreadPoolExecutor

    from ..job.chunks import ChunkWorker

    engine = ThreadPoolExecutor(1, thread_name_prefix="nllb-engine")  # every call of the model on one thread
    try:
        from ..model.translator import load_translator

        translator = engine.submit(load_translator, model, device, adapter, compute_type, kv_cache_type).result()
        if threads is not None and device == "cpu":
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=threads, user_api="blas")
    except Exception as error:  # noqa: BLE001 - the main process says it in one line
        loaded = ("error", str(error))
    else:
        loaded = ("ready", loaded_identity(translator))
    try:
        connection.send(loaded)
    except OSError:  # the main process has gone (another worker's error ended it)
        return
    if loaded[0] != "ready":
        return
    # the engine thread waits for the GIL behind the threads preparing and decoding chunks, as a one-device job's
    # main thread does behind its reader and finisher: the same settings as a job's (job/reader.py)
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
    fewer_collections().__enter__()  # for the worker's life
    sending = threading.Lock()

    def send(message: tuple) -> None:
        with sending:
            try:
                connection.send(message)
            except (EOFError, OSError):
                os._exit(0)  # the main process is gone: nothing is left to do
            except Exception as error:  # noqa: BLE001 - an error that does not pickle goes as its words
                connection.send((*message[:2], NllbError(f"{type(error).__name__}: {error}")))

    def run(number: int, records: list, job: Job, decode: DecodeOptions, batching: BatchOptions) -> None:
        progress = Progress(lambda rows, tokens: send(("advance", number, rows, tokens)))
        try:
            result = ChunkWorker(translator, job, decode, batching,
                                 lambda task: engine.submit(task).result())(records, progress.advance)
            progress.flush()
        except Exception as error:  # noqa: BLE001 - raised in the main process, in the chunk's turn
            result = error
        send(("done", number, result))

    chunks = ThreadPoolExecutor(AHEAD, thread_name_prefix="nllb-chunk")
    while True:
        try:
            task = connection.recv()
        except (EOFError, OSError):
            os._exit(0)  # the main process closed its end, or is gone: nothing is left to do
        chunks.submit(run, *task)


class Progress:
    """A chunk's rows and tokens done, sent on (`send(rows, tokens)`) at most every PROGRESS_EVERY seconds, the
    rest by flush: a bar moves as batches end without a message for each."""

    def __init__(self, send: Callable[[int, int], None]):
        self.send, self.rows, self.tokens, self.sent = send, 0, 0, time.monotonic()

    def advance(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens
        if time.monotonic() - self.sent >= PROGRESS_EVERY:
            self.flush()

    def flush(self) -> None:
        if self.rows or self.tokens:
            self.send(self.rows, self.tokens)
        self.rows = self.tokens = 0
        self.sent = time.monotonic()
