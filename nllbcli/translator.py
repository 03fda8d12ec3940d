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
    engine: ReferenceEngine  # or engine.cuda.CudaEngine: the same calls
    device: str  # "cpu" or "cuda:N": where the engine runs

    def generate(self, sources: list[list[int]], tgt_lang: str, options: DecodeOptions) -> list[list[int]]:
        """Token ids of each translation: after the language token, without </s>. Same order as `sources`.

        A batch larger than the engine's KV pool holds at once goes in parts; a sentence's translation does
        not depend on its batch, so the parts give the same result."""
        lang = self.tokenizer.lang_id(tgt_lang)
        rows, source_rows = self.engine.capacity(options.max_length)
        if options.beam_size > rows:
            raise ValueError(
                f"the GPU's KV pool holds {rows} sequences of {options.max_length} tokens, fewer than one sentence's "
                f"{options.beam_size} beams: lower --beam-size or --max-length"
            )
        outputs: list[list[int]] = []
        part: list[list[int]] = []
        tokens = 0
        for ids in sources:
            if len(ids) > source_rows:
                raise ValueError(f"a source of {len(ids)} tokens does not fit the GPU's KV pool ({source_rows} source tokens)")
            if part and ((len(part) + 1) * options.beam_size > rows or tokens + len(ids) > source_rows):
                outputs += generate(self.engine, part, lang, self.config, options)
                part, tokens = [], 0
            part.append(ids)
            tokens += len(ids)
        if part:
            outputs += generate(self.engine, part, lang, self.config, options)
        return outputs

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
    if where == "cpu":
        return Translator(config, tokenizer, ReferenceEngine(config, weights), where)
    from .engine.cuda import CudaEngine

    return Translator(config, tokenizer, CudaEngine(config, weights, int(where.split(":")[1])), where)
