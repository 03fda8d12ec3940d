"""What a job tells on stderr while it runs and when it ends.

`--progress bar` is a rich progress line (rows done, tokens/s, time left); `json` is one JSON object per
`JSON_INTERVAL` seconds for cron logs and pipelines; `none` is silence; `auto` is the bar when stderr is a
terminal (and the translations do not go to that same terminal), else none. Every job ends with a summary line
(a JSON object under `json`) unless --quiet.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import TextIO

PROGRESS_MODES = ("auto", "bar", "json", "none")
JSON_INTERVAL = 5.0  # seconds between two JSON progress lines


@dataclass
class Counters:
    """The job's counters; a resumed job starts from the interrupted one's."""

    rows: int = 0  # rows read and dealt with (written or failed)
    translated: int = 0  # rows written with their translation
    failed: int = 0  # rows left out (or an empty line in text) for an error
    cut: int = 0  # rows with a sentence longer than the model's positions, cut to fit
    max_length: int = 0  # rows with a sentence whose translation stopped at --max-length
    sentences: int = 0  # sentences translated
    tokens: int = 0  # tokens generated
    seconds: float = 0.0  # time spent, over every run of a resumed job

    @property
    def flagged(self) -> int:
        return self.cut + self.max_length

    def as_dict(self) -> dict:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 3)
        data["flagged"] = self.flagged
        data["tokens_per_s"] = round(self.tokens / self.seconds, 1) if self.seconds > 0 else 0.0
        return data


class Reporter:
    """Counts the job and shows it: `advance` as rows finish, `warn` for skipped rows, `close` for the summary."""

    def __init__(self, mode: str = "none", total: int | None = None, counters: Counters | None = None,
                 stream: TextIO | None = None, summary: bool = True, console=None):
        self.mode, self.total, self.summary = mode, total, summary
        self.counters = counters or Counters()
        self.stream = stream
        self.started = time.monotonic()
        self.seconds_before = self.counters.seconds
        self.last_json = self.started
        self.bar = self.task = None
        if mode == "bar":
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            columns = [
                SpinnerColumn() if total is None else BarColumn(),
                MofNCompleteColumn(),
                TextColumn("rows"),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn() if total is None else TimeRemainingColumn(),
            ]
            self.bar = Progress(*columns, console=console or Console(file=self.out, stderr=stream is None))
            self.bar.start()
            self.task = self.bar.add_task("translate", total=total, completed=self.counters.rows, rate="")

    @property
    def out(self) -> TextIO:
        return self.stream or sys.stderr

    def tick(self) -> None:
        self.counters.seconds = self.seconds_before + time.monotonic() - self.started

    def advance(self, rows: int, tokens: int) -> None:
        """`rows` more rows are done (translated or failed), `tokens` more tokens generated."""
        self.counters.tokens += tokens
        self.tick()
        if self.bar is not None:
            rate = self.counters.tokens / max(self.counters.seconds, 1e-6)
            self.bar.update(self.task, advance=rows, rate=f"{rate:,.0f} tokens/s")
        elif self.mode == "json" and time.monotonic() - self.last_json >= JSON_INTERVAL:
            self.last_json = time.monotonic()
            self.emit("progress")

    def emit(self, event: str) -> None:
        record = {"event": event, **self.counters.as_dict()}
        if self.total is not None:
            record["total"] = self.total
        print(json.dumps(record), file=self.out, flush=True)

    def warn(self, message: str) -> None:
        """A line for a skipped row; through the bar's console, so the bar stays whole."""
        if self.bar is not None:
            self.bar.console.print(message, markup=False, highlight=False)
        else:
            print(message, file=self.out, flush=True)

    def close(self, summary: bool | None = None) -> None:
        """Stop the bar and, unless quiet, print the summary."""
        self.tick()
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        if not (self.summary if summary is None else summary):
            return
        if self.mode == "json":
            self.emit("summary")
            return
        c = self.counters
        print(
            f"Done: {c.rows:,} rows ({c.translated:,} translated, {c.failed:,} failed, {c.flagged:,} flagged: "
            f"{c.cut:,} cut to fit the model, {c.max_length:,} stopped at --max-length), {c.sentences:,} sentences, "
            f"{c.tokens:,} tokens in {c.seconds:.1f} s, {c.as_dict()['tokens_per_s']:,.0f} tokens/s.",
            file=self.out, flush=True,
        )
