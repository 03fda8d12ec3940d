"""The `nllb` command: options in, plain records out, one call to the job (job/loop.py) per input; the one mapping
of errors to exit codes is the command group's."""

from __future__ import annotations

import functools
import operator
import os
import re
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable

import click

from .errors import NllbError
from .io import FORMATS, format_of, input_format_of, known_extension
from .model.langid import AUTO, load_detector, resolve_source
from .model.langs import resolve_lang, resolve_targets
from .options import (COMPUTE_TYPES, FACTOR_RANGE, KV_CACHE_TYPES, GPU_BATCHING, LENGTH_PENALTY_LIMIT, MAX_BATCH, MAX_BEAMS, MAX_LENGTH,
                      MAX_SEED, MAX_THREADS, MAX_TOPK, ON_FLAG, ROW_FLAGS, SAMPLING_TOPP_TOKENS, TARGETS_AS, TEXT_LAYOUTS,
                      BatchOptions,
                      DecodeOptions, Job, ModelOptions, cpu_threads)
from .job.progress import PROGRESS_MODES

ON_ERROR = ("fail", "skip", "record")

DEFAULT_MODEL = "facebook/nllb-200-distilled-600M"


class InvalidUsage(click.ClickException):
    """A bad value the user gave (exit 2), told in one line without the usage block."""

    exit_code = 2


class Device(click.ParamType):
    name = "device"

    def get_metavar(self, *args, **kwargs) -> str:
        return "[auto|cpu|cuda|cuda:N]"

    def convert(self, value, param, ctx):
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value):
            self.fail(f"{value!r} is not a device: use auto, cpu, cuda or cuda:N.", param, ctx)
        return value


class Band(click.ParamType):
    """MIN,MAX: two numbers, MIN below MAX, as (MIN, MAX)."""

    name = "MIN,MAX"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            low, high = (float(part) for part in value.split(","))
        except ValueError:
            self.fail(f"{value!r} is not two numbers with a comma between, as 0.5,2.", param, ctx)
        if not 0 <= low < high:
            self.fail(f"{value!r} is not a band: 0 <= MIN < MAX.", param, ctx)
        return low, high


def flag_list(value: str | None) -> tuple[str, ...]:
    """--flags' names, comma-separated, as a tuple (the job refuses names it does not know)."""
    return tuple(name.strip() for name in value.split(",")) if value else ()


class Between(click.FloatRange):
    """A float within its range, NaN refused too: it compares false with both ends, so the range lets it by."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if number != number:
            self.fail(f"{value!r} is not a number.", param, ctx)
        return number


def load_model(model: str, device: str, adapter: str | None = None, compute_type: str = "auto",
               kv_cache_type: str = "bfloat16"):
    """Load a Translator; imported here so `nllb --help` does not load the model code."""
    from .model.translator import load_translator

    return load_translator(model, device, adapter, compute_type, kv_cache_type)


def load_tokenizer(model: str):
    """The model's tokenizer alone, without its weights."""
    from .model.translator import load_tokenizer

    return load_tokenizer(model)


MODEL_DECLS = ("-m", "--model")
MODEL_ATTRS = dict(default=DEFAULT_MODEL, envvar="NLLB_MODEL", show_default=True, show_envvar=True,
                   help="A model directory in the Hugging Face layout, or a hub id looked up in the local Hugging Face cache.")
model_option = click.option(*MODEL_DECLS, **MODEL_ATTRS)


def model_named(ctx: click.Context, model: str, argument: str | None) -> str:
    """The model a command is to use: its MODEL argument, a shortcut for -m/--model (which NLLB_MODEL sets);
    the two given on the command line must agree."""
    from click.core import ParameterSource

    if argument is None:
        return model
    if ctx.get_parameter_source("model") == ParameterSource.COMMANDLINE and model != argument:
        raise InvalidUsage(f"MODEL {argument} and --model {model} name two models: give one.")
    return argument


USER_ERRORS = (NllbError, ValueError, OSError)  # what a user's input, model, options or disk can cause


def failure(error: BaseException) -> click.ClickException:
    """An error a user can cause as the one line click shows, with exit 1."""
    if isinstance(error, OSError):
        return click.ClickException(f"{error.filename or 'I/O'}: {error.strerror or error}.")
    return click.ClickException(str(error))


class Commands(click.Group):
    """The subcommands, with the one mapping of what ends them to exit codes: an error a user can cause is one
    line and exit 1 (failure; usage errors are click's, exit 2), a reader of stdout gone away 141, a Ctrl-C 130,
    never a traceback (click's own handling of Ctrl-C says "Aborted!" and exits 1)."""

    def make_context(self, *args, **kwargs):
        try:  # the options are parsed before invoke: a Ctrl-C then is 130 too, not click's "Aborted!" and 1
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            exit_stopped(130)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            exit_stopped(130)
        except BrokenPipeError:
            quiet_stdout()
            sys.exit(141)
        except Exception as error:
            code = stopped_by(error)
            if code is not None:
                exit_stopped(code)
            if isinstance(error, USER_ERRORS):
                raise failure(error) from None
            raise


def stopped_by(error: BaseException) -> int | None:
    """The exit code of the Ctrl-C or stop signal `error` comes of, if it does: one that lands while a C extension
    initializes (sentencepiece's, imported as the job starts) surfaces as ImportError("initialization failed"),
    raised from the KeyboardInterrupt (or the job's Stopped)."""
    from .job.signals import Stopped

    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return 130
        if isinstance(error, Stopped):
            return error.exit_code
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


class RecordOption(click.Option):
    """An option that fills a field of one of the job's records: `record` (job, decode, batching or model), `field`
    (the option's own name by default), `convert` what the field takes of the value given (--no-split: split)."""

    def __init__(self, *args, record: str, field: str | None = None, convert: Callable | None = None, **attrs):
        super().__init__(*args, **attrs)
        self.record, self.field, self.convert = record, field or self.name, convert


HELP_GROUPS = {  # `nllb translate --help`'s sections, in order, and the options of each (by their parameter names)
    "Input and output": ("output_option", "input_format", "output_format", "text_layout", "field", "target_field",
                         "target_file", "output_field", "status_field", "overwrite_field", "po_overwrite", "force"),
    "Languages": ("src", "tgt", "targets_as", "src_lang_field", "tgt_lang_field", "detected_field"),
    "Decoding": ("beam_size", "max_length", "length_penalty", "no_repeat_ngram_size", "repetition_penalty",
                 "min_length", "max_length_a", "max_length_b", "num_hypotheses", "sampling_topk", "sampling_topp",
                 "sampling_temperature", "seed", "prefix_field", "scores", "score_field", "log_prob_field",
                 "token_scores", "max_input_length", "no_split", "split", "protect"),
    "Row flags (docs/FLAGS.md)": ("flags", "min_score", "length_ratio", "on_flag", "retry_flagged", "retry_beam_size",
                                  "retry_no_repeat_ngram_size", "retry_repetition_penalty"),
    "Model, devices and batching": ("model", "adapter", "compute_type", "kv_cache_type", "device", "devices",
                                    "threads", "max_batch_tokens", "max_batch_sentences", "chunk_rows"),
    "Cluster (Ray)": ("on_ray", "ray_address", "ray_actors"),
    "Job control": ("on_error", "errors", "resume", "no_record", "progress", "quiet", "help"),
}


class GroupedCommand(click.Command):
    """A command whose --help shows its options in sections (HELP_GROUPS), and under its usage line what its
    arguments default to (`defaults`)."""

    def __init__(self, *args, defaults: str = "", **attrs):
        super().__init__(*args, **attrs)
        self.defaults = defaults

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_usage(ctx, formatter)
        if self.defaults:
            formatter.write(f"{'':>{formatter.current_indent + 2}}{self.defaults}\n")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records = help_records(self, ctx)
        for title, names in help_sections(records):
            with formatter.section(title):
                formatter.write_dl([records[name] for name in names])


def help_records(command: click.Command, ctx: click.Context) -> dict:
    """Each option's (option, help text) as --help shows it, by parameter name ("help" for -h/--help), or None
    for an option without help."""
    return {"help" if param is command.get_help_option(ctx) else param.name: param.get_help_record(ctx)
            for param in command.get_params(ctx) if isinstance(param, click.Option)}


def help_sections(records: dict) -> list[tuple[str, tuple[str, ...]]]:
    """HELP_GROUPS' sections of the options that have help (`records`: each option's, or None), then any option
    in none of them under "Other options" (a test keeps that empty)."""
    grouped = {name for names in HELP_GROUPS.values() for name in names}
    sections = [(title, tuple(n for n in names if records.get(n))) for title, names in HELP_GROUPS.items()]
    sections.append(("Other options", tuple(n for n, record in records.items() if record and n not in grouped)))
    return [(title, names) for title, names in sections if names]


def into(record: str, *decls: str, **attrs):
    """A click option that fills a field of `record` (RecordOption)."""
    return click.option(*decls, cls=RecordOption, record=record, **attrs)


@dataclass(frozen=True)
class Run:
    """How the command runs its jobs: the options of `nllb translate` that fill no record. None shapes the output
    (the paths are the job's, checked_job)."""

    paths: tuple[str, ...]  # INPUT [OUTPUT], or INPUTs with -o
    output_option: str | None  # -o
    input_format: str | None  # the formats as given; the job's are found from the paths (checked_job)
    output_format: str | None
    devices: str | None  # --devices: one worker process a device
    threads: int  # the CPU engine's BLAS threads
    resume: bool
    progress: str
    quiet: bool
    on_ray: bool = False  # --ray, --ray-address, --ray-actors (nllb translate's)
    ray_address: str | None = None
    ray_actors: int | None = None


def with_records(command: Callable) -> Callable:
    """Give the command its options as records: the options of each of job, decode and batching (RecordOption)
    as one mapping of the record's fields to the values given, under the record's name (the records are made once
    the options are checked against each other, option_records); the model's as ModelOptions; the rest as Run."""
    @functools.wraps(command)
    def given_as_records(**params):
        given: dict[str, dict] = {"job": {}, "decode": {}, "batching": {}, "model": {}}
        for param in click.get_current_context().command.params:
            if isinstance(param, RecordOption):
                value = params.pop(param.name)
                given[param.record][param.field] = value if param.convert is None else param.convert(value)
        model = ModelOptions(**given.pop("model"))
        return command(**given, model=model, run=Run(**params))

    return given_as_records


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(None, "-V", "--version", package_name="nllbcli", prog_name="nllb")
def cli():
    """
    Translate text files, JSONL, Parquet and CSV with Meta's NLLB-200 models.

    \b
    Example:
        nllb translate --src eng_Latn --tgt fra_Latn in.jsonl out.jsonl
    """


@cli.command(cls=GroupedCommand, defaults="INPUT and OUTPUT default to -: stdin and stdout.")
@click.argument("paths", metavar="[INPUT [OUTPUT]]", nargs=-1, type=click.Path(allow_dash=True))
@click.option("-o", "--output", "output_option", type=click.Path(allow_dash=True), help="Where the translations go, instead of OUTPUT: a file, or - for stdout; with several INPUTs a directory (made if missing) where each translation gets its INPUT's name.")
@into("job", "--force", is_flag=True, help="Replace an OUTPUT file that nllb did not write (it replaces its own outputs without this).")
@into("job", "--src", help="Language of the input: a FLORES-200 code (eng_Latn), ISO 639 (en, eng) or BCP-47 tag (en-US); or auto: each row's language detected (per sentence where they differ; a row whose language cannot be detected, or that the model lacks, fails; see --detected-field and docs/LANGUAGES.md). Rows with a src_lang field override it (auto there too).")
@into("job", "--tgt", help="Language to translate into, in the same forms (fra_Latn, fr, zh-Hant-TW). Rows with a tgt_lang field override it. Several, with commas between (fra_Latn,deu_Latn), translate each row into each: see --targets-as.")
@into("job", "--targets-as", type=click.Choice(TARGETS_AS), help="With several --tgt languages: the translation (and status, scores) once per target in fields named FIELD_CODE (translation_fra_Latn), or each row once per target, its language in --tgt-lang-field; rows' own target fields are not read. Each sentence goes through the encoder once. [default: columns; rows for text output, a line per target]")
@into("model", *MODEL_DECLS, **MODEL_ATTRS)
@into("model", "--device", type=Device(), default="auto", show_default=True, help="Where to run: auto picks a GPU when CuPy sees one, else the CPU.")
@click.option("--devices", metavar="LIST", help="One worker process per device, each with the model loaded: GPU numbers (0,1,3, as CuPy numbers them under CUDA_VISIBLE_DEVICES), all (every GPU CuPy sees), or cpu:N (N workers on the CPU, at most one a core, sharing --threads). Rows stay in input order and --resume works as in a one-device job.")
@click.option("--ray", "on_ray", is_flag=True, help="Run on a Ray cluster through Ray Data (nllbcli's ray extra: pip install '.[ray]' in nllbcli's checkout): INPUTs are files, directories or globs of JSONL or Parquet, OUTPUT a directory of parts. The cluster is --ray-address's, else $RAY_ADDRESS's, else the one `ray start` runs on this machine, else a Ray started for the job. See docs/SCALE.md.")
@click.option("--ray-address", metavar="ADDRESS", help="With --ray: the cluster to join, as ray.init takes it (auto, HOST:6379, ray://HOST:10001).")
@click.option("--ray-actors", type=click.IntRange(min=1), help="With --ray: translating actors. [default: one per GPU of the cluster, else one]")
@into("model", "--adapter", type=click.Path(file_okay=False), help="A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors), merged into the weights at load.")
@into("model", "--compute-type", type=click.Choice(COMPUTE_TYPES), default="auto", show_default=True, help="The matrix products. On a GPU: bfloat16, or float8 (FP8 E4M3 weights with a scale an output channel, inputs with a scale a row; Hopper GPUs; about half the weights' memory, translations close to bfloat16's: docs/GPU.md, Compute types); auto is float8 for a model converted with --compute-type float8, else bfloat16. On the CPU: float32 (auto), or int8 (int8 weights with a scale an output channel, inputs with a scale a row; faster, translations close to float32's).")
@into("model", "--kv-cache-type", type=click.Choice(KV_CACHE_TYPES), default="bfloat16", show_default=True, help="The decoder's K/V cache: bfloat16 (float32 on the CPU), or float8: each K and V row in FP8 E4M3 with a float32 scale a head, about half the cache's memory, so that larger batches fit; translations close to bfloat16's (docs/GPU.md, FP8 K/V cache). On any GPU, and on the CPU, whose engine rounds its K and V alike.")
@click.option("--input-format", type=click.Choice(FORMATS), help="Format of INPUT (default: from its extension, else found from its first bytes, stdin's too: name csv and tsv).")
@click.option("--output-format", type=click.Choice(FORMATS), help="Format of OUTPUT (default: from its extension; the input's for -).")
@into("job", "--text-layout", type=click.Choice(TEXT_LAYOUTS), default="plain", show_default=True, help="A text output's lines: the translations, a line a row (plain; --num-hypotheses N lines), or marian's n-best layout, a line a hypothesis: ROW ||| TRANSLATION ||| log_prob= LOG_PROB ||| SCORE, ROW counting the input's rows from 0 (nbest; the scores of --scores, a failed row without a line).")
@into("job", "--field", default="text", show_default=True, help="The JSONL field, or Parquet, CSV or TSV column, to translate.")
@into("job", "--output-field", default="translation", show_default=True, help="The JSONL field or Parquet or CSV column the translation goes to.")
@into("job", "--status-field", help="A JSONL field or Parquet or CSV column that gets each row's status: ok, or its flags comma-joined: cut (a sentence was cut to the model's positions), max_length (a translation stopped at --max-length), those of --flags, retried (--retry-flagged), as cut,max_length or repetition,retried. [default: none]")
@into("job", "--overwrite-field", is_flag=True, help="Let the translation (and status) replace a field or column of the same name that a row has, the source text included (refused without this).")
@into("job", "--detected-field", help="With --src auto (or rows whose src_lang is auto): a JSONL field or Parquet or CSV column that gets each row's detected language and the detector's confidence, {\"lang\": \"fra_Latn\", \"confidence\": 0.98} (lang names each language, with commas between, of a row whose sentences differ; null where the row named its language). [default: none]")
@into("job", "--src-lang-field", field="src_field", default="src_lang", show_default=True, help="Field or column that gives a row's own source language.")
@into("job", "--tgt-lang-field", field="tgt_field", default="tgt_lang", show_default=True, help="Field or column that gives a row's own target language.")
@into("decode", "--beam-size", type=click.IntRange(min=1, max=MAX_BEAMS), help=f"Beams per sentence; 1 is greedy search (at most {MAX_BEAMS:,}, and half the model's vocabulary). [default: the model's generation_config.json num_beams, else {DecodeOptions.beam_size}]")
@into("decode", "--max-length", type=click.IntRange(min=1, max=MAX_LENGTH), help=f"At most this many generated tokens per sentence, the target-language token included (at most {MAX_LENGTH:,}: no model has more positions). [default: the model's generation_config.json max_new_tokens, or its max_length less 1 (NLLB's: 199), else {DecodeOptions.max_length}]")
@into("decode", "--length-penalty", type=Between(-LENGTH_PENALTY_LIMIT, LENGTH_PENALTY_LIMIT), help=f"Beam search ranks finished beams by sum(log p) / length ** this (within ±{LENGTH_PENALTY_LIMIT:g}, so that length ** this stays a finite float32 at any length). [default: the model's generation_config.json length_penalty, else {DecodeOptions.length_penalty}]")
@into("decode", "--no-repeat-ngram-size", type=click.IntRange(min=0, max=MAX_LENGTH), help=f"No n-gram of this many tokens occurs twice in a translation; 0 is off. [default: the model's generation_config.json no_repeat_ngram_size, else {DecodeOptions.no_repeat_ngram_size}]")
@into("decode", "--repetition-penalty", type=Between(*FACTOR_RANGE), help=f"Scores of tokens already generated are divided by this (multiplied when negative); 1 is off (from {FACTOR_RANGE[0]:g} to {FACTOR_RANGE[1]:g}, so that the scores stay finite). [default: the model's generation_config.json repetition_penalty, else {DecodeOptions.repetition_penalty}]")
@into("decode", "--min-length", type=click.IntRange(min=0, max=MAX_LENGTH), help=f"At least this many generated tokens before </s>, the target-language token included (transformers' min_new_tokens); 0 is off. [default: the model's generation_config.json min_new_tokens, else {DecodeOptions.min_length}]")
@into("decode", "--max-length-a", type=Between(0, MAX_LENGTH), help="With --max-length-b: at most A x source tokens + B generated tokens per sentence (fairseq's --max-len-a/b; source tokens count the language token and </s>), and never more than --max-length, so that a short input cannot run away. [default: off]")
@into("decode", "--max-length-b", type=click.IntRange(min=0, max=MAX_LENGTH), help="See --max-length-a (either alone takes the other as 0).")
@into("decode", "--num-hypotheses", type=click.IntRange(min=1, max=MAX_BEAMS), default=1, show_default=True, help="Translations per row, best first, at most --beam-size: JSONL and Parquet get lists (of strings, and of scores with --scores), text this many lines per row.")
@into("decode", "--sampling-topk", type=click.IntRange(min=0, max=MAX_TOPK), help="Draw each token at random among the K most likely (0: the whole vocabulary; K at most the model's vocabulary) instead of searching, for back-translation and data augmentation; 1 is greedy search. Sampling takes --beam-size 1 (its default then); --num-hypotheses N draws N samples a sentence. [default: 1, or 0 with --sampling-topp]")
@into("decode", "--sampling-topp", type=Between(min=0, max=1, min_open=True), help=f"With sampling: draw among the fewest of those tokens whose probabilities reach P (nucleus sampling; with --sampling-topk 0, among the {SAMPLING_TOPP_TOKENS} most likely). [default: 1, all of them]")
@into("decode", "--sampling-temperature", type=Between(*FACTOR_RANGE), help=f"With sampling: draw from softmax(logits / T); below 1 sharper, above flatter (from {FACTOR_RANGE[0]:g} to {FACTOR_RANGE[1]:g}, so that logits / T stays finite). [default: 1]")
@into("decode", "--seed", type=click.IntRange(min=0, max=MAX_SEED), help="With sampling: each sentence's draws follow from this and the sentence's place in the input (row, sentence in the row), so a job gives the same output again, whatever its batches, devices or resumes (a 64-bit number). [default: a random seed]")
@into("job", "--prefix-field", help="A JSONL field or Parquet or CSV column with text each row's translation must start with (CTranslate2's target_prefix), for glossary-constrained or interactive work: forced, then the model goes on. Rows without it (or with it empty or null) translate freely. [default: none]")
@into("decode", "--scores", is_flag=True, help="Add each translation's score (beam search's sum(log p) / length ** --length-penalty, greedy search's sum(log p)) and sum of log-probabilities to the row, in --score-field and --log-prob-field: low scores flag translations worth a look (docs/DECODING.md, Scores).")
@into("job", "--score-field", help="With --scores: the JSONL field or Parquet or CSV column of the score. [default: score]")
@into("job", "--log-prob-field", help="With --scores: the JSONL field or Parquet or CSV column of the sum of log-probabilities. [default: log_prob]")
@into("job", "--max-input-length", type=int, help="Cut each source sentence to this many tokens (the language token and </s> included), as a sentence longer than the model's positions is cut: the row's status says cut. [default: the model's positions]")
@into("job", "--no-split", field="split", convert=operator.not_, is_flag=True, help="Translate each row whole instead of sentence by sentence.")
@into("job", "--po-overwrite", is_flag=True, help="A PO INPUT's entries translated already (fuzzy ones too) are translated again; without it only untranslated entries are.")
@into("job", "--protect", is_flag=True, help="Keep placeholders and markup out of the model's hands: {name}, %s, %(name)s, {{var}}, HTML/XML tags and entities, URLs and e-mail addresses come back exactly, in their order, and only the text between them is translated; a row whose translation would not keep them fails (--on-error). PO entries flagged python-format or c-format are protected without it. See docs/FORMATS.md, Protected spans.")
@into("batching", "--max-batch-tokens", type=click.IntRange(min=1, max=MAX_BATCH), help=f"Source tokens per batch, counted as rows x longest row. [default: {BatchOptions.max_batch_tokens} on the CPU, {GPU_BATCHING.max_batch_tokens} on a GPU]")
@into("batching", "--max-batch-sentences", type=click.IntRange(min=1, max=MAX_BATCH), help="Sentences per batch as well: a batch keeps within both limits. [default: no limit]")
@into("batching", "--chunk-rows", field="read_chunk_rows", type=click.IntRange(min=1, max=MAX_BATCH), help=f"Rows read, translated and committed together (what --resume repeats at most). [default: {BatchOptions.read_chunk_rows} on the CPU, {GPU_BATCHING.read_chunk_rows} on a GPU]")
@into("job", "--flags", convert=flag_list, metavar="LIST", help=f"Flags to compute for each row besides cut and max_length, comma-separated: {', '.join(ROW_FLAGS)} (each defined in docs/FLAGS.md). A row's flags go to its --status-field and the summary's counts; the row is written all the same (see --on-flag). [default: none; --min-score and --length-ratio turn theirs on]")
@into("job", "--min-score", type=Between(-1e30, 0), help="low_score: flag a translation whose log-probability per generated token is below this (on the sample model -0.5 parts its held-out translations, -0.38 at least, from its nonsense, -0.6 to -2.7: docs/FLAGS.md). [default: off]")
@into("job", "--length-ratio", field="length_ratio_min", type=Band(), help="length_ratio: flag a row whose translation pieces / source pieces fall outside MIN,MAX. [default: the direction's band measured on the sample model, else 0.4,2.5; off unless --flags length_ratio or this is given]")
@into("job", "--on-flag", type=click.Choice(ON_FLAG), default="write", show_default=True, help="A flagged row is written (write); written and also recorded in --errors with its flags and translation (record); or failed, which --on-error then deals with (fail).")
@into("job", "--retry-flagged", is_flag=True, help="Translate each flagged row (cut alone aside) again, sentence by sentence, with beam search, an n-gram ban and a repetition penalty (--retry-*), and keep the translation with fewer flags, then the better log-probability per token; its status adds retried.")
@into("job", "--retry-beam-size", type=click.IntRange(min=1, max=MAX_BEAMS), default=Job.retry_beam_size, show_default=True, help="With --retry-flagged: the retry's beams.")
@into("job", "--retry-no-repeat-ngram-size", type=click.IntRange(min=0, max=MAX_LENGTH), default=Job.retry_no_repeat_ngram_size, show_default=True, help="With --retry-flagged: the retry's --no-repeat-ngram-size.")
@into("job", "--retry-repetition-penalty", type=Between(*FACTOR_RANGE), default=Job.retry_repetition_penalty, show_default=True, help="With --retry-flagged: the retry's --repetition-penalty.")
@click.option("--threads", type=click.IntRange(min=1, max=MAX_THREADS), default=cpu_threads, envvar="NLLB_THREADS", show_envvar=True, show_default="half the cores, at least 1", help=f"Threads of the CPU engine's matrix products (its own, each matrix product on one thread, so the output does not depend on their number; at most {MAX_THREADS:,}, the most CPUs Linux runs on); a GPU job's engine does not use them.")
@into("job", "--on-error", type=click.Choice(ON_ERROR), help="A bad row stops the job (fail), is left out and named on stderr (skip), or is left out and written to --errors (record). [default: fail, or record with --errors; skip for a PO INPUT, whose failed entries stay untranslated]")
@into("job", "--errors", type=click.Path(dir_okay=False, writable=True), help="JSONL file of the rows that failed: each with its row number, the reason and the row as it was in the input (--on-error record).")
@into("job", "--no-record", field="record", convert=operator.not_, is_flag=True, help="Leave no record of the job beside OUTPUT once it has finished (.NAME.nllb-state.json, kept otherwise): a --resume then translates it again, and another job replaces OUTPUT only with --force.")
@click.option("--resume", is_flag=True, help="Continue an interrupted job on OUTPUT where it stopped; a job that finished already, on the same input with the same options, is not run again (starts afresh when there is nothing to continue).")
@click.option("--progress", type=click.Choice(PROGRESS_MODES), default="auto", show_default=True, help="Progress on stderr: a bar, JSON lines every few seconds, none; auto is the bar on a terminal.")
@click.option("-q", "--quiet", is_flag=True, help="No progress and no summary on stderr.")
@with_records
def translate(job: dict, decode: dict, batching: dict, model: ModelOptions, run: Run):
    """
    Translate INPUT into OUTPUT (both default to -, stdin and stdout).

    The format comes from each file's extension (.jsonl, .ndjson, .json,
    .parquet, .txt, .csv, .tsv, .po, .pot, each optionally .gz or .zst) or
    --input-format and --output-format; stdin and other inputs are sniffed
    from their bytes (CSV and TSV are named), gzip and zstd decompressed.
    JSONL, Parquet, CSV and TSV rows keep every field and gain the
    translation. Rows stay in input order. Each row is translated sentence
    by sentence and joined back.

    An OUTPUT file that nllb did not write is not replaced without --force.
    Several inputs go to a directory: nllb translate -o DIR INPUT...

    Exit codes: 0 all rows translated, 1 the job could not run, 2 bad usage,
    3 finished with some rows failed, 130/143 stopped by SIGINT/SIGTERM
    (--resume continues), 141 the reader of stdout went away.

    \b
    Examples:
        nllb translate --src eng_Latn --tgt fra_Latn in.jsonl out.jsonl
        cat notes.txt | nllb translate --src en --tgt de > notes.de.txt
        nllb translate --src es --tgt en --resume --errors bad.jsonl day.parquet day.en.parquet
        nllb translate --src en --tgt fr -o fr/ docs/*.txt
        nllb translate --src en --tgt fr --ray 'corpus/*.parquet' corpus.fr
    """
    base, decoding = option_records(job, decode, model.model)
    if run.on_ray:
        return translate_on_ray(base, decoding, batching, model, run)
    # as given: several targets go to a text output as rows by default (checked_job)
    run_jobs(base, decoding, batching, model, run, job["targets_as"], job["on_error"] is None and not job["errors"])


def run_jobs(base: Job, decoding: DecodeOptions, batching: dict, model: ModelOptions, run: Run,
             targets_as: str | None = None, default_on_error: bool = False) -> None:
    """The command's jobs, an INPUT and its OUTPUT each, on the one model the command loads (or its --devices
    workers); exits with the worst exit code of them (0, 1 or 3). `default_on_error`: --on-error was not given
    (nor --errors), and a PO input's failed entries are skipped."""
    from dataclasses import replace

    for option, given in (("--ray-address", run.ray_address), ("--ray-actors", run.ray_actors)):
        if given is not None:
            raise InvalidUsage(f"{option} goes with --ray.")
    if base.targets:  # the added fields are named by the model's codes: known before the fields are checked
        base = replace(base, targets=resolved_languages(model.model, None, None, base.targets)["targets"])
    pairs = input_output_pairs(run.paths, run.output_option, run.output_format)
    if len(pairs) > 1 and base.errors:
        raise InvalidUsage("--errors names one file, and there are several inputs: translate them one at a time to "
                           "record their failed rows, or use --on-error skip.")
    jobs = [checked_job(replace(base, input=input, output=output), run.input_format, run.output_format, run.resume,
                        targets_as)
            for input, output in pairs]
    if default_on_error:  # a catalogue's failed entry stays untranslated, named on stderr
        jobs = [replace(each, on_error="skip") if each.input_format == "po" else each for each in jobs]
    if len(pairs) > 1:
        os.makedirs(os.path.dirname(pairs[0][1]) or ".", exist_ok=True)
    languages = resolved_languages(model.model, base.src, base.tgt, base.targets)
    jobs = [replace(job, **languages) for job in jobs]
    with ExitStack() as stack:
        pool = None
        if run.devices is None:
            # the adapter, compute type and K/V cache type are passed only when given, so a load_model that knows none
            # of them still serves
            given = {**({"adapter": model.adapter} if model.adapter else {}),
                     **({"compute_type": model.compute_type} if model.compute_type != "auto" else {}),
                     **({"kv_cache_type": model.kv_cache_type} if model.kv_cache_type != "bfloat16" else {})}
            translator = load_model(model.model, model.device, **given)
        else:
            translator, pool = start_workers(stack, run.devices, model, run.threads)
        batch = BatchOptions.for_device(getattr(translator, "device", "cpu"), **batching)
        codes = []
        for job in jobs:
            mode = "none" if run.quiet else progress_mode(run.progress, job.output)
            try:
                codes.append(run_job(translator, job, decoding, batch, mode, run.resume, run.quiet, run.threads, pool,
                                     where_it_runs(translator, model, pool)))
            except (*USER_ERRORS, click.ClickException) as error:
                if len(jobs) == 1 or isinstance(error, BrokenPipeError):
                    raise
                (error if isinstance(error, click.ClickException) else failure(error)).show()
                codes.append(1)
    command_done(1 if 1 in codes else max(codes))


def reused(*names: str) -> Callable:
    """Give a command these options of `nllb translate` (by parameter name), in this order: one declaration, one
    meaning, whichever command takes them."""
    def give(command: Callable) -> Callable:
        import copy

        params = {param.name: param for param in translate.params}
        for name in reversed(names):
            click.decorators._param_memo(command, copy.copy(params[name]))
        return command

    return give


@cli.command(cls=GroupedCommand, defaults="INPUT and OUTPUT default to -: stdin and stdout.")
@click.argument("paths", metavar="[INPUT [OUTPUT]]", nargs=-1, type=click.Path(allow_dash=True))
@reused("output_option", "force", "src", "tgt", "model", "device", "devices", "adapter", "compute_type", "kv_cache_type",
        "input_format", "output_format", "field")
@into("job", "--target-field", help="The JSONL field or Parquet, CSV or TSV column of the translation to score. [default: translation, the field nllb translate writes]")
@into("job", "--target-file", type=click.Path(exists=True, dir_okay=False, allow_dash=False), help="With a text INPUT: the translations to score, a line each, the line of INPUT's line's number (two files line by line, as paste pairs them).")
@reused("status_field", "overwrite_field", "src_lang_field", "tgt_lang_field")
@into("job", "--score-field", default="score", show_default=True, help="The field or column of the score: the sum of log-probabilities / length ** --length-penalty, length counting the tokens after the decoder start (the language token and </s> included), as beam search's.")
@into("job", "--log-prob-field", default="log_prob", show_default=True, help="The field or column of the sum of the tokens' log-probabilities (</s>'s included, the forced language token's not).")
@into("job", "--token-scores", field="token_scores_field", flag_value="token_scores", default=None, help="Add each token's log-probability, a list in the field token_scores (the translation's pieces in turn, </s>'s last), as marian's --word-scores; a text output's lines get them as a third column.")
@into("decode", "--length-penalty", type=Between(-LENGTH_PENALTY_LIMIT, LENGTH_PENALTY_LIMIT), help="The score is sum(log p) / length ** this. [default: the model's generation_config.json length_penalty, else 1]")
@reused("flags", "min_score", "length_ratio", "on_flag")
@into("job", "--split", is_flag=True, help="Score sentence by sentence: the text's and the translation's sentences in pairs (a row whose sentences are not as many fails); the row's log-probability is their sum, its score their scores' mean. [default: each row whole]")
@reused("max_input_length", "max_batch_tokens", "max_batch_sentences", "chunk_rows", "threads", "on_ray",
        "ray_address", "ray_actors", "on_error", "errors", "no_record", "resume", "progress", "quiet")
@with_records
def score(job: dict, decode: dict, batching: dict, model: ModelOptions, run: Run):
    """
    Score given translations: each row's log-probability of its translation
    under the model (forced decoding, as CTranslate2's score_batch and
    fairseq's --score-reference), to filter a parallel corpus or find the
    rows worth a look.

    INPUT holds text and translation side by side (JSONL, Parquet, CSV, TSV:
    --field and --target-field), or is a text file with the translations in
    --target-file, line by line. OUTPUT gets every row with its score and
    log_prob (a text OUTPUT a line a row: LOG_PROB, tab, SCORE). Rows stay
    in input order; --resume, --on-error and the exit codes are nllb
    translate's.

    \b
    Examples:
        nllb score --src eng_Latn --tgt fra_Latn pairs.jsonl scored.jsonl
        nllb score --src en --tgt fr en.txt --target-file fr.txt > scores.tsv
        nllb translate --src en --tgt fr in.jsonl out.jsonl && nllb score --src en --tgt fr out.jsonl scored.jsonl
    """
    job = dict(job)
    job["length_ratio_min"], job["length_ratio_max"] = job["length_ratio_min"] or (None, None)  # --length-ratio's band
    job = {**job, "task": "score", "on_error": job["on_error"] or ("record" if job["errors"] else "fail"),
           "target_field": job["target_field"] or ("target" if job["target_file"] else "translation")}
    try:
        penalty = decode["length_penalty"]  # the one decoding option a score takes: the model's where not given
        decoding = DecodeOptions(beam_size=1, length_penalty=decode_options(model.model).length_penalty
                                 if penalty is None else penalty)
        base = Job(**job)
    except ValueError as error:
        raise InvalidUsage(str(error)) from None
    if run.on_ray:
        return translate_on_ray(base, decoding, batching, model, run)
    run_jobs(base, decoding, batching, model, run)


def option_records(job: dict, decode: dict, model: str) -> tuple[Job, DecodeOptions]:
    """The job and its decoding options from the fields given (with_records), checked: what one option says of
    another (--score-field goes with --scores, --seed with sampling, several --tgt languages), then the records'
    own checks, each a usage error."""
    job, decode = dict(job), dict(decode)
    job["length_ratio_min"], job["length_ratio_max"] = job["length_ratio_min"] or (None, None)  # --length-ratio's band
    for option, name in (("--score-field", "score_field"), ("--log-prob-field", "log_prob_field")):
        if job[name] is not None and not decode["scores"]:
            raise InvalidUsage(f"{option} goes with --scores.")
    if decode["sampling_topk"] is None and decode["sampling_topp"] is not None:
        decode["sampling_topk"] = 0  # a nucleus of the whole vocabulary
    sampling = decode["sampling_topk"] is not None and decode["sampling_topk"] != 1
    for option, name in (("--sampling-topp", "sampling_topp"), ("--sampling-temperature", "sampling_temperature"),
                         ("--seed", "seed")):
        if decode[name] is not None and not sampling:
            raise InvalidUsage(f"{option} goes with sampling: --sampling-topk 0 (the whole vocabulary) or above 1.")
    if sampling and decode["beam_size"] is None:
        decode["beam_size"] = 1
    tgt = job["tgt"]
    targets = tuple(code.strip() for code in tgt.split(",")) if tgt and "," in tgt else ()
    if targets and not all(targets):
        raise InvalidUsage(f"Invalid value for '--tgt': {tgt!r} has an empty language code: name them with commas "
                           "between, as fra_Latn,deu_Latn.")
    if job["targets_as"] is not None and not targets:
        raise InvalidUsage("--targets-as goes with several target languages: --tgt fra_Latn,deu_Latn.")
    scores = decode["scores"] = decode["scores"] or job["text_layout"] == "nbest"  # its lines hold the scores
    try:
        decoding = decode_options(model, **{**decode, "scores": scores or None})
        return Job(**{**job, "tgt": None if targets else tgt, "targets": targets,
                      "targets_as": job["targets_as"] or "columns",
                      "on_error": job["on_error"] or ("record" if job["errors"] else "fail"),
                      "score_field": (job["score_field"] or "score") if scores else None,
                      "log_prob_field": (job["log_prob_field"] or "log_prob") if scores else None,
                      "hypotheses": decode["num_hypotheses"]}), decoding
    except ValueError as error:
        raise InvalidUsage(str(error)) from None


def decode_options(model: str, **given) -> DecodeOptions:
    """The decoding options: each one given on the command line, else the model's generation_config.json's,
    else nllb's own (checkpoint.decode_options)."""
    from .model.checkpoint import decode_options as for_model, resolve_model_dir

    try:
        model_dir = resolve_model_dir(model)
    except NllbError:
        model_dir = None  # loading the model names what is wrong with it
    return for_model(model_dir, **given)


def resolved_languages(model: str, src: str | None, tgt: str | None, targets: tuple[str, ...] = ()) -> dict:
    """--src and --tgt (or --tgt's several targets) as the model's codes (None where not given), resolved before
    the weights load."""
    known = load_tokenizer(model).lang_codes
    resolved: dict = {}
    if src is not None and src.strip().lower() == AUTO:
        try:
            load_detector()  # a detector not installed is no invalid value of --src
        except NllbError as error:
            raise click.ClickException(str(error)) from None
    for option, value in (("--src", src), ("--tgt", tgt)):
        resolve = resolve_source if option == "--src" else resolve_lang  # --src auto: each row's, detected
        try:
            resolved[option.removeprefix("--")] = None if value is None else resolve(value, known)
        except NllbError as error:
            raise InvalidUsage(f"Invalid value for '{option}': {error}") from None
    try:
        resolved["targets"] = resolve_targets(targets, known)
    except NllbError as error:
        raise InvalidUsage(f"Invalid value for '--tgt': {error}") from None
    return resolved


def translate_on_ray(base: Job, decode: DecodeOptions, batching: dict, model: ModelOptions, run: Run) -> None:
    """--ray: the inputs into one directory of parts on a Ray cluster (runners/ray.py); exit 0, or 3 with failed
    rows. `batching` as given: the actors' device picks the rest."""
    from dataclasses import replace

    from .model.checkpoint import resolve_model_dir
    from .job.signals import Stopped, stop_on_signals

    ctx = click.get_current_context()
    if base.on_flag == "record":
        raise InvalidUsage("--on-flag record is not written by a --ray job: find the flagged rows by their "
                           "--status-field in its parts.")
    if ctx.get_parameter_source("devices") is not click.core.ParameterSource.DEFAULT:
        raise InvalidUsage("--devices and --ray cannot be used together: --ray runs an actor per GPU of the cluster.")
    if model.device not in ("auto", "cpu", "cuda"):
        raise InvalidUsage(f"--device {model.device} with --ray: the actors take auto, cpu or cuda (Ray gives each its GPU).")
    paths = run.paths
    inputs, output = ((list(paths), run.output_option) if run.output_option is not None
                      else (list(paths[:-1]), paths[-1] if paths else None))
    if not inputs or output is None:
        raise InvalidUsage("--ray needs INPUTs and an OUTPUT directory: nllb translate --ray INPUT... OUTPUT, or -o OUTPUT INPUT...")
    if "-" in inputs or output == "-":
        raise InvalidUsage("--ray reads files and writes a directory: - (stdin or stdout) is neither.")
    if not base.record:
        raise InvalidUsage("--no-record does not go with --ray: a --ray job's record is OUTPUT/_SUCCESS, Ray Data's "
                           "mark of a finished output.")
    try:
        from .runners import ray
    except ImportError as error:
        raise click.ClickException(f"--ray needs Ray Data, which is not installed here ({error}): install nllbcli "
                                   "with its ray extra (pip install '.[ray]' in nllbcli's checkout).") from None
    job = replace(base, **resolved_languages(model.model, base.src, base.tgt, base.targets))
    model_dir = str(resolve_model_dir(model.model).resolve())
    options = ray.RayOptions(run.ray_address, run.ray_actors, run.threads)
    try:
        with stop_on_signals():
            outcomes = ray.translate_with_ray(
                inputs, output, job, decode, replace(model, model=model_dir), options, batching=batching,
                resume=run.resume, input_format=run.input_format, output_format=run.output_format,
                progress="none" if run.quiet else progress_mode(run.progress, output),
                warn=lambda message: click.echo(message, err=True))
    except Stopped as stop:
        exit_on_stop(stop, streamed=False)
    ray.report(outcomes, output, summary=not run.quiet, mode=progress_mode(run.progress, output),
               finished_as=job.finished_as)
    command_done(3 if outcomes.counters.failed else 0)


def where_it_runs(translator, model: ModelOptions, pool) -> str:
    """Where a job runs, as its summary says it: the device, the CPU (with why, where --device auto found no GPU),
    or --devices' workers."""
    if pool is not None:
        devices = [worker.device for worker in pool.workers]
        gpus = [device.split(":")[1] for device in devices if device != "cpu"]
        return f"GPU{'s' if len(gpus) > 1 else ''} {', '.join(gpus)}" if gpus else f"{len(devices)} CPU workers"
    device = getattr(translator, "device", "cpu")
    if device != "cpu":
        return device
    if model.device == "auto":
        from .model.translator import no_gpu_reason

        return f"the CPU (--device auto: {no_gpu_reason()})"
    return "the CPU"


def start_workers(stack: ExitStack, devices: str, model: ModelOptions, threads: int):
    """--devices: the main process's model (tokenizer and config, devices.host_translator) and the workers'
    pool, which `stack` ends."""
    from .runners.devices import host_translator, open_pool, parse_devices

    if click.get_current_context().get_parameter_source("device") is not click.core.ParameterSource.DEFAULT:
        raise InvalidUsage("--device and --devices cannot be used together: --devices names every device.")
    try:
        names = parse_devices(devices)
    except NllbError as error:
        raise InvalidUsage(str(error)) from None
    translator = host_translator(model.model, names[0], model.adapter)
    pool = stack.enter_context(open_pool(names, model.model, model.adapter, threads, model.compute_type,
                                         model.kv_cache_type))
    translator.compute_type = pool.compute_type  # what the workers took, for the job's identity
    translator.kv_cache_type = model.kv_cache_type
    return translator, pool


def input_output_pairs(paths: tuple[str, ...], output_option: str | None, output_format: str | None) -> list[tuple[str, str]]:
    """The (INPUT, OUTPUT) of each job: `INPUT [OUTPUT]`, or INPUTs with -o (a directory for several)."""
    for path in paths[:1] if output_option is None else paths:
        if path != "-" and not os.path.exists(path):
            raise InvalidUsage(f"Invalid value for 'INPUT': Path {path!r} does not exist.")
        if os.path.isdir(path):
            raise InvalidUsage(f"Invalid value for 'INPUT': {path!r} is a directory.")
    if output_option is None:
        if len(paths) > 2:
            raise InvalidUsage(f"{len(paths)} paths given, and nllb translate takes one INPUT and its OUTPUT (a pattern "
                               "such as dir/*.txt gives the shell's every match): to translate several files, name an "
                               "output directory: nllb translate -o DIR INPUT...")
        return [(paths[0] if paths else "-", paths[1] if len(paths) > 1 else "-")]
    inputs = paths or ("-",)
    if len(inputs) == 1 and not os.path.isdir(output_option) and not output_option.endswith(os.sep):
        return [(inputs[0], output_option)]
    if output_option == "-" or (os.path.exists(output_option) and not os.path.isdir(output_option)):
        raise InvalidUsage(f"-o {output_option}: with several inputs, -o names a directory for their translations.")
    if "-" in inputs:
        raise InvalidUsage("- (stdin) cannot be one of several inputs: name files.")
    outputs = [os.path.join(output_option, output_name(path, output_format)) for path in inputs]
    for n, output in enumerate(outputs):
        if output in outputs[:n]:
            raise InvalidUsage(f"{inputs[outputs.index(output)]} and {inputs[n]} would both be translated into {output}: "
                               "translate them into separate directories.")
    return list(zip(inputs, outputs))


def output_name(path: str, output_format: str | None) -> str:
    """An input's name in an output directory: its own, or with the extension of --output-format."""
    from .io.streams import compression_of, without_compression

    name = os.path.basename(path)
    if output_format is None:
        return name
    compressed = os.path.splitext(name)[1] if compression_of(name) else ""  # in.jsonl.gz: in.txt.gz
    extension = {"jsonl": ".jsonl", "parquet": ".parquet", "text": ".txt", "csv": ".csv", "tsv": ".tsv", "po": ".po"}[output_format]
    return os.path.splitext(without_compression(name))[0] + extension + compressed


def checked_job(job, input_format: str | None, output_format: str | None, resume: bool, targets_as: str | None = None):
    """The job with its formats, checked before any model loads: every usage error of the job's paths. Several
    targets go to a text output as rows unless `targets_as` (--targets-as) says otherwise."""
    from dataclasses import replace

    from .io.streams import compression_of, writes_to_terminal
    from .job.spec import check_fields, check_paths
    from .job.state import is_stream

    input, output = job.input, job.output
    try:
        in_format = input_format_of(input, input_format)
        # a stream (stdout, /dev/stdout, a FIFO) without a known extension takes the input's format
        out_format = output_format or (in_format if output == "-" or (is_stream(output) and not known_extension(output))
                                       else format_of(output, None))
    except NllbError as error:
        raise InvalidUsage(str(error)) from None
    if out_format == "parquet" and writes_to_terminal(output):
        raise InvalidUsage("Parquet is binary, and OUTPUT is a terminal: name an OUTPUT file, or pass --output-format "
                           "jsonl or text.")
    for path, stream, what in ((input, 0, "input"), (output, 1, "output")):
        if path == "-" and stream in CLOSED_STREAMS:
            raise InvalidUsage(f"standard {what} is closed: name an {what.upper()} file instead of -.")
    for option, value in (("--src", job.src), ("--tgt", job.tgt or job.targets)):
        if not value and in_format == "text":
            raise click.UsageError(f"Missing option '{option}' (text rows cannot name their own languages).")
    if resume and output == "-":
        raise InvalidUsage("--resume needs an OUTPUT file: what went to stdout cannot be continued.")
    for option, path in (("OUTPUT", output), ("--errors", job.errors)):
        if resume and path and path != "-" and is_stream(path):
            raise InvalidUsage(f"--resume needs {option} to be a file: {path} is a stream (a FIFO or a device), and "
                               "what went to it cannot be taken back.")
    job = replace(job, input_format=in_format, output_format=out_format,
                  output_compression=None if output == "-" else compression_of(output),
                  targets_as=targets_as or ("rows" if out_format == "text" and job.targets else job.targets_as))
    try:
        check_paths(job)
        check_fields(job)
    except NllbError as error:
        raise InvalidUsage(str(error)) from None
    return job


def run_job(translator, job, decode: DecodeOptions, batching: BatchOptions, mode: str, resume: bool, quiet: bool,
            threads: int | None = None, pool=None, where: str = "") -> int:
    """One job through the pipeline; its exit code (0, or 3 with failed rows). A stop signal or a gone reader
    of stdout ends the command."""
    from .job.loop import translate_file
    from .job.state import is_stream
    from .job.signals import Stopped, stop_on_signals

    try:
        with stop_on_signals():
            counters = translate_file(translator, job, decode, batching, progress=mode, resume=resume, summary=not quiet,
                                      threads=threads, pool=pool, where=where)
        return 3 if counters.failed else 0
    except Stopped as stop:
        exit_on_stop(stop, is_stream(job.output))


def exit_on_stop(stop, streamed: bool) -> None:
    """End a job a stop signal stopped: say what it leaves (to a stream, `streamed`: how many rows were written,
    `stop.rows`; else what --resume continues from, where `stop.resumable` says something was saved) and exit with
    130 or 143."""
    if streamed and getattr(stop, "rows", 0):
        click.echo(f"Stopped by {stop}: the first {stop.rows:,} rows are done and written.", err=True)
    elif streamed:
        click.echo(f"Stopped by {stop} before any rows were written.", err=True)
    elif getattr(stop, "resumable", False):
        click.echo(f"Stopped by {stop}: the rows done so far are saved; run the same command with --resume to continue.", err=True)
    else:
        click.echo(f"Stopped by {stop} before any rows were saved; nothing was written.", err=True)
    sys.exit(stop.exit_code)


@cli.command()
@click.argument("filters", metavar="[FILTER]...", nargs=-1)
@model_option
@click.option("--json", "as_json", is_flag=True, help="Print the languages as one JSON array of {code, name} objects.")
def langs(filters, model, as_json):
    """
    List the model's language codes with the languages' names.

    A FILTER keeps the languages whose code or name holds it, in any case,
    and the code a language code such as zh-TW resolves to; with several
    FILTERs, a language that matches any of them. No match is exit 1.

    \b
    Examples:
        nllb langs
        nllb langs fra chinese
        nllb langs --json > languages.json
    """
    import json

    from .model.langs import language_name, matching_codes

    known = load_tokenizer(model).lang_codes
    codes = matching_codes(known, filters)
    names = {code: language_name(code) for code in codes}
    if as_json:
        click.echo(json.dumps([{"code": code, "name": names[code]} for code in codes], indent=1, ensure_ascii=False))
    else:
        width = max(map(len, known), default=0)  # the columns of a filtered list are those of the whole one
        click.echo("\n".join(f"{code:<{width}}  {names[code]}" for code in codes))


@cli.command()
@click.argument("model_argument", metavar="[MODEL]", required=False)
@model_option
@click.option("--max-length", type=click.IntRange(min=1, max=MAX_LENGTH), default=DecodeOptions.max_length, show_default=True, help="The --max-length the KV cache per sequence is counted for.")
@click.option("--json", "as_json", is_flag=True, help="Print the facts as one JSON object.")
@click.pass_context
def info(ctx, model_argument, model, max_length, as_json):
    """
    Describe the model (MODEL, or -m/--model) without loading its weights.

    Prints the family (NLLB-200 or M2M-100), dimensions, stored dtype,
    parameter count, the GPU memory its weights take in bf16 and what the
    KV pool adds, from config.json and the weight files' headers alone.

    \b
    Examples:
        nllb info -m facebook/nllb-200-distilled-600M
        nllb info data/samples/model
    """
    import json
    from dataclasses import asdict

    from .model.info import describe, inspect_model

    model = model_named(ctx, model, model_argument)
    facts = inspect_model(model, max_length)
    click.echo(json.dumps(asdict(facts), indent=1) if as_json else describe(facts))


@cli.command()
@click.argument("paths", metavar="[MODEL] OUT", nargs=-1, type=click.Path())
@model_option
@click.option("--force", is_flag=True, help="Replace OUT when it is not empty.")
@click.option("--compute-type", type=click.Choice(("bfloat16", "float8")), default="bfloat16", show_default=True,
              help="float8: the matrices (projections, FFNs, embedding) in FP8 E4M3 with a float32 scale an output "
                   "channel, the rest in bf16: a quarter of a float32 checkpoint, which `nllb translate` runs with FP8 "
                   "matrix products on a Hopper GPU without quantizing again (nllbcli's layout: transformers does not read it).")
@click.pass_context
def convert(ctx, paths, model, force, compute_type):
    """
    Copy the model (MODEL, or -m/--model) into the directory OUT as bf16
    safetensors (or FP8, --compute-type float8).

    The model is a directory (safetensors or pytorch_model.bin, single or
    sharded, any dtype) or a hub id in the local Hugging Face cache. OUT gets
    model.safetensors (half a float32 checkpoint's size, the tied embedding
    stored once), config.json and the tokenizer and generation files. OUT
    appears only when complete.

    \b
    Examples:
        nllb convert facebook/nllb-200-distilled-600M /models/nllb-600M-bf16
        NLLB_MODEL=/models/nllb-600M nllb convert /models/nllb-600M-bf16
        nllb convert /models/nllb-3.3B /models/nllb-3.3B-fp8 --compute-type float8
    """
    from pathlib import Path

    from .model.convert import convert_model

    if not paths:
        raise click.UsageError("Missing argument 'OUT'.")
    if len(paths) > 2:
        raise click.UsageError(f"{len(paths)} paths given: nllb convert takes [MODEL] OUT.")
    *model_argument, out = paths
    model = model_named(ctx, model, model_argument[0] if model_argument else None)
    if os.path.isfile(out):
        raise InvalidUsage(f"Invalid value for 'OUT': {out!r} is a file.")
    written = convert_model(model, Path(out), force=force, float8=compute_type == "float8")
    click.echo(f"Wrote {written}", err=True)


@cli.command()
@click.argument("repo_id")
@click.option("--local-dir", type=click.Path(file_okay=False), help="Download into this directory instead of the Hugging Face cache.")
@click.option("--revision", help="A branch, tag or commit of the hub repository (default: main).")
def download(repo_id, local_dir, revision):
    """
    Fetch a model from the Hugging Face hub.

    Needs the huggingface_hub package (pip install huggingface_hub), which
    nllbcli does not depend on. Without --local-dir the model goes into the Hugging Face cache, where
    --model REPO_ID then finds it. Only the config, tokenizer files and one
    set of weights are fetched (safetensors when the repository has them).
    Prints the model directory.

    \b
    Example:
        nllb download facebook/nllb-200-distilled-600M
    """
    from pathlib import Path

    from .model.checkpoint import download_model

    path = download_model(repo_id, None if local_dir is None else Path(local_dir), revision)
    click.echo(str(path))


def progress_mode(progress: str, output: str) -> str:
    """auto is the bar when stderr is a terminal, unless the translations go to that terminal too."""
    if progress != "auto":
        return progress
    if not sys.stderr.isatty() or (output == "-" and sys.stdout.isatty()):
        return "none"
    return "bar"


def quiet_stdout() -> None:
    """The reader of our stdout went away (`| head`): stop, and keep Python from complaining at exit."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (under a test runner)
        pass


CLOSED_STREAMS: set[int] = set()  # the standard streams (0, 1, 2) the command was started with closed


def reopen_closed_streams() -> set[int]:
    """Open /dev/null onto each standard stream the shell closed (`>&-`, `<&-`, `2>&-`), and return which they
    were. Otherwise the next file the job opens would take the closed stream's descriptor, and whatever is meant
    for that stream (a message, a C library's print) would land in the job's file; Python would also have None
    for sys.stdout."""
    closed = set()
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
    for fd in sorted(closed):  # the lowest free descriptor first: each open fills the one closed
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    streams = {0: ("stdin", "r"), 1: ("stdout", "w"), 2: ("stderr", "w")}
    for fd in closed:
        name, mode = streams[fd]
        setattr(sys, name, open(fd, mode, encoding="utf-8", errors="backslashreplace" if fd == 2 else None, closefd=False))
    return closed


AS_COMMAND = False  # main() sets it: this process is the nllb command, and may ignore signals once it is done


def ignore_signals() -> None:
    """SIGINT and SIGTERM ignored from now on: the command has ended (finished, failed or stopped) and says so
    with its exit code, which a signal while click closes its contexts, or while the interpreter shuts down,
    would turn into a KeyboardInterrupt ("Aborted!", exit 1, or a death by the signal)."""
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def exit_stopped(code: int) -> None:
    """End a command a Ctrl-C or stop signal ended outside a job's own handling (at start-up, say) with `code`.
    As the nllb command, at once (os._exit, its streams flushed; what it opened was closed as the exception
    passed): under `python -m`, Python turns the exit after a KeyboardInterrupt that passed through C code
    running Python (PyRun_String, as some extensions' initialization does) into a death by SIGINT, whatever the
    code. A test's process, running the command through click, gets a SystemExit."""
    if AS_COMMAND:
        ignore_signals()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(code)
    sys.exit(code)


def command_done(code: int) -> None:
    """End a finished command with `code`, which a signal can no longer change (nothing is left to stop). As the
    nllb command only: a test's process, running the command through click, keeps its own handlers."""
    if AS_COMMAND:
        ignore_signals()
    sys.exit(code)


def main(handlers: dict | None = None) -> None:
    """`handlers`: the signal handlers to go back to once the imports are done (__main__ sets its own for them)."""
    import signal

    global AS_COMMAND
    AS_COMMAND = True
    for signum, handler in (handlers or {}).items():
        signal.signal(signum, handler)
    CLOSED_STREAMS.update(reopen_closed_streams())
    # a path on stdout (nllb info, nllb download) is written as its own bytes, as ls writes it: a Linux file name
    # need not be UTF-8, and Python holds its other bytes as surrogates, which a strict stdout refuses (stderr
    # writes them as \udcXX escapes)
    sys.stdout.reconfigure(errors="surrogateescape")
    try:
        cli(prog_name="nllb")
    finally:
        ignore_signals()


if __name__ == "__main__":
    main()
