"""How long translations run against their sources, on the sample model's held-out sentences: the figures
behind docs/DECODING.md's advice for --max-length-a/b (its Length section).

    python -m bench.length_ratio [--beam-size 4]        # the CPU engine, about a minute

For every held-out direction (each language into the next of data/samples/heldout), the generated tokens of
each sentence (language token and </s> included, as --max-length counts them) against its source tokens (as
--max-length-a counts them): the largest ratio, the 99th percentile, and the least B for which A x source + B
cuts no translation, for a few A.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from nllbcli.options import DecodeOptions
from nllbcli.model.translator import load_translator

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT / "data" / "samples" / "heldout"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beam-size", type=int, default=4)
    args = parser.parse_args()
    tr = load_translator(str(ROOT / "data" / "samples" / "model"), "cpu")
    langs = sorted(p.stem for p in HELDOUT.glob("*.txt"))
    sources, outputs = [], []
    for src, tgt in zip(langs, langs[1:] + langs[:1]):
        ids = [tr.tokenizer.encode(t, src) for t in (HELDOUT / f"{src}.txt").read_text(encoding="utf-8").splitlines()]
        found = tr.generate_hypotheses(ids, tgt, DecodeOptions(beam_size=args.beam_size, max_length=200))
        sources += [len(s) for s in ids]
        outputs += [len(h[0].ids) + 2 for h in found]  # the language token and </s>
    source, output = np.array(sources), np.array(outputs)
    ratio = output / source
    print(f"{len(source)} sentences, beam {args.beam_size}: source tokens {source.min()}-{source.max()}, "
          f"generated {output.min()}-{output.max()}; generated / source: max {ratio.max():.2f}, "
          f"99th percentile {np.percentile(ratio, 99):.2f}, median {np.median(ratio):.2f}")
    for a in (1.0, 1.2, 1.5, 2.0):
        print(f"  A = {a}: the least B that cuts none: {int(np.ceil((output - a * source).max()))}")


if __name__ == "__main__":
    main()
