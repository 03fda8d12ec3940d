"""How long translations run against their sources, on the sample model's held-out sentences: the figures
behind docs/DECODING.md's advice for --max-length-a/b (its Length section), and with --bands the length_ratio
flag's bands and the log-probabilities per token behind --min-score (docs/FLAGS.md).

    python -m bench.length_ratio [--beam-size 4]        # the CPU engine, about a minute
    python -m bench.length_ratio --bands                # every one of the 20 directions: about 5 minutes

For every held-out direction (each language into the next of data/samples/heldout), the generated tokens of
each sentence (language token and </s> included, as --max-length counts them) against its source tokens (as
--max-length-a counts them): the largest ratio, the 99th percentile, and the least B for which A x source + B
cuts no translation, for a few A.

With --bands, each held-out language into each other one: translation pieces / source pieces (neither counting
the language token and </s>, as the length_ratio flag counts them) by direction, least, median and largest, and
the band flags.LENGTH_BANDS holds (least / 1.25, largest x 1.25, to two decimals), printed as the Python table;
and the translations' log-probability per generated token (as low_score counts it) over all of them.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from nllbcli.options import DecodeOptions
from nllbcli.model.translator import load_translator

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT / "data" / "samples" / "heldout"
BAND_WIDENING = 1.25  # a direction's band: its held-out ratios' least / this to their largest x this


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--bands", action="store_true", help="the length_ratio bands of all 20 directions")
    args = parser.parse_args()
    tr = load_translator(str(ROOT / "data" / "samples" / "model"), "cpu")
    langs = sorted(p.stem for p in HELDOUT.glob("*.txt"))
    if args.bands:
        return print_bands(tr, langs, args.beam_size)
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


def print_bands(tr, langs: list[str], beam_size: int) -> None:
    """Each direction's ratios and band, the table, and the log-probabilities per token."""
    bands, per_token = {}, []
    decode = DecodeOptions(beam_size=beam_size, max_length=200, scores=True)
    print(f"| direction | least | median | largest | band |\n|---|---|---|---|---|")
    for src in langs:
        ids = [tr.tokenizer.encode(t, src) for t in (HELDOUT / f"{src}.txt").read_text(encoding="utf-8").splitlines()]
        for tgt in langs:
            if tgt == src:
                continue
            found = [h[0] for h in tr.generate_hypotheses(ids, tgt, decode)]
            ratio = np.array([len(h.ids) / (len(s) - 2) for s, h in zip(ids, found)])
            per_token += [h.log_prob / (len(h.ids) + 1) for h in found]
            band = (math.floor(ratio.min() / BAND_WIDENING * 100) / 100,
                    math.ceil(ratio.max() * BAND_WIDENING * 100) / 100)
            bands[(src, tgt)] = band
            print(f"| {src} → {tgt} | {ratio.min():.2f} | {np.median(ratio):.2f} | {ratio.max():.2f} | "
                  f"{band[0]:.2f}–{band[1]:.2f} |")
    print("\nLENGTH_BANDS = {")
    for (src, tgt), (low, high) in bands.items():
        print(f'    ("{src}", "{tgt}"): ({low}, {high}),')
    print("}")
    lp = np.array(per_token)
    print(f"\nlog-probability per token, {len(lp)} translations (beam {beam_size}): least {lp.min():.2f}, "
          f"1st percentile {np.percentile(lp, 1):.2f}, 5th {np.percentile(lp, 5):.2f}, median {np.median(lp):.2f}")


if __name__ == "__main__":
    main()
