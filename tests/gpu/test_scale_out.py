"""--devices and --ray on the GPUs Ray and CUDA see: the plain command's bytes on the sample model, and each GPU
handed to its own worker or actor. Ray tests skip where Ray is not installed (pip install '.[ray]' in the checkout)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = str(ROOT / "data" / "samples" / "model")
TEXTS = ["The concert is on the twelfth of March.", "David sees twenty black hats at the market every morning.",
         "Emma's birthday is on the fourth of July. My sister bought three red cars in the garden last week.",
         "My uncle went to Rome on Friday.", "{not json"]


def nllb(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nllbcli", "translate", "-m", SAMPLE, "--src", "eng_Latn", "--tgt", "fra_Latn",
                           "--progress", "none", "--on-error", "skip", "--chunk-rows", "256", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """2,000 JSONL rows (one in 5 not JSON) and the plain command's output on the GPU."""
    work = tmp_path_factory.mktemp("scale")
    lines = [text if text.startswith("{") else json.dumps({"id": n, "text": text})
             for n, text in ((n, TEXTS[n % len(TEXTS)]) for n in range(2000))]
    (work / "in.jsonl").write_text("\n".join(lines) + "\n")
    plain = nllb("--device", "cuda", "in.jsonl", "plain.jsonl", cwd=work)
    assert plain.returncode == 3, plain.stderr
    return work, (work / "plain.jsonl").read_bytes()


def test_devices_gives_the_plain_commands_bytes(job):
    work, expected = job
    result = nllb("--devices", "all", "in.jsonl", "devices.jsonl", cwd=work)
    assert result.returncode == 3, result.stderr
    assert (work / "devices.jsonl").read_bytes() == expected


def test_ray_gives_the_plain_commands_bytes_with_an_actor_per_gpu(job):
    pytest.importorskip("ray")
    import cupy

    work, expected = job
    result = nllb("--ray", "in.jsonl", "ray", cwd=work)
    assert result.returncode == 3, result.stderr
    parts = sorted((work / "ray").glob("part-*.jsonl"))
    assert b"".join(p.read_bytes() for p in parts) == expected
    gpus = ", ".join(f"GPU {n}" for n in range(cupy.cuda.runtime.getDeviceCount()))
    assert result.stderr.splitlines()[-1] == f"Ray actors: {gpus}.", result.stderr  # after the command's summary
