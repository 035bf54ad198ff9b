"""What one pretraining run is asked to do (`PretrainOptions`) and the defaults that depend on the machine or on
the model size: threads, learning rate and warm-up (the precision's is `device.default_precision`)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from torch import nn

from bertforge.config.sizes import SIZES
from bertforge.config import ModelConfig
from bertforge.data.corpus import find_files
from bertforge.errors import BertforgeError
from bertforge.families import SIZE_PREFIX
from bertforge.pretraining.recipes import Recipe, shape_name, size_of

DEFAULT_VOCAB_EMBEDDED = 8192   # the small stdlib-docs corpus: a small vocabulary trains fast and fits it
DEFAULT_VOCAB = 30522
PREPARE_HELDOUT = 0.05   # held-out share of shards this driver prepares itself


@dataclass
class PretrainOptions:
    recipe: Recipe
    out: Path
    corpus: list[str] | None = None        # None: the embedded stdlib-documentation corpus
    text_col: str | None = None            # the corpus tables' (jsonl files') text column (None: the usual names)
    data: Path | None = None               # shards from `bertforge prepare` (skips tokenising)
    tokenizer: Path | None = None
    vocab_size: int | None = None
    size: str = f"{SIZE_PREFIX}mini"
    seq_len: int = 128
    batch_size: int = 32
    max_steps: int | None = None
    time_budget: str | float | None = None
    lr: float | None = None                # None: the size's default (see `schedule`)
    warmup_ratio: float | None = None      # None: the size's default
    precision: str = "fp32"
    seed: int = 0
    resume: bool = False                   # continue the run in `out` (its options and data must not change)
    overwrite: bool = False                # replace an earlier run in `out` (refused without this or resume)
    init_from: Path | None = None
    heldout_fraction: float | None = None  # None: what the shards' manifest says (PREPARE_HELDOUT when made here)
    eval_batches: int = 20
    log_every: int = 10
    save_every: int | None = None
    workers: int | None = None  # tokenising processes (None: one per core where the corpus is big enough)
    threads: int | None = None             # torch threads per process; None: its share of the cores
    progress: bool = True
    device: str = "auto"                   # auto | cpu | cuda | cuda:N (with torchrun: each rank its own GPU)
    compile: bool | None = None            # torch.compile the model while training (None: on a GPU only)
    report_to: tuple[str, ...] = ()        # trackers besides metrics.jsonl (TrainConfig.report_to)
    logging_dir: Path | None = None        # TensorBoard's event folder (default: OUT/runs)
    fill_mask_examples: int = 3
    extra_eval: Callable[[nn.Module], dict[str, float]] | None = None  # run on the final model (ablation)
    # named held-out corpora, each scored like the held-out split at the end (held-out MLM per language ...)
    heldout_sets: dict[str, list[str]] = field(default_factory=dict)
    # --recipe realm (pretraining.realm): the knowledge passages, the towers' initial retriever, the index refresh
    # interval in steps, the documents retrieved per sentence, the towers' vector size, the salient spans' tagger
    knowledge: Path | None = None
    retriever: Path | None = None
    refresh_every: int = 500
    realm_k: int = 8
    projection_dim: int = 128
    ner_model: Path | None = None


def named_heldout_sets(specs: list[str]) -> dict[str, list[str]]:
    """`--heldout NAME=PATH ...` -> {NAME: [PATH]} (a PATH without NAME= is named by its file's stem); a missing file
    or a name given twice is one line."""
    sets: dict[str, list[str]] = {}
    for spec in specs:
        name, _, path = spec.partition("=") if "=" in spec else (Path(spec).name.split(".")[0], "", spec)
        if not name or not path or name in sets:
            raise BertforgeError(f"--heldout {spec}: give NAME=PATH with a name of its own")
        find_files([path])  # names a missing file or an empty pattern
        sets[name] = [path]
    return sets


def schedule(opts: PretrainOptions, cfg: ModelConfig) -> tuple[float, float, str]:
    """(peak lr, warm-up ratio, the size they were chosen for). An explicit --lr wins; otherwise the size's rate
    (bertforge.config.SIZES) times the recipe's scale. A --init-from checkpoint is sized by its own shape."""
    size = size_of(cfg) if opts.init_from is not None else opts.size
    lr = opts.lr if opts.lr is not None else opts.recipe.default_lr(size)
    warmup = opts.warmup_ratio if opts.warmup_ratio is not None else SIZES[shape_name(size)].pretrain_warmup
    return lr, warmup, size


def auto_threads(world_size: int = 1) -> int:
    """Torch threads per process: this process's share of the cores (`--threads` overrides).

    Not load-dependent: the load average counts this run's own tokenising and preparation, so subtracting it
    starved the training that follows. On a machine shared with other jobs, pass --threads.
    """
    return max(1, (os.cpu_count() or 1) // max(world_size, 1))
