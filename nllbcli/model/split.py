"""Rows into sentences and translations back into rows.

NLLB was trained on single sentences and tends to drop all but the first of several, so each row is cut into
sentences, they are translated one by one (batched with everything else), and the translations are joined in
order. The splitter is a small set of rules of our own (no library covers the scripts NLLB-200 reads; pysbd
knows 22 languages and only their Latin-style full stops):

- a line break always ends a sentence (and is kept between the translations: paragraphs stay paragraphs);
- marks that end a sentence in their own script end one even with no space after them:
  CJK 。！？｡ and their small and vertical forms, Devanagari and Bengali danda । ॥, Ethiopic ። ፧ ፨,
  Myanmar ။, Khmer ។ ៕, Tibetan ༎, Urdu ۔, Arabic ؟, Mongolian ᠃ ᠉, Armenian ։, Ol Chiki ᱾ ᱿;
- `.` `!` `?` `…` `‼` `⁇` `⁈` `⁉` and the Greek question mark `;` end one when whitespace follows and the next
  word does not begin with a lower-case letter or digit; after `.`, not when the word before is an initial
  (`J.`), holds an inner dot (`e.g.`, `U.S.`), is a number of one or two digits (`3.` in `am 3. Mai`), or is a
  common abbreviation (`Dr.`, `etc.`, `z.B.`, ...);
- closing quotes and brackets after the mark stay with the sentence.

The Arabic comma `،` is a comma and never ends a sentence. A row never loses a character: the sentences and
the whitespace between them put back together give the row (`split_text` is property-tested for it).
"""

from __future__ import annotations

import re

ANYWHERE = "。！？｡︒﹒﹗﹖।॥።፧፨။។៕༎۔؟᠃᠉։᱾᱿"  # end a sentence with or without a space after them
SPACED = ".!?…‼⁇⁈⁉;"  # end a sentence only before whitespace (the last is U+037E, the Greek question mark)
CLOSERS = "\"'”’»›)]}」』）】》〉〕〗〙〛＂＇］｝"
ABBREVIATIONS = frozenset(
    """mr mrs ms dr prof st sr sra srta jr vs etc no nr nos vol pp fig figs ca cf approx dept est inc ltd co corp
    jan feb mar apr jun jul aug sep sept oct nov dec mt ft gen col lt sgt capt rev hon mme mlle mm bzw usw vgl
    ggf evtl sog nº ed eds al art sec""".split()
)
NO_SPACE_LANGUAGES = ("zho", "yue", "jpn")  # written without spaces between sentences

BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # line breaks
LINE_BREAK = re.compile(f"\\s*[{BREAKS}]\\s*")
BOUNDARY = re.compile(
    f"(?:[{re.escape(ANYWHERE)}][{re.escape(ANYWHERE + SPACED)}]*|[{re.escape(SPACED)}]+)[{re.escape(CLOSERS)}]*"
)


# Where a text may split: a line break, a mark that ends a sentence anywhere, or a spaced mark (and closers) before
# whitespace. A text without any is one sentence (or none), which split_text answers without its walk: most rows
# (the reader's thread splits every row, holding the GIL the thread driving the GPU waits for).
MAY_SPLIT = re.compile(
    f"[{BREAKS}{re.escape(ANYWHERE)}]|[{re.escape(SPACED)}][{re.escape(CLOSERS)}]*\\s"
)


def split_text(text: str) -> tuple[list[str], list[str]]:
    """The sentences of `text` and the whitespace around them: `gaps[0] + s[0] + gaps[1] + ... + s[-1] + gaps[-1]`
    is `text`, with one gap more than sentences. Sentences are never empty and never begin or end with whitespace."""
    if not MAY_SPLIT.search(text):
        body = text.strip()
        if not body:
            return [], [text]
        start = len(text) - len(text.lstrip())
        return [body], [text[:start], text[start + len(body):]]
    return split_walk(text)


def split_walk(text: str) -> tuple[list[str], list[str]]:
    """split_text, line by line and mark by mark."""
    sentences: list[str] = []
    gaps: list[str] = []
    pending = ""  # whitespace before the next sentence
    position = 0
    for line_break in [*LINE_BREAK.finditer(text), None]:
        end = line_break.start() if line_break else len(text)
        line = text[position:end]
        stripped = line.lstrip()
        pending += line[: len(line) - len(stripped)]
        for sentence, gap in split_line(stripped):
            gaps.append(pending)
            sentences.append(sentence)
            pending = gap
        if line_break:
            pending += line_break.group()
            position = line_break.end()
    gaps.append(pending)
    return sentences, gaps


def split_line(line: str) -> list[tuple[str, str]]:
    """(sentence, whitespace after it) pairs of a line without line breaks or leading whitespace."""
    pieces: list[tuple[str, str]] = []
    start = 0
    for mark in BOUNDARY.finditer(line):
        end = mark.end()
        rest = line[end:]
        after = rest[: len(rest) - len(rest.lstrip())]
        if end + len(after) == len(line) or not ends_sentence(line, start, mark, after):
            continue
        pieces.append((line[start:end], after))
        start = end + len(after)
    if start < len(line):
        body = line[start:].rstrip()
        pieces.append((body, line[start + len(body):]))
    return [(sentence, gap) for sentence, gap in pieces if sentence]


def ends_sentence(line: str, start: int, mark: re.Match, after: str) -> bool:
    """Whether the punctuation `mark` ends the sentence that began at `start`."""
    if mark.group()[0] in ANYWHERE:
        return True
    if not after:  # "3.14", "a.m.", "x!y": no space, no sentence end
        return False
    following = line[mark.end() + len(after)]
    if following.islower() or following.isdigit():
        return False
    if mark.group()[0] != ".":
        return True
    word = line[start : mark.start()].rsplit(None, 1)[-1] if line[start : mark.start()].strip() else ""
    word = word.lstrip("\"'“‘«‹([{")
    if not word:
        return True
    if "." in word and not word.replace(".", "").isdigit():  # e.g. U.S. z.B., but not 3.14
        return False
    if len(word) == 1 and word.isalpha():  # an initial
        return False
    if word.isdigit() and len(word) <= 2:  # an ordinal or a list number
        return False
    return word.lower() not in ABBREVIATIONS


def join_sentences(translations: list[str], gaps: list[str], tgt_lang: str) -> str:
    """The translations of a row's sentences put back together with the whitespace that was between them.

    A line break between two sentences stays. Otherwise sentences are joined as the target language writes
    them: without a space for Chinese and Japanese, with the original space (or one space where the source,
    Chinese say, had none) for the others. The row's own leading and trailing whitespace is not kept: the model
    never reproduced it either."""
    no_space = tgt_lang.split("_")[0] in NO_SPACE_LANGUAGES
    parts: list[str] = []
    for i, translation in enumerate(translations):
        if i:
            gap = gaps[i]
            if LINE_BREAK.search(gap):
                parts.append(gap)
            elif no_space:
                pass
            else:
                parts.append(gap or " ")
        parts.append(translation)
    return "".join(parts)
