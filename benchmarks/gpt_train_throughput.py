"""GPT pretraining throughput: bertforge's causal-LM objective vs transformers' GPT2LMHeadModel, equal config.

Same shape (default: the L6-H384 decoder with a vocabulary of 8192, as pretrained on Gutenberg), same synthetic
packed rows (seq 128, batch 32, no padding), same dropout (0.1), same machine, process and thread count. One
training step = forward (logits at every position) + next-token loss + backward + AdamW step; transformers trains
with its own `labels=` loss and attn_implementation="sdpa". Steps are interleaved across the four configurations
(each library in fp32 and bf16 autocast); the least-disturbed step is reported, the median beside it. The timing
harness is benchmarks/pretrain_throughput.py's.

    python benchmarks/gpt_train_throughput.py [--size l6-h384] [--vocab 8192] [--steps 8] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import torch

from bertforge.config import compose
from bertforge.pretraining.objectives import CausalLMObjective
from pretrain_throughput import Runner, interleaved, matmul_peak


def batches(n: int, batch: int, seq: int, vocab: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [dict(input_ids=(ids := torch.randint(0, vocab, (batch, seq), generator=g)),
                 attention_mask=torch.ones_like(ids)) for _ in range(n)]


def hf_model(cfg):
    from transformers import GPT2Config, GPT2LMHeadModel
    hf = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.max_position_embeddings, n_embd=cfg.hidden_size,
                    n_layer=cfg.num_hidden_layers, n_head=cfg.num_attention_heads, n_inner=cfg.intermediate_size,
                    activation_function=cfg.hidden_act, resid_pdrop=cfg.hidden_dropout_prob,
                    embd_pdrop=cfg.hidden_dropout_prob, attn_pdrop=cfg.attention_probs_dropout_prob)
    return GPT2LMHeadModel._from_config(hf, attn_implementation="sdpa")


def training_flops(cfg, batch: int, seq: int) -> float:
    """Matmul FLOPs of one step (3x forward), logits at every position, causal attention counted in full."""
    h, i, l_, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    tokens = batch * seq
    per_layer = 2 * tokens * (4 * h * h + 2 * h * i) + 2 * 2 * batch * seq * seq * h
    return 3 * (l_ * per_layer + 2 * tokens * h * v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="l6-h384", help="a shape of bertforge.config.SIZES (default: l6-h384)")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peak-size", type=int, default=2048, help="n of the n x n x n matmul measuring the peak")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpt_train_throughput.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    cfg = compose("gpt2", args.size, vocab_size=args.vocab, max_position_embeddings=args.seq_len)
    data = batches(4, args.batch_size, args.seq_len, args.vocab, seed=0)
    tokens = args.batch_size * args.seq_len
    flops = training_flops(cfg, args.batch_size, args.seq_len)
    peak = {"fp32": matmul_peak(torch.float32, args.peak_size), "bf16": matmul_peak(torch.bfloat16, args.peak_size)}

    runners, meta = [], []
    for lib in ("transformers", "bertforge"):
        for precision in ("fp32", "bf16"):
            torch.manual_seed(0)
            if lib == "transformers":
                model, fn = hf_model(cfg), (lambda m, b: m(**b, labels=b["input_ids"]).loss)
            else:
                model, fn = CausalLMObjective(cfg), (lambda m, b: m(**b)["loss"])
            runners.append(Runner(model, fn, bf16=precision == "bf16"))
            meta.append((lib, precision))
    interleaved(runners, data, args.steps, args.warmup)
    rows = []
    for r, (lib, precision) in zip(runners, meta):
        sec, med = min(r.times), sorted(r.times)[len(r.times) // 2]
        rows.append(dict(library=lib, precision=precision, step_s=sec, step_s_median=med, tokens_per_s=tokens / sec,
                         tokens_per_s_median=tokens / med, tflops=flops / sec / 1e12,
                         pct_of_matmul_peak=100 * flops / sec / peak[precision]))
    by = {(r["library"], r["precision"]): r["tokens_per_s"] for r in rows}
    ratios = {p + "_vs_" + p: by["bertforge", p] / by["transformers", p] for p in ("fp32", "bf16")}
    print(f"\nGPT pretraining step, {args.size} (vocab {args.vocab}), seq {args.seq_len}, batch {args.batch_size}, "
          f"{args.threads} threads")
    print("| library | precision | ms/step (min) | ms/step (median) | tokens/s | TFLOP/s | % of matmul peak |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['library']} | {r['precision']} | {r['step_s'] * 1000:.0f} | {r['step_s_median'] * 1000:.0f} | "
              f"{r['tokens_per_s']:.0f} | {r['tflops']:.3f} | {r['pct_of_matmul_peak']:.1f} |")
    for k, v in ratios.items():
        print(f"ratio {k}: {v:.2f}x")
    result = dict(config=dict(size=args.size, vocab=args.vocab, seq_len=args.seq_len, batch_size=args.batch_size,
                              steps=args.steps, warmup=args.warmup, threads=args.threads,
                              parameters=sum(p.numel() for p in runners[-1].model.parameters())),
                  machine=dict(platform=platform.platform(), cpu_count=os.cpu_count(), torch=torch.__version__,
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
