"""The FP8 (E4M3) kernels against NumPy (numerics): quantize_rows bit for bit, the wgmma FP8 GEMM and its logits
epilogues within FP8 wgmma's accumulation error, each output poisoned before the launch."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from nllbcli.engine import kernels  # noqa: E402
from nllbcli.engine import numerics  # noqa: E402
from nllbcli.engine import reference as ref  # noqa: E402

rng = np.random.default_rng(2828)
BF16 = "bfloat16"
bf16 = ref.bf16_round  # the values as the device will hold them


def poisoned(shape, dtype):
    out = cp.empty(shape, dtype=dtype)
    out.fill(float("nan")) if cp.dtype(dtype).kind == "f" or str(dtype) == BF16 else out.fill(7)
    return out


def rows_to_quantize(m: int, k: int) -> np.ndarray:
    """Rows of every scale from 1e-30 to 1e30, an all-zero row, a row of one huge value among tiny ones, and (where
    there are rows enough) a row whose scale is 1 holding every halfway value between E4M3 neighbours."""
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
    return x


@pytest.mark.parametrize("dtype", [BF16, "float32"])
@pytest.mark.parametrize("m,k", [(1, 1), (5, 7), (9, 300), (4, 1024), (3, 5000)])  # 5,000: many elements a thread
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
