"""Line-by-line use on a pipe or terminal: a line (a CSV record, once its quotes close) is translated once the
input goes quiet, not at a full chunk or the end; a fast pipe still fills whole chunks. Parquet is not written to a terminal.

The jobs run in a subprocess with the fake translator of conftest.py (reversed text), as a user's shell runs nllb."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nllbcli.io.streams import Lines, Replay
from nllbcli.job.reader import read_chunks

HERE = Path(__file__).parent
SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from fakes import FakeTranslator
import nllbcli.cli as cli
translator = FakeTranslator()
cli.load_model = lambda model, device: translator
cli.load_tokenizer = lambda model: translator.tokenizer
cli.main()
"""
TRANSLATE = ["translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn"]


def nllb(*args: str) -> list[str]:
    return [sys.executable, "-c", SCRIPT.format(tests=str(HERE)), *args]


def read_line(fd: int, timeout: float, size: int | None = None) -> bytes:
    """A line from `fd` within `timeout` seconds (or, given `size`, that many bytes, lines and all), else what
    came by then."""
    got = b""
    deadline = time.monotonic() + timeout
    while (not got.endswith(b"\n") if size is None else len(got) < size) and (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            block = os.read(fd, 1 << 16)
            if not block:
                break
            got += block
    return got


@pytest.mark.parametrize("stdin", ["pipe", "terminal"])
@pytest.mark.parametrize("fmt", ["text", "jsonl"])
def test_a_line_is_translated_before_the_next_is_sent(tmp_path, stdin, fmt):
    # a JSON Lines blank line holds no row: one after a row does not keep it waiting for the next
    lines = [b"ab\n", b"cd\n"] if fmt == "text" else [b'{"text": "ab"}\n \n', b'{"text": "cd"}\n']
    expected = [b"ba\n", b"dc\n"] if fmt == "text" else [b'{"text": "ab", "translation": "ba"}\n',
                                                         b'{"text": "cd", "translation": "dc"}\n']
    extra = [] if stdin == "pipe" else ["--input-format", fmt]  # a terminal is not sniffed
    if stdin == "pipe":
        read_end, write_end = os.pipe()
    else:
        write_end, read_end = pty.openpty()  # (master, slave): nllb reads the terminal's lines
    process = subprocess.Popen(nllb(*TRANSLATE, *extra), stdin=read_end, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, cwd=tmp_path)
    os.close(read_end)
    try:
        os.write(write_end, lines[0])
        first = read_line(process.stdout.fileno(), 60)
        assert first == expected[0], process.stderr.read1() if first == b"" and process.poll() is not None else first
        os.write(write_end, lines[1])
        assert read_line(process.stdout.fileno(), 60) == expected[1]
        if stdin == "pipe":
            os.close(write_end)
        else:
            os.write(write_end, b"\x04")  # the end: Ctrl-D (a closed terminal would be an I/O error)
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        if stdin != "pipe":
            os.close(write_end)
    assert process.stdout.read() == b""


def test_a_csv_record_is_translated_before_the_next_is_sent(tmp_path, fmt="csv"):
    """The header and a record of two lines (a quoted line break) come out while the pipe is quiet; CSV in, CSV out."""
    sep = b","
    read_end, write_end = os.pipe()
    process = subprocess.Popen(nllb(*TRANSLATE, "--input-format", fmt), stdin=read_end, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, cwd=tmp_path)
    os.close(read_end)
    os.write(write_end, b"n" + sep + b'text\r\n1' + sep + b'"ab\ncd"\r\n')
    first = b"n" + sep + b"text" + sep + b'translation\n1' + sep + b'"ab\ncd"' + sep + b'"ba\ndc"\n'
    got = read_line(process.stdout.fileno(), 60, len(first))
    assert got == first, process.stderr.read1() if got == b"" and process.poll() is not None else got
    os.write(write_end, b"2" + sep + b'"e')  # a record whose quoted field goes on: not a row yet
    time.sleep(0.5)
    os.write(write_end, b'f"\n')
    second = b"2" + sep + b"ef" + sep + b"fe\n"
    assert read_line(process.stdout.fileno(), 60, len(second)) == second
    os.close(write_end)
    assert process.wait(timeout=60) == 0, process.stderr.read()
    assert process.stdout.read() == b""


def test_a_csv_record_arrives_once_its_quotes_close():
    lines, writer = pipe_lines([b'a\n"b\n\n', b'c"\n'], 0.8)
    lines.rows = "csv"
    assert lines.arrived(5) and lines.readline() == b"a\n"
    started = time.monotonic()
    assert not lines.arrived(0.3)  # the blank line is inside the quotes
    assert lines.arrived(5) and time.monotonic() - started > 0.5
    assert list(lines) == [b'"b\n', b"\n", b'c"\n']
    writer.join()


def pipe_lines(writes, pause) -> tuple[Lines, threading.Thread]:
    """Lines of a real pipe that a thread writes `writes` into, `pause` seconds apart (or pause[n - 1] before
    write n)."""
    read_end, write_end = os.pipe()

    def write() -> None:
        for n, data in enumerate(writes):
            if n:
                time.sleep(pause[n - 1] if isinstance(pause, list) else pause)
            os.write(write_end, data)
        os.close(write_end)

    writer = threading.Thread(target=write)
    writer.start()
    return Lines(Replay(os.fdopen(read_end, "rb", buffering=0))), writer


def test_a_fast_pipe_fills_whole_chunks():
    lines, writer = pipe_lines([b"".join(b"line %d\n" % n for n in range(5000))], 0)
    chunks = [len(chunk) for chunk in read_chunks(iter(lines), 2000, arrived=lines.arrived)]
    writer.join()
    assert chunks == [2000, 2000, 1000]


def test_a_quiet_pipe_ends_the_chunk():
    lines, writer = pipe_lines([b"a\nb\n", b"c\n", b"d\ne"], 0.8)
    started = time.monotonic()
    chunks = []
    for chunk in read_chunks(iter(lines), 100, arrived=lines.arrived):
        chunks.append((chunk, round(time.monotonic() - started, 1)))
    writer.join()
    assert [chunk for chunk, _ in chunks] == [[b"a\n", b"b\n"], [b"c\n"], [b"d\n", b"e"]]
    assert chunks[0][1] < 0.7  # once 0.3 s have passed without a line, not when the next comes


def test_a_line_that_comes_in_parts_does_not_hold_back_the_chunk_before_it():
    lines, writer = pipe_lines([b"a\n", b"b", b"c\n"], [0.1, 1.0])  # "b" comes while the chunk waits, its end later
    started = time.monotonic()
    chunks = []
    for chunk in read_chunks(iter(lines), 100, arrived=lines.arrived):
        chunks.append((chunk, time.monotonic() - started))
    writer.join()
    assert [chunk for chunk, _ in chunks] == [[b"a\n"], [b"bc\n"]]
    assert chunks[0][1] < 0.9  # 0.3 s after "b" came, not when "c\n" did


def test_lines_of_a_stream_give_every_byte():
    """A long line over many reads, lines split across reads, and skipping (a resumed stream's rows)."""
    long = b"x" * 300_000
    lines, writer = pipe_lines([b"first\n" + long[:100_000], long[100_000:] + b"\nse", b"cond\nlast"], 0.01)
    assert lines.read(3) == b"fir"
    assert list(lines) == [b"st\n", long + b"\n", b"second\n", b"last"]
    writer.join()


@pytest.mark.parametrize("named", [False, True])
def test_parquet_is_refused_on_a_terminal(tmp_path, named):
    """On stdout, or a terminal's device named as OUTPUT."""
    pq.write_table(pa.table({"text": ["ab"]}), tmp_path / "in.parquet")
    master, slave = pty.openpty()
    output = ["--output-format", "parquet", os.ttyname(slave)] if named else []
    result = subprocess.run(nllb(*TRANSLATE, "in.parquet", *output), stdout=slave, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, timeout=60)
    os.close(slave)
    os.set_blocking(master, False)
    try:
        written = os.read(master, 1 << 16)
    except (BlockingIOError, OSError):
        written = b""
    os.close(master)
    assert result.returncode == 2
    assert result.stderr == ("Error: Parquet is binary, and OUTPUT is a terminal: name an OUTPUT file, or pass "
                             "--output-format jsonl or text.\n")
    assert written == b""
