"""The README and docs/*.md: the README stays a front page (at most 2,000 words), every relative link leads to a
file (and heading) that exists, every repository path a page names exists, and every shell example runs as it is
written.

A ```sh (or ```bash) block runs unless the line before it says why not, as `<!-- not run: needs a GPU -->` does.
It runs with `bash -e -o pipefail` in a fresh temporary directory that holds the repository's sample data
(`data/samples`), the Makefile, and the files the examples name (FILES, made from the sample data), with
`NLLB_MODEL` set to the sample model and `.venv/bin` first on PATH, whose `nllb` and `python` are this Python's
(with this tree's nllbcli), so that both `nllb ...` and `.venv/bin/nllb ...` run as written. Blocks of other
languages (python, console, crontab) are left to their own tests: tests/test_api.py and tests/test_spark.py run
the Python API's and Spark's, tests/test_commands.py the README's "Try it now" block."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data" / "samples"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_WORDS = 2000
SHELLS = ("sh", "bash")
NOT_RUN = re.compile(r"^<!-- not run: (\S.*) -->$")
FENCE = re.compile(r"^```(\S*)\s*$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"`((?:nllbcli|tests|bench|tools|kernels_cu|data|docs)/[^`\s]*)`")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, from 1
    lang: str
    code: str
    not_run: str | None  # the reason, where the line before says it is not run

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found, start = [], None
    for n, line in enumerate(lines):
        fence = FENCE.match(line)
        if fence and start is None:
            start, lang = n, fence.group(1)
        elif line.rstrip() == "```" and start is not None:
            before = NOT_RUN.match(lines[start - 1]) if start else None
            found.append(Block(page, start + 1, lang, "\n".join(lines[start + 1:n]) + "\n",
                               before and before.group(1)))
            start = None
    assert start is None, f"{page.name}: a code block opened on line {start + 1} is not closed"
    return found


def without_blocks(page: Path, langs: tuple[str, ...] | None = None) -> str:
    """The page without its code blocks (those of `langs` only, where given)."""
    text = page.read_text(encoding="utf-8")
    for block in blocks(page):
        if (langs is None or block.lang in langs) and block.code.strip():
            text = text.replace(block.code, "")
    return text


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation but - and _ dropped, spaces as -."""
    found, seen = set(), {}
    for line in without_blocks(page).splitlines():
        heading = re.match(r"^#{1,6} (.+?)\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_the_readme_is_a_front_page():
    words = len((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert words <= MAX_README_WORDS, f"README.md has {words} words; the reference goes in docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_leads_somewhere(page):
    for target in LINK.findall(re.sub(r"`[^`\n]*`", "", without_blocks(page))):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name} links to {target}: there is no {path}"
        if anchor:
            assert anchor in anchors(linked), f"{page.name} links to {target}: {path or page.name} has no such heading"


@pytest.mark.parametrize("page", [page for page in PAGES if page.name != "PERFORMANCE.md"], ids=lambda page: page.name)
def test_every_repository_path_named_exists(page):
    """PERFORMANCE.md is left out: what it tried and rejected names the benchmarks that were removed with it."""
    for path in REPO_PATH.findall(without_blocks(page, SHELLS)):  # the examples' own files are made for them
        assert list(ROOT.glob(path.rstrip("/"))), f"{page.name} names {path}, which is not in the repository"


def test_every_shell_block_runs_or_says_why_not():
    shells = [block for page in PAGES for block in blocks(page) if block.lang in SHELLS]
    assert len([block for block in shells if block.not_run is None]) >= 20
    assert all(block.not_run is None or block.not_run.strip() for block in shells)


def sample_rows(name: str, count: int = 4) -> list[str]:
    return (SAMPLES / name).read_text(encoding="utf-8").splitlines()[:count]


def make_files(where: Path) -> None:
    """The files the examples name, made from the sample data: English but where a name says otherwise."""
    english = sample_rows("demo.eng_Latn.txt")
    spanish = sample_rows("heldout/spa_Latn.txt")
    rows = [{"id": n, "text": text} for n, text in enumerate(english, 1)]
    jsonl = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    articles = [{"id": row["id"], "body": row["text"]} for row in rows]
    bitext = [{"id": n, "text": en, "translation": fr}  # aligned: the held-out sentences, the last pair a mismatch
              for n, (en, fr) in enumerate(zip(sample_rows("heldout/eng_Latn.txt", 20),
                                               sample_rows("heldout/fra_Latn.txt", 19) + ["Le chat dort."]), 1)]
    files = {
        "in.txt": "\n".join(english) + "\n",
        "notes.txt": "\n".join(english) + "\n",
        "docs/a.txt": english[0] + "\n",
        "docs/b.txt": english[1] + "\n",
        "in.jsonl": jsonl,
        "corpus.jsonl": jsonl,
        "articles.jsonl": "".join(json.dumps(row) + "\n" for row in articles),
        "mixed.jsonl": '{"text": "Hello!", "tgt_lang": "de"}\n{"text": "Bonjour !", "src_lang": "fr", "tgt_lang": "es"}\n',
        "prefixed.jsonl": '{"text": "The meeting is on Friday.", "start": "La réunion"}\n',
        "broken.jsonl": '{"text": null, "id": 7}\n{"text": "My uncle went to Rome on Friday.", "id": 8}\n',
        "bitext.jsonl": "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in bitext),
        "en.txt": "".join(row["text"] + "\n" for row in bitext),
        "fr.txt": "".join(row["translation"] + "\n" for row in bitext),
        "in.csv": "id,text\n" + "".join(f'{n},"{text}"\n' for n, text in enumerate(english, 1)),
        "templates.jsonl": json.dumps({"text": f"{english[0]} See <b>{{name}}</b> at https://example.com."}) + "\n",
        "messages.pot": 'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                        + "".join(f'#, python-format\nmsgid "{text} %(n)d"\nmsgstr ""\n\n' for text in english),
    }
    for name, text in files.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(text, encoding="utf-8")
    (where / "rows.jsonl.gz").write_bytes(gzip.compress(jsonl.encode(), mtime=0))
    pq.write_table(pa.Table.from_pylist(rows), where / "in.parquet")
    pq.write_table(pa.Table.from_pylist(articles), where / "articles.parquet")
    pq.write_table(pa.Table.from_pylist([{"id": n, "text": t} for n, t in enumerate(spanish, 1)]), where / "day.parquet")
    (where / "data").mkdir()
    (where / "data" / "samples").symlink_to(SAMPLES)
    (where / "Makefile").symlink_to(ROOT / "Makefile")
    bin_dir = where / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, command in (("nllb", f"{sys.executable} -m nllbcli"), ("python", sys.executable)):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        (bin_dir / name).chmod(0o755)


def run_block(block: Block, where: Path) -> subprocess.CompletedProcess:
    where.mkdir(parents=True)
    make_files(where)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NLLB_")}
    env.update(NLLB_MODEL=str(SAMPLES / "model"), PATH=f"{where / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               PYTHON=str(where / ".venv" / "bin" / "python"),  # what `make demo` runs, as the Makefile allows
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=where, env=env,
                          capture_output=True, text=True, timeout=120)


RUNNABLE = [block for page in PAGES for block in blocks(page) if block.lang in SHELLS and block.not_run is None]


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every runnable block, two at a time (each in a directory of its own)."""
    if not (SAMPLES / "model" / "model.safetensors").is_file():
        pytest.skip("the sample model is not there")
    for tool in ("jq", "gzip", "zcat", "make"):
        if shutil.which(tool) is None:
            pytest.skip(f"the examples use {tool}, which is not installed")
    root = tmp_path_factory.mktemp("docs")
    with ThreadPoolExecutor(2) as pool:
        done = pool.map(lambda nb: run_block(nb[1], root / str(nb[0])), enumerate(RUNNABLE))
        return {block.name: result for block, result in zip(RUNNABLE, done)}


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda block: block.name)
def test_the_shell_example_runs_as_written(block, ran):
    result = ran[block.name]
    assert result.returncode == 0, f"{block.name}:\n{block.code}\nstderr:\n{result.stderr}"

