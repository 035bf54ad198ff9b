"""SWAG multiple choice: the official CSV or JSONL ``{"context", "endings", "label"}``.

Standard library only; malformed input raises ``BertforgeError("<file>:<line>: <what>")``.
"""
from __future__ import annotations

from pathlib import Path

from bertforge.errors import BertforgeError
from bertforge.io.read import csv_rows, jsonl_rows, require_file
from bertforge.io.read import where as _where
from bertforge.tasks.examples import ChoiceExample, text_field


SWAG_COLUMNS = ("video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source")


def read_swag(path: str | Path, num_choices: int = 4) -> list[ChoiceExample]:
    """SWAG: the official CSV (``video-id, fold-ind, startphrase, sent1, sent2, gold-source, ending0..3,
    label``; context = sent1, ending i = ``sent2 + " " + ending_i`` as in BERT's SWAG setup) or JSONL
    ``{"context", "endings": [...], "label"}``. ``label`` absent means unlabelled (test split)."""
    p = require_file(path)
    out: list[ChoiceExample] = []
    if p.suffix.lower() in (".jsonl", ".json"):
        for n, obj in jsonl_rows(p):
            where = _where(p, n)
            endings = obj.get("endings")
            if not isinstance(endings, list) or len(endings) < 2:
                raise BertforgeError(f"{where}: 'endings' must be a list of at least 2 strings")
            out.append(
                ChoiceExample(
                    context=text_field(obj.get("context"), where, "context"),
                    endings=[text_field(e, where, f"ending {i}") for i, e in enumerate(endings)],
                    label=_choice_label(obj.get("label"), len(endings), where),
                    guid=str(obj.get("id", f"{p.stem}-{len(out)}")),
                )
            )
        return out

    rows = csv_rows(p, ",")
    try:
        _, header = next(rows)
    except StopIteration:
        raise BertforgeError(f"{p}: empty file") from None
    cols = {h.strip(): i for i, h in enumerate(header)}
    need = ["sent1", "sent2"] + [f"ending{i}" for i in range(num_choices)]
    missing = [c for c in need if c not in cols]
    if missing:
        raise BertforgeError(f"{_where(p, 1)}: header has no column(s) {', '.join(missing)}")
    for n, row in rows:
        where = _where(p, n)
        if len(row) != len(header):
            raise BertforgeError(f"{where}: expected {len(header)} columns, found {len(row)}")
        sent2 = row[cols["sent2"]].strip()
        endings = [text_field(row[cols[f"ending{i}"]], where, f"ending{i}") for i in range(num_choices)]
        out.append(
            ChoiceExample(
                context=text_field(row[cols["sent1"]], where, "sent1"),
                endings=[f"{sent2} {e}".strip() for e in endings],
                label=_choice_label(row[cols["label"]], num_choices, where) if "label" in cols else None,
                guid=row[cols["fold-ind"]] if "fold-ind" in cols else f"{p.stem}-{len(out)}",
            )
        )
    return out


def _choice_label(raw: object, num_choices: int, where: str) -> int | None:
    if raw is None:
        return None
    try:
        i = int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BertforgeError(f"{where}: label must be an integer, found {raw!r}") from None
    if not 0 <= i < num_choices:
        raise BertforgeError(f"{where}: label {i} out of range for {num_choices} choices")
    return i
