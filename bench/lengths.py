"""Real lengths for the benchmarks: each sentence ends at its own length, as translations do, instead of all at
a fixed count. The harness (`--lengths real`) and bench.e2e (`--lengths real`) use it on both engines.

A sentence of n source tokens (its language token and </s> counted) generates round(r x n) tokens (the language
token counted, and the last: nllbcli's --max-length counts so, and transformers' max_new_tokens), at least 2 and
at most the run's cap, where r is one of RATIOS' 2,000 ratios, picked by a hash of the sentence's ids: the same
sentence ends at the same step in every engine, batch and process.

The ratios are the sample model's held-out sentences' (data/samples/heldout: the same 100 sentences in five
languages, line by line; the sample model translates 99.75% of them as written there), in all 20 directions:
the target's tokens over the source's, each counting its language token and </s>. They run from 0.61 to 1.64,
median 1.00, the middle half 0.92-1.09: a batch of sources of one length finishes over a spread of steps.

How each engine is made to end there, with the work of a real end:
- nllbcli: `install` makes these lengths the limits the search gets, so a sentence leaves the batch there, as at
  </s> (its rows gone from the step, its KV rows freed; the benchmarks' models never reach </s>), while the KV
  pool is planned, as in any job, by the options' limits: the runs with real lengths give the guard that
  docs/DECODING.md suggests, --max-length-a 1.5 --max-length-b 10 (GUARD), which every drawn length of a source
  of up to 71 tokens is within.
- transformers: `ForcedEnd`, a logits processor that bans </s> before a row's length and forces it there; a
  finished row stays in transformers' batch (padded) until the batch's longest ends, as it does in `generate`.
Both take the same number of decoder passes per sentence, its length. nllbcli's last token is a piece where
transformers' is </s>, so their texts differ by that piece.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT / "data" / "samples" / "heldout"
SAMPLE_MODEL = ROOT / "data" / "samples" / "model"
CAP = 200  # the longest a sentence generates (DecodeOptions.max_length's default)
GUARD = {"max_length_a": 1.5, "max_length_b": 10}  # the limits of a job with real lengths (docs/DECODING.md)


@lru_cache(maxsize=1)
def held_out_ratios() -> tuple[float, ...]:
    """Target tokens / source tokens of every held-out sentence in every direction (20 x 100), in a fixed order."""
    from nllbcli.model.tokenizer import tokenizer_from_model_dir

    tokenizer = tokenizer_from_model_dir(SAMPLE_MODEL)
    langs = sorted(p.stem for p in HELDOUT.glob("*.txt"))
    ids = {lang: [tokenizer.encode(line, lang) for line in (HELDOUT / f"{lang}.txt").read_text(encoding="utf-8").splitlines()]
           for lang in langs}
    return tuple(len(target) / len(source) for src in langs for tgt in langs if src != tgt
                 for source, target in zip(ids[src], ids[tgt], strict=True))


def length_of(source: Sequence[int], ratios: Sequence[float], cap: int = CAP) -> int:
    """The tokens a sentence of these source ids generates: round(r x its length), r picked by the ids' hash."""
    r = ratios[zlib.crc32(np.asarray(source, dtype=np.int64).tobytes()) % len(ratios)]
    return int(min(cap, max(2, round(r * len(source)))))


def lengths_of(sources: Sequence[Sequence[int]], ratios: Sequence[float], cap: int = CAP) -> list[int]:
    return [length_of(source, ratios, cap) for source in sources]


def ends_of(sources: Sequence[Sequence[int]], ratios: Sequence[float]) -> list[int]:
    """Where each sentence of a run with real lengths ends: its length, or GUARD's limit where that comes first
    (nllbcli's search stops there; transformers is made to end there too)."""
    from nllbcli.options import DecodeOptions

    limits = DecodeOptions(max_length=CAP, **GUARD).length_limits(sources)
    return [min(end, limit) for end, limit in zip(lengths_of(sources, ratios), limits)]


def install(ratios: Sequence[float]) -> None:
    """In this process, until uninstall(): each sentence a search takes ends at its length, unless the options'
    limit (--max-length, --max-length-a/b) ends it before; what the pool is planned by, the limits, is unchanged."""
    from nllbcli.model import search, translator
    from nllbcli.options import DecodeOptions

    limits_of = ORIGINAL.setdefault("length_limits", DecodeOptions.length_limits)

    def length_limits(options: DecodeOptions, sources: Sequence[Sequence[int]]) -> list[int]:
        limits = limits_of(options, sources)
        if not getattr(SEARCHING, "on", False):
            return limits
        return [min(limit, end) for limit, end in zip(limits, lengths_of(sources, ratios, options.max_length))]

    def ending(generate):
        def generate_ending(*args, **kwargs):
            SEARCHING.on = True
            try:
                return generate(*args, **kwargs)
            finally:
                SEARCHING.on = False

        return generate_ending

    DecodeOptions.length_limits = length_limits
    for module in (search, translator):
        module.generate = ending(ORIGINAL.setdefault(module.__name__, module.generate))


def uninstall() -> None:
    from nllbcli.model import search, translator
    from nllbcli.options import DecodeOptions

    if "length_limits" in ORIGINAL:
        DecodeOptions.length_limits = ORIGINAL.pop("length_limits")
    for module in (search, translator):
        if module.__name__ in ORIGINAL:
            module.generate = ORIGINAL.pop(module.__name__)


ORIGINAL: dict = {}  # what install replaced
SEARCHING = threading.local()  # on inside a search.generate: the sentences' ends are the limits it gets


def forced_end(lengths: Sequence[int], beams: int, eos: int):
    """transformers' logits processor for a batch whose sentence i generates lengths[i] tokens (</s> the last):
    </s> banned before, and the only choice at, that step; a sentence's beams are rows i x beams .. + beams - 1."""
    import torch
    from transformers import LogitsProcessor

    class ForcedEnd(LogitsProcessor):
        def __init__(self):
            self.lengths = None

        def __call__(self, input_ids, scores):
            if self.lengths is None:
                self.lengths = torch.tensor(lengths, device=scores.device).repeat_interleave(beams)
            generated = input_ids.shape[1]  # the decoder start and the tokens so far: this is token `generated`
            ending = self.lengths == generated
            eos_score = scores[:, eos].clone()
            scores[:, eos] = torch.where(self.lengths > generated, -torch.inf, eos_score)
            return torch.where(ending[:, None], torch.where(torch.arange(scores.shape[1], device=scores.device) == eos,
                                                            0.0, -torch.inf), scores)

    return ForcedEnd()
