"""NLLB's and M2M-100's tokenizers on sentencepiece: text + language -> ids, and ids -> text.

Ids follow fairseq's NLLB dictionary, as transformers' NllbTokenizer does:
`<s>`=0 `<pad>`=1 `</s>`=2 `<unk>`=3; sentencepiece piece i>=3 at id i+1; the language codes after the
sentencepiece vocabulary, in FLORES-200 order; `<mask>` last. A source is `[src_lang] pieces </s>`
(transformers' non-legacy behaviour). Where the model directory ships `tokenizer.json`, its ids are used, so
they agree with it by construction.

M2M-100 (M2M100Tokenizer) takes its piece ids from `vocab.json` (fairseq's dictionary: `<s>` `<pad>` `</s>` `<unk>`
then the pieces in the dictionary's order, not sentencepiece's), its language tokens `__xx__` after that
vocabulary, then 8 `madeupword` tokens. Sources and the decoder's start are laid out as NLLB's. Both classes
offer encode(text, src_lang), decode(ids), lang_codes and lang_id(code): the engine and search never know which.
`tokenizer_from_model_dir` picks one from the files a model directory holds.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import numpy as np
import sentencepiece as spm

from .checkpoint import MAX_ID, json_int, json_value, quoted, read_json_object, shown
from ..errors import NllbError
from .langs import FLORES_200_CODES, M2M100_CODES, check_lang

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")
BOS_ID, PAD_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
FAIRSEQ_OFFSET = 1  # sentencepiece piece i >= 3 has NLLB id i + 1
SPACE = "\u2581"  # sentencepiece's visible space, "▁"
LANG_CODE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")
ENCODE_THREADS = min(4, os.cpu_count() or 1)  # sentencepiece's threads for a batch of texts
ENCODE_CALL = 512  # texts a sentencepiece call (the GIL held ~2 ms while it makes their lists)


class SentencePieceTokenizer:
    """What both tokenizers share: language ids, a source's layout, and encode_many, one sentencepiece call for
    many texts, which tokenizes on its own threads without holding the GIL (the reader thread tokenizes while
    the main one drives the GPU)."""

    @property
    def lang_codes(self) -> list[str]:
        return list(self.lang_ids)

    def lang_id(self, code: str) -> int:
        """The id of a language's token (NLLB's `eng_Latn`, M2M-100's `__en__`), or an error naming the closest
        codes the model knows."""
        found = self.lang_ids.get(code)  # the usual case, once per sentence: no list of codes made
        return found if found is not None else self.lang_ids[check_lang(code, self.lang_codes)]

    def encode(self, text: str, src_lang: str, sp_ids: list[int] | None = None) -> list[int]:
        """`[src_lang] pieces </s>`: what the encoder reads (sp_ids: sentencepiece's ids of `text`, where known)."""
        return [self.lang_id(src_lang), *self.encode_pieces(text, sp_ids), EOS_ID]

    def encode_many(self, texts: list[str], src_langs: list[str]) -> list:
        """encode(text, src_lang) of each pair: its ids, or the exception encode would have raised."""
        texts = list(texts)
        pieces: list = []
        # in calls of ENCODE_CALL texts: sentencepiece tokenizes without the GIL but makes its answer's lists with
        # it, ~30 ms for a chunk of 8,192 texts in one call, while the thread driving the GPU waits
        for i in range(0, len(texts), ENCODE_CALL):
            part = texts[i : i + ENCODE_CALL]
            try:
                pieces += self.sp.Encode(part, num_threads=ENCODE_THREADS)
            except Exception:  # noqa: BLE001 - a text the call cannot take: its texts each alone, so it alone fails
                pieces += [None] * len(part)
        out: list = []
        for text, src, sp_ids in zip(texts, src_langs, pieces):
            try:
                out.append(self.encode(text, src, sp_ids))
            except Exception as error:  # noqa: BLE001 - sentencepiece's errors are no narrower than that
                out.append(error)
        return out

    def decode_many(self, outputs: list) -> list[str]:
        """decode(ids) of each id list."""
        return [self.decode(ids) for ids in outputs]

    @functools.cached_property
    def words_apart(self) -> bool:
        """Whether a space always parts pieces: no piece holds "▁" but as its first character. Then the pieces of
        the words before a space are the same whatever follows it (BPE merges only within a piece, never across
        a "▁"), and a text cut before a space gives its first pieces unchanged (rows.bound_text)."""
        return all(SPACE not in self.sp.IdToPiece(i)[1:] for i in range(self.sp.GetPieceSize()))


class NllbTokenizer(SentencePieceTokenizer):
    def __init__(self, sp: spm.SentencePieceProcessor, piece_ids: np.ndarray, lang_ids: dict[str, int], mask_id: int):
        self.sp = sp
        self.piece_ids = piece_ids  # sentencepiece id -> NLLB id
        self.piece_list = piece_ids.tolist()  # the same as a list: a sentence's few ids looked up 3x faster
        self.lang_ids = lang_ids  # FLORES-200 code -> NLLB id, in id order
        self.mask_id = mask_id
        self.piece_of_id = {int(nllb): sp_id for sp_id, nllb in enumerate(piece_ids) if sp_id >= 3 and nllb > UNK_ID}
        self.id_to_lang = {i: code for code, i in lang_ids.items()}
        self.size = max(mask_id, max(lang_ids.values(), default=0), int(piece_ids.max(initial=0))) + 1  # ids the model must have
        self.piece_table: list[str] | None = None  # id -> piece text ("" where decode skips), made on first decode
        # transformers' tokenizer keeps a whitespace at the end of the text as a lone "▁" piece, where
        # sentencepiece drops it; its normaliser without whitespace removal tells whether the text ends in one.
        self.space_id = int(piece_ids[sp.PieceToId(SPACE)])
        self.normalizer = spm.SentencePieceNormalizer(
            model_proto=sp.serialized_model_proto(), remove_extra_whitespaces=False, add_dummy_prefix=False,
            escape_whitespaces=False,
        )

    @classmethod
    def from_model_dir(cls, model_dir: Path, config=None) -> "NllbTokenizer":
        """Load `sentencepiece.bpe.model`, with `tokenizer.json`'s ids where the directory ships one."""
        sp = load_sentencepiece(model_dir)
        tokenizer_json = model_dir / "tokenizer.json"
        if tokenizer_json.is_file():
            tokenizer = cls.from_tokenizer_json(sp, tokenizer_json)
        else:
            tokenizer = cls.from_rules(sp)
        check_fits_model(tokenizer, model_dir, config)
        return tokenizer

    @classmethod
    def from_rules(cls, sp: spm.SentencePieceProcessor, lang_codes=FLORES_200_CODES) -> "NllbTokenizer":
        size = sp.GetPieceSize()
        piece_ids = np.arange(size, dtype=np.int64) + FAIRSEQ_OFFSET
        piece_ids[:3] = (UNK_ID, BOS_ID, EOS_ID)  # sentencepiece's own <unk> <s> </s>
        first_lang = size + FAIRSEQ_OFFSET
        lang_ids = {code: first_lang + i for i, code in enumerate(lang_codes)}
        return cls(sp, piece_ids, lang_ids, first_lang + len(lang_codes))

    @classmethod
    def from_tokenizer_json(cls, sp: spm.SentencePieceProcessor, path: Path) -> "NllbTokenizer":
        data = read_json_object(path)
        model = json_value(path, "model", data.get("model"), dict)
        vocab = model.get("vocab")
        if isinstance(vocab, list):  # a Unigram model stores [piece, score] pairs, ids by position
            for i, pair in enumerate(vocab):
                if not (type(pair) is list and len(pair) == 2 and type(pair[0]) is str):
                    raise NllbError(f"{path}: model.vocab[{i}] must be a [piece, score] pair, not {shown(pair)}")
            vocab = {piece: i for i, (piece, _score) in enumerate(vocab)}
        else:
            check_ids(path, json_value(path, "model.vocab", vocab, dict), "model.vocab")
        added = data.get("added_tokens")
        added_ids = {}
        for n, token in enumerate(json_value(path, "added_tokens", [] if added is None else added, list)):
            json_value(path, f"added_tokens[{n}]", token, dict)
            content = json_value(path, f"added_tokens[{n}].content", token.get("content"), str)
            added_ids[content] = json_int(path, f"added_tokens[{n}].id", token.get("id"))
        ids = {**vocab, **added_ids}
        for token, expected in zip(SPECIAL_TOKENS, (BOS_ID, PAD_ID, EOS_ID, UNK_ID)):
            if ids.get(token) != expected:
                raise NllbError(f"{path}: {token} has id {ids.get(token)}, not {expected}: not an NLLB tokenizer")
        size = sp.GetPieceSize()
        piece_ids = np.array([ids.get(sp.IdToPiece(i), UNK_ID) for i in range(size)], dtype=np.int64)
        piece_ids[:3] = (UNK_ID, BOS_ID, EOS_ID)
        lang_ids = dict(sorted(((c, i) for c, i in added_ids.items() if LANG_CODE.match(c)), key=lambda ci: ci[1]))
        if not lang_ids:
            raise NllbError(f"{path} lists no language codes (such as eng_Latn): not an NLLB tokenizer")
        mask_id = ids.get("<mask>", max(ids.values()) + 1)
        return cls(sp, piece_ids, lang_ids, mask_id)

    def encode_pieces(self, text: str, sp_ids: list[int] | None = None) -> list[int]:
        """NLLB ids of the sentencepiece pieces of `text` (sp_ids: sentencepiece's ids of it, where known),
        without language or end tokens."""
        lookup = self.piece_list
        ids = [lookup[i] for i in (self.sp.EncodeAsIds(text) if sp_ids is None else sp_ids)]
        if text and not text[-1].isalnum() and self.normalizer.Normalize(text).endswith(" "):
            ids.append(self.space_id)
        return ids

    def decode(self, ids) -> str:
        """Text of generated ids; special tokens, language codes and `<mask>` are skipped."""
        return self.decode_many([ids])[0]

    def decode_many(self, outputs: list) -> list[str]:
        """decode(ids) of each list of ids, a table lookup an id inside map(): a batch's thousands of sentences
        are decoded on the main thread between the GPU's batches. As transformers' Metaspace decoder: every "▁"
        becomes a space, and one leading space goes."""
        table = self.piece_table
        if table is None:  # id -> piece, "" for the ids decode skips: sentencepiece asked once, for every piece
            size = max(self.mask_id, max(self.id_to_lang, default=0), max(self.piece_of_id, default=0)) + 1
            table = [""] * size
            nllb_ids = list(self.piece_of_id)
            for i, piece in zip(nllb_ids, self.sp.IdToPiece([self.piece_of_id[i] for i in nllb_ids])):
                table[i] = piece
            self.piece_table = table
        size, get = len(table), table.__getitem__
        texts = []
        for ids in outputs:
            if len(ids) and (min(ids) < 0 or max(ids) >= size):  # ids past the tokenizer's: skipped too
                pieces = (table[i] if 0 <= i < size else "" for i in ids)
            else:
                pieces = map(get, ids)
            text = "".join(pieces).replace(SPACE, " ")
            texts.append(text[1:] if text.startswith(" ") else text)
        return texts


class M2M100Tokenizer(SentencePieceTokenizer):
    """M2M-100's tokenizer, as transformers' M2M100Tokenizer: ids from vocab.json, languages as `__xx__` tokens."""

    def __init__(self, sp: spm.SentencePieceProcessor, vocab: dict[str, int], lang_codes=M2M100_CODES, madeup_words: int = 8):
        self.sp = sp
        unk = vocab["<unk>"]
        # sentencepiece id -> model id: a piece fairseq's dictionary lacks is <unk>, as transformers maps it
        self.piece_ids = np.array([vocab.get(sp.IdToPiece(i), unk) for i in range(sp.GetPieceSize())], dtype=np.int64)
        self.piece_list = self.piece_ids.tolist()
        self.piece_of_id = {i: piece for piece, i in vocab.items() if piece not in SPECIAL_TOKENS}
        first_lang = len(vocab)
        self.lang_ids = {code: first_lang + i for i, code in enumerate(lang_codes)}  # "en" -> id of "__en__"
        self.size = first_lang + len(lang_codes) + madeup_words  # ids the model must have

    @classmethod
    def from_model_dir(cls, model_dir: Path, config=None) -> "M2M100Tokenizer":
        """Load `vocab.json` and `sentencepiece.bpe.model`, as M2M-100's hub repositories ship them."""
        sp = load_sentencepiece(model_dir)
        path = model_dir / "vocab.json"
        vocab = check_ids(path, read_json_object(path))
        for token, expected in zip(SPECIAL_TOKENS, (BOS_ID, PAD_ID, EOS_ID, UNK_ID)):
            if vocab.get(token) != expected:
                raise NllbError(f"{path}: {token} has id {vocab.get(token)}, not {expected}: not an M2M-100 vocabulary")
        if sorted(vocab.values()) != list(range(len(vocab))):
            raise NllbError(f"{path}: the ids are not 0..{len(vocab) - 1} each once: not an M2M-100 vocabulary")
        codes = read_tokenizer_config(model_dir).get("language_codes")
        if codes not in (None, "m2m100"):  # wmt21's 8 languages and others: their ids would silently be wrong
            raise NllbError(f"{model_dir}: tokenizer_config.json sets language_codes {codes!r}; nllbcli knows M2M-100's 100 (m2m100)")
        tokenizer = cls(sp, vocab)
        check_fits_model(tokenizer, model_dir, config)
        return tokenizer

    def encode_pieces(self, text: str, sp_ids: list[int] | None = None) -> list[int]:
        lookup = self.piece_list
        return [lookup[i] for i in (self.sp.EncodeAsIds(text) if sp_ids is None else sp_ids)]

    def decode(self, ids) -> str:
        """Text of generated ids; special tokens, language tokens and madeup words are skipped."""
        pieces = [self.piece_of_id[i] for i in map(int, ids) if i in self.piece_of_id]
        return self.sp.DecodePieces(pieces).strip()


def load_sentencepiece(model_dir: Path) -> spm.SentencePieceProcessor:
    """The directory's sentencepiece model, or an error that says what is missing."""
    model_file = model_dir / "sentencepiece.bpe.model"
    if not model_file.is_file():
        raise NllbError(
            f"{model_dir} has no sentencepiece.bpe.model: copy it from the model's hub repository "
            "(nllbcli tokenizes with sentencepiece)"
        )
    sp = spm.SentencePieceProcessor()
    try:  # from its bytes: sentencepiece takes a file name as UTF-8, which a Linux path need not be
        sp.LoadFromSerializedProto(model_file.read_bytes())
    except OSError as exc:
        raise NllbError(f"cannot read {model_file}: {exc.strerror or exc}") from None
    except RuntimeError:
        raise NllbError(f"cannot read {model_file}: it is not a sentencepiece model") from None
    return sp


def check_ids(path: Path, ids: dict, key: str = "") -> dict:
    """A vocabulary's piece -> id object, every id an integer from 0 to MAX_ID, else an error naming the piece."""
    piece = next((p for p, i in ids.items() if not (type(i) is int and 0 <= i <= MAX_ID)), None)
    if piece is not None:
        json_int(path, f"{key}[{quoted(piece)}]" if key else f"the id of {quoted(piece)}", ids[piece])
    return ids


def check_fits_model(tokenizer: "NllbTokenizer | M2M100Tokenizer", model_dir: Path, config) -> None:
    """The tokenizer's ids must be rows of the model's embedding (vocab_size), and config.json's <pad> and </s> the
    tokenizer's: it ends every source with </s>, while the engines pad and mask by pad_token_id and the search
    stops at eos_token_id (nothing to check without a config)."""
    if config is None:
        return
    if tokenizer.size > config.vocab_size:
        raise NllbError(
            f"{model_dir}: the tokenizer has {tokenizer.size} ids but the model's vocab_size is "
            f"{config.vocab_size}: the tokenizer files do not belong to this model"
        )
    check_special_ids(config, model_dir)


def check_special_ids(config, model_dir: Path) -> None:
    """config.json's pad_token_id and eos_token_id must be <pad>'s and </s>'s ids in both tokenizers (1 and 2)."""
    for key, token, expected in (("pad_token_id", "<pad>", PAD_ID), ("eos_token_id", "</s>", EOS_ID)):
        if getattr(config, key) != expected:
            raise NllbError(f"{model_dir / 'config.json'}: {key} is {getattr(config, key)}, but {token} is token "
                            f"{expected} in NLLB's and M2M-100's vocabularies: the config does not belong to this tokenizer")


def read_tokenizer_config(model_dir: Path) -> dict:
    """tokenizer_config.json's object ({} where the directory has none), the keys nllbcli reads checked: a
    string or null each."""
    path = model_dir / "tokenizer_config.json"
    if not path.is_file():
        return {}
    declared = read_json_object(path)
    for key in ("tokenizer_class", "language_codes"):
        if declared.get(key) is not None:
            json_value(path, key, declared[key], str)
    return declared


def tokenizer_family(model_dir: Path) -> str:
    """"m2m100" or "nllb", from the files present: tokenizer_config.json's tokenizer_class when it names one,
    else vocab.json without tokenizer.json means M2M-100 (its hub repositories ship no tokenizer.json)."""
    declared = read_tokenizer_config(model_dir).get("tokenizer_class") or ""  # a string or null: checked
    if declared.startswith("M2M100"):
        return "m2m100"
    if declared.startswith("Nllb"):
        return "nllb"
    if (model_dir / "vocab.json").is_file() and not (model_dir / "tokenizer.json").is_file():
        return "m2m100"
    return "nllb"


def tokenizer_from_model_dir(model_dir: Path, config=None) -> "NllbTokenizer | M2M100Tokenizer":
    """The tokenizer a model directory holds, NLLB's or M2M-100's."""
    if tokenizer_family(model_dir) == "m2m100":
        return M2M100Tokenizer.from_model_dir(model_dir, config)
    return NllbTokenizer.from_model_dir(model_dir, config)
