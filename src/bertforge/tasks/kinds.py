"""Task kinds as objects: each knows how to read its data, encode it, score a model on it and format predictions.

    kind = kind_for(cfg)                      # ClassifyKind, RegressKind, TagKind, QAKind, ChoiceKind, Seq2SeqKind
    examples = kind.read(path)                # labelled examples (the first labelled file fixes the label list)
    kind.check(examples, path)                # at least one example, every one labelled
    enc = kind.encode(examples, tokenizer)    # Encoded: the examples and their model rows
    model, _ = kind.build(model_dir)          # the task model, encoder from the checkpoint
    kind.evaluate(model, enc)                 # {"accuracy": ...}
    kind.predict(model, enc)                  # [{"id", "label", "score", ...}] (the `predict` output)

`tasks.finetune` and `tasks.predict` are one loop over these methods, without branching on the kind. A kind's
state is what a fine-tuned model stores in config.json (`info()`: label list, columns, SQuAD settings and the
tuned no-answer threshold); `kind_for(cfg, saved, labels)` rebuilds it for a saved model. The base class and its
defaults (batching, saving, loading) are in `tasks.kind_base`; the encoder-decoder kind is `tasks.seq2seq`.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.io.tables import TABLE_SUFFIXES, open_table, source_name
from bertforge.tasks import features as F
from bertforge.tasks import inputs
from bertforge.tasks import metrics as M
from bertforge.tasks import squad as S
from bertforge.tasks.batching import qa_logits, unpad
from bertforge.tasks.config import TASK_KINDS, FinetuneConfig
from bertforge.tasks.inputs import input_columns
from bertforge.tasks.conll import CONLL2003_TYPES, read_conll, read_tagged_table, tag_list, warn_long_sentences
from bertforge.tasks.kind_base import DEV_STEMS, Encoded, TaskKind, compressed  # noqa: F401 (re-exported)
from bertforge.tasks.registry import TASKS
from bertforge.tasks.seq2seq import Seq2SeqKind
from bertforge.tasks.swag import read_swag
from bertforge.tasks.table import table_examples

log = logging.getLogger(__name__)


# ---- sentence (pair) classification and regression -------------------------------------------------------------------
class ClassifyKind(TaskKind):
    """Sentence (pair) classification: a GLUE task's own columns, labels and metrics, or any table's columns
    (--text-col / --text-pair-col / --label-col, else the usual ones: `bertforge.io.tables.pick_columns`)."""

    name = "classify"
    extensions = TABLE_SUFFIXES
    regression = False

    def __init__(self, cfg: FinetuneConfig, saved: dict[str, Any], labels: list[str] | None):
        super().__init__(cfg, saved, labels)
        self.spec = TASKS.get(cfg.task)
        if self.spec is not None and self.spec.labels and self.labels is None:
            self.labels = list(self.spec.labels)
        if self.regression:
            self.labels = None
        self.text_col, self.text_pair_col, self.label_col = cfg.text_col, cfg.text_pair_col, cfg.label_col
        # a saved model reads the columns it was trained on, where a file has them and none are named
        self.saved_cols = (saved.get("text_col"), saved.get("text_pair_col")) if saved else (None, None)
        if self.spec is not None:
            self.main_metric = self.spec.main_metric

    @property
    def label_column(self) -> str:  # named when a file has no labels
        column = self.label_col or (self.spec.label_column if self.spec else None)
        return f"{column!r} column" if column else "label column (label, score, ...; or name it with --label-col)"

    def read(self, source: Any) -> list:
        """Labelled examples. The first source read fixes the columns (and, without a saved model, the label list)
        that later ones are read with."""
        if self.spec is not None:
            text, pair, label = self.spec.columns
            known = self.saved_cols  # a model trained on the task's data under other column names
            if self.text_col is None and known[0] not in (None, text):
                table = open_table(source)
                if all(c is None or table.has(c) for c in known):
                    text, pair = known
            self.text_col, self.text_pair_col = self.text_col or text, self.text_pair_col or pair
            self.label_col = self.label_col or label
            return self.spec.read(source, self.text_col, self.text_pair_col, self.label_col)
        table = open_table(source)
        cols = input_columns(table, self.text_col, self.text_pair_col, self.saved_cols, self.label_col, labelled=True)
        if cols.label is None:
            raise table.missing("label", "label")
        self.text_col, self.text_pair_col, self.label_col = cols.text, cols.pair, cols.label
        examples, found = table_examples(table, cols, label_list=self.labels, regression=self.regression)
        if self.labels is None and not self.regression:
            self.labels = found  # later files are checked against the training file's labels (file:line errors)
        return examples

    def read_inputs(self, source: Any) -> list:
        known = self.saved_cols if self.saved_cols[0] else (self.spec.columns[:2] if self.spec else None)
        return inputs.text_inputs(source, self.text_col, self.text_pair_col, known)

    def encode(self, examples: list, tokenizer) -> Encoded:
        batch = F.encode_text_examples(examples, tokenizer, self.labels, self.max_len)
        return Encoded(examples, unpad(batch), tokenizer.pad_token_id)

    def info(self) -> dict[str, Any]:
        return super().info() | {"text_col": self.text_col, "text_pair_col": self.text_pair_col}

    def evaluate(self, model: nn.Module, enc: Encoded, batch_size: int = 64,
                 progress: bool = False) -> dict[str, float]:
        logits = torch.stack(self.logits(model, enc, batch_size, progress, "eval"))
        gold = torch.stack([r["labels"] for r in enc.rows]).numpy()
        if self.regression:
            pred = logits.squeeze(-1).numpy()
            if self.spec is not None:
                return M.compute_metrics(self.task, pred, gold)
            return {"pearson": M.pearson(pred, gold), "spearman": M.spearman(pred, gold),
                    "mse": float(((pred - gold) ** 2).mean())}
        pred = logits.argmax(-1).numpy()
        if self.spec is not None:
            return M.compute_metrics(self.task, pred, gold)
        from sklearn.metrics import f1_score

        return {"accuracy": M.accuracy(pred, gold),
                "macro_f1": float(f1_score(gold, pred, average="macro", labels=list(range(self.num_labels)),
                                           zero_division=0))}

    def predict(self, model: nn.Module, enc: Encoded, batch_size: int = 64, progress: bool = False) -> list[dict]:
        out = []
        for ex, logits in zip(enc.examples, self.logits(model, enc, batch_size, progress, "predict")):
            if self.regression:
                out.append({"id": ex.guid, "score": float(logits[0])})
                continue
            p = logits.softmax(-1)
            k = int(p.argmax())
            out.append({"id": ex.guid, "label": self.labels[k], "score": float(p[k]),
                        "probabilities": {lab: float(v) for lab, v in zip(self.labels, p)}})
        return out


class RegressKind(ClassifyKind):
    """Sentence (pair) regression (STS-B, or any table with a numeric label column): one float output."""

    name = "regress"
    main_metric = "spearman"
    regression = True


# ---- token classification ----------------------------------------------------------------------------------------
class TagKind(TaskKind):
    """Token classification on CoNLL files (or tables of word and tag lists); labels go on each word's first
    sub-token, scored by entity F1."""

    name = "tag"
    extensions = (".txt", ".conll", ".tsv", ".jsonl", ".json", ".parquet")
    main_metric = "f1"
    label_column = "tag column"

    def __init__(self, cfg: FinetuneConfig, saved: dict[str, Any], labels: list[str] | None):
        super().__init__(cfg, saved, labels)
        self.fixed = self.labels is not None  # a saved model's tags; otherwise every file read adds its tags
        self.seen: list = []
        # the entity types a training file may use: conll's (and --labels), --labels alone for another task, or any
        given = set(cfg.labels)
        self.types = None if self.fixed else set(CONLL2003_TYPES) | given if cfg.task == "conll" else given or None

    def check(self, examples: list, source: Any, labelled: bool = True) -> None:
        super().check(examples, source, labelled)
        unknown = sorted({t for ex in examples for t in ex.tags} - set(self.labels or ()))
        if labelled and unknown:  # only a saved model's fixed tag list can miss some
            raise BertforgeError(f"{source_name(source)}: tags {', '.join(unknown)} are not among the model's "
                                 f"({', '.join(self.labels or ())})")

    def read(self, source: Any) -> list:
        if inputs.is_conll_file(source):
            examples = read_conll(source, types=self.types)
        else:
            examples = read_tagged_table(source, types=self.types)
        warn_long_sentences(examples, source_name(source), self.max_len)
        if not self.fixed:
            self.seen += examples
            self.labels = tag_list(self.seen)
        return examples

    def read_inputs(self, source: Any) -> list:
        return inputs.tagging_inputs(source)

    def has_label(self, example: Any) -> bool:
        return bool(example.tags)

    def encode(self, examples: list, tokenizer) -> Encoded:
        batch = F.encode_tagging_examples(examples, tokenizer, self.labels, self.max_len)
        return Encoded(examples, unpad(batch), tokenizer.pad_token_id)

    def tags(self, model: nn.Module, enc: Encoded, batch_size: int, progress: bool, desc: str) -> list[list[str]]:
        """Each example's word tags, from the prediction on each word's first sub-token."""
        logits = self.logits(model, enc, batch_size, progress, desc)
        return [F.tags_from_token_predictions(lg.argmax(-1)[None], row["word_index"][None], [len(ex.tokens)],
                                              self.labels)[0]
                for ex, row, lg in zip(enc.examples, enc.rows, logits)]

    def evaluate(self, model: nn.Module, enc: Encoded, batch_size: int = 64,
                 progress: bool = False) -> dict[str, float]:
        return M.ner_metrics([ex.tags for ex in enc.examples], self.tags(model, enc, batch_size, progress, "eval"))

    def predict(self, model: nn.Module, enc: Encoded, batch_size: int = 64, progress: bool = False) -> list[dict]:
        return [{"id": ex.guid, "tokens": ex.tokens, "tags": tags}
                for ex, tags in zip(enc.examples, self.tags(model, enc, batch_size, progress, "predict"))]


# ---- multiple choice ---------------------------------------------------------------------------------------------
class ChoiceKind(TaskKind):
    """Multiple choice (SWAG): one score per (context, ending) pair, softmax across the endings."""

    name = "choice"
    extensions = (".csv", ".jsonl", ".json", ".parquet")

    def read(self, source: Any) -> list:
        return read_swag(source)

    def read_inputs(self, source: Any) -> list:
        return inputs.choice_inputs(source)

    def encode(self, examples: list, tokenizer) -> Encoded:
        return Encoded(examples, unpad(F.encode_choice_examples(examples, tokenizer, self.max_len)),
                       tokenizer.pad_token_id)

    def evaluate(self, model: nn.Module, enc: Encoded, batch_size: int = 64,
                 progress: bool = False) -> dict[str, float]:
        pred = [int(logits.argmax()) for logits in self.logits(model, enc, batch_size, progress, "eval")]
        return {"accuracy": M.accuracy(pred, [int(r["labels"]) for r in enc.rows])}

    def predict(self, model: nn.Module, enc: Encoded, batch_size: int = 64, progress: bool = False) -> list[dict]:
        out = []
        for ex, logits in zip(enc.examples, self.logits(model, enc, batch_size, progress, "predict")):
            p = logits.softmax(-1)
            out.append({"id": ex.guid, "label": int(p.argmax()), "score": float(p.max()),
                        "probabilities": [float(v) for v in p]})
        return out


# ---- extractive question answering -------------------------------------------------------------------------------
class QAKind(TaskKind):
    """SQuAD v1.1 / v2.0: sliding-window features, n-best span post-processing, a tuned no-answer threshold."""

    name = "qa"
    extensions = (".json",)
    main_metric = "f1"
    splits_eval_file = True

    def __init__(self, cfg: FinetuneConfig, saved: dict[str, Any], labels: list[str] | None):
        super().__init__(cfg, saved, None)
        self.version_2 = cfg.task == "squad2" or bool(saved.get("version_2"))
        defaults = FinetuneConfig.__dataclass_fields__
        # a saved model's windows as it was trained with, unless the user chose otherwise
        self.doc_stride, self.max_query_length = (
            int(saved[k]) if saved.get(k) and getattr(cfg, k) == defaults[k].default else getattr(cfg, k)
            for k in ("doc_stride", "max_query_length"))
        # None while training: tuned on the eval set at every evaluation; a saved model's stays fixed
        self.null_threshold: float | None = saved.get("null_threshold")
        self.tune_threshold = self.null_threshold is None
        self.split_from = (saved.get("num_train_articles"), saved.get("split_file"))

    def data_files(self, split: str) -> list[str]:
        return compressed([f"{split}*.json"])  # SQuAD's names carry the version: train-v1.1.json, dev-v2.0.json

    def read(self, source: Any) -> list:
        examples = S.read_squad(source)
        self.version_2 = self.version_2 or any(ex.is_impossible for ex in examples)
        return examples

    def read_inputs(self, source: Any) -> list:
        return inputs.qa_inputs(source)

    def has_label(self, example: Any) -> bool:
        return True  # read_squad already requires answers (or is_impossible) on every question

    def split(self, train: list, evaluation: list, eval_file: Any, training: bool) -> tuple[list, list]:
        n_train, split_file = self.split_from
        eval_name = Path(eval_file).name if isinstance(eval_file, (str, Path)) else source_name(eval_file)
        if training and not train and evaluation:  # the shared data has only dev-v1.1: split it by article
            n_articles = len({ex.article for ex in evaluation})
            train, evaluation = S.split_by_article(evaluation, n_articles // 2)
            # stored with the model so that `evaluate` scores the same held-out articles, not the trained-on ones
            self.split_from = (n_articles // 2, eval_name)
            log.warning("no SQuAD train file: training on the first %d articles of %s, evaluating on the other %d",
                        n_articles // 2, source_name(eval_file), n_articles - n_articles // 2)
        elif training:
            self.split_from = (None, None)
        elif evaluation and n_train and split_file == eval_name:
            _, evaluation = S.split_by_article(evaluation, int(n_train))
            log.warning("%s: evaluating on the %d held-out articles (the model trained on the first %d)",
                        source_name(eval_file), len({ex.article for ex in evaluation}), n_train)
        return train, evaluation

    def encode(self, examples: list, tokenizer) -> Encoded:
        windows = S.build_squad_features(examples, tokenizer, max_seq_length=self.max_len, doc_stride=self.doc_stride,
                                         max_query_length=self.max_query_length)
        return Encoded(examples, unpad(windows.tensors()), tokenizer.pad_token_id, windows)

    def info(self) -> dict[str, Any]:
        info = super().info() | {"version_2": self.version_2, "doc_stride": self.doc_stride,
                                 "max_query_length": self.max_query_length}
        if self.split_from[0]:
            info.update(num_train_articles=self.split_from[0], split_file=self.split_from[1])
        if self.null_threshold is not None:
            info["null_threshold"] = self.null_threshold  # used by `predict`; saved with the best checkpoint
        return info

    def spans(self, model: nn.Module, enc: Encoded, batch_size: int, progress: bool, desc: str,
              threshold: float = 0.0) -> S.SquadPredictions:
        assert enc.windows is not None
        start, end = qa_logits(model, enc.rows, enc.pad_id, batch_size, enc.windows.input_ids.shape[1], desc, progress)
        return S.postprocess(enc.examples, enc.windows, start, end, version_2=self.version_2, null_threshold=threshold)

    def evaluate(self, model: nn.Module, enc: Encoded, batch_size: int = 64,
                 progress: bool = False) -> dict[str, float]:
        preds = self.spans(model, enc, batch_size, progress, "eval")
        refs = S.references(enc.examples)
        if not self.version_2:
            return M.squad_v1_metrics(preds.predictions, refs)
        # exact / f1 at the fixed threshold 0 (null answer when its score beats the best span), so the headline
        # numbers are not tuned on the data they score; best_* are the tuned (optimistic) ones
        scores = M.squad_v2_metrics(preds.best_non_null, refs, na_probs=preds.null_diffs, na_prob_thresh=0.0)
        if self.tune_threshold:
            self.null_threshold = float(scores["best_f1_thresh"])
        return {k: v for k, v in scores.items() if not k.endswith("total")} | {"null_threshold": self.null_threshold}

    def predict(self, model: nn.Module, enc: Encoded, batch_size: int = 64, progress: bool = False) -> list[dict]:
        preds = self.spans(model, enc, batch_size, progress, "predict", threshold=float(self.null_threshold or 0.0))
        out = []
        for ex in enc.examples:
            best = preds.nbest[ex.qid][0] if preds.nbest[ex.qid] else None
            answer = preds.predictions[ex.qid]
            rec = {"id": ex.qid, "answer": answer, "score": best["score"] if best else None}
            if answer and best:  # postprocess cuts the answer from the context at these character offsets
                rec.update(start=int(best["start"]), end=int(best["end"]))
            if self.version_2:
                rec["null_score_diff"] = preds.null_diffs[ex.qid]
            out.append(rec)
        return out


KIND_CLASSES: dict[str, type[TaskKind]] = {k.name: k for k in (ClassifyKind, RegressKind, TagKind, QAKind, ChoiceKind,
                                                          Seq2SeqKind)}


def kind_for(cfg: FinetuneConfig, saved: dict[str, Any] | None = None, labels: list[str] | None = None) -> TaskKind:
    """The kind object of `cfg.task`. `saved` (config.json's bertforge_task) and `labels` describe a fine-tuned
    model being evaluated; without them the kind is fresh for training."""
    return KIND_CLASSES[cfg.kind](cfg, saved or {}, labels)


def kind_from_saved(model_dir: Path, saved: dict[str, Any], labels: list[str] | None, text_col: Any = None,
                    text_pair_col: Any = None, label_col: Any = None) -> TaskKind:
    """The kind of a fine-tuned model from its config.json alone (for `predict`: no task options given). Columns
    not named are the ones it was trained on where an input has them (else the usual ones)."""
    name, kind = str(saved.get("name", "")), saved["kind"]
    task = name if TASK_KINDS.get(name) == kind else kind  # a model saved under another name: its kind decides
    cfg = FinetuneConfig(task=task, model=model_dir, out=model_dir, max_seq_len=saved.get("max_seq_len"),
                         text_col=text_col, text_pair_col=text_pair_col, label_col=label_col)
    return kind_for(cfg, saved, labels)

