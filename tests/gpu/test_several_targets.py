"""Several target languages on the GPU engine: each target's translations are those of a run into it alone (the
GPU's translation does not depend on its batch), they agree with the CPU's as plain search does, and the encoder
takes each source sentence once for all the targets."""

from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest

pytest.importorskip("cupy")

from nllbcli.job.chunks import ChunkWorker  # noqa: E402
from nllbcli.io import Record  # noqa: E402
from nllbcli.options import BatchOptions, DecodeOptions, Job  # noqa: E402
from nllbcli.model.split import split_text  # noqa: E402
from nllbcli.model.translator import load_translator  # noqa: E402

from counting import CountingEngine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "data" / "samples" / "heldout"

TARGETS = ("fra_Latn", "deu_Latn", "ita_Latn")


@lru_cache(maxsize=None)
def sample(device):
    return load_translator(str(ROOT / "data" / "samples" / "model"), device)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_several_targets_on_the_gpu_are_each_targets_own_run(beam_size):
    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()[:200]
    records = [Record(n, text, {"text": text}) for n, text in enumerate(texts)]
    decode = DecodeOptions(beam_size=beam_size, max_length=64)
    gpu = sample("cuda")
    counting = CountingEngine(gpu.engine)
    several = ChunkWorker(replace(gpu, engine=counting), Job(src="eng_Latn", tgt=None, targets=TARGETS, output_format="jsonl"), decode, BatchOptions(max_batch_tokens=262144))(records)
    sources = {tuple(gpu.tokenizer.encode(sentence, "eng_Latn")) for text in texts for sentence in split_text(text)[0]}
    assert len(counting.encoded) == len(sources)  # every sentence encoded once for the three targets
    for n, code in enumerate(TARGETS):
        job = Job(src="eng_Latn", tgt=code, output_format="jsonl")
        alone = ChunkWorker(gpu, job, decode, BatchOptions(max_batch_tokens=262144))(records)
        assert [o.targets[n].translation for o in several] == [o.translation for o in alone]
        cpu = ChunkWorker(sample("cpu"), job, decode, BatchOptions(max_batch_tokens=262144))(records)
        same = [a.targets[n].translation == b.translation for a, b in zip(several, cpu)]
        assert sum(same) >= 0.99 * len(same), code
