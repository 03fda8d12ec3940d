"""The NLLB_* variables are read in one module, environment.py, and documented in docs/ENVIRONMENT.md; and
docs/ARCHITECTURE.md names every module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from nllbcli.environment import Environment, read

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nllbcli"


def environment_reads(path: Path) -> list[str]:
    """Where a module reads os.environ or os.getenv: "file:line"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                isinstance(node.value, ast.Name) and node.value.id == "os":
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_environment_py_reads_nllb_variables():
    reads = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "environment.py":
            continue
        text = path.read_text()
        for where in environment_reads(path):
            line = text.splitlines()[int(where.rsplit(":", 1)[1]) - 1]
            if "NLLB_" in line:
                reads[where] = line.strip()
    assert reads == {}


def test_every_variable_the_package_names_is_documented():
    named = set()
    for path in PACKAGE.rglob("*.py"):
        named |= set(re.findall(r'"(NLLB_[A-Z_]+)"', path.read_text()))
    documented = set(re.findall(r"`(NLLB_[A-Z_]+)`", (ROOT / "docs" / "ENVIRONMENT.md").read_text()))
    assert named and named <= documented, named - documented


def test_each_variable_is_read_as_the_switch_it_is():
    assert read({}) == Environment()
    got = read({"NLLB_MODEL": "m", "NLLB_THREADS": "3", "NLLB_CUDA_GRAPHS": "0", "NLLB_PDL": "0",
                "NLLB_STEP_HALVES": "1", "NLLB_GEMM_SMS": "116", "NLLB_TMA_STORE": "no", "NLLB_NO_WGMMA": "1",
                "NLLB_EXACT_MATH": "1", "NLLB_AHEAD": "0", "NLLB_FINISHER": "0", "NLLB_SWITCH_INTERVAL": "0.01",
                "NLLB_GC": "python"})
    assert got == Environment("m", 3, False, False, 1, 116, False, True, True, 0, False, 0.01, True)
    assert read({"NLLB_STEP_HALVES": "2"}).step_halves == 2  # the halves staggered
    assert read({"NLLB_AHEAD": "many", "NLLB_NO_WGMMA": "yes", "NLLB_MODEL": "", "NLLB_THREADS": "0",
                 "NLLB_STEP_HALVES": "on", "NLLB_GEMM_SMS": "0"}) == Environment()  # only "1" is on (halves: "1", "2"); threads, SMs >= 1


def test_the_architecture_doc_names_every_module():
    """docs/ARCHITECTURE.md gives each module its line: a module added without one fails here."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    modules = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts}
    missing = sorted(m for m in modules if m.rsplit("/", 1)[-1] not in text)
    assert missing == []
