"""The GPU engine's translations of the sample model's held-out sentences, exactly as recorded before the
speed work (tests/golden/gpu_sample.json, tools/make_gpu_goldens.py): an optimisation changes no output."""

import json
from pathlib import Path

import pytest

pytest.importorskip("cupy")

from tools.make_gpu_goldens import MODEL, translations  # noqa: E402
from nllbcli.model.translator import load_translator  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "gpu_sample.json"


def test_gpu_translations_are_unchanged():
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    got = translations(load_translator(str(MODEL), "cuda"))
    assert got.keys() == want.keys()
    changed = {key: [i for i, (a, b) in enumerate(zip(got[key], want[key])) if a != b] for key in want}
    changed = {key: rows for key, rows in changed.items() if rows}
    assert not changed, f"translations changed (set: sentence numbers): {changed}"
