"""Every subcommand names its model the same way (-m/--model, NLLB_MODEL, a MODEL argument as a shortcut);
`nllb langs` with names, filters and JSON; and what a new user meets first: the short no-model error, a GPU
asked for without CuPy, `-V`, shell completion and the README's try-it-now block."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from nllbcli.cli import cli
from nllbcli.errors import NllbError
from nllbcli.model.langs import FLORES_200_CODES, M2M100_CODES
from nllbcli.model.translator import choose_device

HERE = Path(__file__).parent
ROOT = HERE.parent
TINY_A = HERE / "models" / "tiny-a"
TINY_M2M = HERE / "models" / "tiny-m2m"
SAMPLE_MODEL = ROOT / "data" / "samples" / "model"


@pytest.fixture
def no_cached_models(tmp_path, monkeypatch):
    """An empty Hugging Face cache and no NLLB_MODEL: a fresh machine."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("NLLB_MODEL", raising=False)


# ------------------------------------------------------------------------------------------- naming a model


def info_model(result) -> str:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["model_dir"]


@pytest.mark.parametrize("args", [["-m", str(TINY_A)], ["--model", str(TINY_A)], [str(TINY_A)],
                                  [str(TINY_A), "-m", str(TINY_A)]])
def test_info_takes_the_model_as_option_or_argument(args, no_cached_models):
    assert info_model(CliRunner().invoke(cli, ["info", "--json", *args])) == str(TINY_A)


def test_info_reads_nllb_model(no_cached_models, monkeypatch):
    monkeypatch.setenv("NLLB_MODEL", str(TINY_M2M))
    assert info_model(CliRunner().invoke(cli, ["info", "--json"])) == str(TINY_M2M)
    # the argument names the model for this call, over the environment's
    assert info_model(CliRunner().invoke(cli, ["info", "--json", str(TINY_A)])) == str(TINY_A)


@pytest.mark.parametrize("command", [["info"], ["convert", "OUT"]])
def test_two_different_models_are_refused_in_one_line(command, tmp_path):
    args = [command[0], "-m", str(TINY_M2M), str(TINY_A), *[str(tmp_path / p) for p in command[1:]]]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert result.output == f"Error: MODEL {TINY_A} and --model {TINY_M2M} name two models: give one.\n"
    assert list(tmp_path.iterdir()) == []


def test_convert_takes_the_model_from_the_option_or_nllb_model(tmp_path, no_cached_models, monkeypatch):
    result = CliRunner().invoke(cli, ["convert", "-m", str(TINY_A), str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "a" / "model.safetensors").is_file()
    monkeypatch.setenv("NLLB_MODEL", str(TINY_M2M))
    result = CliRunner().invoke(cli, ["convert", str(tmp_path / "m2m")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "m2m" / "vocab.json").read_bytes() == (TINY_M2M / "vocab.json").read_bytes()


@pytest.mark.parametrize("args,message", [
    ([], "Missing argument 'OUT'."),
    (["a", "b", "c"], "3 paths given: nllb convert takes [MODEL] OUT."),
])
def test_convert_paths_are_checked(args, message):
    result = CliRunner().invoke(cli, ["convert", *args])
    assert result.exit_code == 2
    assert result.output.endswith(f"Error: {message}\n")


def test_convert_into_a_file_is_refused(tmp_path):
    (tmp_path / "out").write_text("x")
    result = CliRunner().invoke(cli, ["convert", "-m", str(TINY_A), str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.output == f"Error: Invalid value for 'OUT': {str(tmp_path / 'out')!r} is a file.\n"


@pytest.mark.parametrize("command", [["translate", "--src", "en", "--tgt", "fr"], ["langs"], ["info"], ["convert", "OUT"]])
def test_no_model_is_one_short_line_saying_how_to_pass_one(command, no_cached_models, tmp_path):
    args = [str(tmp_path / a) if a == "OUT" else a for a in command]
    result = CliRunner().invoke(cli, args, input="Hello\n")
    assert result.exit_code == 1
    assert result.output == ("Error: no model facebook/nllb-200-distilled-600M in the Hugging Face cache: pass -m DIR "
                             "or set NLLB_MODEL, or run `hf download facebook/nllb-200-distilled-600M`\n")
    assert len(result.output) <= 161


def test_a_missing_model_directory_is_one_short_line(tmp_path):
    result = CliRunner().invoke(cli, ["info", "-m", str(tmp_path / "nowhere")])
    assert result.exit_code == 1
    assert result.output == (f"Error: model directory {tmp_path / 'nowhere'} does not exist: pass -m DIR, a directory "
                             "with config.json, the weights and sentencepiece.bpe.model\n")


# ------------------------------------------------------------------------------------------------- nllb langs


def test_langs_names_the_languages():
    result = CliRunner().invoke(cli, ["langs", "-m", str(TINY_A)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 202
    assert lines[:2] == ["ace_Arab  Acehnese (Arabic)", "ace_Latn  Acehnese (Latin)"]
    assert "eng_Latn  English" in lines and "zho_Hant  Chinese (Traditional)" in lines
    assert [line.split()[0] for line in lines] == list(FLORES_200_CODES)


def test_m2m_langs_are_named_too():
    result = CliRunner().invoke(cli, ["langs", "-m", str(TINY_M2M)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[0] for line in lines] == list(M2M100_CODES)
    assert "en   English" in lines and "ast  Asturian" in lines
    assert "ns   Northern Sotho" in lines  # fairseq's code, which is no ISO 639 code


@pytest.mark.parametrize("filters,codes", [
    (["fra"], ["fra_Latn"]),
    (["FRENCH"], ["fra_Latn"]),
    (["chinese"], ["zho_Hans", "zho_Hant"]),
    (["zh-TW"], ["zho_Hant"]),  # what the code resolves to, as --tgt zh-TW does
    (["deu", "spanish"], ["deu_Latn", "spa_Latn"]),
    (["kashmiri"], ["kas_Arab", "kas_Deva"]),
])
def test_langs_filters_by_code_or_name(filters, codes):
    result = CliRunner().invoke(cli, ["langs", "-m", str(TINY_A), *filters])
    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in result.output.splitlines()] == codes


def test_langs_without_a_match_is_one_line_exit_1():
    result = CliRunner().invoke(cli, ["langs", "-m", str(TINY_A), "klingon"])
    assert result.exit_code == 1
    assert result.output == "Error: no language of the model matches 'klingon': `nllb langs` lists them all\n"


def test_langs_json():
    result = CliRunner().invoke(cli, ["langs", "-m", str(TINY_A), "--json", "nob", "chinese"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == [
        {"code": "nob_Latn", "name": "Norwegian Bokmål"},
        {"code": "zho_Hans", "name": "Chinese (Simplified)"},
        {"code": "zho_Hant", "name": "Chinese (Traditional)"},
    ]


def test_langs_reads_nllb_model(monkeypatch):
    monkeypatch.setenv("NLLB_MODEL", str(TINY_M2M))
    result = CliRunner().invoke(cli, ["langs", "fr"])
    assert result.exit_code == 0, result.output
    assert "fr   French" in result.output.splitlines()


BLOCK_THE_NETWORK = """
import socket

def refused(*args, **kwargs):
    raise OSError("no network in this test")

socket.socket.connect = socket.socket.connect_ex = refused
socket.create_connection = socket.getaddrinfo = refused
"""


def test_every_language_has_a_name_without_the_network():
    """In a fresh process with every connection refused: the names come from the installed language_data."""
    script = BLOCK_THE_NETWORK + """
import json
from nllbcli.model.langs import FLORES_200_CODES, M2M100_CODES, language_name
print(json.dumps({code: language_name(code) for code in FLORES_200_CODES + M2M100_CODES}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    names = json.loads(done.stdout)
    assert len(names) == 302
    assert [code for code, name in names.items() if not name or "Unknown" in name or "[" in name] == []
    assert (names["eng_Latn"], names["srp_Cyrl"], names["ns"]) == ("English", "Serbian (Cyrillic)", "Northern Sotho")


def test_translate_does_not_import_the_language_names():
    """langcodes and language_data are for `nllb langs` and codes that need parsing: a job given the model's own
    codes runs without them (the GPU machines' image has no language_data)."""
    script = BLOCK_THE_NETWORK + f"""
import sys
sys.modules["langcodes"] = None
sys.modules["language_data"] = None
from nllbcli.cli import main
sys.argv = ["nllb", "translate", "-q", "--device", "cpu", "-m", {str(TINY_A)!r}, "--src", "eng_Latn",
            "--tgt", "fra_Latn", "--max-length", "4"]
main()
"""
    done = subprocess.run([sys.executable, "-c", script], input="Hello\n", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1


# ------------------------------------------------------------------------------------------- the first minutes


def test_dash_v_is_the_version():
    result = CliRunner().invoke(cli, ["-V"])
    assert result.exit_code == 0
    assert result.output == CliRunner().invoke(cli, ["--version"]).output
    assert re.fullmatch(r"nllb, version \S+\n", result.output)


def test_device_cuda_without_cupy_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ModuleNotFoundError
    with pytest.raises(NllbError, match=r"^--device cuda:1 needs CuPy, which is not installed: pip install cupy-cuda13x"):
        choose_device("cuda:1")
    assert choose_device("auto") == "cpu"
    result = CliRunner().invoke(cli, ["translate", "--device", "cuda", "-m", str(TINY_A), "--src", "en", "--tgt", "fr"],
                                input="Hello\n")
    assert result.exit_code == 1
    assert result.output == ("Error: --device cuda needs CuPy, which is not installed: pip install cupy-cuda13x "
                             "(CUDA 13 drivers) or cupy-cuda12x (CUDA 12)\n")


def test_device_cuda_with_a_broken_cupy_says_so(monkeypatch):
    class Broken:
        def find_spec(self, name, path=None, target=None):
            if name == "cupy":
                raise ImportError("libcudart.so.13: cannot open shared object file")

    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
    with pytest.raises(NllbError) as error:
        choose_device("cuda")
    assert str(error.value) == ("--device cuda needs CuPy, which is installed but does not import: "
                                "libcudart.so.13: cannot open shared object file")


@pytest.mark.parametrize("shell,marker", [("bash", "_nllb_completion()"), ("zsh", "#compdef nllb"),
                                          ("fish", "function _nllb_completion")])
def test_shell_completion_as_the_readme_says(shell, marker):
    env = {**os.environ, "_NLLB_COMPLETE": f"{shell}_source"}
    done = subprocess.run([sys.executable, "-m", "nllbcli"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert marker in done.stdout
    assert f"_NLLB_COMPLETE={shell}_source nllb" in (ROOT / "README.md").read_text(encoding="utf-8")


def try_it_now_block() -> list[str]:
    """The commands of the shell block of the README's "Try it now", after `make install`."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## Try it now\n", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    lines = block.splitlines()
    assert lines[0] == "make install"
    return lines[1:]


@pytest.mark.skipif(not (SAMPLE_MODEL / "model.safetensors").is_file(), reason="the sample model is not there")
def test_the_readme_opens_with_commands_that_work(tmp_path):
    """The try-it-now block, verbatim, in a fresh copy of the repository's sample files, with the .venv that
    `make install` makes: each command exits 0 and the translations are the sample model's."""
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "nllb").write_text(f"#!/bin/sh\nexec {sys.executable} -m nllbcli \"$@\"\n")
    (venv / "nllb").chmod(0o755)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "samples").symlink_to(ROOT / "data" / "samples")
    commands = try_it_now_block()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NLLB_")}
    done = subprocess.run(["bash", "-e", "-c", "\n".join(commands)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Ma sœur a acheté trois voitures rouges dans le jardin la semaine dernière." in done.stdout
    assert "fra_Latn  French" in done.stdout
