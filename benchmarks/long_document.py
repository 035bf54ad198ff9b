"""Does a longified model read a long document better than its short source reading 512-token windows?

Held-out books are cut into passages of `--windows` x 510 content tokens (8 x 510 = 4,080, i.e. 4,082 tokens with
[CLS] / [SEP]; paragraphs are joined with [SEP] exactly as `pretrain`'s full-sentences builder joins documents).
Each passage is masked once, with `Masker` at 15% (80/10/10) and a fixed seed, and every arm predicts the SAME
corrupted passage at the SAME positions:

    windows  a model reading the passage as independent 512-token windows ([CLS] 510 tokens [SEP] each)
    full     a long model (Longformer) reading the whole passage at once, [CLS] global (as in pretraining)

Reported per arm: MLM accuracy and loss over all masked tokens, the same split by distance to the nearest 512-window
boundary ("edge": within --edge tokens of a window's end, where the windows lose context; "interior": the rest),
accuracy on the "far-only" tokens (the masked token occurs elsewhere in the passage, but only outside its own
512-window: what a whole-passage reader can copy and a window reader cannot),
the per-passage accuracy difference to the first arm (mean and standard error, a paired comparison), and the
training that produced the checkpoint (steps, tokens seen, training seconds, from its eval_results.json).

    python benchmarks/long_document.py --heldout BOOKS_DIR \
        --arm "short-512 windows"=windows:RUNS/short512 --arm "longified"=full:RUNS/long-init \
        --arm "longified + MLM"=full:RUNS/long-mlm --arm "control"=windows:RUNS/short512-more \
        [--passages-per-book 3] [--windows 8] [--seed 0] [--threads 2] [--out benchmarks/results/long_document.json]

`--pipeline RUNS --train TRAIN_BOOKS` first makes the checkpoints (pretrain a short model, longify it, continue
MLM on long passages, and the fair control: the short model continued on 512-token windows for the same budget),
then evaluates the five arms (the long model also reading windows); `--dry-run` prints those commands. See
docs/long.md, "Evidence: a long-document result", for the run these defaults reproduce.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.model.checkpoint import load_pretrained
from bertforge.config import ModelConfig
from bertforge.data.corpus import find_files, iter_documents, split_sentences
from bertforge.data.masking import IGNORE_INDEX, Masker, mask_rng
from bertforge.io.write import atomic_write_text
from bertforge.io.read import read_json
from bertforge.pretraining.objectives import build_objective
from bertforge.tokenization import Tokenizer

WINDOW = 512  # the short model's context: [CLS] + 510 tokens + [SEP]


# ---- passages -----------------------------------------------------------------------------------------------------
def book_stream(path: Path, tok: Tokenizer) -> np.ndarray:
    """A book's token ids as pretraining sees them: paragraphs (documents) of sentence-by-sentence encodings, joined
    by [SEP] (`data.examples.FullSentences`); Gutenberg headers and footers stripped by the corpus reader."""
    parts: list[list[int]] = []
    for doc in iter_documents([path]):
        ids = [i for s, _ in tok.encode_words(split_sentences(doc.text)) for i in s]
        if ids:
            parts.append(ids)
    out: list[int] = []
    for ids in parts:
        if out:
            out.append(tok.sep_token_id)
        out.extend(ids)
    return np.asarray(out, np.int64)


def passages(heldout: str, tok: Tokenizer, content: int, per_book: int) -> list[tuple[str, np.ndarray]]:
    """Up to `per_book` non-overlapping passages of `content` tokens per book, spread evenly through the book,
    each as [CLS] content [SEP]."""
    out = []
    for path in find_files([heldout]):
        stream = book_stream(path, tok)
        n = min(per_book, len(stream) // content)
        if n == 0:
            continue
        starts = np.linspace(0, len(stream) - content, n).astype(int) if n > 1 else [0]
        for s in starts:
            ids = np.concatenate([[tok.cls_token_id], stream[s:s + content], [tok.sep_token_id]])
            out.append((f"{path.name}@{s}", ids))
    return out


def masked(passage_ids: list[np.ndarray], tok: Tokenizer, seed: int, prob: float) -> list[dict[str, np.ndarray]]:
    masker = Masker(tok.vocab_size, tok.mask_token_id, tok.special_ids, mlm_probability=prob)
    return [masker(ids, rng=mask_rng(seed, 0, i)) for i, ids in enumerate(passage_ids)]


# ---- the arms -----------------------------------------------------------------------------------------------------
def load_mlm(directory: Path) -> torch.nn.Module:
    cfg = ModelConfig.from_file(directory).replace(extra={})
    model = build_objective("mlm", cfg, keep_pooler=True)
    load_pretrained(model, directory)
    return model.eval()


def as_windows(ids: np.ndarray, cls_id: int, sep_id: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """[CLS] c [SEP] -> independent windows [CLS] c[k*510:(k+1)*510] [SEP] (the last padded), their attention mask,
    and the flat index of each passage position in the windows (-1 for the passage's own [CLS] / [SEP])."""
    body, step = ids[1:-1], WINDOW - 2
    rows, attn, where = [], [], np.full(len(ids), -1, np.int64)
    for k in range(0, len(body), step):
        chunk = body[k:k + step]
        where[1 + k:1 + k + len(chunk)] = len(rows) * WINDOW + 1 + np.arange(len(chunk))
        rows.append(np.concatenate([[cls_id], chunk, [sep_id], np.zeros(step - len(chunk), np.int64)]))
        attn.append(np.arange(WINDOW) < len(chunk) + 2)
    return torch.as_tensor(np.stack(rows)), torch.as_tensor(np.stack(attn)).long(), where


@torch.no_grad()
def predict(model, mode: str, example: dict[str, np.ndarray], tok: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(log-probability of the right token, whether it is the argmax) at each masked position, in passage order."""
    labels = example["mlm_labels"]
    pos = np.flatnonzero(labels != IGNORE_INDEX)
    target = torch.as_tensor(labels[pos])
    if mode == "full":
        ids = torch.as_tensor(example["input_ids"])[None]
        mask = torch.zeros_like(ids, dtype=torch.bool)
        mask[0, pos] = True
        logits = model.predict_masked(ids, torch.ones_like(ids), positions=mask)
    else:
        rows, attn, where = as_windows(example["input_ids"], tok.cls_token_id, tok.sep_token_id)
        mask = torch.zeros(rows.numel(), dtype=torch.bool)
        mask[torch.as_tensor(where[pos])] = True  # flat order = passage order: the windows are consecutive
        logits = model.predict_masked(rows, attn, positions=mask.view_as(rows))
    logp = F.log_softmax(logits.float(), -1)
    return logp.gather(1, target[:, None])[:, 0].numpy(), (logits.argmax(-1) == target).numpy()


def edge_distance(length: int) -> np.ndarray:
    """Per passage position: tokens to the nearest end of its 512-token window (-1 for [CLS] / [SEP])."""
    step, k = WINDOW - 2, np.arange(length - 2)
    offset = k % step
    window_len = np.minimum(step, (length - 2) - (k - offset))
    d = np.full(length, -1)
    d[1:-1] = np.minimum(offset, window_len - 1 - offset)
    return d


def far_only(original: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Per masked position: its token occurs elsewhere in the passage, but only outside its own 512-window, so a
    window reader cannot copy it and a whole-passage reader can (names, rare words met earlier or later)."""
    step, out = WINDOW - 2, np.zeros(len(positions), bool)
    window = (np.arange(len(original)) - 1) // step
    window[0], window[-1] = -1, -2  # [CLS] / [SEP] belong to no window
    for i, pos in enumerate(positions):
        same = original == original[pos]
        same[pos] = False
        inside = same & (window == window[pos])
        out[i] = bool(same[1:-1].any()) and not inside.any()
    return out


def run_training_info(directory: Path) -> dict:
    f = directory / "eval_results.json"
    if not f.is_file():
        return {}
    r = read_json(f)
    return {"steps": r.get("steps"), "tokens_seen": r.get("tokens_seen"), "seq_len": r.get("seq_len"),
            "batch_size": r.get("batch_size"), "lr": r.get("lr"), "train_seconds": r.get("seconds", {}).get("train"),
            "pretrain_heldout_mlm_acc": r.get("heldout", {}).get("mlm_acc")}


def evaluate(args) -> dict:
    torch.set_num_threads(args.threads)
    arms = []
    for spec in args.arm:
        name, rest = spec.split("=", 1)
        mode, directory = rest.split(":", 1)
        if mode not in ("windows", "full"):
            raise SystemExit(f"--arm {spec}: mode must be windows or full")
        arms.append((name, mode, Path(directory)))
    tok = Tokenizer.from_pretrained(arms[0][2])
    content = args.windows * (WINDOW - 2)
    load0 = os.getloadavg()
    ps = passages(args.heldout, tok, content, args.passages_per_book)
    examples = masked([ids for _, ids in ps], tok, args.seed, args.mask_prob)
    dist = edge_distance(content + 2)
    far_masks = [far_only(ids, np.flatnonzero(ex["mlm_labels"] != IGNORE_INDEX)) for (_, ids), ex in zip(ps, examples)]
    results = []
    per_passage_acc: dict[str, np.ndarray] = {}
    for name, mode, directory in arms:
        model = load_mlm(directory)
        cfg = model.config
        t0 = time.perf_counter()
        lps, hits, near, far = [], [], [], []
        for ex, far_mask in zip(examples, far_masks):
            lp, hit = predict(model, mode, ex, tok)
            lps.append(lp)
            hits.append(hit)
            pos = np.flatnonzero(ex["mlm_labels"] != IGNORE_INDEX)
            near.append(dist[pos] < args.edge)
            far.append(far_mask)
        seconds = time.perf_counter() - t0
        lp, hit, edge, only = (np.concatenate(x) for x in (lps, hits, near, far))
        per_passage_acc[name] = np.array([h.mean() for h in hits])
        results.append({
            "arm": name, "reads": "512-token windows" if mode == "windows" else f"{content + 2} tokens at once",
            "model": str(directory), "model_type": cfg.model_type,
            "attention_window": cfg.attention_window if cfg.model_type == "longformer" else None,
            "mlm_acc": float(hit.mean()), "mlm_loss": float(-lp.mean()),
            "edge_acc": float(hit[edge].mean()), "interior_acc": float(hit[~edge].mean()),
            "far_only_acc": float(hit[only].mean()), "far_only_tokens": int(only.sum()),
            "eval_seconds": round(seconds, 1), "training": run_training_info(directory),
            "per_passage_acc": [round(float(a), 5) for a in per_passage_acc[name]]})
        print(f"  {name}: acc {hit.mean():.4f} loss {-lp.mean():.4f} ({seconds:.0f} s)", flush=True)
    base = arms[0][0]
    for r in results:
        diff = per_passage_acc[r["arm"]] - per_passage_acc[base]
        r["acc_diff_vs_first"] = {"mean": float(diff.mean()),
                                  "stderr": float(diff.std(ddof=1) / math.sqrt(len(diff))) if len(diff) > 1 else None}
    n_masked = sum(int((e["mlm_labels"] != IGNORE_INDEX).sum()) for e in examples)
    return {"heldout": str(args.heldout), "books": sorted({p.split("@")[0] for p, _ in ps}), "passages": len(ps),
            "passage_tokens": content + 2, "masked_tokens": n_masked, "mask_prob": args.mask_prob,
            "seed": args.seed, "edge_tokens": args.edge, "arms": results,
            "machine": {"cpu": _cpu_name(), "cores": os.cpu_count(), "threads": args.threads,
                        "torch": torch.__version__, "python": platform.python_version(),
                        "loadavg_start": [round(x, 2) for x in load0],
                        "loadavg_end": [round(x, 2) for x in os.getloadavg()]}}


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def table(res: dict) -> str:
    rows = ["| arm | reads | steps | tokens seen | train s | MLM acc | MLM loss | edge acc | interior acc | "
            "far-only acc | acc - first (± s.e.) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["arms"]:
        t, d = r["training"], r["acc_diff_vs_first"]
        fmt = lambda v, f: "-" if v is None else format(v, f)
        rows.append(f"| {r['arm']} | {r['reads']} | {fmt(t.get('steps'), ',')} | {fmt(t.get('tokens_seen'), ',')} | "
                    f"{fmt(t.get('train_seconds'), '.0f')} | {r['mlm_acc']:.4f} | {r['mlm_loss']:.3f} | "
                    f"{r['edge_acc']:.4f} | {r['interior_acc']:.4f} | {r['far_only_acc']:.4f} | "
                    f"{d['mean']:+.4f} ± {fmt(d['stderr'], '.4f')} |")
    return "\n".join(rows)


# ---- the runs (optional) ------------------------------------------------------------------------------------------
def pipeline(args) -> list[list[str]]:
    """The commands of docs/long.md's run: short model, longify, then equal wall clock of MLM at the long length
    and (the control) at 512, both on the short run's shards and with equal tokens per step (1 x 4,082, 8 x 512)."""
    r, bf = Path(args.pipeline), [sys.executable, "-m", "bertforge.cli"]
    common = ["--recipe", "roberta", "--precision", "fp32", "--seed", str(args.seed), "--threads", str(args.threads),
              "--no-progress"]
    long_len = args.windows * (WINDOW - 2) + 2
    shards = str(r / "short512" / "data")
    return [
        bf + ["pretrain", *common, "--size", args.size, "--seq-len", "512", "--batch-size", "8", "--vocab-size",
              "16384", "--corpus", args.train, "--time-budget", args.short_budget, "--out", str(r / "short512")],
        bf + ["longify", "--model", str(r / "short512"), "--max-length", str(long_len), "--attention-window",
              str(args.attention_window), "--out", str(r / "long-init")],
        bf + ["pretrain", *common, "--init-from", str(r / "long-init"), "--data", shards, "--seq-len",
              str(long_len), "--batch-size", "1", "--lr", args.continue_lr, "--time-budget", args.continue_budget,
              "--out", str(r / "long-mlm")],
        bf + ["pretrain", *common, "--init-from", str(r / "short512"), "--data", shards, "--seq-len", "512",
              "--batch-size", "8", "--lr", args.continue_lr, "--time-budget", args.continue_budget,
              "--out", str(r / "short512-more")],
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--heldout", required=True, help="folder (or file) of held-out books")
    p.add_argument("--arm", action="append", default=[], help="NAME=windows:DIR or NAME=full:DIR (first = baseline)")
    p.add_argument("--passages-per-book", type=int, default=3)
    p.add_argument("--windows", type=int, default=8, help="passage length in 510-token windows (default 8: 4,082)")
    p.add_argument("--mask-prob", type=float, default=0.15)
    p.add_argument("--edge", type=int, default=64, help="'edge' tokens: this close to a 512-window's end")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/long_document.json")
    p.add_argument("--pipeline", metavar="RUNS", help="make the four checkpoints under RUNS first")
    p.add_argument("--train", help="--pipeline: folder of training books (disjoint from --heldout)")
    p.add_argument("--size", default="bert-tiny")
    p.add_argument("--attention-window", type=int, default=512)
    p.add_argument("--short-budget", default="12m")
    p.add_argument("--continue-budget", default="20m")
    p.add_argument("--continue-lr", default="5e-4")
    p.add_argument("--dry-run", action="store_true", help="--pipeline: print the commands only")
    args = p.parse_args()
    if args.pipeline:
        if not args.train:
            raise SystemExit("--pipeline needs --train")
        for cmd in pipeline(args):
            print("$", " ".join(shlex.quote(c) for c in cmd), flush=True)
            if not args.dry_run:
                subprocess.run(cmd, check=True)
        if args.dry_run:
            return
        r = Path(args.pipeline)
        args.arm = args.arm or [f"short-512 windows=windows:{r / 'short512'}", f"longified=full:{r / 'long-init'}",
                                f"longified + long MLM=full:{r / 'long-mlm'}",
                                f"longified + long MLM, windows=windows:{r / 'long-mlm'}",
                                f"short-512 + 512 MLM, windows=windows:{r / 'short512-more'}"]
    if not args.arm:
        raise SystemExit("give --arm (or --pipeline)")
    res = evaluate(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(res, indent=2) + "\n")
    print(f"{res['passages']} passages of {res['passage_tokens']} tokens from {len(res['books'])} held-out books, "
          f"{res['masked_tokens']:,} masked tokens (seed {res['seed']}); load {res['machine']['loadavg_start']}")
    print(table(res))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
