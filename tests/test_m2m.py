"""M2M-100: its tokenizer and language codes against transformers' M2M100Tokenizer, and generation on a tiny
M2M-format model (tests/models/tiny-m2m, the file layout of facebook/m2m100_418M: pytorch_model.bin, vocab.json,
sentencepiece.bpe.model, no tokenizer.json) against transformers' `generate`. Goldens: tools/make_m2m_fixtures.py."""

import json
import shutil
from functools import lru_cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from nllbcli.cli import cli
from nllbcli.errors import NllbError
from nllbcli.model.langs import FLORES_200_CODES, M2M100_CODES, resolve_lang
from nllbcli.options import DecodeOptions
from nllbcli.model.tokenizer import M2M100Tokenizer, NllbTokenizer, tokenizer_from_model_dir
from nllbcli.model.translator import load_translator

HERE = Path(__file__).parent
MODEL = HERE / "models" / "tiny-m2m"


@lru_cache(maxsize=None)
def golden():
    return json.loads((HERE / "golden" / "tiny-m2m.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def translator():
    return load_translator(str(MODEL), "cpu")


def test_the_family_is_chosen_from_the_files():
    assert isinstance(tokenizer_from_model_dir(MODEL), M2M100Tokenizer)
    assert isinstance(tokenizer_from_model_dir(HERE / "models" / "tiny-a"), NllbTokenizer)  # tokenizer.json
    assert isinstance(tokenizer_from_model_dir(HERE / "models" / "tiny-b"), NllbTokenizer)  # sentencepiece alone


def test_vocab_json_without_tokenizer_config_is_m2m(tmp_path):
    for name in ("vocab.json", "sentencepiece.bpe.model"):
        shutil.copy(MODEL / name, tmp_path)
    assert isinstance(tokenizer_from_model_dir(tmp_path), M2M100Tokenizer)


def test_language_tokens_follow_the_vocabulary():
    tok = tokenizer_from_model_dir(MODEL)
    vocab = json.loads((MODEL / "vocab.json").read_text(encoding="utf-8"))
    assert tok.lang_codes == list(M2M100_CODES) and len(M2M100_CODES) == 100
    assert tok.lang_id("af") == len(vocab) and tok.lang_id("en") == len(vocab) + 18 and tok.lang_id("zu") == len(vocab) + 99
    assert tok.size == len(vocab) + 108 == translator().config.vocab_size  # 8 madeup words last


@pytest.mark.parametrize("index", range(len(golden()["tokenizer"])), ids=lambda i: f"text{i}")
def test_encode_matches_transformers(index):
    case = golden()["tokenizer"][index]
    tok = translator().tokenizer
    ids = tok.encode(case["text"], case["src_lang"])
    assert ids == case["ids"]
    assert tok.decode(ids) == case["decoded"]


def test_decode_matches_transformers():
    tok = translator().tokenizer
    for case in golden()["decode"]:
        assert tok.decode(case["ids"]) == case["decoded"], case["ids"]


@pytest.mark.parametrize("index", range(len(golden()["generate"])), ids=lambda i: f"case{i}")
def test_reference_model_matches_transformers_generate(index):
    case = golden()["generate"][index]
    tr = translator()
    sources = [tr.tokenizer.encode(t, case["src_lang"]) for t in case["texts"]]
    assert sources == case["input_ids"]
    outputs = tr.generate(sources, case["tgt_lang"], DecodeOptions(beam_size=case["beam_size"], max_length=case["max_length"]))
    assert outputs == case["output_ids"]
    assert [tr.tokenizer.decode(o) for o in outputs] == case["output_texts"]


@pytest.mark.parametrize("typed,code", [
    ("en", "en"), ("EN", "en"), ("eng_Latn", "en"), ("eng", "en"), ("en-US", "en"), ("fra_Latn", "fr"), ("fre", "fr"),
    ("arb_Arab", "ar"), ("zho_Hans", "zh"), ("zh", "zh"), ("srp_Cyrl", "sr"), ("nso_Latn", "ns"), ("tgl_Latn", "tl"),
    ("swh_Latn", "sw"), ("pes_Arab", "fa"), ("azj_Latn", "az"), ("iw", "he"), ("ekk_Latn", "et"), ("est_Latn", "et"),
    ("kor_Hang", "ko"), ("ory_Orya", "or"), ("nob_Latn", "no"), ("ast_Latn", "ast"), ("ceb", "ceb"),
])
def test_codes_users_type_resolve_to_m2m_codes(typed, code):
    assert resolve_lang(typed, M2M100_CODES) == code


def test_every_m2m_code_resolves_to_itself():
    for code in M2M100_CODES:
        assert resolve_lang(code, M2M100_CODES) == code


@pytest.mark.parametrize("typed,message", [
    ("zho_Hant", "language code 'zho_Hant' asks for Hant script; M2M-100 has one code for the language, 'zh', mostly trained on Hans script: use zh if that is meant."),
    ("zh-TW", "language code 'zh-TW' asks for Hant script"),
    ("azb_Arab", "unknown language code 'azb_Arab': the model knows 100 M2M-100 codes such as en."),
    ("xx", "unknown language code 'xx': the model knows 100 M2M-100 codes such as en. Did you mean xh?"),
])
def test_codes_m2m_lacks_are_refused_with_a_reason(typed, message):
    with pytest.raises(NllbError) as caught:
        resolve_lang(typed, M2M100_CODES)
    assert str(caught.value).startswith(message)


def test_nllb_resolution_is_unchanged():
    assert resolve_lang("en", FLORES_200_CODES) == "eng_Latn"
    assert resolve_lang("fr", FLORES_200_CODES) == "fra_Latn"


def test_langs_lists_m2m_codes():
    result = CliRunner().invoke(cli, ["langs", "--model", str(MODEL)])
    assert result.exit_code == 0
    assert [line.split()[0] for line in result.output.splitlines()] == list(M2M100_CODES)


@pytest.mark.parametrize("model", [str(MODEL), str(HERE / "models" / "tiny-a")])
def test_translate_en_fr_works_for_both_families(model):
    result = CliRunner().invoke(cli, ["translate", "-q", "--device", "cpu", "--model", model, "--src", "en", "--tgt", "fr",
                                      "--max-length", "8"], input="Hello world!\n")
    assert result.exit_code == 0, result.output
    assert len(result.output.splitlines()) == 1


def test_translate_m2m_matches_the_golden_through_the_cli():
    case = next(c for c in golden()["generate"] if c["beam_size"] == 1 and c["src_lang"] == "en")
    result = CliRunner().invoke(cli, ["translate", "-q", "--device", "cpu", "--model", str(MODEL), "--src", "eng_Latn",
                                      "--tgt", "fra_Latn", "--beam-size", "1", "--max-length", str(case["max_length"]), "--no-split"],
                                input="".join(t + "\n" for t in case["texts"]))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == case["output_texts"]


def test_unknown_m2m_code_is_one_line_exit_2():
    result = CliRunner().invoke(cli, ["translate", "--model", str(MODEL), "--src", "en", "--tgt", "zz"], input="a\n")
    assert result.exit_code == 2
    assert "Invalid value for '--tgt': unknown language code 'zz': the model knows 100 M2M-100 codes" in result.output
    assert "Traceback" not in result.output


def test_a_broken_vocab_json_is_one_clear_error(tmp_path):
    for name in ("sentencepiece.bpe.model", "tokenizer_config.json", "config.json"):
        shutil.copy(MODEL / name, tmp_path)
    (tmp_path / "vocab.json").write_text('{"<s>": 0, "</s>": 1}', encoding="utf-8")
    result = CliRunner().invoke(cli, ["langs", "--model", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output == f"Error: {tmp_path / 'vocab.json'}: <pad> has id None, not 1: not an M2M-100 vocabulary\n"
    (tmp_path / "vocab.json").unlink()
    result = CliRunner().invoke(cli, ["langs", "--model", str(tmp_path)])
    assert result.exit_code == 1 and result.output.startswith(f"Error: cannot read {tmp_path / 'vocab.json'}:")


def test_convert_keeps_the_m2m_tokenizer(tmp_path):
    result = CliRunner().invoke(cli, ["convert", str(MODEL), str(tmp_path / "bf16")])
    assert result.exit_code == 0, result.output
    converted = tokenizer_from_model_dir(tmp_path / "bf16")
    assert isinstance(converted, M2M100Tokenizer)
    assert converted.encode("Hello world!", "en") == translator().tokenizer.encode("Hello world!", "en")


def test_other_language_code_sets_are_refused(tmp_path):
    for name in ("vocab.json", "sentencepiece.bpe.model"):
        shutil.copy(MODEL / name, tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "M2M100Tokenizer", "language_codes": "wmt21"}')
    with pytest.raises(NllbError, match="sets language_codes 'wmt21'; nllbcli knows M2M-100's 100"):
        tokenizer_from_model_dir(tmp_path)
