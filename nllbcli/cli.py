"""The `nllb` command: options in, plain records out, one call to the pipeline. No logic lives here."""

from __future__ import annotations

import os
import re
import sys

import click

from .errors import NllbError
from .io import FORMATS, format_of
from .options import BatchOptions, DecodeOptions

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


def load_model(model: str, device: str):
    """Load a Translator; imported here so `nllb --help` does not load the model code."""
    from .translator import load_translator

    return load_translator(model, device)


def load_tokenizer(model: str):
    """The model's tokenizer alone, without its weights."""
    from .translator import load_tokenizer

    return load_tokenizer(model)


model_option = click.option(
    "-m",
    "--model",
    default=DEFAULT_MODEL,
    envvar="NLLB_MODEL",
    show_default=True,
    show_envvar=True,
    help="A model directory in the Hugging Face layout, or a hub id looked up in the local Hugging Face cache.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="nllbcli", prog_name="nllb")
def cli():
    """
    Translate text files, JSONL and Parquet with Meta's NLLB-200 models.

    \b
    Example:
        nllb translate --src eng_Latn --tgt fra_Latn in.jsonl out.jsonl
    """


@cli.command()
@click.argument("input", default="-", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.argument("output", default="-", type=click.Path(dir_okay=False, writable=True, allow_dash=True))
@click.option("--src", required=True, help="Language of the input, a FLORES-200 code such as eng_Latn.")
@click.option("--tgt", required=True, help="Language to translate into, a FLORES-200 code such as fra_Latn.")
@model_option
@click.option("--device", type=Device(), default="auto", show_default=True, help="Where to run: auto picks a GPU when CuPy sees one, else the CPU.")
@click.option("--input-format", type=click.Choice(FORMATS), help="Format of INPUT (default: from its extension; text for -).")
@click.option("--output-format", type=click.Choice(FORMATS), help="Format of OUTPUT (default: from its extension; the input's for -).")
@click.option("--field", default="text", show_default=True, help="The JSONL field or Parquet column to translate.")
@click.option("--output-field", default="translation", show_default=True, help="The JSONL field or Parquet column the translation goes to.")
@click.option("--beam-size", type=click.IntRange(min=1), default=DecodeOptions.beam_size, show_default=True, help="Beams per sentence; 1 is greedy search.")
@click.option("--max-length", type=click.IntRange(min=1), default=DecodeOptions.max_length, show_default=True, help="At most this many generated tokens per sentence, the target-language token included.")
@click.option("--length-penalty", type=float, default=DecodeOptions.length_penalty, show_default=True, help="Beam search ranks finished beams by sum(log p) / length ** this.")
@click.option("--max-batch-tokens", type=click.IntRange(min=1), default=BatchOptions.max_batch_tokens, show_default=True, help="Source tokens per batch, counted as rows x longest row.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
def translate(input, output, src, tgt, model, device, input_format, output_format, field, output_field,
              beam_size, max_length, length_penalty, max_batch_tokens, quiet):
    """
    Translate INPUT into OUTPUT (both default to -, stdin and stdout).

    The format comes from each file's extension (.jsonl, .parquet, .txt) or
    --input-format/--output-format; - is text, one sentence per line. JSONL
    and Parquet rows keep every field and gain the translation. Rows stay in
    input order.

    \b
    Examples:
        nllb translate --src eng_Latn --tgt fra_Latn in.jsonl out.jsonl
        cat notes.txt | nllb translate --src eng_Latn --tgt deu_Latn > notes.de.txt
        nllb translate --src spa_Latn --tgt eng_Latn day.parquet day.en.parquet
    """
    from .pipeline import Job, translate_file

    try:
        in_format = format_of(input, input_format)
        out_format = output_format or (in_format if output == "-" else format_of(output, None))
    except NllbError as error:
        raise InvalidUsage(str(error)) from None
    job = Job(src=src, tgt=tgt, input=input, output=output, input_format=in_format, output_format=out_format,
              field=field, output_field=output_field)
    decode = DecodeOptions(beam_size, max_length, length_penalty)
    batching = BatchOptions(max_batch_tokens)
    try:
        tokenizer = load_tokenizer(model)  # languages are checked before the weights load
        for option, code in (("--src", src), ("--tgt", tgt)):
            try:
                tokenizer.lang_id(code)
            except NllbError as error:
                raise InvalidUsage(f"Invalid value for '{option}': {error}") from None
        translator = load_model(model, device)
        translate_file(translator, job, decode, batching, progress=show_progress(quiet, output))
    except (NllbError, ValueError) as error:
        raise click.ClickException(str(error)) from None
    except BrokenPipeError:
        quiet_stdout()
        sys.exit(1)
    except OSError as error:
        raise click.ClickException(f"{error.filename or 'I/O'}: {error.strerror or error}.") from None
    except KeyboardInterrupt:
        sys.exit(130)


@cli.command()
@model_option
def langs(model):
    """List the model's language codes, one per line."""
    try:
        codes = load_tokenizer(model).lang_codes
    except (NllbError, ValueError) as error:
        raise click.ClickException(str(error)) from None
    click.echo("\n".join(codes))


def show_progress(quiet: bool, output: str) -> bool:
    """Progress goes to stderr when it is a terminal, unless the translations go to that terminal too."""
    if quiet or not sys.stderr.isatty():
        return False
    return not (output == "-" and sys.stdout.isatty())


def quiet_stdout() -> None:
    """The reader of our stdout went away (`| head`): stop, and keep Python from complaining at exit."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (under a test runner)
        pass


def main() -> None:
    cli(prog_name="nllb")
