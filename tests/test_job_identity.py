"""A job's identity holds the model as it computes: its files, the adapter's, the compute type. A job finished or
stopped with one model is never taken up with another (another adapter, weights written anew in the same
directory, another compute type), on one device, with --devices or with --ray (test_raydata.py).

The tiny test model on the CPU, in process (--devices in a subprocess).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from jobfiles import stopped_after_commits

from nllbcli.model import checkpoint
from nllbcli.model.checkpoint import model_identity, read_safetensors_header
from nllbcli.cli import cli
from nllbcli.options import BatchOptions, DecodeOptions, Job
from nllbcli.job.spec import job_identity
from nllbcli.model.translator import load_translator

MODELS = Path(__file__).resolve().parent / "models"
TINY, LORA = str(MODELS / "tiny-a"), str(MODELS / "tiny-a-lora")
ROWS = [f"The green bicycle number {n} costs forty-five euros." for n in range(30)]
ARGS = ["translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn", "--device", "cpu", "--beam-size", "1",
        "--max-length", "8", "--chunk-rows", "10", "in.txt", "out.txt"]


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("in.txt").write_text("".join(row + "\n" for row in ROWS))
    return tmp_path


def translate(model: str, *extra: str):
    return CliRunner().invoke(cli, [*ARGS[:1], "-m", model, *ARGS[1:], *extra])


def straight(model: str, *extra: str) -> bytes:
    """The output of a job run straight through (into another file)."""
    result = CliRunner().invoke(cli, [*ARGS[:1], "-m", model, *ARGS[1:-1], "straight.txt", *extra])
    assert result.exit_code == 0, result.output
    output = Path("straight.txt").read_bytes()
    for name in ("straight.txt", ".straight.txt.nllb-state.json"):
        os.unlink(name)
    return output


def stopped(model: str, *extra: str) -> None:
    """A job stopped after its first commit, its state saved."""
    with stopped_after_commits(1):
        assert translate(model, *extra).exit_code == 130
    assert json.loads(Path(".out.txt.nllb-state.json").read_text())["position"]["rows"] == 10


def rewrite_weights(model: Path) -> None:
    """Write the model's weights anew, one matrix negated: the same names, shapes and size."""
    path = model / "model.safetensors"
    header, start = read_safetensors_header(path)
    first, end = (start + offset for offset in header["model.decoder.layers.0.fc1.weight"]["data_offsets"])
    data = bytearray(path.read_bytes())
    data[first:end] = (-np.frombuffer(data[first:end], np.float32)).tobytes()
    path.write_bytes(data)


def copy_of_tiny(tmp_path: Path) -> Path:
    model = tmp_path.resolve() / "model"
    shutil.copytree(TINY, model)
    return model


def test_a_finished_job_resumed_with_an_adapter_is_translated_again(here):
    plain, adapted = straight(TINY), straight(TINY, "--adapter", LORA)
    assert plain != adapted
    assert translate(TINY).exit_code == 0
    result = translate(TINY, "--adapter", LORA, "--resume")
    assert result.exit_code == 0, result.output
    assert result.stderr == "Starting afresh: out.txt was finished by a job that differs in adapter.\n"
    assert Path("out.txt").read_bytes() == adapted


@pytest.mark.parametrize("first, then, said", [
    ((), ("--adapter", LORA), f"adapter (was none, now {LORA})"),
    (("--adapter", LORA), (), f"adapter (was {LORA}, now none)"),
])
def test_a_stopped_job_resumed_with_another_adapter_is_refused(here, first, then, said):
    expected = straight(TINY, *first)
    stopped(TINY, *first)
    partial = Path(".out.txt.nllb-partial").read_bytes()
    result = translate(TINY, *then, "--resume")
    assert result.exit_code == 1
    assert result.stderr == f"Error: cannot resume: the interrupted job differs in {said}; run without --resume to start over.\n"
    assert Path(".out.txt.nllb-partial").read_bytes() == partial
    assert translate(TINY, *first, "--resume").exit_code == 0
    assert Path("out.txt").read_bytes() == expected


def test_an_adapter_written_anew_is_another_model(here, tmp_path):
    adapter = tmp_path.resolve() / "lora"
    shutil.copytree(LORA, adapter)
    stopped(TINY, "--adapter", str(adapter))
    settings = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**settings, "lora_alpha": 4}))
    result = translate(TINY, "--adapter", str(adapter), "--resume")
    assert result.exit_code == 1
    assert result.stderr == (f"Error: cannot resume: the interrupted job differs in adapter (adapter_config.json in "
                             f"{adapter} changed); run without --resume to start over.\n")


def test_weights_written_anew_in_the_model_directory_are_another_model(here, tmp_path):
    model = copy_of_tiny(tmp_path)
    assert translate(str(model)).exit_code == 0
    rewrite_weights(model)
    expected = straight(str(model))
    assert expected != Path("out.txt").read_bytes()
    result = translate(str(model), "--resume")
    assert result.exit_code == 0
    assert Path("out.txt").read_bytes() == expected  # translated again, not "Already finished"
    stopped(str(model))
    rewrite_weights(model)
    result = translate(str(model), "--resume")
    assert result.exit_code == 1
    assert result.stderr == (f"Error: cannot resume: the interrupted job differs in model (model.safetensors in {model} "
                             "changed); run without --resume to start over.\n")


def test_a_state_from_before_the_models_files_were_recorded_is_never_taken_up(here):
    """A state that names the model's directory alone cannot tell which weights wrote its rows: a stopped job is
    refused, a finished one translated again."""
    def as_an_earlier_nllb_wrote_it() -> None:
        state = json.loads(Path(".out.txt.nllb-state.json").read_text())
        del state["job"]["adapter"], state["job"]["compute_type"]
        state["job"]["model"] = TINY
        Path(".out.txt.nllb-state.json").write_text(json.dumps(state))

    stopped(TINY)
    as_an_earlier_nllb_wrote_it()
    result = translate(TINY, "--resume")
    assert result.exit_code == 1
    assert result.stderr == ("Error: cannot resume: the interrupted job differs in compute_type (was None, now "
                             "'bfloat16'), model (an earlier nllb recorded its directory alone, not its files); run "
                             "without --resume to start over.\n")
    assert translate(TINY).exit_code == 0
    as_an_earlier_nllb_wrote_it()
    result = translate(TINY, "--resume")
    assert result.exit_code == 0
    assert result.stderr == "Starting afresh: out.txt was finished by a job that differs in compute_type, model.\n"


def test_devices_refuse_to_resume_with_another_adapter(here):
    stopped(TINY)
    command = [sys.executable, "-m", "nllbcli", *ARGS[:1], "-m", TINY, *[a for a in ARGS[1:] if a not in ("--device", "cpu")],
               "--devices", "cpu:2", "--adapter", LORA, "--resume"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr == (f"Error: cannot resume: the interrupted job differs in adapter (was none, now {LORA}); "
                             "run without --resume to start over.\n")


def test_the_identity_holds_each_file_the_model_is_loaded_from():
    def files(model: str) -> list[str]:
        return sorted(model_identity(MODELS / model)["model"]["files"])

    tokenizer = ["generation_config.json", "sentencepiece.bpe.model", "config.json"]
    assert files("tiny-a") == sorted([*tokenizer, "model.safetensors", "tokenizer.json", "tokenizer_config.json"])
    assert files("tiny-b") == sorted([*tokenizer, "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                      "model.safetensors.index.json"])
    assert files("tiny-bin-sharded") == sorted([*tokenizer, "pytorch_model-00001-of-00002.bin",
                                                "pytorch_model-00002-of-00002.bin", "pytorch_model.bin.index.json",
                                                "tokenizer_config.json"])
    assert files("tiny-m2m") == sorted([*tokenizer, "pytorch_model.bin", "tokenizer_config.json", "vocab.json"])
    adapter = model_identity(TINY, LORA)["adapter"]
    assert adapter["path"] == LORA and sorted(adapter["files"]) == ["adapter_config.json", "adapter_model.safetensors"]


def test_the_compute_type_is_part_of_the_identity():
    """The CPU computes in float32 whatever the type, so float8 is a GPU's: the command's identity and Ray's
    differ with it, and agree on it."""
    job = Job(src="eng_Latn", tgt="fra_Latn", input="in.txt", output="out.txt", input_format="text", output_format="text")
    translator = load_translator(TINY, "cpu", LORA)
    bf16 = job_identity(translator, job, DecodeOptions(), BatchOptions())
    translator.compute_type = "float8"
    fp8 = job_identity(translator, job, DecodeOptions(), BatchOptions())
    assert (bf16["compute_type"], fp8["compute_type"]) == ("bfloat16", "float8")
    assert {k: v for k, v in fp8.items() if k != "compute_type"} == {k: v for k, v in bf16.items() if k != "compute_type"}
    assert model_identity(TINY, LORA, "float8") == {key: fp8[key] for key in ("model", "adapter", "compute_type")}


def test_large_files_are_known_by_size_and_time_small_ones_by_content(tmp_path, monkeypatch):
    model = copy_of_tiny(tmp_path)
    config = model / "config.json"
    before = model_identity(model)
    os.utime(config, ns=(1, 1))  # the same bytes written again
    assert model_identity(model) == before
    config.write_text(config.read_text().replace('"relu"', '"gelu"'))
    assert model_identity(model)["model"]["files"]["config.json"] != before["model"]["files"]["config.json"]
    monkeypatch.setattr(checkpoint, "HASHED_BYTES", 0)
    weights = model / "model.safetensors"
    before = model_identity(model)["model"]["files"]["model.safetensors"]
    assert set(before) == {"size", "mtime_ns"}
    os.utime(weights, ns=(1, 1))
    assert model_identity(model)["model"]["files"]["model.safetensors"] == {"size": before["size"], "mtime_ns": 1}
