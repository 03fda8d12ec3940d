"""File names that are not UTF-8 (any bytes but / and NUL are a Linux name; Python holds the others as
surrogates, `in\\udcff.txt`): as INPUT, OUTPUT, --errors, an -o DIR and its inputs, the model's directory, a
job stopped and resumed, and in what the command prints, with a strict stdout (PYTHONIOENCODING=utf-8, as
a UTF-8 locale other than C gives) and with stderr closed.

Real subprocesses on the tiny test model on the CPU; the names made from bytes with os.fsdecode.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from jobfiles import listing, stopped_after_commits

from nllbcli.cli import cli

TINY = str(Path(__file__).resolve().parent / "models" / "tiny-a")
ROWS = 30
STRICT = dict(os.environ, PYTHONIOENCODING="utf-8")  # stdout refuses what UTF-8 cannot write


def name(raw: bytes) -> str:
    return os.fsdecode(raw)


def args(*paths: str) -> list[str]:
    return ["translate", "-m", TINY, "--device", "cpu", "--src", "eng_Latn", "--tgt", "fra_Latn", "--beam-size", "1",
            "--max-length", "6", "--chunk-rows", "10", "--progress", "none", *paths]


def nllb(cwd: Path, *arguments: str, **options) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nllbcli", *arguments], cwd=cwd, env=STRICT, capture_output=True,
                          timeout=120, **options)


def write_input(path: Path) -> None:
    """ROWS rows, the sixth of a JSONL or Parquet input one that fails."""
    texts = [f"The green bicycle number {n} costs forty-five euros." for n in range(ROWS)]
    if path.suffix == ".txt":
        path.write_text("".join(text + "\n" for text in texts))
    elif path.suffix == ".jsonl":
        path.write_text("".join((json.dumps({"text": t}) if n != 5 else '{"text": 5}') + "\n" for n, t in enumerate(texts)))
    else:
        with path.open("wb") as stream:  # pyarrow takes no name that is not UTF-8
            pq.write_table(pa.table({"text": [t if n != 5 else None for n, t in enumerate(texts)]}), stream)


@pytest.mark.parametrize("ext", ["txt", "jsonl", "parquet"])
def test_a_job_on_names_that_are_not_utf8_finishes_and_resumes(tmp_path, monkeypatch, ext):
    source, target, errors = name(b"in\xff." + ext.encode()), name(b"out\xfe." + ext.encode()), name(b"errors\xfd.jsonl")
    write_input(tmp_path / source)
    failed = ext != "txt"
    job = args("--errors", errors, source, target)
    straight = nllb(tmp_path, *job)
    assert straight.returncode == (3 if failed else 0), straight.stderr
    assert straight.stderr.decode().startswith(f"Done: {ROWS} rows")
    expected = (tmp_path / target).read_bytes(), (tmp_path / errors).read_bytes()
    if failed:
        assert json.loads(expected[1])["error"].startswith(f"{source}:")  # \\udcff in the JSON: the name as Python has it
    for path in (target, errors, f".{target}.nllb-state.json"):
        os.unlink(tmp_path / path)
    monkeypatch.chdir(tmp_path)
    with stopped_after_commits(1):  # a commit saved, with the names in its state
        assert CliRunner().invoke(cli, job).exit_code == 130
    assert not (tmp_path / target).exists()
    resumed = nllb(tmp_path, *job, "--resume")
    assert resumed.returncode == straight.returncode, resumed.stderr
    assert ((tmp_path / target).read_bytes(), (tmp_path / errors).read_bytes()) == expected
    again = nllb(tmp_path, *job, "--resume")
    assert again.returncode == 0
    assert again.stderr == (f"Already finished: out\\udcfe.{ext} holds this job's {ROWS} rows, and its input and "
                            "options are unchanged; nothing to do.\n").encode()
    assert listing(tmp_path) == sorted([source, target, errors])


def test_an_output_directory_and_inputs_whose_names_are_not_utf8(tmp_path):
    inputs = [name(b"a\xff.txt"), name(b"b\xfe.jsonl")]
    for path in inputs:
        write_input(tmp_path / path)
    directory = name(b"out\xf0")
    job = args("--on-error", "skip", "-o", directory, *inputs)
    result = nllb(tmp_path, *job)
    assert result.returncode == 3, result.stderr
    assert result.stderr.decode().startswith("Done: 30 rows")
    assert "\nSkipped: b\\udcfe.jsonl:6: field 'text' is int, not a string.\nDone: 30 rows" in result.stderr.decode()
    assert listing(tmp_path / directory) == sorted(inputs)
    again = nllb(tmp_path, *job, "--resume")
    assert again.returncode == 0
    assert again.stderr.decode().splitlines() == [f"Already finished: out\\udcf0/{n} holds this job's {ROWS} rows, and its "
                                                  "input and options are unchanged; nothing to do." for n in
                                                  ("a\\udcff.txt", "b\\udcfe.jsonl")]


def test_a_model_directory_whose_name_is_not_utf8(tmp_path):
    model = name(b"model\xf1")
    shutil.copytree(TINY, tmp_path / model)
    info = nllb(tmp_path, "info", model)
    assert info.returncode == 0, info.stderr
    assert info.stdout.startswith(b"Model:") and b"model\xf1\n" in info.stdout  # the name's own bytes
    write_input(tmp_path / "in.txt")
    job = [*args("in.txt", "out.txt")[:2], model, *args("in.txt", "out.txt")[3:]]
    result = nllb(tmp_path, *job)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out.txt").read_bytes() == CliRunner().invoke(cli, args(str(tmp_path / "in.txt"), "-")).stdout_bytes


def test_a_message_naming_such_a_file_on_a_closed_stderr_keeps_its_exit_code(tmp_path):
    source = name(b"in\xff.txt")
    write_input(tmp_path / source)
    result = nllb(tmp_path, *args(source, source), preexec_fn=lambda: os.close(2))
    assert result.returncode == 2  # the refusal to write over the input, said to no one
