"""Question generation from SQuAD with T5 and BART: pretrain each for a wall-clock budget (or take a checkpoint),
fine-tune on answer + context -> question, and score the dev articles' questions against the copy baseline.

    python benchmarks/seq2seq_qg.py [--budget 10m] [--families t5 bart] [--size bert-tiny] [--context paragraph]
                                    [--finetune-epochs 3] [--eval-limit 500] [--out runs/seq2seq-qg]
    python benchmarks/seq2seq_qg.py --t5-model DIR --bart-model DIR ...      (fine-tune given checkpoints)

Data (`bertforge.tasks.qg.build_qg`): ../shared/data/squad/dev-v1.1.json (the only SQuAD file here), split by
article: the last --dev-articles (8: 1,589 questions) are dev, never seen in pretraining or fine-tuning; the first 40
(8,981 questions) train. Source "answer: A context: C" (C the paragraph, or with --context sentence only the
answer's sentence), target the question.

Pretraining (`bertforge pretrain --recipe t5 | bart`, `pretraining.run.pretrain`): the train articles' paragraphs
(in-domain, no dev passage) plus --books Gutenberg novels, one tokenizer per family trained on that text (T5's
Unigram with 100 sentinels, BART's byte-level BPE), --size's shape in both stacks, --seq-len, the same wall clock
for both families, each run alone under the shared benchmark lock (/tmp/bertforge-bench.lock) with `uptime`
before and after. Its held-out denoising metrics (target perplexity vs a unigram model of the text) are recorded.

Fine-tuning (`bertforge finetune --task seq2seq`): one fixed recipe for both families (AdamW lr --lr, batch 32,
10% warm-up, linear decay, seed 42, --precision: by default bf16 autocast where the hardware computes it natively,
else fp32, for pretraining and fine-tuning alike), sources cut to --max-source-len tokens, questions to 48; greedy
decoding on the first --eval-limit dev questions (in file order) after every epoch, the best epoch by ROUGE-L.
Metrics: sacrebleu corpus BLEU, rouge-score ROUGE-1/2/L F1 (x100); the copy baseline scores the source itself as
the question. Writes --results (JSON, rewritten after every step) and prints a table.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import time
from pathlib import Path

import torch
from bench_common import bench_lock, save

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / ".." / "shared" / "data"
METRICS = ("bleu", "rouge1", "rouge2", "rougeL")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def pretraining_corpus(out: Path, squad: Path, n_train_articles: int, books: int, data: Path) -> list[str]:
    """OUT/corpus/squad_train.txt (the train articles' paragraphs, blank-line separated) + the first N books."""
    from bertforge.tasks.qg import train_contexts

    d = out / "corpus"
    d.mkdir(parents=True, exist_ok=True)
    paragraphs = train_contexts(squad, n_train_articles)
    (d / "squad_train.txt").write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    novels = sorted((data / "gutenberg").glob("*.txt"))[:books]
    return [str(d / "squad_train.txt"), *map(str, novels)]


def pretrain_family(family: str, corpus: list[str], args, out: Path) -> dict:
    from bertforge.pretraining.options import PretrainOptions
    from bertforge.pretraining.recipes import resolve
    from bertforge.pretraining.run import pretrain

    opts = PretrainOptions(recipe=resolve(family), out=out, corpus=corpus, vocab_size=args.vocab_size,
                           size=args.size, seq_len=args.seq_len, batch_size=args.batch_size,
                           time_budget=args.budget, precision=args.precision, seed=0, threads=args.threads,
                           progress=False, eval_batches=10, log_every=50, overwrite=True, fill_mask_examples=2)
    before = uptime()
    with bench_lock() if args.lock else contextlib.nullcontext():
        result = pretrain(opts)
    return {"dir": str(out), "steps": result["steps"], "seconds": result["seconds"], "heldout": result["heldout"],
            "tokens_seen": result["tokens_seen"], "parameters": result["parameters"], "lr": result["lr"],
            "denoising": result.get("denoising", []), "uptime_before": before, "uptime_after": uptime()}


def finetune_family(model: Path, data: Path, args, out: Path) -> dict:
    from bertforge.tasks.finetune import FinetuneConfig, finetune

    cfg = FinetuneConfig(task="seq2seq", model=model, out=out, data=data, max_seq_len=args.max_source_len,
                         max_target_len=48, epochs=args.finetune_epochs, lr=args.lr, batch_size=32,
                         eval_batch_size=64, eval_limit=args.eval_limit, train_limit=args.train_limit,
                         num_beams=args.num_beams, seed=42, progress=False, precision=args.precision)
    t0 = time.time()
    result = finetune(cfg, overwrite=True)
    run = result.runs[0]
    return {"dir": str(out), "best": run["best"], "steps": run["steps"], "seconds": round(time.time() - t0, 1),
            "train_examples": run["train_examples"], "predictions": str(out / "predictions.jsonl")}


def print_table(result: dict) -> None:
    rows = []
    for fam, r in result["families"].items():
        if "finetune" in r:
            rows.append((fam, r["finetune"]["best"]))
    if not rows:
        return
    copy = rows[0][1]
    print(f"\n{'model':<16}" + "".join(f"{m:>9}" for m in METRICS))
    print(f"{'copy source':<16}" + "".join(f"{copy['copy_' + m]:>9.2f}" for m in METRICS))
    for fam, best in rows:
        print(f"{fam:<16}" + "".join(f"{best[m]:>9.2f}" for m in METRICS))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="+", choices=("t5", "bart"), default=["t5", "bart"])
    p.add_argument("--budget", default="10m", help="pretraining wall clock per family (default: 10m)")
    p.add_argument("--size", default="bert-tiny", help="the shape of both stacks (default: bert-tiny)")
    p.add_argument("--seq-len", type=int, default=128, help="pretraining sequence length (default: 128)")
    p.add_argument("--batch-size", type=int, default=32, help="pretraining batch size (default: 32)")
    p.add_argument("--vocab-size", type=int, default=8192, help="tokenizer vocabulary (default: 8192)")
    p.add_argument("--books", type=int, default=4, help="Gutenberg novels added to the pretraining text (default: 4)")
    p.add_argument("--t5-model", type=Path, help="fine-tune this T5 checkpoint instead of pretraining one")
    p.add_argument("--bart-model", type=Path, help="fine-tune this BART checkpoint instead of pretraining one")
    p.add_argument("--context", choices=("paragraph", "sentence"), default="paragraph")
    p.add_argument("--dev-articles", type=int, default=8)
    p.add_argument("--max-source-len", type=int, default=256, help="source tokens (default: 256)")
    p.add_argument("--finetune-epochs", type=float, default=3.0)
    p.add_argument("--lr", type=float, default=1e-3, help="fine-tuning peak learning rate (default: 1e-3)")
    p.add_argument("--train-limit", type=int, help="first N training questions (default: all)")
    p.add_argument("--eval-limit", type=int, default=500, help="first N dev questions scored (default: 500)")
    p.add_argument("--num-beams", type=int, default=1)
    p.add_argument("--precision", choices=("fp32", "bf16"),
                   help="pretraining and fine-tuning precision (default: bf16 where the hardware has it, else fp32)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--no-lock", dest="lock", action="store_false",
                   help="pretrain without taking the shared benchmark lock (tests, smoke runs)")
    p.add_argument("--data", type=Path, default=SHARED,
                   help="folder with squad/dev-v1.1.json and gutenberg/ (default: ../shared/data)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "seq2seq-qg")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "seq2seq_qg.json")
    args = p.parse_args()
    if args.precision is None:
        from bertforge.device import default_precision

        args.precision = default_precision()
    if args.threads:
        torch.set_num_threads(args.threads)

    from bertforge.tasks.qg import build_qg

    squad = args.data / "squad" / "dev-v1.1.json"
    data = args.out / "data"
    info = build_qg(squad, data, args.dev_articles, args.context)
    print(f"QG data: {info['train']} train / {info['dev']} dev questions; dev articles {info['dev_articles']}",
          flush=True)
    result = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "data": info,
              "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                          "device": "cuda" if torch.cuda.is_available() else "cpu"},
              "families": {}}
    corpus = None
    for fam in args.families:
        given = getattr(args, f"{fam}_model")
        row: dict = {}
        if given is None:
            corpus = corpus or pretraining_corpus(args.out, squad, info["train_articles"], args.books, args.data)
            print(f"\n=== pretrain {fam} ({args.size}, {args.budget}) ===", flush=True)
            row["pretrain"] = pretrain_family(fam, corpus, args, args.out / f"pretrain-{fam}")
            model = args.out / f"pretrain-{fam}"
        else:
            model = given
            row["pretrain"] = {"dir": str(given), "given": True}
        result["families"][fam] = row
        save(args.results, result)
        print(f"\n=== fine-tune {fam} on question generation ===", flush=True)
        row["finetune"] = finetune_family(model, data, args, args.out / f"qg-{fam}")
        save(args.results, result)
    print_table(result)
    print(f"\nresults -> {args.results}")


if __name__ == "__main__":
    main()
