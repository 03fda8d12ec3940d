"""A loaded model: tokenizer + engine + search, behind two calls the pipeline uses."""

from __future__ import annotations

from dataclasses import dataclass

from .checkpoint import ModelConfig, load_checkpoint, resolve_model_dir
from .engine.reference import ReferenceEngine
from .options import DecodeOptions
from .search import generate
from .tokenizer import NllbTokenizer


@dataclass
class Translator:
    config: ModelConfig
    tokenizer: NllbTokenizer
    engine: ReferenceEngine
    device: str  # "cpu" or "cuda:N": where the engine runs

    def generate(self, sources: list[list[int]], tgt_lang: str, options: DecodeOptions) -> list[list[int]]:
        """Token ids of each translation: after the language token, without </s>. Same order as `sources`."""
        return generate(self.engine, sources, self.tokenizer.lang_id(tgt_lang), self.config, options)

    def translate(self, texts: list[str], src_lang: str, tgt_lang: str, options: DecodeOptions) -> list[str]:
        """Translate a few texts as one batch (the pipeline batches large inputs itself)."""
        if not texts:
            return []
        sources = [self.tokenizer.encode(text, src_lang) for text in texts]
        return [self.tokenizer.decode(ids) for ids in self.generate(sources, tgt_lang, options)]


def choose_device(device: str) -> str:
    """`auto` is a GPU when CuPy sees one, else the CPU; `cuda` is `cuda:0`."""
    if device == "cpu":
        return "cpu"
    if device not in ("auto", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N")
    try:
        import cupy  # noqa: F401

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver or no GPU: all mean the same here
        count = 0
    if device == "auto":
        return "cuda:0" if count else "cpu"
    index = 0 if device == "cuda" else int(device.split(":", 1)[1])
    if index >= count:
        raise ValueError(f"device {device} asked for, but {'no GPU is' if not count else f'only {count} GPU(s) are'} visible to CuPy")
    return f"cuda:{index}"


def load_tokenizer(model: str) -> NllbTokenizer:
    """The tokenizer of a model directory alone: quick, so languages are checked before the weights load."""
    return NllbTokenizer.from_model_dir(resolve_model_dir(model))


def load_translator(model: str, device: str = "auto") -> Translator:
    """Load a model directory (or a hub id from the local Hugging Face cache) onto a device."""
    where = choose_device(device)
    model_dir = resolve_model_dir(model)
    config, weights = load_checkpoint(model_dir)
    tokenizer = NllbTokenizer.from_model_dir(model_dir, config)
    if where != "cpu":
        if device != "auto":
            raise ValueError(f"the GPU engine is not built yet: run with --device cpu (asked for {device})")
        where = "cpu"  # until the CuPy engine lands, auto means the CPU reference everywhere
    return Translator(config, tokenizer, ReferenceEngine(config, weights), where)
