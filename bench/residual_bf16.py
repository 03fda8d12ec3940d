"""What a bfloat16 residual stream would change in the translations, for the issue owner's decision (CPU only).

    python bench/residual_bf16.py [--sentences 100] [--beams 1]

The GPU engine keeps the residual stream (embeddings plus every sub-layer's output) in float32, and adds onto it
in the epilogues of attention out and FFN2: those two GEMMs then read and write 4 bytes an element where
`cupy.matmul`'s bf16 output writes 2, and at 4,096 rows that is most of their gap to cuBLAS (docs/PERF.md, tenth
session). transformers in bf16 keeps the stream in bf16. This runs the CPU reference as the GPU computes (bf16
weights, bf16 GEMM inputs and K/V: ReferenceEngine's bf16_activations) with the stream in float32 and, the one
difference, rounded to bf16 at every add (bf16_residual), and counts the outputs that change:
  - the trained sample model, every direction among its five languages, the held-out sentences (and how many
    of each come out as the reference translation);
  - tests/models/tiny-b (random weights: near-ties everywhere, the sensitive case), random sources.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nllbcli.checkpoint import load_checkpoint  # noqa: E402
from nllbcli.engine.reference import ReferenceEngine, bf16_round  # noqa: E402
from nllbcli.options import DecodeOptions  # noqa: E402
from nllbcli.search import generate  # noqa: E402
from nllbcli.tokenizer import tokenizer_from_model_dir  # noqa: E402

SAMPLE = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"
LANGS = ["eng_Latn", "fra_Latn", "deu_Latn", "spa_Latn", "ita_Latn"]


def engines(model_dir: Path):
    """The GPU's arithmetic with the stream in f32 ("f32") and in bf16 ("bf16"), and float32 throughout ("ref",
    the reference proper: how far the GPU's own bf16 already is from it, for scale)."""
    config, weights = load_checkpoint(model_dir)
    rounded = {k: bf16_round(v) for k, v in weights.items()}  # the weights the GPU holds
    made = {stream: ReferenceEngine(config, rounded, bf16_activations=True, bf16_residual=stream == "bf16")
            for stream in ("f32", "bf16")}
    return config, {**made, "ref": ReferenceEngine(config, weights)}


def differ(out: dict, a: str, b: str) -> int:
    return sum(x != y for x, y in zip(out[a], out[b]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sentences", type=int, default=100, help="held-out sentences a direction")
    parser.add_argument("--beams", type=int, default=1)
    args = parser.parse_args()
    options = DecodeOptions(beam_size=args.beams, max_length=64)

    config, eng = engines(SAMPLE)
    tok = tokenizer_from_model_dir(SAMPLE, config)
    texts = {lang: (HELDOUT / f"{lang}.txt").read_text(encoding="utf-8").splitlines()[: args.sentences]
             for lang in LANGS}
    changed = {"bf16 vs f32 stream": 0, "f32 stream vs float32 reference": 0, "bf16 stream vs float32 reference": 0}
    total = 0
    right = {"f32": 0, "bf16": 0, "ref": 0}
    for src, tgt in itertools.permutations(LANGS, 2):
        sources = [tok.encode(t, src) for t in texts[src]]
        out = {s: generate(e, sources, tok.lang_id(tgt), config, options) for s, e in eng.items()}
        for key, (a, b) in zip(changed, (("bf16", "f32"), ("f32", "ref"), ("bf16", "ref"))):
            changed[key] += differ(out, a, b)
        total += len(sources)
        for stream, ids in out.items():
            right[stream] += sum(tok.decode(i) == ref for i, ref in zip(ids, texts[tgt]))
    print(json.dumps({"model": "sample", "beams": args.beams, "sentences": total, "outputs_changed": changed,
                      "reference_translations": right}))

    config, eng = engines(ROOT / "tests" / "models" / "tiny-b")
    rng = np.random.default_rng(0)
    lang = config.vocab_size - 10  # tiny-b's language ids sit at the end of its vocabulary; any id is forced alike
    sources = [[lang] + rng.integers(4, 400, n).tolist() + [2] for n in rng.integers(3, 30, 200)]
    options = DecodeOptions(beam_size=args.beams, max_length=16)
    out = {s: generate(e, sources, lang + 1, config, options) for s, e in eng.items()}
    print(json.dumps({"model": "tiny-b (random weights)", "beams": args.beams, "sentences": len(sources),
                      "outputs_changed": {"bf16 vs f32 stream": differ(out, "bf16", "f32"),
                                          "f32 stream vs float32 reference": differ(out, "f32", "ref"),
                                          "bf16 stream vs float32 reference": differ(out, "bf16", "ref")}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
