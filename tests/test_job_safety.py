"""What a job promises about its files, streams and signals, under hostile conditions: inputs that are streams,
paths that name the input again, links planted where the job writes, states left by killed runs, signals at the
worst moments, closed standard streams and full disks. Each test fails on the cause it names."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from nllbcli.cli import cli
from nllbcli.job.signals import Stopped
from jobfiles import listing

TRANSLATE = ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn"]
TINY = str(Path(__file__).parent / "models" / "tiny-a")
ROWS = [f"row {i}" for i in range(12)]
REVERSED = [text[::-1] for text in ROWS]


def invoke(*args: str):
    return CliRunner().invoke(cli, TRANSLATE + list(args))


def stop_after(fake, calls: int, signum: int = signal.SIGTERM) -> None:
    """Make the fake translator stop the job (as a SIGTERM would) at its `calls`-th batch."""
    generate = type(fake).generate
    count = [0]

    def stopping(sources, tgt_lang, options):
        count[0] += 1
        if count[0] == calls:
            raise Stopped(signum)
        return generate(fake, sources, tgt_lang, options)

    fake.generate = stopping


def translate_normally(fake) -> None:
    fake.generate = type(fake).generate.__get__(fake)


def stopped_job(fake, *first: str, bad_row: bool = False) -> list[str]:
    """A JSONL job (a bad first row with `bad_row`) stopped by SIGTERM after two commits, run with the options
    `first`; returns the arguments that run it again. The fake translates normally from then on."""
    rows = "".join(json.dumps({"text": t}) + "\n" for t in ROWS)
    Path("in.jsonl").write_text(('{"text": 1}\n' if bad_row else "") + rows)
    args = ["-q", "--chunk-rows", "3", "in.jsonl", "out.jsonl"]
    stop_after(fake, 3)
    assert invoke(*first, *args).exit_code == 143
    translate_normally(fake)
    return args


# -- inputs that are streams: read once, never counted first ------------------------------------------------------

def feed(where: str | int, data: bytes) -> threading.Thread:
    """Write `data` into a FIFO (a path) or a pipe (its write end) from a thread, as `cat in.txt > fifo` would."""
    def write():
        with open(where, "wb") as stream:
            stream.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def input_bytes(fmt: str, tmp_path: Path) -> bytes:
    if fmt == "text":
        return "".join(t + "\n" for t in ROWS).encode()
    if fmt == "jsonl":
        return "".join(json.dumps({"text": t}) + "\n" for t in ROWS).encode()
    pq.write_table(pa.table({"text": ROWS}), tmp_path / "source.parquet")
    return (tmp_path / "source.parquet").read_bytes()


def read_texts(path: Path, fmt: str) -> list[str]:
    if fmt == "text":
        return path.read_text().splitlines()
    if fmt == "jsonl":
        return [json.loads(line)["translation"] for line in path.read_text().splitlines()]
    return pq.read_table(path).column("translation").to_pylist()


@pytest.mark.parametrize("progress", ["json", "bar"])
@pytest.mark.parametrize("fmt", ["text", "jsonl", "parquet"])
@pytest.mark.parametrize("kind", ["fifo", "pipe"])
def test_a_stream_input_with_progress_loses_no_row(fake, tmp_path, kind, fmt, progress):
    """Counting the rows for the progress total read a pipe (`<(cat in.txt)`) to its end, or hung on a FIFO."""
    ext = {"text": "txt", "jsonl": "jsonl", "parquet": "parquet"}[fmt]
    data = input_bytes(fmt, tmp_path)
    if kind == "fifo":
        path = str(tmp_path / f"in.{ext}")
        os.mkfifo(path)
        writer = feed(path, data)
    else:  # what the shell's <(cat in.txt) gives
        read_end, write_end = os.pipe()
        path = f"/dev/fd/{read_end}"
        writer = feed(write_end, data)
    target = tmp_path / f"out.{ext}"
    result = invoke("--progress", progress, "--input-format", fmt, "--chunk-rows", "5", path, str(target))
    writer.join(5)
    if kind == "pipe":
        os.close(read_end)
    assert result.exit_code == 0, result.output
    assert read_texts(target, fmt) == REVERSED


# -- paths that name the input ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
@pytest.mark.parametrize("which", ["--errors", "OUTPUT"])
def test_a_job_never_writes_over_its_input(fake, tmp_path, monkeypatch, which, how):
    monkeypatch.chdir(tmp_path)
    content = "".join(json.dumps({"text": t}) + "\n" for t in ROWS) + "oops\n"
    Path("in.jsonl").write_text(content)
    other = "in.jsonl"
    if how == "symlink":
        os.symlink("in.jsonl", "other.jsonl")
        other = "other.jsonl"
    elif how == "hardlink":
        os.link("in.jsonl", "other.jsonl")
        other = "other.jsonl"
    args = ["--errors", other, "in.jsonl", "out.jsonl"] if which == "--errors" else ["in.jsonl", other]
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"Error: {which} {other} is the input file in.jsonl: refusing to write over the input.")
    assert Path("in.jsonl").read_text() == content
    assert not fake.batches


def test_errors_through_a_link_to_output_is_refused(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("in.txt").write_text("ab\n")
    Path("out.txt").write_text("old\n")
    os.symlink("out.txt", "e.jsonl")
    result = invoke("--errors", "e.jsonl", "in.txt", "out.txt")
    assert result.exit_code == 2
    assert result.stderr == "Error: --errors must be another file than OUTPUT.\n"


@pytest.mark.parametrize("errors,code,message", [
    ("-", 2, "--errors needs a file: - is not one (--on-error skip names the failed rows on stderr)."),  # not a file named -
    ("missing/e.jsonl", 1, "cannot write missing/e.jsonl: No such file or directory."),  # the output's partial file stayed
])
def test_a_refused_errors_file_leaves_nothing_behind(fake, tmp_path, monkeypatch, errors, code, message):
    monkeypatch.chdir(tmp_path)
    Path("in.txt").write_text("ab\n")
    result = invoke("--errors", errors, "in.txt", "o_ok.jsonl")
    assert result.exit_code == code
    assert result.stderr == f"Error: {message}\n"
    assert listing(tmp_path) == ["in.txt"]


# -- destinations that are streams or links -----------------------------------------------------------------------

def test_errors_are_recorded_when_the_output_is_stdout(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("in.jsonl").write_text('{"text": "ab"}\n{"text": 1}\n')
    result = invoke("-q", "--errors", "e.jsonl", "in.jsonl", "-")
    assert result.exit_code == 3
    assert result.stdout == '{"text": "ab", "translation": "ba"}\n' and result.stderr == ""
    assert [json.loads(line)["row"] for line in Path("e.jsonl").read_text().splitlines()] == [2]
    assert listing(tmp_path) == ["e.jsonl", "in.jsonl"]


@pytest.mark.skipif(not os.access("/dev/null", os.W_OK), reason="no /dev/null")
def test_a_device_output_is_written_to_not_replaced(fake, tmp_path):
    """A partial file renamed onto /dev/null would have replaced the device with a file."""
    (tmp_path / "in.txt").write_text("ab\n")
    before = os.stat("/dev/null")
    result = invoke("-q", "--errors", "/dev/null", str(tmp_path / "in.txt"), "/dev/null")
    assert result.exit_code == 0, result.output
    after = os.stat("/dev/null")
    assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev) and not os.path.lexists("/dev/.null.nllb-partial")


def fifo_reader(path: str) -> tuple[threading.Thread, list[bytes]]:
    """A FIFO at `path`, and a thread that reads all that is written to it into the list."""
    os.mkfifo(path)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(open(path, "rb").read()), daemon=True)
    reader.start()
    return reader, got


def test_a_fifo_output_gets_the_rows_as_they_come(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("in.txt").write_text("".join(t + "\n" for t in ROWS))
    reader, got = fifo_reader("out.txt")
    result = invoke("-q", "--chunk-rows", "5", "in.txt", "out.txt")
    reader.join(10)
    assert result.exit_code == 0, result.output
    assert got == ["".join(t + "\n" for t in REVERSED).encode()]
    assert listing(tmp_path) == ["in.txt", "out.txt"] and not Path("out.txt").is_file()
    result = invoke("--resume", "in.txt", "out.txt")
    assert result.exit_code == 2
    assert result.stderr == ("Error: --resume needs OUTPUT to be a file: out.txt is a stream (a FIFO or a device), and "
                             "what went to it cannot be taken back.\n")


def test_a_job_stopped_while_writing_to_a_fifo_says_its_rows_are_written(fake, tmp_path, monkeypatch):
    """Not "nothing was written": the rows before the stop went to the stream."""
    monkeypatch.chdir(tmp_path)
    Path("in.txt").write_text("".join(t + "\n" for t in ROWS))
    reader, got = fifo_reader("out.txt")
    stop_after(fake, 3)
    result = invoke("-q", "--chunk-rows", "5", "in.txt", "out.txt")
    reader.join(10)
    assert result.exit_code == 143
    assert result.stderr == "Stopped by SIGTERM: the first 10 rows are done and written.\n"
    assert got == ["".join(t + "\n" for t in REVERSED[:10]).encode()]


def test_a_job_stopped_waiting_for_a_fifo_reader_says_nothing_was_written(fake, tmp_path, monkeypatch):
    """A FIFO nobody opens to read holds the job at its open: a stop there wrote no row."""
    from nllbcli.job import signals

    monkeypatch.chdir(tmp_path)
    Path("in.txt").write_text("".join(t + "\n" for t in ROWS))
    os.mkfifo("out.txt")

    def stop_once_handled() -> None:  # SIGTERM once the job handles it (before, it would end the test run)
        while signal.getsignal(signal.SIGTERM) is not signals._handle:
            time.sleep(0.01)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_once_handled, daemon=True).start()
    result = invoke("-q", "in.txt", "out.txt")
    assert result.exit_code == 143
    assert result.stderr == "Stopped by SIGTERM before any rows were written.\n"


@pytest.mark.parametrize("fmt", ["txt", "parquet"])
def test_a_symlinked_output_is_written_where_it_points(fake, tmp_path, monkeypatch, fmt):
    monkeypatch.chdir(tmp_path)
    Path("in.txt").write_text("".join(t + "\n" for t in ROWS))
    os.mkdir("data")
    os.symlink(f"data/today.{fmt}", f"latest.{fmt}")  # dangling until the job writes its target
    result = invoke("-q", "--output-format", "text" if fmt == "txt" else "parquet", "in.txt", f"latest.{fmt}")
    assert result.exit_code == 0, result.output
    assert os.path.islink(f"latest.{fmt}") and os.readlink(f"latest.{fmt}") == f"data/today.{fmt}"
    assert read_texts(Path(f"data/today.{fmt}"), "text" if fmt == "txt" else "parquet") == REVERSED
    assert listing(tmp_path / "data") == [f"today.{fmt}"]


# -- links planted where the job writes ------------------------------------------------------------------------------

@pytest.mark.parametrize("planted,fmt", [
    (".out.txt.nllb-partial", "txt"),
    (".out.txt.nllb-state.json.tmp", "txt"),
    (".out.txt.nllb-state.json", "txt"),
    (".e.jsonl.nllb-partial", "txt"),
    (".out.parquet.nllb-converting", "parquet"),
    (".out.parquet.nllb-partial", "parquet"),
])
@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_planted_links_are_never_written_through(fake, tmp_path, monkeypatch, planted, fmt, link):
    monkeypatch.chdir(tmp_path)
    if fmt == "txt":
        Path("in.txt").write_text("".join(t + "\n" for t in ROWS))
    else:
        pq.write_table(pa.table({"text": ROWS}), "in.parquet")
    Path("victim.txt").write_text("precious\n")
    (os.symlink if link == "symlink" else os.link)(str(tmp_path / "victim.txt"), planted)
    result = invoke("-q", "--chunk-rows", "4", "--errors", "e.jsonl", f"in.{fmt}", f"out.{fmt}")
    assert result.exit_code == 0, result.output
    assert Path("victim.txt").read_text() == "precious\n"
    assert not os.path.islink(f"out.{fmt}") and read_texts(Path(f"out.{fmt}"), "text" if fmt == "txt" else "parquet") == REVERSED
    assert listing(tmp_path) == sorted(["e.jsonl", f"in.{fmt}", f"out.{fmt}", "victim.txt"])


# -- states left by killed runs --------------------------------------------------------------------------------------

def write_rows(path: Path, rows: list[str]) -> None:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))


def expected_jsonl(rows: list[str]) -> str:
    return "".join(json.dumps({"text": t, "translation": t[::-1]}) + "\n" for t in rows)


def test_a_fresh_run_stopped_before_its_first_commit_leaves_no_stale_state(fake, tmp_path, monkeypatch):
    """(a) a job stopped after a commit; (b) run again without --resume and stopped before its first commit;
    (c) --resume must work: the fresh run removed the old state before it emptied the old partial file."""
    monkeypatch.chdir(tmp_path)
    write_rows(Path("in.jsonl"), ROWS)
    args = ["-q", "--chunk-rows", "3", "in.jsonl", "out.jsonl"]
    stop_after(fake, 3)  # chunks 1 and 2 committed
    result = invoke(*args)
    assert result.exit_code == 143
    assert "--resume" in result.stderr
    assert listing(tmp_path) == [".out.jsonl.nllb-partial", ".out.jsonl.nllb-state.json", "in.jsonl"]
    stop_after(fake, 1)  # the fresh run stops before anything is committed
    result = invoke(*args)
    assert result.exit_code == 143
    assert result.stderr == "Stopped by SIGTERM before any rows were saved; nothing was written.\n"
    assert listing(tmp_path) == ["in.jsonl"]
    translate_normally(fake)
    result = invoke("--resume", *args)
    assert result.exit_code == 0, result.output
    assert Path("out.jsonl").read_text() == expected_jsonl(ROWS)


@pytest.mark.parametrize("damage", ["truncate", "remove", "garbage", "version"])
def test_resume_from_a_damaged_state_starts_afresh(fake, tmp_path, monkeypatch, damage):
    """A state whose partial file lost its committed bytes (or that cannot be read) never blocks --resume."""
    monkeypatch.chdir(tmp_path)
    args = stopped_job(fake)
    partial, state = Path(".out.jsonl.nllb-partial"), Path(".out.jsonl.nllb-state.json")
    if damage == "truncate":
        os.truncate(partial, 5)
    elif damage == "remove":
        partial.unlink()
    elif damage == "garbage":
        state.write_text("{not json")
    else:
        state.write_text(json.dumps({**json.loads(state.read_text()), "version": 0}))
    for run in range(2):  # and again: a finished job's --resume starts afresh too
        result = invoke("--resume", *args)
        assert result.exit_code == 0, result.output
        assert result.stderr.startswith("Starting afresh: ") == (run == 0)
        assert Path("out.jsonl").read_text() == expected_jsonl(ROWS)
        assert listing(tmp_path) == ["in.jsonl", "out.jsonl"]


def test_a_damaged_state_is_reported(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = stopped_job(fake)
    os.truncate(".out.jsonl.nllb-partial", 5)
    result = invoke("--resume", *args)
    assert result.exit_code == 0
    state, partial = tmp_path / ".out.jsonl.nllb-state.json", tmp_path / ".out.jsonl.nllb-partial"
    committed = len(expected_jsonl(ROWS[:6]).encode())
    assert result.stderr == (f"Starting afresh: the resume state {state} says {committed} bytes of {partial} are "
                             "committed, but it holds 5.\n")


def test_resume_never_leaves_recorded_rows_behind(fake, tmp_path, monkeypatch):
    """A job recording bad rows in e.jsonl, stopped, resumed with --on-error skip: the row recorded before the
    stop was in an orphaned partial file, reported nowhere."""
    monkeypatch.chdir(tmp_path)
    args = stopped_job(fake, "--errors", "e.jsonl", bad_row=True)
    for other in (["--on-error", "skip"], ["--on-error", "fail"], ["--errors", "other.jsonl"]):
        result = invoke("--resume", *other, *args)
        assert result.exit_code == 1, result.output
        assert result.stderr == (f"Error: cannot resume: the interrupted job recorded 1 failed row in {tmp_path / 'e.jsonl'}; "
                                 f"resume with --errors {tmp_path / 'e.jsonl'}, or run without --resume to start over.\n")
    result = invoke("--resume", "--errors", "e.jsonl", *args)
    assert result.exit_code == 3
    assert [json.loads(line)["row"] for line in Path("e.jsonl").read_text().splitlines()] == [1]
    assert listing(tmp_path) == ["e.jsonl", "in.jsonl", "out.jsonl"]


def test_resume_may_drop_an_errors_file_that_recorded_nothing(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = stopped_job(fake, "--errors", "e.jsonl")
    result = invoke("--resume", "--on-error", "skip", *args)
    assert result.exit_code == 0, result.output
    assert listing(tmp_path) == ["in.jsonl", "out.jsonl"]  # no orphaned .e.jsonl.nllb-partial


def test_a_fresh_run_removes_the_old_jobs_errors_partial(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = stopped_job(fake, "--errors", "e.jsonl", bad_row=True)
    assert invoke("--on-error", "skip", *args).exit_code == 3
    assert listing(tmp_path) == ["in.jsonl", "out.jsonl"]


# -- signals at the end ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["txt", "parquet"])
def test_a_signal_while_the_output_is_put_in_place_ends_the_job_as_finished(fake, tmp_path, monkeypatch, fmt):
    import nllbcli.job.loop as loop

    monkeypatch.chdir(tmp_path)
    Path("in.txt").write_text("".join(t + "\n" for t in ROWS))
    save_record = loop.save_record

    def signalled(*args):  # SIGTERM arrives inside the last critical section, after the rename
        os.kill(os.getpid(), signal.SIGTERM)
        save_record(*args)

    monkeypatch.setattr(loop, "save_record", signalled)
    result = invoke("--errors", "e.jsonl", "--chunk-rows", "5", "in.txt", f"out.{fmt}")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("Done: 12 rows into ")
    assert read_texts(Path(f"out.{fmt}"), "text" if fmt == "txt" else "parquet") == REVERSED
    assert listing(tmp_path) == sorted(["e.jsonl", "in.txt", f"out.{fmt}"])


# -- JSONL to text keeps one line per row ----------------------------------------------------------------------------

def test_jsonl_to_text_is_one_line_per_row(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    texts = ["one\ntwo", "three", "four\r\nfive\rsix", "\n", "seven\n\n"]
    write_rows(Path("in.jsonl"), texts)
    result = invoke("-q", "in.jsonl", "out.txt")
    assert result.exit_code == 0, result.output
    lines = Path("out.txt").read_bytes().split(b"\n")
    assert len(lines) == len(texts) + 1 and lines[-1] == b""
    assert b"\r" not in Path("out.txt").read_bytes()
    assert lines[0] == b"eno owt" and lines[2] == b"ruof evif xis"


# -- messages --------------------------------------------------------------------------------------------------------

def test_a_lone_surrogate_is_named_plainly(tmp_path, monkeypatch):
    """The real tokenizer: a JSON "\\ud800" escape gave pybind11's "incompatible function arguments" text."""
    monkeypatch.chdir(tmp_path)
    Path("in.jsonl").write_text('{"text": "ok \\ud800 x"}\n{"text": "Hello."}\n')
    result = CliRunner().invoke(cli, TRANSLATE + ["--model", TINY, "--device", "cpu", "--beam-size", "1", "--max-length", "3",
                                                  "-q", "--on-error", "skip", "in.jsonl", "out.jsonl"])
    assert result.exit_code == 3
    assert result.stderr == ("Skipped: in.jsonl:1: field 'text' holds a lone surrogate (\\ud800 at character 4), half of a "
                             "UTF-16 pair, which is not text.\n")


def test_a_full_disk_names_the_output(fake, tmp_path, monkeypatch):
    import nllbcli.job.state as resume

    monkeypatch.chdir(tmp_path)
    Path("in.txt").write_text("".join(t + "\n" for t in ROWS))

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(resume.os, "fsync", full)
    result = invoke("-q", "in.txt", "out.txt")
    assert result.exit_code == 1
    assert result.stderr == "Error: cannot write out.txt: No space left on device.\n"
    assert listing(tmp_path) == ["in.txt"]


@pytest.mark.parametrize("out", ["out.parquet", "out.txt.zst"])
def test_a_full_disk_while_the_output_is_converted_leaves_no_half_file(fake, tmp_path, monkeypatch, out):
    """OUTPUT written from the finished partial file (Parquet, compressed) onto a disk that fills up: the
    half-written file beside it is removed (on a full disk it holds the room a retry needs), and --resume, once
    there is room, writes OUTPUT from the committed rows."""
    import nllbcli.job.commit as commit

    monkeypatch.chdir(tmp_path)
    Path("in.txt").write_text("".join(t + "\n" for t in ROWS))
    compressing = commit.compressing

    def filling(target, compression):
        target.write(b"x" * 4096)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(commit, "compressing", filling)
    result = invoke("-q", "in.txt", out)
    assert result.exit_code == 1
    assert result.stderr == f"Error: cannot write {out}: No space left on device.\n"
    assert not any(name.endswith(".nllb-converting") for name in os.listdir(tmp_path))
    monkeypatch.setattr(commit, "compressing", compressing)
    result = invoke("-q", "--resume", "in.txt", out)
    assert result.exit_code == 0, result.output
    assert listing(tmp_path) == ["in.txt", out]


def test_a_full_temporary_directory_is_named(fake, monkeypatch):
    """Parquet from stdin is spooled to $TMPDIR; a full one gave `Error: I/O: No space left on device.`"""
    import tempfile

    real = tempfile.NamedTemporaryFile

    class Full:
        def __init__(self, **options):
            self.file = real(**options)
            self.name = self.file.name

        def write(self, block):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", Full)
    result = CliRunner().invoke(cli, TRANSLATE + ["--input-format", "parquet", "-", "-"], input=b"PAR1 stand-in")
    assert result.exit_code == 1
    assert result.stderr == (f"Error: cannot copy <stdin> to a temporary file in {tempfile.gettempdir()} (Parquet is read "
                             "from a file): No space left on device; set TMPDIR to a directory with room.\n")


def test_a_read_error_names_the_input(fake, tmp_path, monkeypatch):
    import nllbcli.io.text as text

    monkeypatch.chdir(tmp_path)
    Path("in.txt").write_text("ab\ncd\n")

    def failing(stream, name, field, position):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
        yield

    monkeypatch.setattr(text, "read_text", failing)
    result = invoke("-q", "in.txt", "out.txt")
    assert result.exit_code == 1
    assert result.stderr == "Error: cannot read in.txt: Input/output error.\n"
    assert listing(tmp_path) == ["in.txt"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_stdout_is_named(tmp_path):
    (tmp_path / "in.txt").write_text("Hello.\n")
    with open("/dev/full", "wb") as full:
        result = subprocess.run(nllb("in.txt", "-"), stdout=full, stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == "Error: cannot write standard output: No space left on device."


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("where", ["OUTPUT", "--errors"])
def test_a_full_device_is_named(fake, tmp_path, monkeypatch, where):
    """The buffered bytes' second failed flush, at close, replaced the message that names the file."""
    monkeypatch.chdir(tmp_path)
    Path("in.jsonl").write_text(('{"text": 1}\n' if where == "--errors" else "") + '{"text": "ab"}\n')
    args = ["in.jsonl", "/dev/full"] if where == "OUTPUT" else ["--errors", "/dev/full", "in.jsonl", "out.jsonl"]
    result = invoke("-q", "--output-format", "jsonl", *args)
    assert result.exit_code == 1
    assert result.stderr == "Error: cannot write /dev/full: No space left on device.\n"
    assert listing(tmp_path) == ["in.jsonl"]


# -- closed standard streams and signals at start-up (real processes) ----------------------------------------------

def nllb(*args: str) -> list[str]:
    return [sys.executable, "-m", "nllbcli", *TRANSLATE, "--model", TINY, "--device", "cpu", "--beam-size", "1",
            "--max-length", "3", *args]


def closing(fd: int):
    return lambda: os.close(fd)


def test_closed_stdout_with_output_to_stdout_is_one_line(tmp_path):
    (tmp_path / "in.txt").write_text("Hello.\n")
    result = subprocess.run(nllb("in.txt", "-"), stderr=subprocess.PIPE, text=True, cwd=tmp_path, preexec_fn=closing(1), timeout=120)
    assert result.returncode == 2
    assert result.stderr == "Error: standard output is closed: name an OUTPUT file instead of -.\n"


def test_closed_stdin_with_input_from_stdin_is_one_line(tmp_path):
    result = subprocess.run(nllb("-", "out.txt"), capture_output=True, text=True, cwd=tmp_path, preexec_fn=closing(0), timeout=120)
    assert result.returncode == 2
    assert result.stderr == "Error: standard input is closed: name an INPUT file instead of -.\n"
    assert listing(tmp_path) == []


@pytest.mark.parametrize("fd", [0, 1, 2])
def test_a_closed_stream_the_job_does_not_use_changes_nothing(tmp_path, fd):
    (tmp_path / "in.txt").write_text("Hello.\nGood night.\n")
    stdout = None if fd == 1 else subprocess.PIPE
    process = subprocess.run(nllb("in.txt", "-" if fd != 1 else "out.txt"), stdout=stdout, stderr=None if fd == 2 else subprocess.PIPE,
                             cwd=tmp_path, preexec_fn=closing(fd), timeout=120)
    assert process.returncode == 0, process.stderr
    if fd == 1:
        assert len((tmp_path / "out.txt").read_text().splitlines()) == 2
    else:
        assert len(process.stdout.splitlines()) == 2  # the translations, and no summary line among them
    if fd != 2:
        assert process.stderr.decode().startswith("Done: 2 rows")


def wait_for_entry_point(pid: int) -> None:
    """Until nllb's entry point has run (it catches SIGTERM, which Python leaves alone: /proc's SigCgt). Before,
    while the interpreter itself starts (up to 0.2 s on a loaded machine), no program's code can keep a Ctrl-C
    from killing it by the signal's default action or as a KeyboardInterrupt."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = open(f"/proc/{pid}/status").read()
        caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.M)[1], 16)
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.001)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.1, 0.2, 0.35])  # from when nllb's entry point has run
def test_ctrl_c_during_start_up_has_no_traceback(tmp_path, delay):
    (tmp_path / "in.txt").write_text("Hello.\n" * 50)
    process = subprocess.Popen(nllb("in.txt", "out.txt"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    wait_for_entry_point(process.pid)
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert process.returncode in (130, 0), stderr
    if process.returncode == 130:
        assert listing(tmp_path) == ["in.txt"] or (tmp_path / ".out.txt.nllb-state.json").exists()


def test_the_nllb_command_starts_through_the_quiet_entry_point():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "nllb"]
    assert script.value == "nllbcli.__main__:main"


@pytest.mark.parametrize("where", ["the command's", "its subcommand's"])
def test_ctrl_c_while_the_options_are_parsed_is_130(monkeypatch, where):
    """The window between the imports and the subcommand: click parses `nllb`'s own options, then the
    subcommand's (converting --device, say), and a Ctrl-C there is 130 like one later, not click's "Aborted!"
    and exit 1."""
    from click.testing import CliRunner

    from nllbcli import cli as cli_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "the command's":
        monkeypatch.setattr(cli_module.Commands, "parse_args", interrupted)
    else:
        monkeypatch.setattr(cli_module.Device, "convert", interrupted)
    result = CliRunner().invoke(cli_module.cli, ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn", "-"], input="")
    assert result.exit_code == 130 and "Aborted" not in result.output, result.output


@pytest.mark.parametrize("raised", [ImportError("initialization failed"), OSError(errno.EINTR, "Interrupted system call")])
@pytest.mark.parametrize("stop, code", [(KeyboardInterrupt(), 130), (Stopped(signal.SIGTERM), 143)])
def test_a_stop_that_surfaces_as_another_error_is_its_exit_code(monkeypatch, raised, stop, code):
    """A Ctrl-C while a C extension initializes (sentencepiece's, imported as the job starts) comes out as an
    ImportError raised from the KeyboardInterrupt: the command exits with the stop's code, without a traceback."""
    from click.testing import CliRunner

    from nllbcli import cli as cli_module

    def interrupted_import(*args, **kwargs):
        try:
            raise stop
        except BaseException as error:
            raise raised from error

    monkeypatch.setattr(cli_module, "load_tokenizer", interrupted_import)
    result = CliRunner().invoke(cli_module.cli, ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn", "-"], input="")
    assert result.exit_code == code and result.output == "", result.output


def test_ctrl_c_through_c_code_at_start_up_is_130_under_python_m(tmp_path):
    """A KeyboardInterrupt that passed through C code running Python (PyRun_String: some extensions'
    initialization), then handled, leaves Python's "unhandled KeyboardInterrupt" flag set, with which `python -m`
    would end the process by SIGINT (-2) whatever its exit code: the command still exits 130, quietly."""
    (tmp_path / "through_c.py").write_text("\n".join([
        "import ctypes",
        "from nllbcli import cli",
        "def interrupted(*args, **kwargs):",
        "    run = ctypes.pythonapi.PyRun_String",
        "    run.restype, run.argtypes = ctypes.py_object, [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]",
        "    run(b'raise KeyboardInterrupt', 257, {}, {})",
        "cli.load_tokenizer = interrupted",
        "from nllbcli.__main__ import main",
        "main()",
    ]) + "\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-m", "through_c", *TRANSLATE, "-"], input="Hello.\n", capture_output=True,
                            text=True, cwd=tmp_path, env=env, timeout=120)
    assert (result.returncode, result.stderr) == (130, "")


def test_a_signal_once_the_job_has_finished_does_not_change_its_exit(tmp_path):
    """A Ctrl-C that lands as the finished command exits (here: in sys.exit itself) leaves exit 0 and the
    finished output; it once went on as a KeyboardInterrupt to click's "Aborted!" and 1, or killed the
    process as the interpreter shut down."""
    (tmp_path / "in.txt").write_text("Hello.\n")
    script = "\n".join([
        "import os, signal, sys",
        "real_exit = sys.exit",
        "def interrupted(code=0):",
        "    os.kill(os.getpid(), signal.SIGINT)",
        "    real_exit(code)",
        "sys.exit = interrupted",
        "from nllbcli.cli import main",
        "sys.argv = ['nllb'] + sys.argv[1:]",
        "main()",
    ])
    args = nllb("in.txt", "out.txt")[3:]  # the command's arguments, after python -m nllbcli
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=tmp_path,
                            timeout=120)
    assert result.returncode == 0 and "Aborted" not in result.stderr, result.stderr
    assert (tmp_path / "out.txt").read_text().count("\n") == 1
