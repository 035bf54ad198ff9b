"""What a model folder holds, decided in one place. Every verb that opens a `--model` (or a teacher, or a model to
serve) asks `inspect_folder` and opens what it is told, so a folder means the same to every verb:

    holds              the folder has                                        opened by
    encoder            a bare encoder (BertModel and its family)             model.Encoder.from_pretrained
    sentence-encoder   sentence-transformers modules (modules.json)          embed.SentenceEncoder.from_pretrained
    task               a fine-tuned encoder (config.json: bertforge_task)     tasks.models.load_task_model
    bilstm             a distilled BiLSTM student                            model.bilstm.load_bilstm
    decoder            a GPT-2 layout decoder                                model.DecoderLM.from_pretrained
    encoder-decoder    a T5 / BART model                                     model.Seq2SeqLM.from_pretrained

and how its weights are stored: as an exported ONNX graph (`graph`, run by onnxruntime: `model.onnx`) or as int8
weights (`int8`, written by `bertforge quantize`). A path to a `.onnx` file names the folder beside it; a
fine-tuning folder that keeps its model in `best/` (older bertforge versions) names that.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.families import FAMILIES, SEQ2SEQ_FAMILIES
from bertforge.io.read import read_json
from bertforge.model.bilstm import MODEL_TYPE as BILSTM_MODEL_TYPE
from bertforge.model.checkpoint import INT8_WEIGHTS
from bertforge.model.int8 import QUANT_FIELD
from bertforge.model.onnx import model_folder, onnx_file

HOLDS = ("encoder", "sentence-encoder", "task", "bilstm", "decoder", "encoder-decoder")


@dataclass(frozen=True)
class ModelFolder:
    path: Path                   # the folder with config.json and the tokenizer
    holds: str                   # one of HOLDS
    config: dict[str, Any]       # its config.json
    graph: Path | None = None    # an exported ONNX graph to run instead of PyTorch weights
    int8: bool = False           # int8 weights (`bertforge quantize`)

    @property
    def task(self) -> dict[str, Any] | None:
        """A task model's `bertforge_task` record (kind, task name, ...)."""
        task = self.config.get("bertforge_task")
        return task if isinstance(task, dict) else None

    @property
    def kind(self) -> str:
        """What the model does: a fine-tuned model's task kind (classify, regress, tag, qa, choice, seq2seq), or
        "feature" for a head on frozen features; else `holds` (a BiLSTM student is "bilstm" whatever its task)."""
        if self.task is not None and self.holds != "bilstm":
            return "feature" if self.task.get("features") else str(self.task.get("kind"))
        return self.holds

    @property
    def labels(self) -> list[str] | None:
        id2label = self.config.get("id2label") or {}
        return [id2label[str(i)] for i in range(len(id2label))] or None


def _holds(folder: Path, config: dict[str, Any]) -> str:
    model_type = config.get("model_type")
    if model_type == BILSTM_MODEL_TYPE:
        return "bilstm"
    if model_type in SEQ2SEQ_FAMILIES:  # a fine-tuned one too (its task record is `task`): it still generates
        return "encoder-decoder"
    if model_type in FAMILIES and FAMILIES[model_type].decoder:
        return "decoder"
    if isinstance(config.get("bertforge_task"), dict):
        return "task"
    return "sentence-encoder" if (folder / "modules.json").is_file() else "encoder"


def inspect_folder(path: str | Path, flag: str = "--model") -> ModelFolder:
    """What the model folder (or exported .onnx file) at `path` holds; one line naming `flag` if it is none."""
    graph = onnx_file(path)
    folder = model_folder(path)
    if not (folder / "config.json").is_file() and (folder / "best" / "config.json").is_file():
        folder = folder / "best"
    if (folder / "config.json").is_file():
        config = read_json(folder / "config.json")
    elif (folder / "modules.json").is_file():  # sentence-transformers modules whose Transformer sits in a sub-folder
        config = {}
    else:
        raise BertforgeError(f"{flag} {folder}: not a model directory (no config.json)")
    return ModelFolder(path=folder, holds=_holds(folder, config), config=config, graph=graph,
                       int8=(folder / INT8_WEIGHTS).is_file() or bool(config.get(QUANT_FIELD)))
