"""Readers for fine-tuning data, gathered in one namespace (each lives in a module of its own concern):

* ``examples``: ``TextExample`` / ``TaggingExample`` / ``ChoiceExample`` and the shared field checks;
* ``glue``: ``read_sst2``, ``read_cola``, ``read_mrpc``, ``read_stsb``, ``read_rte``, ``read_qnli``,
  ``read_nli_jsonl`` (MNLI / SNLI);
* ``table``: ``read_table``, any table with a column mapping;
* ``conll``: ``read_conll``, ``read_tagged_table``, ``tag_list`` and the IOB1 / IOB2 helpers;
* ``swag``: ``read_swag``;
* ``registry``: ``TASKS`` (reader, labels, metrics, usual files of each GLUE-style task) and ``get_task``.

Every reader takes any source `bertforge.io.tables.open_table` takes (a CSV / TSV / JSONL / JSON / Parquet file, a
saved or Hub dataset, data in memory) and returns a list of plain dataclass examples; labels stay as the *strings*
found in the file (classification) or floats (regression). Malformed input raises
``BertforgeError("<file>:<line>: <what>")``. Only the standard library is imported (pyarrow and datasets when a
source needs them), so importing readers is cheap::

    spec = get_task("sst-2")
    train = spec.read(data_dir / "glue/SST-2/train.tsv")
"""
from __future__ import annotations

from bertforge.io.read import jsonl_rows
from bertforge.labels import NLI2_LABELS, NLI3_LABELS
from bertforge.tasks.conll import detect_tag_scheme, iob1_to_iob2, read_conll, read_tagged_table, tag_list
from bertforge.tasks.examples import ChoiceExample, Label, TaggingExample, TextExample
from bertforge.tasks.glue import read_cola, read_mrpc, read_nli_jsonl, read_qnli, read_rte, read_sst2, read_stsb
from bertforge.tasks.registry import TASKS, TaskSpec, get_task
from bertforge.tasks.swag import SWAG_COLUMNS, read_swag
from bertforge.tasks.table import read_table

__all__ = [
    "ChoiceExample", "Label", "TaggingExample", "TextExample", "NLI2_LABELS", "NLI3_LABELS", "jsonl_rows",
    "read_sst2", "read_cola", "read_mrpc", "read_stsb", "read_rte", "read_qnli", "read_nli_jsonl", "read_table",
    "read_conll", "read_tagged_table", "detect_tag_scheme", "iob1_to_iob2", "tag_list", "SWAG_COLUMNS", "read_swag",
    "TASKS", "TaskSpec", "get_task",
]
