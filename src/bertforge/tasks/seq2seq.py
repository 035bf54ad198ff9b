"""Sequence-to-sequence fine-tuning (`bertforge finetune --task seq2seq`): source -> target text with an
encoder-decoder (`bertforge.model.Seq2SeqLM`: a T5 or BART checkpoint, bertforge's or transformers').

Data: any table (JSONL, TSV, CSV, JSON, Parquet, a saved or hub dataset) with a source and a target column (--source-col / --target-col, default source / target);
a row without one, or with an empty one, is refused as file:line naming the column. Sources are cut to
--max-seq-len tokens, targets to --max-target-len, both ending in the tokenizer's eos (T5: "text </s>"; BART:
"<s> text </s>", as transformers' tokenizers encode them). Training minimises the decoder's cross-entropy on the
target (teacher forcing, labels shifted right inside the model); evaluation generates (greedy, or beam search with
--num-beams) and scores the generated text against the targets with sacrebleu's corpus BLEU and rouge-score's
ROUGE-1/2/L F1 (stemmed), next to the copy baseline (the source itself as the prediction), all x100. The best
evaluation's predictions are written to OUT/predictions.jsonl. The main metric, which picks the best checkpoint,
is ROUGE-L: on small models and short runs BLEU is often 0 for every checkpoint and then picks nothing.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from tqdm.auto import tqdm

from bertforge.errors import BertforgeError
from bertforge.io.tables import open_table, pick_columns
from bertforge.io.write import atomic_write_text
from bertforge.model.folder import ModelFolder
from bertforge.tasks.config import FinetuneConfig
from bertforge.tasks.examples import TextExample
from bertforge.tasks.kind_base import Encoded, TaskKind
from bertforge.tasks.table import table_examples

METRICS = ("bleu", "rouge1", "rouge2", "rougeL")


def text_metrics(predictions: list[str], references: list[str]) -> dict[str, float]:
    """Corpus BLEU (sacrebleu, its default 13a tokenisation) and mean ROUGE-1/2/L F1 (rouge-score, Porter
    stemming), all x100."""
    try:
        import sacrebleu
        from rouge_score import rouge_scorer
    except ImportError:
        raise BertforgeError("seq2seq evaluation needs sacrebleu and rouge-score: pip install "
                             "'bertforge[seq2seq]'") from None
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    out = {"bleu": float(sacrebleu.corpus_bleu(predictions, [references]).score)}
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    sums = dict.fromkeys(("rouge1", "rouge2", "rougeL"), 0.0)
    for pred, ref in zip(predictions, references):
        for key, score in scorer.score(ref, pred).items():
            sums[key] += score.fmeasure
    out.update({k: 100.0 * v / max(len(predictions), 1) for k, v in sums.items()})
    return out


class Seq2SeqKind(TaskKind):
    """Source -> target generation, scored by BLEU / ROUGE against the targets and against copying the source."""

    name = "seq2seq"
    extensions = (".jsonl", ".tsv", ".csv", ".json", ".parquet")
    main_metric = "rougeL"

    def __init__(self, cfg: FinetuneConfig, saved: dict[str, Any], labels: list[str] | None):
        super().__init__(cfg, saved, None)
        defaults = FinetuneConfig.__dataclass_fields__
        # a saved model's settings unless the user chose otherwise
        for key in ("source_col", "target_col", "max_target_len", "num_beams"):
            given = getattr(cfg, key)
            setattr(self, key, saved[key] if saved.get(key) is not None and given == defaults[key].default else given)
        if self.max_target_len < 2 or self.num_beams < 1:
            raise BertforgeError(f"--max-target-len must be at least 2 and --num-beams at least 1 (got "
                                 f"{self.max_target_len}, {self.num_beams})")
        self.label_column = f"{self.target_col!r} column"
        self.tokenizer: Any = None
        # while training (no saved settings): the best evaluation's predictions go to OUT/predictions.jsonl
        self.predictions_path = None if saved else Path(cfg.out) / "predictions.jsonl"
        self.best = -math.inf
        self._copy: dict[int, dict[str, float]] = {}  # the copy baseline per encoded eval set (computed once)

    # ---- data ----------------------------------------------------------------------------------------------------
    def read(self, source: Any) -> list[TextExample]:
        table = open_table(source)
        return table_examples(table, pick_columns(table, self.source_col, self.target_col, want_label=False))[0]

    def read_inputs(self, source: Any) -> list[TextExample]:
        table = open_table(source)
        return table_examples(table, pick_columns(table, self.source_col, want_pair=False, want_label=False))[0]

    def has_label(self, example: Any) -> bool:
        return example.text_pair is not None

    def encode(self, examples: list[TextExample], tokenizer) -> Encoded:
        self.tokenizer = tokenizer
        src = tokenizer([ex.text for ex in examples], max_length=self.max_len, padding=False,
                        return_tensors=None)["input_ids"]
        rows = [{"input_ids": torch.tensor(s, dtype=torch.long)} for s in src]
        if examples and all(self.has_label(ex) for ex in examples):
            tgt = tokenizer([ex.text_pair for ex in examples], max_length=self.max_target_len, padding=False,
                            return_tensors=None)["input_ids"]
            for row, t in zip(rows, tgt):
                row["labels"] = torch.tensor(t, dtype=torch.long)
        return Encoded(examples, rows, tokenizer.pad_token_id)

    def collate(self, pad_id: int) -> Callable[[list[dict]], dict[str, torch.Tensor]]:
        from bertforge.data.seq2seq import pad_pairs

        def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
            return pad_pairs([r["input_ids"].tolist() for r in rows], [r["labels"].tolist() for r in rows], pad_id)

        return collate

    # ---- model ---------------------------------------------------------------------------------------------------
    def build(self, model_dir: "Path | ModelFolder", freeze: dict[str, Any] | None = None) -> tuple[nn.Module, list[str]]:
        from bertforge.model import Seq2SeqLM

        return Seq2SeqLM.from_pretrained(model_dir).train(), []

    def info(self) -> dict[str, Any]:
        return super().info() | {"source_col": self.source_col, "target_col": self.target_col,
                                 "max_target_len": self.max_target_len, "num_beams": self.num_beams}

    def save(self, model: nn.Module, directory: Path, tokenizer: Any) -> None:
        model.config.extra["bertforge_task"] = dict(self.info(), kind=self.name)  # config.json keeps it
        model.save_pretrained(directory, tokenizer=tokenizer)

    def load_into(self, model: nn.Module, directory: Path) -> None:
        from bertforge.model import Seq2SeqLM

        model.load_state_dict(Seq2SeqLM.from_pretrained(directory).state_dict())

    def load(self, path: "Path | ModelFolder") -> nn.Module:
        from bertforge.model import Seq2SeqLM

        folder = ModelFolder.open(path)
        if folder.graph is not None:
            raise BertforgeError(f"{folder.graph}: encoder-decoders are not exported to ONNX; give the model folder")
        return Seq2SeqLM.from_pretrained(folder)

    # ---- generation and scores -----------------------------------------------------------------------------------
    def generate(self, model: nn.Module, enc: Encoded, batch_size: int, progress: bool, desc: str) -> list[str]:
        """Each example's generated text (longest sources first, so batches carry little padding)."""
        from bertforge.data.seq2seq import pad_pairs
        from bertforge.generation import GenerationConfig, generate_ids

        if self.tokenizer is None:
            raise BertforgeError("seq2seq: encode the examples before generating (the tokenizer decodes)")
        config = GenerationConfig(max_new_tokens=self.max_target_len, greedy=self.num_beams == 1,
                                  num_beams=self.num_beams)
        device = next(model.parameters()).device
        order = sorted(range(len(enc.rows)), key=lambda i: -len(enc.rows[i]["input_ids"]))
        texts: list[str] = [""] * len(order)
        was_training = model.training
        model.eval()
        for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False):
            idx = order[start:start + batch_size]
            batch = pad_pairs([enc.rows[i]["input_ids"].tolist() for i in idx], [[0]] * len(idx), enc.pad_id)
            out = generate_ids(model, batch["input_ids"].to(device), batch["attention_mask"].to(device), config)
            for i, ids in zip(idx, out[:, 1:].tolist()):  # the first column is the decoder's start token
                texts[i] = self.tokenizer.decode(ids, skip_special_tokens=True).strip()
        model.train(was_training)
        return texts

    def evaluate(self, model: nn.Module, enc: Encoded, batch_size: int = 64,
                 progress: bool = False) -> dict[str, float]:
        predictions = self.generate(model, enc, batch_size, progress, "eval")
        references = [ex.text_pair for ex in enc.examples]
        scores = text_metrics(predictions, references)
        if id(enc) not in self._copy:
            self._copy[id(enc)] = text_metrics([ex.text for ex in enc.examples], references)
        scores.update({f"copy_{k}": v for k, v in self._copy[id(enc)].items()})
        scores["gen_len"] = sum(len(p.split()) for p in predictions) / max(len(predictions), 1)
        if self.predictions_path is not None and scores[self.main_metric] > self.best:
            self.best = scores[self.main_metric]
            records = [{"id": ex.guid, "source": ex.text, "target": ex.text_pair, "prediction": p}
                       for ex, p in zip(enc.examples, predictions)]
            atomic_write_text(self.predictions_path, "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                             for r in records))
        return scores

    def predict(self, model: nn.Module, enc: Encoded, batch_size: int = 64, progress: bool = False) -> list[dict]:
        predictions = self.generate(model, enc, batch_size, progress, "predict")
        return [{"id": ex.guid, "prediction": p} for ex, p in zip(enc.examples, predictions)]
