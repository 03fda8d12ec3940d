"""The tests' stand-in translator: its translation of a text is the text reversed (tests import it from here, a
module of one name whichever conftest.py a test process loaded first)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nllbcli.errors import NllbError

EOS = 2
LANG_BASE = 0x110000  # the fake's language ids: past every Unicode code point, so no character's id is one


class FakeTokenizer:
    def __init__(self):
        self.lang_codes = ["deu_Latn", "eng_Latn", "fra_Latn"]
        self.reject = None  # encode raises on text holding this

    def lang_id(self, code: str) -> int:
        if code not in self.lang_codes:
            raise NllbError(f"unknown language code {code!r}; the closest known codes are eng_Latn, fra_Latn.")
        return LANG_BASE + self.lang_codes.index(code)

    def encode(self, text: str, src_lang: str) -> list[int]:
        if self.reject and self.reject in text:
            raise UnicodeEncodeError("utf-8", text, 0, 1, "surrogates not allowed")
        return [self.lang_id(src_lang)] + [ord(c) for c in text] + [EOS]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids if i != EOS and i < LANG_BASE)


@dataclass
class FakeConfig:
    max_position_embeddings: int = 1024


@dataclass
class FakeTranslator:
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    config: FakeConfig = field(default_factory=FakeConfig)
    batches: list = field(default_factory=list)  # every batch generate was given
    options: list = field(default_factory=list)  # the DecodeOptions of each call
    languages: list = field(default_factory=list)  # the target language of each call
    device: str = "cpu"
    fail_with: BaseException | None = None  # raised by generate when set

    def generate(self, sources, tgt_lang, options):
        for lang in [tgt_lang] if isinstance(tgt_lang, str) else tgt_lang:  # one for all, or one per source
            self.tokenizer.lang_id(lang)
        if self.fail_with:
            raise self.fail_with
        self.batches.append(sources)
        self.options.append(options)
        self.languages.append(tgt_lang)
        return [ids[1:-1][::-1] for ids in sources]  # the pieces reversed, without the language token and </s>

    def generate_hypotheses(self, sources, tgt_lang, options, keys=None, prefixes=None, targets=None):
        """generate's ids first, then as many more as asked, each with a digit more ("1", "2", ...); scores that
        fall with the length and the rank."""
        from nllbcli.model.search import Hypothesis

        return [[Hypothesis(ids + [ord(str(k))] * bool(k), -0.5 * (len(ids) + 2 + k), -0.5 - 0.25 * k)
                 for k in range(options.num_hypotheses)] for ids in self.generate(sources, tgt_lang, options)]
