"""Opening a model folder, in one place. What the user typed (`--model`, `--teacher`, a model to serve) becomes a
local path in `resolve_model_path` (`io.hub`: a folder, or a Hugging Face Hub id at a revision, downloaded or taken
from the cache when offline), the one place where a name becomes a folder before anything is read;
`ModelFolder.open` then reads config.json once and decides what the folder holds:

    holds              the folder has                                        built by
    encoder            a bare encoder (BertModel and its family)             model.Encoder.from_pretrained
    sentence-encoder   sentence-transformers modules (modules.json)          embed.SentenceEncoder.from_pretrained
    task               a fine-tuned encoder (config.json: bertforge_task)     tasks.models.load_task_model
    bilstm             a distilled BiLSTM student                            model.bilstm.load_bilstm
    decoder            a GPT-2 layout decoder                                model.DecoderLM.from_pretrained
    encoder-decoder    a T5 / BART model                                     model.Seq2SeqLM.from_pretrained

how its weights are stored (an exported ONNX graph to run in onnxruntime, `graph`: `model.onnx`; int8 weights
written by `bertforge quantize`, `int8_weights`), its task and labels, and its parsed config (`model_config`: a
ModelConfig or Seq2SeqConfig; `config_for` checks it against the weights' shapes before the first model is built,
not at open, so a verb reports its data's problems first). Every loader above takes the opened folder (or a path,
which it opens), so a folder means the same to every verb and its config.json is read once. A path to a `.onnx`
file names the folder beside it; a fine-tuning folder that keeps its model in `best/` (older bertforge versions)
names that.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.config.hf import check_against_weights, config_from_dict, read_config_json
from bertforge.errors import BertforgeError
from bertforge.io.hub import named as _named
from bertforge.io.hub import ResolvedModel, resolve_model_path
from bertforge.io.read import safetensors_shapes
from bertforge.families import DECODER, ENCODER, ENCODER_DECODER, FAMILIES
from bertforge.model.checkpoint import INT8_WEIGHTS, weight_families
from bertforge.model.int8 import INT8_SCHEME, QUANT_FIELD

HOLDS = ("encoder", "sentence-encoder", "task", "bilstm", "decoder", "encoder-decoder")
BILSTM_MODEL_TYPE = "bertforge-bilstm"  # config.json's model_type of a distilled BiLSTM student (model.bilstm)
ONNX_FP32 = "model.onnx"                # `bertforge export`'s graphs
ONNX_INT8 = "model.int8.onnx"
TORCH_WEIGHTS = ("model.safetensors", INT8_WEIGHTS, "pytorch_model.bin")


def onnx_file(path: str | Path, flag: str = "--model") -> Path | None:
    """The ONNX graph a --model argument names, or None for a PyTorch model folder."""
    p = Path(path)
    if p.suffix == ".onnx":
        if not p.is_file():
            raise BertforgeError(f"{_named(flag, p)}: no such file")
        if not (p.parent / "config.json").is_file():
            raise BertforgeError(f"{_named(flag, p)}: an ONNX graph with no config.json beside it (use the folder "
                                 "`bertforge export` wrote)")
        return p
    if (p / ONNX_FP32).is_file() and not any((p / w).is_file() for w in TORCH_WEIGHTS):
        return p / ONNX_FP32
    return None


def check_family(folder: Path, config: dict[str, Any]) -> None:
    """One line when config.json's model_type names an encoder family whose tensor names model.safetensors does not
    use while other families' it does (an XLM-RoBERTa file under a config that says deberta-v2): the config and
    the weights disagree about the family, which the config's own fields would otherwise be blamed for."""
    weights = folder / "model.safetensors"
    fam = FAMILIES.get(config.get("model_type"))
    if fam is None or fam.stack != ENCODER or not weights.is_file():
        return
    try:
        held = weight_families(safetensors_shapes(weights))
    except BertforgeError:
        return  # an unreadable file is reported where the weights are loaded
    if held and config["model_type"] not in held:
        named_by = [str(a) for a in config.get("architectures") or []]  # the family its class names, first
        held.sort(key=lambda t: not any(a.startswith(FAMILIES[t].hf_prefix) for a in named_by))
        shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        raise BertforgeError(f"{folder / 'config.json'}: the config and the weights disagree about the model's "
                             f"family: model_type is {config['model_type']!r}, but {weights.name} names its tensors "
                             f"as another family does ({shown})")


def need_onnxruntime(path: str | Path, flag: str = "--model") -> None:
    """One line naming the `export` extra when an exported ONNX model is to run without onnxruntime: said when the
    folder is opened, before any data is read or any work done."""
    import importlib.util

    try:
        found = importlib.util.find_spec("onnxruntime") is not None
    except (ImportError, ValueError):  # a broken install, or a module hidden in sys.modules
        found = False
    if not found:
        raise BertforgeError(f"{_named(flag, path)}: an exported ONNX model; running it needs onnxruntime, which is "
                             "not installed: pip install 'bertforge[export]'")


def check_runtime(name: Any, flag: str = "--model") -> None:
    """`need_onnxruntime` for a model given by its local path, for verbs that read their input before they open
    the model (a Hub id brings no ONNX graph: only PyTorch weights are downloaded)."""
    if isinstance(name, (str, Path)) and Path(name).expanduser().exists():
        try:
            graph = onnx_file(Path(name).expanduser(), flag)
        except BertforgeError:
            return  # said when the folder is opened
        if graph is not None:
            need_onnxruntime(name, flag)


@dataclass(frozen=True)
class ModelFolder:
    path: Path                      # the folder with config.json and the tokenizer
    holds: str                      # one of HOLDS
    config: dict[str, Any]          # its config.json, as read
    model_config: Any = None        # the parsed config (ModelConfig / Seq2SeqConfig; `config_for` checks it
    #                                 against the weights); None for a BiLSTM student, or sentence-transformers
    #                                 modules with no config.json
    graph: Path | None = None       # an exported ONNX graph to run instead of PyTorch weights
    int8_weights: bool = False      # int8 weights on disk (`bertforge quantize`: model.int8.safetensors)
    flag: str = "--model"           # how messages name it
    _checked: list = field(default_factory=list, repr=False, compare=False)  # model_config checked against weights

    @classmethod
    def open(cls, name: "str | Path | ModelFolder", flag: str = "--model",
             revision: str | None = None) -> "ModelFolder":
        """The model folder (or exported .onnx file) `name` stands for, with its config.json read and parsed once;
        one line naming `flag` if it is no model folder. An opened folder is returned as it is."""
        if isinstance(name, ModelFolder):
            return name
        # a name resolved earlier in this call (the command line, the API) is not resolved again
        path = Path(name) if isinstance(name, ResolvedModel) else resolve_model_path(name, revision, flag)
        graph = onnx_file(path, flag)
        if graph is not None:
            need_onnxruntime(path, flag)
        folder = path.parent if path.suffix == ".onnx" else path
        if not (folder / "config.json").is_file() and (folder / "best" / "config.json").is_file():
            folder = folder / "best"
        if (folder / "config.json").is_file():
            config = read_config_json(folder)
        elif (folder / "modules.json").is_file():  # sentence-transformers modules, the Transformer in a sub-folder
            config = {}
        else:
            raise BertforgeError(f"{_named(flag, folder)}: not a model directory (no config.json)")
        holds = _holds(folder, config)
        if holds != "bilstm":
            check_family(folder, config)
        parsed = config_from_dict(config, str(folder / "config.json")) if config and holds != "bilstm" else None
        return cls(path=folder, holds=holds, config=config, model_config=parsed, graph=graph,
                   int8_weights=(folder / INT8_WEIGHTS).is_file(), flag=flag)

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
        """A classifier's or tagger's label names, in id order."""
        id2label = self.config.get("id2label") or {}
        return [id2label[str(i)] for i in range(len(id2label))] or None

    @property
    def quantised(self) -> bool:
        """Written by `bertforge quantize` (config.json says so): int8 weights, or (older bertforge versions) fp32
        weights whose int8 copy is made at load."""
        return bool(self.config.get(QUANT_FIELD))

    @property
    def int8(self) -> bool:
        """Runs as int8: int8 weights on disk, or a quantised folder of fp32 weights."""
        return self.int8_weights or self.quantised

    @property
    def int8_scheme(self) -> int:
        """The int8 recipe a quantised folder was written with (`model.int8.INT8_SCHEME`; 1 before it was
        recorded); the current one for a folder whose int8 copy is made at load."""
        field = self.config.get(QUANT_FIELD)
        if not self.int8_weights:
            return INT8_SCHEME
        scheme = field.get("scheme", 1) if isinstance(field, dict) else 1
        if scheme not in (1, 2):
            raise BertforgeError(f"{self.path / 'config.json'}: {QUANT_FIELD}.scheme {scheme!r} is not one this "
                                 "bertforge knows (1, 2); quantise the fp32 model again")
        return scheme

    def tokenizer(self) -> Any:
        """The folder's tokenizer, checked against the model's vocabulary."""
        from bertforge.tokenization import Tokenizer  # (tokenization sits below model; imported where used)
        vocab = self.model_config.vocab_size if self.model_config is not None else None
        return Tokenizer.from_pretrained(self.path, vocab_size=vocab)

    def config_for(self, *stacks: str, verb: str = "this command") -> Any:
        """A copy of the parsed config (each model built from the folder owns its own) when the folder's family
        builds one of `stacks` (families.ENCODER, ...); else one line saying what the folder holds."""
        cfg = self.model_config
        if cfg is None or cfg.stack not in stacks:
            what = f"{cfg.model_type} model ({cfg.stack})" if cfg is not None else f"{self.kind} model"
            raise BertforgeError(f"{_named(self.flag, self.path)}: holds a {what}, not {verb}")
        if not self._checked:  # before the first model is built (not at open: a verb reads its data first)
            check_against_weights(cfg, self.path / "model.safetensors", str(self.path / "config.json"))
            self._checked.append(True)
        return cfg.replace(extra=dict(cfg.extra))

    def require(self, *holds: str, verb: str = "this command") -> "ModelFolder":
        """The folder itself when it holds one of `holds`; else one line saying what it holds instead."""
        if self.holds not in holds:
            raise BertforgeError(f"{_named(self.flag, self.path)}: holds a {self.kind} model; {verb} needs "
                                 f"{' or '.join(holds)}")
        return self


def _holds(folder: Path, config: dict[str, Any]) -> str:
    family = FAMILIES.get(config.get("model_type"))
    if config.get("model_type") == BILSTM_MODEL_TYPE:
        return "bilstm"
    if family is not None and family.stack == ENCODER_DECODER:  # a fine-tuned one too: it still generates
        return "encoder-decoder"
    if family is not None and family.stack == DECODER:
        return "decoder"
    if isinstance(config.get("bertforge_task"), dict):
        return "task"
    return "sentence-encoder" if (folder / "modules.json").is_file() else "encoder"


def open_model_folder(name: "str | Path | ModelFolder", flag: str = "--model",
                      revision: str | None = None) -> ModelFolder:
    """`ModelFolder.open`: what every verb calls with the model string the user typed."""
    return ModelFolder.open(name, flag, revision)
