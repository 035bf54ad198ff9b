"""Hugging Face `config.json` files, for every config class alike: the one reader of the file (`read_config_json`),
the translation through the family's schema (`HFConfig.from_hf_dict`: the family's `read_config`, its strict
fields, the task fields kept in `extra`), and the check of a config against its weights' shapes before any model is
built (`check_against_weights`, reading only the safetensors header).

`ModelConfig` (encoders, the GPT-2 decoder) and `Seq2SeqConfig` (the encoder-decoders) are `HFConfig`s; each keeps
only what is its own: its fields, the stacks it configures, which of its fields are sizes, and how its layers are
counted in a checkpoint. `config_from_dict` / `config_from_file` return whichever of them the family builds.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, ClassVar

from bertforge.config.checks import check_fields
from bertforge.errors import BertforgeError
from bertforge.families import ENCODER_DECODER, FAMILIES, Family
from bertforge.io.read import read_json, safetensors_shapes

# config.json fields any PretrainedConfig dump holds (read and dropped: they describe the run or generation defaults,
# not the network); a family with a strict schema (`Family.config_fields`) accepts them besides its own.
GENERIC_FIELDS = {"architectures", "transformers_version", "dtype", "torch_dtype", "_name_or_path", "use_cache",
                  "is_encoder_decoder", "is_decoder", "return_dict", "output_hidden_states", "output_attentions",
                  "output_past", "torchscript", "chunk_size_feed_forward", "id2label", "label2id", "num_labels",
                  "problem_type", "task_specific_params", "tokenizer_class", "prefix", "gradient_checkpointing",
                  "finetuning_task", "bertforge", "bertforge_task",
                  # generation defaults of transformers 4 dumps (generation reads its own flags)
                  "max_length", "min_length", "num_beams", "no_repeat_ngram_size", "length_penalty",
                  "early_stopping", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty",
                  "num_return_sequences", "bad_words_ids", "diversity_penalty", "num_beam_groups"}
# What an encoder-decoder's file must say, whatever its family.
_STACK_FIXED = {ENCODER_DECODER: {"is_encoder_decoder": True, "is_decoder": False}}


def read_config_json(path: str | Path) -> dict[str, Any]:
    """The one reader of config.json files: `path` is the file or the folder holding it."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise BertforgeError(f"{path}: no such file (a model directory needs config.json)")
    return read_json(path)


class HFConfig:
    """What every config class shares: its family, reading config.json through the family's schema, and the check
    against the weights. A subclass sets the class attributes below and is a dataclass with a `model_type` and an
    `extra` field."""

    stacks: ClassVar[tuple[str, ...]] = ()         # the family stacks it configures
    kept_fields: ClassVar[tuple[str, ...]] = ()    # config.json fields kept in `extra` (task records, labels, ...)
    what: ClassVar[str] = "model"                  # what it configures, for messages
    model_type: str
    extra: dict[str, Any]

    @property
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    @property
    def stack(self) -> str:
        """What the model is: families.ENCODER, DECODER or ENCODER_DECODER."""
        return self.family.stack

    @classmethod
    def families(cls) -> dict[str, Family]:
        return {name: fam for name, fam in FAMILIES.items() if fam.stack in cls.stacks}

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> Any:
        """The config a config.json dict describes; one line naming `source` and the field for what is wrong."""
        check_fields(d, source)  # every field's type and range (config.checks), before the family reads them
        model_type = d.get("model_type")
        if model_type not in cls.families():
            raise BertforgeError(f"{source}: model_type {model_type!r} is not {cls.what} bertforge reads "
                                 f"({', '.join(cls.families())})")
        fam = FAMILIES[model_type]
        if fam.config_fields:
            for key in d:
                if key not in fam.config_fields and key not in GENERIC_FIELDS:
                    raise BertforgeError(f"{source}: unknown {model_type} config field {key!r}")
        for key, ok in {**_STACK_FIXED.get(fam.stack, {}), **fam.fixed_fields}.items():
            if key in d and d[key] != ok:
                raise BertforgeError(f"{source}: {model_type} with {key}={d[key]!r} is not supported "
                                     f"(bertforge computes {key}={ok!r})")
        try:
            settings = fam.read_config(fam, d, source, d.get("bertforge", {}))
            return cls(**settings, extra=cls.kept(fam, d))
        except KeyError as err:
            raise BertforgeError(f"{source}: missing field {err.args[0]!r} for model_type {model_type!r}") from None
        except BertforgeError as err:
            raise BertforgeError(str(err) if str(err).startswith(source) else f"{source}: {err}") from None

    @classmethod
    def kept(cls, fam: Family, d: dict[str, Any]) -> dict[str, Any]:
        """The fields of `d` that ride along in `extra` and are written back unchanged."""
        return {k: d[k] for k in (*cls.kept_fields, *fam.kept_fields) if k in d}

    @classmethod
    def from_file(cls, path: str | Path) -> Any:
        """The config in `path` (a config.json or its folder), checked against the folder's model.safetensors."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        cfg = cls.from_hf_dict(read_config_json(path), source=str(path))
        check_against_weights(cfg, path.parent / "model.safetensors", str(path))
        return cfg

    # ---- what each config class says about its shapes (see check_against_weights) ------------------------------
    def positive_fields(self) -> tuple[str, ...]:
        """Fields that must be at least 1."""
        raise NotImplementedError

    def size_fields(self) -> tuple[str, ...]:
        """Fields no larger than some dimension of the weights (refused beyond the largest before allocation)."""
        raise NotImplementedError

    def check_shapes(self, shapes: dict[str, tuple[int, ...]], refuse: Callable[[str, str], None]) -> None:
        """The checks of this config class against the tensor shapes: `refuse(field, what the file holds)`."""


def check_against_weights(cfg: HFConfig, weights: Path, source: str) -> None:
    """Refuse a config.json whose shapes `weights` (a model.safetensors) does not have, reading only its header.

    Runs before any model is built: a config claiming 100,000 layers or a vocabulary of 1e10 would otherwise
    allocate gigabytes first, and fewer layers than the file holds would load with the rest silently dropped. A
    size beyond every dimension in the file is refused here; a smaller mismatch is left to loading, whose message
    names the tensor and both shapes."""
    for name in cfg.positive_fields():
        if getattr(cfg, name) < 1:
            raise BertforgeError(f"{source}: {name} must be at least 1, got {getattr(cfg, name)}")
    if not weights.is_file():
        return
    shapes = safetensors_shapes(weights)

    def refuse(name: str, held: str) -> None:
        raise BertforgeError(f"{source}: {name} is {getattr(cfg, name)} but {weights.name} holds {held}; "
                             "this config.json does not describe these weights")

    cfg.check_shapes(shapes, refuse)
    largest = max((n for shape in shapes.values() for n in shape), default=None)
    for name in cfg.size_fields():
        if largest is not None and getattr(cfg, name) > largest:
            refuse(name, f"no tensor with a dimension of {getattr(cfg, name)} (the largest is {largest})")


def layer_counts(shapes: dict[str, tuple[int, ...]], pattern: re.Pattern) -> dict[str, int]:
    """Layers per stack found in tensor names: `pattern` matches a layer's name, group 1 the stack, group 2 the
    index."""
    found: dict[str, set[int]] = {}
    for name in shapes:
        if m := pattern.search(name):
            found.setdefault(m.group(1), set()).add(int(m.group(2)))
    return {stack: max(indices) + 1 for stack, indices in found.items()}


def config_from_dict(d: dict[str, Any], source: str = "config.json") -> Any:
    """The config of whichever class builds the family `d` names (ModelConfig, Seq2SeqConfig)."""
    fam = FAMILIES.get(d.get("model_type"))
    for cls in HFConfig.__subclasses__():
        if fam is not None and fam.stack in cls.stacks:
            return cls.from_hf_dict(d, source)
    raise BertforgeError(f"{source}: unknown model_type {d.get('model_type')!r} (bertforge reads "
                         f"{', '.join(FAMILIES)})")
