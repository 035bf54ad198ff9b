"""Pretraining quality: bert-mini pretrained on Project Gutenberg for a fixed wall-clock budget, then held-out MLM
accuracy on WikiText-2 test (another domain: encyclopaedic), next to the most-frequent-token baseline.

    python benchmarks/pretrain_quality.py [--budget 30m] [--recipe bert] [--size bert-mini] [--out DIR]

Writes benchmarks/results/pretrain_quality.json (and the run itself under --out).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(DATA / "gutenberg"))
    ap.add_argument("--eval-text", default=str(DATA / "wikitext-2-raw" / "wiki.test.raw"))
    ap.add_argument("--budget", default="30m", help="training wall clock (default: 30m)")
    ap.add_argument("--recipe", default="bert")
    ap.add_argument("--size", default="bert-mini")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--vocab-size", type=int, default=30522)
    ap.add_argument("--precision", default=None)
    ap.add_argument("--workers", type=int, default=2, help="tokenising processes for the corpus")
    ap.add_argument("--out", default="runs/pretrain-quality")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "pretrain_quality.json"))
    args = ap.parse_args()

    from bertforge.data import ShardedCorpus, prepare_corpus
    from bertforge.pretraining.recipes import resolve
    from bertforge.pretraining.inputs import make_dataset
    from bertforge.pretraining.metrics import mlm_metrics, token_frequencies
    from bertforge.pretraining.options import PretrainOptions
    from bertforge.device import default_precision
    from bertforge.pretraining.run import pretrain
    from bertforge.tokenization import Tokenizer

    out = Path(args.out)
    t0 = time.perf_counter()
    holder: dict = {}

    def wiki_eval(model):
        """MLM accuracy on WikiText-2 test: token masking (15%, fixed seed), full-sentence sequences."""
        tok = Tokenizer.from_pretrained(out / "tokenizer")
        wiki_dir = out / "wikitext-shards"
        prepare_corpus([args.eval_text], tok, wiki_dir, progress=False, heldout_fraction=0.0)
        wiki = ShardedCorpus(wiki_dir, split="all")
        ds = make_dataset(wiki, resolve("bert", objective="mlm", input_format="full-sentences"), args.seq_len,
                          seed=12345, static=True, dupe_factor=1)
        collate = ds.collator()
        batches = [collate([ds[i] for i in range(s, min(s + args.batch_size, len(ds)))])
                   for s in range(0, len(ds), args.batch_size)]
        # the baseline predicts the most frequent token of the *training* corpus
        counts = token_frequencies(ShardedCorpus(out / "data", split="train"))
        counts[list(wiki.special_ids)] = 0
        holder["wiki_tokens"] = wiki.total_tokens
        return mlm_metrics(model, batches, int(counts.argmax()), precision=opts.precision)

    opts = PretrainOptions(recipe=resolve(args.recipe), out=out, corpus=[args.corpus], vocab_size=args.vocab_size,
                           size=args.size, seq_len=args.seq_len, batch_size=args.batch_size,
                           time_budget=args.budget, precision=args.precision or default_precision(),
                           workers=args.workers, heldout_fraction=0.01, extra_eval=wiki_eval,
                           fill_mask_examples=3)
    res = pretrain(opts)
    result = {
        "setup": {"corpus": args.corpus, "eval": args.eval_text, "budget": args.budget, "recipe": args.recipe,
                  "size": args.size, "seq_len": args.seq_len, "batch_size": args.batch_size,
                  "vocab_size": args.vocab_size, "precision": opts.precision, "cpu_count": os.cpu_count()},
        "steps": res["steps"], "tokens_seen": res["tokens_seen"], "seconds": res["seconds"],
        "gutenberg_heldout": res["heldout"], "wikitext2_test": {**res["common"], "tokens": holder.get("wiki_tokens")},
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, path)
    w = result["wikitext2_test"]
    print(f"\nWikiText-2 test MLM accuracy {w['mlm_acc']:.3f} (baseline {w['baseline_acc']:.3f}, "
          f"{w['masked_tokens']} masked tokens) after {res['steps']} steps -> {path}")


if __name__ == "__main__":
    main()
