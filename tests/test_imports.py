"""The package's modules import one another without a cycle, counting the imports inside functions too (a
deferred import hides a cycle from Python, not from the reader)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nllbcli"


def module_names(root: Path = PACKAGE) -> dict[str, Path]:
    """nllbcli's modules by dotted name: a package by its __init__.py."""
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports anywhere in its source: `from X import y` counts as X.y where
    that is a module, else as X."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def package_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_no_import_cycle_among_the_packages_modules():
    graph = package_graph()
    assert "nllbcli.model.engine.numerics" in graph["nllbcli.model.search"]  # the walk sees the imports it must
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_a_deferred_import_cycle_is_found(tmp_path):
    """Two modules that import each other, one of them inside a function, as search.py and engine/reference.py
    once did: the check above reports them."""
    root = tmp_path / "nllbcli"
    (root / "engine").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "engine" / "__init__.py").write_text("")
    (root / "search.py").write_text("def beam():\n    from .engine.reference import log_softmax\n")
    (root / "engine" / "reference.py").write_text("def step_topk():\n    from ..search import topk_desc\n")
    modules = module_names(root)
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert find_cycle(graph) == ["nllbcli.engine.reference", "nllbcli.search", "nllbcli.engine.reference"]


LAYERS = ("nllbcli.errors nllbcli.environment", "nllbcli.io", "nllbcli.options", "nllbcli.model", "nllbcli.job",
          "nllbcli.runners")  # bottom to top; every other module (cli, api, spark, ...) is above them all


def layer_of(module: str) -> int:
    for n, names in enumerate(LAYERS):
        if any(module == name or module.startswith(name + ".") for name in names.split()):
            return n
    return len(LAYERS)


def test_every_import_goes_down_the_layers():
    """io, the option records, the model, the job, the runners, the front ends: a module imports only its own
    layer's and those below (docs/ARCHITECTURE.md), so that a row's way goes down without coming back."""
    graph = package_graph()
    assert layer_of("nllbcli.job.loop") > layer_of("nllbcli.model.translator") > layer_of("nllbcli.io.jsonl")
    upward = sorted(f"{a} -> {b}" for a, imported in graph.items() for b in imported if layer_of(b) > layer_of(a))
    assert upward == []


def engine_methods() -> set[str]:
    """The calls of the engine interface (engine.Engine), read from its source."""
    tree = ast.parse((PACKAGE / "model" / "engine" / "__init__.py").read_text(encoding="utf-8"))
    protocol = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    return {n.name for n in protocol.body if isinstance(n, ast.FunctionDef)}


def class_methods(path: Path, name: str) -> set[str]:
    """The methods a class of `path` defines, read from its source (the GPU engine imports CuPy)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    return {n.name for n in found.body if isinstance(n, ast.FunctionDef)}


def test_both_engines_answer_every_call_of_the_engine_interface():
    calls = engine_methods()
    assert {"encode", "start", "step_argmax_ahead", "step_topk", "fetch_later", "reorder", "select"} <= calls
    assert calls <= class_methods(PACKAGE / "model" / "engine" / "reference.py", "ReferenceEngine")
    assert calls <= class_methods(PACKAGE / "model" / "engine" / "cuda.py", "CudaEngine")


def test_the_search_calls_only_the_engine_interface():
    """Every `engine.NAME` the search reads is a call of engine.Engine (or its `xp`)."""
    tree = ast.parse((PACKAGE / "model" / "search.py").read_text(encoding="utf-8"))
    used = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "engine"}
    assert used and used <= engine_methods() | {"xp"}, used - engine_methods()
