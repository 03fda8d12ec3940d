"""nllb score's forced decoding on the GPU engine against the CPU reference, on the sample model's held-out
sentences with their true translations and with mismatched ones: each token's log-probability within bf16's
reach of float32's, a translation's sum within SCORE_TOLERANCE, and the same order of good and bad pairs."""

from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cupy")

from nllbcli.options import DecodeOptions  # noqa: E402
from nllbcli.model.translator import load_translator  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"
SCORE_TOLERANCE = 0.15  # bf16 against float32, a sum of ~20 log-probs (tests/gpu/test_decoding_controls.py's)


@lru_cache(maxsize=None)
def sample(device, compute_type="bfloat16"):
    return load_translator(str(SAMPLE), device, compute_type=compute_type)


def pairs(src: str, tgt: str, shift: int = 0):
    """The held-out sentences and their translations (the translations moved `shift` rows on: mismatches)."""
    tokenizer = sample("cpu").tokenizer
    texts = (HELDOUT / f"{src}.txt").read_text(encoding="utf-8").splitlines()
    translations = (HELDOUT / f"{tgt}.txt").read_text(encoding="utf-8").splitlines()
    translations = translations[shift:] + translations[:shift]
    return ([tokenizer.encode(text, src) for text in texts],
            [tokenizer.encode(text, tgt)[1:-1] for text in translations])


@pytest.mark.parametrize("compute_type", ["bfloat16", "float8"])
@pytest.mark.parametrize("shift", [0, 1])
def test_forced_decoding_scores_what_the_cpu_scores(shift, compute_type):
    sources, targets = pairs("eng_Latn", "fra_Latn", shift)
    options = DecodeOptions(beam_size=1)
    gpu = sample("cuda", compute_type).generate_hypotheses(sources, "fra_Latn", options, targets=targets)
    cpu = sample("cpu").generate_hypotheses(sources, "fra_Latn", options, targets=targets)
    tolerance = SCORE_TOLERANCE * (4 if compute_type == "float8" else 1)
    worst = max(abs(a[0].log_prob - b[0].log_prob) / max(1.0, abs(b[0].log_prob) / 20) for a, b in zip(gpu, cpu))
    assert worst < tolerance, worst
    for (a,), (b,) in zip(gpu, cpu):
        assert len(a.token_log_probs) == len(b.token_log_probs) == len(a.ids) + 1


def test_the_gpu_scores_a_greedy_translation_as_its_search_did():
    """Greedy search's log-probability of its own translation, and forced decoding's of it: the same pass."""
    sources, _ = pairs("deu_Latn", "ita_Latn")
    gpu = sample("cuda")
    found = gpu.generate_hypotheses(sources, "ita_Latn", DecodeOptions(beam_size=1, scores=True, max_length=64))
    scored = gpu.generate_hypotheses(sources, "ita_Latn", DecodeOptions(beam_size=1),
                                     targets=[h[0].ids for h in found])
    difference = np.array([a[0].log_prob - b[0].log_prob for a, b in zip(found, scored)])
    assert np.abs(difference).max() < 1e-3, np.abs(difference).max()



@pytest.mark.parametrize("compute_type", ["bfloat16", "float8"])
def test_one_pass_scores_what_the_steps_score(compute_type, monkeypatch):
    """forced_log_probs (every position of a given translation at once, a few rows a pass) against the same
    engine's step loop (search.stepped_log_probs): translations of different lengths, one repeated source."""
    from nllbcli.model.engine import cuda

    sources, targets = pairs("eng_Latn", "fra_Latn", 1)
    sources, targets = sources[:30] + sources[:1], targets[:30] + targets[5:6]
    tr, options = sample("cuda", compute_type), DecodeOptions(beam_size=1)

    def scored():
        return [h[0] for h in tr.generate_hypotheses(sources, "fra_Latn", options, targets=targets)]

    one_pass = scored()
    monkeypatch.setattr(cuda, "FORCED_TOKENS", 100)  # a few rows a pass
    parts = scored()
    monkeypatch.delattr(cuda.CudaEngine, "forced_log_probs")  # score_targets then steps
    stepped = scored()
    for a, b, c in zip(one_pass, stepped, parts):
        assert len(a.token_log_probs) == len(b.token_log_probs) == len(c.token_log_probs) == len(a.ids) + 1
        np.testing.assert_allclose(a.token_log_probs, b.token_log_probs, atol=0.02)
        np.testing.assert_allclose(a.token_log_probs, c.token_log_probs, atol=1e-3)
    worst = max(abs(a.log_prob - b.log_prob) for a, b in zip(one_pass, stepped))
    print(compute_type, "one pass against steps, worst sentence", worst)
    assert worst < SCORE_TOLERANCE
