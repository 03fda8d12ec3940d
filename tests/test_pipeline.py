import io
import json
import re
import sys
import time

import pytest
from rich.console import Console

from nllbcli.errors import NllbError
from nllbcli.io import Record
from nllbcli.options import GPU_BATCHING, BatchOptions, DecodeOptions
from nllbcli.job.chunks import ChunkWorker, plan_batches
from nllbcli.options import Job
from nllbcli.job.reader import read_chunks
from nllbcli.job.rows import cut_source
from nllbcli.job.progress import Counters, Reporter

JOB = Job("eng_Latn", "fra_Latn")
WHOLE = Job("eng_Latn", "fra_Latn", split=False)


def translations(outcomes):
    return [o.translation for o in outcomes]


def test_plan_batches_sorts_longest_first_within_the_budget():
    lengths = {0: 3, 1: 10, 2: 4, 3: 4, 4: 2, 5: 9}
    assert plan_batches(lengths, 20) == [[1, 5], [2, 3, 0, 4]]
    assert plan_batches(lengths, 8) == [[1], [5], [2, 3], [0, 4]]  # rows longer than the budget go alone


def test_batch_defaults_follow_the_device():
    """A GPU batches thousands of sentences at once; the CPU the small default; a given value always wins."""
    assert BatchOptions.for_device("cpu") == BatchOptions()
    assert BatchOptions.for_device("cuda:1") == GPU_BATCHING
    assert GPU_BATCHING.max_batch_tokens >= 4096 * 64 and GPU_BATCHING.read_chunk_rows >= 4096
    assert BatchOptions.for_device("cuda:0", 100, None) == BatchOptions(100, GPU_BATCHING.read_chunk_rows)
    assert BatchOptions.for_device("cpu", None, 7) == BatchOptions(BatchOptions().max_batch_tokens, 7)


def test_plan_batches_keeps_within_the_sentences_too():
    lengths = {0: 3, 1: 9, 2: 5, 3: 4, 4: 2, 5: 8}
    assert plan_batches(lengths, 20, 1) == [[1], [5], [2], [3], [0], [4]]
    assert plan_batches(lengths, 100, 4) == [[1, 5, 2, 3], [0, 4]]
    assert plan_batches(lengths, 20, 3) == [[1, 5], [2, 3, 0], [4]]  # the tokens cut first, then the sentences
    assert BatchOptions.for_device("cuda:0", None, None, 64) == BatchOptions(GPU_BATCHING.max_batch_tokens, GPU_BATCHING.read_chunk_rows, 64)


def test_plan_batches_of_nothing():
    assert plan_batches({}, 100) == []


def test_cut_source_keeps_language_token_and_eos():
    ids = [500, 10, 11, 12, 13, 2]
    assert cut_source(ids, 6) == ids
    assert cut_source(ids, 4) == [500, 10, 11, 2]


def test_the_chunk_worker_restores_input_order(fake):
    translator = fake
    texts = ["a" * (i % 7) + str(i) for i in range(50)]
    records = [Record(i, t, {}) for i, t in enumerate(texts)]
    assert translations(ChunkWorker(translator, JOB, DecodeOptions(), BatchOptions(max_batch_tokens=40))(records)) == [t[::-1] for t in texts]
    assert [len(batch[0]) for batch in translator.batches] == sorted((len(b[0]) for b in translator.batches), reverse=True)


def test_the_chunk_worker_leaves_empty_texts_to_itself(fake):
    translator = fake
    done = []
    records = [Record(0, "", {}), Record(1, "ab", {}), Record(2, " \t", {})]
    result = ChunkWorker(translator, JOB, DecodeOptions(), BatchOptions(max_batch_tokens=100))(records, lambda rows, tokens: done.append((rows, tokens)))
    assert translations(result) == ["", "ba", ""]
    assert translator.batches == [[[translator.tokenizer.lang_id("eng_Latn"), ord("a"), ord("b"), 2]]]
    assert done == [(2, 0), (1, 2)]


def test_the_chunk_worker_cuts_long_sources_and_flags_the_row(fake):
    translator = fake
    translator.config.max_position_embeddings = 4
    [outcome] = ChunkWorker(translator, JOB, DecodeOptions(), BatchOptions(max_batch_tokens=100))([Record(0, "abcdef", {})])
    assert (outcome.translation, outcome.cut) == ("ba", True)
    assert translator.batches == [[[translator.tokenizer.lang_id("eng_Latn"), ord("a"), ord("b"), 2]]]


def test_rows_are_translated_sentence_by_sentence_and_joined(fake):
    records = [Record(0, "Ab cd. Ef gh?  Ij!\nKl", {}), Record(1, "甲乙。丙丁！", {})]
    result = ChunkWorker(fake, JOB, DecodeOptions(), BatchOptions(max_batch_tokens=100))(records)
    assert translations(result) == [".dc bA ?hg fE  !jI\nlK", "。乙甲 ！丁丙"]  # French takes a space where Chinese had none
    assert sorted(len(s) - 2 for batch in fake.batches for s in batch) == [2, 3, 3, 3, 6, 6]
    assert translations(ChunkWorker(fake, WHOLE, DecodeOptions(), BatchOptions(max_batch_tokens=100))(records)) == [records[0].text[::-1], records[1].text[::-1]]


def test_sentences_joined_without_spaces_for_chinese(fake):
    records = [Record(0, "Ab. Cd.", {"tgt_lang": "zho_Hans"})]
    fake.tokenizer.lang_codes = ["deu_Latn", "eng_Latn", "fra_Latn", "zho_Hans"]
    assert translations(ChunkWorker(fake, JOB, DecodeOptions(), BatchOptions(max_batch_tokens=100))(records)) == [".bA.dC"]


def test_max_length_flag(fake):
    records = [Record(0, "abcd", {}), Record(1, "ab", {})]
    result = ChunkWorker(fake, JOB, DecodeOptions(max_length=5), BatchOptions(max_batch_tokens=100))(records)
    assert [o.max_length for o in result] == [True, False]  # 4 tokens after the language token: the limit


def test_per_row_languages(fake):
    records = [
        Record(0, "ab", {"src_lang": "fr", "tgt_lang": "de"}, where="in:1"),
        Record(1, "cd", {"tgt_lang": "deu_Latn"}, where="in:2"),
        Record(2, "ef", {"src_lang": None}, where="in:3"),
    ]
    result = ChunkWorker(fake, JOB, DecodeOptions(), BatchOptions(max_batch_tokens=100))(records)
    assert translations(result) == ["ba", "dc", "fe"]
    assert fake.languages == [["deu_Latn", "deu_Latn", "fra_Latn"]]  # one batch, mixing target languages
    sources = {tuple(s) for batch in fake.batches for s in batch}
    eng, fra = fake.tokenizer.lang_id("eng_Latn"), fake.tokenizer.lang_id("fra_Latn")
    assert (fra, ord("a"), ord("b"), 2) in sources and (eng, ord("c"), ord("d"), 2) in sources


@pytest.mark.parametrize(
    "fields,error",
    [
        ({"tgt_lang": "klingon"}, "in:1: field 'tgt_lang': unknown language code 'klingon'"),
        ({"src_lang": 5}, "in:1: field 'src_lang' is int, not a language code."),
        ({"tgt_lang": "en-Cyrl"}, "in:1: field 'tgt_lang': language code 'en-Cyrl' asks for eng in Cyrl script"),
    ],
)
def test_bad_row_languages_fail_the_row(fake, fields, error):
    records = [Record(0, "ab", fields, where="in:1"), Record(1, "cd", {}, where="in:2")]
    result = ChunkWorker(fake, Job("eng_Latn", "fra_Latn", on_error="skip"), DecodeOptions(), BatchOptions(max_batch_tokens=100))(records)
    assert result[0].translation is None and result[0].error.startswith(error)
    assert result[1].translation == "dc"
    with pytest.raises(NllbError, match="^" + error[:20]):
        ChunkWorker(fake, JOB, DecodeOptions(), BatchOptions(max_batch_tokens=100))(records)


def test_missing_languages_without_defaults(fake):
    records = [Record(0, "ab", {"src_lang": "en"}, where="in:1"), Record(1, "cd", {"src_lang": "en", "tgt_lang": "fr"}, where="in:2")]
    result = ChunkWorker(fake, Job(None, None, on_error="skip"), DecodeOptions(), BatchOptions(max_batch_tokens=100))(records)
    assert result[0].error == "in:1: no 'tgt_lang' field and no --tgt to fall back on."
    assert result[1].translation == "dc"


def test_tokenizer_failure_fails_the_row(fake):
    records = [Record(0, "a\u2603b", {}, where="in:1"), Record(1, "cd", {}, where="in:2")]
    fake.tokenizer.reject = "\u2603"
    result = ChunkWorker(fake, Job("eng_Latn", "fra_Latn", on_error="skip"), DecodeOptions(), BatchOptions(max_batch_tokens=100))(records)
    assert result[0].error == "in:1: the tokenizer cannot take this text: 'utf-8' codec can't encode character '\\x61' in position 0: surrogates not allowed"
    assert result[1].translation == "dc"


def test_a_lone_surrogate_fails_its_row_before_the_tokenizer(fake):
    records = [Record(0, "ab \udc80", {}, where="in:1"), Record(1, "cd", {}, where="in:2")]
    result = ChunkWorker(fake, Job("eng_Latn", "fra_Latn", on_error="skip"), DecodeOptions(), BatchOptions(max_batch_tokens=100))(records)
    assert result[0].error == "in:1: field 'text' holds a lone surrogate (\\udc80 at character 4), half of a UTF-16 pair, which is not text."
    assert result[1].translation == "dc"


def test_read_chunks_with_a_smaller_first_chunk():
    assert [len(c) for c in read_chunks(iter(range(10)), 4, first=1)] == [1, 4, 4, 1]


def test_read_chunks():
    assert [len(chunk) for chunk in read_chunks(iter(range(7)), 3)] == [3, 3, 1]


def test_progress_bar_on_a_terminal():
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=120)
    reporter = Reporter("bar", 10, console=console, stream=io.StringIO())
    reporter.advance(4, 100)
    reporter.advance(6, 50)
    reporter.close(summary=False)
    assert "10/10" in stream.getvalue() and "tokens/s" in stream.getvalue() and "rows" in stream.getvalue()


def test_progress_none_writes_only_the_summary():
    stream = io.StringIO()
    reporter = Reporter("none", None, stream=stream)
    reporter.counters.rows, reporter.counters.translated, reporter.counters.failed = 3, 2, 1
    reporter.counters.tokens = 40  # the committed rows' (commit_rows counts them)
    reporter.advance(3, 50)  # rows and tokens as the model finishes them: the bar's
    reporter.close()
    assert stream.getvalue().startswith("Done: 3 rows (2 translated, 1 failed, 0 flagged: 0 cut to fit the model, 0 stopped at --max-length), 0 sentences, 40 tokens in ")
    assert stream.getvalue().endswith(" rows/s, 0 tokens/s.\n") or "tokens/s." in stream.getvalue()
    assert stream.getvalue().count("\n") == 1


def test_progress_json_lines(monkeypatch):
    """A progress line: rows done (committed or not), the committed rows' counters (which agree with each other:
    rows = translated + failed), and this run's rows/s and time left."""
    clock = [100.0]
    monkeypatch.setattr("nllbcli.job.progress.time.monotonic", lambda: clock[0])
    monkeypatch.setattr("nllbcli.job.progress.JSON_INTERVAL", 3600)  # the timer's lines: test_cli's
    stream = io.StringIO()
    reporter = Reporter("json", 20, Counters(rows=5, translated=4, failed=1, tokens=10, seconds=2.0), stream=stream,
                        output="out.jsonl", where="the CPU")
    clock[0] += 4
    reporter.advance(2, 10)  # two more rows translated, not yet committed
    reporter.emit("progress")
    reporter.close()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["progress", "summary"]
    assert lines[0] == {"event": "progress", "done": 7, "rows": 5, "translated": 4, "failed": 1, "cut": 0,
                        "max_length": 0, "flagged": 0, "repetition": 0, "wrong_language": 0, "length_ratio": 0,
                        "low_score": 0, "copy": 0, "retried": 0, "sentences": 0, "tokens": 10, "seconds": 6.0,
                        "rows_per_s": 0.5, "tokens_per_s": 1.7, "eta_s": 26.0, "total": 20}  # the counters: committed
    assert lines[1]["rows"] == 5 and "done" not in lines[1]
    assert (lines[1]["output"], lines[1]["where"]) == ("out.jsonl", "the CPU")


def rendered_lines(stream: io.StringIO) -> list[str]:
    """What a terminal shows of a rich console's output, line by line: cursor moves and colours taken out."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())
    return [line for line in re.split(r"[\r\n]", text) if line.strip()]


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("total", [3_000, 3_000_000])
def test_progress_bar_names_the_job_and_fits_the_width(width, total):
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=width)
    reporter = Reporter("bar", total, console=console, stream=io.StringIO(), label="in.jsonl: eng_Latn → fra_Latn")
    time.sleep(0.05)
    reporter.advance(total // 3, total * 10)
    reporter.bar.refresh()
    reporter.close(summary=False)
    lines = rendered_lines(stream)
    assert max(len(line) for line in lines) <= width
    assert "in.jsonl: eng_Latn → fra_Latn" in lines
    bar = lines[-1]
    assert re.search(rf"{total // 3:,}/{total:,} rows [\d,.]+k? rows/s [\d,.]+k? tokens/s 0:00:00 ETA 0:00:\d\d$", bar), bar


def test_progress_bar_has_a_time_left_from_the_first_rows():
    """rich's own estimate stays blank until two updates fall within its window; this one needs one row done."""
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=100)
    reporter = Reporter("bar", 100, console=console, stream=io.StringIO())
    reporter.bar.refresh()
    assert rendered_lines(stream)[-1].endswith("ETA -:--:--")
    time.sleep(0.2)
    reporter.advance(1, 30)  # 1 row in 0.2 s: 99 left take ~20 s
    reporter.bar.refresh()
    reporter.close(summary=False)
    assert re.search(r"ETA 0:00:(1\d|2\d)$", rendered_lines(stream)[-1])


@pytest.mark.parametrize("width", [80, 120])
def test_the_summary_wraps_at_words_on_a_terminal(width):
    stream = io.StringIO()
    console = Console(file=io.StringIO(), force_terminal=True, width=width)
    reporter = Reporter("bar", 10, Counters(rows=1_234_567, translated=1_234_000, failed=567, sentences=2_345_678,
                                            tokens=98_765_432), console=console, stream=stream)
    reporter.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) > 1 and max(len(line) for line in lines) <= width
    assert " ".join(lines).startswith("Done: 1,234,567 rows (1,234,000 translated, 567 failed, 0 flagged: 0 cut to fit "
                                      "the model, 0 stopped at --max-length), 2,345,678 sentences, 98,765,432 tokens in ")


def reader_of(rows: int, log: list[int], fail_at: int | None = None):
    """An Input of `rows` rows whose reading is logged, and a prepare that fails on the row numbered fail_at."""
    from nllbcli.io import Input, Position

    position = Position()

    def records():
        for i in range(rows):
            log.append(i)
            position.rows, position.lines, position.offset = i + 1, i + 1, 10 * (i + 1)
            yield Record(i, f"row {i}", {"text": f"row {i}"})

    def prepare(chunk):
        if fail_at is not None and any(r.index == fail_at for r in chunk):
            raise NllbError(f"row {fail_at} is bad")
        return [r.text.upper() for r in chunk]

    return Input(records(), rows, None, position, {}), prepare


def test_chunk_reader_gives_chunks_in_order_with_their_positions():
    from nllbcli.job.reader import ChunkReader

    for ahead in (True, False):
        source, prepare = reader_of(10, [])
        with ChunkReader(source, 4, prepare, ahead=ahead) as reader:
            got = [([r.index for r in chunk], position.rows, position.offset, prepared) for chunk, position, prepared in reader]
        assert got == [([0, 1, 2, 3], 4, 40, ["ROW 0", "ROW 1", "ROW 2", "ROW 3"]),
                       ([4, 5, 6, 7], 8, 80, ["ROW 4", "ROW 5", "ROW 6", "ROW 7"]), ([8, 9], 10, 100, ["ROW 8", "ROW 9"])]
        assert reader.position.rows == 10


def test_chunk_reader_reads_one_chunk_ahead_at_most():
    import time

    from nllbcli.job.reader import ChunkReader

    log: list[int] = []
    source, prepare = reader_of(100, log)
    with ChunkReader(source, 10, prepare) as reader:
        chunks = iter(reader)
        next(chunks)  # the caller works on chunk 0 ...
        time.sleep(0.2)  # ... long enough for the thread to read all it may
        assert max(log) == 19  # chunk 1 is read ahead, chunk 2 is not
        next(chunks)
        time.sleep(0.2)
        assert max(log) == 29
    assert not reader.thread.is_alive()  # leaving stops the thread and waits for it
    assert max(log) <= 39


def test_chunk_reader_shortens_the_switch_interval_while_its_thread_runs():
    import sys

    from nllbcli.job.reader import SWITCH_INTERVAL, ChunkReader

    before = sys.getswitchinterval()
    for ahead, inside in ((True, SWITCH_INTERVAL), (False, before)):
        source, prepare = reader_of(10, [])
        with ChunkReader(source, 4, prepare, ahead=ahead) as reader:
            for _ in reader:
                assert sys.getswitchinterval() == pytest.approx(inside)
        assert sys.getswitchinterval() == before


def test_chunk_reader_raises_an_error_in_its_chunks_turn():
    from nllbcli.job.reader import ChunkReader

    source, prepare = reader_of(30, [], fail_at=25)
    taken = []
    with pytest.raises(NllbError, match="row 25 is bad"), ChunkReader(source, 10, prepare) as reader:
        for chunk, _, _ in reader:
            taken.append(chunk[0].index)
    assert taken == [0, 10]  # the chunks before the bad one come first


def test_finisher_runs_tasks_in_order_and_stops_at_the_first_error():
    """Commits run in order behind the main thread; after a failed task none runs (a later chunk is never
    written after an earlier one failed), and the main thread gets the error once, at its next call."""
    from nllbcli.job.reader import Finisher

    ran = []

    def fail():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"), Finisher() as finisher:
        finisher.submit(lambda: ran.append(1))
        finisher.submit(lambda: ran.append(2), chunk_end=True)
        finisher.submit(fail, chunk_end=True)
        finisher.submit(lambda: ran.append(3), chunk_end=True)
        finisher.wait()  # raises the error, once every chunk end has run or been passed over
    assert ran == [1, 2]


def test_finisher_runs_what_was_submitted_when_the_main_thread_fails():
    """An error on the main thread (a bad row, a stop signal) leaves the block after the finisher has run what
    was submitted before it: the chunks already translated are committed."""
    import threading

    from nllbcli.job.reader import Finisher

    ran, gate = [], threading.Event()
    with pytest.raises(NllbError, match="bad row"), Finisher() as finisher:
        finisher.submit(lambda: (gate.wait(5), ran.append("commit 1")), chunk_end=True)
        finisher.submit(lambda: ran.append("commit 2"), chunk_end=True)
        gate.set()
        raise NllbError("bad row")
    assert ran == ["commit 1", "commit 2"]
    assert not finisher.thread.is_alive()


def test_a_failed_commit_leaves_the_chunks_before_it(fake, tmp_path, monkeypatch):
    """Chunks are written and committed on the finisher thread: when writing chunk 2 fails, chunk 1 stays
    committed (for --resume), and neither chunk 2 nor any later chunk is written."""
    from click.testing import CliRunner

    from nllbcli.job import loop
    from nllbcli.cli import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("".join(f"a{i}\n" for i in range(5000)))
    real, calls = loop.write_chunk, []

    def write_chunk(chunk, *args):
        calls.append(chunk[0].index)
        if len(calls) == 2:
            raise NllbError("out.txt: no space left on the device")
        return real(chunk, *args)

    monkeypatch.setattr(loop, "write_chunk", write_chunk)
    result = CliRunner().invoke(cli, ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn", "--chunk-rows", "2048",
                                      "in.txt", "out.txt"])
    assert result.exit_code == 1 and result.stderr.strip() == "Error: out.txt: no space left on the device"
    assert calls == [0, 2048]
    assert (tmp_path / ".out.txt.nllb-partial").read_text() == "".join(f"{i}"[::-1] + "a\n" for i in range(2048))
    assert json.loads((tmp_path / ".out.txt.nllb-state.json").read_text())["position"]["rows"] == 2048


def test_a_job_restores_the_cyclic_collector(tmp_path):
    """While a job runs the collector is set to collect rarely, and what was alive before it is frozen out of
    its walks; after the job (done or failed) Python's settings are back."""
    import gc

    from nllbcli.job import reader

    before = gc.get_threshold()
    with reader.fewer_collections():
        assert gc.get_threshold() == reader.GC_THRESHOLD
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError):
        with reader.fewer_collections():
            raise RuntimeError("a job that fails")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_job_refuses_error_options_that_do_not_go_together():
    """One check, for the command and the library alike: record needs an errors file, an errors file needs record."""
    with pytest.raises(ValueError, match="--on-error record needs --errors FILE"):
        Job("eng_Latn", "fra_Latn", on_error="record")
    with pytest.raises(ValueError, match="--errors is only written with --on-error record, not skip"):
        Job("eng_Latn", "fra_Latn", on_error="skip", errors="bad.jsonl")
    with pytest.raises(ValueError, match="--on-error is one of fail, skip, record"):
        Job("eng_Latn", "fra_Latn", on_error="ignore")
    assert Job("eng_Latn", "fra_Latn", on_error="record", errors="bad.jsonl").errors == "bad.jsonl"


def test_the_rate_and_time_left_leave_out_the_first_batch_and_follow_the_recent_ones(monkeypatch):
    """A job whose first batch takes 30 s (a GPU compiling its kernels, a model warming up) and whose batches then
    take 1 s for 10 rows: once a second batch is done the rate is 10 rows/s, not 20 rows over 31 s, and the time
    left follows it; a job that slows down shows its recent rate within RATE_WINDOW seconds."""
    from nllbcli.job.progress import RATE_WINDOW

    clock = [100.0]
    monkeypatch.setattr("nllbcli.job.progress.time.monotonic", lambda: clock[0])
    reporter = Reporter("none", 1000, stream=io.StringIO())
    clock[0] += 30
    reporter.advance(10, 100)
    assert reporter.rates() == (10 / 30, 100 / 30)  # one batch: this run's average
    clock[0] += 1
    reporter.advance(10, 100)
    assert reporter.rates() == (10.0, 100.0)
    assert reporter.finish() == clock[0] + 980 / 10
    for _ in range(int(RATE_WINDOW) + 5):  # then a row a second
        clock[0] += 1
        reporter.advance(1, 10)
    assert reporter.rates() == (1.0, 10.0)
    assert reporter.finish() == clock[0] + (1000 - reporter.done) / 1.0


def test_no_gpu_reason_says_why_auto_took_the_cpu(monkeypatch):
    from nllbcli.model.translator import no_gpu_reason

    monkeypatch.setitem(sys.modules, "cupy", None)
    assert no_gpu_reason() == "CuPy is not installed"
