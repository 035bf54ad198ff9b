"""BM25 through bertforge's index (retrieval.index, method bm25) side by side with bm25s alone: build, query, and
save + load, same run, same texts, same settings (lowercase, English stopwords, Lucene BM25 k1 1.5 b 0.75).

Corpora: the SQuAD v1.1 dev paragraphs (title + paragraph; its questions are the queries), and Project Gutenberg
books cut into 100-word passages (the PG header and footer stripped; title = the book's; queries: SQuAD's
questions again). Each timing is the best of --repeats runs, the two sides alternating; the top-10 rows of both
sides are compared. Writes benchmarks/results/bm25.json.

    nice -n 10 python benchmarks/bm25.py [--passages 100000] [--queries 2000] [--repeats 2]
"""
from __future__ import annotations

import argparse
import gc
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench_common import bench_lock, save

ROOT = Path(__file__).resolve().parent.parent
DATA = Path("/work/shared/data")
START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG")
END = re.compile(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG")


def squad(path: Path) -> tuple[list[tuple[str, str]], list[str]]:
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    passages = [(a["title"].replace("_", " "), p["context"]) for a in data for p in a["paragraphs"]]
    questions = [q["question"] for a in data for p in a["paragraphs"] for q in p["qas"]]
    return passages, questions


def gutenberg(folder: Path, limit: int, words: int = 100) -> list[tuple[str, str]]:
    """100-word passages of the books' bodies (between the PG START and END lines), book by book."""
    out: list[tuple[str, str]] = []
    for book in sorted(folder.glob("*.txt")):
        lines = book.read_text(encoding="utf-8", errors="replace").splitlines()
        title = next((ln[6:].strip() for ln in lines[:60] if ln.startswith("Title:")), book.stem)
        first = next((i + 1 for i, ln in enumerate(lines) if START.match(ln)), 0)
        last = next((i for i, ln in enumerate(lines) if END.match(ln)), len(lines))
        body = " ".join(lines[first:last]).split()
        for i in range(0, len(body) - words + 1, words):
            out.append((title, " ".join(body[i:i + words])))
            if len(out) == limit:
                return out
    return out


def best(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        result = None
        gc.collect()  # neither side pays for the garbage the other left
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return min(times), result


def measure(name: str, rows: list[tuple[str, str]], queries: list[str], repeats: int) -> dict:
    import bm25s

    from bertforge.retrieval.index import RetrievalIndex
    from bertforge.retrieval.passages import Passages, with_title

    passages = Passages([f"{name}:{i}" for i in range(len(rows))], [t for t, _ in rows], [x for _, x in rows])
    texts = [with_title(t, x) for t, x in rows]  # what bm25s alone indexes: the same strings bertforge builds

    def plain_build():
        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
        return retriever

    def ours_build():
        return RetrievalIndex.build(None, passages, method="bm25", progress=False)

    build = {"bm25s": [], "bertforge": []}
    for _ in range(repeats):  # alternating, so a burst of load on the shared machine hits both sides
        for side, fn in (("bm25s", plain_build), ("bertforge", ours_build)):
            t, obj = best(fn, 1)
            build[side].append(t)
            if side == "bm25s":
                plain = obj
            else:
                ours = obj

    docs = [{"id": i, "title": t, "text": x} for i, t, x in zip(passages.ids, passages.titles, passages.texts)]

    def plain_query():
        tokens = bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)
        return plain.retrieve(tokens, k=10, show_progress=False)

    def plain_docs_query():  # bm25s returning the passages themselves, as bertforge's hits do
        tokens = bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)
        return plain.retrieve(tokens, corpus=docs, k=10, show_progress=False)

    def ours_query():
        return ours.search(None, queries, k=10)

    query = {"bm25s": [], "bm25s+docs": [], "bertforge": []}
    for _ in range(repeats + 1):
        for side, fn in (("bm25s", plain_query), ("bertforge", ours_query), ("bm25s+docs", plain_docs_query)):
            t, obj = best(fn, 1)
            query[side].append(t)
            if side == "bm25s":
                plain_hits = obj
            elif side == "bertforge":
                ours_hits = obj
    # the same rows, in the same order, for every hit bertforge returns (it drops rows that score 0)
    same = all([int(h.id.rsplit(":", 1)[1]) for h in hits] == [int(r) for r, s in zip(rows_, scores_) if s > 0]
               for hits, rows_, scores_ in zip(ours_hits, plain_hits.documents, plain_hits.scores))

    tmp = Path(tempfile.mkdtemp(prefix="bm25-bench-"))
    try:
        def plain_io():  # with the passages, as bertforge keeps them
            d = tmp / f"plain-{time.perf_counter_ns()}"
            plain.save(str(d), corpus=docs, show_progress=False)
            return bm25s.BM25.load(str(d), load_corpus=True)

        def ours_io():
            d = tmp / f"ours-{time.perf_counter_ns()}"
            d.mkdir()
            ours.path = d
            ours.save()
            return RetrievalIndex.load(d)

        io = {"bm25s": [], "bertforge": []}
        for _ in range(repeats):
            for side, fn in (("bm25s", plain_io), ("bertforge", ours_io)):
                io[side].append(best(fn, 1)[0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        ours.path = None

    words = sum(len(x.split()) for _, x in rows)
    return {"corpus": name, "passages": len(rows), "words": words, "queries": len(queries), "same_top10": same,
            "build_s": {k: min(v) for k, v in build.items()},
            "query_ms": {k: 1000 * min(v) / len(queries) for k, v in query.items()},
            "save_load_s": {k: min(v) for k, v in io.items()},
            "runs": {"build_s": build, "query_s": query, "save_load_s": io}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passages", type=int, default=100_000, help="Gutenberg passages")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/bm25.json"))
    args = ap.parse_args()
    import bm25s

    paragraphs, questions = squad(DATA / "squad/dev-v1.1.json")
    queries = questions[:args.queries]
    books = gutenberg(DATA / "gutenberg", args.passages)
    results = []
    with bench_lock():
        for name, rows in (("squad-dev", paragraphs), ("gutenberg", books)):
            r = measure(name, rows, queries, args.repeats)
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "runs"}), flush=True)
    header = ("| corpus | passages | side | build s | ms a query: row numbers | ms a query: the passages | "
              "save + load s | same top 10 |")
    print("\n" + header + "\n|---|---:|---|---:|---:|---:|---:|---|")
    for r in results:
        q = r["query_ms"]
        for side, rows_only, with_docs in (("bm25s", q["bm25s"], q["bm25s+docs"]),
                                           ("bertforge", None, q["bertforge"])):
            print(f"| {r['corpus']} | {r['passages']:,} | {side} | {r['build_s'][side]:.2f} | "
                  f"{'' if rows_only is None else f'{rows_only:.3f}'} | {with_docs:.3f} | "
                  f"{r['save_load_s'][side]:.2f} | {r['same_top10']} |")
    save(Path(args.out), {"bm25s": bm25s.__version__, "repeats": args.repeats, "settings": {
        "lower": True, "stopwords": "en", "k1": 1.5, "b": 0.75, "method": "lucene"}, "results": results,
        "command": f"nice -n 10 python benchmarks/bm25.py --passages {args.passages} --queries {args.queries} "
                   f"--repeats {args.repeats}", "numpy": np.__version__})


if __name__ == "__main__":
    main()
