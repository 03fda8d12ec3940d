"""Record the GPU engine's own translations of the held-out sentences: tests/golden/gpu_sample.json.

    python tools/make_gpu_goldens.py [--out PATH]      # on a GPU machine

Every direction among the sample model's five languages, all 100 held-out sentences, greedy and beam 4,
token ids. tests/gpu/test_outputs_unchanged.py checks that the engine still gives exactly these: an
optimisation must not change a translation (issue 5). Regenerate only on purpose, from the commit whose
outputs are the reference, and say in docs/PERF.md which commit that was.
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import permutations
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nllbcli.options import DecodeOptions  # noqa: E402
from nllbcli.model.translator import load_translator  # noqa: E402

MODEL = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"
LANGS = ["eng_Latn", "fra_Latn", "deu_Latn", "spa_Latn", "ita_Latn"]
BEAMS = (1, 4)
MAX_LENGTH = 64


def translations(translator) -> dict[str, list[list[int]]]:
    """"src>tgt beam" -> each sentence's generated ids (after the language token, without </s>)."""
    out = {}
    for src, tgt in permutations(LANGS, 2):
        texts = (HELDOUT / f"{src}.txt").read_text(encoding="utf-8").splitlines()
        sources = [translator.tokenizer.encode(t, src) for t in texts]
        for beams in BEAMS:
            options = DecodeOptions(beam_size=beams, max_length=MAX_LENGTH)
            out[f"{src}>{tgt} {beams}"] = translator.generate(sources, tgt, options)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "golden" / "gpu_sample.json")
    args = parser.parse_args()
    result = translations(load_translator(str(MODEL), "cuda"))
    args.out.write_text(json.dumps(result, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"{len(result)} sets of {sum(len(v) for v in result.values())} translations -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
