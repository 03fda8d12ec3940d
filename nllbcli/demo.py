"""`make demo`: translate the sample sentences in data/samples/demo.* on this machine and print them.

    python -m nllbcli.demo [MODEL_DIR]    (default data/samples/model, else the test model tests/models/tiny-a)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .errors import NllbError
from .io import format_of
from .options import DecodeOptions
from .options import Job
from .job.loop import translate_file
from .model.translator import load_translator

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_MODEL = Path("data/samples/model")
TEST_MODEL = Path("tests/models/tiny-a")
SOURCE = "eng_Latn"
TARGETS = ["fra_Latn", "deu_Latn", "spa_Latn", "ita_Latn"]  # the languages the sample model is trained on
SEARCHES = {"greedy": DecodeOptions(beam_size=1, max_length=64), "beam 4": DecodeOptions(beam_size=4, max_length=64)}


def main(argv: list[str]) -> int:
    console = Console()
    model = Path(argv[0]) if argv else SAMPLE_MODEL
    if model == SAMPLE_MODEL and not (ROOT / model / "config.json").is_file():
        console.print(f"{SAMPLE_MODEL} is not there yet (tools/train_sample_model.py makes it): using the test model "
                      f"{TEST_MODEL}, whose random weights translate into nonsense.")
        model = TEST_MODEL
    try:
        translator = load_translator(str(model if model.is_absolute() else ROOT / model), "auto")
        targets = [code for code in TARGETS if code in translator.tokenizer.lang_codes]
        console.print(f"model {model} on {translator.device}")
        for source in sorted((ROOT / "data" / "samples").glob(f"demo.{SOURCE}.*")):
            console.print(translate_demo(translator, source, targets))
    except (NllbError, ValueError) as error:
        console.print(f"demo failed: {error}")
        return 1
    return 0


def translate_demo(translator, source: Path, targets: list[str]) -> Table:
    """A table of the file's sentences and their translations, greedy and beam, made by the real pipeline."""
    fmt = format_of(str(source), None)
    texts = read_texts(source, fmt, "text")
    found = {}  # (target, search) -> translations
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / f"out{source.suffix}"
        for target in targets:
            for search, options in SEARCHES.items():
                translate_file(translator, Job(SOURCE, target, str(source), str(output), fmt, fmt), options)
                found[target, search] = read_texts(output, fmt, "translation")
    table = Table("sentence", "into", *SEARCHES, title=f"{source.relative_to(ROOT)}", show_lines=False)
    for row, text in enumerate(texts):
        for target in targets:
            first = target == targets[0]
            last = target == targets[-1]
            table.add_row(text if first else "", target, *(found[target, s][row] for s in SEARCHES), end_section=last)
    return table


def read_texts(path: Path, fmt: str, field: str) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return lines if fmt == "text" else [json.loads(line)[field] for line in lines if line.strip()]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
