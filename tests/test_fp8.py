"""The NumPy model of FP8 E4M3 rounding (numerics.e4m3_*), what FP8 matrix products are checked against: every code
decodes to its value and rounds back to itself, halfway values go to the even code, sizes past 448 saturate, and
a per-channel quantization keeps each value within half a step of its channel's grid; the model of an FP8 matrix
product (numerics.gemm_fp8_reference) is the product of the dequantized operands, summed exactly."""

import numpy as np
import pytest

from nllbcli.model.engine.numerics import (E4M3_MAX, dequantize_e4m3, e4m3_bits, e4m3_values, gemm_fp8_reference,
                                      quantize_e4m3)


def test_every_code_is_its_own_rounding():
    values = e4m3_values()
    finite = [c for c in range(256) if c not in (0x7F, 0xFF)]
    assert np.isnan(values[[0x7F, 0xFF]]).all()
    assert e4m3_bits(values[finite]).tolist() == finite  # -0 (0x80) included
    assert values[0x7E] == E4M3_MAX and values[0x01] == 2.0**-9 and values[0x38] == 1.0 and values[0x08] == 2.0**-6
    assert (np.diff(values[:127]) > 0).all() and (values[0x80:0xFF] == -values[:0x7F]).all()


@pytest.mark.parametrize("x, code", [(1.0625, 0x38), (1.1875, 0x3A), (0.5 * 2.0**-9, 0x00), (1.5 * 2.0**-9, 0x02),
                                     (0.75 * 2.0**-9, 0x01), (1.06, 0x38), (1.07, 0x39), (-1.1875, 0xBA),
                                     (448.0, 0x7E), (464.0, 0x7E), (1e30, 0x7E), (-1e30, 0xFE), (np.inf, 0x7E)])
def test_rounding_is_to_the_nearest_ties_to_even_and_saturates(x, code):
    assert int(e4m3_bits(np.float32(x))) == code


def test_every_halfway_value_goes_to_the_even_code():
    values = e4m3_values()[:127].astype(np.float64)
    halfway = ((values[:-1] + values[1:]) / 2).astype(np.float32)  # exact in float32
    codes = e4m3_bits(halfway)
    assert (codes % 2 == 0).all() and (np.abs(codes.astype(int) - np.arange(126) - 0.5) == 0.5).all()
    assert int(e4m3_bits(np.float32(np.nan))) == 0x7F


def test_quantization_keeps_each_value_within_half_a_step_of_its_channel():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(32, 300)).astype(np.float32) * rng.uniform(1e-3, 10, size=(32, 1)).astype(np.float32)
    w[3] = 0
    codes, scales = quantize_e4m3(w)
    assert codes.dtype == np.uint8 and scales.shape == (32, 1) and scales[3, 0] == 1
    back = dequantize_e4m3(codes, scales)
    assert np.abs(back).max(axis=1).tolist() == pytest.approx(np.abs(w).max(axis=1).tolist(), rel=1e-6)  # 448 x scale
    step = np.maximum(2.0 ** (np.floor(np.log2(np.maximum(np.abs(w / scales), 2.0**-6))) - 3), 2.0**-9) * scales
    assert (np.abs(back - w) <= step / 2 * (1 + 1e-6)).all()


def nearest_code(x) -> np.ndarray:
    """E4M3 rounding by definition: the code of the nearest of the grid's sizes (a tie to the even code), past
    448 the largest; what e4m3_bits computes from float32's bits."""
    x = np.asarray(x, dtype=np.float32)
    size = np.minimum(np.abs(x).astype(np.float64), E4M3_MAX)
    grid = e4m3_values()[:127].astype(np.float64)
    above = np.clip(np.searchsorted(grid, size), 0, 126)
    below = np.maximum(above - 1, 0)
    to_below, to_above = size - grid[below], grid[above] - size
    nearest = np.where(to_below < to_above, below, np.where(to_above < to_below, above, np.where(below % 2 == 0, below, above)))
    return np.where(np.isnan(x), 0x7F, nearest | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def test_the_rounding_from_bits_is_the_nearest_code_everywhere():
    rng = np.random.default_rng(1)
    sizes = np.exp2(rng.uniform(-30, 12, 2_000_000)).astype(np.float32)
    values = e4m3_values()[:127].astype(np.float64)
    halfway = ((values[:-1] + values[1:]) / 2).astype(np.float32)
    edges = np.array([0, 2.0**-6, 2.0**-10, 2.0**-149, 448, 464, 465, 480, 3e38, np.inf, np.nan], np.float32)
    x = np.concatenate([sizes * rng.choice([-1, 1], sizes.size).astype(np.float32), edges, -edges, halfway, -halfway,
                        np.nextafter(halfway, np.float32(0)), np.nextafter(halfway, np.float32(1e9)), values.astype(np.float32)])
    assert (e4m3_bits(x) == nearest_code(x)).all()
    assert e4m3_bits(x[:10].reshape(2, 5)).tolist() == nearest_code(x[:10]).reshape(2, 5).tolist()


def test_the_fp8_product_model_is_the_product_of_the_dequantized_operands():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(7, 96)).astype(np.float32) * 3
    w = rng.normal(size=(11, 96)).astype(np.float32) / 10
    a[2] = 0
    bias, residual = rng.normal(size=11).astype(np.float32), rng.normal(size=(7, 11)).astype(np.float32)
    (a_codes, a_scale), (w_codes, w_scale) = quantize_e4m3(a), quantize_e4m3(w)
    got = gemm_fp8_reference(a_codes, a_scale[:, 0], w_codes, w_scale, bias=bias, residual=residual, relu=True)
    a_back = dequantize_e4m3(a_codes, a_scale).astype(np.float64)
    w_back = dequantize_e4m3(w_codes, w_scale).astype(np.float64)
    want = np.maximum(a_back @ w_back.T + bias, 0) + residual
    magnitude = np.abs(a_back) @ np.abs(w_back).T
    # dequantize_e4m3 rounds each value times its scale to float32: 2^-24 of each product, twice
    assert got.dtype == np.float64 and got.shape == (7, 11)
    assert (np.abs(got - want) <= 2.0**-22 * magnitude + 1e-12).all()
    assert (got[2] == np.maximum(bias.astype(np.float64), 0) + residual[2]).all()  # an all-zero row: products 0


def test_the_fp8_product_model_sums_exactly():
    # 448 * 448 + 2^-9 * 2^-9 - 448 * 448: float32 would lose the small product (2^-18 against 2^17.6)
    codes = e4m3_bits(np.array([[448.0, 2.0**-9, -448.0]], np.float32))
    ones = np.ones(1, np.float32)
    assert gemm_fp8_reference(codes, ones, codes[:, [0, 1, 0]], ones)[0, 0] == 2.0**-18
    assert gemm_fp8_reference(codes, 2 * ones, codes[:, [0, 1, 0]], 0.25 * ones)[0, 0] == 2.0**-19


def test_a_matrix_quantized_a_block_of_rows_at_a_time_is_quantized_as_whole(monkeypatch):
    from nllbcli.model.checkpoint import float32_to_bf16
    from nllbcli.model.engine import numerics
    from nllbcli.model.engine.numerics import E4M3Matrix

    rng = np.random.default_rng(5)
    w = rng.normal(size=(37, 24)).astype(np.float32) * rng.uniform(1e-3, 10, size=(37, 1)).astype(np.float32)
    monkeypatch.setattr(numerics, "E4M3_BLOCK", 100)  # blocks of 4 rows
    for given, values in ((w, w), (float32_to_bf16(w), reference_bf16(w))):
        made = E4M3Matrix.quantize(given)
        codes, scales = quantize_e4m3(values)
        assert (made.codes == codes).all() and (made.scales == scales).all()


def reference_bf16(x):
    from nllbcli.model.engine.reference import bf16_round

    return bf16_round(x)
