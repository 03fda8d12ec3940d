"""A loaded model: tokenizer + engine + search, behind two calls the pipeline uses."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .checkpoint import ModelConfig, load_checkpoint, resolve_model_dir
from .engine import Engine
from .engine.reference import ReferenceEngine
from ..errors import NllbError
from ..options import COMPUTE_TYPES, KV_CACHE_TYPES, DecodeOptions
from .search import Hypothesis, generate, score_targets
from .tokenizer import M2M100Tokenizer, NllbTokenizer, tokenizer_from_model_dir


class SentenceError(NllbError):
    """One sentence of a batch cannot be translated, even alone; the rest of the batch can."""

    def __init__(self, message: str, position: int):
        super().__init__(message)
        self.position = position  # index of the sentence in the batch given to generate


@lru_cache(maxsize=1)
def out_of_memory_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean the GPU ran out of memory: CuPy's, when CuPy is there (imported only then)."""
    try:
        import cupy
    except Exception:  # no CuPy, or no driver: nothing can run out
        return ()
    return (cupy.cuda.memory.OutOfMemoryError,)


def release_free_memory() -> None:
    """Give CuPy's cached blocks back to the driver before a smaller retry."""
    try:
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
    except Exception:
        pass


@dataclass
class Translator:
    config: ModelConfig
    tokenizer: NllbTokenizer | M2M100Tokenizer  # the engine and search never know which
    engine: Engine  # engine.reference.ReferenceEngine or engine.cuda.CudaEngine
    device: str  # "cpu" or "cuda:N": where the engine runs
    model_dir: str = ""  # where the model was loaded from
    compute_type: str = "bfloat16"  # the matrix products: bfloat16 or float8 on a GPU, int8 on the CPU (load_translator)
    adapter: str | None = None  # the PEFT LoRA adapter directory merged into the weights, if any
    threads: int | None = None  # the BLAS threads the library's calls run the CPU engine with (nllbcli.load)
    kv_cache_type: str = "bfloat16"  # the decoder's K/V cache: bfloat16 (float32 on the CPU) or float8 (load_translator)

    def generate(self, sources: list[list[int]], tgt_lang: str | list[str], options: DecodeOptions) -> list[list[int]]:
        """Token ids of each translation: after the language token, without </s>. Same order as `sources`.
        (generate_hypotheses' best, without the scores.)"""
        return [hypotheses[0].ids for hypotheses in self.generate_hypotheses(sources, tgt_lang, options)]

    def generate_hypotheses(self, sources: list[list[int]], tgt_lang: str | list[str], options: DecodeOptions,
                            keys: list[int] | None = None, prefixes: list[list[int]] | None = None,
                            targets: list[list[int]] | None = None) -> list[list[Hypothesis]]:
        """The options.num_hypotheses best translations of each source, best first, with their scores
        (search.Hypothesis). Same order as `sources`. Sampling draws from the sources' random streams `keys`;
        each translation starts with its source's prefix, where given (search.generate).

        `tgt_lang` is one language for all, or one per source: a batch may mix target languages. A batch
        larger than the engine's KV pool holds at once goes in parts, and a part that runs the GPU (or the CPU)
        out of memory is halved and retried, down to one sentence; a sentence's translation does not depend on its
        batch, so the parts give the same result. A sentence that cannot be translated even alone raises SentenceError.

        `targets`: each source's given translation (pieces after the language token, without </s>), scored instead of
        searched for (search.score_targets, options.length_penalty its score's): one Hypothesis a source."""
        per_source = [tgt_lang] * len(sources) if isinstance(tgt_lang, str) else list(tgt_lang)
        ids = {lang: self.tokenizer.lang_id(lang) for lang in dict.fromkeys(per_source)}
        langs = np.array([ids[lang] for lang in per_source], dtype=np.int64)
        per_sentence = 1 if targets is not None else options.rows_per_sentence
        # the pool sized for the batch: its sentences, the tokens they can reach, its sources (a source's copies
        # side by side, several targets, share its cross rows)
        reach = max((len(target) + 2 for target in targets) if targets is not None else
                    options.length_limits(sources), default=1)
        distinct = sum(len(source) for n, source in enumerate(sources) if n == 0 or source != sources[n - 1])
        rows, source_rows = self.engine.capacity(reach, per_sentence, sentences=len(sources), source_tokens=distinct)
        if per_sentence > rows:
            raise ValueError(
                f"the GPU's KV pool holds {rows} sequences of {reach} tokens, fewer than one sentence's "
                f"{per_sentence} beams or samples: lower --beam-size or --max-length (or --num-hypotheses)"
            )
        outputs: list[list[Hypothesis]] = []
        part: list[list[int]] = []
        tokens = 0
        for position, source in enumerate(sources):
            if len(source) > source_rows:
                raise SentenceError(f"a source of {len(source)} tokens does not fit the GPU's KV pool ({source_rows} source tokens)", position)
            while part and ((len(part) + 1) * per_sentence > rows or
                            (source != part[-1] and tokens + len(source) > source_rows)):
                run = len(part)  # copies of this source at the part's end (several targets) go on with it
                while run > 0 and part[run - 1] == source:
                    run -= 1
                run = run or len(part)
                outputs += self.generate_part(part[:run], langs, options, len(outputs), keys, prefixes, targets)
                part = part[run:]
                tokens = len(part[0]) if part else 0
            if not part or source != part[-1]:  # a source's copies share its cross K/V rows (search.generate)
                tokens += len(source)
            part.append(source)
        if part:
            outputs += self.generate_part(part, langs, options, len(outputs), keys, prefixes, targets)
        return outputs

    def generate_part(self, sources: list[list[int]], langs: np.ndarray, options: DecodeOptions, first: int,
                      keys: list[int] | None = None, prefixes: list[list[int]] | None = None,
                      targets: list[list[int]] | None = None) -> list[list[Hypothesis]]:
        """One part that fits the pool; halved and retried while the GPU (or the CPU) runs out of memory. `first`
        is the position of sources[0] in generate's batch (langs, keys, prefixes and targets hold the whole
        batch's), and names the sentence in an error."""
        end, gpu = first + len(sources), self.device.startswith("cuda")
        try:
            if targets is not None:
                return [[scored] for scored in score_targets(self.engine, sources, langs[first:end], self.config,
                                                             targets[first:end], options.length_penalty)]
            return generate(self.engine, sources, langs[first:end], self.config, options,
                            None if keys is None else keys[first:end], None if prefixes is None else prefixes[first:end])
        except out_of_memory_errors() if gpu else MemoryError:  # the CPU's: NumPy's, within the process's limit
            if gpu:
                release_free_memory()
            if len(sources) == 1:
                rows, kind = options.rows_per_sentence, "sample" if options.sampling else "beam"
                raise SentenceError(
                    f"the {'GPU' if gpu else 'CPU'} ran out of memory on this sentence alone ({len(sources[0])} source "
                    f"tokens) with {rows:,} {kind}{'s' if rows > 1 else ''} of up to "
                    f"{options.length_limit(len(sources[0])):,} tokens: lower "
                    f"{'--num-hypotheses' if options.sampling else '--beam-size'} or --max-length", first) from None
        half = len(sources) // 2
        return (self.generate_part(sources[:half], langs, options, first, keys, prefixes, targets)
                + self.generate_part(sources[half:], langs, options, first + half, keys, prefixes, targets))

    def translate_sentences(self, texts: list[str], src_lang: str, tgt_lang: str, options: DecodeOptions) -> list[str]:
        """Translate a few sentences as one batch, each text whole, as one sentence (FLORES-200 codes; errors
        raise). Rows of text go through nllbcli.translate, which splits them into sentences as the CLI does."""
        if not texts:
            return []
        sources = [self.tokenizer.encode(text, src_lang) for text in texts]
        return [self.tokenizer.decode(ids) for ids in self.generate(sources, tgt_lang, options)]


def choose_device(device: str, option: str | None = None) -> str:
    """`auto` is a GPU when CuPy sees one, else the CPU; `cuda` is `cuda:0`. `option` is how messages name what
    asked for the device (default: --device DEVICE)."""
    option = option or f"--device {device}"
    if device == "cpu":
        return "cpu"
    if device not in ("auto", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N")
    count = gpu_count(None if device == "auto" else option)
    if device == "auto":
        return "cuda:0" if count else "cpu"
    index = 0 if device == "cuda" else int(device.split(":", 1)[1])
    if index >= count:
        raise ValueError(f"device {device} asked for, but {visible_gpus(count)}")
    return f"cuda:{index}"


def gpu_count(option: str | None) -> int:
    """The GPUs this process may use, cuda:0 to cuda:N-1: those the CUDA runtime counts, which are those an
    inherited CUDA_VISIBLE_DEVICES gives (inherited_gpus); 0 without a driver or a GPU. `option` names what asked
    for a GPU: without CuPy, an NllbError that says how to install it (None: no GPU)."""
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except ImportError as error:
        if option is None:
            return 0
        if isinstance(error, ModuleNotFoundError) and error.name == "cupy":
            raise NllbError(f"{option} needs CuPy, which is not installed: pip install cupy-cuda13x "
                            "(CUDA 13 drivers) or cupy-cuda12x (CUDA 12)") from None
        raise NllbError(f"{option} needs CuPy, which is installed but does not import: {error}") from None
    except Exception:  # no driver or no GPU
        return 0
    given = inherited_gpus()
    return count if given is None else min(count, len(given))


def inherited_gpus() -> list[str] | None:
    """The GPUs that CUDA_VISIBLE_DEVICES gives this process, as it names them (numbers, or UUIDs such as GPU-...
    and MIG-...): cuda:N is the Nth. None where it is not set (every GPU of the host, by CUDA's numbers); empty
    where it is set empty (no GPU)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [entry.strip() for entry in value.split(",")] if value.strip() else []


def no_gpu_reason() -> str:
    """Why --device auto took the CPU, in words."""
    try:
        import cupy  # noqa: F401
    except ModuleNotFoundError:
        return "CuPy is not installed"
    except ImportError as error:
        return f"CuPy does not import: {error}"
    return visible_gpus(gpu_count(None))


def visible_gpus(count: int) -> str:
    """`count` GPUs visible, in words, with the CUDA_VISIBLE_DEVICES that chose them."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    chosen = "" if value is None else f" (CUDA_VISIBLE_DEVICES={value})" if value else " (CUDA_VISIBLE_DEVICES is empty)"
    return ("no GPU is" if not count else f"only {count} GPU(s) are") + " visible to CuPy" + chosen


def load_tokenizer(model: str) -> NllbTokenizer | M2M100Tokenizer:
    """The tokenizer of a model directory alone: quick, so languages are checked before the weights load."""
    return tokenizer_from_model_dir(resolve_model_dir(model))


INT8_ON_GPU = "--compute-type int8 is the CPU engine's: give --device cpu with it (a GPU takes bfloat16 or float8)"


def load_translator(model: str, device: str = "auto", adapter: str | None = None, compute_type: str = "auto",
                    kv_cache_type: str = "bfloat16") -> Translator:
    """Load a model directory (or a hub id from the local Hugging Face cache) onto a device, with a PEFT LoRA
    adapter directory merged into its weights when one is given. compute_type: the GPU's matrix products in
    bfloat16, or in float8 (FP8 E4M3 weights and activations, checkpoint.E4M3Matrix; Hopper only); auto is
    float8 where the model is stored so (`nllb convert --compute-type float8`) and the GPU has it, else
    bfloat16. The CPU engine computes in float32, or with int8 weights and inputs (int8, the CPU's alone), and
    refuses float8. kv_cache_type: the decoder's K/V cache in bfloat16 (float32 on the CPU), or float8 (E4M3
    codes with a float32 scale a (row, head), on any GPU and on the CPU: the CPU engine rounds its K/V alike)."""
    check_kv_cache_type(kv_cache_type)
    where = choose_device(device)
    model_dir = resolve_model_dir(model)
    if compute_type == "int8" and where != "cpu":
        raise NllbError(INT8_ON_GPU)
    float8 = uses_float8(compute_type, where, model_dir)
    kv_float8 = kv_cache_type == "float8"
    # the GPU engine holds bf16: a bf16 checkpoint's bits go there as they are (a LoRA merge needs float32); in
    # FP8, matrices stored so come as they are, the others are quantized on the GPU as they go there
    config, weights = load_checkpoint(model_dir, bf16_bits=where != "cpu" and adapter is None, float8=float8 and adapter is None)
    if adapter is not None:
        from pathlib import Path

        from .lora import merge_lora

        weights = merge_lora(config, weights, Path(adapter))
    tokenizer = tokenizer_from_model_dir(model_dir, config)
    if where == "cpu":
        int8 = compute_type == "int8"
        return Translator(config, tokenizer, ReferenceEngine(config, weights, int8=int8, kv_float8=kv_float8), where,
                          str(model_dir), "int8" if int8 else "bfloat16", adapter, kv_cache_type=kv_cache_type)
    from .engine.cuda import CudaEngine

    engine = CudaEngine(config, weights, int(where.split(":")[1]), float8=float8, kv_float8=kv_float8)
    return Translator(config, tokenizer, engine, where, str(model_dir), "float8" if float8 else "bfloat16", adapter,
                      kv_cache_type=kv_cache_type)


def uses_float8(compute_type: str, where: str, model_dir) -> bool:
    """Whether the engine multiplies in FP8 (load_translator's compute_type), or why it cannot, in one line."""
    check_compute_type(compute_type)
    if compute_type in ("bfloat16", "int8") or (compute_type == "auto" and not stored_in_float8(model_dir)):
        return False
    why_not = float8_missing(where)
    if why_not and compute_type == "float8":
        raise NllbError(f"--compute-type float8 {why_not}: leave it out, or use bfloat16")
    return not why_not


def expected_compute_type(compute_type: str, on_gpu: bool, model_dir) -> str:
    """The compute type workers elsewhere will take (--devices, --ray), for the job's identity, without probing
    their GPUs: float8 where asked, or by auto for a model stored in FP8 on GPUs; int8 on CPUs where asked; else
    bfloat16."""
    check_compute_type(compute_type)
    if compute_type == "int8":
        if on_gpu:
            raise NllbError(INT8_ON_GPU)
        return "int8"
    float8 = compute_type == "float8" or (compute_type == "auto" and on_gpu and stored_in_float8(model_dir))
    return "float8" if float8 else "bfloat16"


def check_compute_type(compute_type: str) -> None:
    if compute_type not in COMPUTE_TYPES:
        raise NllbError(f"unknown compute type {compute_type!r}: one of {', '.join(COMPUTE_TYPES)}")


def check_kv_cache_type(kv_cache_type: str) -> None:
    if kv_cache_type not in KV_CACHE_TYPES:
        raise NllbError(f"unknown K/V cache type {kv_cache_type!r}: one of {', '.join(KV_CACHE_TYPES)}")


def float8_missing(where: str) -> str | None:
    """Why `where` cannot run FP8 matrix products (None: it can): they are Hopper's wgmma (compute capability 9.0)."""
    if where == "cpu":
        return "runs on a Hopper GPU (FP8 matrix products); the CPU engine computes in float32"
    from .engine import kernels

    if not kernels.wgmma_available():
        return (f"needs a Hopper GPU (compute capability 9.0, FP8 matrix products by wgmma); {where} is "
                f"{kernels.arch().replace('sm_', 'compute capability ')}" + (" with NLLB_NO_WGMMA set" if kernels.arch() == "sm_90" else ""))
    return None


def stored_in_float8(model_dir) -> bool:
    """The model's matrices are stored in FP8 (from the files' headers alone)."""
    from pathlib import Path

    from .checkpoint import FLOAT8, stored_tensors, weight_files

    return any(dtype == FLOAT8 for path in weight_files(Path(model_dir)) for _, dtype in stored_tensors(path).values())


def quantize_matrices(weights: dict) -> dict:
    """Every matrix (2-D weight: float32, or bf16 bits) as an E4M3Matrix, a tied one quantized once: on the host,
    for `nllb convert --compute-type float8` and the CPU reference's FP8 products."""
    from .engine.numerics import E4M3Matrix

    done: dict[int, E4M3Matrix] = {}
    out = {}
    for name, w in weights.items():
        if getattr(w, "ndim", 0) == 2:
            if id(w) not in done:
                done[id(w)] = E4M3Matrix.quantize(w)
            w = done[id(w)]
        out[name] = w
    return out
