"""Which files a job may replace, several inputs, and a finished job's --resume: an OUTPUT that nllb did not
write is never replaced without --force (with `dir/*.txt` the shell makes the second input OUTPUT), an output
nllb wrote is replaced by the next run, and a --resume of a job that finished on the same input with the same
options does nothing."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from nllbcli.cli import cli
from nllbcli.job.signals import Stopped

from jobfiles import listing

TRANSLATE = ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn"]
ROWS = [f"row {i}" for i in range(12)]
REVERSED = [text[::-1] for text in ROWS]


def invoke(*args: str):
    return CliRunner().invoke(cli, TRANSLATE + list(args))


def lines(path) -> list[str]:
    return Path(path).read_text().splitlines()


def write_rows(path, rows=ROWS) -> None:
    Path(path).write_text("".join(row + "\n" for row in rows))


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -- OUTPUT files nllb did not write ----------------------------------------------------------------------------------

def test_a_second_input_given_as_output_is_not_replaced(fake, here):
    """`nllb translate dir/*.txt` with two files: the second is not replaced by the first's translations."""
    write_rows("a.txt")
    write_rows("b.txt", ["other"])
    result = invoke("-q", "a.txt", "b.txt")
    assert result.exit_code == 2
    assert result.stderr == ("Error: OUTPUT b.txt exists and nllb did not write it: refusing to replace it. Pass --force "
                             "to replace it; to translate several files, name an output directory: -o DIR INPUT...\n")
    assert lines("b.txt") == ["other"] and not fake.batches
    assert listing(here) == ["a.txt", "b.txt"]


def test_a_link_to_a_file_nllb_did_not_write_is_not_replaced(fake, here):
    write_rows("a.txt")
    write_rows("b.txt", ["other"])
    os.symlink("b.txt", "link.txt")
    assert invoke("-q", "a.txt", "link.txt").exit_code == 2
    assert lines("b.txt") == ["other"] and os.path.islink("link.txt")


def test_force_replaces_a_file_nllb_did_not_write(fake, here):
    write_rows("a.txt")
    write_rows("b.txt", ["other"])
    assert invoke("-q", "--force", "a.txt", "b.txt").exit_code == 0
    assert lines("b.txt") == REVERSED


def test_an_empty_output_is_replaced(fake, here):
    """As `out=$(mktemp)` makes it."""
    write_rows("a.txt")
    Path("out.txt").touch()
    assert invoke("-q", "a.txt", "out.txt").exit_code == 0
    assert lines("out.txt") == REVERSED


@pytest.mark.parametrize("ext", ["txt", "jsonl", "parquet"])
def test_a_rerun_replaces_the_output_nllb_wrote(fake, here, ext):
    write_rows("a.txt")
    assert invoke("-q", "a.txt", f"out.{ext}").exit_code == 0
    write_rows("a.txt", ["new"])
    result = invoke("-q", "a.txt", f"out.{ext}")
    assert result.exit_code == 0, result.output
    assert listing(here) == ["a.txt", f"out.{ext}"]
    if ext == "txt":
        assert lines("out.txt") == ["wen"]


def test_an_output_changed_since_nllb_wrote_it_is_not_replaced(fake, here):
    write_rows("a.txt")
    assert invoke("-q", "a.txt", "out.txt").exit_code == 0
    Path("out.txt").write_text("edited by hand\n")
    assert invoke("-q", "a.txt", "out.txt").exit_code == 2
    assert lines("out.txt") == ["edited by hand"]


def test_a_rerun_stopped_before_its_first_commit_may_still_replace_its_output(fake, here):
    """A fresh run over nllb's own output records at once that it may replace it: stopped before it commits
    anything, the output is still nllb's, and the next run (with --resume or without) replaces it."""
    write_rows("a.txt")
    assert invoke("-q", "a.txt", "out.txt").exit_code == 0
    generate = type(fake).generate

    def stopped(*args):
        raise Stopped(signal.SIGTERM)

    fake.generate = stopped
    assert invoke("-q", "--beam-size", "2", "a.txt", "out.txt").exit_code == 143
    assert lines("out.txt") == REVERSED
    fake.generate = generate.__get__(fake)
    for extra in (["--resume"], []):
        result = invoke("-q", *extra, "--beam-size", "2", "a.txt", "out.txt")
        assert result.exit_code == 0, result.output
    assert listing(here) == ["a.txt", "out.txt"]


def test_a_rerun_stopped_while_it_records_its_state_leaves_nothing_behind(fake, here, monkeypatch):
    """A fresh run over a finished job's output, stopped while it writes its first state (the temporary file
    made, not yet renamed), removes the temporary file; and one a kill -9 left there is removed by the next run,
    even when that run finds the job finished and has nothing else to do."""
    import nllbcli.job.state as resume

    write_rows("a.txt")
    assert invoke("-q", "a.txt", "out.txt").exit_code == 0
    asdict = resume.asdict

    def stopped(*args, **kwargs):
        raise Stopped(signal.SIGINT)

    monkeypatch.setattr(resume, "asdict", stopped)  # in save_state, with the temporary file made
    assert invoke("-q", "a.txt", "out.txt").exit_code == 130
    assert listing(here) == ["a.txt", "out.txt"]
    monkeypatch.setattr(resume, "asdict", asdict)
    for name in (".out.txt.nllb-partial", ".e.jsonl.nllb-partial"):  # as a kill -9 leaves them
        Path(name).write_bytes(b"")
    Path(".out.txt.nllb-state.json.tmp").write_text('{"version": 2, "job": {}')
    result = invoke("--resume", "a.txt", "out.txt")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("Already finished: out.txt")
    assert listing(here) == [".e.jsonl.nllb-partial", "a.txt", "out.txt"]  # another job's errors file
    assert lines("out.txt") == REVERSED


def test_a_finished_jobs_resume_leaves_the_files_of_a_job_writing_its_output_alone(fake, here):
    import fcntl

    write_rows("a.txt")
    assert invoke("-q", "--errors", "e.jsonl", "a.txt", "out.txt").exit_code == 0
    Path(".out.txt.nllb-state.json.tmp").write_text("{")
    Path(".e.jsonl.nllb-partial").write_bytes(b"")
    with open(".out.txt.nllb-partial", "wb") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = invoke("--resume", "--errors", "e.jsonl", "a.txt", "out.txt")
        assert result.exit_code == 0, result.output
        assert result.stderr.startswith("Already finished: out.txt")
        assert {".e.jsonl.nllb-partial", ".out.txt.nllb-partial", ".out.txt.nllb-state.json.tmp"} <= set(os.listdir(here))
    result = invoke("-q", "--resume", "--errors", "e.jsonl", "a.txt", "out.txt")
    assert result.exit_code == 0, result.output
    assert listing(here) == ["a.txt", "e.jsonl", "out.txt"]


# -- several inputs ---------------------------------------------------------------------------------------------------

def test_more_than_two_paths_are_refused_with_what_to_do(fake, here):
    for name in ("a.txt", "b.txt", "c.txt"):
        write_rows(name, [name])
    result = invoke("-q", "a.txt", "b.txt", "c.txt")
    assert result.exit_code == 2
    assert "3 paths given" in result.stderr and "-o DIR INPUT..." in result.stderr
    assert [lines(n) for n in ("a.txt", "b.txt", "c.txt")] == [["a.txt"], ["b.txt"], ["c.txt"]]


def test_several_inputs_go_to_a_directory(fake, here):
    Path("docs").mkdir()
    for name in ("a.txt", "b.txt"):
        write_rows(f"docs/{name}", [name])
    result = invoke("-o", "fr", "docs/a.txt", "docs/b.txt")
    assert result.exit_code == 0, result.output
    assert lines("fr/a.txt") == ["txt.a"] and lines("fr/b.txt") == ["txt.b"]
    assert lines("docs/a.txt") == ["a.txt"] and listing("fr") == ["a.txt", "b.txt"]
    assert result.stderr.count("Done: 1 row into ") == 2
    assert len(fake.loaded) == 1  # one model for all


def test_one_input_with_o_names_the_output_file(fake, here):
    write_rows("a.txt")
    assert invoke("-q", "-o", "out.jsonl", "a.txt").exit_code == 0
    assert [json.loads(line)["translation"] for line in lines("out.jsonl")] == REVERSED


def test_output_format_names_the_files_in_the_directory(fake, here):
    write_rows("a.txt")
    write_rows("b.txt")
    assert invoke("-q", "--output-format", "jsonl", "-o", "out", "a.txt", "b.txt").exit_code == 0
    assert listing("out") == ["a.jsonl", "b.jsonl"]


def test_a_directory_of_several_inputs_is_the_input_directory_refused(fake, here):
    """-o . with inputs in . would translate each file onto itself."""
    write_rows("a.txt", ["a"])
    write_rows("b.txt", ["b"])
    result = invoke("-q", "-o", ".", "a.txt", "b.txt")
    assert result.exit_code == 2 and "is the input file" in result.stderr
    assert lines("a.txt") == ["a"] and lines("b.txt") == ["b"]


@pytest.mark.parametrize("args, message", [
    (["-o", "out", "x/a.txt", "y/a.txt"], "would both be translated into out/a.txt"),
    (["-o", "out", "x/a.txt", "-"], "- (stdin) cannot be one of several inputs"),
    (["-o", "file.txt", "x/a.txt", "y/a.txt"], "-o names a directory"),
    (["--errors", "e.jsonl", "-o", "out", "x/a.txt", "x/b.txt"], "--errors names one file, and there are several inputs"),
])
def test_several_inputs_refused_when_they_cannot_be_told_apart(fake, here, args, message):
    for name in ("x/a.txt", "x/b.txt", "y/a.txt"):
        Path(name).parent.mkdir(exist_ok=True)
        write_rows(name)
    Path("file.txt").write_text("")
    result = invoke("-q", *args)
    assert result.exit_code == 2 and message in result.stderr, result.stderr
    assert not os.path.exists("out") and not fake.batches


def test_a_failed_input_does_not_stop_the_others(fake, here):
    Path("bad.jsonl").write_text("not json\n")
    Path("good.jsonl").write_text('{"text": "ab"}\n')
    result = invoke("-q", "-o", "out", "bad.jsonl", "good.jsonl")
    assert result.exit_code == 1
    assert result.stderr == "Error: bad.jsonl:1: not valid JSON: Expecting value (column 1).\n"
    assert listing("out") == ["good.jsonl"]


# -- a finished job's --resume ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("ext", ["txt", "jsonl", "parquet"])
def test_resume_of_a_finished_job_does_nothing(fake, here, ext):
    write_rows("a.txt")
    assert invoke("-q", "--resume", "a.txt", f"out.{ext}").exit_code == 0
    before = Path(f"out.{ext}").read_bytes(), os.stat(f"out.{ext}").st_mtime_ns
    fake.batches.clear()
    result = invoke("--resume", "a.txt", f"out.{ext}")
    assert result.exit_code == 0, result.output
    assert result.stderr == (f"Already finished: out.{ext} holds this job's 12 rows, and its input and options are "
                             "unchanged; nothing to do.\n")
    assert not fake.batches
    assert (Path(f"out.{ext}").read_bytes(), os.stat(f"out.{ext}").st_mtime_ns) == before
    assert invoke("-q", "--resume", "a.txt", f"out.{ext}").stderr == ""


def test_resume_of_a_finished_job_with_failed_rows_does_nothing(fake, here):
    Path("a.jsonl").write_text('{"text": "ab"}\n{"text": 1}\n')
    assert invoke("-q", "--resume", "--errors", "e.jsonl", "a.jsonl", "out.jsonl").exit_code == 3
    fake.batches.clear()
    result = invoke("-q", "--resume", "--errors", "e.jsonl", "a.jsonl", "out.jsonl")
    assert result.exit_code == 0 and not fake.batches
    assert listing(here) == ["a.jsonl", "e.jsonl", "out.jsonl"]


@pytest.mark.parametrize("change, said", [
    (lambda: write_rows("a.txt", ["a new day"]), "was finished by a job that differs in input"),
    (lambda: Path("out.txt").unlink(), None),
])
def test_resume_after_the_input_or_the_output_changed_runs_again(fake, here, change, said):
    write_rows("a.txt")
    assert invoke("-q", "--resume", "a.txt", "out.txt").exit_code == 0
    change()
    fake.batches.clear()
    result = invoke("--resume", "a.txt", "out.txt")
    assert result.exit_code == 0, result.output
    assert fake.batches
    assert lines("out.txt") == [line[::-1] for line in lines("a.txt")]
    if said:
        assert result.stderr.startswith(f"Starting afresh: out.txt {said}")


def test_resume_with_other_options_after_a_finished_job_runs_again(fake, here):
    write_rows("a.txt")
    assert invoke("-q", "--resume", "a.txt", "out.txt").exit_code == 0
    fake.batches.clear()
    result = invoke("--resume", "--beam-size", "2", "a.txt", "out.txt")
    assert result.exit_code == 0 and fake.batches
    assert "was finished by a job that differs in decode" in result.stderr
