"""Every field of the option records is declared output-shaping (in the job's identity, which --resume and
"Already finished" compare) or output-neutral, once, beside its record; the identity is derived from that
declaration for the command, --devices and --ray alike.

Generated from the records: each field changed alone changes the identity exactly when it shapes the output;
a few of them end to end through the command (the tiny test model on the CPU), where a resumed job with one
shaping option changed is refused in one line (stopped) or started afresh (finished), never continued.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from jobfiles import stopped_after_commits

from nllbcli.cli import RecordOption, cli, translate
from nllbcli.job.spec import identity_of, job_identity, shaping_values
from nllbcli.model.translator import load_translator
from nllbcli.options import OPTION_RECORDS, BatchOptions, DecodeOptions, Job, ModelOptions, loaded_model, shaping_fields

MODELS = Path(__file__).resolve().parent / "models"
TINY, LORA = str(MODELS / "tiny-a"), str(MODELS / "tiny-a-lora")
RECORDS = {"job": Job, "decode": DecodeOptions, "batching": BatchOptions, "model": ModelOptions}  # with_records' names


def test_every_field_of_every_option_record_is_declared_once():
    for record in OPTION_RECORDS:
        names = {f.name for f in dataclasses.fields(record)}
        assert set(shaping_fields(record)) | record.OUTPUT_NEUTRAL == names, record
        assert not set(shaping_fields(record)) & record.OUTPUT_NEUTRAL, record


@pytest.mark.parametrize("record", OPTION_RECORDS, ids=lambda record: record.__name__)
def test_a_field_added_without_being_declared_is_refused(record):
    """A new option that is neither output-shaping nor output-neutral fails here, and in every job."""
    added = dataclasses.make_dataclass(f"New{record.__name__}", [("new_option", "int", dataclasses.field(default=0))],
                                       bases=(record,), frozen=True)
    with pytest.raises(TypeError, match=rf"^New{record.__name__}: each field is declared once, in SHAPING or "
                                        r"OUTPUT_NEUTRAL; not so: new_option\.$"):
        shaping_fields(added)
    required = {f.name: None for f in dataclasses.fields(record) if f.default is dataclasses.MISSING}
    with pytest.raises(TypeError, match="not so: new_option"):  # what every job's identity is made with
        shaping_values(added(**required))
    both = type(f"Both{record.__name__}", (record,), {"OUTPUT_NEUTRAL": record.OUTPUT_NEUTRAL | record.SHAPING})
    with pytest.raises(TypeError, match="not so: "):
        shaping_fields(both)


def test_the_model_part_of_the_identity_is_each_field_of_the_model_record():
    """ModelOptions' fields go into the identity by the model's and the adapter's files (model_identity), not by
    the generic rule: the same keys (the K/V cache type where it is not the default: an identity without one means
    bfloat16, tests/test_kv8.py)."""
    identity = identity_of(Job(None, None), DecodeOptions(), BatchOptions(),
                           ModelOptions(TINY, LORA, "bfloat16", "cpu", "float8"))
    assert set(shaping_fields(ModelOptions)) <= set(identity)
    assert identity["adapter"]["path"] == LORA and identity["device"] == "cpu"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[str, str]:
    directory = tmp_path_factory.mktemp("inputs")
    for name, text in (("a.jsonl", '{"text": "Hello."}\n'), ("b.jsonl", '{"text": "Hello there."}\n')):
        (directory / name).write_text(text)
    return str(directory / "a.jsonl"), str(directory / "b.jsonl")


# values a field's type does not give: another model or adapter, a choice of a fixed list
OTHER = {"model": str(MODELS / "tiny-b"), "adapter": LORA, "compute_type": "float8", "kv_cache_type": "float8",
         "on_error": "skip",
         "targets_as": "rows", "targets": ("fra_Latn", "deu_Latn"), "text_layout": "nbest", "flags": ("repetition",),
         "on_flag": "fail", "task": "score"}


def another(record, name: str, inputs: tuple[str, str]):
    """Another valid value for a field: another input file, OTHER's, else one its annotated type gives."""
    value, kind = getattr(record, name), {f.name: f.type for f in dataclasses.fields(record)}[name]
    if name == "input":
        return inputs[1]
    if name in OTHER:
        return OTHER[name]
    if kind.startswith("bool"):
        return not value
    if kind.startswith("int"):
        return 7 if value is None else value + 1
    if kind.startswith("float"):
        return 0.5 if value is None else value / 2
    return "other" if value is None else value + "_other"


def bases(inputs) -> dict[type, list]:
    """Each record as a job has it, and where a field takes a value only with another, a second one (sampling;
    --on-error record with its --errors file) for that field."""
    job = Job("eng_Latn", "fra_Latn", input=inputs[0], output="out.jsonl", input_format="jsonl", output_format="jsonl")
    decode = DecodeOptions(beam_size=2, max_length=8)
    return {Job: [job, dataclasses.replace(job, on_error="record", errors="errors.jsonl"),
                  dataclasses.replace(job, target_field="translation")],  # a score job's field, for task
            DecodeOptions: [decode, DecodeOptions(beam_size=1, sampling_topk=0, max_length=8)],
            BatchOptions: [BatchOptions()], ModelOptions: [ModelOptions(TINY, None, "bfloat16", "cpu")]}


def identity(records: dict) -> dict:
    return identity_of(records[Job], records[DecodeOptions], records[BatchOptions], records[ModelOptions])


def changed_alone(record_type, name: str, inputs) -> tuple[dict, dict]:
    """The records of a job, and the same with the one field changed (on the first base that takes the value)."""
    for base in bases(inputs)[record_type]:
        try:
            changed = dataclasses.replace(base, **{name: another(base, name, inputs)})
        except ValueError:
            continue
        records = {kind: found[0] for kind, found in bases(inputs).items()}
        return {**records, record_type: base}, {**records, record_type: changed}
    raise AssertionError(f"no valid other value for {record_type.__name__}.{name}")


FIELDS = [(record, f.name) for record in OPTION_RECORDS for f in dataclasses.fields(record)]


@pytest.mark.parametrize("record, name", FIELDS, ids=[f"{record.__name__}.{name}" for record, name in FIELDS])
def test_a_field_changes_the_identity_exactly_when_it_shapes_the_output(inputs, record, name):
    before, after = changed_alone(record, name, inputs)
    if name in shaping_fields(record):
        assert identity(after) != identity(before)
    else:
        assert identity(after) == identity(before)


def test_the_command_and_ray_have_one_identity(inputs):
    """--ray's identity is the command's, its inputs (several files) under "input"; the batching as given, the
    device's defaults picked once the cluster is joined."""
    ray = pytest.importorskip("nllbcli.runners.ray")
    job = bases(inputs)[Job][0]
    model = ModelOptions(TINY, None, "bfloat16", "cpu")
    command = identity_of(job, DecodeOptions(), BatchOptions(), model)
    on_ray = ray.ray_identity(list(inputs), job, DecodeOptions(), {"read_chunk_rows": None}, model)
    assert set(on_ray) == set(command)
    assert {k: v for k, v in on_ray.items() if k not in ("input", "read_chunk_rows")} == \
           {k: v for k, v in command.items() if k not in ("input", "read_chunk_rows")}
    assert [entry["name"] for entry in on_ray["input"]] == list(inputs)


def test_the_command_names_its_model_as_loaded():
    translator = load_translator(TINY, "cpu", LORA)
    job = Job("eng_Latn", "fra_Latn", input_format="text", output_format="text")
    assert loaded_model(translator) == ModelOptions(TINY, LORA, "bfloat16", "cpu")
    assert job_identity(translator, job, DecodeOptions(), BatchOptions()) == \
           identity_of(job, DecodeOptions(), BatchOptions(), ModelOptions(TINY, LORA, "bfloat16", "cpu"))
    assert json.loads(json.dumps(shaping_values(Job("eng_Latn", None, targets=("fra_Latn",)))))["targets"] == ["fra_Latn"]


def test_each_option_that_fills_a_record_names_one_of_its_fields():
    filled = {(option.record, option.field) for option in translate.params if isinstance(option, RecordOption)}
    for record, name in filled:
        assert name in {f.name for f in dataclasses.fields(RECORDS[record])}, (record, name)
    assert {name for record, name in filled if record == "model"} == {f.name for f in dataclasses.fields(ModelOptions)}


# End to end: a representative option of each record, changed alone on a resume.
ROWS = [f"The green bicycle number {n} costs forty-five euros. It is blue." for n in range(30)]
ARGS = ["translate", "-q", "-m", TINY, "--src", "eng_Latn", "--tgt", "fra_Latn", "--device", "cpu", "--beam-size", "1",
        "--max-length", "8", "--chunk-rows", "10"]
SHAPING = [("decode", "max_length", ["--max-length", "9"]), ("batching", "read_chunk_rows", ["--chunk-rows", "7"]),
           ("job", "split", ["--no-split"]), ("job", "output_field", ["--output-field", "t"]),
           ("model", "adapter", ["--adapter", LORA]), ("model", "kv_cache_type", ["--kv-cache-type", "float8"])]
# shaping options a job's identity names only off their default: taken back to it, a job is another one too
OFF_DEFAULT = [("model", "kv_cache_type", ["--kv-cache-type", "float8"], "'float8'", "'bfloat16'")]
NEUTRAL = [("batching", "max_batch_tokens", ["--max-batch-tokens", "50"]), ("job", "on_error", ["--on-error", "skip"])]


def option_fills(record: str, name: str, option: str) -> bool:
    return any(isinstance(p, RecordOption) and option in p.opts and (p.record, p.field) == (record, name)
               for p in translate.params)


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("in.jsonl").write_text("".join(json.dumps({"text": row}) + "\n" for row in ROWS))
    return tmp_path


def run(*extra: str):
    return CliRunner().invoke(cli, [*ARGS, *extra, "in.jsonl", "out.jsonl"])


@pytest.mark.parametrize("record, name, changed", SHAPING, ids=[name for _, name, _ in SHAPING])
def test_a_job_resumed_with_a_shaping_option_changed_is_refused_or_started_afresh(here, record, name, changed):
    assert option_fills(record, name, changed[0]) and name in shaping_fields(RECORDS[record])
    key = "decode" if record == "decode" else name
    with stopped_after_commits(1):
        assert run().exit_code == 130
    partial = Path(".out.jsonl.nllb-partial").read_bytes()
    refused = run(*changed, "--resume")
    assert refused.exit_code == 1
    assert refused.stderr.startswith(f"Error: cannot resume: the interrupted job differs in {key} (")
    assert refused.stderr.count("\n") == 1 and Path(".out.jsonl.nllb-partial").read_bytes() == partial
    assert run().exit_code == 0
    afresh = run(*changed, "--resume")
    assert afresh.exit_code == 0
    assert afresh.stderr == f"Starting afresh: out.jsonl was finished by a job that differs in {key}.\n"


@pytest.mark.parametrize("record, name, given, was, now", OFF_DEFAULT, ids=[row[1] for row in OFF_DEFAULT])
def test_a_job_resumed_with_a_shaping_option_back_at_its_default_is_refused(here, record, name, given, was, now):
    assert option_fills(record, name, given[0])
    with stopped_after_commits(1):
        assert run(*given).exit_code == 130
    partial = Path(".out.jsonl.nllb-partial").read_bytes()
    refused = run("--resume")
    assert refused.exit_code == 1
    assert refused.stderr == (f"Error: cannot resume: the interrupted job differs in {name} (was {was}, now {now}); "
                              f"run without --resume to start over.\n")
    assert Path(".out.jsonl.nllb-partial").read_bytes() == partial
    assert run(*given, "--resume").exit_code == 0


@pytest.mark.parametrize("record, name, changed", NEUTRAL, ids=[name for _, name, _ in NEUTRAL])
def test_a_job_resumed_with_a_neutral_option_changed_is_the_same_job(here, record, name, changed):
    assert option_fills(record, name, changed[0]) and name not in shaping_fields(RECORDS[record])
    assert run().exit_code == 0
    again = CliRunner().invoke(cli, [*[a for a in ARGS if a != "-q"], *changed, "--resume", "in.jsonl", "out.jsonl"])
    assert again.exit_code == 0 and again.stderr.startswith("Already finished: out.jsonl holds this job's 30 rows")


def test_a_long_job_resumed_with_an_adapter_is_translated_again(tmp_path, monkeypatch):
    """More rows than a chunk: a finished job taken up with --adapter is never "Already finished"."""
    monkeypatch.chdir(tmp_path)
    Path("in.txt").write_text("".join(f"The green bicycle number {n} costs forty-five euros.\n" for n in range(3000)))
    args = ["translate", "-m", TINY, "--src", "eng_Latn", "--tgt", "fra_Latn", "--device", "cpu", "--beam-size", "1",
            "--max-length", "8", "--progress", "none", "in.txt", "out.txt"]
    assert CliRunner().invoke(cli, args).exit_code == 0
    plain = Path("out.txt").read_bytes()
    result = CliRunner().invoke(cli, [*args, "--adapter", LORA, "--resume"])
    assert result.exit_code == 0
    assert result.stderr.startswith("Starting afresh: out.txt was finished by a job that differs in adapter.\n")
    assert "Already finished" not in result.stderr and Path("out.txt").read_bytes() != plain
