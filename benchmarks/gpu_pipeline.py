"""Does the input pipeline starve the model? Pretraining tokens/s end to end vs on synthetic batches, same shape.

The pipeline is `bertforge pretrain`'s own (tokenizer and shards made as it makes them, the recipe's example
builder, dynamic masking in the collator, `ResumableLoader`, the `Trainer`), on a corpus of text files. Three arms
train the same model from the same initial weights, in the same process, on --device:
  * synthetic:  the Trainer fed batches already in memory (real batches of this pipeline, made up front and
                cycled): no input cost at all, the ceiling;
  * inline:     the pipeline with `prefetch=0`: each batch collated and masked between steps (before this work);
  * background: the pipeline with `prefetch=2`: batches made ahead in a thread, pinned on a GPU;
  * workers:    (--train-workers N) batches made by N worker processes (the Trainer's default on a GPU).
Also: batches/s made by 1, 2, ... worker processes alone (--make-workers), against one process.
A step is forward + backward + AdamW (+ clipping), as in `bertforge pretrain`; the arms are run one after the
other, in the order synthetic / inline / background / synthetic, and the synthetic figure is the mean of its two
runs, so drifting machine load hits both sides. Also reported: the milliseconds one batch takes to make alone.
The goal: end-to-end >= 95% of the synthetic figure.

    python benchmarks/gpu_pipeline.py --corpus ../shared/data/gutenberg --device cpu --size bert-mini \\
        --batch-size 32 --steps 30
    python benchmarks/gpu_pipeline.py --corpus DIR --device cuda --size bert-base --batch-size 256 --precision bf16
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from bertforge.data import ShardedCorpus
from bertforge.pretraining.inputs import SingleSegmentCollator, make_dataset, single_segment
from bertforge.pretraining.options import PretrainOptions
from bertforge.pretraining.prepare import prepare_data, prepare_tokenizer
from bertforge.pretraining.recipes import resolve
from bertforge.pretraining.run import build_model
from bertforge.device import resolve_device
from bertforge.training import ResumableLoader, TrainConfig, Trainer
from bertforge.training.loader import batch_stream


class Cycled:
    """Batches already in memory, served forever (the synthetic arm's loader)."""

    def __init__(self, batches: list[dict]):
        self.batches = batches

    def __iter__(self):
        return itertools.islice(itertools.cycle(self.batches), 10 ** 9)


def step_seconds(out: Path, warmup_steps: int) -> float:
    """Mean step time after the warm-up, from the trainer's own speed.jsonl (elapsed_s at every logged step)."""
    rows = [json.loads(line) for line in (out / "speed.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] >= warmup_steps]
    (s0, t0), (s1, t1) = (rows[0]["step"], rows[0]["elapsed_s"]), (rows[-1]["step"], rows[-1]["elapsed_s"])
    return (t1 - t0) / (s1 - s0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", nargs="+", required=True, help="text files or folders (e.g. ../shared/data/gutenberg)")
    ap.add_argument("--max-files", type=int, default=20, help="use the first N files of the corpus (default: 20)")
    ap.add_argument("--recipe", default="roberta")
    ap.add_argument("--size", default="bert-mini")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--vocab-size", type=int, default=30522)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per arm (after --warmup)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--make-workers", type=int, nargs="*", default=[1, 2],
                    help="batches/s made by this many worker processes, alone (default: 1 2)")
    ap.add_argument("--make-batches", type=int, default=16, help="batches timed per --make-workers count")
    ap.add_argument("--train-workers", type=int, default=0,
                    help="add an arm whose batches N worker processes make (default 0: no such arm)")
    ap.add_argument("--work", default=None, help="folder for tokenizer + shards (default: a temporary one)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpu_pipeline.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    load_start = os.getloadavg()[0]
    files = sorted(str(p) for c in args.corpus for p in (sorted(Path(c).glob("*.txt")) if Path(c).is_dir()
                                                          else [Path(c)]))[:args.max_files]
    work = Path(args.work or tempfile.mkdtemp(prefix="bf-pipeline-"))
    recipe = resolve(args.recipe)
    opts = PretrainOptions(recipe=recipe, out=work, corpus=files, size=args.size, seq_len=args.seq_len,
                           batch_size=args.batch_size, vocab_size=args.vocab_size, max_steps=1, progress=False)
    t = time.perf_counter()
    tok = prepare_tokenizer(opts, files, True)
    data_dir = prepare_data(opts, files, tok, True)
    print(f"tokenizer + shards of {len(files)} files: {time.perf_counter() - t:.1f} s -> {work}", flush=True)
    corpus = ShardedCorpus(data_dir, split="train", tokenizer=tok)

    def pipeline() -> ResumableLoader:
        ds = make_dataset(corpus, recipe, args.seq_len, seed=0)
        torch.manual_seed(0)
        one = single_segment(build_model(opts, tok).config, recipe)
        collate = SingleSegmentCollator(ds.collator()) if one else ds.collator()
        return ResumableLoader(ds, args.batch_size, collate_fn=collate, shuffle=True, seed=0, drop_last=True)

    loader = pipeline()
    it = iter(loader)
    t = time.perf_counter()
    made = [next(it) for _ in range(8)]
    make_ms = (time.perf_counter() - t) / len(made) * 1000
    print(f"one batch made alone: {make_ms:.1f} ms", flush=True)
    made_per_s = {0: 1000 / make_ms}
    for n in args.make_workers:  # batches/s that n worker processes make, nothing else running
        stream = batch_stream(pipeline(), 2, False, n)
        next(stream)  # start-up (fork, first batch) not counted
        t = time.perf_counter()
        for _ in range(args.make_batches):
            next(stream)
        made_per_s[n] = args.make_batches / (time.perf_counter() - t)
        stream.close()
        print(f"{n} worker(s): {made_per_s[n]:.1f} batches/s ({made_per_s[n] / made_per_s[0]:.2f}x one process)",
              flush=True)

    steps = args.warmup + args.steps
    results: dict[str, list[float]] = {}
    arms = ("synthetic", "inline", "background") + (("workers",) if args.train_workers else ())
    for arm in arms + ("synthetic",):
        torch.manual_seed(0)
        model = build_model(opts, tok)
        source = Cycled(made) if arm == "synthetic" else pipeline()
        out = work / f"run-{arm}-{len(results.get(arm, []))}"
        cfg = TrainConfig(out_dir=out, lr=1e-4, max_steps=steps, warmup_steps=0, precision=args.precision,
                          log_every=1, device=str(device), progress=False, plot=False,
                          prefetch=2 if arm in ("background", "workers") else 0,
                          loader_workers=args.train_workers if arm == "workers" else 0)
        Trainer(model, source, cfg).train()
        sec = step_seconds(out, args.warmup)
        results.setdefault(arm, []).append(sec)
        print(f"{arm:>10}: {sec * 1000:8.1f} ms/step  {args.batch_size * args.seq_len / sec:10.0f} tokens/s",
              flush=True)
    tokens = args.batch_size * args.seq_len
    secs = {arm: sum(v) / len(v) for arm, v in results.items()}
    rows = [dict(arm=arm, step_ms=secs[arm] * 1000, tokens_per_s=tokens / secs[arm],
                 pct_of_synthetic=100 * secs["synthetic"] / secs[arm]) for arm in arms]
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"\n{args.size} {args.recipe} seq {args.seq_len} batch {args.batch_size} {args.precision} on {dev_name}")
    print("| arm | ms/step | tokens/s | % of synthetic |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['arm']} | {r['step_ms']:.1f} | {r['tokens_per_s']:.0f} | {r['pct_of_synthetic']:.1f} |")
    print(f"one batch made alone: {make_ms:.1f} ms ({100 * make_ms / 1000 / secs['synthetic']:.1f}% of a "
          f"synthetic step)")
    result = dict(config=vars(args) | {"files": len(files)}, device=str(device), device_name=dev_name,
                  batch_make_ms=make_ms, batches_made_per_s_by_workers=made_per_s, synthetic_runs_ms=[s * 1000 for s in results["synthetic"]], rows=rows,
                  machine=dict(platform=platform.platform(), cpu_count=os.cpu_count(), torch=torch.__version__,
                               loadavg_start=load_start, loadavg_end=os.getloadavg()[0]))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
