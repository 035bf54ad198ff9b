"""REALM pre-training's two costs: one training step (retrieve top k from the stale index, re-embed the k + 1
candidates with the document tower, read k + 1 joined inputs, marginal loss, backward, AdamW) and one refresh of the
knowledge index (the whole corpus embedded by the document tower + the FAISS flat index rebuilt), and the share of
training time the refresh takes when it is amortised over --refresh-every steps:

    share = refresh / (refresh_every * step + refresh)

The knowledge corpus: Project Gutenberg (the books of --data, header and footer stripped) cut into 100-word passages
(about 130 WordPiece tokens, REALM's blocks are up to 288); the training sentences are the passages' own sentences with
a salient span. The refresh is measured at --passages (what finishes here in minutes) and extrapolated linearly to
--target (100k: embedding is linear in the corpus; the flat index's build and search, measured too, are small beside
it). Prints a table; writes benchmarks/results/realm_step.json.

    nice -n 10 python benchmarks/realm_step.py --passages 1500 --batch-size 4 --steps 3   # bert-mini, CPU, ~4 min
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_common import book_words, save  # noqa: E402

WORDS = 100




def passages_of(data: Path, n: int):
    from bertforge.retrieval.passages import Passage, Passages

    out = Passages()
    for book in sorted(data.glob("*.txt")):
        words = book_words(book)
        for start in range(0, len(words) - WORDS + 1, WORDS):
            if len(out) == n:
                return out
            out.append(Passage(f"{book.stem}:{start}", "", " ".join(words[start:start + WORDS])))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/work/shared/data/gutenberg"))
    ap.add_argument("--passages", type=int, default=5000)
    ap.add_argument("--target", type=int, default=100_000)
    ap.add_argument("--size", default="bert-mini")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--projection-dim", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5, help="timed steps (after one untimed)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default: 1, fastest on a shared machine)")
    ap.add_argument("--refresh-every", type=int, nargs="+", default=[100, 500, 1000])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "realm_step.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from bertforge.pretraining.objectives import build_objective
    from bertforge.pretraining.recipes import RECIPES
    from bertforge.retrieval.realm_data import RealmCollator, RealmSentences
    from bertforge.retrieval.realm_knowledge import KnowledgeIndex
    from bertforge.retrieval.realm_model import RealmModel, projected_tower
    from bertforge.tokenization import Tokenizer

    passages = passages_of(args.data, args.passages)
    print(f"{len(passages):,} passages of {WORDS} words from {args.data}", flush=True)
    tok = Tokenizer.train(passages.texts[:2000], kind="wordpiece", vocab_size=8192)
    torch.manual_seed(0)
    cfg = RECIPES["realm"].model_config(args.size, tok.vocab_size, tok.pad_token_id, args.seq_len)
    reader = build_objective("mlm", cfg)
    query = projected_tower(copy.deepcopy(reader.bert), tok, args.projection_dim, args.seq_len)
    document = projected_tower(copy.deepcopy(reader.bert), tok, args.projection_dim, args.seq_len)
    knowledge = KnowledgeIndex(passages)
    sentences = RealmSentences(passages.texts[:2000], knowledge.sources_of)
    with tempfile.TemporaryDirectory() as tmp:
        model = RealmModel(reader, query, document, knowledge, tok, k=args.k, refresh_every=10**9,
                           seq_len=args.seq_len, out_dir=Path(tmp), progress=True)
        t = time.perf_counter()
        model.refresh()  # embedding + flat index + OUT/knowledge written atomically
        refresh_s = time.perf_counter() - t
        t = time.perf_counter()
        knowledge.set_vectors(knowledge.vectors, 0)
        build_s = time.perf_counter() - t
        rng = np.random.default_rng(0)
        q = rng.standard_normal((args.batch_size, args.projection_dim)).astype(np.float32)
        t = time.perf_counter()
        for _ in range(20):
            knowledge.search(q, args.k, [set()] * args.batch_size)
        search_s = (time.perf_counter() - t) / 20
        # the search at the target size, measured (random vectors: a flat search's cost does not depend on them)
        big = KnowledgeIndex(passages)
        big.texts = [""] * args.target
        big.set_vectors(rng.standard_normal((args.target, args.projection_dim)).astype(np.float32), 0)
        t = time.perf_counter()
        for _ in range(5):
            big.search(q, args.k, [set()] * args.batch_size)
        target_search_s = (time.perf_counter() - t) / 5
        del big

        collate = RealmCollator(tok, tok.mask_token, args.seq_len // 2)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model.train()
        step_times, forward_times = [], []
        for i in range(args.steps + 1):
            batch = collate([sentences[(i * args.batch_size + j) % len(sentences)] for j in range(args.batch_size)])
            t = time.perf_counter()
            out = model(**batch)
            t_fwd = time.perf_counter() - t
            out["loss"].backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i:  # the first step warms the allocator and caches
                step_times.append(time.perf_counter() - t)
                forward_times.append(t_fwd)
    step_s = float(np.median(step_times))
    per_passage = refresh_s / len(passages)
    target_refresh = per_passage * args.target
    shares = {str(r): {"measured": refresh_s / (r * step_s + refresh_s),
                       "at_target": target_refresh / (r * step_s + target_refresh)} for r in args.refresh_every}
    result = {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                    "torch": torch.__version__, "note": "a 2-core machine shared with other jobs; run with nice"},
        "model": {"size": args.size, "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
                  "seq_len": args.seq_len, "projection_dim": args.projection_dim, "vocab": tok.vocab_size},
        "batch_size": args.batch_size, "k": args.k, "candidates": args.k + 1,
        "step_s": round(step_s, 3), "step_forward_s": round(float(np.median(forward_times)), 3),
        "passages": len(passages), "refresh_s": round(refresh_s, 2),
        "refresh_passages_per_s": round(len(passages) / refresh_s, 1),
        "flat_index_build_s": round(build_s, 4), "flat_search_batch_s": round(search_s, 5),
        "target_passages": args.target, "target_refresh_s_extrapolated": round(target_refresh, 1),
        "target_search_batch_s": round(target_search_s, 4),
        "refresh_share": {r: {k: round(v, 4) for k, v in s.items()} for r, s in shares.items()},
    }
    print(f"\nREALM step ({args.size}, batch {args.batch_size}, k {args.k} + null, seq {args.seq_len}): "
          f"{step_s:.2f} s (forward {result['step_forward_s']:.2f} s)")
    print(f"refresh of {len(passages):,} passages: {refresh_s:.1f} s ({result['refresh_passages_per_s']:.0f} "
          f"passages/s); at {args.target:,} (linear): {target_refresh:.0f} s")
    print(f"flat index: build {build_s * 1e3:.1f} ms, search of a batch {search_s * 1e3:.2f} ms "
          f"(at {args.target:,}, measured: {target_search_s * 1e3:.1f} ms)")
    print("\n| refresh every | refresh share (measured corpus) | refresh share (target corpus) |")
    print("|---:|---:|---:|")
    for r, s in shares.items():
        print(f"| {r} | {s['measured']:.1%} | {s['at_target']:.1%} |")
    old = json.loads(args.out.read_text()) if args.out.is_file() else {}
    old[f"{args.size}-{len(passages)}"] = result
    save(args.out, old)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
