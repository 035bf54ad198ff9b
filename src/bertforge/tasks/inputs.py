"""Prediction inputs: the unlabelled formats `bertforge predict` reads, one function per task kind.

  classify / regress: JSONL {"text", "text_pair"?} (or the columns named at training time), the task's GLUE tsv,
                      or text lines (a tab separates a pair)
  tag:                JSONL {"tokens": [...]}, a CoNLL file (.conll, or a .txt with blank-line separators), or
                      text lines split on whitespace
  qa:                 JSONL {"id"?, "question", "context"} or a SQuAD .json file
  choice:             SWAG csv or JSONL {"context", "endings": [...]}
Labels found in a file are dropped: predictions never see them. Standard library only (plus the SQuAD reader).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.read import jsonl_rows, require_file, text_lines, where
from bertforge.tasks.conll import read_conll
from bertforge.tasks.examples import ChoiceExample, TaggingExample, TextExample, text_field
from bertforge.tasks.registry import TaskSpec
from bertforge.tasks.swag import read_swag


def _field(obj: dict, keys: tuple[str, ...], at: str, required: bool = True) -> Any:
    """The first of `keys` present (not null) in a JSONL object; the first key is the one named when none is."""
    for k in keys:
        if obj.get(k) is not None:
            return obj[k]
    if required:
        raise BertforgeError(f"{at}: missing field {keys[0]!r}")
    return None


def text_inputs(path: str | Path, spec: TaskSpec | None, text_col: str | None,
                text_pair_col: str | None) -> list[TextExample]:
    """Sentences (pairs) to classify or score."""
    p = require_file(path)
    suffix = p.suffix.lower()
    if suffix == ".tsv" and spec is not None:
        return [TextExample(ex.text, ex.text_pair, None, ex.guid) for ex in spec.read(p)]
    if suffix in (".jsonl", ".json"):
        text_keys = tuple(dict.fromkeys((text_col or "text", "text", "sentence")))
        pair_keys = tuple(k for k in (text_pair_col, "text_pair") if k)
        out = []
        for n, obj in jsonl_rows(p):
            at = where(p, n)
            text = text_field(_field(obj, text_keys, at), at, "text")
            pair = _field(obj, pair_keys, at, required=False) if pair_keys else None
            out.append(TextExample(text, None if pair is None else text_field(pair, at, "text_pair"), None,
                                   str(obj.get("id", n))))
        return out
    out = []
    for n, line in text_lines(p):
        parts = line.split("\t")
        if len(parts) > 2:
            raise BertforgeError(f"{where(p, n)}: expected a text or a text<TAB>pair, found {len(parts)} fields")
        out.append(TextExample(parts[0].strip(), parts[1].strip() if len(parts) == 2 else None, None, str(n)))
    return out


def _looks_conll(path: Path) -> bool:
    """A token-per-line file: blank lines separate its sentences, or it has -DOCSTART- lines (first 50 lines)."""
    for n, line in text_lines(path, skip_blank=False):
        if not line.strip() or line.startswith("-DOCSTART-"):
            return True
        if n >= 50:
            break
    return False


def tagging_inputs(path: str | Path) -> list[TaggingExample]:
    """Pre-tokenised sentences to tag."""
    p = require_file(path)
    suffix = p.suffix.lower()
    if suffix == ".conll" or (suffix == ".txt" and _looks_conll(p)):
        return [TaggingExample(ex.tokens, [], ex.guid) for ex in read_conll(p, tag_col=None)]
    if suffix in (".jsonl", ".json"):
        out = []
        for n, obj in jsonl_rows(p):
            tokens = _field(obj, ("tokens", "words"), where(p, n))
            if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) and t for t in tokens):
                raise BertforgeError(f"{where(p, n)}: 'tokens' must be a non-empty list of strings")
            out.append(TaggingExample(tokens, [], str(obj.get("id", n))))
        return out
    return [TaggingExample(line.split(), [], str(n)) for n, line in text_lines(p)]


def qa_inputs(path: str | Path) -> list:
    """Questions with their contexts (SquadExample, unanswered)."""
    from bertforge.tasks.squad import SquadExample, read_squad  # numpy and torch: only when predicting QA

    p = require_file(path)
    if p.suffix.lower() == ".json":
        return read_squad(p)
    out = []
    for n, obj in jsonl_rows(p):
        at = where(p, n)
        out.append(SquadExample(str(obj.get("id", n)), text_field(_field(obj, ("question",), at), at, "question"),
                                text_field(_field(obj, ("context",), at), at, "context"), article=0))
    return out


def choice_inputs(path: str | Path) -> list[ChoiceExample]:
    """Contexts with candidate endings."""
    return [ChoiceExample(ex.context, ex.endings, None, ex.guid) for ex in read_swag(path)]
