"""gettext PO catalogues in and out: untranslated entries filled and marked fuzzy, plural forms by the header's
nplurals, comments, context, flags and obsolete entries kept, translated entries left alone unless
--po-overwrite, placeholders of *-format entries protected, and an entry whose translation fails left
untranslated and named. The fake translator reverses each text."""

from __future__ import annotations

import json
import subprocess
import sys
import signal
from pathlib import Path

import polib
import pytest
from click.testing import CliRunner

from nllbcli.cli import cli
from nllbcli.errors import NllbError
from nllbcli.io.po import fill_catalogue, read_catalogue
from nllbcli.job.signals import Stopped

TRANSLATE = ["translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn"]

HEADER = '''# A catalogue.
msgid ""
msgstr ""
"Language: fr\\n"
"Content-Type: text/plain; charset=UTF-8\\n"
"Plural-Forms: nplurals={nplurals}; plural=(n > 1);\\n"
'''
CATALOGUE = HEADER + '''
#. A note for translators
#: app.py:12
msgid "Good day"
msgstr ""

#: app.py:14
#, python-format
msgid "Hello %(name)s"
msgstr ""

#: app.py:20
msgctxt "menu"
msgid "Open"
msgstr "Ouvrir"

#, fuzzy
msgid "Close"
msgstr "Fermer"

#, c-format
msgid "%d file"
msgid_plural "%d files"
msgstr[0] ""
msgstr[1] ""

#~ msgid "Old"
#~ msgstr "Vieux"
'''


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(cli, TRANSLATE + list(args), input=input)


def catalogue(nplurals: int = 2) -> str:
    return CATALOGUE.replace("{nplurals}", str(nplurals))


def filled(nplurals: int, plural_forms: list[str]) -> str:
    """The catalogue as nllb writes it with the fake's translations."""
    forms = "".join(f'msgstr[{n}] "{text}"\n' for n, text in enumerate(plural_forms))
    return HEADER.replace("{nplurals}", str(nplurals)) + f'''
#. A note for translators
#: app.py:12
#, fuzzy
msgid "Good day"
msgstr "yad dooG"

#: app.py:14
#, fuzzy, python-format
msgid "Hello %(name)s"
msgstr "olleH %(name)s"

#: app.py:20
msgctxt "menu"
msgid "Open"
msgstr "Ouvrir"

#, fuzzy
msgid "Close"
msgstr "Fermer"

#, fuzzy, c-format
msgid "%d file"
msgid_plural "%d files"
{forms}
#~ msgid "Old"
#~ msgstr "Vieux"
'''


@pytest.mark.parametrize("nplurals,forms", [
    (2, ["%d elif", "%d selif"]), (1, ["%d selif"]), (3, ["%d elif", "%d selif", "%d selif"])])
def test_untranslated_entries_are_filled_and_marked_fuzzy(fake, here, nplurals, forms):
    Path("app.po").write_text(catalogue(nplurals))
    result = invoke("app.po", "app.fr.po")
    assert result.exit_code == 0, result.output
    assert Path("app.fr.po").read_text() == filled(nplurals, forms)
    sent = sorted("".join(chr(i) for i in ids[1:-1]) for batch in fake.batches for ids in batch)
    assert sent == ["Good day", "Hello", "file", "files"]  # the placeholders never went to the model


def test_a_po_output_on_stdout_is_the_same_catalogue(fake, here):
    Path("app.po").write_text(catalogue())
    result = invoke("app.po", "-")
    assert result.exit_code == 0, result.output
    assert result.stdout == filled(2, ["%d elif", "%d selif"])


def test_a_po_job_stopped_and_resumed_writes_the_same_catalogue(fake, here):
    """The partial file holds the translated rows (frames), so --resume continues after the last commit."""
    Path("app.po").write_text(catalogue())
    args = ["--chunk-rows", "1", "app.po"]
    generate, calls = type(fake).generate, []

    def stop_on_the_third_chunk(self, *rest):
        calls.append(1)
        if len(calls) == 3:
            raise Stopped(signal.SIGTERM)
        return generate(self, *rest)

    fake.generate = stop_on_the_third_chunk.__get__(fake)
    assert invoke(*args, "app.fr.po").exit_code == 143
    assert not Path("app.fr.po").exists()
    fake.generate = generate.__get__(fake)
    fake.batches.clear()
    result = invoke(*args, "--resume", "app.fr.po")
    assert result.exit_code == 0, result.output
    assert len(fake.batches) == 2  # the rows after the two committed
    assert Path("app.fr.po").read_text() == filled(2, ["%d elif", "%d selif"])


def test_po_overwrite_translates_translated_entries_again(fake, here):
    Path("app.po").write_text(catalogue())
    result = invoke("--po-overwrite", "app.po", "app.fr.po")
    assert result.exit_code == 0, result.output
    entries = {(e.msgctxt, e.msgid): e for e in polib.pofile("app.fr.po")}
    assert entries["menu", "Open"].msgstr == "nepO"
    assert entries["menu", "Open"].flags == ["fuzzy"]
    assert entries[None, "Close"].msgstr == "esolC"


def test_a_po_input_gives_rows_to_jsonl(fake, here):
    Path("app.po").write_text(catalogue())
    result = invoke("app.po", "rows.jsonl")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in Path("rows.jsonl").read_text().splitlines()]
    assert rows[1] == {"text": "Hello %(name)s", "msgctxt": None, "po_entry": 1, "po_form": "msgid",
                       "translation": "olleH %(name)s"}
    assert [(row["po_entry"], row["po_form"]) for row in rows] == [(0, "msgid"), (1, "msgid"), (4, "msgid"),
                                                                    (4, "msgid_plural")]


def test_an_entry_whose_translation_fails_stays_untranslated_and_is_named(fake, here):
    """The fake's reversal of "s% off" writes "%s", a placeholder the entry does not have there; the job skips
    the entry by default for a PO input, and names it."""
    Path("app.po").write_text(HEADER.replace("{nplurals}", "2") + '''
#, python-format
msgid "Price s% off %(n)d"
msgstr ""

msgid "Good day"
msgstr ""
''')
    result = invoke("app.po", "app.fr.po")
    assert result.exit_code == 3
    assert result.stderr == ("Skipped: app.po: entry 1 (line 8): placeholders: its translation added '%s' (the "
                             "row's placeholders and markup must come back exactly).\n")
    entries = polib.pofile("app.fr.po")
    assert [(e.msgstr, e.flags) for e in entries] == [("", ["python-format"]), ("yad dooG", ["fuzzy"])]


def test_a_po_output_needs_a_po_input(fake, here):
    Path("in.txt").write_text("Hello\n")
    result = invoke("in.txt", "out.po")
    assert result.exit_code == 2
    assert "INPUT must be a PO file, not text" in result.output
    result = invoke("--po-overwrite", "in.txt", "out.txt")
    assert result.exit_code == 2
    assert result.stderr == "Error: --po-overwrite goes with a PO INPUT, and INPUT is text.\n"



def test_a_charset_that_cannot_hold_the_translations_is_refused_in_one_sentence():
    catalogue = read_catalogue(b'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=ASCII\\n"\n\n'
                               b'msgid "Coffee"\nmsgstr ""\n', "app.po")
    with pytest.raises(NllbError) as error:
        fill_catalogue(catalogue, iter([b'{"entry": 0, "form": "msgid", "translation": "Caf\\u00e9"}\n']))
    assert str(error.value).startswith("the catalogue's charset ASCII cannot hold its translations (")
    assert str(error.value).endswith("): convert it to UTF-8 first (msgconv -t UTF-8).")


SAMPLE = str(Path(__file__).resolve().parent.parent / "data" / "samples" / "model")


def test_two_workers_write_a_one_device_jobs_catalogue(tmp_path):
    """--devices: the workers protect the *-format entries and the main process writes the same catalogue."""
    (tmp_path / "app.po").write_text(HEADER.replace("{nplurals}", "2") + "".join(
        f'\n#, python-format\nmsgid "{text} %(n)s"\nmsgstr ""\n' for text in
        ["Tom went to Rome in May.", "My birthday is on the fourth of November.", "The wedding is in June."]))
    base = [sys.executable, "-m", "nllbcli", "translate", "-q", "-m", SAMPLE, "--src", "en", "--tgt", "fr",
            "--beam-size", "1", "--max-length", "24", "--chunk-rows", "1", "app.po"]
    one = subprocess.run([*base, "one.po", "--device", "cpu"], cwd=tmp_path, capture_output=True, text=True)
    two = subprocess.run([*base, "two.po", "--devices", "cpu:2"], cwd=tmp_path, capture_output=True, text=True)
    assert (one.returncode, two.returncode) == (0, 0), one.stderr + two.stderr
    assert (tmp_path / "two.po").read_text() == (tmp_path / "one.po").read_text()
    assert 'msgstr "Tom est allé à Rome en mai. %(n)s"' in (tmp_path / "one.po").read_text()
