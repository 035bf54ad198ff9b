"""The shape of the code base: layers only import downwards, no import circles, small modules, one implementation
of the things issue #8 found written twice. Read from the source with `ast`, so lazy imports count too."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "bertforge"

# Lowest first. A module may import its own layer (without circles) or any layer below it, never one above.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "device", "fileio", "files", "labels", "rundir"),
    ("config", "config_families", "config_long", "config_schemas", "config_seq2seq", "tokenization",
     "tokenizer_pipelines", "tokenizer_train"),
    ("model", "checkpoint", "heads", "runtime"),
    ("data", "training"),
    ("generation", "pretrain", "tasks", "embed", "distill", "analysis", "lab"),
    ("serve",),  # calls the same encode / predict functions the CLI calls
    ("commands", "cli"),
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
MAX_LINES = 450


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """bertforge modules imported anywhere in the file (top level or inside functions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("bertforge")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bertforge"):
            found.add(node.module)
            # `from bertforge.data import corpus` imports the sub-module bertforge.data.corpus
            for a in node.names:
                if (SRC.parent / (node.module.replace(".", "/") + "/" + a.name + ".py")).is_file():
                    found.add(f"{node.module}.{a.name}")
    return found


FILES = sorted(p for p in SRC.rglob("*.py"))
MODULES = {_module_name(p): p for p in FILES}
GRAPH = {name: {m for m in _imports(p) if m != name and m in MODULES} for name, p in MODULES.items()}


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_part_has_a_layer():
    tops = {_top(m) for m in MODULES if _top(m)}
    assert tops <= set(RANK), f"give these a layer in LAYERS: {sorted(tops - set(RANK))}"


def test_no_upward_imports():
    upward = []
    for name, deps in GRAPH.items():
        if name == "bertforge":  # the package's lazy top-level re-exports
            continue
        for dep in deps:
            if dep != "bertforge" and RANK[_top(dep)] > RANK[_top(name)]:
                upward.append(f"{name} -> {dep}")
    assert not upward, "imports that run up a layer:\n" + "\n".join(sorted(upward))


def test_no_import_circles():
    graph = {n: {d for d in deps if d != "bertforge"} for n, deps in GRAPH.items() if n != "bertforge"}
    # A package's __init__ importing its own sub-modules is how packages re-export; not a circle of logic.
    for n in graph:
        graph[n] = {d for d in graph[n] if not (n != "bertforge" and d.startswith(n + ".") and MODULES[n].name == "__init__.py")}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep] if dep in stack else [node, dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_modules_stay_small(path: Path):
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(SRC)} has {n} lines; split it by concern"


def _calls(name: str) -> list[str]:
    hits = []
    for path in FILES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if called == name:
                    hits.append(str(path.relative_to(SRC)))
    return sorted(set(hits))


def _definitions(name: str) -> list[str]:
    return sorted(str(p.relative_to(SRC)) for p in FILES
                  for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                  if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name)


def test_one_self_attention():
    assert _calls("scaled_dot_product_attention") == ["model/attention.py"]


def test_one_mean_pool_and_one_json_reader():
    assert len(_definitions("mean_pool")) == 1, _definitions("mean_pool")
    assert [d for d in _definitions("_read_json") + _definitions("read_json")] == ["files.py"]
    assert _definitions("jsonl_rows") == ["files.py"]


def test_the_train_shim_is_gone():
    assert not (SRC / "train.py").exists()
    assert not [m for m, deps in GRAPH.items() if "bertforge.train" in deps]
