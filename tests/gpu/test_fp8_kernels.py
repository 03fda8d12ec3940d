"""The FP8 (E4M3) kernels against NumPy (numerics): quantize_rows bit for bit, the wgmma FP8 GEMM and its logits
epilogues within FP8 wgmma's accumulation error, each output poisoned before the launch."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from nllbcli.model.engine import kernels  # noqa: E402
from nllbcli.model.engine import numerics  # noqa: E402
from nllbcli.model.engine import reference as ref  # noqa: E402

rng = np.random.default_rng(2828)
BF16 = "bfloat16"
bf16 = ref.bf16_round  # the values as the device will hold them


def poisoned(shape, dtype):
    out = cp.empty(shape, dtype=dtype)
    out.fill(float("nan")) if cp.dtype(dtype).kind == "f" or str(dtype) == BF16 else out.fill(7)
    return out


def rows_to_quantize(m: int, k: int) -> np.ndarray:
    """Rows of every scale from 1e-30 to 1e30, an all-zero row, a row of one huge value among tiny ones, and (where
    there are rows enough) a row whose scale is 1 holding every halfway value between E4M3 neighbours and a row of
    values near 1e36 (its scale past 2^100: e4m3_quotient divides there, as below 2^-80)."""
    x = rng.normal(size=(m, k)).astype(np.float32) * (10.0 ** rng.uniform(-30, 30, size=(m, 1))).astype(np.float32)
    if m > 1:
        x[1] = 0
    if m > 2:
        x[2] = rng.normal(size=k) * 1e-30
        x[2, k // 2] = -1e30
    if m > 3 and k >= 127:
        values = numerics.e4m3_values()[:127].astype(np.float64)
        halfway = ((values[:-1] + values[1:]) / 2).astype(np.float32)  # exact in bf16 too
        x[3] = 0
        x[3, :126] = halfway * np.where(np.arange(126) % 2, 1, -1)
        x[3, 126] = numerics.E4M3_MAX  # the row's largest size is 448: scale 1
    if m > 4:
        x[4] = rng.normal(size=k).astype(np.float32) * np.float32(1e36)
    return x


@pytest.mark.parametrize("dtype", [BF16, "float32"])
@pytest.mark.parametrize("m,k", [(1, 1), (5, 7), (9, 300), (4, 1024), (3, 5000), (20, 4096), (11, 8)])  # 5,000: many
# elements a thread; bf16 rows of whole 16-byte vectors take the warp-a-row kernel
def test_quantize_rows_matches_reference_bit_for_bit(dtype, m, k):
    x = rows_to_quantize(m, k)
    if dtype == BF16:
        x = bf16(x)
    want_codes, want_scales = numerics.quantize_e4m3(x)
    codes, scales = poisoned((m, k), cp.uint8), poisoned((m,), cp.float32)
    got_codes, got_scales = kernels.quantize_rows(cp.asarray(x).astype(dtype), codes=codes, scales=scales)
    assert got_codes is codes and got_scales is scales
    assert (cp.asnumpy(scales).view(np.uint32) == want_scales[:, 0].view(np.uint32)).all()
    assert (cp.asnumpy(codes) == want_codes).all()


@pytest.mark.parametrize("m,d", [(1, 64), (13, 1024), (300, 2048), (5, 100), (9, 30)])  # 100, 30: no 16-byte loads
def test_layernorm_e4m3_is_quantize_rows_of_layernorm_bit_for_bit(m, d):
    x = cp.asarray(rng.normal(size=(m, d)).astype(np.float32) * rng.uniform(0.01, 50, size=(m, 1)).astype(np.float32))
    weight = cp.asarray(rng.normal(size=d).astype(np.float32))
    bias = cp.asarray(rng.normal(size=d).astype(np.float32))
    want_codes, want_scales = kernels.quantize_rows(kernels.layernorm(x, weight, bias))
    codes, scales = poisoned((m, d), cp.uint8), poisoned((m,), cp.float32)
    got_codes, got_scales = kernels.layernorm_e4m3(x, weight, bias, codes=codes, scales=scales)
    assert got_codes is codes and got_scales is scales
    assert (scales.view(cp.uint32) == want_scales.view(cp.uint32)).all() and (codes == want_codes).all()


# The wgmma tiles, the only ones with FP8 products (none where wgmma is not available: the tests below then check
# only that gemm_fp8 says so).
FP8_TILES = [t for t in kernels.available_tiles() if kernels.GEMM_TILES[t]["kind"] == "sm90"]
LOGITS_TILES = [t for t in FP8_TILES if not kernels.stores_only(t)]
# every M of the brief, each with an N and K of its own: N odd or not a multiple of 8 (the scales' and the
# epilogue's ragged edges), K a multiple of 16 (TMA's 16-byte rows) but not always of 128 (a zero-filled k-step)
SHAPES = [(1, 72, 48), (7, 515, 1024), (64, 1024, 4096), (65, 130, 208), (300, 515, 1024), (4096, 384, 1024)]


def exact_operands(m: int, n: int, k: int):
    """Operands whose FP8 product the tensor cores sum exactly, whatever their accumulation's precision past 14 bits:
    A's values small integers (-2..2) with one 7 a row, times a power of two a row, so that quantize_e4m3 gives each
    row the scale 7 * 2^e / 448 = 2^(e - 6) and exact codes (-128..128 and 448); W's codes -1, 0, 1 with scales
    powers of two. Each output is then an integer times 64 (A's codes' unit), every partial sum at most 2K + 7 such
    units, below 2^14 for K <= 4,096: any accumulator of 14 significant bits holds it exactly, so the model's
    float64 sum is the kernel's, and scaling by powers of two is exact too. -> (a values, a codes, a
    scales (M,), w codes, w scales (N,)), NumPy."""
    a = rng.integers(-2, 3, size=(m, k)).astype(np.float32)
    a[np.arange(m), rng.integers(0, k, size=m)] = 7
    a *= (2.0 ** rng.integers(-3, 4, size=(m, 1))).astype(np.float32)
    a_codes, a_scale = numerics.quantize_e4m3(a)
    assert (numerics.dequantize_e4m3(a_codes, a_scale) == a).all()
    w_codes = numerics.e4m3_bits(rng.integers(-1, 2, size=(n, k)).astype(np.float32))
    w_scale = (2.0 ** rng.integers(-4, 4, size=n)).astype(np.float32)
    return a, a_codes, a_scale[:, 0], w_codes, w_scale


def fp8_error_bound(a_codes, a_scale, w_codes, w_scale) -> np.ndarray:
    """How far FP8 wgmma's sum of an output's K products may be from the exact one (M, N). Hopper adds FP8 products
    into its fp32 accumulators keeping about 14 significant bits (DeepSeek-V3's technical report, 3.3.2, measured on
    the H800; the same tensor cores as the H200's), so each of the ceil(K / 32) wgmma k-steps that adds into an output
    loses less than 2^-13 of the largest value it handles, and none handles more than sum_k |a_k w_k| (scaled): the
    bound is 2^-13 (ceil(K / 32) + 1) sum_k |a_k w_k| (+ 1: the products within a step). About 2^-6 of sum_k |a_k w_k|
    at K = 4,096, a few percent of the output where the products' signs are random: loose, so the exact tests
    (exact_operands) are the ones that find a misplaced element."""
    k = a_codes.shape[1]
    size = np.abs(numerics.e4m3_values().astype(np.float64))
    magnitude = (size[a_codes] @ size[w_codes].T) * np.abs(a_scale.astype(np.float64))[:, None] * np.abs(w_scale)
    return 2.0**-13 * (-(-k // 32) + 1) * magnitude


def to_device(*arrays):
    return [cp.asarray(a) for a in arrays]


@pytest.mark.skipif(bool(FP8_TILES), reason="a GPU without wgmma")
def test_gemm_fp8_needs_hopper():
    codes, scales = cp.zeros((4, 16), cp.uint8), cp.ones(4, cp.float32)
    with pytest.raises(ValueError, match=r"--compute-type float8 needs a Hopper GPU \(sm_90\)"):
        kernels.gemm_fp8(codes, scales, codes, scales)


@pytest.mark.parametrize("tile", FP8_TILES)
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("epilogue", ["plain_f32", "bias_relu_bf16", "bias_residual_f32", "onto_residual"])
def test_gemm_fp8_is_exact_where_its_sums_are(tile, m, n, k, epilogue):
    """Every element where the model puts it, its bits those of the model's f32 epilogue: bias added to the scaled
    sum, then ReLU, then the residual, each rounded to f32 (then bf16). onto_residual: out is residual (TMA_STORE 2
    for the tiles a multiple of 64 columns wide)."""
    _, a_codes, a_scale, w_codes, w_scale = exact_operands(m, n, k)
    exact = numerics.gemm_fp8_reference(a_codes, a_scale, w_codes, w_scale).astype(np.float32)  # exact in f32
    bias = rng.normal(size=n).astype(np.float32)
    residual = rng.normal(size=(m, n)).astype(np.float32)
    kwargs, want = {}, exact
    if epilogue != "plain_f32":
        kwargs["bias"] = cp.asarray(bias)
        want = want + bias
    if epilogue == "bias_relu_bf16":
        kwargs["relu"] = True
        want = bf16(np.maximum(want, 0))
    if epilogue in ("bias_residual_f32", "onto_residual"):
        want = want + residual
        kwargs["residual"] = cp.asarray(residual)
    if epilogue == "onto_residual":
        out = kwargs["residual"]
    else:
        out = poisoned((m, n), BF16 if epilogue.endswith("bf16") else cp.float32)
    got = kernels.gemm_fp8(*to_device(a_codes, a_scale, w_codes, w_scale), out=out, tile=tile, **kwargs)
    assert got is out
    got = cp.asnumpy(out.astype(cp.float32))
    wrong = np.argwhere(got != want)
    assert not len(wrong), f"{len(wrong)} of {m * n} differ, first (row, column): {wrong[:5].tolist()}"


@pytest.mark.parametrize("tile", FP8_TILES)
@pytest.mark.parametrize("m,n,k", [(7, 515, 1024), (300, 1000, 4096), (4096, 384, 1024)])
def test_gemm_fp8_matches_the_model_within_its_accumulation_error(tile, m, n, k):
    """Activations and weights as the engine's (normal, quantized per row by quantize_rows and quantize_e4m3), with a
    bias into bf16 (default tile too): within fp8_error_bound of the model, plus the output's rounding."""
    a = bf16(rng.normal(size=(m, k)).astype(np.float32) * (10.0 ** rng.uniform(-2, 2, size=(m, 1))).astype(np.float32))
    w = rng.normal(size=(n, k)).astype(np.float32) / np.sqrt(k)
    bias = rng.normal(size=n).astype(np.float32)
    a_codes, a_scale = kernels.quantize_rows(cp.asarray(a).astype(BF16))
    w_codes, w_scale = numerics.quantize_e4m3(w)
    a_codes_host, a_scale_host = cp.asnumpy(a_codes), cp.asnumpy(a_scale)
    want = numerics.gemm_fp8_reference(a_codes_host, a_scale_host, w_codes, w_scale, bias=bias)
    bound = fp8_error_bound(a_codes_host, a_scale_host, w_codes, w_scale[:, 0])
    bound += 2.0**-8 * (np.abs(want) + bound) + 2.0**-22 * (np.abs(want) + np.abs(bias))  # bf16's and f32's roundings
    for chosen in (tile, None):
        out = poisoned((m, n), BF16)
        kernels.gemm_fp8(a_codes, a_scale, *to_device(w_codes, w_scale), bias=cp.asarray(bias), out=out, tile=chosen)
        error = np.abs(cp.asnumpy(out.astype(cp.float32)) - want)
        assert not np.isnan(error).any()
        assert (error <= bound).all(), f"error up to {(error / bound).max():.2f} of the bound"


@pytest.mark.parametrize("tile", LOGITS_TILES)
@pytest.mark.parametrize("m,v,d", [(1, 606, 64), (7, 5000, 96), (130, 2051, 128), (300, 30001, 64)])
def test_logits_argmax_fp8_matches_the_model(tile, m, v, d):
    """The argmax epilogue with an Fp8Weight (h quantized per row inside): values within fp8_error_bound of the model's
    row max, ids the model's where its best two are further apart than twice the bound; then with ARGMAX_LSE, the
    same ids and values, bit for bit, and each id's log-probability."""
    h = bf16(rng.normal(size=(m, d)).astype(np.float32))
    w = rng.normal(size=(v, d)).astype(np.float32)
    w_codes, w_scale = numerics.quantize_e4m3(w)
    h_codes, h_scale = numerics.quantize_e4m3(h)  # quantize_rows' bits (test_quantize_rows_...)
    logits = numerics.gemm_fp8_reference(h_codes, h_scale, w_codes, w_scale)
    bound = fp8_error_bound(h_codes, h_scale[:, 0], w_codes, w_scale[:, 0]).max(axis=1)
    bound += 1e-6 * np.abs(logits).max(axis=1)  # f32
    weight = kernels.Fp8Weight(*to_device(w_codes, w_scale[:, 0]))
    h_device = cp.asarray(h).astype(BF16)
    ids, values = kernels.logits_argmax(h_device, weight, tile=tile, ids=poisoned((m,), cp.int32),
                                        values=poisoned((m,), cp.float32))
    ids, values = cp.asnumpy(ids), cp.asnumpy(values)
    assert (np.abs(values - logits.max(axis=1)) <= bound).all()
    top2 = np.sort(np.partition(logits, -2, axis=1)[:, -2:], axis=1)
    clear = top2[:, 1] - top2[:, 0] > 2 * bound
    assert clear.mean() > 0.5 or m < 8  # the test tests something
    assert (ids[clear] == logits.argmax(axis=1)[clear]).all()
    lse_ids, lse_values = kernels.logits_argmax(h_device, weight, tile=tile, ids=poisoned((m,), cp.int32),
                                                values=poisoned((m,), cp.float32),
                                                logprob=(logprob := poisoned((m,), cp.float32)))
    np.testing.assert_array_equal(cp.asnumpy(lse_ids), ids)
    np.testing.assert_array_equal(cp.asnumpy(lse_values), values)
    want = numerics.log_softmax(logits)[np.arange(m), ids]
    np.testing.assert_allclose(cp.asnumpy(logprob), want, rtol=1e-4, atol=1e-4 + 2 * bound.max())


@pytest.mark.parametrize("tile", [t for t in LOGITS_TILES if kernels.GEMM_TILES[t]["BN"] % 128 == 0])
@pytest.mark.parametrize("k", [1, 8, 32])
@pytest.mark.parametrize("m,v,d", [(1, 606, 64), (70, 5000, 96), (200, 3000, 128)])
def test_logits_topk_and_lse_fp8_are_exact_where_the_sums_are(tile, k, m, v, d):
    """The STAT and TOPK epilogues with an Fp8Weight on exact_operands' numbers (h's rows quantized inside to exact
    codes): the model's ids, ties to the lower id, and their log-probabilities; logits_lse the model's log-sum-exp."""
    h, h_codes, h_scale, w_codes, w_scale = exact_operands(m, v, d)
    h, w_scale = h / 64, w_scale / 4  # logits of a few units: a softmax with more than one term
    h_codes, h_scale = numerics.quantize_e4m3(h)
    logits = numerics.gemm_fp8_reference(h_codes, h_scale, w_codes, w_scale)
    weight = kernels.Fp8Weight(*to_device(w_codes, w_scale))
    h_device = cp.asarray(h).astype(BF16)
    assert (cp.asnumpy(h_device.astype(cp.float32)) == h).all()
    got_lp, got_ids = kernels.logits_topk(h_device, weight, k, logprob=poisoned((m, k), cp.float32),
                                          ids=poisoned((m, k), cp.int32), tile=tile)
    logprob = numerics.log_softmax(logits)
    want_ids = np.argsort(-logprob, axis=1, kind="stable")[:, :k]  # ties: the lower id first
    np.testing.assert_array_equal(cp.asnumpy(got_ids), want_ids)
    np.testing.assert_allclose(cp.asnumpy(got_lp), np.take_along_axis(logprob, want_ids, axis=1), rtol=1e-4, atol=1e-4)
    top = logits.max(axis=1)
    lse = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
    np.testing.assert_allclose(cp.asnumpy(kernels.logits_lse(h_device, weight)), lse, rtol=1e-5, atol=1e-4)
