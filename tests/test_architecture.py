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
    "generation", "tasks", "embedding",
    "retrieval",  # sparse / dense / hybrid retrieval, the corpus index, readers over the top k, open-QA scoring
    "analysis", "distillation", "pretraining", "lab",
    "server",  # calls the same encode / predict functions the CLI calls
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



def test_no_name_is_both_a_package_and_a_verb():
    """A verb's name is its public function only: `bertforge.embed` is never also a package (which editors and type
    checkers cannot tell from the function), and users' `from bertforge import embed` gets the function."""
    import inspect

    import bertforge

    tops = {p.name.removesuffix(".py") for p in SRC.iterdir() if p.suffix == ".py" or p.is_dir()}
    assert not tops & set(bertforge.__all__), sorted(tops & set(bertforge.__all__))
    from bertforge import distill, embed, pretrain, serve

    assert all(inspect.isfunction(f) for f in (distill, embed, pretrain, serve))

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
# A family's name may appear outside families/ only where the allow-list below says why: in an identifier
# (`roberta_head`), inside a string (`"albert.pooler.weight"`, help text "use albert or electra") or as a string
# of its own. Each source file is read with `tokenize`: NAME and STRING tokens count (comments and docstrings do
# not), matched case-insensitively as a word (camelCase and snake_case split, so `RobertaClassificationHead`
# and `t5_lengths` are found while `bertforge` is not). Exempt by rule: bertforge's canonical encoder name
# (`families.family.CANONICAL_ENCODER`), as the attribute `.bert` and as the first part of a canonical tensor name
# (`"bert.encoder.layer."`): that is bertforge's own layout, which every family's rules translate from.

# Why a mention stays: one reason per kind, each entry naming its own.
PAPER = "product text naming the paper a recipe, objective, layout or option comes from, for the user to read"
LAB = "the ablation lab re-runs the papers' tables: its tables and arms are named as the papers name them"
MECHANISM = "a mechanism named for the paper that introduced it (its module, class or function), not a family switch"
FOREIGN = "a class of another library, named by that library"
ONNX = "onnxruntime's optimiser names the op pattern it fuses 'bert' (the pattern model.onnx.for_export writes)"
CONSTANT = "imports a constant its family file declares (the family owns the value; this module only reads it)"
METHOD = "DPR the retrieval method and its data formats (Karpukhin et al. 2020), not the family's checkpoints"
TODO_HELP = "hand-written list of recipes in help text; to be derived from the recipes' records"
SIZE = "a size's name as the user types it (`--size bert-mini`): the sizes are families.SIZES_FAMILY's presets"

# "path: token" (the token's text, first 60 characters, whitespace collapsed) -> why it may name a family.
FAMILY_NAME_ALLOWED: dict[str, str] = {
    'commands/pretrain.py: "bert, roberta, albert, electra, spanbert, deberta-v3, realm': PAPER,
    'lab/realm_table.py: bart': PAPER,
    'lab/tables.py: "NQ EM 39.2 (REALM, Wikipedia) / 40.4 (CC-News) vs 34.5 (T5-': PAPER,
    'lab/tables.py: "NQ EM 44.1 (RAG-Token) / 44.5 (RAG-Seq) vs 26.5 (BART-large': PAPER,
    'lab/tables.py: "T5-11B closed book"': PAPER,
    'lab/tables.py: "BART-large closed book"': PAPER,
    'api/ablation.py: "bert-mini"': SIZE,
    'commands/finetune.py: "seq2seq (a T5 or BART model; source -> target text)"': PAPER,
    'commands/finetune.py: "Fine-tune a pretrained model (a folder or a Hugging Face Hu': PAPER,
    'commands/finetune.py: "directory that BertFor<Task>.from_pretrained(OUT) loads), t': PAPER,
    'commands/finetune.py: "a T5 model: 1e-4)"': PAPER,
    '__init__.py: "export_dpr"': METHOD,
    'api/__init__.py: "export_dpr"': METHOD,
    'api/__init__.py: export_dpr': METHOD,
    'api/generative_qa.py: "generator: give the generator (a BART or T5 folder, a RAG f': PAPER,
    'api/models.py: f", BigBird block-sparse attention (blocks of {cfg.block_siz': PAPER,
    'api/models.py: f", Longformer attention (window {\'/\'.join(map(str, windows)': PAPER,
    'api/pretraining.py: "bert-mini"': SIZE,
    'api/pretraining.py: "bert-tiny"': SIZE,
    'api/retrieval.py: dpr': METHOD,
    'api/retrieval.py: export_dpr': METHOD,
    'cli.py: "The BERT family end to end."': PAPER,
    'commands/distill.py: "DistilBERT: soft MLM targets + MLM + hidden-state cosine on': PAPER,
    'commands/distill.py: "Knowledge distillation: `general` (DistilBERT\'s triple loss': PAPER,
    'commands/distill.py: "a masked LM (BertForMaskedLM / ForPreTraining)"': PAPER,
    'commands/distill.py: "where the soft loss is taken: every real token (DistilBERT)': PAPER,
    'commands/embed.py: "cross-encoder (BertForSequenceClassification with 1 label, ': PAPER,
    'commands/finetune.py: "seq2seq (source -> target text with a T5/BART model: jsonl/': PAPER,
    'commands/generate.py: "a decoder reads <bos> (GPT-2: <|endoftext|>) before a non-e': PAPER,
    'commands/generate.py: "continue a prompt with a decoder (GPT-2 layout) or an encod': PAPER,
    'commands/generate.py: "decoder (model_type gpt2) or encoder-decoder (t5, bart) che': PAPER,
    'commands/generate.py: "encoder-decoder (T5, BART: the prompt is the encoder\'s inpu': PAPER,
    'commands/generate.py: "transformers GPT-2 directory), or generate the output for a': PAPER,
    'commands/generative_qa.py: "rag / fid: the generator, a BART or T5 folder (instead of "': PAPER,
    'commands/generative_qa.py: f"--task {args.task} needs --generator DIR (a BART or T5 fol': PAPER,
    'commands/longify.py: "Write a Longformer checkpoint for sequences of up to --max-': PAPER,
    'commands/longify.py: "a bert or roberta checkpoint (with or without "': PAPER,
    'commands/longify.py: "make a long (Longformer) model from a bert / roberta checkp': PAPER,
    'commands/longify.py: "output directory (LongformerForMaskedLM layout)"': PAPER,
    'commands/longify.py: f"next: bertforge pretrain --init-from {d[\'out\']} --seq-len ': PAPER,
    'commands/open_qa.py: "(question<TAB>pattern), DPR\'s csv (question<TAB>[answers]) ': METHOD,
    'commands/open_qa.py: "dpr-csv"': METHOD,
    'commands/pretrain.py: "--table bert|roberta|albert|electra|spanbert|deberta-v3|all': PAPER,
    'commands/pretrain.py: "BERT, RoBERTa, ALBERT, ELECTRA, SpanBERT or DeBERTa-v3 pape': PAPER,
    'commands/pretrain.py: "GPT-2 byte-level BPE; the context is --seq-len; "': TODO_HELP,
    'commands/pretrain.py: "another family (e.g. --recipe electra on a DeBERTa encoder)': PAPER,
    'commands/pretrain.py: "bert = MLM+NSP, segment pairs, static masks (WordPiece); ro': TODO_HELP,
    'commands/pretrain.py: "bert-base/large; twice that for electra and modern)"': SIZE,
    'commands/pretrain.py: "bert-mini"': SIZE,
    'commands/pretrain.py: "dynamic; MLM vs ELECTRA vs XLNet; token vs span masking; ..': PAPER,
    'commands/pretrain.py: "embedding module, ELECTRA\'s default) or gdes (gradient-dise': PAPER,
    'commands/pretrain.py: "embedding sharing (Unigram in DeBERTa\'s layout); xlm-robert': TODO_HELP,
    'commands/pretrain.py: "factorisation order predicted); gpt = left-to-right LM (GPT': TODO_HELP,
    'commands/pretrain.py: "masking + span-boundary objective; electra = replaced-token': TODO_HELP,
    'commands/pretrain.py: "model size (default: bert-mini)"': SIZE,
    'commands/pretrain.py: "model size (default: bert-mini; bert-tiny for the built-in ': SIZE,
    'commands/pretrain.py: "modern = ModernBERT: pre-norm, rotary, GeGLU, local/global ': TODO_HELP,
    'commands/pretrain.py: "peak learning rate (default: by size, 1e-3 for bert-tiny/mi': SIZE,
    'commands/pretrain.py: "pretrain a BERT-family model or a GPT decoder (default: a ~': PAPER,
    'commands/pretrain.py: "random) objectives; xlnet = permutation LM with two-stream ': TODO_HELP,
    'commands/pretrain.py: "re-run the BERT, RoBERTa, ALBERT, ELECTRA, SpanBERT and DeB': PAPER,
    'commands/pretrain.py: "sentences (byte-level BPE); albert = MLM+SOP, E=128, all la': TODO_HELP,
    'commands/pretrain.py: "share of tokens to predict (default: the recipe\'s; 0.15, mo': PAPER,
    'commands/pretrain.py: "xlnet: predict the last 1/K of each factorisation order (de': PAPER,
    'commands/retriever.py: "a retriever folder\'s towers in transformers\' DPR layout"': METHOD,
    'commands/retriever.py: "dense retrievers: train DPR-style question / passage towers': METHOD,
    'commands/retriever.py: "export-dpr"': METHOD,
    'commands/retriever.py: "in transformers\' DPR layout"': METHOD,
    'commands/retriever.py: "pooler_output is the towers\' vectors. BERT towers read at [': PAPER,
    'commands/retriever.py: "rows {question, positive, negatives?, answers?} (jsonl, csv': PAPER,
    'commands/retriever.py: "starting encoder (BERT folder or Hub id, sentence-transform': PAPER,
    'commands/retriever.py: "the tower\'s vector: cls (DPR\'s, the default) or mean (a ret': METHOD,
    'commands/retriever.py: "train a dense retriever (DPR: in-batch and BM25 hard negati': METHOD,
    'commands/retriever.py: export_dpr': METHOD,
    'commands/tokenizer.py: "(<s>/</s>/<mask>, always cased); unigram = ALBERT (▁ word s': PAPER,
    'commands/tokenizer.py: "Train tokenizers for the BERT family."': PAPER,
    'commands/tokenizer.py: "kinds: wordpiece = BERT (## continuation, [CLS]/[SEP]/[MASK': PAPER,
    'config/long.py: LONGFORMER_WINDOW': CONSTANT,
    'config/long.py: f"attention_type is a BigBird setting (block-sparse attentio': PAPER,
    'config/long.py: f"attention_window is a Longformer setting (sliding-window a': PAPER,
    'config/long.py: longformer': CONSTANT,
    'config/model.py: BIGBIRD_BLOCK': CONSTANT,
    'config/model.py: BIGBIRD_RANDOM': CONSTANT,
    'config/model.py: big_bird': CONSTANT,
    'config/model.py: modernbert': CONSTANT,
    'data/noising.py: BartNoise': MECHANISM,
    'data/noising.py: t5_lengths': MECHANISM,
    'data/seq2seq.py: "text infilling needs a tokenizer with a <mask> token (byte-': PAPER,
    'data/seq2seq.py: BartNoise': MECHANISM,
    'data/seq2seq.py: t5_lengths': MECHANISM,
    'distillation/compress.py: "bert"': ONNX,
    'distillation/init.py: "a DistilBERT student needs a teacher with unfactorised embe': PAPER,
    'distillation/init.py: f"a DistilBERT student needs a {\' or \'.join(teachers)} teach': PAPER,
    'embedding/modules.py: "sentence_bert_config.json"': FOREIGN,
    'embedding/modules.py: f"{path / \'sentence_bert_config.json\'}: max_seq_length"': FOREIGN,
    'generation/text.py: f"{folder.path}: {what} cannot generate text; give a decoder': PAPER,
    'lab/flops.py: electra': CONSTANT,
    'lab/run.py: "bert-base"': SIZE,
    'lab/run.py: "bert-l6-h384"': SIZE,
    'lab/run.py: "bert-large"': SIZE,
    'lab/run.py: "bert-medium"': SIZE,
    'lab/run.py: "bert-mini"': SIZE,
    'lab/run.py: "bert-small"': SIZE,
    'lab/run.py: "bert-tiny"': SIZE,
    'lab/run.py: electra': CONSTANT,
    'lab/tables.py: "ALBERT, all layers shared (E=128, SOP)"': LAB,
    'lab/tables.py: "ALBERT, not shared"': LAB,
    'lab/tables.py: "Clark et al. 2020, Table 1 (ELECTRA-Small vs BERT-Small, GL': LAB,
    'lab/tables.py: "Devlin et al. 2019, Table 5 (BERT-base, dev)"': LAB,
    'lab/tables.py: "Lan et al. 2020, Tables 4 and 5 (ALBERT-base, dev)"': LAB,
    'lab/tables.py: "Liu et al. 2019, Tables 1 and 2 (BERT-base, dev)"': LAB,
    'lab/tables.py: "MLM (BERT)"': LAB,
    'lab/tables.py: "MLM + NSP (BERT)"': LAB,
    'lab/tables.py: "albert"': LAB,
    'lab/tables.py: "albert-unshared"': LAB,
    'lab/tables.py: "bert"': LAB,
    'lab/tables.py: "electra"': LAB,
    'lab/tables.py: "electra-flops"': LAB,
    'lab/tables.py: "roberta"': LAB,
    'lab/tables.py: "the bert encoder at random initialisation, fine-tuned like ': LAB,
    'model/__init__.py: "BigBirdSelfAttention"': MECHANISM,
    'model/__init__.py: "LongformerSelfAttention"': MECHANISM,
    'model/__init__.py: "XLNetEncoder"': MECHANISM,
    'model/__init__.py: "XLNetOutput"': MECHANISM,
    'model/__init__.py: BigBirdSelfAttention': MECHANISM,
    'model/__init__.py: LongformerSelfAttention': MECHANISM,
    'model/__init__.py: XLNetEncoder': MECHANISM,
    'model/__init__.py: XLNetOutput': MECHANISM,
    'model/__init__.py: bigbird': MECHANISM,
    'model/__init__.py: longformer': MECHANISM,
    'model/__init__.py: xlnet': MECHANISM,
    'model/decoder.py: "a decoder (GPT-2 layout)"': PAPER,
    'model/decoder.py: f"model_type {cfg.model_type} is an encoder, not a decoder (': PAPER,
    'model/encoder.py: "cannot prune heads of an encoder whose layers share attenti': PAPER,
    'model/encoder.py: "relative attention), not by the BERT encoder: bertforge pre': PAPER,
    'model/encoder.py: f"a {cfg.model_type} model is built by bertforge.model.XLNet': PAPER,
    'model/encoder.py: f"global_attention_mask is a Longformer input; a {self.confi': PAPER,
    'model/encoder.py: f"model_type {cfg.model_type} is a decoder (GPT-2 layout), n': PAPER,
    'model/encoder.py: longformer': MECHANISM,
    'model/encoder.py: modernbert': CONSTANT,
    'model/heads.py: "XLNetLM"': MECHANISM,
    'model/heads.py: "an XLNet language model"': PAPER,
    'model/heads.py: XLNetEncoder': MECHANISM,
    'model/heads.py: XLNetLM': MECHANISM,
    'model/sparse/bigbird.py: BigBirdSelfAttention': MECHANISM,
    'model/sparse/bigbird.py: bigbird_plan': MECHANISM,
    'model/sparse/layout.py: f"global_attention_mask is a Longformer input; a {cfg.model_': PAPER,
    'model/sparse/layout.py: f"input length {T} is not a multiple of BigBird\'s block_size': PAPER,
    'model/sparse/longformer.py: "Longformer attention runs inside its Encoder (the layout co': PAPER,
    'model/sparse/longformer.py: BigBirdSelfAttention': MECHANISM,
    'model/sparse/longformer.py: LongformerSelfAttention': MECHANISM,
    'model/sparse/longformer.py: bigbird': MECHANISM,
    'model/xlnet.py: "XLNetEncoder"': MECHANISM,
    'model/xlnet.py: "an XLNet encoder"': PAPER,
    'model/xlnet.py: XLNetEncoder': MECHANISM,
    'model/xlnet.py: XLNetFeedForward': MECHANISM,
    'model/xlnet.py: XLNetLayer': MECHANISM,
    'model/xlnet.py: XLNetOutput': MECHANISM,
    'model/xlnet.py: f"XLNetEncoder needs a two-stream (XLNet) config, got model_': PAPER,
    'pretraining/ablation.py: "ALBERT with no cross-layer sharing"': LAB,
    'pretraining/ablation.py: "DeBERTa RTD, one embedding module for both (ES, ELECTRA\'s s': LAB,
    'pretraining/ablation.py: "MLM + NSP, segment pairs, static masks (BERT)"': LAB,
    'pretraining/ablation.py: "MLM + WSO + SSO, segment pairs, static masks (StructBERT)"': LAB,
    'pretraining/ablation.py: "albert"': LAB,
    'pretraining/ablation.py: "albert-unshared"': LAB,
    'pretraining/ablation.py: "bert-mini"': LAB,
    'pretraining/ablation.py: "electra"': LAB,
    'pretraining/ablation.py: "electra-flops"': LAB,
    'pretraining/ablation.py: "left-to-right LM on the same encoder, left-only attention (': LAB,
    'pretraining/ablation.py: "permutation LM, two-stream relative attention, last 1/6 pre': LAB,
    'pretraining/ablation.py: "roberta"': LAB,
    'pretraining/ablation.py: "span masking + span-boundary objective (SpanBERT)"': LAB,
    'pretraining/ablation.py: "the ALBERT recipe: MLM + SOP, E=128, all layers shared"': LAB,
    'pretraining/ablation.py: "the ModernBERT recipe: modernbert family, MLM 30%, packed r': LAB,
    'pretraining/ablation.py: "xlnet"': LAB,
    'pretraining/inputs.py: f"(XLNet models train the permutation LM, {PLM}, and only th': PAPER,
    'pretraining/longify.py: f"{\', \'.join(SOURCES)} checkpoints, whose layers Longformer\'': PAPER,
    'pretraining/objectives.py: XLNetLM': MECHANISM,
    'pretraining/recipes.py: f"({PLM}) is what an XLNet model trains, and all it trains; ': PAPER,
    'pretraining/recipes.py: f"--masking {self.masking} does not apply to --objective plm': PAPER,
    'pretraining/report.py: "context: a few CPU minutes show the whole pipeline, not a u': PAPER,
    'pretraining/report.py: "with a larger model (--size bert-mini --time-budget 8h, on ': PAPER,
    'pretraining/run.py: f"--init-from {src}: a {cfg.model_type} checkpoint cannot co': PAPER,
    'pretraining/seq2seq.py: f"{source}: a {tok.kind} tokenizer has no <mask> token for B': PAPER,
    'retrieval/dpr.py: dpr_loss': METHOD,
    'retrieval/dpr.py: f"{where}: no question (expected question + positive, DPR\'s ': METHOD,
    'retrieval/generative_train.py: "the question tower has no DPR layout (%s): the RAG folder h': METHOD,
    'retrieval/generative_train.py: dpr_layout_problem': METHOD,
    'retrieval/generative_train.py: export_dpr_towers': METHOD,
    'retrieval/ict.py: dpr': METHOD,
    'retrieval/questions.py: "dpr-csv"': METHOD,
    'retrieval/questions.py: "or JSON Lines {question, answers: [...]}), CuratedTREC (que': PAPER,
    'retrieval/questions.py: "the first line\'s (DPR\'s csv)"': METHOD,
    'retrieval/rag_folder.py: "question_encoder.bert_model."': PAPER,
    'retrieval/rag_folder.py: "the question encoder\'s weights are neither in DPR\'s layout ': METHOD,
    'retrieval/rag_folder.py: DPR_QUESTION_BODY': METHOD,
    'retrieval/rag_folder.py: f"({DPR_QUESTION_BODY}*) nor in BERT\'s (bert.* / embeddings.': METHOD,
    'retrieval/towers.py: "DPR\'s towers are read at [CLS]; this one pools otherwise (t': METHOD,
    'retrieval/towers.py: "DPR\'s towers end with at most one linear projection; this o': METHOD,
    'retrieval/towers.py: _dpr_family': METHOD,
    'retrieval/towers.py: dpr': METHOD,
    'retrieval/towers.py: dpr_cfg': METHOD,
    'retrieval/towers.py: dpr_layout_problem': METHOD,
    'retrieval/towers.py: dpr_loss': METHOD,
    'retrieval/towers.py: export_dpr': METHOD,
    'retrieval/towers.py: export_dpr_towers': METHOD,
    'retrieval/towers.py: f"a {cfg.model_type} encoder has no DPR layout (DPR\'s towers': METHOD,
    'retrieval/train.py: dpr': METHOD,
    'tokenization/pipelines.py: "BertNormalizer"': FOREIGN,
    'tokenization/pipelines.py: BertNormalizer': FOREIGN,
    'tokenization/pipelines.py: BertPreTokenizer': FOREIGN,
    'tokenization/pipelines.py: RobertaProcessing': FOREIGN,
}


def _family_files() -> dict[str, str]:
    """Each file of families/ -> the model_type of the family it defines (its `FAMILY`)."""
    import importlib

    return {path.stem: importlib.import_module(f"bertforge.families.{path.stem}").FAMILY.model_type
            for path in sorted((SRC / "families").glob("*.py")) if path.stem not in ("__init__", "family")}


def _words(text: str) -> str:
    """`text` lower-cased with camelCase split into words ("DebertaV2Model" -> "deberta v2 model")."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", text).lower()


def _family_pattern() -> re.Pattern:
    """Every family's name as a word: its model_type, its file's name and its HF class prefix, each part (letters,
    digits) allowed to be joined by nothing, "-", "_" or a space ("gpt2", "GPT-2", "big_bird", "BigBird")."""
    from bertforge.families import FAMILIES

    spellings = {s for stem, model_type in _family_files().items()
                 for s in (stem, model_type, FAMILIES[model_type].hf_prefix) if s}
    alternatives = set()
    for spelling in spellings:
        parts = re.findall(r"[a-z]+|[0-9]+", _words(spelling))
        alternatives.add(r"[-_ ]?".join(parts))
    return re.compile(r"(?<![a-z])(%s)(?![a-z])" % "|".join(sorted(alternatives, key=len, reverse=True)))


def _canonical_stripped(text: str) -> str:
    from bertforge.families.family import CANONICAL_ENCODER

    if text == CANONICAL_ENCODER:  # the canonical encoder's attribute, `model.bert`
        return ""
    return re.sub(r"(?<![A-Za-z])%s\\?\." % CANONICAL_ENCODER, " ", text)  # "bert.encoder..." tensor names


def _docstring_lines(tree: ast.AST) -> set[int]:
    return {node.body[0].value.lineno for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
            and isinstance(node.body[0].value.value, str)}


def family_name_mentions(root: Path = SRC, allowed: dict[str, str] | None = None) -> list[str]:
    """`path: token` for each identifier or string outside families/ (comments and docstrings excluded) that
    names a family, and is not on the allow-list (`allowed`, FAMILY_NAME_ALLOWED by default)."""
    import io
    import tokenize

    allowed = FAMILY_NAME_ALLOWED if allowed is None else allowed
    pattern = _family_pattern()
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] == "families":
            continue
        text = path.read_text(encoding="utf-8")
        docs = _docstring_lines(ast.parse(text))
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type not in (tokenize.NAME, tokenize.STRING) or \
                    (tok.type == tokenize.STRING and tok.start[0] in docs):
                continue
            if pattern.search(_words(_canonical_stripped(tok.string))):
                key = f"{rel.as_posix()}: {' '.join(tok.string.split())[:60]}"
                if key not in allowed:
                    found.append(key)
    return found


def test_no_family_name_outside_families():
    from bertforge.families import FAMILIES

    files = _family_files()
    assert set(files.values()) == set(FAMILIES)  # one file per family, read off the files themselves
    assert all(stem == model_type.replace("-", "_") for stem, model_type in files.items()), files  # named for it
    found = family_name_mentions()
    assert not found, ("behaviour that differs by family is a field of the family (families/), not a mention of "
                       "its name:\n" + "\n".join(found))


def test_every_allowed_mention_still_exists_and_says_why():
    """A stale entry would let a new mention in: each allowed one is still in the code, each with a reason."""
    assert all(isinstance(why, str) and why for why in FAMILY_NAME_ALLOWED.values())
    present = set(family_name_mentions(allowed={}))
    stale = sorted(set(FAMILY_NAME_ALLOWED) - present)
    assert not stale, "allow-list entries no longer in the code (remove them):\n" + "\n".join(stale)


def test_the_family_name_check_finds_a_mention(tmp_path):
    """The check above can fail: identifiers, substrings of strings and prose are found; docstrings, comments,
    `bertforge` and the canonical `bert.` names are not."""
    (tmp_path / "families").mkdir()
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "head.py").write_text(
        '"""roberta"""\nimport bertforge  # albert\n'
        'def head(cfg, model, k):\n    """bert"""\n    roberta_head = model.bert(k.startswith("bert.encoder."))\n'
        '    return k.endswith("albert.pooler.weight") or "use albert or electra" or RobertaClassificationHead\n',
        encoding="utf-8")
    assert family_name_mentions(tmp_path, allowed={}) == [
        "tasks/head.py: roberta_head", 'tasks/head.py: "albert.pooler.weight"',
        'tasks/head.py: "use albert or electra"', "tasks/head.py: RobertaClassificationHead"]
    assert family_name_mentions(tmp_path, allowed={"tasks/head.py: roberta_head": "a reason"}) == [
        'tasks/head.py: "albert.pooler.weight"', 'tasks/head.py: "use albert or electra"',
        "tasks/head.py: RobertaClassificationHead"]
