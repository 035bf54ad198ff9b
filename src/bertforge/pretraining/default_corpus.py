"""The embedded default corpus: the Python standard library's own documentation, read with `ast` (never imported):
module/class/function docstrings of its .py sources and the language-reference topics of `pydoc_data`.

Every Python installation has it offline, it is deterministic for a given Python version (files are visited in
sorted order and nothing is imported), and it is a few MB of English prose about programming. One document per
module (its module, class and function docstrings in source order); paragraphs become lines, blank lines separate
documents -- the plain-text layout `bertforge.data` reads.
"""
from __future__ import annotations

import ast
import hashlib
import re
import sys
import sysconfig
import warnings
from pathlib import Path

from bertforge.io.cache import cache_dir
from bertforge.io.write import atomic_write_text

# Test suites and vendored third-party code are skipped: mostly code, little prose.
_SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "lib2to3", "turtledemo"}
_MIN_PARAGRAPH_CHARS = 40


def _paragraphs(doc: str) -> list[str]:
    """Prose paragraphs of a docstring, each folded onto one line; code examples (>>>) and tables are dropped."""
    out = []
    for para in re.split(r"\n\s*\n", doc):
        lines = [ln.strip() for ln in para.strip().splitlines()]
        if not lines or any(ln.startswith((">>>", "...", "|", "+--", "$ ")) for ln in lines):
            continue
        text = " ".join(lines)
        letters = sum(c.isalpha() or c == " " for c in text)
        if len(text) >= _MIN_PARAGRAPH_CHARS and letters >= 0.8 * len(text):
            out.append(text)
    return out


def _module_docstrings(path: Path) -> list[str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # old escape sequences in a few stdlib files
            tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    nodes = [tree] + [n for n in ast.walk(tree)
                      if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    paras: list[str] = []
    for node in nodes:
        doc = ast.get_docstring(node)
        if doc:
            paras.extend(_paragraphs(doc))
    return paras


def _pydoc_topics(root: Path) -> list[list[str]]:
    """The language-reference topics that `help()` shows (pydoc_data/topics.py), one document per topic."""
    path = root / "pydoc_data" / "topics.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assign = next(n for n in tree.body if isinstance(n, ast.Assign))
        topics = ast.literal_eval(assign.value)  # a literal dict: parsed, never executed
    except (OSError, SyntaxError, ValueError, StopIteration):
        return []
    docs = [_paragraphs(topics[k]) for k in sorted(topics)]
    return [d for d in docs if len(d) >= 2]


def stdlib_documents() -> list[list[str]]:
    """Documents (lists of paragraph lines): the stdlib's docstrings in sorted file order, then pydoc's topics."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = _pydoc_topics(root)
    for path in sorted(root.rglob("*.py")):
        if _SKIP_PARTS.intersection(path.relative_to(root).parts):
            continue
        paras = _module_docstrings(path)
        if len(paras) >= 2:  # sentence-pair objectives need at least two segments per document
            docs.append(paras)
    return docs


def default_corpus(cache_root: str | Path | None = None) -> Path:
    """Write (once) and return the path of the stdlib-documentation corpus (a text file of a few MB).

    The cache key is the Python version and stdlib path, so another interpreter gets its own copy. Held-out
    documents are chosen later by `ShardedCorpus` from per-document hashes, as for any corpus.
    """
    root = Path(cache_root) if cache_root else cache_dir()
    key = hashlib.sha1(f"{sys.version}|{sysconfig.get_paths()['stdlib']}|v2".encode()).hexdigest()[:10]
    path = root / f"stdlib-docs-{key}.txt"
    if not path.is_file():
        docs = stdlib_documents()
        atomic_write_text(path, "\n\n".join("\n".join(d) for d in docs) + "\n")
    return path
