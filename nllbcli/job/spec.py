"""The job's spec checked before any work: its paths (never over its input, never over a file nllb did not
write), its fields (no clash among the added ones, none over an input column unless asked), and the identity
that a resumed job must match."""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType

from ..errors import NllbError
from ..io import STDIN_NAME, file_identity
from ..model.checkpoint import MODEL_PARTS, model_identity, worker_disagreement
from ..options import BatchOptions, DecodeOptions, Job, ModelOptions, loaded_model, shaping_fields
from .state import converting_path, file_stamp, is_stream, partial_paths, written_by_nllb


def follow_link(path: str | None) -> str | None:
    """A destination that is a symbolic link is written where it points, as the shell's `>` does: the partial
    file goes beside the link's target and is renamed onto it, and the link stays."""
    if path and path != "-" and os.path.islink(path):
        return os.path.realpath(path)
    return path


def check_paths(job: Job) -> None:
    """Refuse a job that would write over its own input: OUTPUT, the errors file and the files written beside
    them (partial, state) are each another file than INPUT, and the errors file another than OUTPUT, also
    through a symbolic or hard link. A PO output is written from a PO input's catalogue, in one language."""
    if job.output_format == "po" and job.input_format != "po":
        raise NllbError(f"a PO output is its input's catalogue with the translations filled in: INPUT must be a PO "
                        f"file, not {job.input_format}.")
    if job.po_overwrite and job.input_format != "po":
        raise NllbError(f"--po-overwrite goes with a PO INPUT, and INPUT is {job.input_format}.")
    if job.output_format == "po" and job.targets:
        raise NllbError("a PO output holds one language: translate into each of several --tgt languages apart.")
    written = []
    if job.output != "-":
        written.append(("OUTPUT", job.output))
        if not is_stream(job.output):
            written += [*(("OUTPUT's partial file", p) for p in partial_paths(job.output)),
                        ("OUTPUT's temporary file", converting_path(job.output))]
    if job.records_errors:
        if job.errors == "-":
            raise NllbError("--errors needs a file: - is not one (--on-error skip names the failed rows on stderr).")
        if job.output != "-" and not is_stream(job.errors) and same_file(job.errors, job.output):
            raise NllbError("--errors must be another file than OUTPUT.")
        written.append(("--errors", job.errors))
        if not is_stream(job.errors):
            written.append(("--errors' partial file", partial_paths(job.errors)[0]))
    for option, read in (("the input file", job.input), ("--target-file", job.target_file)):
        if read is not None and read != "-":
            for what, path in written:
                if same_file(read, path):
                    raise NllbError(f"{what} {path} is {option} {read}: refusing to write over the input.")
    if job.output != "-" and not job.force and not is_stream(job.output):
        check_replace(job.output)


def check_replace(output: str) -> None:
    """Refuse to replace a file at OUTPUT that nllb did not write (an empty file aside): with `nllb translate
    dir/*.txt` the shell makes the second input OUTPUT."""
    target = follow_link(output)
    stamp = file_stamp(target)
    if stamp is None or stamp["size"] == 0 or written_by_nllb(target):
        return
    raise NllbError(f"OUTPUT {output} exists and nllb did not write it: refusing to replace it. Pass --force to "
                    "replace it; to translate several files, name an output directory: -o DIR INPUT...")


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file: the same inode where both exist (links included), else the same path
    once links are resolved."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def job_identity(translator, job: Job, decode: DecodeOptions, batching: BatchOptions) -> dict:
    """The identity of a job run with `translator` (identity_of): the command's, and --devices' (whose main
    process holds the workers' model, devices.host_translator)."""
    return identity_of(job, decode, batching, loaded_model(translator))


def identity_of(job: Job, decode: DecodeOptions, batching: BatchOptions | Mapping, model: ModelOptions,
                input: dict | list | None = None) -> dict:
    """What shapes the output: each output-shaping field of the records (options.shaping_fields), which a resumed
    job must match, and an unchanged finished job's record too. The input by its file's identity (or `input`,
    where a runner reads several files), the model and the adapter by their files (checkpoint.model_identity),
    the decoding options under "decode". `batching` may be a mapping of the batching options as given (one left
    out or None: the device's default), where the runner picks the device only once it runs (--ray)."""
    identity = {**shaping_values(job), "input": input_identity(job.input) if input is None else input,
                "decode": shaping_values(decode), **shaping_values(batching, BatchOptions)}
    if job.target_file is not None:
        identity["target_file"] = input_identity(job.target_file)
    return {**identity, **model_identity(model.model, model.adapter, model.compute_type, model.kv_cache_type),
            "device": model.device}


def model_part(identity: dict) -> dict:
    """The model part of a job's identity (checkpoint.model_identity's): what every worker must compute with."""
    return {key: identity[key] for key in (*MODEL_PARTS, "compute_type", "kv_cache_type") if key in identity}


def loaded_identity(translator) -> dict:
    """The model part of the identity of a job run with `translator`: what a worker computes with, once loaded."""
    model = loaded_model(translator)
    return model_identity(model.model, model.adapter, model.compute_type, model.kv_cache_type)


def check_worker(identity: dict, loaded: dict, worker: str, same_host: bool = True) -> None:
    """Refuse a job whose worker (a --devices process, a Ray actor: `worker` names it) computes with another
    model than the job's identity names (`loaded`: loaded_identity there): a job's bytes must not depend on which
    worker took a chunk."""
    why = worker_disagreement(model_part(identity), loaded, same_host)
    if why is None:
        return
    hint = ("give --compute-type bfloat16, or only devices with FP8 (Hopper GPUs)" if why.startswith("computes")
            else "load every worker with the job's --kv-cache-type" if why.startswith("keeps")
            else "its files changed after it loaded them, or it sees other files: run the command again once they are "
                 "the same")
    raise NllbError(f"{worker} {why}: {hint}.")


def shaping_values(record, record_type: type | None = None) -> dict:
    """The output-shaping fields of a record (or a mapping of its fields' values) as JSON holds them."""
    get = record.get if isinstance(record, Mapping) else lambda name: getattr(record, name)
    return {name: list(value) if isinstance(value, tuple) else value
            for name in shaping_fields(record_type or type(record)) for value in (get(name),)}


def input_identity(path: str) -> dict:
    """An input file's identity (its size and modification time, io.file_identity); stdin's is its name."""
    return {"path": "-"} if path == "-" else file_identity(path)


def job_label(job: Job) -> str:
    """What the progress bar names the job by: the input's file name and the direction."""
    name = "stdin" if job.input == "-" else os.path.basename(job.input)
    src, tgt = job.src or f"each row's {job.src_field}", job.tgt or ", ".join(job.targets) or f"each row's {job.tgt_field}"
    return f"{name}: {src} → {tgt}"


def check_fields(job: Job, names: Mapping[str, str] = MappingProxyType({})) -> None:
    """Refuse, before any work, fields that clash: the translation written over the source text (unless
    --overwrite-field), the status or a score over either or each other, or a status or scores where the output
    (text) has no fields. Messages name the options as `names` spells them (the API's arguments), else as the
    command's."""
    say = lambda option: names.get(option, option)  # noqa: E731
    if job.text_layout == "nbest" and job.output_format != "text":
        raise NllbError(f"--text-layout nbest lays out a text output, and OUTPUT is {job.output_format}: its rows "
                        "hold the hypotheses and their scores as fields with --num-hypotheses and --scores.")
    if job.text_layout == "nbest" and job.targets:
        raise NllbError("--text-layout nbest takes one target language: its lines name their row, not their target.")
    if job.prefix_field is not None and job.input_format == "text":
        raise NllbError("--prefix-field needs JSONL, Parquet or CSV input: a text input has no fields.")
    if job.targets and job.output_format == "text" and job.targets_as != "rows":
        raise NllbError("Several target languages as columns need JSONL, Parquet or CSV output: a text output has no "
                        "columns. Pass --targets-as rows for a line per target language.")
    if job.targets and job.targets_as == "rows" and job.output_format != "text" and not job.tgt_field:
        raise NllbError(f"{say('--targets-as rows')} names each row's target language in {say('--tgt-lang-field')}: "
                        "give it a name.")
    named = [("--field", job.field), *((o, n) for o, n in job.added.options
                                       if not (o == "--tgt-lang-field" and job.output_format == "text"))]
    scored = ("--score-field", "--log-prob-field") if job.text_layout == "nbest" else ()  # in its lines
    if job.task == "score":  # a text output's lines are the scores
        scored = ("--score-field", "--log-prob-field", "--token-scores")
        if job.target_field == job.field:
            raise NllbError(f"{say('--target-field')} {job.target_field} is {say('--field')}'s too: the translation to "
                            "score is another field than the text.")
        if job.target_file is None and job.input_format == "text":
            raise NllbError(f"A text INPUT has no fields: name the file of its translations, a line each, with "
                            f"{say('--target-file')}.")
        if job.target_file is not None and job.input_format != "text":
            raise NllbError(f"{say('--target-file')} pairs a text INPUT's lines with its own; INPUT is "
                            f"{job.input_format}: name the translations' field with {say('--target-field')}.")
    for n, (option, name) in enumerate(named[1:], 1):
        if job.output_format == "text" and option != "--output-field" and option not in scored:
            what = "--scores" if option in ("--score-field", "--log-prob-field") else option
            raise NllbError(f"{what} needs JSONL, Parquet or CSV output: a text output has one translation a line and no "
                            "fields.")
        # a translation over the source text is --overwrite-field's to allow, below
        clash = next((other for other, taken in named[:n]
                      if taken == name and (option, other) != ("--output-field", "--field")), None)
        if clash is not None:
            raise NllbError(f"{say(option)} {name} is {say(clash)}'s field too: name another.")
    translations = [name for option, name in named if option == "--output-field"]
    if job.field in translations and job.output_format != "text" and not job.overwrite_field:
        what = job.output_field if job.output_field == job.field else f"{job.output_field} writes {job.field}, which"
        raise NllbError(f"{say('--output-field')} {what} is the field being translated ({say('--field')}), and the "
                        f"translation would replace the source text: name another with {say('--output-field')}, or "
                        f"pass {say('--overwrite-field')} to replace it.")


def check_added_columns(schema, job: Job, names: Mapping[str, str] = MappingProxyType({})) -> None:
    """Refuse, before any work, an input schema with a column of the name the translation (or the status) would
    be written to, unless --overwrite-field (messages name options as check_fields' do)."""
    if schema is None or job.overwrite_field or job.output_format == "text" or job.input_format == "text":
        return
    name = STDIN_NAME if job.input == "-" else job.input
    for option, column in job.added.options:
        if column in schema.names:
            option = names.get(option, option)
            raise NllbError(f"{name}: it has a column {column!r} already, which {option} would replace: name "
                            f"another with {option}, or pass {names.get('--overwrite-field', '--overwrite-field')} "
                            "to replace it.")
