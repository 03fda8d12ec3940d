"""Every numeric option bounded where its meaning ends: the command refuses a value past its bound (huge,
negative, zero, inf, nan) with exit 2 before any work, naming the option; the option records (what the API, Spark
and Ray take) raise ValueError naming the field. What only the model knows, its vocabulary and the memory a beam
takes (tests/test_translator.py), is one sentence when the job meets it, never a traceback."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest
from click.testing import CliRunner

import nllbcli
from nllbcli.cli import cli
from nllbcli.options import BatchOptions, DecodeOptions, Job

TINY = str(Path(__file__).parent / "models" / "tiny-a")
TRANSLATE = ["translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn"]
HUGE = "99999999999999999999"
SAMPLING = ["--sampling-topk", "0"]


@lru_cache(maxsize=1)
def tiny():
    return nllbcli.load(TINY, "cpu")


@pytest.mark.parametrize("option, value, others", [
    ("--beam-size", "100000", []), ("--beam-size", HUGE, []), ("--beam-size", "0", []),
    ("--max-length", HUGE, []), ("--max-length", "65537", []), ("--max-length", "-1", []),
    ("--length-penalty", "400", ["--beam-size", "4"]), ("--length-penalty", "-7.5", []),
    ("--length-penalty", "inf", []), ("--length-penalty", "nan", []),
    ("--no-repeat-ngram-size", HUGE, []), ("--no-repeat-ngram-size", "-1", []),
    ("--repetition-penalty", "inf", []), ("--repetition-penalty", "nan", []), ("--repetition-penalty", "0", []),
    ("--repetition-penalty", "1e-40", []),
    ("--min-length", HUGE, []), ("--min-length", "-1", []),
    ("--max-length-a", "1e308", []), ("--max-length-a", "inf", []), ("--max-length-a", "nan", []),
    ("--max-length-a", "-1", []),
    ("--max-length-b", HUGE, []), ("--max-length-b", "-5", []),
    ("--num-hypotheses", "100000", SAMPLING), ("--num-hypotheses", "0", []),
    ("--sampling-topk", HUGE, []), ("--sampling-topk", "-1", []),
    ("--sampling-topp", "nan", []), ("--sampling-topp", "inf", []), ("--sampling-topp", "0", []),
    ("--sampling-temperature", "inf", SAMPLING), ("--sampling-temperature", "nan", SAMPLING),
    ("--sampling-temperature", "0", SAMPLING), ("--sampling-temperature", "1e-40", SAMPLING),
    ("--seed", HUGE, SAMPLING), ("--seed", str(2**64), SAMPLING), ("--seed", "-1", SAMPLING),
    ("--max-batch-tokens", HUGE, []), ("--max-batch-tokens", "0", []),
    ("--max-batch-sentences", HUGE, []), ("--max-batch-sentences", "-1", []),
    ("--chunk-rows", HUGE, []), ("--chunk-rows", "0", []),
    ("--threads", HUGE, []), ("--threads", "8193", []),
])
def test_a_value_past_an_options_bound_is_refused_before_any_work(fake, option, value, others):
    result = CliRunner().invoke(cli, TRANSLATE + others + [option, value], input="ab\n")
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1].startswith(f"Error: Invalid value for '{option}'")
    assert fake.batches == []


@pytest.mark.parametrize("value", [HUGE, "2"])
def test_max_input_length_is_refused_past_the_positions_of_any_model(fake, value):
    result = CliRunner().invoke(cli, TRANSLATE + ["--max-input-length", value], input="ab\n")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and fake.batches == []
    assert result.stderr == {HUGE: f"Error: --max-input-length is at most 65,536 (no model has more positions), not {HUGE}.\n",
                             "2": "Error: --max-input-length must leave room for the language token, a piece and </s>: "
                                  "3 or more, not 2.\n"}[value]


def test_info_refuses_a_max_length_past_its_bound():
    result = CliRunner().invoke(cli, ["info", TINY, "--max-length", HUGE])
    assert result.exit_code == 2 and "Error: Invalid value for '--max-length': " in result.stderr


def test_the_bounds_themselves_are_taken():
    options = DecodeOptions(beam_size=1024, num_hypotheses=1024, max_length=65536, length_penalty=-7.0,
                            no_repeat_ngram_size=65536, repetition_penalty=1e30, min_length=65536,
                            max_length_a=65536.0, max_length_b=65536)
    assert options.length_limit(65536) == 65536
    assert DecodeOptions(beam_size=1, sampling_topk=0, num_hypotheses=1024, sampling_temperature=1e-30,
                         seed=2**64 - 1).seed == 2**64 - 1
    assert BatchOptions(2**31 - 1, 2**31 - 1, 2**31 - 1).read_chunk_rows == 2**31 - 1
    result = CliRunner().invoke(cli, ["translate", "--help"])
    assert "1<=x<=1024" in result.output and "-7.0<=x<=7.0" in result.output and "1<=x<=8192" in result.output


@pytest.mark.parametrize("record, given, message", [
    (DecodeOptions, {"length_penalty": 400.0}, "length_penalty must be from -7.0 to 7.0, not 400.0."),
    (DecodeOptions, {"max_length_a": math.inf}, "max_length_a must be from 0 to 65,536, not inf."),
    (DecodeOptions, {"max_length_a": math.nan}, "max_length_a must be from 0 to 65,536, not nan."),
    (DecodeOptions, {"max_length_b": -5}, "max_length_b must be from 0 to 65,536, not -5."),
    (DecodeOptions, {"max_length": 10**20}, "max_length must be from 1 to 65,536, not 100000000000000000000."),
    (DecodeOptions, {"beam_size": 100000}, "beam_size must be from 1 to 1,024, not 100000."),
    (DecodeOptions, {"beam_size": 1, "sampling_topk": 0, "num_hypotheses": 100000},
     "num_hypotheses must be from 1 to 1,024, not 100000."),
    (DecodeOptions, {"repetition_penalty": math.nan}, "repetition_penalty must be from 1e-30 to 1e+30, not nan."),
    (DecodeOptions, {"sampling_temperature": math.inf}, "sampling_temperature must be from 1e-30 to 1e+30, not inf."),
    (DecodeOptions, {"sampling_topp": math.nan}, "sampling_topp must be above 0 and at most 1, not nan."),
    (DecodeOptions, {"seed": 2**64}, "seed must be from 0 to 18,446,744,073,709,551,615, not 18446744073709551616."),
    (DecodeOptions, {"no_repeat_ngram_size": -1}, "no_repeat_ngram_size must be from 0 to 65,536, not -1."),
    (BatchOptions, {"read_chunk_rows": 0}, "read_chunk_rows must be from 1 to 2,147,483,647, not 0."),
    (BatchOptions, {"read_chunk_rows": -3}, "read_chunk_rows must be from 1 to 2,147,483,647, not -3."),
    (BatchOptions, {"max_batch_tokens": 2**31}, "max_batch_tokens must be from 1 to 2,147,483,647, not 2147483648."),
    (BatchOptions, {"max_batch_sentences": 0}, "max_batch_sentences must be from 1 to 2,147,483,647, not 0."),
    (Job, {"src": "eng_Latn", "tgt": "fra_Latn", "max_input_length": 10**6},
     "--max-input-length is at most 65,536 (no model has more positions), not 1000000."),
])
def test_the_option_records_refuse_what_the_command_refuses(record, given, message):
    with pytest.raises(ValueError) as caught:
        record(**given)
    assert str(caught.value) == message


def test_a_batching_of_no_rows_is_refused_not_an_empty_result():
    with pytest.raises(ValueError, match="^read_chunk_rows must be from 1"):
        BatchOptions.for_device("cpu", read_chunk_rows=0)
    with pytest.raises(ValueError, match="^max_batch_tokens must be from 1"):
        BatchOptions.for_device("cuda", max_batch_tokens=0)
    assert BatchOptions.for_device("cpu", read_chunk_rows=None) == BatchOptions()


@pytest.mark.parametrize("min_length, widest", [(0, 303), (1, 302)])
def test_a_beam_wider_than_the_vocabulary_is_one_sentence(min_length, widest):
    """Beam search keeps 2 candidates a beam (one more while </s> is banned): tiny-a's 606 tokens hold 303 beams."""
    options = DecodeOptions(beam_size=widest, max_length=3, min_length=min_length)
    assert nllbcli.translate(tiny(), ["Hello!"], "eng_Latn", "fra_Latn", options)[0].error is None
    with pytest.raises(ValueError) as caught:
        nllbcli.translate(tiny(), ["Hello!"], "eng_Latn", "fra_Latn", replace(options, beam_size=widest + 1))
    assert str(caught.value) == (f"a beam size of {widest + 1} takes {2 * widest + 2 + min_length} candidate tokens "
                                 f"a step, more than the model's vocabulary of 606: lower the beam size to {widest} "
                                 "or less.")


@pytest.mark.parametrize("length_penalty", [-7.0, 7.0])
def test_the_widest_length_penalties_keep_scores_finite(length_penalty):
    options = DecodeOptions(beam_size=3, max_length=40, length_penalty=length_penalty, scores=True)
    result = nllbcli.translate(tiny(), ["The quick brown fox jumps over the lazy dog."], "eng_Latn", "fra_Latn",
                               options)[0]
    assert result.error is None and math.isfinite(result.score) and math.isfinite(result.log_prob)
