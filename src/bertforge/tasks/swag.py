"""SWAG multiple choice: the official CSV or JSONL ``{"context", "endings", "label"}`` (or the same columns in any
source `bertforge.io.tables.open_table` takes). Malformed input raises ``BertforgeError("<file>:<line>: <what>")``.
"""
from __future__ import annotations

from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.tables import open_table, value
from bertforge.tasks.examples import ChoiceExample, text_field


SWAG_COLUMNS = ("video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source")


def read_swag(source: Any, num_choices: int = 4) -> list[ChoiceExample]:
    """SWAG: the official CSV's columns (``video-id, fold-ind, startphrase, sent1, sent2, gold-source, ending0..3,
    label``; context = sent1, ending i = ``sent2 + " " + ending_i`` as in BERT's SWAG setup; the Hub's copy has the
    same) or ``{"context", "endings": [...], "label"}`` rows, in any source `io.tables.open_table` takes. ``label``
    absent means unlabelled (test split)."""
    table = open_table(source)
    out: list[ChoiceExample] = []
    if "endings" in table.columns:
        for row in table:
            where = row.where
            endings = row.get("endings")
            if not isinstance(endings, list) or len(endings) < 2:
                raise BertforgeError(f"{where}: 'endings' must be a list of at least 2 strings")
            out.append(
                ChoiceExample(
                    context=text_field(row.get("context"), where, "context"),
                    endings=[text_field(e, where, f"ending {i}") for i, e in enumerate(endings)],
                    label=_choice_label(row.get("label"), len(endings), where),
                    guid=str(row.get("id", f"{table.stem}-{len(out)}")),
                )
            )
        return out
    for column in ["sent1", "sent2"] + [f"ending{i}" for i in range(num_choices)]:
        table.require(column)
    labelled = table.has("label")
    for row in table:
        where = row.where
        sent2 = str(value(row, "sent2") or "").strip()
        endings = [text_field(value(row, f"ending{i}"), where, f"ending{i}") for i in range(num_choices)]
        out.append(
            ChoiceExample(
                context=text_field(value(row, "sent1"), where, "sent1"),
                endings=[f"{sent2} {e}".strip() for e in endings],
                label=_choice_label(row.get("label"), num_choices, where) if labelled else None,
                guid=str(row["fold-ind"]) if row.get("fold-ind") is not None else f"{table.stem}-{len(out)}",
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
