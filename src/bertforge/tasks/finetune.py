"""Fine-tuning driver: data -> features -> length-grouped batches -> the shared Trainer -> best checkpoint.

    cfg = FinetuneConfig(task="sst2", model="path/to/bert", out="runs/sst2", data="glue/SST-2")
    result = finetune(cfg)           # result.summary: median / min / max / std of the main metric over --runs

Defaults are the BERT paper's: AdamW (weight decay 0.01), lr 3e-5 (2e-5..5e-5 is the useful range), 10 % linear
warm-up then linear decay, batch 32, 3 epochs, evaluation after every epoch; the best checkpoint is kept in
`out/best` (an HF directory; see `bertforge.tasks.models`). SQuAD trains on sliding-window features and is scored
after n-best span post-processing; for SQuAD 2.0 the no-answer threshold is tuned on the eval set and stored in
config.json. `freeze=True` is the paper's feature-based mode: a frozen encoder feeding a linear or BiLSTM head.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from bertforge.checkpoint import atomic_write_text, load_pretrained
from bertforge.errors import BertforgeError
from bertforge.tasks import features as F
from bertforge.tasks import metrics as M
from bertforge.tasks import readers as R
from bertforge.tasks import squad as S
from bertforge.tasks.models import init_from_pretrained, load_task_model, save_task_model

log = logging.getLogger(__name__)

# task name -> kind; GLUE-style names use their readers.TASKS spec
TASK_KINDS = {"sst2": "classify", "cola": "classify", "mrpc": "classify", "stsb": "regress", "rte": "classify",
              "qnli": "classify", "mnli": "classify", "snli": "classify", "conll": "tag", "squad": "qa",
              "squad2": "qa", "swag": "choice", "classify": "classify", "regress": "regress", "tag": "tag",
              "qa": "qa", "choice": "choice"}
TASKS = tuple(TASK_KINDS)
MAIN_METRIC = {"classify": "accuracy", "regress": "spearman", "tag": "f1", "qa": "f1", "choice": "accuracy"}


@dataclass
class FinetuneConfig:
    """Everything one fine-tuning job needs. `data` is a task folder or file; `train`/`eval` name files directly."""

    task: str
    model: str | Path
    out: str | Path
    data: str | Path | None = None
    train: str | Path | None = None
    eval: str | Path | None = None
    epochs: float = 3.0
    max_steps: int | None = None
    lr: float = 3e-5
    batch_size: int = 32
    eval_batch_size: int = 64
    max_seq_len: int | None = None  # None: 128, or 384 for SQuAD
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    seed: int = 42
    runs: int = 1
    freeze: bool = False
    features: str = "concat_last4"
    head: str = "linear"
    text_col: str = "text"
    text_pair_col: str | None = None
    label_col: str = "label"
    resume: bool = False
    precision: str = "fp32"
    group_by_length: bool = True
    train_limit: int | None = None  # first N training examples (quick runs, benchmarks)
    eval_limit: int | None = None
    doc_stride: int = 128
    max_query_length: int = 64
    device: str = "auto"
    progress: bool = True
    save_checkpoints: bool = True  # per-epoch trainer checkpoints (needed for --resume)

    def __post_init__(self) -> None:
        self.task = self.task.lower().replace("-", "").replace("_", "")
        if self.task not in TASK_KINDS:
            raise BertforgeError(f"unknown task {self.task!r} (choose from {', '.join(TASKS)})")
        if self.runs < 1:
            raise BertforgeError(f"--runs must be at least 1, got {self.runs}")
        if self.max_seq_len is None:
            self.max_seq_len = 384 if self.kind == "qa" else 128
        if self.freeze and self.kind not in ("classify", "regress", "tag"):
            raise BertforgeError(f"--freeze (feature-based mode) supports classification, regression and tagging, "
                                 f"not {self.task}")

    @property
    def kind(self) -> str:
        return TASK_KINDS[self.task]


# ---- rows, batches and forward passes --------------------------------------------------------------------------------
PAD_VALUES = {"input_ids": None, "token_type_ids": 0, "attention_mask": 0, "labels": F.IGNORE_INDEX,
              "word_index": -1}


def unpad(batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Split a padded feature dict into per-example rows trimmed to their real length (for length-grouping)."""
    lengths = batch["attention_mask"].sum(-1)
    if lengths.dim() == 2:  # multiple choice: keep every choice as long as its longest
        lengths = lengths.max(-1).values
    rows = []
    for i, n in enumerate(lengths.tolist()):
        row = {}
        for k, v in batch.items():
            row[k] = v[i][..., :n] if v.dim() >= 2 and v.shape[-1] == batch["attention_mask"].shape[-1] else v[i]
        rows.append(row)
    return rows


def make_collate(pad_id: int) -> Callable[[list[dict]], dict[str, torch.Tensor]]:
    """Pad rows to the longest in the batch (token-level keys) and stack scalars (labels, positions)."""

    def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        t = max(r["input_ids"].shape[-1] for r in rows)
        out = {}
        for key in rows[0]:
            vals = [r[key] for r in rows]
            if key in PAD_VALUES and vals[0].dim() >= 1 and (key != "labels" or vals[0].dim() == rows[0]["input_ids"].dim()):
                fill = pad_id if key == "input_ids" else PAD_VALUES[key]
                vals = [torch.nn.functional.pad(v, (0, t - v.shape[-1]), value=fill) for v in vals]
            out[key] = torch.stack(vals)
        return out

    return collate


def row_length(row: dict[str, torch.Tensor]) -> int:
    return int(row["input_ids"].shape[-1])


def forward_rows(model: nn.Module, rows: list[dict], collate, batch_size: int, keys: tuple[str, ...],
                 desc: str = "eval", progress: bool = True) -> list[dict[str, torch.Tensor]]:
    """Run the model over rows (sorted by length for speed), returning each row's outputs (trimmed) in order."""
    device = next(model.parameters()).device
    order = sorted(range(len(rows)), key=lambda i: -row_length(rows[i]))
    results: list[dict[str, torch.Tensor] | None] = [None] * len(rows)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False):
            idx = order[start:start + batch_size]
            batch = collate([{k: v for k, v in rows[i].items() if k in ("input_ids", "token_type_ids",
                                                                         "attention_mask")} for i in idx])
            out = model(**{k: v.to(device) for k, v in batch.items()})
            for j, i in enumerate(idx):
                n = row_length(rows[i])
                # token-level outputs ([B, T, K] logits, [B, T] start/end) lose their padding; [B, K] stay whole
                token_level = lambda k: out[k].dim() == 3 or k in ("start_logits", "end_logits")  # noqa: E731
                results[i] = {k: (out[k][j][:n] if token_level(k) else out[k][j]).float().cpu() for k in keys}
    model.train(was_training)
    return results  # type: ignore[return-value]


# ---- per-task data -----------------------------------------------------------------------------------------------
@dataclass
class TaskData:
    """Training rows for the loader plus an `evaluate(model) -> metrics` closure over the eval split."""

    kind: str
    labels: list[str] | None
    main_metric: str
    train_rows: list[dict]
    evaluate: Callable[[nn.Module], dict[str, float]] | None
    task_info: dict[str, Any] = field(default_factory=dict)


def _find(folder: Path, stems: tuple[str, ...], exts: tuple[str, ...]) -> Path | None:
    for stem in stems:
        for ext in exts:
            if (folder / f"{stem}{ext}").is_file():
                return folder / f"{stem}{ext}"
    return None


TRAIN_STEMS = ("train",)
EVAL_STEMS = {"dev": ("dev", "dev_matched", "valid", "validation", "val", "eval"), "test": ("test",)}
EXTS = {"classify": (".tsv", ".csv", ".jsonl", ".json"), "regress": (".tsv", ".csv", ".jsonl", ".json"),
        "tag": (".txt", ".conll", ".tsv"), "choice": (".csv", ".jsonl", ".json"), "qa": (".json",)}


def resolve_files(cfg: FinetuneConfig, split: str = "dev", need_train: bool = True) -> tuple[Path | None, Path | None]:
    """(train file, eval file) from --train/--eval or the --data folder; SQuAD may give one file (split later)."""
    train = Path(cfg.train) if cfg.train else None
    evalf = Path(cfg.eval) if cfg.eval else None
    if cfg.data is not None:
        data = Path(cfg.data)
        if data.is_file():
            if cfg.kind == "qa":
                evalf = evalf or data
            elif need_train:
                train = train or data
            else:
                evalf = evalf or data
        elif data.is_dir():
            exts = EXTS[cfg.kind]
            if cfg.kind == "qa":
                train = train or next(iter(sorted(data.glob("train*.json"))), None)
                evalf = evalf or next(iter(sorted(data.glob(f"{split}*.json"))), None)
            else:
                train = train or _find(data, TRAIN_STEMS, exts)
                evalf = evalf or _find(data, EVAL_STEMS.get(split, (split,)), exts)
        else:
            raise BertforgeError(f"--data {data}: no such file or folder")
    for p in (train, evalf):
        if p is not None and not p.is_file():
            raise BertforgeError(f"{p}: no such file")
    if need_train and train is None and not (cfg.kind == "qa" and evalf is not None):
        where = f" in {cfg.data}" if cfg.data else ""
        raise BertforgeError(f"no training file found{where} (expected train{EXTS[cfg.kind][0]}; or pass --train FILE)")
    return train, evalf


def _limit(xs: list, n: int | None) -> list:
    return xs if n is None else xs[:n]


def prepare(cfg: FinetuneConfig, tokenizer, split: str = "dev", need_train: bool = True,
            labels: list[str] | None = None, task_info: dict | None = None) -> TaskData:
    """Read, encode and wrap the task's data. `labels` (from a saved model) fixes the label list when given."""
    train_file, eval_file = resolve_files(cfg, split, need_train)
    kind = cfg.kind
    info = dict(task_info or {})
    info.update(name=cfg.task, max_seq_len=cfg.max_seq_len)
    pad = tokenizer.pad_token_id
    collate = make_collate(pad)

    if kind in ("classify", "regress"):
        spec = R.TASKS.get(cfg.task)
        regression = kind == "regress"

        def read(path: Path, label_list):
            if spec is not None:
                return spec.read(path), (list(spec.labels) if spec.labels else None)
            return R.read_table(path, cfg.text_col, cfg.text_pair_col, cfg.label_col, label_list=label_list,
                                regression=regression)

        train_ex = []
        if need_train and train_file is not None:
            train_ex, found = read(train_file, labels)
            labels = labels or found
        eval_ex = []
        if eval_file is not None:
            eval_ex, found = read(eval_file, labels)
            labels = labels or found
        if not regression and not labels:
            raise BertforgeError("no labels found in the data (is --label-col right?)")
        train_ex, eval_ex = _limit(train_ex, cfg.train_limit), _limit(eval_ex, cfg.eval_limit)
        label_list = None if regression else labels
        train_rows = unpad(F.encode_text_examples(train_ex, tokenizer, label_list, cfg.max_seq_len)) if train_ex else []
        info.update(text_col=cfg.text_col, text_pair_col=cfg.text_pair_col)
        evaluate = None
        if eval_ex:
            eval_rows = unpad(F.encode_text_examples(eval_ex, tokenizer, label_list, cfg.max_seq_len))

            def evaluate(model: nn.Module) -> dict[str, float]:
                outs = forward_rows(model, eval_rows, collate, cfg.eval_batch_size, ("logits",),
                                    progress=cfg.progress)
                logits = torch.stack([o["logits"] for o in outs])
                gold = torch.stack([r["labels"] for r in eval_rows]).numpy()
                return text_metrics(cfg.task, kind, logits, gold, len(labels or []))
        return TaskData(kind, None if regression else list(labels), main_metric(cfg.task, kind), train_rows,
                        evaluate, info)

    if kind == "tag":
        train_ex = R.read_conll(train_file) if need_train and train_file else []
        eval_ex = R.read_conll(eval_file) if eval_file else []
        labels = labels or R.tag_list(train_ex + eval_ex)
        train_ex, eval_ex = _limit(train_ex, cfg.train_limit), _limit(eval_ex, cfg.eval_limit)
        train_rows = []
        if train_ex:
            train_rows = unpad(F.encode_tagging_examples(train_ex, tokenizer, labels, cfg.max_seq_len))
            for r in train_rows:
                r.pop("word_index")
        evaluate = None
        if eval_ex:
            eval_rows = unpad(F.encode_tagging_examples(eval_ex, tokenizer, labels, cfg.max_seq_len))

            def evaluate(model: nn.Module) -> dict[str, float]:
                outs = forward_rows(model, eval_rows, collate, cfg.eval_batch_size, ("logits",),
                                    progress=cfg.progress)
                pred = [predicted_tags(o["logits"], r["word_index"], len(ex.tokens), labels)
                        for o, r, ex in zip(outs, eval_rows, eval_ex)]
                return M.ner_metrics([ex.tags for ex in eval_ex], pred)
        return TaskData(kind, list(labels), "f1", train_rows, evaluate, info)

    if kind == "choice":
        train_ex = R.read_swag(train_file) if need_train and train_file else []
        eval_ex = _limit(R.read_swag(eval_file), cfg.eval_limit) if eval_file else []
        train_ex = _limit(train_ex, cfg.train_limit)
        train_rows = unpad(F.encode_choice_examples(train_ex, tokenizer, cfg.max_seq_len)) if train_ex else []
        evaluate = None
        if eval_ex:
            eval_rows = unpad(F.encode_choice_examples(eval_ex, tokenizer, cfg.max_seq_len))

            def evaluate(model: nn.Module) -> dict[str, float]:
                outs = forward_rows(model, eval_rows, collate, cfg.eval_batch_size, ("logits",),
                                    progress=cfg.progress)
                pred = [int(o["logits"].argmax()) for o in outs]
                return {"accuracy": M.accuracy(pred, [int(r["labels"]) for r in eval_rows])}
        return TaskData(kind, None, "accuracy", train_rows, evaluate, info)

    # extractive QA
    version_2 = cfg.task == "squad2" or info.get("version_2", False)
    train_ex = S.read_squad(train_file) if need_train and train_file else []
    eval_ex = S.read_squad(eval_file) if eval_file else []
    if need_train and not train_ex and eval_ex:  # the shared data has only dev-v1.1: split it by article
        n_articles = len({ex.article for ex in eval_ex})
        train_ex, eval_ex = S.split_by_article(eval_ex, n_articles // 2)
        # stored with the model so that `evaluate` scores the same held-out articles, not the trained-on ones
        info.update(num_train_articles=n_articles // 2, split_file=Path(eval_file).name)
        log.warning("no SQuAD train file: training on the first %d articles of %s, evaluating on the other %d",
                    n_articles // 2, eval_file, n_articles - n_articles // 2)
    elif need_train:
        info.pop("num_train_articles", None), info.pop("split_file", None)
    elif eval_ex and info.get("num_train_articles") and info.get("split_file") == Path(eval_file).name:
        _, eval_ex = S.split_by_article(eval_ex, int(info["num_train_articles"]))
        log.warning("%s: evaluating on the %d held-out articles (the model trained on the first %d)",
                    eval_file, len({ex.article for ex in eval_ex}), info["num_train_articles"])
    version_2 = version_2 or any(ex.is_impossible for ex in train_ex + eval_ex)
    fixed_tau = not need_train and "null_threshold" in info
    if not need_train:  # evaluating a saved model: features as it was trained, unless the user chose otherwise
        defaults = FinetuneConfig.__dataclass_fields__
        for name in ("doc_stride", "max_query_length"):
            if info.get(name) and getattr(cfg, name) == defaults[name].default:
                setattr(cfg, name, int(info[name]))
    info.update(version_2=version_2, doc_stride=cfg.doc_stride, max_query_length=cfg.max_query_length)
    train_ex, eval_ex = _limit(train_ex, cfg.train_limit), _limit(eval_ex, cfg.eval_limit)
    qa_args = dict(max_seq_length=cfg.max_seq_len, doc_stride=cfg.doc_stride, max_query_length=cfg.max_query_length)
    train_rows = unpad(S.build_squad_features(train_ex, tokenizer, **qa_args).tensors()) if train_ex else []
    evaluate = None
    if eval_ex:
        feats = S.build_squad_features(eval_ex, tokenizer, **qa_args)
        eval_rows = unpad(feats.tensors(labels=False))

        def evaluate(model: nn.Module) -> dict[str, float]:
            start, end = qa_logits(model, eval_rows, collate, cfg, feats.input_ids.shape[1])
            preds = S.postprocess(eval_ex, feats, start, end, version_2=version_2)
            refs = S.references(eval_ex)
            if not version_2:
                return M.squad_v1_metrics(preds.predictions, refs)
            # exact / f1 at the fixed threshold 0 (null answer when its score beats the best span), so the
            # headline numbers are not tuned on the data they score; best_* are the tuned (optimistic) ones
            scores = M.squad_v2_metrics(preds.best_non_null, refs, na_probs=preds.null_diffs, na_prob_thresh=0.0)
            if fixed_tau:  # evaluating a saved model: report the threshold tuned when it was trained
                tau = float(info["null_threshold"])
            else:
                tau = float(scores["best_f1_thresh"])
                info["null_threshold"] = tau  # used by `predict`; saved with the checkpoint this eval may make best
            return {k: v for k, v in scores.items() if not k.endswith("total")} | {"null_threshold": tau}
    return TaskData(kind, None, "f1", train_rows, evaluate, info)


def main_metric(task: str, kind: str) -> str:
    spec = R.TASKS.get(task)
    return spec.main_metric if spec is not None else MAIN_METRIC[kind]


def text_metrics(task: str, kind: str, logits: torch.Tensor, gold: np.ndarray, num_labels: int) -> dict[str, float]:
    """GLUE metrics for GLUE tasks; accuracy + macro F1 (classify) or Pearson/Spearman (regress) otherwise."""
    if kind == "regress":
        pred = logits.squeeze(-1).numpy()
        if task in R.TASKS:
            return M.compute_metrics(task, pred, gold)
        return {"pearson": M.pearson(pred, gold), "spearman": M.spearman(pred, gold), "mse": float(((pred - gold) ** 2).mean())}
    pred = logits.argmax(-1).numpy()
    if task in R.TASKS:
        return M.compute_metrics(task, pred, gold)
    from sklearn.metrics import f1_score

    return {"accuracy": M.accuracy(pred, gold),
            "macro_f1": float(f1_score(gold, pred, average="macro", labels=list(range(num_labels)), zero_division=0))}


def predicted_tags(logits: torch.Tensor, word_index: torch.Tensor, num_words: int, labels: list[str]) -> list[str]:
    """One example's word tags from its token logits (first sub-token of each word)."""
    return F.tags_from_token_predictions(logits.argmax(-1)[None], word_index[None], [num_words], labels)[0]


def qa_logits(model: nn.Module, rows: list[dict], collate, cfg: FinetuneConfig, width: int):
    """Start/end logits [F, width] for postprocess (trimmed padding refilled with a very low score)."""
    outs = forward_rows(model, rows, collate, cfg.eval_batch_size, ("start_logits", "end_logits"),
                        progress=cfg.progress)
    start = torch.full((len(rows), width), -1e4)
    end = torch.full((len(rows), width), -1e4)
    for i, o in enumerate(outs):
        n = o["start_logits"].shape[0]
        start[i, :n], end[i, :n] = o["start_logits"], o["end_logits"]
    return start, end


# ---- training --------------------------------------------------------------------------------------------------------
@dataclass
class FinetuneResult:
    runs: list[dict[str, Any]]  # per run: seed, best metrics, out dir, train examples/s
    main_metric: str
    summary: dict[str, float]  # median, min, max, std of the main metric over the runs
    best_dir: Path


def summarize(values: list[float]) -> dict[str, float]:
    return {"median": float(statistics.median(values)), "min": float(min(values)), "max": float(max(values)),
            "std": float(statistics.pstdev(values)) if len(values) > 1 else 0.0, "n": len(values)}


def load_model_dir(path: str | Path) -> Path:
    """A model directory; a fine-tuning output folder resolves to its best/ checkpoint."""
    p = Path(path)
    if not (p / "config.json").is_file() and (p / "best" / "config.json").is_file():
        return p / "best"
    if not (p / "config.json").is_file():
        raise BertforgeError(f"{p}: not a model directory (no config.json)")
    return p


def finetune(cfg: FinetuneConfig) -> FinetuneResult:
    """Fine-tune `cfg.runs` times (seeds seed, seed+1, ...); the best run's best checkpoint ends in out/best."""
    from bertforge.tokenization import Tokenizer

    model_dir = load_model_dir(cfg.model)
    tokenizer = Tokenizer.from_pretrained(model_dir)
    data = prepare(cfg, tokenizer)
    if not data.train_rows:
        raise BertforgeError("the training split is empty")
    if data.evaluate is None:
        log.warning("no evaluation file: the last checkpoint is kept as out/best")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for r in range(cfg.runs):
        run_dir = out if cfg.runs == 1 else out / f"run-{r}"
        done = run_dir / "run_result.json"
        if cfg.resume and done.is_file():  # a finished run of an interrupted --runs job
            runs.append(json.loads(done.read_text(encoding="utf-8")))
            continue
        runs.append(train_one(cfg, model_dir, tokenizer, data, run_dir, cfg.seed + r))
        atomic_write_text(done, json.dumps(runs[-1], indent=2) + "\n")
    values = [run["best"][data.main_metric] for run in runs if data.main_metric in run["best"]]
    summary = summarize(values) if values else {}
    best_run = max(range(len(runs)), key=lambda i: runs[i]["best"].get(data.main_metric, -math.inf))
    best_dir = out / "best"
    if cfg.runs > 1:  # copy the winning run's checkpoint to out/best (temp dir then rename)
        src = Path(runs[best_run]["out"]) / "best"
        tmp = out / ".best-tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        shutil.rmtree(best_dir, ignore_errors=True)
        tmp.rename(best_dir)
    result = FinetuneResult(runs, data.main_metric, summary, best_dir)
    atomic_write_text(out / "results.json", json.dumps(
        {"task": cfg.task, "main_metric": data.main_metric, "summary": summary, "runs": runs,
         "best_run": best_run, "config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str))},
        indent=2) + "\n")
    return result


def train_one(cfg: FinetuneConfig, model_dir: Path, tokenizer, data: TaskData, run_dir: Path,
              seed: int) -> dict[str, Any]:
    """One fine-tuning run; returns its record (best metrics, throughput)."""
    from bertforge.train import ResumableLoader, Trainer, TrainConfig, set_seed

    set_seed(seed)  # the head's initialisation depends on the seed too
    freeze = {"features": cfg.features, "head": cfg.head} if cfg.freeze else None
    num_labels = len(data.labels) if data.labels else 1
    model, missing = init_from_pretrained(model_dir, cfg.kind, num_labels, freeze)
    before = {k: v.clone() for k, v in model.bert.state_dict().items()} if cfg.freeze else None
    lengths = [row_length(r) for r in data.train_rows] if cfg.group_by_length else None
    loader = ResumableLoader(data.train_rows, cfg.batch_size, collate_fn=make_collate(tokenizer.pad_token_id),
                             shuffle=True, seed=seed, group_by_length=lengths)
    per_epoch = len(loader)
    every = per_epoch if cfg.max_steps is None else min(per_epoch, cfg.max_steps)
    info = data.task_info

    def save_fn(m: nn.Module, d: Path) -> None:
        save_task_model(m, d, data.labels, info, tokenizer=tokenizer)

    def load_fn(m: nn.Module, d: Path) -> None:
        load_pretrained(m, d)

    tc = TrainConfig(out_dir=run_dir, lr=cfg.lr, weight_decay=cfg.weight_decay, warmup_ratio=cfg.warmup_ratio,
                     max_steps=cfg.max_steps, num_epochs=None if cfg.max_steps else cfg.epochs,
                     precision=cfg.precision, eval_every=every if data.evaluate else None,
                     save_every=every if cfg.save_checkpoints else None, keep_checkpoints=1, seed=seed,
                     device=cfg.device, progress=cfg.progress, plot=False, resume=cfg.resume,
                     best_metric=data.main_metric if data.evaluate else None, log_every=max(1, min(50, every)),
                     extra={"task": cfg.task})
    trainer = Trainer(model, loader, tc, eval_fn=data.evaluate, save_fn=save_fn, load_fn=load_fn)
    history = trainer.train()
    if data.evaluate is None:  # nothing to choose by: the final model is the one kept
        save_task_model(model, run_dir / "best", data.labels, info, tokenizer=tokenizer)
    if before is not None:
        changed = [k for k, v in model.bert.state_dict().items() if not torch.equal(v.cpu(), before[k])]
        if changed:
            raise RuntimeError(f"feature-based mode changed encoder weights: {changed[:3]}")
    evals = [h for h in history if h.get("split") == "eval"]
    best = {}
    if evals:
        best = max(evals, key=lambda h: h.get(data.main_metric, -math.inf))
    # throughput from the trainer's own step timer (optimizer steps only: no eval, no checkpoint writes)
    step_sum, step_count = trainer._step_time
    examples_per_s = cfg.batch_size * step_count / step_sum if step_sum > 0 else None
    seconds = next((h["elapsed_s"] for h in reversed(history) if "elapsed_s" in h), None)
    return {"seed": seed, "out": str(run_dir), "steps": trainer.step,
            "best": {k: v for k, v in best.items() if k != "split"}, "elapsed_seconds": seconds,
            "train_examples_per_s": examples_per_s, "train_examples": len(data.train_rows),
            "missing_at_init": [m for m in missing if not m.startswith("bert.")]}


# ---- evaluate / predict with a fine-tuned model ----------------------------------------------------------------------
def evaluate_model(model_path: str | Path, cfg: FinetuneConfig, split: str = "dev") -> dict[str, float]:
    """Metrics of a fine-tuned directory on the task's `split` (dev, or test where a folder has one)."""
    from bertforge.tokenization import Tokenizer

    path = load_model_dir(model_path)
    model, task, labels = load_task_model(path)
    if task.get("kind") != cfg.kind:
        raise BertforgeError(f"{path} was fine-tuned for {task.get('name')} ({task.get('kind')}), "
                             f"not a {cfg.kind} task like {cfg.task}")
    tokenizer = Tokenizer.from_pretrained(path)
    if task.get("max_seq_len") and cfg.max_seq_len == (384 if cfg.kind == "qa" else 128):
        cfg.max_seq_len = task["max_seq_len"]
    data = prepare(cfg, tokenizer, split=split, need_train=False, labels=labels, task_info=task)
    if data.evaluate is None:
        raise BertforgeError(f"no {split} file found in {cfg.data} (or pass --eval FILE)")
    from bertforge.train import resolve_device

    model.to(resolve_device(cfg.device))
    return data.evaluate(model)
