"""The shape of the code base: each part (top-level module or package) has its own layer and imports only downwards,
no import circles, modules of one concept, one implementation of each shared thing, and docs/architecture.md naming
only what exists. Read from the source with `ast`, so lazy imports count too."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "bertforge"

# Lowest first, one part (a top-level module or package) per layer. A module may import its own part (without
# circles) or any part below it, never one above; docs/architecture.md's layer table lists the same parts in this
# order (test_the_architecture_doc_matches_the_code).
LAYERS: list[str] = [
    "errors", "labels", "device", "io", "families", "config", "tokenization", "model", "data", "training",
    "generation", "tasks", "embed",
    "retrieval",  # sparse / dense / hybrid retrieval, the corpus index, readers over the top k, open-QA scoring
    "analysis", "distill", "pretrain", "lab",
    "serve",  # calls the same encode / predict functions the CLI calls
    "api",  # the public functions: one per verb, over everything below (serve included)
    "commands", "cli",
]
RANK = {name: i for i, name in enumerate(LAYERS)}
MAX_LINES = 600  # past it, a module says at its top why it is one module (WHY_LONG)
WHY_LONG = "One module because"


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
    assert len(set(LAYERS)) == len(LAYERS)


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
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES or any(WHY_LONG in line for line in lines[:30]), \
        f"{path.relative_to(SRC)} has {len(lines)} lines; split it by concept, or say at its top why it is one module"


def test_parts_are_few():
    tops = {p.name.removesuffix(".py") for p in SRC.iterdir()
            if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    assert len(tops) <= 21, sorted(tops)


# ---- commands/ parses and prints --------------------------------------------------------------------------------
# The command line's modules reach the library only through the public API (and the device flags, the file
# helpers and the errors below it); domain logic lives in its room, so a verb's behaviour is the API's.
COMMANDS_MAY_IMPORT = ("bertforge.api", "bertforge.device", "bertforge.io", "bertforge.errors", "bertforge.commands")


def commands_imports_outside_the_api(root: Path = SRC) -> list[str]:
    """`commands/MODULE.py:LINE: bertforge.X` for each import (top level or inside a function) of a bertforge
    module outside COMMANDS_MAY_IMPORT by a module of commands/."""
    found = []
    for path in sorted((root / "commands").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from bertforge import tasks` imports the part itself
                names = ([f"bertforge.{a.name}" for a in node.names] if node.module == "bertforge"
                         else [node.module])
            else:
                continue
            for name in names:
                if (name == "bertforge" or name.startswith("bertforge.")) and not any(
                        name == ok or name.startswith(ok + ".") for ok in COMMANDS_MAY_IMPORT):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
    return found


def test_commands_import_only_the_api_device_io_and_errors():
    found = commands_imports_outside_the_api()
    assert not found, ("commands/ parses flags and prints results: it imports bertforge.api (api/choices.py for "
                       "the names a parser offers), device, io and errors only:\n" + "\n".join(found))


def test_the_commands_check_finds_a_lazy_import(tmp_path):
    """The check above can fail: an import inside a function is found as well as one at the top."""
    (tmp_path / "commands").mkdir()
    (tmp_path / "commands" / "verb.py").write_text(
        "from bertforge.api import finetune\nfrom bertforge.io.write import atomic_write\n"
        "def run(args):\n    from bertforge.tasks.config import TASKS\n    import bertforge.model.folder\n"
        "    from bertforge import lab\n", encoding="utf-8")
    assert commands_imports_outside_the_api(tmp_path) == [
        "commands/verb.py:4: bertforge.tasks.config", "commands/verb.py:5: bertforge.model.folder",
        "commands/verb.py:6: bertforge.lab"]


# ---- docs/architecture.md against the code ------------------------------------------------------------------------
DOC = SRC.parents[1] / "docs" / "architecture.md"
DATA_FILES = (".json", ".jsonl", ".safetensors", ".txt", ".png", ".md", ".onnx")


def _defined(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                if isinstance(target, ast.Name) and target.id == "__all__" and node.value is not None:
                    # a package that imports its names on first use (a module __getattr__) lists them here
                    names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)
                              and isinstance(c.value, str)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _doc_reference_problem(ref: str) -> str | None:
    """None when `ref` (`model.attention.attend`, `tasks/kinds.py`, `io/`) names a module, package or a name one
    defines; else what is wrong."""
    parts = ref.removesuffix(".py").strip("/").replace("/", ".").split(".")
    for n in range(len(parts), 0, -1):
        module = SRC.joinpath(*parts[:n])
        file = module.with_suffix(".py") if not (module / "__init__.py").is_file() else module / "__init__.py"
        if file.is_file():
            rest = parts[n:]
            if not rest or rest[0] in _defined(file):
                return None
            return f"`{ref}`: {file.relative_to(SRC)} defines no {rest[0]!r}"
    return f"`{ref}`: no such module"


def test_the_architecture_doc_matches_the_code():
    text = DOC.read_text(encoding="utf-8")
    table = [line for line in text.splitlines() if line.startswith("| ") and "`" in line.split("|")[2]]
    documented = [line.split("|")[2].strip().strip("`") for line in table if line.split("|")[1].strip().isdigit()]
    assert documented == LAYERS, "docs/architecture.md's layer table lists other parts (or another order):\n" \
        f"doc:  {documented}\ncode: {LAYERS}"
    refs = set(re.findall(r"`((?:%s)(?:[./][A-Za-z_][A-Za-z0-9_]*)+/?)`" % "|".join(LAYERS), text))
    refs = {r for r in refs if not r.endswith(DATA_FILES)}  # config.json, metrics.jsonl: files, not modules
    problems = sorted(filter(None, map(_doc_reference_problem, refs)))
    assert not problems, "docs/architecture.md names what the code does not have:\n" + "\n".join(problems)


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
    assert [d for d in _definitions("_read_json") + _definitions("read_json")] == ["io/read.py"]
    assert _definitions("jsonl_rows") == ["io/read.py"]


# ---- a family decides its own behaviour -------------------------------------------------------------------------
# (module, literal) pairs where a family's name is another namespace's word, each said why; nothing else outside
# families/ may spell a family's name.
FAMILY_NAME_ALLOWED = {
    # the ablation lab's tables are the papers' tables (`--table bert` is Devlin et al.'s Table 5, ...), and the
    # arms they compare by name
    ("lab/tables.py", "bert"), ("lab/tables.py", "roberta"), ("lab/tables.py", "albert"), ("lab/tables.py", "electra"),
    # arms that run a paper's recipe as it is are named as that recipe (`ablate --arms electra`)
    ("pretrain/ablation.py", "electra"), ("pretrain/ablation.py", "albert"), ("pretrain/ablation.py", "xlnet"),
    ("pretrain/ablation.py", "roberta"),
    # onnxruntime's optimiser names the op pattern it fuses "bert" (the pattern `model.onnx.for_export` writes)
    ("distill/compress.py", "bert"),
}


def _family_files() -> dict[str, str]:
    """Each file of families/ -> the model_type of the family it defines (its `FAMILY`)."""
    import importlib

    return {path.stem: importlib.import_module(f"bertforge.families.{path.stem}").FAMILY.model_type
            for path in sorted((SRC / "families").glob("*.py")) if path.stem not in ("__init__", "family")}


def _family_names() -> set[str]:
    """Every family's name as a string may spell it: its model_type and its file's name ("deberta-v2",
    "deberta_v2")."""
    return {spelling for stem, model_type in _family_files().items() for spelling in (stem, model_type)}


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def family_name_literals(root: Path = SRC) -> list[str]:
    """`module:line: 'name'` for each string constant outside families/ (docstrings excluded) that is a family's
    name (its model_type or its file's), and not on the allow-list."""
    names = _family_names()
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] == "families":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
                    and id(node) not in docs and (str(rel), node.value) not in FAMILY_NAME_ALLOWED):
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    return found


def test_no_family_name_outside_families():
    from bertforge.families import FAMILIES

    files = _family_files()
    assert set(files.values()) == set(FAMILIES)  # one file per family, read off the files themselves
    assert all(stem == model_type.replace("-", "_") for stem, model_type in files.items()), files  # named for it
    found = family_name_literals()
    assert not found, ("behaviour that differs by family is a field of the family (families/), not a comparison "
                       "with its name:\n" + "\n".join(found))


def test_the_family_name_check_finds_a_comparison(tmp_path):
    """The check above can fail: a module comparing model_type with a family's name is found, a docstring is not."""
    (tmp_path / "families").mkdir()
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "head.py").write_text(
        '"""roberta"""\ndef head(cfg):\n    """bert"""\n    return 1 if cfg.model_type == "roberta" else 2\n',
        encoding="utf-8")
    assert family_name_literals(tmp_path) == ["tasks/head.py:4: 'roberta'"]
