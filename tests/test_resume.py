"""Jobs killed at random points (kill -9, SIGTERM, SIGINT) and resumed give byte-identical output.

Real subprocesses on the tiny test model on the CPU, many rows, small chunks, so that a kill lands anywhere:
while reading, translating, writing a chunk, committing the state, or renaming the finished files.
"""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from jobfiles import listing

TINY = str(Path(__file__).parent / "models" / "tiny-a")
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello! We will meet at the station at seven.",
    "",
    "Combien de personnes vivent dans cette ville ? Plus de deux millions.",
    "我们晚上七点在车站见面。这个城市有多少人？",
    "   ",
    "Wie viele Menschen leben in dieser Stadt?",
]
ROWS = 900
EXTENSION = {"text": "txt", "jsonl": "jsonl", "parquet": "parquet", "csv": "csv"}
FAILING = ("jsonl", "csv")  # the formats whose input has bad rows (exit 3)


def make_input(path: Path, fmt: str) -> None:
    texts = [f"{SENTENCES[i % len(SENTENCES)]} {i}" if i % 5 else SENTENCES[i % len(SENTENCES)] for i in range(ROWS)]
    if fmt == "text":
        path.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    elif fmt == "jsonl":
        lines = [json.dumps({"id": i, "text": t, **({"tgt_lang": "de"} if i % 3 == 0 else {})}, ensure_ascii=False) for i, t in enumerate(texts)]
        lines[77] = '{"id": 77, "text": 5}'  # bad rows, recorded in the errors file
        lines[401] = "not json"
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    elif fmt == "csv":  # quoted line breaks, commas and quotes; an empty tgt_lang is --tgt's; bad rows recorded
        rows = [[i, f'{t}\n"{i}", ok' if i % 11 == 0 else t, "de" if i % 3 == 0 else ""] for i, t in enumerate(texts)]
        rows[77] = [77, "ragged"]
        with open(path, "w", encoding="utf-8", newline="") as stream:
            csv.writer(stream).writerows([["id", "text", "tgt_lang"], *rows])
    else:
        pq.write_table(pa.table({"id": list(range(ROWS)), "text": texts}), path, row_group_size=128)


def command(source: Path, target: Path, *extra: str) -> list[str]:
    """The job, run in the files' directory; with --scores where the output holds them, so their bits count too."""
    scores = ["--scores"] if target.suffix in (".jsonl", ".parquet", ".csv") else []
    return [sys.executable, "-m", "nllbcli.cli", "translate", "--src", "en", "--tgt", "fra_Latn", "--model", TINY,
            "--device", "cpu", "--beam-size", "1", "--max-length", "6", "--chunk-rows", "40", "--progress", "none",
            "--on-error", "record", "--errors", "errors.jsonl", *scores, *extra, source.name, target.name]


def stamp(path: Path | None):
    try:
        return path.stat().st_mtime_ns if path else None
    except FileNotFoundError:
        return None


def run(args: list[str], kill_after: float | None = None, sig: int = signal.SIGKILL, cwd: Path | None = None,
        after_commit: Path | None = None) -> int:
    """Run a job; kill it kill_after seconds after its start, or, given a state file, after its next commit
    (so that the kill lands mid-job however fast or slow this machine is today)."""
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd)
    if after_commit is not None:
        before = stamp(after_commit)
        deadline = time.monotonic() + 60
        while process.poll() is None and stamp(after_commit) == before and time.monotonic() < deadline:
            time.sleep(0.01)
    if kill_after is not None:
        try:
            process.wait(kill_after)
        except subprocess.TimeoutExpired:
            process.send_signal(sig)
    process.wait(120)
    process.stderr.close()
    return process.returncode


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Each format's output and errors file from one uninterrupted run, and how long it took."""
    results = {}
    for fmt in EXTENSION:
        directory = tmp_path_factory.mktemp(f"straight-{fmt}")
        source, target = directory / f"in.{EXTENSION[fmt]}", directory / f"out.{EXTENSION[fmt]}"
        make_input(source, fmt)
        start = time.monotonic()
        code = run(command(source, target), cwd=directory)
        assert code == (3 if fmt in FAILING else 0)
        results[fmt] = (target.read_bytes(), (directory / "errors.jsonl").read_bytes(), time.monotonic() - start)
        assert listing(directory) == sorted(["errors.jsonl", source.name, target.name])
    return results


@pytest.mark.parametrize("fmt", list(EXTENSION))
def test_kill_9_at_random_points_then_resume_gives_identical_bytes(tmp_path, straight, fmt):
    expected, expected_errors, seconds = straight[fmt]
    source, target = tmp_path / f"in.{EXTENSION[fmt]}", tmp_path / f"out.{EXTENSION[fmt]}"
    make_input(source, fmt)
    rng = random.Random(f"kill-{fmt}")
    kills = 0
    committed = []  # rows committed when each kill landed
    state = tmp_path / f".{target.name}.nllb-state.json"
    # the first kill at a random time, maybe before the first commit; the others a random while after a commit
    code = run(command(source, target), kill_after=rng.uniform(0.2, 0.6 * seconds), cwd=tmp_path)
    finished = False  # whether the last run found the job finished (a kill after its record: it does nothing)
    for attempt in range(4):  # killed again while resuming, at other points
        if code != -signal.SIGKILL:
            break
        kills += 1  # (a kill may also land after the final rename and the record: resuming then does nothing)
        saved = json.loads(state.read_text()) if state.exists() else {}
        committed.append(saved["position"]["rows"] if saved else 0)
        finished = saved.get("finished", False)
        code = run(command(source, target, "--resume"), kill_after=rng.uniform(0.0, seconds / 4), cwd=tmp_path,
                   after_commit=state)
    if code == -signal.SIGKILL:
        finished = json.loads(state.read_text()).get("finished", False)
        code = run(command(source, target, "--resume"), cwd=tmp_path)
    assert kills >= 1 and any(0 < rows < ROWS for rows in committed), committed  # some kill landed mid-job
    assert code == (3 if fmt in FAILING and not finished else 0)
    assert target.read_bytes() == expected
    assert (tmp_path / "errors.jsonl").read_bytes() == expected_errors
    assert listing(tmp_path) == sorted(["errors.jsonl", source.name, target.name])


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_stop_signal_saves_the_state_and_resume_finishes(tmp_path, straight, sig, code):
    expected, expected_errors, seconds = straight["jsonl"]
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    make_input(source, "jsonl")
    process = subprocess.Popen(command(source, target), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    state = tmp_path / ".out.jsonl.nllb-state.json"
    deadline = time.monotonic() + 60
    while not state.exists() and time.monotonic() < deadline:  # stop it once it has committed something
        time.sleep(0.02)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code
    assert stderr == f"Stopped by {signal.Signals(sig).name}: the rows done so far are saved; run the same command with --resume to continue.\n"
    assert not target.exists() and state.exists()
    rows = json.loads(state.read_text())["position"]["rows"]
    assert 0 < rows < ROWS and rows % 40 == 0
    assert run(command(source, target, "--resume"), cwd=tmp_path) == 3
    assert target.read_bytes() == expected
    assert (tmp_path / "errors.jsonl").read_bytes() == expected_errors


def test_resume_refuses_another_job(tmp_path):
    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    make_input(source, "text")
    args = command(source, target)
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    state = tmp_path / ".out.txt.nllb-state.json"
    while not state.exists() and process.poll() is None:
        time.sleep(0.02)
    process.kill()
    process.wait()
    changed = [a if a != "6" else "7" for a in command(source, target, "--resume")]  # --max-length 7
    result = subprocess.run(changed, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("Error: cannot resume: the interrupted job differs in decode (was {")
    assert result.stderr.count("\n") == 1
    result = subprocess.run(command(source, target, "--resume", "--max-input-length", "5"), capture_output=True,
                            text=True, cwd=tmp_path)
    assert result.returncode == 1 and "differs in max_input_length" in result.stderr
    with source.open("a") as stream:
        stream.write("one more row\n")
    result = subprocess.run(command(source, target, "--resume"), capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 1 and "differs in input" in result.stderr


@pytest.mark.parametrize("fmt", ["txt", "parquet"])
def test_a_job_killed_after_its_output_is_in_place_resumes_to_the_same_files(fake, tmp_path, monkeypatch, fmt):
    """The last window: the output renamed into place, the errors file and the state not yet done."""
    from click.testing import CliRunner

    import nllbcli.job.loop as loop
    from nllbcli.cli import cli

    monkeypatch.chdir(tmp_path)
    if fmt == "txt":
        Path("in.txt").write_text("ab\ncd\n")
    else:
        pq.write_table(pa.table({"text": ["ab", "cd"]}), "in.parquet")
    args = ["translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn", "--errors", "errors.jsonl", f"in.{fmt}", f"out.{fmt}"]

    def killed(state, saved, output):
        raise KeyboardInterrupt  # stands for kill -9 between putting the output in place and recording it

    with monkeypatch.context() as patch:
        patch.setattr(loop, "save_record", killed)
        assert CliRunner().invoke(cli, args).exit_code == 130
    finished = Path(f"out.{fmt}").read_bytes()
    assert Path(f".out.{fmt}.nllb-state.json").exists() and not Path(f".out.{fmt}.nllb-partial").exists()
    result = CliRunner().invoke(cli, args + ["--resume"])
    assert result.exit_code == 0, result.output
    assert Path(f"out.{fmt}").read_bytes() == finished
    assert listing(".") == sorted(["errors.jsonl", f"in.{fmt}", f"out.{fmt}"])


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_kill_chains_of_fresh_runs_and_resumes_never_block_resume(tmp_path, straight, fmt):
    """Runs with and without --resume, each killed (kill -9, SIGTERM, SIGINT) after a commit, or just as it
    empties the partial file to start afresh, or at a random time; then one --resume to the end: byte-identical
    output, nothing left behind. A fresh run that emptied the partial file before it removed the old state left
    a state that failed every later --resume ("holds 0 bytes, fewer than the N committed")."""
    expected, expected_errors, seconds = straight[fmt]
    source, target = tmp_path / f"in.{EXTENSION[fmt]}", tmp_path / f"out.{EXTENSION[fmt]}"
    make_input(source, fmt)
    state, partial = tmp_path / f".{target.name}.nllb-state.json", tmp_path / f".{target.name}.nllb-partial"
    rng = random.Random(f"chain-{fmt}")
    chain = [(False, state, signal.SIGKILL), (False, partial, signal.SIGTERM), (True, state, signal.SIGKILL),
             (False, partial, signal.SIGKILL), (True, partial, signal.SIGINT), (False, None, signal.SIGTERM),
             (True, state, signal.SIGTERM), (False, partial, signal.SIGINT)]
    for resume, watch, sig in chain:
        args = command(source, target, *(["--resume"] if resume else []))
        if watch is None:
            run(args, kill_after=rng.uniform(0.2, seconds), sig=sig, cwd=tmp_path)
        else:  # killed at the next change of the watched file: a commit, or the partial file emptied
            run(args, kill_after=0.0, sig=sig, cwd=tmp_path, after_commit=watch)
    # 3 for the JSONL input's bad rows; 0 where a run of the chain finished before its signal landed (a loaded
    # machine), the last --resume then finding the job done ("Already finished")
    assert run(command(source, target, "--resume"), cwd=tmp_path) in ((3, 0) if fmt == "jsonl" else (0,))
    assert target.read_bytes() == expected
    assert (tmp_path / "errors.jsonl").read_bytes() == expected_errors
    assert listing(tmp_path) == sorted(["errors.jsonl", source.name, target.name])


def test_a_second_stop_signal_ends_a_stop_that_cannot_finish(tmp_path):
    """The first SIGTERM stops the job at its next safe point, but its last write blocks: the output is a FIFO
    whose reader reads nothing. The second SIGTERM ends the process at once, as kill -9 would."""
    source, fifo = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps({"text": f"Hello {i}.", "pad": "x" * 2000}) + "\n" for i in range(400)))
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # open, never read: the job's writes block once the pipe is full
    try:
        process = subprocess.Popen(command(source, fifo), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        deadline = time.monotonic() + 60
        while not (tmp_path / ".errors.jsonl.nllb-partial").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(3)  # the pipe's 64 KiB fill within the first chunks
        process.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(2)  # stopping: waits for its write
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        os.close(reader)
    assert process.returncode == 143
    assert stderr == "Stopped by SIGTERM again: exiting at once; the last commit is kept for --resume.\n"


def test_no_record_leaves_nothing_beside_the_output(tmp_path):
    """--no-record: the finished job leaves OUTPUT alone beside its input, no hidden state; a --resume then
    translates it again (nothing says it finished), and another job replaces OUTPUT only with --force."""
    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    make_input(source, "text")
    done = subprocess.run(command(source, target, "--no-record"), cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode in (0, 3), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["errors.jsonl", "in.txt", "out.txt"]
    first = target.read_bytes()
    again = subprocess.run(command(source, target, "--resume"), cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 2 and "nllb did not write it" in again.stderr
    forced = subprocess.run(command(source, target, "--resume", "--force"), cwd=tmp_path, capture_output=True, text=True)
    assert forced.returncode in (0, 3) and forced.stderr.startswith("Done: ")  # translated again, not "Already finished"
    assert target.read_bytes() == first
    assert ".out.txt.nllb-state.json" in {p.name for p in tmp_path.iterdir()}  # without --no-record, the record stays
