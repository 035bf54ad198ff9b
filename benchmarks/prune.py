"""Head pruning sweep (Michel et al. 2019) on the SST-2 teacher: dev accuracy and speed against the share of heads
removed, no re-training (as in the paper).

Heads are scored on --score-data (default: the SST-2 training sentences benchmarks/distill.py held out for model
selection, never the reported dev set) with the gradient of a head mask, and removed iteratively (--step of all
heads per round, re-scored with them masked: `bertforge.analysis.importance.iterative_masks`). After each round
a copy of the model has the masked heads physically removed (`prune_masked`: smaller Q/K/V and output matrices)
and is measured: SST-2 dev accuracy (all 872) and forward time over the dev set at batch 32 and batch 1 (the first
--speed-sentences), each timed next to the unpruned model (best of 2, interleaved) so that load hits both alike.
Writes benchmarks/results/prune.json and the plot docs/figures/prune_sweep.png.

    python benchmarks/prune.py [--model /tmp/bertforge_bench_distill/teacher] [--step 0.0833] [--fraction 0.9]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from bertforge.analysis.importance import iterative_masks, load_task_data, prune_masked  # noqa: E402
from bertforge.tasks.batching import forward_rows  # noqa: E402
from bertforge.tokenization import Tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SST2 = ROOT.parent / "shared/data/glue/SST-2"
WORK = Path("/tmp/bertforge_bench_distill")


def forward_seconds(model, enc, rows: int | None, batch_size: int) -> float:
    sub = type(enc)(enc.examples[:rows], enc.rows[:rows], enc.pad_id, enc.windows) if rows else enc
    t = time.perf_counter()
    forward_rows(model, sub.rows, sub.pad_id, batch_size, ("logits",), progress=False)
    return time.perf_counter() - t


def paired_speedup(base, pruned, enc, rows: int | None, batch_size: int) -> tuple[float, float]:
    """(base seconds, pruned seconds), each the best of 2, the two interleaved."""
    tb, tp = [], []
    for _ in range(2):
        tb.append(forward_seconds(base, enc, rows, batch_size))
        tp.append(forward_seconds(pruned, enc, rows, batch_size))
    return min(tb), min(tp)


def plot(points: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [100 * p["fraction_removed"] for p in points]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(x, [100 * p["dev_accuracy"] for p in points], "o-", color="C0", label="dev accuracy")
    ax.axhline(100 * points[0]["dev_accuracy"] - 1, color="C0", ls=":", lw=1, label="unpruned - 1 point")
    ax.set_xlabel("attention heads removed (%)")
    ax.set_ylabel("SST-2 dev accuracy (%)", color="C0")
    ax2 = ax.twinx()
    ax2.plot(x, [p["speedup_batch32"] for p in points], "s--", color="C1", label="speed-up, batch 32")
    ax2.plot(x, [p["speedup_batch1"] for p in points], "^--", color="C2", label="speed-up, batch 1")
    ax2.set_ylabel("forward speed-up (x)", color="C1")
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + ax2.get_legend_handles_labels()[1]
    ax.legend(lines, labels, fontsize=7, loc="lower left")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(WORK / "teacher"))
    ap.add_argument("--score-data", default=str(WORK / "sst2-split" / "dev.tsv"))
    ap.add_argument("--max-examples", type=int, default=1000, help="score-data sentences used to score heads")
    ap.add_argument("--step", type=float, default=1 / 12, help="share of all heads removed per round")
    ap.add_argument("--fraction", type=float, default=0.9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--speed-sentences", type=int, default=200, help="dev sentences timed at batch 1")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/prune.json"))
    ap.add_argument("--plot", default=str(ROOT / "docs/figures/prune_sweep.png"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model, kind, enc, _, _ = load_task_data(args.model, "sst2", args.score_data)
    examples = kind.read(SST2 / "dev.tsv")
    kind.check(examples, SST2 / "dev.tsv")
    dev = kind.encode(examples, Tokenizer.from_pretrained(args.model))
    total = sum(layer.attention.self.n_heads for layer in model.bert.encoder.layer)
    points = []
    for mask in iterative_masks(model, enc, args.fraction, args.step, 32, args.max_examples, progress=False):
        pruned = copy.deepcopy(model)
        prune_masked(pruned, mask)
        b32 = paired_speedup(model, pruned, dev, None, 32)
        b1 = paired_speedup(model, pruned, dev, args.speed_sentences, 1)
        point = {"heads_removed": int(total - mask.sum()), "fraction_removed": float(1 - mask.sum() / total),
                 "heads_per_layer": pruned.config.heads_per_layer or [model.config.num_attention_heads] *
                 model.config.num_hidden_layers,
                 "dev_accuracy": kind.evaluate(pruned, dev, 64)["accuracy"],
                 "parameters": sum(p.numel() for p in pruned.parameters()),
                 "seconds_batch32": b32[1], "speedup_batch32": b32[0] / b32[1],
                 "seconds_batch1": b1[1], "speedup_batch1": b1[0] / b1[1]}
        points.append(point)
        print(json.dumps(point), flush=True)
    base = points[0]["dev_accuracy"]
    for p in points:
        p["points_lost"] = 100 * (base - p["dev_accuracy"])
    result = {"model": str(args.model), "score_data": args.score_data, "max_examples": args.max_examples,
              "step": args.step, "heads_total": total, "threads": args.threads, "torch": torch.__version__,
              "machine": platform.processor() or platform.machine(), "load_avg_1m": os.getloadavg()[0],
              "points": points}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    plot(points, Path(args.plot), f"Head pruning (Michel et al.), MiniLM-L6 fine-tuned on SST-2, {total} heads; "
                                  "no re-training")
    print(f"{'heads removed':>13} {'share':>6} {'dev acc':>8} {'lost':>6} {'x b32':>6} {'x b1':>6} {'params':>10}")
    for p in points:
        print(f"{p['heads_removed']:13d} {100 * p['fraction_removed']:5.1f}% {p['dev_accuracy']:8.4f} "
              f"{p['points_lost']:6.2f} {p['speedup_batch32']:6.2f} {p['speedup_batch1']:6.2f} {p['parameters']:10d}")
    print(f"load avg {result['load_avg_1m']:.1f} -> {out}, {args.plot}")


if __name__ == "__main__":
    main()
