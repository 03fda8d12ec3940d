"""Spark's DataFrame.mapInArrow over the table API: each Arrow batch of a partition through
nllbcli.translate_table, the model loaded once per Python worker, every row kept (a failed one with a null
translation and its reason in the error column).

    translate = nllbcli.spark.partition_translator("/models/nllb-600M", device="cuda", src="en", tgt="fr")
    out = df.mapInArrow(translate, translate.schema(df.schema))

pyspark is imported only where it is needed: by `schema` on the driver, and on a worker to find the task's GPU.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa

from .api import check_type, load, translate_table
from .options import DecodeOptions, Job
from .model.translator import Translator

# A Python worker runs one task after another (spark.python.worker.reuse, on by default), and keeps this
# module's globals between them, so a model loaded here serves every later task. The globals of a function
# defined in the user's script cannot do this: cloudpickle ships them by value, made afresh for each task.
LOADED: dict[tuple[str | None, str, str | None], Translator] = {}


@dataclass(frozen=True)
class PartitionTranslator:
    """A function for DataFrame.mapInArrow, and the schema of what it gives."""

    model: str | None  # nllbcli.load's: a directory every executor can read, a hub id in its cache, None: $NLLB_MODEL
    device: str  # auto and cuda: the GPU Spark gave the task, if any; else as nllbcli.load takes it
    adapter: str | None
    options: dict  # translate_table's keyword arguments, error_field among them
    compute_type: str = "auto"  # nllbcli.load's
    kv_cache_type: str = "bfloat16"  # nllbcli.load's

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Each batch translated, in the order given: the model loads with the first batch, so an empty
        partition loads nothing."""
        for batch in batches:
            translator = loaded(self.model, self.device, self.adapter, self.compute_type, self.kv_cache_type)
            yield from translate_table(translator, batch, **self.options).to_batches()

    def schema(self, schema):
        """The Spark schema of the output for an input of `schema` (a StructType): the input's columns, with the
        translation, status, scores (decode.scores) and error columns of translate_table's types, each in place
        of a column of its name (overwrite_field) or else added last, as translate_table places them. An input
        with a column one of them would replace, without overwrite_field, raises NllbError here, on the driver,
        as translate_table would in every task."""
        from pyspark.sql.types import ArrayType, DoubleType, StringType, StructField, StructType

        from .api import API_NAMES
        from .job.spec import check_added_columns

        job = self.job()
        check_added_columns(schema, job, API_NAMES)
        scalar = {"string": StringType(), "double": DoubleType()}

        def spark_type(kind):  # an added column's Arrow type: a string, a double, a list or a struct of them
            if hasattr(kind, "value_type"):
                return ArrayType(scalar[str(kind.value_type)])
            if isinstance(kind, pa.StructType):  # --detected-field's {lang, confidence}
                return StructType([StructField(f.name, scalar[str(f.type)], True) for f in kind])
            return scalar[str(kind)]

        kinds = {name: spark_type(kind) for name, kind in job.added.types.items()}
        fields = list(schema.fields)
        for name, kind in kinds.items():
            names = [field.name for field in fields]
            column = StructField(name, kind, True)
            if name in names:
                fields[names.index(name)] = column
            else:
                fields.append(column)
        return StructType(fields)

    def job(self) -> Job:
        """translate_table's job for these options, its arguments' types and fields checked (api.table_job)
        without loading the model: only its tokenizer, for several target languages, whose codes name the added
        columns."""
        from .api import check_languages, check_options, table_job

        arguments = inspect.signature(translate_table).bind(None, None, **self.options)
        arguments.apply_defaults()
        options = arguments.arguments
        check_options(options["decode"], options["batching"], options["progress"])
        check_languages(options["src"], options["tgt"])
        decode, tgt, targets = options["decode"] or DecodeOptions(), options["tgt"], ()
        if tgt is not None and (not isinstance(tgt, str) or "," in tgt):  # several targets: their columns or rows
            from .api import DEFAULT_MODEL
            from .environment import ENV
            from .model.langs import resolve_targets
            from .model.translator import load_tokenizer

            targets = resolve_targets(tgt, load_tokenizer(self.model or ENV.model or DEFAULT_MODEL).lang_codes)
        keywords = [p.name for p in inspect.signature(table_job).parameters.values() if p.kind is p.KEYWORD_ONLY]
        return table_job(decode, None, targets, **{name: options[name] for name in keywords})


def partition_translator(model: str | None = None, *, device: str = "auto", adapter: str | None = None,
                         compute_type: str = "auto", kv_cache_type: str = "bfloat16", error_field: str = "error",
                         **options) -> PartitionTranslator:
    """A PartitionTranslator that runs translate_table(translator, batch, error_field=error_field, **options)
    on each batch, with nllbcli.load(model, device, adapter, compute_type, kv_cache_type=kv_cache_type) loaded once
    per Python worker. Its arguments are checked here, on the driver: a wrong type, a misspelt option or fields that
    clash raise at once."""
    for name, value in (("model", model), ("adapter", adapter)):
        check_type(name, value, (str, os.PathLike, type(None)), "a directory (a str or path) or None")
    for name, value in (("device", device), ("compute_type", compute_type), ("kv_cache_type", kv_cache_type)):
        check_type(name, value, str, "a str")
    if not error_field:
        raise ValueError("partition_translator needs an error_field: without one, a row that fails would fail "
                         "its task (or be left out of the output).")
    try:  # a misspelt option fails here, on the driver, not in every task
        inspect.signature(translate_table).bind(None, None, error_field=error_field, **options)
    except TypeError as error:
        raise ValueError(f"partition_translator takes translate_table's keyword arguments, and {error}.") from None
    translate = PartitionTranslator(model, device, adapter, {**options, "error_field": error_field}, compute_type,
                                    kv_cache_type)
    translate.job()
    return translate


def loaded(model: str | None, device: str, adapter: str | None, compute_type: str = "auto",
           kv_cache_type: str = "bfloat16") -> Translator:
    """This worker's translator for the model on the device, loaded on first use."""
    if device in ("auto", "cuda"):
        device = task_gpu() or device
    key = (model, device, adapter, compute_type, kv_cache_type)
    if key not in LOADED:
        LOADED[key] = load(model, device, adapter, compute_type, kv_cache_type=kv_cache_type)
    return LOADED[key]


def task_gpu() -> str | None:
    """cuda:N for the first GPU Spark's scheduler gave the running task (spark.task.resource.gpu.amount or a
    resource profile's), else None."""
    try:
        from pyspark import TaskContext
    except ImportError:  # not under Spark: no task, no GPU of its own
        return None
    context = TaskContext.get()
    gpu = context.resources().get("gpu") if context is not None else None
    return f"cuda:{gpu.addresses[0]}" if gpu is not None and gpu.addresses else None
