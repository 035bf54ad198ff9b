"""XLNet permutation-LM training step: bertforge vs transformers' XLNetLMHeadModel on the same weights and inputs.

Same shape (bert-mini: 4 layers, hidden 256, 4 heads; vocab 8192), seq 128, batch 32, factorisation orders from
`bertforge.data.PermutationSampler` (K = 6: the last 1/6 of each order predicted), turned into the perm_mask /
target_mapping / labels that transformers takes. One step = forward + backward + AdamW. Both libraries run
interleaved in one process, in fp32, and in bf16 autocast where the CPU does bf16 matmuls natively (elsewhere
bf16 is emulated and slow for both libraries; `--precisions fp32 bf16` forces it). Also reported: bertforge's MLM step on the same encoder shape
(what one XLNet step costs in MLM steps, which is what an equal-wall-clock comparison pays), and the largest logit
difference between the two libraries on the same weights (fp32), before training.

    python benchmarks/xlnet.py [--size mini] [--steps 10] [--warmup 3] [--threads 2] [--precisions fp32 bf16]
                               [--out results/xlnet.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np
import torch

from bertforge.config import compose
from bertforge.data import PermutationSampler
from bertforge.io.write import atomic_write_text
from bertforge.model import permutation_mask, target_mapping_of
from bertforge.pretraining.objectives import build_objective
from bertforge.device import default_precision
from pretrain_throughput import Runner, interleaved  # same timing harness as the BERT throughput benchmark


def plm_batches(n: int, batch: int, seq: int, vocab: int, k: int, seed: int) -> list[dict]:
    """Batches in bertforge's form (perm_rank, mlm_labels) and, for transformers, the same orders as perm_mask /
    target_mapping / labels [B, P]."""
    rng = np.random.default_rng(seed)
    sampler = PermutationSampler(vocab, special_ids=[0, 1, 2, 3, 4], k=k)
    out = []
    for _ in range(n):
        ids = rng.integers(5, vocab, (batch, seq))
        ids[:, 0], ids[:, -1] = 1, 2  # [CLS] ... [SEP]: never predicted
        rows = [sampler(row, rng=rng) for row in ids]
        b = {key: torch.from_numpy(np.stack([r[key] for r in rows])) for key in ("input_ids", "mlm_labels",
                                                                                 "perm_rank")}
        b["attention_mask"] = torch.ones_like(b["input_ids"])
        b["token_type_ids"] = torch.zeros_like(b["input_ids"])
        targets = b["mlm_labels"].ne(-100)
        mapping, valid = target_mapping_of(targets)
        labels = torch.full(valid.shape, -100, dtype=torch.long)
        labels[valid] = b["mlm_labels"][targets]
        hf = dict(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"], attention_mask=b["attention_mask"],
                  perm_mask=permutation_mask(b["perm_rank"]).float(), target_mapping=mapping, labels=labels)
        mlm = dict(b, mlm_labels=b["mlm_labels"], input_ids=b["input_ids"].masked_fill(targets, 3))
        mlm.pop("perm_rank")
        out.append(dict(ours=b, hf=hf, mlm=mlm))
    return out


def hf_twin(ours):
    """transformers' XLNetLMHeadModel with bertforge's weights (saved, then loaded the way users load it)."""
    import tempfile

    from transformers import XLNetLMHeadModel
    with tempfile.TemporaryDirectory() as d:
        ours.save_pretrained(d)
        return XLNetLMHeadModel.from_pretrained(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="mini")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"),
                    default=["fp32"] + (["bf16"] if default_precision() == "bf16" else []))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "xlnet.json"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    cfg = compose("xlnet", args.size, vocab_size=args.vocab, pad_token_id=0)
    batches = plm_batches(4, args.batch_size, args.seq_len, args.vocab, args.k, seed=0)

    torch.manual_seed(0)
    probe = build_objective("plm", cfg).eval()
    twin = hf_twin(probe).eval()
    with torch.no_grad():
        b = batches[0]
        ours_logits = probe.lm_loss(probe.bert(b["ours"]["input_ids"], None, b["ours"]["token_type_ids"],
                                               b["hf"]["perm_mask"], b["hf"]["target_mapping"]).last_hidden_state)
        hf_logits = twin(**{k: v for k, v in b["hf"].items() if k != "labels"}, use_mems=False).logits
    max_diff = float((ours_logits - hf_logits).abs().max())
    print(f"same weights, same inputs: max |logit difference| = {max_diff:.2e}", flush=True)

    runners, meta = [], []
    for precision in args.precisions:
        for lib in ("transformers", "bertforge", "bertforge-mlm"):
            torch.manual_seed(0)
            if lib == "transformers":
                model = hf_twin(build_objective("plm", cfg))
                fn = (lambda m, b: m(**b["hf"], use_mems=False).loss)
            elif lib == "bertforge":
                model, fn = build_objective("plm", cfg), (lambda m, b: m(**b["ours"])["loss"])
            else:
                model = build_objective("mlm", compose("bert", args.size, vocab_size=args.vocab, pad_token_id=0))
                fn = (lambda m, b: m(**b["mlm"])["loss"])
            runners.append(Runner(model, fn, bf16=precision == "bf16"))
            meta.append((lib, precision))
    interleaved(runners, batches, args.steps, args.warmup)

    tokens = args.batch_size * args.seq_len
    rows = []
    for r, (lib, precision) in zip(runners, meta):
        sec, med = min(r.times), sorted(r.times)[len(r.times) // 2]
        rows.append(dict(library=lib, precision=precision, step_s=sec, step_s_median=med, tokens_per_s=tokens / sec))
    by = {(r["library"], r["precision"]): r for r in rows}
    ratios = {f"{p}_bertforge_vs_transformers": by["transformers", p]["step_s"] / by["bertforge", p]["step_s"]
              for p in args.precisions}
    ratios.update({f"{p}_plm_step_in_mlm_steps": by["bertforge", p]["step_s"] / by["bertforge-mlm", p]["step_s"]
                   for p in args.precisions})
    print("\n| library | objective | precision | ms/step (min) | ms/step (median) | tokens/s |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        lib, obj = ("bertforge", "MLM (BERT encoder)") if r["library"] == "bertforge-mlm" else (r["library"], "PLM")
        print(f"| {lib} | {obj} | {r['precision']} | {r['step_s'] * 1000:.1f} | {r['step_s_median'] * 1000:.1f} | "
              f"{r['tokens_per_s']:.0f} |")
    for k, v in ratios.items():
        print(f"ratio {k}: {v:.2f}x")
    load_end = os.getloadavg()[0]
    print(f"load average: start {load_start:.2f}, end {load_end:.2f}")
    result = dict(config=dict(size=args.size, vocab=args.vocab, seq_len=args.seq_len, batch_size=args.batch_size,
                              k=args.k, steps=args.steps, warmup=args.warmup, threads=args.threads,
                              precisions=args.precisions),
                  machine=dict(platform=platform.platform(), cpu_count=os.cpu_count(), torch=torch.__version__,
                               loadavg_start=load_start, loadavg_end=load_end),
                  max_logit_diff_fp32=max_diff, rows=rows, ratios=ratios)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
