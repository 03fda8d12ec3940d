"""Write docs/OPTIONS.md, the reference of `nllb translate`'s and `nllb score`'s options, from the commands themselves: its --help
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
    """The page: a part a command, a table a section, an option a row."""
    from nllbcli.cli import cli, help_records, help_sections

    parent = click.Context(cli, info_name="nllb", **cli.context_settings)  # -h as well as --help
    lines = ["# `nllb translate` and `nllb score` options", "",
             "Made from the commands by `python tools/make_options_reference.py`, in the sections of their `--help`; "
             "the usage is `nllb translate [OPTIONS] [INPUT [OUTPUT]]` (and `nllb score`'s the same), INPUT and OUTPUT "
             "defaulting to `-` (stdin and stdout).", ""]
    for name in ("translate", "score"):
        command = cli.commands[name]
        ctx = click.Context(command, parent=parent, info_name=name, terminal_width=10_000, max_content_width=10_000)
        records = help_records(command, ctx)
        lines += [f"## `nllb {name}`", ""]
        for title, names in help_sections(records):
            lines += [f"### {title}", "", "| option | what it does |", "|---|---|"]
            for option_name in names:
                option, text = records[option_name]
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
