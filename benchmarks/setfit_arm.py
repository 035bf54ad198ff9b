"""The SetFit arm of benchmarks/small_data.py, run by an interpreter that has the `setfit` package (1.2.0).

SetFit (Tunstall et al. 2022): contrastive fine-tuning of the sentence encoder on pairs sampled from the labelled rows
(CosineSimilarityLoss, 1 epoch, batch 16), then a logistic regression head on the tuned embeddings. The final model
is scored on the eval file (no eval set is seen during training). Prints one JSON line: accuracy, macro_f1, steps,
pairs, seconds.

    python benchmarks/setfit_arm.py MODEL TRAIN.tsv DEV.tsv --seed 42 --num-iterations 8
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time


def read_tsv(path: str) -> tuple[list[str], list[int]]:
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["sentence"] for r in rows], [int(r["label"]) for r in rows]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("train")
    ap.add_argument("eval")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--num-iterations", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()

    from datasets import Dataset
    from setfit import SetFitModel, Trainer, TrainingArguments
    from sklearn.metrics import accuracy_score, f1_score

    texts, labels = read_tsv(args.train)
    dev_texts, dev_labels = read_tsv(args.eval)
    start = time.perf_counter()
    model = SetFitModel.from_pretrained(args.model)
    targs = TrainingArguments(batch_size=args.batch_size, num_epochs=1, num_iterations=args.num_iterations,
                              seed=args.seed, report_to="none", save_strategy="no", eval_strategy="no",
                              logging_strategy="no", show_progress_bar=False)
    trainer = Trainer(model=model, args=targs, train_dataset=Dataset.from_dict({"text": texts, "label": labels}))
    trainer.train()
    seconds = time.perf_counter() - start
    pred = [int(p) for p in model.predict(dev_texts, batch_size=64, show_progress_bar=False)]
    pairs = 2 * args.num_iterations * len(texts)
    print(json.dumps({"accuracy": accuracy_score(dev_labels, pred), "macro_f1": f1_score(dev_labels, pred, average="macro"),
                      "steps": math.ceil(pairs / args.batch_size), "pairs": pairs,
                      "num_iterations": args.num_iterations, "train_seconds": round(seconds, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
