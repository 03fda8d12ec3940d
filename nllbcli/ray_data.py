"""Ray Data's Dataset.map_batches over the table API, for a Dataset of one's own: each Arrow batch through
nllbcli.translate_table, the model loaded once per actor (on the GPU Ray gave it, with num_gpus=1), every row
kept (a failed one with a null translation and its reason in the error column, translate_table's default).

    import ray, nllbcli.ray_data
    ds = ray.data.read_parquet("day/")
    out = ds.map_batches(nllbcli.ray_data.BatchTranslator, batch_format="pyarrow", concurrency=2, num_gpus=1,
                         fn_constructor_kwargs={"model": "/models/nllb-600M", "src": "en", "tgt": "fr"})

The class needs nothing of Ray itself: Ray Data makes one per actor and calls it with each batch. (`nllb
translate --ray` is the command's own job over files, with resume and an errors file.)
"""

from __future__ import annotations

import inspect

import pyarrow as pa

from .api import load, translate_table


class BatchTranslator:
    """A callable class for Dataset.map_batches(..., batch_format="pyarrow"): nllbcli.load(model, device, adapter,
    compute_type, threads, kv_cache_type) as the actor starts, then translate_table(translator, batch, **options)
    for each batch (src, tgt, decode, field, output_field, status_field, error_field, ...: translate_table's keyword
    arguments, checked before the model loads)."""

    def __init__(self, model: str | None = None, *, device: str = "auto", adapter: str | None = None,
                 compute_type: str = "auto", threads: int | None = None, kv_cache_type: str = "bfloat16", **options):
        try:  # a misspelt option fails before the model loads
            inspect.signature(translate_table).bind(None, None, **options)
        except TypeError as error:
            raise ValueError(f"BatchTranslator takes translate_table's keyword arguments, and {error}.") from None
        self.options = options
        self.translator = load(model, device, adapter, compute_type, threads, kv_cache_type)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return translate_table(self.translator, batch, **self.options)
