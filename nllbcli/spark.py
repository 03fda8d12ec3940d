"""Spark's DataFrame.mapInArrow over the table API: each Arrow batch of a partition through
nllbcli.translate_table, the model loaded once per Python worker, every row kept (a failed one with a null
translation and its reason in the error column).

    translate = nllbcli.spark.partition_translator("/models/nllb-600M", device="cuda", src="en", tgt="fr")
    out = df.mapInArrow(translate, translate.schema(df.schema))

pyspark is imported only where it is needed: by `schema` on the driver, and on a worker to find the task's GPU.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa

from .api import load, translate_table
from .translator import Translator

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

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Each batch translated, in the order given: the model loads with the first batch, so an empty
        partition loads nothing."""
        for batch in batches:
            translator = loaded(self.model, self.device, self.adapter, self.compute_type)
            yield from translate_table(translator, batch, **self.options).to_batches()

    def schema(self, schema):
        """The Spark schema of the output for an input of `schema` (a StructType): the input's columns, with the
        translation, status, scores (decode.scores) and error columns of translate_table's types, each in place
        of a column of its name (overwrite_field) or else added last, as translate_table places them."""
        from pyspark.sql.types import ArrayType, DoubleType, StringType, StructField, StructType

        from .io import Added
        from .options import DecodeOptions

        decode, options = self.options.get("decode") or DecodeOptions(), self.options
        added = Added(options.get("output_field", "translation"), options.get("status_field"),
                      options.get("score_field", "score") if decode.scores else None,
                      options.get("log_prob_field", "log_prob") if decode.scores else None, decode.num_hypotheses)
        tgt = options.get("tgt")
        if tgt is not None and (not isinstance(tgt, str) or "," in tgt):  # several targets: their columns or rows
            from dataclasses import replace

            from .api import DEFAULT_MODEL
            from .environment import ENV
            from .langs import resolve_targets
            from .translator import load_tokenizer

            targets = resolve_targets(tgt, load_tokenizer(self.model or ENV.model or DEFAULT_MODEL).lang_codes)
            if len(targets) > 1:
                added = (replace(added, targets=targets) if options.get("targets_as", "columns") == "columns"
                         else replace(added, target=options.get("tgt_field", "tgt_lang")))
        scalar = {"string": StringType(), "double": DoubleType()}
        kinds = {name: ArrayType(scalar[str(kind.value_type)]) if hasattr(kind, "value_type") else scalar[str(kind)]
                 for name, kind in added.types.items()}
        kinds[options["error_field"]] = StringType()
        fields = list(schema.fields)
        for name, kind in kinds.items():
            names = [field.name for field in fields]
            column = StructField(name, kind, True)
            if name in names:
                fields[names.index(name)] = column
            else:
                fields.append(column)
        return StructType(fields)


def partition_translator(model: str | None = None, *, device: str = "auto", adapter: str | None = None,
                         compute_type: str = "auto", error_field: str = "error", **options) -> PartitionTranslator:
    """A PartitionTranslator that runs translate_table(translator, batch, error_field=error_field, **options)
    on each batch, with nllbcli.load(model, device, adapter, compute_type) loaded once per Python worker."""
    if not error_field:
        raise ValueError("partition_translator needs an error_field: without one, a row that fails would be "
                         "left out of the output.")
    try:  # a misspelt option fails here, on the driver, not in every task
        inspect.signature(translate_table).bind(None, None, error_field=error_field, **options)
    except TypeError as error:
        raise ValueError(f"partition_translator takes translate_table's keyword arguments, and {error}.") from None
    return PartitionTranslator(model, device, adapter, {**options, "error_field": error_field}, compute_type)


def loaded(model: str | None, device: str, adapter: str | None, compute_type: str = "auto") -> Translator:
    """This worker's translator for the model on the device, loaded on first use."""
    if device in ("auto", "cuda"):
        device = task_gpu() or device
    key = (model, device, adapter, compute_type)
    if key not in LOADED:
        LOADED[key] = load(model, device, adapter, compute_type)
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
