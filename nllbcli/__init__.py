"""nllbcli: translate text, JSONL and Parquet with NLLB-200 and M2M-100 models, from the shell (`nllb`) or from
Python: `nllbcli.load`, `nllbcli.translate`, `nllbcli.translate_iterable`, `nllbcli.translate_table`,
`nllbcli.score` and `nllbcli.score_table` (nllbcli/api.py)."""

API = ("Result", "load", "score", "score_table", "translate", "translate_iterable", "translate_table")
OPTIONS = ("BatchOptions", "DecodeOptions", "ModelOptions")
__all__ = [*API, *OPTIONS]


def __getattr__(name: str):
    """The library's names, imported when first asked for: the command's start-up does not pay for them."""
    if name in API:
        from . import api

        return getattr(api, name)
    if name in OPTIONS:
        from . import options

        return getattr(options, name)
    raise AttributeError(f"module 'nllbcli' has no attribute {name!r}")
