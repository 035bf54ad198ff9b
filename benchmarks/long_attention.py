"""Time and memory of one forward + backward pass against sequence length: full attention vs Longformer's sliding
window (+ a global [CLS]) vs BigBird's block-sparse attention, the same encoder shape, the same run; optionally
transformers' LongformerModel and BigBirdModel on the same weights beside bertforge's.

Each (arm, length) runs in a fresh process so that its memory high-water mark is its own: the reported memory is
the peak resident set size during the timed passes minus the resident size just before them (model, optimizer-free
weights and inputs already allocated), i.e. the activations and attention buffers. A process may use at most
--mem-limit GB (address space); an arm that needs more is reported as "over the limit", which is how full
attention's quadratic growth shows at 8192. Batch 1, random token ids, training mode (dropout on), the loss is the
mean square of the last hidden state; the median of --repeats timed passes after one warm-up.

    python benchmarks/long_attention.py [--size mini] [--lengths 512 1024 2048 4096 8192] [--window 256]
        [--block 64] [--random-blocks 3] [--reference] [--threads 2] [--out benchmarks/results/long_attention.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARMS = ("full (sdpa)", "full (eager)", "longformer", "bigbird")
REFERENCE_ARMS = ("transformers Longformer", "transformers BigBird")


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def build(arm: str, size: str, length: int, window: int, block: int, random_blocks: int):
    """(callable running one forward + backward, the model) for one arm at one length."""
    import torch

    from bertforge.config import compose
    from bertforge.model import Encoder

    torch.manual_seed(0)
    family = {"longformer": "longformer", "transformers Longformer": "longformer", "bigbird": "big_bird",
              "transformers BigBird": "big_bird"}.get(arm, "bert")
    extra: dict = {}
    if family == "longformer":
        extra = dict(attention_window=window, max_position_embeddings=length + 2)  # RoBERTa's positions from 2
    elif family == "big_bird":
        extra = dict(attention_type="block_sparse", block_size=block, num_random_blocks=random_blocks,
                     max_position_embeddings=length)
    else:
        extra = dict(max_position_embeddings=length)
    cfg = compose(family, size, **extra)
    ids = torch.randint(5, cfg.vocab_size, (1, length))
    glob = torch.zeros(1, length, dtype=torch.long)
    glob[:, 0] = 1  # Longformer's classification setting: [CLS] attends and is attended everywhere
    if arm.startswith("transformers"):
        from transformers import AutoModel

        ours = Encoder(cfg)
        tmp = tempfile.mkdtemp()
        ours.save_pretrained(tmp)
        model = AutoModel.from_pretrained(tmp)
        del ours
        kwargs = {"global_attention_mask": glob} if family == "longformer" else {}
        model.train()
        return (lambda: model(input_ids=ids, **kwargs).last_hidden_state.pow(2).mean().backward()), model
    model = Encoder(cfg, attn_implementation="eager" if arm == "full (eager)" else "sdpa").train()
    kwargs = {"global_attention_mask": glob} if family == "longformer" else {}
    return (lambda: model(ids, **kwargs).last_hidden_state.pow(2).mean().backward()), model


def child(args: argparse.Namespace) -> None:
    """Runs one arm at one length and prints one JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    limit = int(args.mem_limit * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = {"arm": args.arm, "length": args.length}
    try:
        step, model = build(args.arm, args.size, args.length, args.window, args.block, args.random_blocks)
        base = _rss_kb()
        step()  # warm-up
        model.zero_grad(set_to_none=True)
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
            model.zero_grad(set_to_none=True)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out.update(seconds=statistics.median(times), seconds_min=min(times),
                   activation_mb=round((peak - base) / 1024, 1))
    except (MemoryError, RuntimeError) as err:  # torch reports a failed allocation as RuntimeError
        if "memory" not in str(err).lower() and not isinstance(err, MemoryError):
            raise
        out.update(error=f"over the {args.mem_limit:g} GB limit")
    print(json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="mini", help="a bertforge size (default mini: 4 layers, H256, 4 heads)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    ap.add_argument("--window", type=int, default=256, help="Longformer attention_window (default 256)")
    ap.add_argument("--block", type=int, default=64, help="BigBird block_size (default 64)")
    ap.add_argument("--random-blocks", type=int, default=3, help="BigBird num_random_blocks (default 3)")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS + REFERENCE_ARMS)
    ap.add_argument("--reference", action="store_true", help="add transformers' Longformer and BigBird")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mem-limit", type=float, default=12.0, help="GB of address space per measurement")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per measurement")
    ap.add_argument("--out", default="benchmarks/results/long_attention.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    arms = list(args.arms) + (list(REFERENCE_ARMS) if args.reference else [])
    rows = []
    for length in args.lengths:
        for arm in arms:
            cmd = [sys.executable, __file__, "--child", "--arm", arm, "--length", str(length), "--size", args.size,
                   "--window", str(args.window), "--block", str(args.block), "--random-blocks",
                   str(args.random_blocks), "--repeats", str(args.repeats), "--threads", str(args.threads),
                   "--mem-limit", str(args.mem_limit)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                row = json.loads(lines[-1]) if lines else {
                    "arm": arm, "length": length, "error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
            except subprocess.TimeoutExpired:
                row = {"arm": arm, "length": length, "error": f"over {args.timeout:g} s"}
            rows.append(row)
            shown = (f"{row['seconds']:8.3f} s  {row['activation_mb']:9.1f} MB" if "seconds" in row
                     else row["error"])
            print(f"{length:6d}  {arm:26s} {shown}", flush=True)
    print("\nlength  " + "  ".join(f"{a:>24s}" for a in arms))
    for length in args.lengths:
        cells = []
        for arm in arms:
            r = next(r for r in rows if r["arm"] == arm and r["length"] == length)
            cells.append(f"{r['seconds']:7.2f}s {r['activation_mb']:8.0f}MB" if "seconds" in r else f"{'-':>24s}")
        print(f"{length:6d}  " + "  ".join(f"{c:>24s}" for c in cells))
    import torch

    meta = dict(size=args.size, window=args.window, block=args.block, random_blocks=args.random_blocks,
                threads=args.threads, repeats=args.repeats, mem_limit_gb=args.mem_limit, torch=torch.__version__,
                cpu=platform.processor() or platform.machine(), load_average=os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
