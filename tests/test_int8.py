"""--compute-type int8 on the CPU: the products' arithmetic (int8 weights with a scale an output channel, inputs
with a scale a row, exact integer sums), a row's bits its own whatever the rows beside it and the threads, the
translations against float32's, the job identity, and the one-line refusal on a GPU."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from nllbcli.cli import cli
from nllbcli.errors import NllbError
from nllbcli.model.engine import reference as ref
from nllbcli.model.engine.products import Int8Products, quantize_int8
from nllbcli.model.translator import expected_compute_type, load_translator
from nllbcli.options import BatchOptions, DecodeOptions, Job

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"


def int8_by_hand(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The int8 product's arithmetic in NumPy, its sums in int64: what Int8Products must give to the bit."""
    codes, w_scale = quantize_int8(w)
    x_scale = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    x_scale = np.where(x_scale > 0, x_scale, np.float32(1)).astype(np.float32)
    q = np.rint(x / x_scale).astype(np.int64)
    sums = q @ (codes.astype(np.int64) - 128)
    return (sums.astype(np.float32) * x_scale) * w_scale + bias


def test_the_int8_product_is_its_arithmetic_and_a_rows_bits_are_its_own():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(389, 300)).astype(np.float32)
    w[7] = 0  # a channel of zeros: scale 1
    bias = rng.normal(size=389).astype(np.float32)
    x = rng.normal(size=(40, 300)).astype(np.float32) * rng.uniform(0.01, 50, size=(40, 1)).astype(np.float32)
    x[4] = 0  # a row of zeros
    products = Int8Products()
    products.spread_work = 0  # the columns shared among the threads at any size
    want = int8_by_hand(x, w, bias)
    np.testing.assert_array_equal(ref.linear(x, w, bias, products), want)
    with ThreadPoolExecutor(3) as pool:
        for spread in (ref.ALONE, ref.Spread(2, pool.map), ref.Spread(3, pool.map)):
            for rows in ([0], [4], [3, 1], list(range(7)), [5] * 9 + [2], list(range(39, -1, -1))):
                np.testing.assert_array_equal(ref.linear(x[rows], w, bias, products, spread), want[rows])
    exact = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    assert np.abs(want - exact).max() < 0.03 * np.abs(exact).max()  # int8's error: about 1% of the largest size


def test_the_weights_codes_are_a_scale_a_channel_rounded_to_even():
    w = np.array([[1.0, -0.5, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0], [254.0, 1.0, -127.0, 3.0]], np.float32)
    codes, scale = quantize_int8(w)
    assert codes.shape == (4, 3) and codes.dtype == np.uint8
    np.testing.assert_array_equal(scale[0], np.float32([1 / 127, 1, 2]))
    np.testing.assert_array_equal(codes.T.astype(int) - 128, [[127, -64, 32, 0], [0, 0, 0, 0], [127, 0, -64, 2]])


def test_int8_translates_the_held_out_sentences_as_float32_does(tmp_path):
    """On the sample model, the first held-out sentences of two directions, greedy and beam 4 (bench.fp8_quality
    --int8: all 2,000 sentences of the 20 directions greedy the same)."""
    plain, int8 = load_translator(str(SAMPLE), "cpu"), load_translator(str(SAMPLE), "cpu", compute_type="int8")
    assert (plain.compute_type, int8.compute_type) == ("bfloat16", "int8")
    for src, tgt in (("eng_Latn", "fra_Latn"), ("deu_Latn", "ita_Latn")):
        texts = (HELDOUT / f"{src}.txt").read_text(encoding="utf-8").splitlines()[:12]
        for beams in (1, 4):
            options = DecodeOptions(beam_size=beams, max_length=64)
            assert int8.translate_sentences(texts, src, tgt, options) == plain.translate_sentences(texts, src, tgt, options)


def test_the_command_takes_int8_on_the_cpu_and_a_job_in_int8_is_its_own(tmp_path):
    from nllbcli.job.spec import job_identity

    source = tmp_path / "in.txt"
    source.write_text("The yellow book costs fourteen euros.\n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn", "-m", str(SAMPLE), "--device",
                                      "cpu", "--compute-type", "int8", "-q", str(source), str(tmp_path / "out.txt")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "Le livre jaune coûte quatorze euros.\n"
    job = Job(src="eng_Latn", tgt="fra_Latn", input="in.txt", output="out.txt", input_format="text", output_format="text")
    identities = [job_identity(load_translator(str(SAMPLE), "cpu", compute_type=t), job, DecodeOptions(), BatchOptions())
                  for t in ("auto", "int8")]
    assert identities[0]["compute_type"] == "bfloat16" and identities[1]["compute_type"] == "int8"


def test_int8_is_the_cpus_alone():
    assert expected_compute_type("int8", False, SAMPLE) == "int8"
    with pytest.raises(NllbError, match=r"^--compute-type int8 is the CPU engine's: give --device cpu with it"):
        expected_compute_type("int8", True, SAMPLE)  # --devices or --ray workers on GPUs, or on devices not named
