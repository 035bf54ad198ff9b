"""DeBERTa-v3-base-shaped inference and one fine-tuning step: bertforge against transformers on the same weights, in
the same run, reported as ratios.

The model is DeBERTa-v3-base's shape (12 layers, hidden 768, 12 heads, vocabulary 128,100, 256 position buckets,
shared attention keys, both relative terms) with a 2-label classification head, randomly initialised once by
bertforge, saved, and loaded by transformers' DebertaV2ForSequenceClassification (the script checks that the two
give the same logits first). bertforge adds the disentangled scores to SDPA as its float mask (and computes them
against the 2T - 1 relative rows a length reaches); transformers computes the attention with an eager
matmul-softmax over all 512 rows.

  inference   eval mode, no gradient, a batch of --batch texts of 128 tokens (a quarter padded to 96)
  train step  train mode (dropout on), forward + cross-entropy + backward + AdamW step on the same batch

The two libraries alternate, repeat by repeat, so a change of machine load hits both. Each cell is the fastest of
--repeats timed calls after one warm-up (on a shared machine other jobs only ever add time, so the fastest call is
the closest to the work itself), and the ratio is theirs over ours; the medians and the median of the per-repeat
ratios are in the JSON too.

    python benchmarks/deberta_speed.py [--batch 8] [--seq 128] [--repeats 5] [--threads 2] [--precision fp32]
        [--device cpu] [--out benchmarks/results/deberta_speed.json]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
from contextlib import nullcontext
from pathlib import Path

import torch

from bench_common import bench_lock, save, timed

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def models(device: torch.device):
    """(bertforge classifier, transformers classifier) of DeBERTa-v3-base's shape with the same weights."""
    import transformers

    from bertforge.config import compose
    from bertforge.tasks.models import build_model, load_task_model, save_task_model

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = compose("deberta-v2", "base")
    with tempfile.TemporaryDirectory() as tmp:
        save_task_model(build_model(cfg, "classify", 2), tmp, ["neg", "pos"], {"name": "bench"})
        ours, _, _ = load_task_model(tmp)
        theirs = transformers.DebertaV2ForSequenceClassification.from_pretrained(tmp)
    return ours.to(device), theirs.to(device), cfg


def batch(cfg, size: int, seq: int, device: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, cfg.vocab_size, (size, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[: max(1, size // 4), seq * 3 // 4:] = 0  # a quarter of the rows padded, so the mask is real
    ids[mask == 0] = cfg.pad_token_id
    labels = torch.randint(0, 2, (size,), generator=g)
    return {k: v.to(device) for k, v in dict(input_ids=ids, attention_mask=mask, labels=labels).items()}


def compare(name: str, ours_fn, theirs_fn, repeats: int, device: torch.device) -> dict:
    ours_fn(), theirs_fn()  # warm-up
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(timed(ours_fn, device))
        theirs.append(timed(theirs_fn, device))
    ratios = [t / o for o, t in zip(ours, theirs)]
    row = {"measure": name, "bertforge_ms": 1000 * min(ours), "transformers_ms": 1000 * min(theirs),
           "ratio": min(theirs) / min(ours), "bertforge_median_ms": 1000 * statistics.median(ours),
           "transformers_median_ms": 1000 * statistics.median(theirs), "median_ratio": statistics.median(ratios),
           "ratio_range": [min(ratios), max(ratios)]}
    print(f"{name:<12} bertforge {row['bertforge_ms']:9.1f} ms   transformers {row['transformers_ms']:9.1f} ms   "
          f"{row['ratio']:.2f}x (per repeat {min(ratios):.2f}-{max(ratios):.2f}, median {row['median_ratio']:.2f})",
          flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast, both libraries")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="benchmarks/results/deberta_speed.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    ours, theirs, cfg = models(device)
    b = batch(cfg, args.batch, args.seq, device)
    inputs = {k: v for k, v in b.items() if k != "labels"}
    cast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if args.precision == "bf16" else nullcontext
    with torch.no_grad():
        ours.eval(), theirs.eval()
        diff = float((ours(**inputs)["logits"] - theirs(**inputs).logits).abs().max())
    print(f"same weights: max |logit difference| {diff:.2e} (fp32)", flush=True)

    def infer(model, hf: bool):
        def run():
            with torch.no_grad(), cast():
                out = model(**inputs)
            return out.logits if hf else out["logits"]
        return run

    def train_step(model, hf: bool):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

        def run():
            with cast():
                out = model(**b)
            (out.loss if hf else out["loss"]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return run

    rows = []
    with bench_lock():
        ours.eval(), theirs.eval()
        rows.append(compare("inference", infer(ours, False), infer(theirs, True), args.repeats, device))
        ours.train(), theirs.train()
        rows.append(compare("train step", train_step(ours, False), train_step(theirs, True), args.repeats, device))
    tokens = args.batch * args.seq
    print(f"\n| measure ({args.batch} x {args.seq} tokens, {args.precision}, {device.type}) | bertforge | "
          f"transformers | ratio |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['measure']} | {r['bertforge_ms']:.0f} ms ({tokens / r['bertforge_ms'] * 1000:,.0f} tok/s) | "
              f"{r['transformers_ms']:.0f} ms | **{r['ratio']:.2f}x** |")
    import transformers

    meta = dict(shape="deberta-v3-base", batch=args.batch, seq=args.seq, precision=args.precision,
                device=str(device), threads=args.threads, repeats=args.repeats, max_logit_diff=diff,
                torch=torch.__version__, transformers=transformers.__version__,
                cpu=platform.processor() or platform.machine(), load_average=os.getloadavg(),
                gpu=torch.cuda.get_device_name() if device.type == "cuda" else None)
    save(Path(args.out), {"meta": meta, "rows": rows})
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
