"""The modern recipe at equal wall clock: `--recipe modern` vs `--recipe bert` vs `--recipe roberta`, each pretrained
for the same budget on the same data, scored on the same held-out task, then fine-tuned with one fixed recipe.

    python benchmarks/modern_recipe.py [--budget 10m] [--arms nsp roberta modern] [--out runs/modern-recipe]

What is shared, so the arms differ only in their recipes (objective, masking rate, input format, static/dynamic
masks, family, schedule, default learning rate):
  - one WordPiece tokenizer (30,522) trained on the corpus and one set of shards (`ablation.prepare_shared`): the
    recipes' own tokenizer kinds (BPE for roberta/modern) are left out, so the vocabulary is not an arm;
  - the held-out task: the same 5% of documents, packed into full 128-token rows, 15% token masking with a fixed
    seed, scored by MLM accuracy at the masked positions (the modern arm trains at 30% but is scored at 15%);
  - the wall-clock budget per arm, each arm run alone under the shared benchmark lock
    (/tmp/bertforge-bench.lock, as `flock` takes it), with `uptime` recorded before and after;
  - the fine-tuning recipe: AdamW lr 1e-4, batch 32, 10% warm-up, linear decay, seed 42, the machine's default
    precision (bf16 autocast where the CPU has native bf16, else fp32; pretraining likewise); SST-2 on the first
    8,000 training sentences for 1 epoch (seq 64), MRPC on its full training set for 3 epochs (seq 128); dev
    scores (best epoch). Fine-tuning runs niced, outside the lock: its scores do not depend on speed.

The bert arm is `bertforge ablate`'s `nsp` arm (= `--recipe bert`). Writes benchmarks/results/modern_recipe.json
(rewritten after every arm and task, so a partial run leaves results) and prints a table with ratios to bert.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

from bench_common import bench_lock, save

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
FINETUNE = {  # task -> (data folder, train_limit, epochs, max_seq_len)
    "sst2": ("glue/SST-2", 8000, 1.0, 64),
    "mrpc": ("glue/MRPC", None, 3.0, 128),
}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def finetune_arm(model_dir: Path, out: Path, task: str, smoke: bool = False, lr: float = 1e-4) -> dict:
    from bertforge.tasks.config import FinetuneConfig
    from bertforge.tasks.finetune import finetune
    folder, limit, epochs, seq = FINETUNE[task]
    cfg = FinetuneConfig(task=task, model=model_dir, out=out, data=DATA / folder, epochs=epochs, lr=lr,
                         batch_size=32, max_seq_len=seq, train_limit=64 if smoke else limit, seed=42,
                         progress=False, save_checkpoints=False, eval_limit=64 if smoke else None)
    res = finetune(cfg, overwrite=True)
    run = res.runs[0]
    return {"main_metric": res.main_metric, "best": run["best"], "steps": run["steps"],
            "train_examples": run["train_examples"], "lr": lr}


def table(result: dict) -> str:
    rows = result["arms"]
    bert = next((r for r in rows if r["arm"] == "nsp"), None)
    lines = ["| arm (recipe) | lr | steps | tokens/s | held-out MLM acc (15%) | vs bert | MLM loss | SST-2 acc | "
             "MRPC F1 / acc |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        ft = result["finetune"].get(r["arm"], {})
        sst = ft.get("sst2", {}).get("best", {})
        mrpc = ft.get("mrpc", {}).get("best", {})
        ratio = f"{r['heldout_mlm_acc'] / bert['heldout_mlm_acc']:.2f}x" if bert else "-"
        lines.append(f"| {r['arm']} ({r['recipe']}) | {r['lr']:g} | {r['steps']} | "
                     f"{r['tokens_seen'] / r['train_seconds']:,.0f} | {r['heldout_mlm_acc']:.3f} | {ratio} | "
                     f"{r['heldout_mlm_loss']:.2f} | {sst.get('accuracy', float('nan')):.3f} | "
                     f"{mrpc.get('f1', float('nan')):.3f} / {mrpc.get('accuracy', float('nan')):.3f} |")
    extra = sorted({k for ft in result["finetune"].values() for k in ft if " lr " in k})
    if extra:  # the other fine-tuning rates, one column each
        lines += ["", "| arm | " + " | ".join(extra) + " |", "|---|" + "---:|" * len(extra)]
        for r in rows:
            ft = result["finetune"].get(r["arm"], {})
            cells = [ft[k]["best"].get(ft[k]["main_metric"], float("nan")) if k in ft else float("nan")
                     for k in extra]
            lines.append(f"| {r['arm']} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(DATA / "gutenberg"))
    ap.add_argument("--arms", nargs="+", default=["nsp", "roberta", "modern"])
    ap.add_argument("--budget", default="10m", help="training wall clock per arm (default: 10m)")
    ap.add_argument("--size", default="bert-mini")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--vocab-size", type=int, default=30522)
    ap.add_argument("--tasks", nargs="*", default=list(FINETUNE), help="fine-tuning tasks (none: skip)")
    ap.add_argument("--skip-pretrain", action="store_true", help="fine-tune the arms already pretrained in --out")
    ap.add_argument("--finetune-lr", type=float, nargs="+", default=[1e-4],
                    help="fine-tuning learning rates (default 1e-4, the fixed recipe); results for other rates are "
                         "kept as 'TASK lr LR'")
    ap.add_argument("--smoke", action="store_true",
                    help="check the script: no lock, 64 fine-tuning and evaluation examples (give a short --budget)")
    ap.add_argument("--out", default="runs/modern-recipe")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "modern_recipe.json"))
    args = ap.parse_args()

    from bertforge.pretraining.ablation import prepare_shared, run_arm
    from bertforge.device import default_precision

    out, path = Path(args.out), Path(args.json)
    # An earlier run's results are kept: arms named in --arms are re-run and replaced, the others stay.
    result = json.loads(path.read_text()) if path.is_file() else {}
    result.setdefault("setup", {}).update(
        corpus=args.corpus, budget=args.budget, size=args.size, seq_len=args.seq_len, batch_size=args.batch_size,
        vocab_size=args.vocab_size, precision=default_precision(), cpu_count=os.cpu_count(),
        heldout_task="15% token masking, full 128-token rows of the held-out 5% of documents, seed 12345",
        finetune={k: dict(zip(("data", "train_limit", "epochs", "max_seq_len"), v)) for k, v in FINETUNE.items()})
    result.setdefault("arms", [])
    result.setdefault("finetune", {})
    shared = prepare_shared([args.corpus], out, args.seq_len, args.batch_size, args.vocab_size)
    if not args.skip_pretrain:
        for name in args.arms:
            lock = bench_lock() if not args.smoke else contextmanager(lambda: (yield))()
            with lock:
                before = uptime()
                row = run_arm(name, shared, args.size, args.seq_len, args.batch_size, args.budget)
                row.update(uptime_before=before, uptime_after=uptime())
            result["arms"] = [r for r in result["arms"] if r["arm"] != name] + [row]
            save(path, result)
    os.nice(19)  # fine-tuning is not timed
    for row in result["arms"]:
        for task in args.tasks:
            for lr in args.finetune_lr:
                key = task if lr == 1e-4 else f"{task} lr {lr:g}"
                print(f"\n=== fine-tune {row['arm']} on {task}, lr {lr:g} ===", flush=True)
                res = finetune_arm(out / "arms" / row["arm"], out / "finetune" / row["arm"] / key.replace(" ", "-"),
                                   task, args.smoke, lr)
                result["finetune"].setdefault(row["arm"], {})[key] = res
                save(path, result)
    print("\n" + table(result))
    print(f"-> {path}")


if __name__ == "__main__":
    main()
