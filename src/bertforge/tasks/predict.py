"""Predictions from a fine-tuned directory, one JSON object per input; the task comes from its config.json.

Inputs by kind (JSONL, one object a line; or plain text where it makes sense):
  classify / regress: {"text": ..., "text_pair"?: ...} (or the columns named at training time), a GLUE tsv of the
                      task, or .txt lines (a tab separates a pair)
  tag:                {"tokens": [...]} or .txt lines (split on whitespace), or a CoNLL file (.conll)
  qa:                 {"id"?, "question", "context"} or a SQuAD .json file
  choice:             {"context", "endings": [...]}
Outputs: label + score + probabilities (classify), score (regress), tokens + tags (tag), answer + span + score +
null/no-answer flag (qa), label index + probabilities (choice).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from bertforge.errors import BertforgeError
from bertforge.tasks import features as F
from bertforge.tasks import readers as R
from bertforge.tasks import squad as S


def _jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    return R.jsonl_rows(path)  # file:line errors, shared with the readers


def _field(obj: dict, keys: tuple[str, ...], where: str, required: bool = True) -> Any:
    for k in keys:
        if k in obj and obj[k] is not None:
            return obj[k]
    if required:
        raise BertforgeError(f"{where}: missing field {keys[0]!r}")
    return None


def read_inputs(path: Path, kind: str, task: dict[str, Any]) -> list:
    """Unlabelled examples of `kind` from `path` (see the module docstring for the formats)."""
    if not path.is_file():
        raise BertforgeError(f"{path}: no such file")
    suffix = path.suffix.lower()
    name = path.name
    if kind in ("classify", "regress"):
        spec = R.TASKS.get(task.get("name", ""))
        if suffix == ".tsv" and spec is not None:
            return spec.read(path)
        if suffix in (".jsonl", ".json"):
            text_keys = tuple(dict.fromkeys((task.get("text_col") or "text", "text", "sentence")))
            pair_keys = tuple(k for k in (task.get("text_pair_col"), "text_pair") if k)
            out = []
            for n, obj in _jsonl(path):
                where = f"{name}:{n}"
                text = _field(obj, text_keys, where)
                pair = _field(obj, pair_keys, where, required=False) if pair_keys else None
                out.append(R.TextExample(R._text(text, where, "text"), None if pair is None else
                                         R._text(pair, where, "text_pair"), None, str(obj.get("id", n))))
            return out
        out = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                parts = line.split("\t")
                if len(parts) > 2:
                    raise BertforgeError(f"{name}:{n}: expected a text or a text<TAB>pair, found {len(parts)} fields")
                out.append(R.TextExample(parts[0].strip(), parts[1].strip() if len(parts) == 2 else None, None, str(n)))
        return out
    if kind == "tag":
        if suffix in (".conll",) or (suffix == ".txt" and _looks_conll(path)):
            return [R.TaggingExample(ex.tokens, [], ex.guid) for ex in R.read_conll(path, tag_col=None)]
        if suffix in (".jsonl", ".json"):
            out = []
            for n, obj in _jsonl(path):
                tokens = _field(obj, ("tokens", "words"), f"{name}:{n}")
                if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) and t for t in tokens):
                    raise BertforgeError(f"{name}:{n}: 'tokens' must be a non-empty list of strings")
                out.append(R.TaggingExample(tokens, [], str(obj.get("id", n))))
            return out
        return [R.TaggingExample(line.split(), [], str(n))
                for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
    if kind == "qa":
        if suffix == ".json":
            return S.read_squad(path)
        out = []
        for n, obj in _jsonl(path):
            where = f"{name}:{n}"
            out.append(S.SquadExample(str(obj.get("id", n)), R._text(_field(obj, ("question",), where), where, "question"),
                                      R._text(_field(obj, ("context",), where), where, "context"), article=0))
        return out
    return [R.ChoiceExample(ex.context, ex.endings, None, ex.guid) for ex in R.read_swag(path)]


def _looks_conll(path: Path) -> bool:
    """A token-per-line file: most non-blank lines have one to four fields and there are blank separators."""
    with open(path, encoding="utf-8") as f:
        head = [next(f, "") for _ in range(50)]
    return any(not line.strip() for line in head) or any(line.startswith("-DOCSTART-") for line in head)


def predict(model_dir: str | Path, input_path: str | Path, batch_size: int = 64, device: str = "auto",
            progress: bool = True) -> list[dict[str, Any]]:
    """Predictions for every example in `input_path`, in input order."""
    from bertforge.tasks.finetune import forward_rows, load_model_dir, make_collate, predicted_tags, unpad
    from bertforge.tasks.models import load_task_model
    from bertforge.tokenization import Tokenizer
    from bertforge.train import resolve_device

    path = load_model_dir(model_dir)
    model, task, labels = load_task_model(path)
    model.to(resolve_device(device))
    tok = Tokenizer.from_pretrained(path)
    kind, max_len = task["kind"], int(task.get("max_seq_len") or (384 if task["kind"] == "qa" else 128))
    examples = read_inputs(Path(input_path), kind, task)
    if not examples:
        raise BertforgeError(f"{input_path}: no inputs")
    collate = make_collate(tok.pad_token_id)
    out: list[dict[str, Any]] = []
    if kind in ("classify", "regress"):
        for ex in examples:
            ex.label = None
        rows = unpad(F.encode_text_examples(examples, tok, None, max_len))
        outs = forward_rows(model, rows, collate, batch_size, ("logits",), desc="predict", progress=progress)
        for ex, o in zip(examples, outs):
            if kind == "regress":
                out.append({"id": ex.guid, "score": float(o["logits"][0])})
            else:
                p = o["logits"].softmax(-1)
                k = int(p.argmax())
                out.append({"id": ex.guid, "label": labels[k], "score": float(p[k]),
                            "probabilities": {lab: float(v) for lab, v in zip(labels, p)}})
    elif kind == "tag":
        rows = unpad(F.encode_tagging_examples(examples, tok, labels, max_len))
        outs = forward_rows(model, rows, collate, batch_size, ("logits",), desc="predict", progress=progress)
        for ex, r, o in zip(examples, rows, outs):
            out.append({"id": ex.guid, "tokens": ex.tokens,
                        "tags": predicted_tags(o["logits"], r["word_index"], len(ex.tokens), labels)})
    elif kind == "choice":
        rows = unpad(F.encode_choice_examples(examples, tok, max_len))
        outs = forward_rows(model, rows, collate, batch_size, ("logits",), desc="predict", progress=progress)
        for ex, o in zip(examples, outs):
            p = o["logits"].softmax(-1)
            out.append({"id": ex.guid, "label": int(p.argmax()), "score": float(p.max()),
                        "probabilities": [float(v) for v in p]})
    else:
        from bertforge.tasks.finetune import qa_logits

        feats = S.build_squad_features(examples, tok, max_seq_length=max_len, doc_stride=int(task.get("doc_stride", 128)),
                                       max_query_length=int(task.get("max_query_length", 64)))
        rows = unpad(feats.tensors(labels=False))

        class _Cfg:  # the two fields qa_logits reads
            eval_batch_size = batch_size

        _Cfg.progress = progress
        start, end = qa_logits(model, rows, collate, _Cfg, feats.input_ids.shape[1])
        v2 = bool(task.get("version_2"))
        tau = float(task.get("null_threshold", 0.0))
        preds = S.postprocess(examples, feats, start, end, version_2=v2, null_threshold=tau)
        for ex in examples:
            best = preds.nbest[ex.qid][0] if preds.nbest[ex.qid] else None
            answer = preds.predictions[ex.qid]
            rec = {"id": ex.qid, "answer": answer, "score": best["score"] if best else None}
            if answer and best:  # postprocess cuts the answer from the context at these character offsets
                rec.update(start=int(best["start"]), end=int(best["end"]))
            if v2:
                rec["null_score_diff"] = preds.null_diffs[ex.qid]
            out.append(rec)
    return out


def write_jsonl(records: list[dict[str, Any]], path: str | Path | None) -> None:
    """JSONL to `path` (atomically) or stdout."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if path is None:
        import sys

        sys.stdout.write(text)
        return
    from bertforge.checkpoint import atomic_write_text

    atomic_write_text(path, text)
