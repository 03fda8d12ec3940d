"""Decoding defaults from a model directory's generation_config.json, as transformers' `generate` takes them
(goldens from tools/make_genconfig_golden.py), with the command line's options winning."""

import json
import shutil
from functools import lru_cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from nllbcli.model.checkpoint import generation_defaults
from nllbcli.cli import cli, decode_options
from nllbcli.errors import NllbError
from nllbcli.options import DecodeOptions
from nllbcli.model.translator import load_translator

HERE = Path(__file__).parent
GOLDEN = json.loads((HERE / "golden" / "tiny-a-genconfig.json").read_text(encoding="utf-8"))


def model_with(tmp_path: Path, settings: dict) -> Path:
    model = tmp_path / "model"
    if not model.exists():
        shutil.copytree(HERE / "models" / "tiny-a", model)
    (model / "generation_config.json").write_text(json.dumps({**GOLDEN["special"], **settings}), encoding="utf-8")
    return model


@lru_cache(maxsize=None)
def translator():
    return load_translator(str(HERE / "models" / "tiny-a"), "cpu")


@pytest.mark.parametrize("settings, expected", [
    ({"max_length": 200}, {"max_length": 199}),  # NLLB's: the decoder's start token counts in max_length
    ({"max_length": 50, "max_new_tokens": 6}, {"max_length": 6}),
    ({"num_beams": 3, "length_penalty": 0.6, "no_repeat_ngram_size": 2, "repetition_penalty": 1.3, "max_length": None},
     {"beam_size": 3, "length_penalty": 0.6, "no_repeat_ngram_size": 2, "repetition_penalty": 1.3}),
    ({"do_sample": False, "early_stopping": False}, {}),
    ({"min_length": 5}, {"min_length": 4}),  # as max_length: the decoder's start token counts
    ({"min_length": 5, "min_new_tokens": 2}, {"min_length": 2}),
    ({"min_length": 0}, {}),
])
def test_the_files_settings_as_decode_options(tmp_path, settings, expected):
    assert generation_defaults(model_with(tmp_path, settings)) == expected


def test_a_model_without_the_file_keeps_nllbs_defaults(tmp_path):
    model = model_with(tmp_path, {})
    (model / "generation_config.json").unlink()
    assert decode_options(str(model)) == DecodeOptions()


@pytest.mark.parametrize("settings, message", [
    ({"num_beams": 0}, "num_beams must be an integer from 1"),
    ({"max_length": "long"}, "max_length must be an integer"),
    ({"length_penalty": "high"}, "length_penalty must be a number"),
    ({"repetition_penalty": -1}, "repetition_penalty must be above 0"),
    ({"repetition_penalty": 1e300}, r"repetition_penalty must be above 0 \(from 1e-30 to 1e\+30\), not 1e\+300"),
    ({"num_beams": 1025}, "num_beams must be an integer from 1 to 1,024"),
    ({"max_new_tokens": 10**9}, "max_new_tokens must be an integer from 1 to 65,536"),
    ({"max_length": 10**9}, "max_length must be an integer from 2 to 65,537"),
    ({"min_new_tokens": 10**9}, "min_new_tokens must be an integer from 0 to 65,536"),
    ({"no_repeat_ngram_size": 10**9}, "no_repeat_ngram_size must be an integer from 0 to 65,536"),
    ({"length_penalty": 400}, "length_penalty must be from -7.0 to 7.0, not 400"),
])
def test_a_bad_setting_is_one_line_naming_the_file(tmp_path, settings, message):
    with pytest.raises(NllbError, match=message):
        generation_defaults(model_with(tmp_path, settings))
    result = CliRunner().invoke(cli, ["translate", "-m", str(tmp_path / "model"), "--src", "eng_Latn", "--tgt",
                                      "fra_Latn"], input="Hello!\n")
    assert result.exit_code == 1 and "generation_config.json" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("index", range(len(GOLDEN["cases"])))
def test_the_files_settings_decode_as_transformers_generate_does(tmp_path, index):
    case = GOLDEN["cases"][index]
    # transformers' own default is greedy search, nllb's 4 beams: where the file names no num_beams, say 1
    given = {} if "num_beams" in case["generation_config"] else {"beam_size": 1}
    options = decode_options(str(model_with(tmp_path, case["generation_config"])), **given)
    tr = translator()
    sources = [tr.tokenizer.encode(text, case["src_lang"]) for text in case["texts"]]
    assert sources == case["input_ids"]
    assert tr.generate(sources, case["tgt_lang"], options) == case["output_ids"]


def test_the_command_line_wins_over_the_file(tmp_path):
    case = next(c for c in GOLDEN["cases"] if "num_beams" in c["generation_config"] and c["src_lang"] == "eng_Latn")
    model = model_with(tmp_path, case["generation_config"])
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in case["texts"]), encoding="utf-8")

    def translated(*options: str) -> list[str]:
        result = CliRunner().invoke(cli, ["translate", "-q", "-m", str(model), "--src", "eng_Latn", "--tgt",
                                          "fra_Latn", "--no-split", *options, str(source), str(tmp_path / "out.jsonl")])
        assert result.exit_code == 0, result.output
        return [json.loads(line)["translation"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]

    assert translated() == case["output_texts"]  # the file's settings, as transformers' generate follows them
    tr = translator()
    sources = [tr.tokenizer.encode(text, "eng_Latn") for text in case["texts"]]
    mine = DecodeOptions(beam_size=1, max_length=3, length_penalty=0.6, no_repeat_ngram_size=2)
    assert translated("--beam-size", "1", "--max-length", "3") == [
        tr.tokenizer.decode(ids) for ids in tr.generate(sources, "fra_Latn", mine)]


def test_the_api_without_decode_options_decodes_as_the_command(tmp_path):
    import nllbcli

    case = next(c for c in GOLDEN["cases"] if "num_beams" in c["generation_config"] and c["src_lang"] == "eng_Latn")
    translator = nllbcli.load(str(model_with(tmp_path, case["generation_config"])), "cpu")
    results = nllbcli.translate(translator, case["texts"], "eng_Latn", "fra_Latn", split=False)
    assert [r.text for r in results] == case["output_texts"]
