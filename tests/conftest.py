"""The CLI and pipeline tests' fixtures: the fake translator of fakes.py loaded by the command, and a working
directory. And the property tests' examples: the same on every run (derandomized), so that a run that fails (CI
lands a change on one) fails for the change, not for a new draw; HYPOTHESIS_PROFILE=explore draws new ones."""

from __future__ import annotations

import os

import pytest

from fakes import FakeTranslator

try:  # (the GPU machine's image, which runs tests/gpu alone, has no hypothesis)
    from hypothesis import settings
except ImportError:
    pass
else:
    settings.register_profile("fixed", derandomize=True)
    settings.register_profile("explore", derandomize=False)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


@pytest.fixture
def fake(monkeypatch):
    """Make the CLI load a FakeTranslator; the test gets it to inspect its calls."""
    translator = FakeTranslator()
    loaded = []

    def load_model(model, device):
        loaded.append((model, device))
        return translator

    monkeypatch.setattr("nllbcli.cli.load_model", load_model)
    monkeypatch.setattr("nllbcli.cli.load_tokenizer", lambda model: translator.tokenizer)
    translator.loaded = loaded
    return translator


@pytest.fixture
def here(tmp_path, monkeypatch):
    """The test's temporary directory, as the working directory: a job's files named as a user names them."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
