"""Pretraining throughput: bertforge vs transformers' BertForPreTraining on the same synthetic MLM+NSP batches.

Same config (bert-mini shape, vocab 30522, seq 128, batch 32), same machine, same process, same batches, same
thread count. One training step = forward + backward + AdamW step. Rows: each library in fp32 and bf16 autocast
(transformers with attn_implementation="sdpa"); ratios bf16-vs-bf16, fp32-vs-fp32 and our best vs their default
(fp32). Achieved FLOP/s is set against a measured bf16 / fp32 matmul peak on this machine. The optimizer is
torch's fused AdamW for both, which is what each library's trainer uses (`bertforge pretrain`; transformers'
Trainer defaults to "adamw_torch_fused" with torch >= 2.8); `--optimizer foreach` gives the older figures.
`--compile` adds rows of both models under torch.compile (same steps, compiled during the warm-up).

    python benchmarks/pretrain_throughput.py [--steps 10] [--warmup 3] [--threads 2] [--compile] [--out ...json]
    python benchmarks/pretrain_throughput.py --device cuda --size bert-base --batch-size 128   (on a GPU)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from bench_common import bench_lock
from bertforge.config import preset
from bertforge.pretraining.objectives import MLMObjective
from bertforge.device import compile_module


def synthetic_batches(n: int, batch: int, seq: int, vocab: int, mask_prob: float, seed: int) -> list[dict]:
    """MLM+NSP batches: random ids, ~mask_prob of positions labelled (and replaced by id 103 = [MASK])."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(1000, vocab, (batch, seq), generator=g)
        ids[:, 0], ids[:, -1] = 101, 102
        masked = torch.rand(batch, seq, generator=g) < mask_prob
        masked[:, 0] = masked[:, -1] = False
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        ids = ids.masked_fill(masked, 103)
        tt = torch.zeros_like(ids)
        tt[:, seq // 2:] = 1
        out.append(dict(input_ids=ids, token_type_ids=tt, attention_mask=torch.ones_like(ids),
                        mlm_labels=labels, sentence_label=torch.randint(0, 2, (batch,), generator=g)))
    return out


def hf_model(cfg):
    from transformers import BertConfig, BertForPreTraining
    hf_cfg = BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                        intermediate_size=cfg.intermediate_size, max_position_embeddings=512)
    return BertForPreTraining(hf_cfg, attn_implementation="sdpa") if _takes_attn_kw() else \
        BertForPreTraining._from_config(hf_cfg, attn_implementation="sdpa")


def _takes_attn_kw() -> bool:
    import inspect
    from transformers import BertForPreTraining
    return "attn_implementation" in inspect.signature(BertForPreTraining.__init__).parameters


def hf_step_loss(model, b):
    """transformers' own loss: labels over the full [B, T, V] logits, as its users train it."""
    out = model(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"], attention_mask=b["attention_mask"],
                labels=b["mlm_labels"], next_sentence_label=b["sentence_label"])
    return out.loss


def ours_step_loss(model, b):
    return model(**b)["loss"]


class Runner:
    """One (model, AdamW) pair; `step(batch)` times one training step (forward + backward + optimizer)."""

    def __init__(self, model, loss_fn, bf16: bool, device: torch.device = torch.device("cpu"),
                 fused: bool | None = None):
        """`fused`: torch's fused AdamW kernel; None: on a GPU only (how the GPT and XLNet benchmarks, which share
        this harness, were measured)."""
        self.model, self.loss_fn, self.bf16, self.device = model.to(device).train(), loss_fn, bf16, device
        fused = device.type == "cuda" if fused is None else fused
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused, foreach=None if fused else True)
        self.times: list[float] = []

    def step(self, b, record: bool = True) -> None:
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            loss = self.loss_fn(self.model, b)
        loss.float().backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        if record:
            self.times.append(time.perf_counter() - t0)


def interleaved(runners: list[Runner], batches, steps: int, warmup: int) -> None:
    """Round-robin one step of each runner at a time, so load from other programs on a shared machine falls on
    every configuration alike rather than on whichever happened to run during a busy minute."""
    for i in range(warmup):
        for r in runners:
            r.step(batches[i % len(batches)], record=False)
    for i in range(steps):
        for r in runners:
            r.step(batches[i % len(batches)])


def matmul_peak(dtype: torch.dtype, n: int | None = None, reps: int = 5, device: str = "cpu") -> float:
    """Best FLOP/s of an n x n x n matmul in `dtype` (the machine's practical peak for this thread count)."""
    if n is None:  # --peak-n: a smoke run's small product instead (not a peak)
        n = 2048 if device == "cpu" else 8192  # a GPU needs a big product to reach its peak
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    a @ b
    best = float("inf")
    for _ in range(reps):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def training_flops(cfg, batch: int, seq: int, n_masked: float) -> float:
    """Matmul FLOPs of one step (3x forward: forward + backward), counting MLM logits only where computed."""
    h, i, l_, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    tokens = batch * seq
    per_layer = 2 * tokens * (4 * h * h + 2 * h * i) + 2 * 2 * batch * seq * seq * h
    head = 2 * n_masked * (h * h + h * v)
    return 3 * (l_ * per_layer + head)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="bert-mini")
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu (default) | cuda")
    ap.add_argument("--optimizer", choices=("fused", "foreach"), default="fused", help="AdamW kernel (both libraries)")
    ap.add_argument("--compile", action="store_true", help="also time both models under torch.compile")
    ap.add_argument("--peak-n", type=int, default=None,
                    help="size of the peak-measuring matmul (default 2048, 8192 on a GPU; small for a smoke run)")
    ap.add_argument("--out", default=None, help="default: results/pretrain_throughput[_cuda].json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from bertforge.device import resolve_device
    device = resolve_device(args.device)
    args.out = args.out or str(Path(__file__).parent / "results" /
                               ("pretrain_throughput.json" if device.type == "cpu" else "pretrain_throughput_cuda.json"))
    torch.manual_seed(0)
    load_start = os.getloadavg()[0]

    cfg = preset(args.size, vocab_size=args.vocab)
    batches = [{k: v.to(device) for k, v in b.items()}
               for b in synthetic_batches(4, args.batch_size, args.seq_len, args.vocab, 0.15, seed=0)]
    n_masked = sum(int(b["mlm_labels"].ne(-100).sum()) for b in batches) / len(batches)
    tokens = args.batch_size * args.seq_len
    peak = {p: matmul_peak(dt, args.peak_n, device=device.type) for p, dt in (("fp32", torch.float32),
                                                                              ("bf16", torch.bfloat16))}

    runners, meta = [], []
    for compiled in (False, True) if args.compile else (False,):
        for lib in ("transformers", "bertforge"):
            for precision in ("fp32", "bf16"):
                torch.manual_seed(0)
                if lib == "transformers":
                    model, fn = hf_model(cfg), hf_step_loss
                    flops = training_flops(cfg, args.batch_size, args.seq_len, tokens)  # full [B, T, V] logits
                else:
                    model, fn = MLMObjective(cfg, relation="nsp"), ours_step_loss
                    flops = training_flops(cfg, args.batch_size, args.seq_len, n_masked)
                if compiled:
                    model = compile_module(model, True)
                runners.append(Runner(model, fn, bf16=precision == "bf16", device=device,
                                      fused=args.optimizer == "fused"))
                meta.append((lib + (" +compile" if compiled else ""), precision, flops))
    with bench_lock():
        interleaved(runners, batches, args.steps, args.warmup)
    rows = []
    for r, (lib, precision, flops) in zip(runners, meta):
        # min: the least-disturbed step (timeit's convention on a noisy machine); the median is reported too
        sec, med = min(r.times), sorted(r.times)[len(r.times) // 2]
        rows.append(dict(library=lib, precision=precision, step_s=sec, step_s_median=med, tokens_per_s=tokens / sec,
                         tokens_per_s_median=tokens / med, tflops=flops / sec / 1e12,
                         pct_of_matmul_peak=100 * flops / sec / peak[precision]))
        print(f"{lib:>12} {precision}: {sec * 1000:7.1f} ms/step (median {med * 1000:.1f})  "
              f"{tokens / sec:9.0f} tok/s", flush=True)

    by = {(r["library"], r["precision"]): r for r in rows}
    best = max((r for r in rows if r["library"] == "bertforge"), key=lambda r: r["tokens_per_s"])
    ratios = {
        "fp32_vs_fp32": by["bertforge", "fp32"]["tokens_per_s"] / by["transformers", "fp32"]["tokens_per_s"],
        "bf16_vs_bf16": by["bertforge", "bf16"]["tokens_per_s"] / by["transformers", "bf16"]["tokens_per_s"],
        "best_vs_their_default_fp32": best["tokens_per_s"] / by["transformers", "fp32"]["tokens_per_s"],
    }
    if args.compile:
        for p in ("fp32", "bf16"):
            ratios[f"compiled_{p}_vs_compiled_{p}"] = (by["bertforge +compile", p]["tokens_per_s"]
                                                       / by["transformers +compile", p]["tokens_per_s"])
    print()
    print("| library | precision | ms/step (min) | ms/step (median) | tokens/s | TFLOP/s | % of matmul peak |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['library']} | {r['precision']} | {r['step_s'] * 1000:.1f} | {r['step_s_median'] * 1000:.1f} | "
              f"{r['tokens_per_s']:.0f} | {r['tflops']:.3f} | {r['pct_of_matmul_peak']:.1f} |")
    print(f"\nmatmul peak ({args.threads} threads): fp32 {peak['fp32'] / 1e12:.3f} TFLOP/s, "
          f"bf16 {peak['bf16'] / 1e12:.3f} TFLOP/s")
    for k, v in ratios.items():
        print(f"ratio {k}: {v:.2f}x")
    result = dict(device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                  config=dict(size=args.size, vocab=args.vocab, seq_len=args.seq_len, batch_size=args.batch_size,
                              steps=args.steps, warmup=args.warmup, threads=args.threads, objective="mlm+nsp",
                              optimizer=f"AdamW ({args.optimizer})",
                              masked_per_batch=n_masked),
                  machine=dict(platform=platform.platform(), processor=platform.processor(),
                               cpu_count=os.cpu_count(), torch=torch.__version__,
                               # other programs on a shared machine distort every number; record how busy it was
                               loadavg_start=load_start, loadavg_end=os.getloadavg()[0]),
                  matmul_peak_tflops={k: v / 1e12 for k, v in peak.items()}, rows=rows, ratios=ratios)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
