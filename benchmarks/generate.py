"""Decoding speed at batch 1 on CPU: bertforge with its KV cache, bertforge recomputing the whole prefix every step
(no cache), and transformers' `generate` on the same weights (with and without its cache), same settings, same run.

Greedy decoding of exactly --new-tokens tokens after a --prompt-tokens prompt (eos is switched off on both sides,
so every run does the same work); the outputs are checked to be token-identical. Rows are interleaved (one run of
each configuration in turn) and the median of --repeats runs is reported, with the min beside it. Models: the
checkpoint given with --model (e.g. the L6-H384 decoder pretrained on Gutenberg), and GPT-2 small's shape with
random weights (124M parameters, vocabulary 50257), where the matmuls rather than the per-step overhead dominate.

Two more rows put the ratio in context. "weights floor" multiplies one vector by every weight matrix of the model
(the blocks' projections and the vocabulary projection) once per token and does nothing else: at batch 1 each new
token must read every weight once, so no fp32 implementation decodes faster than this on the machine. The bf16 rows
run both libraries with their weights stored in bf16 (half the bytes to read per token); their tokens are compared
with fp32 transformers' as the share of positions that agree.

    python benchmarks/generate.py [--model DIR] [--shapes model,gpt2] [--new-tokens 128] [--threads 2]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bertforge.config import compose, preset
from bertforge.generation import generate_ids
from bertforge.model import DecoderLM


def no_cache_greedy(lm: DecoderLM, ids: torch.Tensor, n: int) -> torch.Tensor:
    """The loop without a cache (nanoGPT's `generate`): every step runs the whole sequence again."""
    with torch.inference_mode():
        for _ in range(n):
            nxt = lm.lm_logits(ids, last_only=True).argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
    return ids


def weights_floor(lm: DecoderLM, n: int):
    """n steps of: one vector times every weight matrix (nn.Linear, the tied vocabulary projection included)."""
    weights = [m.weight for m in lm.modules() if isinstance(m, torch.nn.Linear)]
    x = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype) for w in weights}

    def run() -> None:
        with torch.inference_mode():
            for _ in range(n):
                for w in weights:
                    torch.nn.functional.linear(x[w.shape[1]], w)
    return run


def runners(lm: DecoderLM, hf, ids: torch.Tensor, n: int) -> dict:
    hf.generation_config.eos_token_id = None  # exactly n new tokens, as ours with stop_at_eos=False
    hf.generation_config.pad_token_id = 0
    lm16, hf16 = copy.deepcopy(lm).to(torch.bfloat16), copy.deepcopy(hf).to(torch.bfloat16)
    return {
        "weights floor (fp32)": weights_floor(lm, n),
        "bertforge (KV cache, bf16 weights)": lambda: generate_ids(lm16, ids, max_new_tokens=n, greedy=True,
                                                                   stop_at_eos=False),
        "transformers generate (cache, bf16 weights)": lambda: hf16.generate(ids, max_new_tokens=n, do_sample=False),
        "bertforge (KV cache)": lambda: generate_ids(lm, ids, max_new_tokens=n, greedy=True, stop_at_eos=False),
        "bertforge (no cache)": lambda: no_cache_greedy(lm, ids, n),
        "transformers generate (cache)": lambda: hf.generate(ids, max_new_tokens=n, do_sample=False),
        "transformers generate (no cache)": lambda: hf.generate(ids, max_new_tokens=n, do_sample=False,
                                                                use_cache=False),
    }


def measure(name: str, lm: DecoderLM, hf, prompt_tokens: int, n: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, lm.config.vocab_size, (1, prompt_tokens), generator=g)
    fns = runners(lm, hf, ids, n)
    outputs = {k: f() for k, f in fns.items()}  # warm-up, and the outputs to compare
    reference = outputs["transformers generate (cache)"]
    identical = {k: o is not None and o.tolist() == reference.tolist() for k, o in outputs.items()}
    agree = {k: float((o[0, -n:] == reference[0, -n:]).float().mean()) for k, o in outputs.items() if o is not None}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    rows = []
    for k, ts in times.items():
        med = statistics.median(ts)
        rows.append(dict(shape=name, runner=k, seconds_median=med, seconds_min=min(ts), tokens_per_s=n / med,
                         tokens_per_s_best=n / min(ts), identical_to_transformers=identical[k],
                         tokens_agreeing_with_transformers_fp32=agree.get(k)))
    by = {r["runner"]: r["tokens_per_s"] for r in rows}
    ratios = {"cache_vs_transformers_cache": by["bertforge (KV cache)"] / by["transformers generate (cache)"],
              "transformers_cache_vs_weights_floor": by["transformers generate (cache)"] / by["weights floor (fp32)"],
              "bertforge_cache_vs_weights_floor": by["bertforge (KV cache)"] / by["weights floor (fp32)"],
              "bf16_vs_bf16": by["bertforge (KV cache, bf16 weights)"]
              / by["transformers generate (cache, bf16 weights)"],
              "bertforge_bf16_vs_transformers_fp32": by["bertforge (KV cache, bf16 weights)"]
              / by["transformers generate (cache)"],
              "cache_vs_no_cache": by["bertforge (KV cache)"] / by["bertforge (no cache)"],
              "transformers_cache_vs_no_cache": by["transformers generate (cache)"]
              / by["transformers generate (no cache)"]}
    return dict(shape=name, parameters=lm.num_parameters(), layers=lm.config.num_hidden_layers,
                hidden=lm.config.hidden_size, vocab=lm.config.vocab_size, rows=rows, ratios=ratios)


def load_pair(path: Path):
    import transformers
    transformers.logging.set_verbosity_error()
    return DecoderLM.from_pretrained(path), transformers.GPT2LMHeadModel.from_pretrained(path).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a decoder checkpoint (default: a random model of the l6-h384 shape)")
    ap.add_argument("--shapes", default="model,gpt2", help="model (--model or l6-h384) and/or gpt2 (GPT-2 small)")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "generate.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    results = []
    for shape in args.shapes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            if shape == "model" and args.model:
                path, name = Path(args.model), Path(args.model).name
            else:
                cfg = (preset("gpt2") if shape == "gpt2" else
                       compose("gpt2", "l6-h384", vocab_size=8192, max_position_embeddings=256))
                torch.manual_seed(0)
                DecoderLM(cfg).save_pretrained(tmp)
                path, name = Path(tmp), ("gpt2-small (random)" if shape == "gpt2" else "l6-h384 (random)")
            lm, hf = load_pair(path)
            res = measure(name, lm, hf, args.prompt_tokens, args.new_tokens, args.repeats)
        results.append(res)
        print(f"\n{name}: {res['parameters'] / 1e6:.1f}M parameters, prompt {args.prompt_tokens}, "
              f"{args.new_tokens} new tokens, batch 1, greedy, {args.threads} threads")
        print("| runner | tokens/s (median) | tokens/s (best) | same tokens as transformers fp32 |")
        print("|---|---:|---:|---|")
        for r in res["rows"]:
            a = r["tokens_agreeing_with_transformers_fp32"]
            same = "-" if a is None else ("yes" if r["identical_to_transformers"] else f"{100 * a:.0f}% of positions")
            print(f"| {r['runner']} | {r['tokens_per_s']:.1f} | {r['tokens_per_s_best']:.1f} | {same} |")
        for k, v in res["ratios"].items():
            print(f"ratio {k}: {v:.2f}x")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = dict(config=dict(prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens, repeats=args.repeats,
                           threads=args.threads, batch=1, decoding="greedy", model=args.model),
               machine=dict(platform=platform.platform(), cpu_count=os.cpu_count(), torch=torch.__version__,
                            loadavg_start=load_start, loadavg_end=os.getloadavg()[0]),
               results=results)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
