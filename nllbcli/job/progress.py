"""What a job tells on stderr while it runs and when it ends.

`--progress bar` is a rich progress display: a line naming the input and the direction, then the bar, rows
done, rows/s and tokens/s, time elapsed and time left; `json` is one JSON object every `JSON_INTERVAL` seconds
(on a timer thread, whether or not a batch finished meanwhile) for cron logs and pipelines; `none` is silence;
`auto` is the bar when stderr is a terminal (and the translations do not go to that same terminal), else none.
Every job ends with a summary line (a JSON object under `json`) unless --quiet; on a terminal it wraps at word
boundaries to the terminal's width.

Rows count as done when translated (or failed), before their chunk is committed: the bar shows those, and a JSON
line says them as "done" beside the committed rows' counters (rows = translated + failed, their sentences and
tokens). The rates and time left are over the last RATE_WINDOW seconds of finished batches, so that neither the
model's load nor its first batch (a GPU compiles its kernels then) weighs on them once a second batch is done.
The summary names the output, where the job ran, and its rows/s and tokens/s.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import TextIO

PROGRESS_MODES = ("auto", "bar", "json", "none")
JSON_INTERVAL = 5.0  # seconds between two JSON progress lines
RATE_WINDOW = 20.0  # seconds of finished batches the rates and the time left are taken over


@dataclass
class Counters:
    """The job's counters; a resumed job starts from the interrupted one's."""

    rows: int = 0  # rows read and dealt with (written or failed)
    translated: int = 0  # rows written with their translation
    failed: int = 0  # rows left out (or an empty line in text) for an error
    cut: int = 0  # rows with a sentence longer than the model's positions, cut to fit
    max_length: int = 0  # rows with a sentence whose translation stopped at --max-length
    flagged: int = 0  # rows with any flag (cut, max_length, those below), each once
    repetition: int = 0  # rows flagged by the flags the job asks for (job/flags.py), each flag's
    wrong_language: int = 0
    length_ratio: int = 0
    low_score: int = 0
    copy: int = 0
    retried: int = 0  # rows translated again for their flags (--retry-flagged)
    sentences: int = 0  # sentences translated
    tokens: int = 0  # tokens generated
    seconds: float = 0.0  # time spent, over every run of a resumed job

    def as_dict(self) -> dict:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 3)
        data["rows_per_s"] = round(self.rows / self.seconds, 1) if self.seconds > 0 else 0.0
        data["tokens_per_s"] = round(self.tokens / self.seconds, 1) if self.seconds > 0 else 0.0
        return data


class Rate:
    """Rows and tokens a second over the last `window` seconds of samples (each taken as a batch ends)."""

    def __init__(self, window: float = RATE_WINDOW):
        self.window = window
        self.samples: deque[tuple[float, int, int]] = deque()  # (time, rows done, tokens), oldest first

    def add(self, when: float, rows: int, tokens: int) -> None:
        self.samples.append((when, rows, tokens))
        while len(self.samples) > 2 and self.samples[1][0] <= when - self.window:
            self.samples.popleft()  # the oldest kept spans the whole window

    def per_second(self) -> tuple[float, float] | None:
        """(rows/s, tokens/s) between the window's first and last samples; None before two."""
        if len(self.samples) < 2:
            return None
        (start, rows, tokens), (end, last_rows, last_tokens) = self.samples[0], self.samples[-1]
        return ((last_rows - rows) / (end - start), (last_tokens - tokens) / (end - start)) if end > start else None


class Reporter:
    """Counts the job and shows it: `advance` as rows finish, `warn` for skipped rows, `close` for the summary.

    `counters` are the committed rows' (commit.commit_rows counts them, their tokens too; the resume state saves
    them); `done` and `tokens` count rows and tokens as the model finishes them, for display. `label` names the job in the bar (input and direction)."""

    def __init__(self, mode: str = "none", total: int | None = None, counters: Counters | None = None,
                 stream: TextIO | None = None, summary: bool = True, console=None, label: str = "",
                 output: str = "", where: str = "", live: bool = True, finished_as: str = "translated"):
        self.mode, self.total, self.summary = mode, total, summary
        self.output, self.where = output, where  # what the summary names: the output, where the job ran
        self.finished_as = finished_as  # what the summary calls a row done: translated, or scored
        self.counters = counters or Counters()
        self.stream = stream
        self.started = time.monotonic()
        self.seconds_before = self.counters.seconds
        self.done = self.first = self.counters.rows  # rows done (committed or not), and those done before this run
        self.tokens = 0  # tokens generated in this run
        self.rate = Rate()  # from the first batch's end: the time before it (the model's warm-up) is left out
        self.lock = threading.Lock()  # one line at a time on the stream, from the timer and the job's threads
        self.bar = self.task = self.console = self.timer = None
        self.stopped = threading.Event()
        if mode == "bar" and live:  # (not live: the summary alone, of a job that ran elsewhere)
            from rich.console import Console

            self.console = console or Console(file=self.out, stderr=stream is None)
            self.bar = job_progress(self.console, label, total)
            self.bar.start()
            self.task = self.bar.add_task("translate", total=total, completed=self.done, rates=None, finish=None)
        elif mode == "json" and live:
            self.timer = threading.Thread(target=self.emit_every, name="nllb-progress", daemon=True)
            self.timer.start()

    @property
    def out(self) -> TextIO:
        return self.stream or sys.stderr

    def tick(self) -> None:
        self.counters.seconds = self.seconds_before + time.monotonic() - self.started

    def advance(self, rows: int, tokens: int) -> None:
        """`rows` more rows are done (translated or failed), `tokens` more tokens generated."""
        with self.lock:
            self.done += rows
            self.tokens += tokens
            self.rate.add(time.monotonic(), self.done, self.tokens)
        self.tick()
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, rates=self.rates(), finish=self.finish())

    def rates(self) -> tuple[float, float] | None:
        """(rows/s, tokens/s) of this run: over the window (Rate), or from its start while one batch is done."""
        rates = self.rate.per_second()
        if rates is None and self.done > self.first:
            seconds = self.rate.samples[-1][0] - self.started
            rates = ((self.done - self.first) / seconds, self.tokens / seconds) if seconds > 0 else None
        return rates

    def finish(self) -> float | None:
        """When the job's rows will be done at the current rate (time.monotonic's clock); None: not known."""
        rates = self.rates()
        if self.total is None or not rates or rates[0] <= 0:
            return None
        return self.rate.samples[-1][0] + (self.total - self.done) / rates[0]

    def emit_every(self) -> None:
        """A progress line every JSON_INTERVAL seconds until close(); a stream that cannot take one ends it."""
        while not self.stopped.wait(JSON_INTERVAL):
            try:
                self.emit("progress")
            except (OSError, ValueError):  # stderr closed or gone: the job goes on without progress
                return

    def emit(self, event: str) -> None:
        self.tick()
        record = {"event": event, **self.counters.as_dict()}
        if event == "progress":  # the rows the model has finished, committed or not, at this run's recent rate
            rates, finish = self.rates(), self.finish()
            record = {"event": event, "done": self.done, **record,
                      "rows_per_s": round(rates[0], 2) if rates else 0.0}
            if self.total is not None:
                record["eta_s"] = round(max(0.0, finish - time.monotonic()), 1) if finish is not None else None
        if self.total is not None:
            record["total"] = self.total
        if event == "summary":
            record.update({name: value for name, value in (("output", self.output), ("where", self.where)) if value})
        self.write(json.dumps(record))

    def write(self, line: str) -> None:
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()

    def warn(self, message: str) -> None:
        """A line for a skipped row; through the bar's console, so the bar stays whole."""
        if self.bar is not None:
            self.bar.console.print(message, markup=False, highlight=False)
        else:
            self.write(message)

    def width(self) -> int | None:
        """The terminal's width, where the summary goes to one (None: a file or a pipe, one line)."""
        if self.console is not None:
            return self.console.width if self.console.is_terminal else None
        try:
            return shutil.get_terminal_size().columns if self.out.isatty() else None
        except (AttributeError, ValueError, OSError):
            return None

    def close(self, summary: bool | None = None) -> None:
        """Stop the bar or the timer and, unless quiet, print the summary."""
        self.tick()
        if self.timer is not None:
            self.stopped.set()
            self.timer.join()
            self.timer = None
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        if not (self.summary if summary is None else summary):
            return
        if self.mode == "json":
            self.emit("summary")
            return
        c, rates = self.counters, self.counters.as_dict()
        into = f" into {self.output}" if self.output else ""
        where = f" on {self.where}" if self.where else ""
        line = (f"Done: {counted(c.rows, 'row')}{into} ({c.translated:,} {self.finished_as}, {c.failed:,} failed, "
                f"{c.flagged:,} flagged: {c.cut:,} cut to fit the model, {c.max_length:,} stopped at --max-length"
                f"{flag_counts(c)}), "
                f"{counted(c.sentences, 'sentence')}, {counted(c.tokens, 'token')} in {c.seconds:.1f} s{where}: "
                f"{rates['rows_per_s']:,.1f} rows/s, {rates['tokens_per_s']:,.0f} tokens/s.")
        width = self.width()
        self.write(line if width is None else textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False))


def flag_counts(c: Counters) -> str:
    """The summary's counts of the flags a job asks for and of retried rows, those above 0: ", 2 repetition,
    1 retried"."""
    counts = [(name, getattr(c, name)) for name in ("repetition", "wrong_language", "length_ratio", "low_score",
                                                     "copy", "retried")]
    return "".join(f", {count:,} {name}" for name, count in counts if count)


def counted(number: int, noun: str) -> str:
    """"1 row", "2,048 rows"."""
    return f"{number:,} {noun}" if number == 1 else f"{number:,} {noun}s"


def job_progress(console, label: str, total: int | None):
    """The bar: `label` on a line of its own (cut to the width), then bar, rows, rates, elapsed and time left,
    which rich fits to the width by narrowing the bar."""
    from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.table import Column
    from rich.text import Text

    def rate(x: float) -> str:  # at most 5 characters up to 999,999/s: the bar keeps its room on 80 columns
        return f"{x:.1f}" if x < 100 else f"{x:,.0f}" if x < 10_000 else f"{x / 1000:,.0f}k"

    class RateColumn(ProgressColumn):
        """Rows/s and tokens/s over the recent batches (Reporter.rates)."""

        def render(self, task) -> Text:
            rates = task.fields["rates"]
            if not rates:
                return Text("")
            return Text(f"{rate(rates[0])} rows/s {rate(rates[1])} tokens/s", style="progress.data.speed")

    class TimeLeftColumn(ProgressColumn):
        """The time left at the recent rows/s (Reporter.finish), counting down between batches (rich's own
        estimate has none while one batch takes longer than its window)."""

        def render(self, task) -> Text:
            finish = task.fields["finish"]
            if finish is None:
                return Text("ETA -:--:--", style="progress.remaining")
            left = max(0, int(finish - time.monotonic()))
            return Text(f"ETA {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d}", style="progress.remaining")

    class JobProgress(Progress):
        def get_renderables(self):
            if label:
                yield Text(label, no_wrap=True, overflow="ellipsis")
            yield from super().get_renderables()

    line = lambda: Column(no_wrap=True, overflow="ellipsis")  # noqa: E731 - one line, cut where the width ends
    if total is None:
        columns = [SpinnerColumn(table_column=line()), TextColumn("{task.completed:,.0f} rows", table_column=line())]
    else:
        columns = [BarColumn(bar_width=None, table_column=Column(ratio=1, no_wrap=True)),
                   TextColumn("{task.completed:,.0f}/{task.total:,.0f} rows", table_column=line())]
    columns += [RateColumn(table_column=line()), TimeElapsedColumn(table_column=line())]
    if total is not None:
        columns.append(TimeLeftColumn(table_column=line()))
    return JobProgress(*columns, console=console, expand=total is not None)  # the bar takes the width left
