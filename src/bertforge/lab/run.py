"""`bertforge ablate --table`: pretrain every arm of a paper's table for the same wall clock (or, where the paper
compared at equal compute, the same estimated FLOPs), fine-tune each on a fixed downstream suite with one fixed
recipe, repeat over seeds, and write the table with the seed spread and a verdict per claim.

Resumable: each (arm, seed) keeps OUT/results/ARM-sSEED.json, rewritten after its pretraining and after each
fine-tuned task, so a killed table continues with the first missing piece (an interrupted pretraining restarts
that arm; a finished one is never redone). Arms shared by several tables (the BERT baseline is in three) are
pretrained once per seed. The same command again continues; other options are refused, naming the option.
"""
from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write_text
from bertforge.io.read import read_json
from bertforge.lab.flops import training_flops_per_token
from bertforge.lab.report import write_reports
from bertforge.lab.tables import CONTROL, CONTROL_DESCRIBE, RETRIEVAL, SUITE, Table, tables_named, tasks_of
from bertforge.io.rundir import claim_output_dir
from bertforge.training.config import parse_duration

MIN_BUDGET_S = 30.0  # below this an arm has barely left its warm-up: nothing worth fine-tuning
# Fine-tuning learning rate by size: the top of the grid Google's compact-BERT release searched (3e-4 ... 3e-5,
# Turc et al. 2019) for the smallest, BERT's own grid (2e-5 ... 5e-5) for base and large. Measured here: at 1e-4 a
# 2-minute bert-tiny left CoNLL at F1 0.00 after 3 epochs of 2,000 sentences (every token tagged O).
FINETUNE_LR = {"bert-tiny": 3e-4, "bert-mini": 3e-4, "bert-small": 1e-4, "bert-medium": 1e-4, "bert-l6-h384": 1e-4,
               "bert-base": 3e-5, "bert-large": 2e-5}


@dataclass
class LabOptions:
    tables: list[str]
    out: Path
    data_root: Path                 # ../shared/data: glue/SST-2, glue/MRPC, ..., conll2003, squad
    corpus: list[str] | None = None  # pretraining text (None: the embedded stdlib docs)
    budget: str = "2m"              # pretraining wall clock per arm
    steps: int | None = None        # instead: the same number of steps per arm (equal steps, not equal time)
    seeds: int = 2
    size: str = "bert-mini"
    seq_len: int = 128
    batch_size: int = 32
    vocab_size: int | None = None
    precision: str | None = None
    device: str = "auto"            # where the arms pretrain and fine-tune (not part of the setup: same numbers)
    threads: int | None = None
    tasks: list[str] | None = None  # None: each table's suite
    finetune_epochs: float = 3.0
    train_limit: int | None = None  # None: the suite's slice per task
    retriever: str | None = None    # realm table: the RAG arms' encoder (None: each seed's REALM document tower)
    overwrite: bool = False
    tables_: list[Table] = field(default_factory=list, repr=False)

    def setup(self) -> dict[str, Any]:
        """What the results depend on (a continued table must not change it), by option name."""
        return {"budget": None if self.steps else self.budget, "steps": self.steps, "size": self.size,
                "seq_len": self.seq_len, "batch_size": self.batch_size, "vocab_size": self.vocab_size,
                "precision": self.precision,
                "corpus": None if self.corpus is None else [str(Path(c).resolve()) for c in self.corpus],
                "downstream": str(Path(self.data_root).resolve()), "finetune_epochs": self.finetune_epochs,
                "finetune_lr": FINETUNE_LR[self.size], "train_limit": self.train_limit,
                "tables": self.tables, "seeds": self.seeds, "tasks": self.tasks, "threads": self.threads,
                "retriever": None if self.retriever is None else str(Path(self.retriever).resolve())}


def check_options(opts: LabOptions) -> list[Table]:
    """Every bad input in one clear line, before anything is trained."""
    tables = tables_named(opts.tables)
    if opts.steps is not None and opts.steps < 1:
        raise BertforgeError(f"--steps must be at least 1, got {opts.steps}")
    if opts.steps is None and parse_duration(opts.budget) < MIN_BUDGET_S:
        raise BertforgeError(f"--budget {opts.budget}: too small to pretrain anything worth fine-tuning "
                             f"(at least {MIN_BUDGET_S:.0f}s per arm)")
    if opts.seeds < 1:
        raise BertforgeError(f"--seeds must be at least 1, got {opts.seeds}")
    if opts.size not in FINETUNE_LR:
        raise BertforgeError(f"--size: unknown {opts.size!r} (choose from {', '.join(FINETUNE_LR)})")
    for task in opts.tasks or []:
        if task not in SUITE:
            raise BertforgeError(f"--tasks: unknown {task!r} (choose from {', '.join(SUITE)})")
    root = Path(opts.data_root)
    if not root.is_dir():
        raise BertforgeError(f"--downstream {root}: no such folder (the downstream data: glue/SST-2, glue/MRPC, "
                             "glue/RTE, glue/STS-B, conll2003, squad)")
    for table in tables:
        if table.kind == RETRIEVAL and not (root / "squad" / "dev-v1.1.json").is_file():
            raise BertforgeError(f"--downstream {root}: no squad/dev-v1.1.json (the {table.name} table's knowledge "
                                 "corpus and questions)")
    if opts.retriever is not None and not Path(opts.retriever).is_dir():
        raise BertforgeError(f"retriever {opts.retriever}: no such folder")
    for task in sorted({t for table in tables if table.kind != RETRIEVAL for t in tasks_of(table, opts.tasks)}):
        folder = root / SUITE[task][0]
        if not folder.is_dir():
            raise BertforgeError(f"--downstream {root}: no {SUITE[task][0]} folder (the {task} data)")
    for c in opts.corpus or []:
        if not Path(c).exists() and not any(ch in c for ch in "*?["):
            raise BertforgeError(f"--corpus {c}: no such file or folder")
    return tables


def run_lab(opts: LabOptions) -> dict[str, Any]:
    """Run (or continue) the tables; returns {table: report} and writes OUT/TABLE.md, .json, .png."""
    tables = check_options(opts)
    out = Path(opts.out)
    with claim_output_dir(out, resume=True, overwrite=opts.overwrite, options=opts.setup(),
                          may_change=("tables", "seeds", "tasks", "threads"), what="--out", resume_flag=None):
        return _run(opts, tables, out)


def _run(opts: LabOptions, all_tables: list[Table], out: Path) -> dict[str, Any]:
    from bertforge.device import default_precision

    opts.precision = opts.precision or default_precision(opts.device)
    tables = [t for t in all_tables if t.kind != RETRIEVAL]
    if tables:
        _run_pretraining_tables(opts, tables, all_tables, out)
    for table in all_tables:
        if table.kind == RETRIEVAL:
            from bertforge.lab.realm_table import run_realm_table

            run_realm_table(opts, table, out)
            write_reports(out, all_tables, opts, _records(out))
    return write_reports(out, all_tables, opts, _records(out))


def _run_pretraining_tables(opts: LabOptions, tables: list[Table], all_tables: list[Table], out: Path) -> None:
    from bertforge.pretraining.ablation import prepare_shared

    work = _work_list(tables, opts)
    runs = {(a, s) for a, s, _ in work if a != CONTROL}
    done = {key for key, r in _records(out).items() if "pretrain" in r}
    left = len(runs - done)
    each = f"{opts.steps} steps" if opts.steps else opts.budget
    todo = f"{left} to run" + ("" if opts.steps else
                               f", at least {left * parse_duration(opts.budget) / 60:.0f} min before fine-tuning")
    print(f"ablation lab: {', '.join(t.name for t in tables)}; {len(runs)} pretraining runs of {each} ({todo}), "
          f"{opts.size}, {opts.seeds} seed(s), and the untrained control", flush=True)
    shared = prepare_shared(opts.corpus, out, opts.seq_len, opts.batch_size, opts.vocab_size)
    relation_batches = _relation_batches(shared, opts)
    for i, (arm, seed, table) in enumerate(work, 1):
        record_path = out / "results" / f"{arm}-s{seed}.json"
        record = read_json(record_path) if record_path.is_file() else {"arm": arm, "seed": seed, "tasks": {}}
        tag = f"[{i}/{len(work)}] {table.name}: {arm}, seed {seed}"
        record.pop("error", None)  # a failed arm is tried again
        try:
            if "pretrain" not in record:
                print(f"\n{tag}: pretraining ({_length(table, arm, opts)})", flush=True)
                record["pretrain"] = _pretrain_arm(arm, seed, table, opts, shared, relation_batches, out)
                atomic_write_text(record_path, json.dumps(record, indent=2) + "\n")
            model_dir = _model_dir(out / "arms" / f"{arm}-s{seed}")
            for task in tasks_of(table, opts.tasks):
                if task in record["tasks"]:
                    continue
                t0 = time.perf_counter()
                record["tasks"][task] = finetune_task(model_dir, task, seed, opts,
                                                      out / "finetune" / f"{arm}-s{seed}")
                r = record["tasks"][task]
                print(f"{tag}: {task} {r['metric']} {r['score']:.4f} ({time.perf_counter() - t0:.0f}s)", flush=True)
                atomic_write_text(record_path, json.dumps(record, indent=2) + "\n")
        except Exception as err:  # noqa: BLE001 -- one arm's failure is reported; the table goes on
            record["error"] = f"{type(err).__name__}: {err}"
            atomic_write_text(record_path, json.dumps(record, indent=2) + "\n")
            print(f"{tag}: FAILED, the table goes on without it ({record['error']})", flush=True)
        write_reports(out, all_tables, opts, _records(out))  # after every arm: a killed table still has a report


def _work_list(tables: list[Table], opts: LabOptions) -> list[tuple[str, int, Table]]:
    """(arm, seed, table) in seed-major order (a stopped table has whole seeds), each pair once, FLOPs-matched
    arms after the arm whose FLOPs they get."""
    work, seen = [], set()
    for seed in range(opts.seeds):
        for table in tables:
            arms = sorted(table.arms, key=lambda a: a in table.flops_matched)  # stable: matched ones last
            for arm in arms:
                if (arm, seed, table.name) not in seen:
                    seen.add((arm, seed, table.name))
                    work.append((arm, seed, table))
    return work


def _length(table: Table, arm: str, opts: LabOptions) -> str:
    ref = table.flops_matched.get(arm)
    if arm == CONTROL:
        return "none: random initialisation"
    return f"the FLOPs of {ref}" if ref else f"{opts.steps} steps" if opts.steps else opts.budget


def _pretrain_arm(arm: str, seed: int, table: Table, opts: LabOptions, shared, relation_batches,
                  out: Path) -> dict[str, Any]:
    from bertforge.pretraining.ablation import run_arm

    if arm == CONTROL:
        return _untrained_arm(seed, opts, shared, _arm_dir(out, arm, seed))
    per_token = training_flops_per_token(_arm_configs(arm, opts, shared), opts.seq_len)
    budget, max_steps = (None, opts.steps) if opts.steps else (opts.budget, None)
    ref = table.flops_matched.get(arm)
    if ref is not None:  # equal compute: as many steps as the reference arm's FLOPs pay for
        ref_row = read_json(out / "results" / f"{ref}-s{seed}.json")["pretrain"]
        per_step = ref_row["tokens_seen"] / max(ref_row["steps"], 1)
        budget, max_steps = None, max(1, math.floor(ref_row["flops"] / (per_token * per_step)))
    row = run_arm(arm, shared, opts.size, opts.seq_len, opts.batch_size, budget, opts.precision, seed,
                  max_steps=max_steps, threads=opts.threads, out_name=f"{arm}-s{seed}",
                  extra_eval=lambda m: relation_accuracies(m, relation_batches, opts.precision), device=opts.device)
    row["flops"] = per_token * row["tokens_seen"]
    shutil.rmtree(_arm_dir(out, arm, seed) / "checkpoints", ignore_errors=True)  # the final model stays
    return row


def _untrained_arm(seed: int, opts: LabOptions, shared, arm_dir: Path) -> dict[str, Any]:
    """The control: the bert recipe's encoder at its seed's random initialisation, saved like a pretrained arm."""
    from bertforge.pretraining.ablation import BASE
    from bertforge.pretraining.objectives import build_objective
    from bertforge.pretraining.recipes import resolve
    from bertforge.tokenization import Tokenizer

    tok = Tokenizer.from_pretrained(shared.out / "tokenizer")
    recipe = resolve(BASE, objective="mlm")
    cfg = _model_config(recipe, opts, tok)
    torch.manual_seed(seed)
    model = build_objective(recipe.objective, cfg)
    model.save_pretrained(arm_dir, tokenizer=tok)
    print(f"{CONTROL}: saved a randomly initialised {opts.size} encoder (seed {seed}) -> {arm_dir}", flush=True)
    return {"arm": CONTROL, "describe": CONTROL_DESCRIBE, "recipe": None, "family": cfg.model_type,
            "objective": None, "parameters": sum(p.numel() for p in model.parameters()), "steps": 0,
            "tokens_seen": 0, "flops": 0.0, "train_seconds": 0.0, "heldout_mlm_acc": None, "common": {}}


def _arm_dir(out: Path, arm: str, seed: int) -> Path:
    return out / "arms" / f"{arm}-s{seed}"


def _model_config(recipe, opts: LabOptions, tok) -> ModelConfig:
    """The encoder `bertforge pretrain` builds for `recipe` at the lab's size with the shared tokenizer."""
    return recipe.model_config(opts.size, tok.vocab_size, tok.pad_token_id or 0, opts.seq_len)


def _arm_configs(arm: str, opts: LabOptions, shared) -> dict[str, Any]:
    """What the arm's training FLOPs are counted for: its objective and the configs its recipe builds."""
    from bertforge.families.electra import RTD_OBJECTIVE
    from bertforge.pretraining.ablation import ARMS
    from bertforge.pretraining.objectives import generator_config, rtd_config
    from bertforge.pretraining.recipes import resolve
    from bertforge.tokenization import Tokenizer

    recipe = resolve(ARMS[arm]["recipe"], **ARMS[arm]["over"])
    main = _model_config(recipe, opts, Tokenizer.from_pretrained(shared.out / "tokenizer"))
    gen = generator_config(rtd_config(main)) if recipe.objective == RTD_OBJECTIVE else None
    return {"objective": recipe.objective, "mask_prob": recipe.mask_prob, "model": main, "generator": gen}


def _model_dir(arm_dir: Path) -> Path:
    """What is fine-tuned: the arm's encoder (ELECTRA: its discriminator)."""
    return arm_dir / "discriminator" if (arm_dir / "discriminator").is_dir() else arm_dir


def _records(out: Path) -> dict[tuple[str, int], dict]:
    found = {}
    for p in sorted((out / "results").glob("*.json")):
        r = read_json(p)
        found[(r["arm"], int(r["seed"]))] = r
    return found


# ---- downstream ---------------------------------------------------------------------------------------------------
def finetune_task(model_dir: Path, task: str, seed: int, opts: LabOptions, work: Path) -> dict[str, Any]:
    """Fine-tune `model_dir` on `task` with the lab's fixed recipe; the dev score of the best epoch (the model
    itself is deleted: only its numbers are kept)."""
    from bertforge.tasks.config import FinetuneConfig
    from bertforge.tasks.finetune import finetune

    folder, train_n, eval_n = SUITE[task]
    cfg = FinetuneConfig(task=task, model=model_dir, out=work / task, data=Path(opts.data_root) / folder,
                         epochs=opts.finetune_epochs, lr=FINETUNE_LR[opts.size], batch_size=32, seed=seed,
                         train_limit=opts.train_limit or train_n, eval_limit=eval_n, precision=opts.precision or "fp32",
                         device=opts.device, progress=False, save_checkpoints=False)
    t0 = time.perf_counter()
    res = finetune(cfg, overwrite=True)
    run = res.runs[0]
    shutil.rmtree(work / task, ignore_errors=True)
    return {"metric": res.main_metric, "score": float(run["best"].get(res.main_metric, float("nan"))),
            "best": run["best"], "train_examples": run["train_examples"], "steps": run["steps"],
            "seconds": round(time.perf_counter() - t0, 1)}


# ---- ALBERT's cross-task sentence scores --------------------------------------------------------------------------
def _relation_batches(shared, opts: LabOptions) -> dict[str, list[dict]]:
    """Held-out NSP and SOP batches (fixed masks and pairs), for scoring any sentence head on both tasks."""
    from bertforge.data import ShardedCorpus
    from bertforge.pretraining.ablation import BASE
    from bertforge.pretraining.inputs import heldout_batches
    from bertforge.pretraining.recipes import resolve

    held = ShardedCorpus(shared.data_dir, split="heldout", heldout_fraction=shared.heldout_fraction)
    return {task: heldout_batches(held, resolve(BASE, objective=f"mlm+{task}"), opts.seq_len, opts.batch_size,
                                  n_batches=10) for task in ("nsp", "sop")}


@torch.no_grad()
def relation_accuracies(model: nn.Module, batches: dict[str, list[dict]], precision: str | None) -> dict[str, float]:
    """{"cross_nsp_acc", "cross_sop_acc"}: the model's sentence head (NSP or SOP, whichever it trained) scored on
    both tasks; {} for a model without one. ALBERT's finding: an SOP head solves NSP, an NSP head not SOP."""
    head = getattr(getattr(model, "cls", None), "seq_relationship", None)
    if head is None:
        return {}
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    scores = {}
    for task, task_batches in batches.items():
        right = total = 0
        for b in task_batches:
            b = {k: v.to(device) for k, v in b.items()}
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                pooled = model.bert(b["input_ids"], b["attention_mask"], b["token_type_ids"]).pooler_output
                logits = head(pooled)  # inside autocast: bf16 activations meet fp32 weights there
            right += int((logits.argmax(-1) == b["sentence_label"]).sum())
            total += len(b["sentence_label"])
        scores[f"cross_{task}_acc"] = right / max(total, 1)
    model.train(was_training)
    return scores


