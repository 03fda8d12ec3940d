"""The NLLB tokenizer on sentencepiece against transformers' NllbTokenizer (goldens kept in the repo)."""

import json
import shutil
from functools import lru_cache
from pathlib import Path

import pytest
import sentencepiece as spm

from nllbcli.errors import NllbError
from nllbcli.model.langs import FLORES_200_CODES
from nllbcli.model.tokenizer import NllbTokenizer

HERE = Path(__file__).parent
MODELS = ("tiny-a", "tiny-b")


@lru_cache(maxsize=None)
def tokenizer(name):
    return NllbTokenizer.from_model_dir(HERE / "models" / name)


@lru_cache(maxsize=None)
def golden(name):
    return json.loads((HERE / "golden" / f"{name}.json").read_text(encoding="utf-8"))


def encode_cases():
    for name in MODELS:
        for i, case in enumerate(golden(name)["tokenizer"]):
            yield pytest.param(name, i, id=f"{name}-{case['src_lang']}-{case['text'][:24]!r}")


@pytest.mark.parametrize("name,index", list(encode_cases()))
def test_encode_and_decode_match_transformers(name, index):
    case = golden(name)["tokenizer"][index]
    tok = tokenizer(name)
    assert tok.encode(case["text"], case["src_lang"]) == case["ids"]
    assert tok.decode(case["ids"]) == case["decoded"]


@pytest.mark.parametrize("name", MODELS + ("tiny-m2m",))
def test_encode_many_gives_each_texts_encode(name):
    """One sentencepiece call for many texts, the transformers goldens' texts among them; a text sentencepiece
    cannot take (a lone surrogate) fails alone, with encode's own error, and the others still come out."""
    from nllbcli.model.tokenizer import tokenizer_from_model_dir

    tok = tokenizer_from_model_dir(HERE / "models" / name)
    cases = golden("tiny-a")["tokenizer"]
    src = "en" if name == "tiny-m2m" else None
    texts = [c["text"] for c in cases] + ["Hello, world!", "", "x" * 3000]
    langs = [src or c["src_lang"] for c in cases] + [src or "eng_Latn"] * 3
    assert tok.encode_many(texts, langs) == [tok.encode(t, lang) for t, lang in zip(texts, langs)]
    bad = "bad \ud800 text"
    with pytest.raises(Exception) as alone:
        tok.encode(bad, langs[0])
    got = tok.encode_many([texts[0], bad, texts[1]], langs[:3])
    assert got[0] == tok.encode(texts[0], langs[0]) and got[2] == tok.encode(texts[1], langs[2])
    assert type(got[1]) is type(alone.value) and str(got[1]) == str(alone.value)


def test_encode_many_in_several_calls(monkeypatch):
    """Many texts go to sentencepiece a few at a time (ENCODE_CALL): the same ids, in order, over the calls'
    edges, and a bad text still fails alone."""
    import nllbcli.model.tokenizer as tokenizer_module

    tok = tokenizer_module.tokenizer_from_model_dir(HERE / "models" / "tiny-a")
    texts = [f"Sentence number {i}, {'with more words ' * (i % 5)}done." for i in range(23)]
    langs = ["eng_Latn"] * len(texts)
    want = [tok.encode(t, "eng_Latn") for t in texts]
    monkeypatch.setattr(tokenizer_module, "ENCODE_CALL", 4)
    assert tok.encode_many(texts, langs) == want
    got = tok.encode_many(texts[:5] + ["bad \ud800 text"] + texts[5:], langs + ["eng_Latn"])
    assert got[:5] + got[6:] == want and isinstance(got[5], Exception)


@pytest.mark.parametrize("name", MODELS)
def test_decode_skips_special_and_language_tokens_as_transformers(name):
    tok = tokenizer(name)
    for case in golden(name)["decode"]:
        assert tok.decode(case["ids"]) == case["decoded"], case["ids"]


@pytest.mark.parametrize("name", MODELS)
def test_ids_follow_nllb_rules(name):
    tok = tokenizer(name)
    sp = spm.SentencePieceProcessor(model_file=str(HERE / "models" / name / "sentencepiece.bpe.model"))
    size = sp.get_piece_size()
    assert tok.lang_codes == list(FLORES_200_CODES)
    assert tok.lang_id("ace_Arab") == size + 1
    assert tok.lang_id("eng_Latn") == size + 1 + FLORES_200_CODES.index("eng_Latn")
    assert tok.lang_id("zul_Latn") == size + 202
    assert tok.mask_id == size + 203
    assert tok.piece_ids[:5].tolist() == [3, 0, 2, 4, 5]  # <unk> <s> </s>, then piece i at i + 1
    ids = tok.encode("Hello world", "fra_Latn")
    assert ids[0] == tok.lang_id("fra_Latn") and ids[-1] == 2
    assert ids[1:-1] == [i + 1 for i in sp.encode("Hello world")]


def test_tokenizer_json_ids_agree_with_the_rules():
    """tiny-a ships tokenizer.json; reading it or applying NLLB's rules must give the same ids."""
    from_json = tokenizer("tiny-a")
    sp = spm.SentencePieceProcessor(model_file=str(HERE / "models" / "tiny-a" / "sentencepiece.bpe.model"))
    from_rules = NllbTokenizer.from_rules(sp)
    assert from_json.lang_ids == from_rules.lang_ids
    assert from_json.mask_id == from_rules.mask_id
    assert from_json.piece_ids.tolist() == from_rules.piece_ids.tolist()


def test_ids_come_from_tokenizer_json_where_it_ships(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(HERE / "models" / "tiny-a", model)
    data = json.loads((model / "tokenizer.json").read_text(encoding="utf-8"))
    for token in data["added_tokens"]:
        if token["content"] == "fra_Latn":
            token["id"] = 5000
    (model / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    assert NllbTokenizer.from_model_dir(model).lang_id("fra_Latn") == 5000


def test_unknown_language_names_the_closest_codes():
    with pytest.raises(NllbError, match="fra_Latn"):
        tokenizer("tiny-a").lang_id("fra_Latm")
    with pytest.raises(NllbError, match="eng_Latn"):
        tokenizer("tiny-a").lang_id("en")


def test_missing_sentencepiece_model_is_explained(tmp_path):
    with pytest.raises(NllbError, match="sentencepiece.bpe.model"):
        NllbTokenizer.from_model_dir(tmp_path)


def test_tokenizer_json_that_is_not_nllb_is_refused(tmp_path):
    shutil.copy(HERE / "models" / "tiny-a" / "sentencepiece.bpe.model", tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"<unk>": 0}}, "added_tokens": []}))
    with pytest.raises(NllbError, match="not an NLLB tokenizer"):
        NllbTokenizer.from_model_dir(tmp_path)


@pytest.mark.parametrize("name", MODELS)
def test_decode_many_is_decode_of_each(name):
    """The batch path (a table of pieces) gives each id list's text as sentencepiece's pieces would: pieces,
    special and language tokens, <mask>, and ids past the tokenizer's (skipped) alike."""
    import random

    tok = tokenizer(name)
    rng = random.Random(0)
    top = tok.mask_id + 3
    outputs = [[rng.randrange(top) for _ in range(rng.randrange(0, 30))] for _ in range(300)]
    outputs += [[], [4, 5, 6], [tok.mask_id, tok.lang_id("fra_Latn"), 2, 1, 0, 3], [top + 10, 7], [-1, 8]]

    def one_by_one(ids):  # each id's piece from sentencepiece itself
        text = "".join(tok.sp.IdToPiece(tok.piece_of_id[i]) if i in tok.piece_of_id else "" for i in ids)
        text = text.replace("\u2581", " ")
        return text[1:] if text.startswith(" ") else text

    want = [one_by_one(ids) for ids in outputs]
    assert tok.decode_many(outputs) == want
    assert [tok.decode(ids) for ids in outputs] == want  # the table made once, reused


def test_special_token_strings_in_text_are_text():
    """`</s>`, `<unk>`, `<pad>` and language codes inside a text are spelled out as pieces, never the special
    ids (docs/FORMATS.md: transformers differs here, on purpose)."""
    from nllbcli.model.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, tokenizer_from_model_dir

    tok = tokenizer_from_model_dir(HERE.parent / "data" / "samples" / "model")
    for text in ("Hello </s> world", "x<s>y <pad>", "fra_Latn is here", "a <mask> b"):
        ids = tok.encode(text, "eng_Latn")
        assert ids[0] == tok.lang_id("eng_Latn") and ids[-1] == EOS_ID
        inner = ids[1:-1]
        assert not {BOS_ID, PAD_ID, EOS_ID} & set(inner)
        assert not set(inner) & (set(tok.lang_ids.values()) | {tok.mask_id})
        assert len(inner) > 1 and inner != [UNK_ID] * len(inner)  # pieces of the text (a few unknown to the small vocabulary)
