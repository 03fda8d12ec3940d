"""Placeholders and markup kept out of the model's hands (--protect): a row's protected spans (URLs, e-mail
addresses, `{{var}}`, `{name}`, `%(name)s`, printf's `%s`, HTML/XML tags and comments, character entities) are
found, and only the text between them goes to the model; the spans are put back byte for byte, each exactly once,
in the source's order. The model never sees a mask token it was not trained on (the way Okapi's and
translate-toolkit's segment placeholders work, and argos-translate's tag handling translates the text inside
tags apart): so a span cannot be lost, duplicated, reordered or altered by it, and a tag's nesting is the
source's.

A text between spans is translated when it holds a letter; one without (`, `, `!`, ` - `, `42`) is kept as it
is, as is a sentence without one, and the whitespace around each text, so that `Hello {name}, welcome!` keeps its
spacing; so is the punctuation a text after a span begins with (`, ` there), which goes on the sentence. With
sentence splitting, each text between spans is split into sentences apart: a sentence never holds a span, so a
split cannot fall inside one.

The restored translation is checked (check_spans): the spans found in it must be the source's, the same ones in
the same order. The model can still write something that reads as a span (`%d`, `<b>`, a URL) into a text it
translates; such a row fails (with --on-error's rules) rather than be written with a placeholder too many.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from ..model.split import join_sentences, split_text

# Each kind of span, tried at each position in this order (a URL may hold `%20` and `&amp;`, a tag `{x}`):
KINDS = {
    "url": r"(?:https?|ftp)://[^\s<>\"'{}]+[^\s<>\"'{}.,;:!?)\]]|www\.[^\s<>\"'{}]+[^\s<>\"'{}.,;:!?)\]]",
    # from the start of a run of its characters only, so that a long run without an @ is scanned once, not once a
    # character
    "email": r"(?:mailto:)?(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    "template": r"\{\{[^{}]*\}\}|\{%[^{}]*%\}",  # Jinja's and Mustache's {{ var }}, {% tag %}
    "brace": r"\{[^{}\s]*\}",  # Python's str.format and ICU's simple arguments: {}, {0}, {name}, {x:>10}
    # a width never begins with 0, the flag: the flags and the width cannot both take a run of zeros
    "named_percent": r"%\([^()\s]+\)[-#0+ ]*(?:[1-9]\d*|\*)?(?:\.(?:\d+|\*))?[diouxXeEfFgGcrsa%]",  # %(name)s
    # printf's %s, %5.2f, %1$s, %lld and %%; no ' ' flag, so that "50 % of" is text
    "percent": r"%(?:[1-9]\d*\$)?[-#0+']*(?:[1-9]\d*|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGcrsaAp%@]",
    "comment": r"<!--.*?-->",
    # <b>, </b>, <br/>, <a href="...">, <x:y/>; its attributes one run up to the next < or >, which is scanned once
    "tag": r"</?[A-Za-z][\w:.-]*(?:\s[^<>]*)?/?>",
    "entity": r"&(?:[A-Za-z][A-Za-z0-9]*|#[0-9]+|#[xX][0-9A-Fa-f]+);",  # &amp; &#39; &#x2014;
}
SPANS = re.compile("|".join(f"(?P<{name}>{pattern})" for name, pattern in KINDS.items()), re.DOTALL)
LETTER = re.compile(r"[^\W\d_]")  # a text without one (punctuation, digits, spaces) is not translated
# punctuation that goes on a sentence after a span (`{name}, welcome`): kept where it is, not given to the model,
# which would start a translation with it no more than it starts one with a comma
CONTINUING = re.compile(r"[,;:]+\s*")


def find_spans(text: str) -> list[str]:
    """The protected spans of `text`, in order."""
    return [match.group() for match in SPANS.finditer(text)]


def cut_at_spans(text: str) -> list[tuple[str, bool]]:
    """`text` as its pieces, in order, each (piece, protected): the spans, and the texts between them (never
    empty). The pieces joined are `text`."""
    pieces, start = [], 0
    for match in SPANS.finditer(text):
        if match.start() > start:
            pieces.append((text[start:match.start()], False))
        pieces.append((match.group(), True))
        start = match.end()
    if start < len(text):
        pieces.append((text[start:], False))
    return pieces


@dataclass
class Layout:
    """How a protected row's translation is put together: `items` in order, each a string kept as it is (a
    span, whitespace, a text without a letter), or a text's sentences as (gaps, kept): split_text's gaps (one
    more than its sentences) and each sentence's own text where it is kept (one without a letter: `!`), None
    where its translation goes, which come in the row's order."""

    items: list
    source: str  # the row's text, whose spans the translation must hold (check_spans)


def protected_layout(text: str, split: bool) -> tuple[list[str], Layout]:
    """The sentences of a row to translate, and the Layout that puts their translations back together with its
    spans (restore)."""
    sentences: list[str] = []
    items: list = []
    for piece, protected in cut_at_spans(text):
        if protected or not LETTER.search(piece):
            items.append(piece)
            continue
        continuing = CONTINUING.match(piece) if items else None
        if continuing:
            items.append(continuing.group())
            piece = piece[continuing.end():]
        if split:
            found, gaps = split_text(piece)
        else:
            body = piece.strip()
            start = len(piece) - len(piece.lstrip())
            found, gaps = [body], [piece[:start], piece[start + len(body):]]
        kept = [None if LETTER.search(sentence) else sentence for sentence in found]
        sentences += [sentence for sentence, keep in zip(found, kept) if keep is None]
        items.append((gaps, kept))
    return sentences, Layout(items, text)


def restore(layout: Layout, translations: list[str], tgt: str) -> str:
    """The row's translation: its kept pieces, and its sentences' `translations` (in order) joined as
    join_sentences joins a row's, each text's own leading and trailing whitespace kept."""
    parts: list[str] = []
    given = iter(translations)
    for item in layout.items:
        if isinstance(item, str):
            parts.append(item)
            continue
        gaps, kept = item
        texts = [next(given) if keep is None else keep for keep in kept]
        parts += [gaps[0], join_sentences(texts, gaps, tgt), gaps[-1]]
    return "".join(parts)


def check_spans(source: str, translation: str) -> str | None:
    """Why `translation` does not hold `source`'s protected spans exactly (each once, in the source's order), or
    None when it does."""
    wanted, found = find_spans(source), find_spans(translation)
    if found == wanted:
        return None
    missing = list((Counter(wanted) - Counter(found)).elements())
    extra = list((Counter(found) - Counter(wanted)).elements())
    if missing or extra:
        said = [f"{what} {', '.join(map(repr, spans))}" for what, spans in (("lost", missing), ("added", extra)) if spans]
        return "its translation " + " and ".join(said)
    return "its translation holds them in another order"


def placeholders_error(where: str, reason: str) -> str:
    """A row's error when its translation would not keep its protected spans."""
    return f"{where}: placeholders: {reason} (the row's placeholders and markup must come back exactly)."
