"""--devices with CPU workers: the same bytes as a one-device job (output, errors file, resume), whichever
worker ends a chunk first, a worker killed mid-job, the main process killed or stopped.

Real subprocesses on the tiny test model, as in test_resume.py, with two CPU workers.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import multiprocessing
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import types
from collections import deque
from dataclasses import replace
from pathlib import Path

import pytest
from jobfiles import listing
from test_resume import EXTENSION, ROWS, TINY, command, make_input


from click.testing import CliRunner

from nllbcli.job.chunks import ChunkWorker
from nllbcli.cli import cli
from nllbcli.job.loop import translate_file
from nllbcli.runners.devices import AHEAD, Pool, host_translator, open_pool, parse_devices
from nllbcli.errors import NllbError
from nllbcli.options import BatchOptions, DecodeOptions, Job, usable_cores
from nllbcli.io import Record
from nllbcli.model.translator import load_translator

LONGER = ("--max-length", "30")  # a job of a few seconds, so that a kill lands mid-job
BATCHING = BatchOptions(max_batch_tokens=4096)
GREEDY = DecodeOptions(beam_size=1, max_length=8)
SAMPLE = str(Path(__file__).resolve().parent.parent / "data" / "samples" / "model")


def on_workers(args: list[str], workers: int = 2) -> list[str]:
    """The same command with --devices cpu:N instead of --device cpu."""
    at = args.index("--device")
    return [*args[:at], "--devices", f"cpu:{workers}", *args[at + 2:]]


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as stream:
        return [int(child) for child in stream.read().split()]


def workers_of(pid: int) -> list[int]:
    """The job's worker processes (its children but multiprocessing's resource tracker, which spawn starts)."""
    def command_line(child: int) -> bytes:
        with open(f"/proc/{child}/cmdline", "rb") as stream:
            return stream.read()

    return [child for child in children(pid) if b"resource_tracker" not in command_line(child)]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stream:
            return stream.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(condition, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "waited too long"
        time.sleep(0.01)


def first_commit(process: subprocess.Popen, state: Path) -> None:
    wait_for(lambda: state.exists() or process.poll() is not None)
    assert process.poll() is None, "the job ended before its first commit"


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """Each format's output and errors file from a one-device job."""
    results = {}
    for fmt in EXTENSION:
        directory = tmp_path_factory.mktemp(f"plain-{fmt}")
        source, target = directory / f"in.{EXTENSION[fmt]}", directory / f"out.{EXTENSION[fmt]}"
        make_input(source, fmt)
        done = subprocess.run(command(source, target, *LONGER), cwd=directory, capture_output=True)
        assert done.returncode == (3 if fmt in ("jsonl", "csv") else 0), done.stderr  # their bad rows
        results[fmt] = (target.read_bytes(), (directory / "errors.jsonl").read_bytes())
    return results


@pytest.mark.parametrize("fmt", list(EXTENSION))
def test_two_workers_write_a_one_device_jobs_bytes(tmp_path, plain, fmt):
    source, target = tmp_path / f"in.{EXTENSION[fmt]}", tmp_path / f"out.{EXTENSION[fmt]}"
    make_input(source, fmt)
    done = subprocess.run(on_workers(command(source, target, *LONGER)), cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == (3 if fmt in ("jsonl", "csv") else 0), done.stderr
    assert target.read_bytes() == plain[fmt][0]
    assert (tmp_path / "errors.jsonl").read_bytes() == plain[fmt][1]  # the bad rows of the JSONL and CSV inputs
    assert listing(tmp_path) == sorted(["errors.jsonl", source.name, target.name])


# the nllb command with its main process's tokenizers refusing every text: only a worker may split, tokenize or decode
NO_TOKENIZING = """
import runpy, sys
from nllbcli.model import tokenizer
def refuse(*args, **kwargs):
    raise AssertionError("the main process tokenized")
for kind in (tokenizer.SentencePieceTokenizer, tokenizer.NllbTokenizer, tokenizer.M2M100Tokenizer):
    for name in ("encode", "encode_many", "encode_pieces", "decode", "decode_many"):
        if name in vars(kind):
            setattr(kind, name, refuse)
sys.argv[0] = "nllb"
runpy.run_module("nllbcli.cli", run_name="__main__")
"""


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_the_main_process_leaves_tokenizing_and_decoding_to_the_workers(tmp_path, plain, fmt):
    """With --devices the main process reads, hands out, writes and commits rows; the workers split, tokenize,
    translate, decode and join them, so the main process's share of a row stays small as GPUs are added."""
    source, target = tmp_path / f"in.{EXTENSION[fmt]}", tmp_path / f"out.{EXTENSION[fmt]}"
    make_input(source, fmt)
    args = on_workers(command(source, target, *LONGER))
    assert args[1:3] == ["-m", "nllbcli.cli"]
    done = subprocess.run([sys.executable, "-c", NO_TOKENIZING, *args[3:]], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == (3 if fmt == "jsonl" else 0), done.stderr
    assert target.read_bytes() == plain[fmt][0]
    assert (tmp_path / "errors.jsonl").read_bytes() == plain[fmt][1]


def test_chunks_that_end_out_of_order_are_finished_in_order():
    """A first chunk far longer than the others: a worker ends later chunks before it, and finish() still
    takes them in input order, with each chunk's result that of the one-device translator."""
    translator = load_translator(TINY, "cpu")
    job = Job(src="eng_Latn", tgt="fra_Latn")
    decode = DecodeOptions(beam_size=1, max_length=30)
    texts = [["The quick brown fox jumps over the lazy dog. " * 8] * 12] + [[f"Hi {n}."] for n in range(9)]
    items = [([Record(index=n * 100 + i, text=t, fields={"text": t}) for i, t in enumerate(chunk_texts)], n, None)
             for n, chunk_texts in enumerate(texts)]
    finished, arrived, advanced = [], [], []
    with open_pool(["cpu", "cpu"], TINY, None, 2) as pool:
        receive = pool.receive

        def recording(results, *args):
            receive(results, *args)
            arrived.extend(n for n in results if n not in arrived)

        pool.receive = recording
        pool.translate(iter(items), job, decode, BATCHING, lambda chunk, position, prepared, result:
                       finished.append((position, result)), lambda *done: advanced.append(done), print)
    assert [position for position, _ in finished] == list(range(len(texts)))
    assert arrived != sorted(arrived)  # some chunk ended before one ahead of it
    for (chunk, _, _), (_, result) in zip(items, finished):
        assert result == ChunkWorker(translator, job, decode, BATCHING)(chunk)
    assert sum(rows for rows, _ in advanced) == sum(len(chunk) for chunk, _, _ in items)  # every row, once
    assert sum(tokens for _, tokens in advanced) > 0


def test_a_worker_killed_mid_job_has_its_chunks_redone_by_the_other(tmp_path, plain):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    make_input(source, "jsonl")
    process = subprocess.Popen(on_workers(command(source, target, *LONGER)), cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    first_commit(process, tmp_path / ".out.jsonl.nllb-state.json")
    workers = workers_of(process.pid)
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 3, stderr
    lines = stderr.splitlines()
    assert lines[0].startswith("nllb: the worker on cpu was killed by SIGKILL; its ")
    assert lines[0].endswith(" chunk(s) go to the 1 left.")
    assert lines[1].startswith("Done: 900 rows into out.jsonl") and len(lines) == 2
    assert " on 2 CPU workers: " in lines[1]
    assert target.read_bytes() == plain["jsonl"][0]
    assert (tmp_path / "errors.jsonl").read_bytes() == plain["jsonl"][1]


def test_every_worker_killed_stops_the_job_resumable(tmp_path, plain):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    make_input(source, "jsonl")
    state = tmp_path / ".out.jsonl.nllb-state.json"
    process = subprocess.Popen(on_workers(command(source, target, *LONGER)), cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    first_commit(process, state)
    for worker in workers_of(process.pid):
        os.kill(worker, signal.SIGKILL)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1
    last = stderr.splitlines()[-1]
    assert last.endswith("and it was the last one: the rows committed so far are saved; run the same command with "
                         "--resume to continue.")
    assert "Traceback" not in stderr and len(stderr.splitlines()) <= 2
    assert 0 < json.loads(state.read_text())["position"]["rows"] < ROWS
    done = subprocess.run(on_workers(command(source, target, *LONGER, "--resume")), cwd=tmp_path, capture_output=True)
    assert done.returncode == 3
    assert target.read_bytes() == plain["jsonl"][0]
    assert (tmp_path / "errors.jsonl").read_bytes() == plain["jsonl"][1]


@pytest.mark.parametrize("resume_on", ["workers", "one device"])
def test_the_main_process_killed_leaves_no_worker_and_resume_gives_identical_bytes(tmp_path, plain, resume_on):
    source, target = tmp_path / "in.parquet", tmp_path / "out.parquet"
    make_input(source, "parquet")
    state = tmp_path / ".out.parquet.nllb-state.json"
    process = subprocess.Popen(on_workers(command(source, target, *LONGER)), cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    first_commit(process, state)
    workers = children(process.pid)
    process.kill()
    process.wait()
    wait_for(lambda: not any(alive(worker) for worker in workers), 10)  # none outlives the main process
    assert 0 < json.loads(state.read_text())["position"]["rows"] < ROWS
    again = command(source, target, *LONGER, "--resume")
    done = subprocess.run(on_workers(again) if resume_on == "workers" else again, cwd=tmp_path, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == plain["parquet"][0]


def test_ctrl_c_stops_main_and_workers_without_a_traceback_and_resume_finishes(tmp_path, plain):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    make_input(source, "jsonl")
    state = tmp_path / ".out.jsonl.nllb-state.json"
    process = subprocess.Popen(on_workers(command(source, target, *LONGER)), cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    first_commit(process, state)
    workers = children(process.pid)
    os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the whole process group
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert stderr == "Stopped by SIGINT: the rows done so far are saved; run the same command with --resume to continue.\n"
    wait_for(lambda: not any(alive(worker) for worker in workers), 10)
    done = subprocess.run(on_workers(command(source, target, *LONGER, "--resume")), cwd=tmp_path, capture_output=True)
    assert done.returncode == 3
    assert target.read_bytes() == plain["jsonl"][0]
    assert (tmp_path / "errors.jsonl").read_bytes() == plain["jsonl"][1]


def test_stdin_through_workers_gives_a_one_device_jobs_stdout(tmp_path, plain):
    source = tmp_path / "in.txt"
    make_input(source, "text")
    args = [sys.executable, "-m", "nllbcli.cli", "translate", "--src", "en", "--tgt", "fra_Latn", "--model", TINY,
            "--devices", "cpu:2", "--beam-size", "1", *LONGER, "--chunk-rows", "40", "--progress", "none"]
    with source.open("rb") as stdin:
        done = subprocess.run(args, stdin=stdin, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == plain["text"][0]


CORES = usable_cores()


@pytest.mark.parametrize("extra,message", [
    (["--devices", "cpu:0"], "Error: --devices cpu:0: cpu:N needs a number of CPU workers, at least 1 (cpu:2).\n"),
    (["--devices", "cpu:\u00b2"], "Error: --devices cpu:\u00b2: cpu:N needs a number of CPU workers, at least 1 (cpu:2).\n"),
    *[(["--devices", f"cpu:{count}"], f"Error: --devices cpu:{count}: at most {CORES} CPU worker(s), one a core this "
                                      f"process may run on (cpu:{CORES}).\n")
      for count in (CORES + 1, 100_000, 99999999999999999999)],
    (["--devices", "0,x"], "Error: --devices 0,x: name GPUs by number (0,1,3), all, or cpu:N for N CPU workers.\n"),
    (["--devices", "0,\u00b2"], "Error: --devices 0,\u00b2: name GPUs by number (0,1,3), all, or cpu:N for N CPU workers.\n"),
    (["--devices", "cpu:2", "--device", "cpu"], "Error: --device and --devices cannot be used together: --devices "
                                                "names every device.\n"),
])
def test_bad_devices_are_one_line_and_exit_2(tmp_path, extra, message):
    bad_devices(tmp_path, extra, message)


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
@pytest.mark.parametrize("devices", ["0,1", "all"])
def test_gpu_devices_without_cupy_say_what_to_install(tmp_path, devices):
    bad_devices(tmp_path, ["--devices", devices], f"Error: --devices {devices} needs CuPy, which is not installed: pip "
                "install cupy-cuda13x (CUDA 13 drivers) or cupy-cuda12x (CUDA 12)\n")


def bad_devices(tmp_path, extra, message):
    (tmp_path / "in.txt").write_text("Hello.\n")
    done = subprocess.run([sys.executable, "-m", "nllbcli.cli", "translate", "--src", "en", "--tgt", "fr", "--model",
                           TINY, *extra, "in.txt", "out.txt"], cwd=tmp_path, capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (2, message)
    assert listing(tmp_path) == ["in.txt"]


def test_a_bad_row_under_on_error_fail_leaves_a_one_device_jobs_commit(tmp_path):
    """The reader's error on a chunk is raised in that chunk's turn: the chunks before it are committed first,
    so the partial output and the state are those of a one-device job."""
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    make_input(source, "jsonl")
    args = command(source, target, *LONGER)
    at = args.index("--on-error")
    args[at:at + 4] = ["--on-error", "fail"]
    left = {}
    for name, workers in (("plain", False), ("workers", True)):
        done = subprocess.run(on_workers(args) if workers else args, cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 1
        assert done.stderr.startswith("Error: in.jsonl:78: ") and len(done.stderr.splitlines()) == 1
        state = json.loads((tmp_path / ".out.jsonl.nllb-state.json").read_text())
        del state["counters"]["seconds"]  # the time the job took
        assert state["position"]["rows"] == 40
        left[name] = (state, listing(tmp_path), (tmp_path / ".out.jsonl.nllb-partial").read_bytes())
        for path in tmp_path.iterdir():
            if path != source:
                path.unlink()
    assert left["workers"] == left["plain"]


@pytest.mark.parametrize("keep", [200, 4000])
def test_an_input_that_cannot_be_read_is_a_one_device_jobs_error_not_a_hang(tmp_path, keep):
    """A compressed input cut short: the reader's error comes with no chunk (200 bytes: the first chunk), or some
    chunks, in the workers; it is the one-device job's one line and exit code, once the chunks before it are done."""
    source = tmp_path / "in.jsonl"
    make_input(source, "jsonl")
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(source.read_bytes())[:keep])
    results = []
    for name, workers in (("plain", False), ("workers", True)):
        args = command(cut, tmp_path / f"{name}.jsonl", *LONGER)
        done = subprocess.run(on_workers(args) if workers else args, cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
        results.append((done.returncode, done.stderr))
    assert results[0] == results[1]
    assert results[0][0] == 1 and results[0][1].startswith("Error: cannot read cut.jsonl.gz: ")


def test_a_workers_rows_reach_the_progress_as_its_batches_end():
    """A chunk's rows are counted as a worker's batches end, not all at once with the chunk's result: the bar of a
    --devices job moves while a chunk runs."""
    job = Job(src="eng_Latn", tgt="fra_Latn")
    decode = DecodeOptions(beam_size=1, max_length=30)
    texts = [f"The quick brown fox {n} jumps over the lazy dog." for n in range(100)]
    chunk = [Record(index=n, text=t, fields={"text": t}) for n, t in enumerate(texts)]
    events = []
    with open_pool(["cpu"], TINY, None, 1) as pool:
        pool.translate(iter([(chunk, 0, None)]), job, decode, BatchOptions(max_batch_tokens=16),
                       lambda *finished: events.append("finish"), lambda rows, tokens: events.append(rows), print)
    assert events[-1] == "finish"
    assert sum(events[:-1]) == len(chunk)
    assert len(events) > 2 and events[0] > 0  # rows counted before the chunk ended, in more than one message


def test_a_dead_workers_reported_progress_is_taken_back():
    """The rows and tokens a worker reported for the chunks it dies with are taken off the progress: another
    worker does them again, and they are counted once."""
    def worker(chunks):
        process = types.SimpleNamespace(exitcode=-9, join=lambda timeout=None: None, is_alive=lambda: False)
        return types.SimpleNamespace(device="cpu", process=process, chunks=chunks,
                                     connection=types.SimpleNamespace(close=lambda: None))

    pool, advanced, todo = object.__new__(Pool), [], deque()
    dead, alive = worker([3, 4]), worker([5])
    pool.workers, pool.progressed = [dead, alive], {3: [5, 40], 5: [2, 9]}
    pool.advance = lambda rows, tokens: advanced.append((rows, tokens))
    pool.lose(dead, todo, lambda message: None)
    assert advanced == [(-5, -40)] and list(todo) == [3, 4]
    assert pool.progressed == {5: [2, 9]} and pool.workers == [alive]


def test_a_job_that_ends_on_an_error_leaves_no_result_to_the_next():
    """A job that stops while the workers hold its later chunks (here finish() fails on the first): their
    results, coming in later, are not taken for the next job's chunks."""
    translator = load_translator(TINY, "cpu")
    job = Job(src="eng_Latn", tgt="fra_Latn")
    decode = DecodeOptions(beam_size=1, max_length=30)

    def chunks(texts):
        return [([Record(index=n, text=text, fields={"text": text})], n, None) for n, text in enumerate(texts)]

    def fail(*args):
        raise OSError("the disk is full")

    first, second = chunks([f"Hello {n}." for n in range(6)]), chunks([f"Good night, {n} cats." for n in range(6)])
    finished = []
    with open_pool(["cpu", "cpu"], TINY, None, 2) as pool:
        with pytest.raises(OSError):
            pool.translate(iter(first), job, decode, BATCHING, fail, lambda *done: None, print)
        pool.translate(iter(second), job, decode, BATCHING, lambda chunk, position, prepared, result:
                       finished.append(result), lambda *done: None, print)
    assert finished == [ChunkWorker(translator, job, decode, BATCHING)(chunk) for chunk, _, _ in second]


def test_a_job_after_every_worker_died_is_one_line(tmp_path):
    for name in ("a", "b"):
        make_input(tmp_path / f"{name}.txt", "text")
    args = on_workers(command(tmp_path / "a.txt", tmp_path / "out", *LONGER))
    at = args.index("--on-error")
    del args[at:at + 4]
    args[-2:] = ["-o", "out", "a.txt", "b.txt"]
    process = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first_commit(process, tmp_path / "out" / ".a.txt.nllb-state.json")
    for worker in workers_of(process.pid):
        os.kill(worker, signal.SIGKILL)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1
    lines = stderr.splitlines()
    assert len(lines) <= 3 and "and it was the last one" in lines[-2]  # (after a line for the first, if seen first)
    assert lines[-1] == "Error: no --devices worker is left (they died in an earlier job): nothing can be translated."


def test_workers_that_cannot_load_the_model_are_one_line(tmp_path):
    """The main process reads the config and tokenizer; the weights, which only the workers read, are broken."""
    model = tmp_path / "model"
    model.mkdir()
    for path in Path(TINY).iterdir():
        (model / path.name).write_bytes(path.read_bytes()[:100] if path.suffix == ".safetensors" else path.read_bytes())
    (tmp_path / "in.txt").write_text("Hello.\n")
    done = subprocess.run([sys.executable, "-m", "nllbcli.cli", "translate", "--src", "en", "--tgt", "fr", "--model",
                           str(model), "--devices", "cpu:2", "in.txt", "out.txt"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert done.returncode == 1
    assert done.stderr == (f"Error: the worker on cpu could not load the model: {model}/model.safetensors is not a "
                           "readable safetensors file (header length out of range)\n")


class Answering:
    """A worker's end of the pipe that answers what a worker sends once its model is loaded."""

    def __init__(self, answer):
        self.answer = answer

    def recv(self):
        return self.answer


def test_workers_that_would_compute_differently_are_one_line():
    """--compute-type auto on GPUs of which only some have FP8, for a model stored in FP8: each worker takes what its
    GPU can, and the job, whose bytes must not depend on which worker took a chunk, stops before it starts."""
    from nllbcli.runners.devices import Pool, Worker
    from nllbcli.errors import NllbError

    def loaded(kind: str) -> tuple:
        return "ready", {"model": None, "adapter": None, "compute_type": kind}

    pool = Pool.__new__(Pool)
    pool.workers = [Worker(device, None, Answering(loaded(kind)), [])
                    for device, kind in (("cuda:0", "float8"), ("cuda:1", "bfloat16"), ("cuda:2", "float8"))]
    with pytest.raises(NllbError) as raised:
        pool.ready()
    assert str(raised.value) == ("the devices would compute differently (cuda:0 in float8, cuda:1 in bfloat16, cuda:2 "
                                 "in float8): give --compute-type bfloat16, or only devices with FP8 (Hopper GPUs).")
    pool.workers = [Worker(device, None, Answering(loaded("float8")), []) for device in ("cuda:0", "cuda:1")]
    pool.ready()
    assert pool.compute_type == "float8"  # the job's identity, which --resume compares, says what the workers took


def test_a_job_whose_model_changed_after_the_workers_loaded_it_is_refused(tmp_path):
    """The workers load the model once for every job of the command (-o DIR INPUT...): a job whose identity names
    other files than they loaded (weights written anew meanwhile) stops in one line before any row is written,
    instead of translating with the old weights under the new identity."""
    model = tmp_path / "model"
    shutil.copytree(SAMPLE, model)
    job = Job(src="eng_Latn", tgt="fra_Latn", input=str(tmp_path / "in.txt"), output=str(tmp_path / "out.txt"),
              input_format="text", output_format="text")
    (tmp_path / "in.txt").write_text("Hello.\n")
    with open_pool(["cpu"], str(model), None, 1) as pool:
        host = host_translator(str(model), "cpu")
        host.compute_type = pool.compute_type
        translate_file(host, job, GREEDY, pool=pool)
        assert (tmp_path / "out.txt").read_text().count("\n") == 1
        os.utime(model / "model.safetensors", ns=(1, 1))
        with pytest.raises(NllbError, match=r"^the worker on cpu has another model than the job: model\.safetensors "
                                            r"in .+ changed: its files changed after it loaded them"):
            translate_file(host, replace(job, output=str(tmp_path / "again.txt")), GREEDY, pool=pool)
    assert not (tmp_path / "again.txt").exists()


def test_cpu_workers_name_the_job_as_one_device_does(tmp_path):
    """The identity --devices gives the job (its compute type among it) is the one-device job's."""
    with open_pool(["cpu", "cpu"], TINY, None, 2) as pool:
        assert pool.compute_type == load_translator(TINY, "cpu").compute_type == "bfloat16"


def test_a_quiet_pipes_rows_come_out_as_they_are_translated(tmp_path):
    """A pipe that goes quiet after a row: its translation is written while the pipe stays quiet, before the next
    row comes, with --devices as without (the workers are not kept waiting for chunks the pipe has not given)."""
    args = [sys.executable, "-m", "nllbcli.cli", "translate", "--src", "en", "--tgt", "fra_Latn", "--model", TINY,
            "--beam-size", "1", "--max-length", "8", "--progress", "none"]
    lines = {}
    for name, extra in (("plain", ["--device", "cpu"]), ("workers", ["--devices", "cpu:2"])):
        process = subprocess.Popen([*args, *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
        try:
            process.stdin.write(b"The green bicycle costs forty-five euros.\n")
            process.stdin.flush()
            assert select.select([process.stdout], [], [], 60)[0], f"{name}: no row written while the pipe was quiet"
            first = process.stdout.readline()
            process.stdin.write(b"Anna will find seven blue umbrellas.\n")
            rest, stderr = process.communicate(timeout=60)
        finally:
            process.kill()
        assert process.returncode == 0, stderr
        lines[name] = [first, *rest.splitlines(keepends=True)]
    assert lines["workers"] == lines["plain"] and len(lines["plain"]) == 2


def test_a_regular_file_keeps_two_chunks_a_worker_in_flight(tmp_path, monkeypatch):
    """Chunks go to the workers as they are read, and while the input has more, every worker holds its next."""
    (tmp_path / "in.txt").write_text("".join(f"Hello {n}.\n" for n in range(12)))
    in_flight = []
    receive = Pool.receive

    def recording(pool, *args):
        in_flight.append(sum(len(worker.chunks) for worker in pool.workers))
        receive(pool, *args)

    monkeypatch.setattr(Pool, "receive", recording)
    args = ["translate", "--src", "en", "--tgt", "fr", "--model", TINY, "--beam-size", "1", "--max-length", "8",
            "--chunk-rows", "2", "-q", str(tmp_path / "in.txt")]
    on_workers, plain = (CliRunner().invoke(cli, [*args, *extra]) for extra in (["--devices", "cpu:2"], ["--device", "cpu"]))
    assert on_workers.exit_code == 0, on_workers.output
    assert max(in_flight) == AHEAD * 2
    assert on_workers.output == plain.output


# CuPy on a host of 4 GPUs, counting them as the CUDA runtime does: those CUDA_VISIBLE_DEVICES names (by number or
# UUID), up to the first entry that names none; and a cupyx that says which GPUs its process was given
FAKE_CUPY = '''
import os
from types import SimpleNamespace

UUIDS = ["GPU-0a", "GPU-1b", "GPU-2c", "GPU-3d"]


def count():
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [str(n) for n in range(len(UUIDS))] if value is None else value.split(",") if value else []
    visible = 0
    for entry in entries:
        if entry not in UUIDS and not (entry.isdigit() and int(entry) < len(UUIDS)):
            break
        visible += 1
    if not visible:
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
    return visible


cuda = SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=count))
'''
FAKE_CUPYX = 'import os\nraise ImportError("a fake CuPy, given CUDA_VISIBLE_DEVICES=" + os.environ["CUDA_VISIBLE_DEVICES"])\n'


@pytest.fixture
def fake_cupy(monkeypatch):
    cupy = types.ModuleType("cupy")
    exec(FAKE_CUPY, vars(cupy))
    monkeypatch.setitem(sys.modules, "cupy", cupy)


class Spawned:
    """A worker process that is not started: it notes the CUDA_VISIBLE_DEVICES it would have started with."""

    def __init__(self, started: list, **kwargs):
        self.started = started

    def start(self) -> None:
        self.started.append(os.environ.get("CUDA_VISIBLE_DEVICES"))

    def join(self, timeout=None) -> None:
        pass

    def is_alive(self) -> bool:
        return False


@pytest.mark.parametrize("given,devices,workers", [
    (None, "all", ["0", "1", "2", "3"]),
    ("2,3", "all", ["2", "3"]),
    ("2,3", "1", ["3"]),
    ("3,1,0", "2,0", ["0", "3"]),
    ("2,3,7,1", "all", ["2", "3"]),  # CUDA stops at the entry that names no GPU
    ("GPU-2c,GPU-0a", "all", ["GPU-2c", "GPU-0a"]),
])
def test_gpu_workers_are_given_the_jobs_gpus(monkeypatch, fake_cupy, given, devices, workers):
    """The job's GPU N is the Nth that its CUDA_VISIBLE_DEVICES names (on a shared host, under Slurm), and `all`
    is every one of them: each worker starts with that one GPU as its CUDA_VISIBLE_DEVICES."""
    if given is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", given)
    started = []
    monkeypatch.setattr(multiprocessing.get_context("spawn"), "Process",
                        lambda **kwargs: Spawned(started, **kwargs))
    names = parse_devices(devices)
    Pool(names, TINY, None, None).close()
    assert started == workers
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == given


@pytest.mark.parametrize("given,devices,message", [
    ("2,3", "2", "Error: --devices 2: GPU 2 asked for, but only 2 GPU(s) are visible to CuPy "
                 "(CUDA_VISIBLE_DEVICES=2,3).\n"),
    ("", "all", "Error: --devices all: no GPU is visible to CuPy (CUDA_VISIBLE_DEVICES is empty); cpu:N runs N "
                "workers on the CPU.\n"),
    ("1", "0,99999999999999999999", "Error: --devices 0,99999999999999999999: GPU 99999999999999999999 asked for, "
                                    "but only 1 GPU(s) are visible to CuPy (CUDA_VISIBLE_DEVICES=1).\n"),
])
def test_gpus_the_job_was_not_given_are_one_line_and_exit_2(monkeypatch, fake_cupy, given, devices, message):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", given)
    result = CliRunner().invoke(cli, ["translate", "--src", "en", "--tgt", "fr", "--model", TINY, "--devices", devices],
                                input="Hello.\n")
    assert (result.exit_code, result.output) == (2, message)


def test_a_gpu_worker_process_starts_on_the_jobs_gpu(tmp_path):
    """The whole command, with CuPy faked in the main process and the worker: the job's GPU 1 of 2,3 is GPU 3."""
    (tmp_path / "cupy.py").write_text(FAKE_CUPY)
    (tmp_path / "cupyx.py").write_text(FAKE_CUPYX)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "2,3",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "nllbcli.cli", "translate", "--src", "en", "--tgt", "fr", "--model",
                           TINY, "--devices", "1", "-"], input="Hello.\n", env=env, capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stderr) == (1, "Error: the worker on cuda:1 could not load the model: a fake CuPy, "
                                                 "given CUDA_VISIBLE_DEVICES=3\n")
