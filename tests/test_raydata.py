"""--ray on a local Ray with logical CPUs and two fake GPUs, the sample model on the CPU engine in the actors: the
CLI's bytes (in order when asked, else as a set), every row once, the failed rows recorded, an actor killed, a
batch function that raises once, a failed job never promoted and resumed, the GPU ids Ray gives the actors.

One Ray for the whole module (started in this process; the jobs join it), so each job costs seconds.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from test_job_identity import rewrite_weights

ray = pytest.importorskip("ray")

from nllbcli.runners import ray as raydata  # noqa: E402
from nllbcli.cli import cli  # noqa: E402
from nllbcli.errors import NllbError  # noqa: E402
from nllbcli.job.progress import Counters  # noqa: E402
from nllbcli.job.spec import identity_of  # noqa: E402
from nllbcli.options import DecodeOptions, Job, ModelOptions  # noqa: E402
from nllbcli.model.translator import load_translator  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = str(ROOT / "data" / "samples" / "model")
TINY = str(ROOT / "tests" / "models" / "tiny-a")
GREEDY = DecodeOptions(beam_size=1, max_length=48)
DECODE_ARGS = ["--beam-size", "1", "--max-length", "48"]
SKIPPING = Job(src="eng_Latn", tgt="fra_Latn", on_error="skip")
TEXTS = ["The concert is on the twelfth of March.", "David sees twenty black hats at the market every morning.",
         "Emma's birthday is on the fourth of July. My sister bought three red cars in the garden last week.",
         "My uncle went to Rome on Friday.", ""]


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors run this module's translators
    yield
    ray.shutdown()


def write_jsonl(path: Path, rows: int, start: int = 0, bad_every: int = 0) -> None:
    """Rows of the sample model's sentences, a blank line now and then, and a line that is not JSON every
    `bad_every` rows."""
    lines = []
    for n in range(start, start + rows):
        if n % 9 == 4:
            lines.append("\n")
        if bad_every and n % bad_every == bad_every - 1:
            lines.append("{not json\n")
        else:
            lines.append(json.dumps({"id": n, "text": TEXTS[n % len(TEXTS)]}) + "\n")
    path.write_text("".join(lines))


def write_parquet(path: Path, rows: int, start: int = 0) -> None:
    texts = [None if n % 11 == 10 else TEXTS[n % len(TEXTS)] for n in range(start, start + rows)]
    pq.write_table(pa.table({"id": pa.array(range(start, start + rows), pa.int64()), "text": texts}), path,
                   row_group_size=7)


def cli_output(tmp_path: Path, source: Path, *args: str) -> tuple[bytes, bytes]:
    """The plain command's output and errors file for one input (skip: the errors file is empty)."""
    name = source.name.removesuffix(".gz")  # the translations written plain, as the parts are
    out, errors = tmp_path / f"cli-{name}", tmp_path / f"cli-{name}.errors.jsonl"
    record = ["--errors", str(errors)] if "skip" not in args else []
    result = CliRunner().invoke(cli, ["translate", "-q", "-m", SAMPLE, "--device", "cpu", *DECODE_ARGS, "--src", "en",
                                      "--tgt", "fr", *record, *args, str(source), str(out)])
    assert result.exit_code in (0, 3), result.output
    return out.read_bytes(), errors.read_bytes() if errors.exists() else b""


def parts(output: Path, suffix: str) -> list[Path]:
    return sorted(p for p in output.iterdir() if p.name.startswith("part-") and p.name.endswith(suffix))


def run(tmp_path: Path, inputs: list[str], output: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["translate", "-m", SAMPLE, *DECODE_ARGS, "--src", "en", "--tgt", "fr",
                                      "--progress", "none", *args, "--ray", *inputs, str(output)])
    return result.exit_code, result.output


def test_jsonl_parts_in_name_order_are_the_commands_output_file_after_file(tmp_path, monkeypatch):
    """The parts are the command's output, file after file; the progress counts rows as the actors translate them,
    and the summary is the command's (JSON lines here)."""
    monkeypatch.setattr("nllbcli.job.progress.JSON_INTERVAL", 0.1)
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_jsonl(inputs / "a.jsonl", 40, bad_every=13)
    write_jsonl(inputs / "b.jsonl", 25, start=40)
    (inputs / "b.jsonl.gz").write_bytes(gzip.compress((inputs / "b.jsonl").read_bytes()))  # read as the CLI reads it
    (inputs / "b.jsonl").unlink()
    write_jsonl(inputs / "c.jsonl", 5, start=65)
    (inputs / "c.jsonl").write_bytes(gzip.compress((inputs / "c.jsonl").read_bytes()))  # gzip, as its bytes say
    (inputs / "_SUCCESS").write_text("")  # a marker of another tool's, not an input
    code, said = run(tmp_path, [str(inputs)], tmp_path / "out", "--chunk-rows", "8", "--max-batch-sentences", "3",
                     "--errors", str(tmp_path / "errors.jsonl"), "--progress", "json")
    assert code == 3, said
    expected = [cli_output(tmp_path, inputs / name) for name in ("a.jsonl", "b.jsonl.gz", "c.jsonl")]
    assert b"".join(p.read_bytes() for p in parts(tmp_path / "out", ".jsonl")) == b"".join(out for out, _ in expected)
    assert (tmp_path / "errors.jsonl").read_bytes() == b"".join(errors for _, errors in expected)
    lines = [json.loads(line) for line in said.splitlines() if line.startswith("{")]
    summary, progress = lines[-1], [line for line in lines if line["event"] == "progress"]
    assert (summary["event"], summary["rows"], summary["translated"], summary["failed"]) == ("summary", 70, 67, 3)
    assert summary["where"] == "2 Ray actors (GPU 0, GPU 1)"  # each actor was given its own GPU by Ray
    assert summary["output"] == str(tmp_path / "out")
    done = [line["done"] for line in progress]
    assert done == sorted(done) and 0 < done[-1] <= 70  # counted as the actors translate them
    assert "_SUCCESS" in os.listdir(tmp_path / "out")
    assert not list(tmp_path.glob(".out.nllb-staging"))


def test_parquet_rows_come_once_each_with_the_commands_translations(tmp_path):
    """... the scores and lists of --scores and --num-hypotheses too (to the bit, though the batches differ)."""
    write_parquet(tmp_path / "a.parquet", 30)
    write_parquet(tmp_path / "b.parquet", 21, start=30)
    options = ("--on-error", "skip", "--status-field", "status", "--scores", "--num-hypotheses", "2", "--beam-size", "2")
    code, said = run(tmp_path, [str(tmp_path / "*.parquet")], tmp_path / "out", "--chunk-rows", "6", *options)
    assert code == 3, said
    assert said.count("Skipped: ") == 4 and "a.parquet: row 11: field 'text' is null, not a string." in said
    got = pa.concat_tables([pq.read_table(p) for p in parts(tmp_path / "out", ".parquet")])
    expected = pa.concat_tables([pq.read_table(pa.BufferReader(cli_output(tmp_path, tmp_path / name, *options)[0]))
                                 for name in ("a.parquet", "b.parquet")])
    assert got.schema == expected.schema
    assert got.schema.field("translation").type == pa.list_(pa.string())
    assert got.to_pylist() == expected.to_pylist()  # every row once, the parts in name order in input order
    assert pq.read_table(tmp_path / "out").num_rows == 47  # readers of the directory skip _SUCCESS


def test_several_targets_come_as_the_commands_columns(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", 23)
    options = ("--tgt", "fr,de", "--status-field", "status")
    code, said = run(tmp_path, [str(tmp_path / "a.jsonl")], tmp_path / "out", "--chunk-rows", "5", *options)
    assert code == 0, said
    got = b"".join(p.read_bytes() for p in parts(tmp_path / "out", ".jsonl"))
    assert got == cli_output(tmp_path, tmp_path / "a.jsonl", *options)[0]
    assert list(json.loads(got.splitlines()[0])) == ["id", "text", "translation_fra_Latn", "translation_deu_Latn",
                                                     "status_fra_Latn", "status_deu_Latn"]


def test_a_score_job_on_ray_writes_the_commands_rows(tmp_path):
    """nllb score --ray: the parts hold the plain score job's rows, its scores to the bit."""
    rows = [{"id": n, "text": TEXTS[n % len(TEXTS)], "translation": TEXTS[(n + n // 3) % len(TEXTS)]} for n in range(17)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    score = ["score", "-m", SAMPLE, "--device", "cpu", "--src", "en", "--tgt", "fr", "--token-scores"]
    plain = CliRunner().invoke(cli, [*score, "-q", str(tmp_path / "pairs.jsonl"), str(tmp_path / "plain.jsonl")])
    assert plain.exit_code == 0, plain.output
    result = CliRunner().invoke(cli, [*score, "--chunk-rows", "5", "--ray", str(tmp_path / "pairs.jsonl"),
                                      str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"Done: 17 rows into {tmp_path / 'out'} (17 scored, 0 failed")
    got = b"".join(p.read_bytes() for p in parts(tmp_path / "out", ".jsonl"))
    assert got == (tmp_path / "plain.jsonl").read_bytes()


def test_the_actors_are_given_blocks_of_chunk_rows_rows(tmp_path):
    # a block smaller than --chunk-rows is an actor call with too little for the GPU while the next is prepared:
    # one file's rows come in blocks of exactly 8 but the last, whatever blocks the read gave
    write_jsonl(tmp_path / "in.jsonl", 70)
    code, said = run(tmp_path, [str(tmp_path / "in.jsonl")], tmp_path / "out", "--chunk-rows", "8")
    assert code == 0, said
    sizes = [len(p.read_bytes().splitlines()) for p in parts(tmp_path / "out", ".jsonl")]
    assert sizes == [8] * 8 + [6]


def test_a_write_task_given_rows_apart_writes_a_part_for_each_run(tmp_path):
    """Rows of one write task that are not adjacent in the input (a resumed job's leftovers, blocks that ended
    out of order) go to separate parts, so that parts in name order hold the rows in input order; the task's own
    file holds what its blocks counted."""
    sink = raydata.Sink(str(tmp_path), "jsonl", "skip", 5)
    ids = [5, 6, 9, 10, 11, (1 << raydata.FILE_BITS) | 1]  # lines 5-6 and 9-11 (7 blank) of file 0, line 1 of file 1
    rows = [3, 4, 6, 7, 8, 0]  # row 5 (line 8) is not among them: written by an earlier run
    counted = ['{"rows": 3, "translated": 3, "sentences": 4, "tokens": 20}', None, None,
               '{"rows": 3, "translated": 2, "failed": 1, "sentences": 2, "cut": 1, "flagged": 1, "tokens": 9}', None, None]
    block = pa.table({raydata.ID: ids, raydata.ROW: rows, raydata.LINE: [b"%d\n" % i for i in ids],
                      raydata.ERROR: [None, None, None, "line 10: bad", None, None],
                      raydata.ERROR_LINE: [None, None, None, b"{}\n", None, None], raydata.WORKER: ["CPU"] * 6,
                      raydata.COUNTED: counted})
    record = io.BytesIO()
    assert sink.write_parts(pa.concat_tables([block.slice(3), block.slice(0, 3)]), "u_000007", record) == {"workers": ["CPU"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == [  # each named by its first line and its rows
        "u_000007-00000-000000000005-2.jsonl", "u_000007-00000-000000000009-1.errors.jsonl",
        "u_000007-00000-000000000009-2.jsonl", "u_000007-00001-000000000001-1.jsonl"]
    assert (tmp_path / "u_000007-00000-000000000009-2.jsonl").read_bytes() == b"9\n11\n"
    assert json.loads(record.getvalue()) == {"rows": 6, "translated": 5, "failed": 1, "cut": 1, "max_length": 0,
                                             "flagged": 1, "repetition": 0, "wrong_language": 0, "length_ratio": 0,
                                             "low_score": 0, "copy": 0, "retried": 0, "sentences": 6, "tokens": 29}


def write_task(staging: Path, task: int, lines: list[tuple[int, int, int, str | None]], digits: int) -> None:
    """What a write task of a job writes into its staging's data: rows given as (file, line, row, error), and the
    task's counts (a sentence a translated row, a token a row) in its own file."""
    ids = [file << raydata.FILE_BITS | line for file, line, _, _ in lines]
    failed = sum(e is not None for *_, e in lines)
    counted = json.dumps({"rows": len(lines), "translated": len(lines) - failed, "failed": failed,
                          "sentences": len(lines) - failed, "tokens": len(lines)})
    block = pa.table({raydata.ID: pa.array(ids, pa.int64()), raydata.ROW: [row for _, _, row, _ in lines],
                      raydata.LINE: [b'{"n": %d}\n' % i for i in ids], raydata.ERROR: [e for *_, e in lines],
                      raydata.ERROR_LINE: [None if e is None else b'{"error": "%s"}\n' % e.encode() for *_, e in lines],
                      raydata.WORKER: ["CPU"] * len(lines), raydata.COUNTED: [counted] + [None] * (len(lines) - 1)})
    sink = raydata.Sink(str(staging / "data"), "jsonl", "skip", digits)
    record = io.BytesIO()
    sink.write_parts(block, f"u_{task:06d}", record)
    (staging / "data" / f"u_{task:06d}").write_bytes(record.getvalue())


def test_part_names_keep_input_order_past_99999_files(tmp_path, monkeypatch):
    """The file's number takes as many digits as the job's last file needs, in every name of the job: names sort
    as the inputs do and parse back, at 100,001 inputs as at 2."""
    digits = raydata.file_digits(100_001)
    assert (raydata.file_digits(2), digits) == (5, 6)
    names = [raydata.final_name(file, line, digits, ".jsonl") for file, line in ((100_000, 1), (5, 12), (99_999, 3), (5, 2))]
    assert sorted(names) == ["part-000005-000000000002.jsonl", "part-000005-000000000012.jsonl",
                             "part-099999-000000000003.jsonl", "part-100000-000000000001.jsonl"]
    staged = raydata.staged_name("u_000007", 100_000, 5, 3, digits, ".errors.jsonl")
    assert staged == "u_000007-100000-000000000005-3.errors.jsonl"
    assert raydata.parse_staged(staged) == (100_000, 5, 3, ".errors.jsonl")
    assert raydata.parse_staged("part-100000-000000000005.jsonl") is None  # a promoted part is not a staged one

    # a promotion of such a job: the parts of the last two of 100,001 inputs (the inputs themselves are not read)
    files = [f"in-{n}.jsonl" for n in range(100_001)]
    staging = tmp_path / ".out.nllb-staging"
    raydata.prepare_staging(str(staging), {"job": 1}, False, print)
    write_task(staging, 0, [(100_000, 1, 0, None), (100_000, 2, 1, "bad")], digits)
    write_task(staging, 1, [(99_999, 1, 0, None), (99_999, 3, 1, None)], digits)
    # the read tasks' records of 100,001 inputs' rows (as many files in the staging: a minute on a slow disk)
    monkeypatch.setattr(raydata, "counted_rows", lambda staging, files: {n: 2 * (n >= 99_999) for n in range(len(files))})
    skipped = []
    outcomes = raydata.promote(str(staging), str(tmp_path / "out"), files, SKIPPING, {"job": 1}, None, skipped.append)
    assert outcomes.counters == Counters(rows=4, translated=3, failed=1, sentences=3, tokens=4)
    assert skipped == ["Skipped: bad"]
    assert sorted(os.listdir(tmp_path / "out")) == ["_SUCCESS", "part-099999-000000000001.jsonl",  # no task's counts
                                                   "part-100000-000000000001.jsonl"]
    assert (tmp_path / "out" / "part-099999-000000000001.jsonl").read_bytes() == (
        b'{"n": %d}\n{"n": %d}\n' % (99_999 << raydata.FILE_BITS | 1, 99_999 << raydata.FILE_BITS | 3))
    assert not staging.exists()


@pytest.mark.parametrize("lost", ["first", "last", "errors"])
def test_a_lost_part_is_refused_from_the_counts_the_tasks_recorded(tmp_path, lost):
    """The parts' rows (from their names) against each input's (its read task's record): a part gone, the first,
    the last of a file or an errors part, is refused and nothing promoted."""
    staging = tmp_path / ".out.nllb-staging"
    raydata.prepare_staging(str(staging), {"job": 1}, False, print)
    write_task(staging, 0, [(0, 1, 0, None), (0, 2, 1, None)], 5)
    write_task(staging, 1, [(0, 4, 2, None), (0, 5, 3, "bad"), (0, 6, 4, None)], 5)
    open(staging / raydata.ROWS / "0-5", "wb").close()
    data = staging / "data"
    gone = {"first": "u_000000-00000-000000000001-2.jsonl", "last": "u_000001-00000-000000000004-2.jsonl",
            "errors": "u_000001-00000-000000000004-1.errors.jsonl"}[lost]
    (data / gone).unlink()
    with pytest.raises(NllbError, match=r"the parts hold [34] rows of in.jsonl, whose rows are 5: refusing to finish "
                                        r"the job; run it again without --resume\.$"):
        raydata.promote(str(staging), str(tmp_path / "out"), ["in.jsonl"], SKIPPING, {"job": 1}, None, print)
    assert not (tmp_path / "out").exists() and not (staging / raydata.PLAN).exists()


def test_an_input_that_changed_while_the_job_read_it_is_refused(tmp_path):
    """Two reads of one input (a read task run again, a resumed job) that counted other rows."""
    staging = tmp_path / ".out.nllb-staging"
    raydata.prepare_staging(str(staging), {"job": 1}, False, print)
    write_task(staging, 0, [(0, 1, 0, None)], 5)
    for record in ("0-1", "0-2"):
        open(staging / raydata.ROWS / record, "wb").close()
    with pytest.raises(NllbError, match=r"^in.jsonl changed while the job read it \(\d rows, then \d\): run the job "
                                        r"again without --resume\.$"):
        raydata.promote(str(staging), str(tmp_path / "out"), ["in.jsonl"], SKIPPING, {"job": 1}, None, print)


class Flaky:
    """A translator whose generate raises once (the first call of any actor), then works; or sleeps a while
    before each call, so that a job lasts long enough to be interrupted."""

    def __init__(self, translator, marker: str | None = None, delay: float = 0.0):
        self.translator, self.marker, self.delay = translator, marker, delay

    def __getattr__(self, name):
        return getattr(self.translator, name)

    def generate_hypotheses(self, *args, **kwargs):
        time.sleep(self.delay)
        if self.marker is not None and not os.path.exists(self.marker):
            Path(self.marker).write_text("raised")
            raise RuntimeError("a transient failure")
        return self.translator.generate_hypotheses(*args, **kwargs)


def flaky(marker: str | None = None, delay: float = 0.0) -> Flaky:
    return Flaky(load_translator(SAMPLE, "cpu"), marker, delay)


def translate(tmp_path: Path, inputs: list[str], output: Path, load=None, chunk_rows=None, decode: DecodeOptions = GREEDY,
              **kwargs) -> raydata.Outcomes:
    job = Job(src="eng_Latn", tgt="fra_Latn", on_error=kwargs.pop("on_error", "skip"), errors=kwargs.pop("errors", None))
    return raydata.translate_with_ray(inputs, str(output), job, decode, ModelOptions(SAMPLE),
                                      batching={"read_chunk_rows": chunk_rows}, load=load, warn=lambda message: None,
                                      **kwargs)


def test_a_batch_function_that_raises_is_run_again(tmp_path):
    import functools

    write_jsonl(tmp_path / "in.jsonl", 30)
    outcomes = translate(tmp_path, [str(tmp_path / "in.jsonl")], tmp_path / "out", chunk_rows=5,
                         load=functools.partial(flaky, str(tmp_path / "raised")))
    assert (tmp_path / "raised").exists() and outcomes.rows == outcomes.translated == 30
    assert b"".join(p.read_bytes() for p in parts(tmp_path / "out", ".jsonl")) == cli_output(
        tmp_path, tmp_path / "in.jsonl", "--on-error", "skip")[0]


def actor_processes() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as stream:
                if b"MapWorker" in stream.read() and b"Translating" in open(f"/proc/{entry}/cmdline", "rb").read():
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def test_a_killed_actor_is_replaced_and_no_row_is_lost_or_written_twice(tmp_path):
    import functools

    write_jsonl(tmp_path / "in.jsonl", 60)
    staged = tmp_path / ".out.nllb-staging" / "data"
    killed = []

    def kill_one_when_a_part_is_written():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (staged.is_dir() and any(staged.iterdir())):
            time.sleep(0.05)
        actors = actor_processes()
        if actors:
            os.kill(actors[0], signal.SIGKILL)
            killed.append(actors[0])

    killer = threading.Thread(target=kill_one_when_a_part_is_written)
    killer.start()
    outcomes = translate(tmp_path, [str(tmp_path / "in.jsonl")], tmp_path / "out", chunk_rows=4,
                         load=functools.partial(flaky, None, 0.3))
    killer.join()
    assert killed and outcomes.rows == outcomes.translated == 60
    assert b"".join(p.read_bytes() for p in parts(tmp_path / "out", ".jsonl")) == cli_output(
        tmp_path, tmp_path / "in.jsonl", "--on-error", "skip")[0]


def test_a_failed_job_is_not_promoted_and_resumes_to_the_same_bytes(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", 48, bad_every=40)
    output = tmp_path / "out"
    with pytest.raises(NllbError, match=r"in.jsonl:\d+: not valid JSON.*--resume"):
        translate(tmp_path, [str(tmp_path / "in.jsonl")], output, chunk_rows=4, on_error="fail")
    assert not output.exists()
    staged = [p.name for p in (tmp_path / ".out.nllb-staging" / "data").iterdir()]
    assert staged and not any(name.endswith(".errors.jsonl") for name in staged)
    assert not os.listdir(tmp_path / ".out.nllb-staging" / raydata.WRITING)  # every write task had ended
    outcomes = translate(tmp_path, [str(tmp_path / "in.jsonl")], output, chunk_rows=4, on_error="skip", resume=True)
    assert (outcomes.rows, outcomes.failed) == (48, 1)
    assert b"".join(p.read_bytes() for p in parts(output, ".jsonl")) == cli_output(
        tmp_path, tmp_path / "in.jsonl", "--on-error", "skip")[0]
    again = translate(tmp_path, [str(tmp_path / "in.jsonl")], output, chunk_rows=4, on_error="skip", resume=True)
    assert again.already


def test_a_resume_waits_for_the_interrupted_jobs_writes_still_in_flight(tmp_path):
    """A write task of the interrupted job still writing (its file in the staging's WRITING folder) when the
    resume starts: the resume waits for it, so that the part it writes is there before the uncommitted parts are
    cleaned up, not after. A task of this host that has ended (killed with the job, or its Ray) is not waited for."""
    staging, identity = str(tmp_path / ".out.nllb-staging"), {"job": 1}
    raydata.prepare_staging(staging, identity, False, print)
    with raydata.writing(staging, "task-0"):
        assert os.listdir(os.path.join(staging, raydata.WRITING)) == ["task-0"]
        threading.Timer(0.5, lambda: os.unlink(os.path.join(staging, raydata.WRITING, "task-0"))).start()
        started = time.monotonic()
        raydata.prepare_staging(staging, identity, True, print)
        assert time.monotonic() - started >= 0.4
    assert not os.path.exists(os.path.join(staging, raydata.WRITING))
    open(os.path.join(staging, "data", "part-a-00000-000000000000.jsonl"), "w").close()
    os.makedirs(os.path.join(staging, raydata.WRITING))
    open(os.path.join(staging, raydata.WRITING, "task-1"), "w").close()  # a task killed while it wrote, unnamed
    started = time.monotonic()
    raydata.wait_for_writes(staging, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 5
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for host, pid, start, waits in ((socket.gethostname(), int(ended.stdout), "1", False),  # a task of here, ended
                                    (socket.gethostname(), os.getpid(), raydata.process_start(os.getpid()), True),
                                    ("elsewhere", os.getpid(), raydata.process_start(os.getpid()), True)):
        with open(os.path.join(staging, raydata.WRITING, "task-1"), "w") as marker:
            json.dump({"host": host, "pid": pid, "start": start}, marker)
        started = time.monotonic()
        raydata.wait_for_writes(staging, timeout=1.0)
        assert (time.monotonic() - started >= 1.0) == waits, (host, pid)


def test_a_killed_job_resumes_to_the_same_bytes(tmp_path):
    """The whole command killed (kill -9) once a part is staged: --resume reads only the rows not written."""
    write_jsonl(tmp_path / "in.jsonl", 80)
    command = [sys.executable, "-m", "nllbcli", "translate", "-m", SAMPLE, *DECODE_ARGS, "--src", "en", "--tgt", "fr",
               "-q", "--chunk-rows", "4", "--ray-actors", "1", "--ray", "in.jsonl", "out"]
    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)  # this module's Ray
    process = subprocess.Popen(command, cwd=tmp_path, env=env)
    staged = tmp_path / ".out.nllb-staging" / "data"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (staged.is_dir() and len(list(staged.iterdir())) >= 2):
        time.sleep(0.05)
    process.kill()
    process.wait()
    assert not (tmp_path / "out").exists()
    resumed = subprocess.run([*command, "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert b"".join(p.read_bytes() for p in parts(tmp_path / "out", ".jsonl")) == cli_output(
        tmp_path, tmp_path / "in.jsonl", "--on-error", "skip")[0]


def test_the_jobs_counts_are_the_commands_every_run_included(tmp_path):
    """What a --ray job counts (rows, translated, failed, flagged, sentences, tokens) is what the command counts
    of the same rows (job/commit.py counts both), for a job that failed and was resumed too: each write task's
    counts are staged with its parts."""
    write_jsonl(tmp_path / "in.jsonl", 48, bad_every=40)
    result = CliRunner().invoke(cli, ["translate", "-m", SAMPLE, "--device", "cpu", "--beam-size", "1", "--max-length",
                                      "8", "--src", "en", "--tgt", "fr", "--progress", "json", "--on-error", "skip",
                                      str(tmp_path / "in.jsonl"), str(tmp_path / "command.jsonl")])
    summary = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")][-1]
    expected = {name: summary[name] for name in raydata.counted_fields(Counters())}
    assert expected["failed"] and expected["max_length"] and expected["tokens"]  # something of each to count
    short = DecodeOptions(beam_size=1, max_length=8)
    with pytest.raises(NllbError, match=r"not valid JSON"):
        translate(tmp_path, [str(tmp_path / "in.jsonl")], tmp_path / "out", decode=short, chunk_rows=4, on_error="fail")
    assert any((tmp_path / ".out.nllb-staging" / "data").iterdir())  # counts of the first run to keep
    outcomes = translate(tmp_path, [str(tmp_path / "in.jsonl")], tmp_path / "out", decode=short, chunk_rows=4,
                         resume=True)
    assert raydata.counted_fields(outcomes.counters) == expected and outcomes.counters.seconds > 0
    assert json.loads((tmp_path / "out" / "_SUCCESS").read_text())["tokens"] == expected["tokens"]


def test_the_summary_is_the_commands_line_naming_the_actors():
    said = io.StringIO()
    counters = Counters(rows=70, translated=67, failed=3, max_length=2, flagged=2, sentences=80, tokens=1200, seconds=4.0)
    raydata.report(raydata.Outcomes(counters, ("GPU 0", "GPU 1")), "out", stream=said)
    assert said.getvalue() == ("Done: 70 rows into out (67 translated, 3 failed, 2 flagged: 0 cut to fit the model, 2 "
                               "stopped at --max-length), 80 sentences, 1,200 tokens in 4.0 s on 2 Ray actors (GPU 0, GPU 1): "
                               "17.5 rows/s, 300 tokens/s.\n")
    said = io.StringIO()
    raydata.report(raydata.Outcomes(already=True), "out", stream=said)
    assert said.getvalue() == ("Already finished: out holds this job's rows, and its inputs and options are unchanged; "
                               "nothing to do.\n")
    said = io.StringIO()
    raydata.report(raydata.Outcomes(counters), "out", summary=False, stream=said)  # --quiet
    assert said.getvalue() == ""


def test_the_runner_takes_ray_data_through_its_public_and_developer_interfaces():
    """Every name the runner imports from Ray is one Ray marks @PublicAPI or @DeveloperAPI, from a module that is
    not private; Ray's internals are named in INTERNALS alone (test_the_ray_internals_the_runner_relies_on_are_there)."""
    import ast
    import importlib

    from ray.util.annotations import AnnotationType

    tree = ast.parse(Path(raydata.__file__).read_text())
    imported = [(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.level == 0 and node.module.split(".")[0] == "ray" for alias in node.names]
    assert imported
    for module, name in imported:
        if any(part.startswith("_") for part in module.split(".")):
            assert f"{module}.{name}" in raydata.INTERNALS, f"{module}.{name}: a private module of Ray's, not in INTERNALS"
            continue
        kind = getattr(getattr(importlib.import_module(module), name), "_annotated_type", None)
        assert kind in (AnnotationType.PUBLIC_API, AnnotationType.DEVELOPER_API), f"{module}.{name} is {kind}"


def test_a_ray_without_what_the_job_needs_of_it_is_refused_in_one_line(tmp_path, monkeypatch):
    """A Ray that lacks one of INTERNALS, or a DataContext setting the job sets, is refused before any work, by
    name, rather than run otherwise than the job says."""
    write_jsonl(tmp_path / "in.jsonl", 3)
    monkeypatch.setitem(raydata.INTERNALS, "ray.data._internal.planner.checkpoint.plan_write_op", ("gone",))
    code, said = run(tmp_path, [str(tmp_path / "in.jsonl")], tmp_path / "out")
    assert code == 1 and said == (f"Error: --ray: Ray {ray.__version__} has no ray.data._internal.planner.checkpoint."
                                  "plan_write_op.gone, which the job needs (runners/ray.py's INTERNALS): install a Ray "
                                  "that nllbcli supports (its ray extra: pip install '.[ray]' in nllbcli's checkout).\n")
    assert not (tmp_path / ".out.nllb-staging").exists()
    with pytest.raises(NllbError, match=rf"^--ray: Ray {re.escape(ray.__version__)}'s DataContext has no "
                                        r"a_setting_renamed, which the job sets: install a Ray"):
        raydata.configure(ray.data.DataContext.get_current(), a_setting_renamed=True)


def test_the_ray_internals_the_runner_relies_on_are_there():
    """What the runner needs of Ray that Ray does not publish (INTERNALS, and the module's docstring says why): a
    Ray that lacks or changed one must fail here, naming it, rather than lose rows, write them twice, or wait."""
    from types import SimpleNamespace

    try:
        raydata.check_internals()
    except NllbError as error:
        pytest.fail(str(error))
    # the two-phase checkpoint is a file datasink's, and a task's pending checkpoint is named by its file's name
    # (TaskName's): on resume, the files whose names start with it are the uncommitted ones, deleted
    from ray.data._internal.planner.checkpoint.plan_write_op import _generate_base_filename
    from ray.data._internal.planner.plan_write_op import WRITE_UUID_KWARG_NAME
    from ray.data.datasource.file_datasink import _FileDatasink

    sink = raydata.Sink("/nonexistent/data", "jsonl", "skip", 5)
    assert isinstance(sink, _FileDatasink), f"Ray {ray.__version__}: the Sink is not a file datasink of Ray's checkpoint"
    name = _generate_base_filename(sink, SimpleNamespace(kwargs={WRITE_UUID_KWARG_NAME: "u"}, task_idx=7))
    assert name == sink.filename_provider.task == "u_000007", (
        f"Ray {ray.__version__} names a write task's pending checkpoint {name!r}, not by TaskName's name: an "
        "uncommitted part would not be deleted on resume.")


def test_a_job_whose_weights_were_written_anew_is_refused_or_translated_again(tmp_path):
    """The model part of the job's identity is the command's (checkpoint.model_identity): after the model's
    weights are written anew in the same directory, an interrupted job is not continued, and a finished one is not
    "already finished"."""
    model = tmp_path.resolve() / "model"
    shutil.copytree(TINY, model)
    write_jsonl(tmp_path / "in.jsonl", 20)
    files, output = [str(tmp_path / "in.jsonl")], tmp_path / "out"
    job = Job(src="eng_Latn", tgt="fra_Latn", on_error="skip")

    def ray_job() -> raydata.Outcomes:
        return raydata.translate_with_ray(files, str(output), job, GREEDY, ModelOptions(str(model)),
                                          batching={"read_chunk_rows": 5}, resume=True, warn=lambda message: None)

    # the job as it finished, and as it was interrupted, before the weights were written anew
    before = raydata.ray_identity(files, replace(job, input_format="jsonl", output_format="jsonl"), GREEDY,
                                  {"read_chunk_rows": 5}, ModelOptions(str(model), None, "bfloat16"))
    output.mkdir()
    raydata.write_json(str(output / raydata.SUCCESS), {"nllb": 1, "job": before})
    assert ray_job().already
    rewrite_weights(model)
    staging = raydata.staging_path(str(output))
    raydata.prepare_staging(staging, before, False, print)
    with pytest.raises(NllbError, match=rf"^--resume: the interrupted job in .+ differs in model \(model.safetensors in "
                                        rf"{re.escape(str(model))} changed\); run without --resume to start afresh\.$"):
        ray_job()
    raydata.remove_path(staging)
    outcomes = ray_job()
    assert not outcomes.already and outcomes.rows == 20
    result = CliRunner().invoke(cli, ["translate", "-q", "-m", str(model), "--device", "cpu", *DECODE_ARGS, "--src", "en",
                                      "--tgt", "fr", files[0], str(tmp_path / "cli.jsonl")])
    assert result.exit_code == 0, result.output
    assert b"".join(p.read_bytes() for p in parts(output, ".jsonl")) == (tmp_path / "cli.jsonl").read_bytes()


def test_a_job_staged_on_the_cpu_is_not_resumed_on_gpus(tmp_path):
    """Where the actors compute is recorded with the staged parts (--device auto: the cluster's GPUs decide), and
    a resume whose actors would compute elsewhere is refused: the GPU's bf16 rows and the CPU's float32 ones must
    not mix in one output."""
    raydata.record_actors(str(tmp_path), "cpu")
    raydata.record_actors(str(tmp_path), "cpu")  # resumed where it ran
    with pytest.raises(NllbError, match=r"^--resume: the interrupted job's actors computed on the CPU, and this "
                                        r"cluster's would on GPUs; resume where it ran"):
        raydata.record_actors(str(tmp_path), "cuda")


class Crash(BaseException):
    """A kill at one step of a promotion (a BaseException, as a stop signal's: nothing catches it)."""


def test_a_promotion_stopped_at_any_step_is_finished_by_resume_to_the_same_bytes(tmp_path, monkeypatch):
    """The promotion stopped before each of its steps (each rename or replace of a file, and the staging's removal:
    the points where what is on disk changes) in turn, then --resume: the same OUTPUT, errors file and counts as a
    promotion straight through, with Ray run again only where the plan had not been recorded yet."""
    import shutil

    write_jsonl(tmp_path / "in.jsonl", 30, bad_every=7)
    inputs, output, errors = [str(tmp_path / "in.jsonl")], tmp_path / "out", tmp_path / "errors.jsonl"
    staging, kept = tmp_path / ".out.nllb-staging", tmp_path / "kept-staging"
    previous = {"nllb": 1, "job": {"an": "earlier job"}}  # a finished OUTPUT of another job, which this one replaces

    def earlier_output():
        shutil.rmtree(output, ignore_errors=True)
        output.mkdir()
        (output / "part-00000-000000000001.jsonl").write_text("{}\n")
        (output / "_SUCCESS").write_text(json.dumps(previous))

    promote = raydata.promote

    def keep_staging(*args):
        shutil.copytree(staging, kept, symlinks=True)
        return promote(*args)

    events = []  # renames onto OUTPUT, and the directories whose entries were made durable (fsynced), in order
    fsync, rename = os.fsync, os.rename

    def recorded_fsync(fd):
        if os.path.isdir(path := os.readlink(f"/proc/self/fd/{fd}")):
            events.append(("synced", path))
        return fsync(fd)

    def recorded_rename(source, target, *args, **kwargs):
        rename(source, target, *args, **kwargs)
        events.append(("renamed", str(target)))

    earlier_output()
    with monkeypatch.context() as patch:
        patch.setattr(raydata, "promote", keep_staging)
        patch.setattr(os, "fsync", recorded_fsync)
        patch.setattr(os, "rename", recorded_rename)
        straight = translate(tmp_path, inputs, output, chunk_rows=10, on_error="record", errors=str(errors))
    last_rename = max(n for n, event in enumerate(events) if event == ("renamed", str(output)))
    assert ("synced", str(tmp_path)) in events[last_rename:]  # OUTPUT's directory, once OUTPUT is renamed into it
    expected = {p.name: p.read_bytes() for p in output.iterdir()}, errors.read_bytes()
    assert (straight.rows, straight.failed) == (30, 4) and len(expected[0]) > 2 and len(expected[1].splitlines()) == 4

    steps = []

    def step(function):
        def counted(*args, **kwargs):
            if str(args[0]).startswith(str(tmp_path)):
                steps.append(str(args[0]))
                if len(steps) == crash_at:
                    raise Crash()
            return function(*args, **kwargs)
        return counted

    crash_at, crashed = 0, True
    while crashed:
        crash_at += 1
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(kept, staging, symlinks=True)
        earlier_output()
        errors.unlink(missing_ok=True)
        steps.clear()
        job = Job(src="eng_Latn", tgt="fra_Latn", on_error="record", errors=str(errors))
        errors_file = raydata.open_errors(job)
        with monkeypatch.context() as patch:
            for name in ("rename", "replace"):
                patch.setattr(os, name, step(getattr(os, name)))
            patch.setattr(shutil, "rmtree", step(shutil.rmtree))
            try:
                raydata.promote(str(staging), str(output), inputs, job, json.loads((staging / "job.json").read_text()),
                                errors_file, print)
                crashed = False
            except Crash:
                errors_file.close()  # as the process's end closes it (a kill leaves its partial file)
        if crashed:
            resumed = translate(tmp_path, inputs, output, chunk_rows=10, on_error="record", errors=str(errors),
                                resume=True)
            assert resumed.already or (resumed.rows, resumed.failed) == (30, 4), crash_at
        assert ({p.name: p.read_bytes() for p in output.iterdir()}, errors.read_bytes()) == expected, crash_at
        assert not staging.exists() and not list(tmp_path.glob(".errors.jsonl.nllb-partial"))
    assert crash_at > 8  # the plan, the parts, the errors parts, the errors file, _SUCCESS, OUTPUT, the staging


@pytest.mark.parametrize("args, message", [
    (["--devices", "cpu:2"], "--devices and --ray cannot be used together"),
    (["-"], "--ray reads files and writes a directory"),
    (["--device", "cuda:1"], "the actors take auto, cpu or cuda"),
])
def test_usage_errors_are_one_line_before_ray_starts(tmp_path, args, message):
    write_jsonl(tmp_path / "in.jsonl", 3)
    inputs = [] if args == ["-"] else [str(tmp_path / "in.jsonl")]
    code, said = run(tmp_path, inputs + (args if args == ["-"] else []), tmp_path / "out", *([] if args == ["-"] else args))
    assert code == 2 and message in said and "Traceback" not in said


def test_names_that_are_not_utf8_are_refused_in_one_line_or_recorded(tmp_path):
    """Ray Data reads and writes through pyarrow, which takes UTF-8 names only: an input or OUTPUT named otherwise
    is refused before Ray starts. The job's record holds such a name (a model's directory) as the command's state
    does, and reads it back the same."""
    source = tmp_path / os.fsdecode(b"in\xff.jsonl")
    write_jsonl(source, 3)
    write_jsonl(tmp_path / "in.jsonl", 3)
    for inputs, output in (([str(source)], tmp_path / "out"), ([str(tmp_path / "in.jsonl")], tmp_path / os.fsdecode(b"out\xfe"))):
        code, said = run(tmp_path, inputs, output)
        named = str(source if output.name == "out" else output).encode("utf-8", "backslashreplace").decode()  # as stderr writes it
        assert code == 1 and said == (f"Error: {named}: --ray reads and writes files by UTF-8 names (through pyarrow), "
                                      "and this path is not UTF-8: rename it, or translate without --ray.\n")
    staging, identity = str(tmp_path / ".out.nllb-staging"), {"model": {"path": os.fsdecode(b"/models/m\xf1")}}
    raydata.prepare_staging(staging, identity, False, print)
    raydata.prepare_staging(staging, identity, True, print)  # the same job: continued


@pytest.mark.parametrize("actors, message", [
    ("5", "--ray-actors 5: the Ray cluster has 4 CPU(s), one an actor."),
    ("99999999999999999999", "--ray-actors 99999999999999999999: the Ray cluster has 4 CPU(s), one an actor."),
])
def test_more_actors_than_the_cluster_has_cpus_are_refused(tmp_path, actors, message):
    write_jsonl(tmp_path / "in.jsonl", 3)
    code, said = run(tmp_path, [str(tmp_path / "in.jsonl")], tmp_path / "out", "--device", "cpu", "--ray-actors", actors)
    assert code == 1 and said == f"Error: {message}\n"


def test_outputs_nllb_did_not_write_are_refused(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", 3)
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "data.csv").write_text("a,b\n")
    code, said = run(tmp_path, [str(tmp_path / "in.jsonl")], tmp_path / "theirs")
    assert code == 1 and "nllb did not write: refusing to replace it" in said
    (tmp_path / "file").write_text("x")
    code, said = run(tmp_path, [str(tmp_path / "in.jsonl")], tmp_path / "file")
    assert code == 1 and "is a file, and --ray writes a directory" in said
    code, said = run(tmp_path, [str(tmp_path / "nothing-*.jsonl")], tmp_path / "out")
    assert code == 1 and "the pattern matches no file" in said
    code, said = run(tmp_path, [str(tmp_path / "in.jsonl")], tmp_path / "out", "--errors", str(tmp_path / "out" / "bad.jsonl"))
    assert code == 1 and "lies in OUTPUT" in said and not (tmp_path / "out").exists()
    (tmp_path / "in.txt").write_text("Hello.\n")
    code, said = run(tmp_path, [str(tmp_path / "in.txt")], tmp_path / "out")
    assert code == 1 and "--ray reads JSONL and Parquet, not text" in said


def command_said(tmp_path: Path, source: Path, *args: str) -> str:
    """What the command without --ray says of one input."""
    return CliRunner().invoke(cli, ["translate", "-m", SAMPLE, *DECODE_ARGS, "--src", "en", "--tgt", "fr", "--progress",
                                    "none", *args, str(source), str(tmp_path / "command.jsonl")]).output


def test_inputs_and_the_errors_file_are_refused_before_any_work_as_the_command_refuses_them(tmp_path):
    """An input in a directory that cannot be read (a dangling link, a FIFO) or whose bytes are not the
    compression its name says, or a Parquet input with a column the translation would replace, and an errors file
    that cannot be written or is an input: one line that names the
    file and the reason (the command's, where the command reads such a file), before Ray runs and anything is
    staged."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_jsonl(inputs / "a.jsonl", 3)
    link, staging = inputs / "b.jsonl", tmp_path / ".out.nllb-staging"
    link.symlink_to(tmp_path / "gone.jsonl")
    assert run(tmp_path, [str(inputs)], tmp_path / "out") == (1, f"Error: cannot read {link}: No such file or directory.\n")
    link.unlink()
    os.mkfifo(link)
    assert run(tmp_path, [str(inputs)], tmp_path / "out") == (
        1, f"Error: cannot read {link}: it is not a regular file, and --ray reads files.\n")
    link.unlink()
    plain = inputs / "b.jsonl.gz"  # named as gzip-compressed, and it is not
    plain.write_text('{"text": "Hello."}\n')
    said = command_said(tmp_path, plain)
    assert said.startswith(f"Error: INPUT {plain} is named as gzip-compressed, but its first bytes are 7b 22 74 65")
    assert run(tmp_path, [str(inputs)], tmp_path / "out") == (1, said)
    plain.unlink()
    missing, given = tmp_path / "nodir" / "bad.jsonl", inputs / "a.jsonl"
    for errors, reason in ((missing, f"cannot write {missing}: No such file or directory."),
                           (given, f"--errors {given} is the input file {given}: refusing to write over the input.")):
        assert command_said(tmp_path, given, "--errors", str(errors)) == f"Error: {reason}\n"
        assert run(tmp_path, [str(inputs)], tmp_path / "out", "--errors", str(errors)) == (1, f"Error: {reason}\n")
    adapter = tmp_path / "no-adapter"
    said = command_said(tmp_path, given, "--adapter", str(adapter))
    assert said == f"Error: --adapter {adapter}: not a directory (expected adapter_config.json and adapter_model.safetensors)\n"
    assert run(tmp_path, [str(inputs)], tmp_path / "out", "--adapter", str(adapter)) == (1, said)
    translated = tmp_path / "translated.parquet"  # a column the translation would replace, without --overwrite-field
    pq.write_table(pa.table({"text": ["Hello."], "translation": ["kept"]}), translated)
    said = command_said(tmp_path, translated)
    assert said.startswith(f"Error: {translated}: it has a column 'translation' already, which --output-field would")
    assert run(tmp_path, [str(translated)], tmp_path / "out") == (1, said)
    assert not staging.exists() and not (tmp_path / "out").exists()


def unloadable():
    raise NllbError("the model does not load on this actor.")


def test_a_model_that_does_not_load_on_an_actor_is_the_jobs_one_line(tmp_path):
    """An actor whose model does not load (its constructor raised: Ray keeps only the text of that) fails each
    block with the error that says why, and the job's error is that line."""
    write_jsonl(tmp_path / "in.jsonl", 3)
    with pytest.raises(NllbError, match=r"^the model does not load on this actor \(the rows written so far are kept"):
        translate(tmp_path, [str(tmp_path / "in.jsonl")], tmp_path / "out", load=unloadable)


def test_an_input_that_fails_in_its_read_task_is_named_as_the_command_names_it(tmp_path):
    """A cut gzip file fails once a read task reaches its end: the job's line names it and says why, as the
    command's does, and keeps what was written for --resume."""
    write_jsonl(tmp_path / "in.jsonl", 200)
    whole = gzip.compress((tmp_path / "in.jsonl").read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[:len(whole) // 2])
    said = command_said(tmp_path, cut)
    assert said.startswith(f"Error: cannot read {cut}: Compressed file ended before the end-of-stream marker was ")
    assert run(tmp_path, [str(cut)], tmp_path / "out", "--chunk-rows", "8") == (
        1, said.removesuffix(".\n") + " (the rows written so far are kept: run the same command with --resume to continue)\n")


def test_a_part_that_cannot_be_written_is_named_with_the_reason(tmp_path):
    (tmp_path / "data").write_text("")  # where the parts go is a file
    with pytest.raises(NllbError, match=rf"^cannot write {tmp_path}/data/u_000000-00000-000000000001-1.jsonl: Not a "
                                        r"directory\.$"):
        write_task(tmp_path, 0, [(0, 1, 0, None)], 5)


def test_a_stop_signal_while_ray_starts_stops_the_job_as_the_command_stops(tmp_path, monkeypatch):
    """ray.init sets a SIGTERM handler of its own while it starts Ray (it exits with 15): a SIGTERM then ends the
    job as one later does, with 143 and the command's line; and the job's handlers are in force again after it."""
    import nllbcli.job.signals as signals

    def init_stopped(**kwargs):
        sys.exit(signal.SIGTERM)  # what ray.init's handler does

    shutdowns = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # the module's Ray stands for none
    monkeypatch.setattr(ray, "init", init_stopped)
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(signal.getsignal(signal.SIGTERM)))
    write_jsonl(tmp_path / "in.jsonl", 3)
    code, said = run(tmp_path, [str(tmp_path / "in.jsonl")], tmp_path / "out", "--ray-address", "local")
    assert (code, said) == (143, "Stopped by SIGTERM before any rows were saved; nothing was written.\n")
    assert len(shutdowns) == 1  # what ray.init had started is ended
    assert signal.getsignal(signal.SIGTERM) is not signals._handle  # the job's handlers end with it


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nllb_ray(cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """`nllb translate --ray` run as a user runs it: no address, Ray found (or started) by the command."""
    env = {k: v for k, v in env.items() if k not in ("RAY_ADDRESS", "RAY_BACKEND_LOG_LEVEL")}
    return subprocess.run([sys.executable, "-m", "nllbcli", "translate", "-m", SAMPLE, *DECODE_ARGS, "--src", "en",
                           "--tgt", "fr", "--chunk-rows", "8", "--ray", "in.jsonl", "out"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def ray_tmpdir():
    """A Ray temporary directory of the test's own (where `ray start` records its cluster), short enough for
    Ray's socket paths."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="nllb-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_job_joins_the_ray_that_ray_start_runs_here(tmp_path, ray_tmpdir):
    write_jsonl(tmp_path / "in.jsonl", 3)  # one block for three actors, which Ray Data warns of
    env = dict(os.environ, RAY_TMPDIR=ray_tmpdir)
    head = subprocess.Popen([sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())",
                             "start", "--head", "--block", f"--port={free_port()}", "--num-cpus=4", "--num-gpus=3",
                             "--include-dashboard=false", "--disable-usage-stats"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for line in head.stdout:
            if "block forever" in line:
                break
        result = nllb_ray(tmp_path, env)
    finally:  # the cluster, every process of it in the session of `ray start` (its own end takes half a minute)
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
    deadline = time.monotonic() + 10
    while session_processes(head.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not session_processes(head.pid)
    assert result.returncode == 0, result.stderr
    [done] = result.stderr.splitlines()  # the summary, and no line of Ray's
    assert done.startswith("Done: 3 rows into ") and " (3 translated, 0 failed, " in done
    assert " on 1 Ray actor (GPU " in done  # that Ray's: one the job starts has none


def test_the_record_of_a_ray_that_has_stopped_is_not_followed(tmp_path, ray_tmpdir):
    write_jsonl(tmp_path / "in.jsonl", 30)
    os.makedirs(os.path.join(ray_tmpdir, "ray"))
    with open(os.path.join(ray_tmpdir, "ray", "ray_current_cluster"), "w") as record:  # as a killed `ray start` leaves
        record.write(f"127.0.0.1:{free_port()}")
    result = nllb_ray(tmp_path, dict(os.environ, RAY_TMPDIR=ray_tmpdir))
    assert result.returncode == 0, result.stderr
    assert b"".join(p.read_bytes() for p in parts(tmp_path / "out", ".jsonl")) == cli_output(
        tmp_path, tmp_path / "in.jsonl", "--on-error", "skip")[0]


def session_processes(session: int) -> list[str]:
    """The processes of a session (ended ones that their parent has not reaped aside): a command started in a
    session of its own, and every process of the Ray it starts."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                name, fields = stat.read().rsplit(b")", 1)
        except OSError:
            continue
        state, _, _, sid = fields.split()[:4]
        if int(sid) == session and state != b"Z":
            found.append(name.split(b"(", 1)[1].decode())
    return found


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_job_stopped_or_killed_ends_the_ray_it_started(tmp_path, ray_tmpdir, signum):
    """SIGTERM mid-job: exit 143 with the command's line, no stack dump of Ray's; SIGTERM or kill -9, no process
    of the Ray the job started is left half a minute later (its agents would stay a minute after a kill -9)."""
    write_jsonl(tmp_path / "in.jsonl", 60)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_BACKEND_LOG_LEVEL")}
    process = subprocess.Popen([sys.executable, "-m", "nllbcli", "translate", "-m", SAMPLE, *DECODE_ARGS, "--src", "en",
                                "--tgt", "fr", "-q", "--chunk-rows", "4", "--ray", "in.jsonl", "out"], cwd=tmp_path,
                               env=dict(env, RAY_TMPDIR=ray_tmpdir), stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    staged = tmp_path / ".out.nllb-staging" / "data"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (staged.is_dir() and any(staged.iterdir())):
        time.sleep(0.05)
    os.kill(process.pid, signum)
    said = process.communicate(timeout=60)[1]
    if signum == signal.SIGTERM:
        assert process.returncode == 143
        assert said == "Stopped by SIGTERM: the rows done so far are saved; run the same command with --resume to continue.\n"
    else:
        assert process.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 30  # seconds on a loaded machine, where Ray's processes take long to end
    while session_processes(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert session_processes(process.pid) == []


@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}"])
def test_a_cluster_that_does_not_answer_is_one_line_not_a_wait(tmp_path, ray_tmpdir, address):
    write_jsonl(tmp_path / "in.jsonl", 3)
    port = free_port()
    result = subprocess.run([sys.executable, "-m", "nllbcli", "translate", "-m", SAMPLE, "--src", "en", "--tgt", "fr",
                             "--ray", "--ray-address", address.format(port=port), "in.jsonl", "out"], cwd=tmp_path,
                            env=dict(os.environ, RAY_TMPDIR=ray_tmpdir), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: Ray cluster {address.format(port=port)}: nothing answers at ")
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_an_actor_whose_gpu_computes_otherwise_than_the_job_is_one_line(monkeypatch):
    """--compute-type auto for a model stored in FP8: the job's identity says float8 (its GPUs are not probed before
    Ray starts), and an actor given a GPU without FP8, which would compute in bfloat16, stops the job in one line
    instead of writing other bytes for its blocks."""
    import nllbcli.model.translator as translator_module

    def on_a_gpu(model, device, adapter, compute_type, kv_cache_type):
        loaded = load_translator(model, "cpu", adapter, kv_cache_type=kv_cache_type)
        if device != "cpu":
            loaded.device, loaded.compute_type = "cuda:0", "bfloat16"
        return loaded

    monkeypatch.setattr(translator_module, "load_translator", on_a_gpu)
    host = socket.gethostname()

    def identity(compute_type: str) -> dict:
        return identity_of(Job(src="eng_Latn", tgt="fra_Latn"), GREEDY, {}, ModelOptions(SAMPLE, None, compute_type))

    with pytest.raises(NllbError, match=r"^the Ray actor on cuda:0 of .+ computes in bfloat16, and the job in float8: "
                                        r"give --compute-type bfloat16, or only devices with FP8 \(Hopper GPUs\)\.$"):
        raydata.load_on_actor(ModelOptions(SAMPLE), None, identity("float8"), host)
    assert raydata.load_on_actor(ModelOptions(SAMPLE), None, identity("bfloat16"), host).compute_type == "bfloat16"
    cpu = ModelOptions(SAMPLE, device="cpu")
    assert raydata.load_on_actor(cpu, 1, identity("float8"), host).device == "cpu"  # the CPU computes in float32


def test_an_actor_whose_model_files_differ_from_the_drivers_is_one_line(tmp_path):
    """The job's identity names the model's files as the driver saw them; an actor that loads other files (weights
    written anew since, a node's copy of another content) stops the job, while a node's copy that differs only in
    its files' times is the same model."""
    model = tmp_path / "model"
    shutil.copytree(SAMPLE, model)  # weights over checkpoint.HASHED_BYTES: known by their size and time
    identity = identity_of(Job(src="eng_Latn", tgt="fra_Latn"), GREEDY, {}, ModelOptions(str(model), None, "bfloat16"))
    os.utime(model / "model.safetensors", ns=(1, 1))
    here, elsewhere, cpu = socket.gethostname(), "another-host", ModelOptions(str(model), device="cpu")
    assert raydata.load_on_actor(cpu, 1, identity, elsewhere).device == "cpu"
    with pytest.raises(NllbError, match=r"^the Ray actor on cpu of .+ has another model than the job: "
                                        r"model\.safetensors in .+ changed: its files changed after it loaded them"):
        raydata.load_on_actor(cpu, 1, identity, here)
    with open(model / "generation_config.json", "a") as f:
        f.write(" ")
    with pytest.raises(NllbError, match=r"generation_config\.json in .+ changed"):
        raydata.load_on_actor(cpu, 1, identity, elsewhere)


def test_a_users_own_dataset_goes_through_map_batches_as_translate_table_gives_it():
    """nllbcli.ray_data.BatchTranslator over a Dataset of the user's: every row once, each as translate_table gives
    it (a row that fails keeps its place with its reason); a misspelt option is one line."""
    from nllbcli import api
    from nllbcli.ray_data import BatchTranslator

    table = pa.table({"id": list(range(30)), "text": [f"My sister bought {n} red cars." for n in range(29)] + [None]})
    options = {"model": SAMPLE, "device": "cpu", "src": "en", "tgt": "fr", "decode": GREEDY, "status_field": "status"}
    dataset = ray.data.from_arrow(table).map_batches(BatchTranslator, fn_constructor_kwargs=options, batch_size=10,
                                                     batch_format="pyarrow", concurrency=1)
    out = pa.concat_tables(list(dataset.iter_batches(batch_format="pyarrow", batch_size=None))).sort_by("id")
    expected = api.translate_table(load_translator(SAMPLE, "cpu"), table, "en", "fr", GREEDY, status_field="status")
    assert out.drop_columns(["error"]).equals(expected.drop_columns(["error"]))
    assert out.column("error").to_pylist()[-1] == "the table: row 10: field 'text' is null, not a string."  # its batch's
    with pytest.raises(ValueError, match="^BatchTranslator takes translate_table's keyword arguments, and .*'colour'"):
        BatchTranslator(SAMPLE, colour="red")
