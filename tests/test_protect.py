"""--protect: placeholders, markup, URLs and e-mail addresses come back exactly, each once and in order, with only
the text between them translated; a row whose translation would not hold them fails, never written broken. The
fake translator reverses each text it is given, which shows what went to the model and what did not."""

from __future__ import annotations

import time
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import nllbcli
from nllbcli.cli import cli
from nllbcli.io import Record
from nllbcli.job.chunks import ChunkWorker
from nllbcli.job.protect import check_spans, cut_at_spans, find_spans, protected_layout, restore
from nllbcli.options import BatchOptions, DecodeOptions, Job

from fakes import FakeTranslator

TRANSLATE = ["translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn"]
SAMPLE = Path(__file__).resolve().parent.parent / "data" / "samples" / "model"


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(cli, TRANSLATE + list(args), input=input)


@pytest.mark.parametrize("text,spans", [
    ("Hello {name}, {0} and {}", ["{name}", "{0}", "{}"]),
    ("%s of %d at %5.2f, %1$s and 100%%", ["%s", "%d", "%5.2f", "%1$s", "%%"]),
    ("Dear %(name)s, %(count)d left", ["%(name)s", "%(count)d"]),
    ("Hi {{ user.name }} and {% if x %}", ["{{ user.name }}", "{% if x %}"]),
    ('Click <a href="/x">here</a><br/> &amp; &#39;&#x2014;', ['<a href="/x">', "</a>", "<br/>", "&amp;", "&#39;", "&#x2014;"]),
    ("See https://example.com/a?b=1&c=2. Or www.example.org, or mail tom.s@example.co.uk!",
     ["https://example.com/a?b=1&c=2", "www.example.org", "tom.s@example.co.uk"]),
    ("50 % of them, 3 < 4 > 2, {not one}, a & b", []),
])
def test_each_kind_of_span_is_found_whole(text, spans):
    assert find_spans(text) == spans


@pytest.mark.parametrize("text", ["a" * 20000, "<a" + " " * 20000 + "x", "<" + "a" * 20000, "http://" + "." * 20000,
                                  "%" + "0" * 20000, "%(a)" + "0" * 20000, "%1" + "1" * 20000, "<!--" + "-" * 20000])
def test_finding_spans_takes_time_linear_in_the_text(text):
    """Texts that make a backtracking pattern quadratic or worse (a tag's spaces that several quantifiers may
    share take minutes for 5,000 of them; an e-mail address tried at each character of a long word) are scanned
    in well under a second."""
    start = time.perf_counter()
    find_spans(text * 5)
    assert time.perf_counter() - start < 1.0


def test_only_the_text_between_spans_goes_to_the_model():
    """Texts without a letter, the whitespace around each text and the punctuation a text after a span begins
    with are kept as they are."""
    sentences, layout = protected_layout("Hello {name}, see <b>the docs</b>! Bye. ", split=True)
    assert sentences == ["Hello", "see", "the docs", "Bye."]
    assert restore(layout, ["A", "B", "C", "D"], "fra_Latn") == "A {name}, B <b>C</b>! D "
    sentences, layout = protected_layout(", see {name};  Bye", split=False)  # a row's own first comma is text
    assert sentences == [", see", "Bye"]
    assert restore(layout, ["A", "B"], "fra_Latn") == "A {name};  B"


def test_sentences_are_split_between_spans_never_across_one():
    sentences, layout = protected_layout("Go to https://example.com/a. Then stop. Now {x}. Done.", split=True)
    assert sentences == ["Go to", "Then stop.", "Now", "Done."]  # ". " after the URL is a sentence of its own
    assert restore(layout, ["A", "B", "C", "D"], "fra_Latn") == "A https://example.com/a. B C {x}. D"


def test_check_spans_names_what_is_lost_added_or_moved():
    assert check_spans("a {x} b %s", "b {x} a %s") is None
    assert check_spans("a {x} b %s", "a b %s %s") == "its translation lost '{x}' and added '%s'"
    assert check_spans("<b>a</b>", "</b>a<b>") == "its translation holds them in another order"


def test_protect_translates_around_the_spans(fake):
    result = invoke("--protect", input="Hello {name}, see <b>the docs</b>!\nMail tom@example.org now.\n")
    assert result.exit_code == 0, result.output
    assert result.output == "olleH {name}, ees <b>scod eht</b>!\nliaM tom@example.org .won\n"


def test_without_protect_the_spans_go_to_the_model(fake):
    result = invoke(input="Hello {name}!\n")
    assert result.output == "!}eman{ olleH\n"


def test_a_row_whose_translation_adds_a_placeholder_fails_and_is_not_written(fake):
    """The fake's reversal of "s% off" writes "%s": a placeholder the source does not have at that place."""
    result = invoke("--protect", "--on-error", "skip", input="Price s% off {n}\nHello {n}\n")
    assert result.exit_code == 3
    assert result.stdout == "\nolleH {n}\n"
    assert result.stderr == ("Skipped: <stdin>:1: placeholders: its translation added '%s' (the row's placeholders "
                             "and markup must come back exactly).\n")
    failed = invoke("--protect", input="Price s% off {n}\n")
    assert failed.exit_code == 1
    assert "<stdin>:1: placeholders: its translation added '%s'" in failed.output


WORDS = st.sampled_from(["Hello", "the", "docs", "Tom", "went", "to", "Rome", "in", "May.", "Bye!", "x,", "42", "-"])
NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True)
PLACEHOLDERS = st.one_of(
    NAMES.map(lambda n: "{" + n + "}"), st.integers(0, 9).map(lambda n: "{%d}" % n), st.just("{}"),
    st.sampled_from(["%s", "%d", "%5.2f", "%1$s", "%%", "%lld", "%@"]),
    NAMES.map(lambda n: f"%({n})s"), NAMES.map(lambda n: "{{ %s }}" % n),
    st.sampled_from(["&amp;", "&lt;", "&#39;", "&#x2014;", "<br/>", '<img src="a.png"/>']),
    NAMES.map(lambda n: f"https://example.com/{n}?q=1&r=%20"), NAMES.map(lambda n: f"{n}@example.org"),
)


@st.composite
def texts_with_spans(draw, depth: int = 0) -> list[str]:
    """Words and placeholders, and tags around some of them, properly nested."""
    pieces: list[str] = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.integers(0, 3 if depth < 2 else 2))
        if kind == 3:
            tag = draw(st.sampled_from(["b", "i", "a", "span"]))
            attributes = draw(st.sampled_from(["", ' class="x"', " href='/y'"]))
            pieces += [f"<{tag}{attributes}>", *draw(texts_with_spans(depth + 1)), f"</{tag}>"]
        elif kind == 2:
            pieces.append(draw(PLACEHOLDERS))
        else:
            pieces.append(draw(WORDS))
    return pieces


WORKER = ChunkWorker(FakeTranslator(), Job("eng_Latn", "fra_Latn", protect=True), DecodeOptions(beam_size=1),
                     BatchOptions())


@settings(max_examples=150, deadline=None)
@given(texts_with_spans(), st.booleans())
def test_a_translation_holds_exactly_its_sources_placeholders(pieces, split):
    """Whatever mix of words, placeholders and nested tags a row holds, its translation holds the same spans,
    each once, in the same order: tags nest as they did."""
    text = " ".join(pieces)
    spans = [piece for piece in pieces if find_spans(piece) == [piece]]
    worker = WORKER if split else ChunkWorker(WORKER.translator, Job("eng_Latn", "fra_Latn", protect=True,
                                                                     split=False), WORKER.decode, WORKER.batching)
    outcome, = worker([Record(0, text, {"text": text}, where="row 1")])
    assert outcome.error is None
    assert find_spans(text) == spans
    assert find_spans(outcome.translation) == spans
    assert [piece for piece, protected in cut_at_spans(outcome.translation) if protected] == spans


@lru_cache(maxsize=None)
def sample():
    return nllbcli.load(str(SAMPLE), "cpu")


def test_the_sample_model_keeps_every_span_through_the_api():
    texts = ["Tom went to Rome in May. See <b>https://example.com/a?b=1&amp;c=2</b>.",
             "My birthday is on %(day)s, {name}!", "{0} {1}"]
    greedy = nllbcli.DecodeOptions(beam_size=1, max_length=32)
    results = nllbcli.translate(sample(), texts, "en", "fr", greedy, protect=True)
    assert [r.error for r in results] == [None, None, None]
    assert results[0].text.startswith("Tom est allé à Rome en mai. ")
    assert [find_spans(r.text) for r in results] == [find_spans(t) for t in texts]
    assert results[2].text == "{0} {1}"  # nothing to translate: the model is not asked
    table = nllbcli.translate_table(sample(), pa.table({"text": texts}), "en", "fr", greedy, protect=True)
    assert table.column("translation").to_pylist() == [r.text for r in results]
