"""Write docs/OPTIONS.md, the reference of `nllb translate`'s options, from the command itself: its --help
sections (cli.HELP_GROUPS), each option with its help text as --help shows it. tests/test_cli.py fails when the
page and the command differ.

Usage: python tools/make_options_reference.py [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "OPTIONS.md"


def options_reference() -> str:
    """The page: a table a section, an option a row."""
    from nllbcli.cli import cli, help_records, help_sections

    command = cli.commands["translate"]
    parent = click.Context(cli, info_name="nllb", **cli.context_settings)  # -h as well as --help
    ctx = click.Context(command, parent=parent, info_name="translate", terminal_width=10_000, max_content_width=10_000)
    records = help_records(command, ctx)
    lines = ["# `nllb translate` options", "",
             "Made from the command by `python tools/make_options_reference.py`, in the sections of "
             "`nllb translate --help`; the usage is `nllb translate [OPTIONS] [INPUT [OUTPUT]]`, INPUT and OUTPUT "
             "defaulting to `-` (stdin and stdout).", ""]
    for title, names in help_sections(records):
        lines += [f"## {title}", "", "| option | what it does |", "|---|---|"]
        for name in names:
            option, text = records[name]
            lines.append(f"| `{cell(option)}` | {cell(text)} |")
        lines.append("")
    return "\n".join(lines)


def cell(text: str) -> str:
    """Text as a Markdown table cell holds it."""
    return " ".join(text.split()).replace("|", "\\|")


if __name__ == "__main__":
    page = options_reference()
    if "--check" in sys.argv[1:]:
        sys.exit(0 if PAGE.read_text(encoding="utf-8") == page else f"{PAGE} differs from the command: run {__file__}.")
    PAGE.write_text(page, encoding="utf-8")
