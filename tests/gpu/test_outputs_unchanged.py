"""The GPU engine's translations of the sample model's held-out sentences, exactly as recorded before the
speed work (tests/golden/gpu_sample.json, tools/make_gpu_goldens.py): an optimisation changes no output."""

import json
from pathlib import Path

import pytest

pytest.importorskip("cupy")

from tools.make_gpu_goldens import MODEL, translations  # noqa: E402
from nllbcli.model.engine import kernels, numerics  # noqa: E402
from nllbcli.model.engine.numerics import HALVES, STAGGERED, WHOLE  # noqa: E402
from nllbcli.model.translator import load_translator  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "gpu_sample.json"


@pytest.mark.parametrize("halves", [WHOLE, HALVES, STAGGERED], ids=["whole", "halves", "staggered"])
def test_gpu_translations_are_unchanged(halves, monkeypatch):
    """halves: every decoder step in two halves on two streams (CudaEngine.step_halves; a half at every 16 rows,
    whatever the step's rows), side by side or staggered, the GEMMs on half the SMs."""
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    translator = load_translator(str(MODEL), "cuda")
    if halves:
        monkeypatch.setattr(numerics, "HALVES_MIN_ROWS", 2)
        monkeypatch.setattr(numerics, "HALF_ROWS", 16)
        translator.engine.step_halves, translator.engine.gemm_sms = halves, kernels.multiprocessors() // 2
    got = translations(translator)
    assert got.keys() == want.keys()
    changed = {key: [i for i, (a, b) in enumerate(zip(got[key], want[key])) if a != b] for key in want}
    changed = {key: rows for key, rows in changed.items() if rows}
    assert not changed, f"translations changed (set: sentence numbers): {changed}"
