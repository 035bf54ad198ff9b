"""Sentence-embedding verbs: `embed`, `embed-train`, `embed-eval`, and `index build | add | query`."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bertforge.commands.needs import Need, index_needs, tracker_needs
from bertforge.commands.options import add_overwrite_arg, add_progress_arg, add_trainer_args, device_of
from bertforge.device import PRECISIONS, add_device_args
from bertforge.commands.bounds import COUNT, COUNT0, EPOCHS, FRACTION, POSITIVE, STEPS
from bertforge.commands.data_options import add_column_args, add_input_split_args
from bertforge.errors import BertforgeError

POOLINGS = ("mean", "cls", "max", "mean_sqrt_len")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("embed", help="encode texts (a text file, or a column of a table) to vectors (.npy or .jsonl)",
                       description="Encode one text per input row: the lines of a text file, or a column of a csv / "
                                   "tsv / jsonl / json / parquet file, a saved or Hub dataset. Empty rows are "
                                   "embedded as the empty string so output row i is input row i; texts longer than "
                                   "the model's max_seq_length are truncated.")
    p.add_argument("--model", required=True, metavar="DIR", help="sentence-transformers folder or HF encoder dir")
    p.add_argument("--input", required=True, metavar="PATH",
                   help="a UTF-8 text file (one text per line), or a table: csv / tsv (with a header), jsonl, json, "
                        "parquet, a save_to_disk folder, a Hub dataset id")
    add_column_args(p, pair=False, label=False)
    add_input_split_args(p)
    p.add_argument("--out", required=True, metavar="FILE", help="output .npy (float32 [N, dim]) or .jsonl")
    _encode_options(p)
    p.add_argument("--pooling", choices=POOLINGS, help="override the model's pooling (plain HF dirs: mean)")
    p.add_argument("--normalize", action="store_true", help="L2-normalise the vectors (ST models that end in "
                                                            "Normalize always are)")
    p.set_defaults(func=embed_command, needs=())

    p = sub.add_parser("embed-train", help="fine-tune a sentence encoder (cosine / softmax / triplet / mnrl loss)",
                       description="Fine-tune a bi-encoder on pair, scored-pair, NLI or triplet data and save it in "
                                   "the sentence-transformers layout.")
    p.add_argument("--model", required=True, metavar="DIR", help="starting model (ST folder or HF encoder dir)")
    p.add_argument("--train", required=True, metavar="PATH",
                   help="training pairs: tsv / csv / jsonl / json / parquet, a saved or Hub dataset (its train split); "
                        "layouts in docs/embeddings.md")
    p.add_argument("--out", required=True, metavar="DIR", help="where the trained model goes")
    p.add_argument("--loss", default="cosine", choices=("cosine", "softmax", "triplet", "mnrl"))
    p.add_argument("--epochs", type=EPOCHS, default=1.0)
    p.add_argument("--max-steps", type=STEPS, help="stop after this many steps (overrides --epochs)")
    p.add_argument("--batch-size", type=COUNT, default=16)
    p.add_argument("--lr", type=POSITIVE, default=2e-5)
    p.add_argument("--pooling", choices=POOLINGS, help="pooling for a plain HF dir (default mean)")
    p.add_argument("--eval", metavar="PATH", help="scored pairs for STS Spearman after training (a saved or Hub "
                                                   "dataset: its dev / validation split)")
    add_column_args(p)
    p.add_argument("--data-config", metavar="NAME", help="a Hugging Face Hub dataset's configuration (e.g. stsb)")
    add_trainer_args(p)
    p.set_defaults(func=train_command, needs=_train_needs)

    p = sub.add_parser("embed-eval", help="STS correlation or retrieval metrics of a sentence encoder (JSON)",
                       description="Print JSON: Spearman/Pearson of cosine vs gold (--sts), or Recall@k and MRR@10 "
                                   "of questions against passages (--squad, or --queries/--passages/--qrels).")
    p.add_argument("--model", required=True, metavar="DIR")
    p.add_argument("--sts", metavar="PATH", help="scored pairs (STS-benchmark layout, GLUE STS-B tsv, any table with "
                                                  "sentence1 / sentence2 / score, a saved or Hub dataset)")
    p.add_argument("--squad", metavar="FILE", help="SQuAD v1.1 json: questions retrieve their paragraphs")
    p.add_argument("--queries", metavar="FILE", help="query per line (with --passages and --qrels)")
    p.add_argument("--passages", metavar="FILE", help="passage per line")
    p.add_argument("--qrels", metavar="FILE", help="per line: comma-separated 0-based passage rows relevant to that "
                                                   "query")
    p.add_argument("--limit", type=COUNT, help="evaluate only the first N pairs / queries")
    add_column_args(p, "--sts: ")
    add_input_split_args(p)
    _encode_options(p)
    p.add_argument("--pooling", choices=POOLINGS)
    p.set_defaults(func=eval_command, progress=False, needs=(Need("embed", "scipy", "embed-eval"),))

    p = sub.add_parser("index", help="passage index (dense FAISS, BM25, or hybrid): build, add, query")
    isub = p.add_subparsers(dest="index_command", metavar="ACTION")
    b = isub.add_parser("build", help="index a corpus into an index directory (dense, bm25 or hybrid)")
    b.add_argument("--method", default="dense", choices=("dense", "bm25", "hybrid"),
                   help="dense: a sentence encoder's vectors (default); bm25: BM25 over words (no --model); hybrid: "
                        "both, fused (docs/retrieval.md)")
    b.add_argument("--model", metavar="DIR", help="the sentence encoder (dense and hybrid)")
    b.add_argument("--corpus", required=True, metavar="PATH",
                   help="one passage per line, or a table (csv / tsv / jsonl / json / parquet, a saved or Hub "
                        "dataset) with a text column and optional id and title columns")
    _corpus_columns(b)
    b.add_argument("--out", required=True, metavar="DIR")
    b.add_argument("--kind", choices=("flat", "hnsw", "ivf", "ivf-pq"),
                   help="the dense structure: flat, exact inner product on unit vectors (default); hnsw / ivf / "
                        "ivf-pq: approximate (ivf-pq: compressed to a few bytes a vector) (dense and hybrid)")
    b.add_argument("--fusion", choices=("weighted", "rrf"),
                   help="hybrid: weighted sum of min-max normalised scores (default) or reciprocal-rank fusion")
    b.add_argument("--alpha", type=FRACTION, help="hybrid, weighted: the dense score's weight, 0 to 1 (default 0.5)")
    b.add_argument("--stopwords", default="en", choices=("en", "none"),
                   help="bm25 and hybrid: drop English stopwords (default) or keep every word")
    b.add_argument("--pooling", choices=POOLINGS)
    _encode_options(b)
    add_overwrite_arg(b)
    _shard_options(b)
    b.set_defaults(func=index_build, needs=_index_needs)
    a = isub.add_parser("add", help="index more passages into an existing index (same model required)")
    a.add_argument("--index", required=True, metavar="DIR")
    a.add_argument("--corpus", required=True, metavar="PATH", help="passages, as for `index build`")
    _corpus_columns(a)
    a.add_argument("--model", metavar="DIR", help="default: the model recorded in the index (dense and hybrid)")
    a.add_argument("--batch-size", type=COUNT, default=32)
    _device_options(a)
    add_progress_arg(a)
    a.set_defaults(func=index_add, needs=_index_needs)
    q = isub.add_parser("query", help="top-k passages for a question")
    q.add_argument("--index", required=True, metavar="DIR")
    q.add_argument("question", nargs="+", help="one or more questions")
    q.add_argument("-k", type=COUNT, default=10,
                   help="hits per question (default 10; above the number of passages: all of them, with a warning)")
    q.add_argument("--model", metavar="DIR", help="default: the model recorded in the index (dense and hybrid)")
    q.add_argument("--fusion", choices=("weighted", "rrf"), help="a hybrid index: other than its recorded fusion")
    q.add_argument("--alpha", type=FRACTION, help="a hybrid index: other than its recorded dense weight")
    q.add_argument("--rerank", metavar="DIR", help="cross-encoder (BertForSequenceClassification with 1 label, or "
                                                    "2: label 1's logit scores) that re-orders the top-k")
    q.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    _device_options(q)
    q.set_defaults(func=index_query, needs=_index_needs)
    p.set_defaults(func=lambda args: _index_help(p))


def _train_needs(args: argparse.Namespace) -> tuple[Need, ...]:
    """--eval scores STS with scipy's Spearman."""
    return (*tracker_needs(args), *((Need("embed", "scipy", "embed-train --eval"),) if args.eval else ()))


def _shard_options(b: argparse.ArgumentParser) -> None:
    g = b.add_argument_group("a corpus-scale index from embedding shards (docs/retrieval.md)")
    g.add_argument("--num-shards", type=COUNT, metavar="N",
                   help="split the corpus into N shards (passage k goes to shard k mod N); default: torchrun's "
                        "WORLD_SIZE, or a Slurm job array's SLURM_ARRAY_TASK_COUNT, else no shards")
    g.add_argument("--shard-id", type=COUNT0, metavar="I",
                   help="embed only shard I (0..N-1) into OUT/shards; default: torchrun's RANK, or "
                        "SLURM_ARRAY_TASK_ID; with --num-shards alone every shard is built in turn, then merged")
    g.add_argument("--merge", action="store_true",
                   help="merge the finished shards in OUT into its index (--kind) instead of embedding")
    g.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="build the shards on a Ray cluster (default: start a local one), then merge")
    g.add_argument("--shard-dtype", default="float32", choices=("float32", "float16"),
                   help="how shards store vectors (float16: half the disk; the index is float32 either way)")
    g.add_argument("--chunk-size", type=COUNT, default=4096,
                   help="passages per committed chunk of a shard (a rerun after a kill redoes at most one)")


def _index_needs(args: argparse.Namespace) -> tuple[Need, ...]:
    """dense: faiss; bm25: bm25s; hybrid: both. `index add` / `query` read the method from the index's meta.json;
    --ray: ray."""
    what = f"index {args.index_command}"
    needs = index_needs(args.index if getattr(args, "method", None) is None else None, what,
                        getattr(args, "method", None))
    return (*needs, *((Need("ray", "ray", "index build --ray"),) if getattr(args, "ray", None) else ()))


def _corpus_columns(p: argparse.ArgumentParser) -> None:
    add_column_args(p, pair=False, label=False)
    p.add_argument("--id-col", metavar="COL",
                   help="the passage id column (default: the first of id, _id, doc_id, passage_id, pid present, "
                        "else FILE:ROW)")
    p.add_argument("--title-col", metavar="COL", help="the passage title column (default: title where there is one)")
    p.add_argument("--require-ids", action="store_true",
                   help="refuse a corpus without an id column (instead of naming passages FILE:ROW)")
    add_input_split_args(p)


def _encode_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-size", type=COUNT, default=32)
    add_device_args(p, PRECISIONS, "fp32", "fp32 (exact), bf16, fp16 (GPU only), or int8 (CPU only: dynamic "
                    "quantisation of the Linear layers)",
                    compile="torch.compile the encoder (pays off on long inputs; falls back to eager with one line)")
    add_progress_arg(p)


def _device_options(p: argparse.ArgumentParser) -> None:
    add_device_args(p, None, compile="torch.compile the encoder (pays off on long inputs; falls back to eager with "
                                     "one line)")


def _index_help(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2


# ---- embed ---------------------------------------------------------------------------------------------------------
def embed_command(args: argparse.Namespace) -> int:
    import numpy as np

    from bertforge.api import embed, read_texts
    from bertforge.io.write import atomic_write, prepare_output_file

    device_of(args)
    out = Path(args.out)
    if out.suffix not in (".npy", ".jsonl"):
        raise BertforgeError(f"--out {out}: use a .npy or .jsonl file name")
    prepare_output_file(out, what="--out")  # before the model is loaded and every text embedded
    texts = read_texts(args.input, args.text_col, split=args.data_split, config=args.data_config)
    vectors = embed(args.model, texts, batch_size=args.batch_size, device=args._placement, precision=args.precision,
                    pooling=args.pooling, normalize=True if args.normalize else None, compile=bool(args.compile),
                    progress=args.progress)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:  # a handle, so numpy does not append ".npy" to the temporary name
            if out.suffix == ".npy":
                np.save(fh, vectors)
            else:
                for i, (text, vec) in enumerate(zip(texts, vectors)):
                    rec = {"line": i + 1, "text": text, "embedding": [round(float(x), 7) for x in vec]}
                    fh.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
    atomic_write(out, write)
    print(f"{len(texts)} texts -> {out} ({vectors.shape[0]} x {vectors.shape[1]}, {args.precision})",
          file=sys.stderr)
    return 0


# ---- train / eval --------------------------------------------------------------------------------------------------
def train_command(args: argparse.Namespace) -> int:
    from bertforge.api import train_sentence_encoder

    result = train_sentence_encoder(
        args.model, args.train, out=args.out, loss=args.loss, eval=args.eval, text_col=args.text_col,
        text_pair_col=args.text_pair_col, label_col=args.label_col, data_config=args.data_config,
        epochs=args.epochs, max_steps=args.max_steps, batch_size=args.batch_size, lr=args.lr, pooling=args.pooling,
        seed=args.seed, device=args.device, precision=args.precision, compile=args.compile, progress=args.progress,
        report_to=args.report_to, logging_dir=args.logging_dir, overwrite=args.overwrite)
    print(json.dumps(result.to_dict(), indent=2))
    return 0


def eval_command(args: argparse.Namespace) -> int:
    from bertforge.api import evaluate_sentence_encoder

    if sum(x is not None for x in (args.sts, args.squad, args.queries)) != 1:
        raise BertforgeError("give exactly one of --sts FILE, --squad FILE, or --queries/--passages/--qrels")
    if args.queries is not None and (args.passages is None or args.qrels is None):
        raise BertforgeError("--queries needs --passages and --qrels")
    result = evaluate_sentence_encoder(
        args.model, sts=args.sts, squad=args.squad, queries=args.queries, passages=args.passages,
        relevant=args.qrels, limit=args.limit, text_col=args.text_col, text_pair_col=args.text_pair_col,
        label_col=args.label_col, data_split=args.data_split, data_config=args.data_config,
        batch_size=args.batch_size, device=args.device, precision=args.precision, pooling=args.pooling,
        progress=args.progress)
    result.update(model=str(args.model), precision=args.precision)
    print(json.dumps(result, indent=2))
    return 0


# ---- index ---------------------------------------------------------------------------------------------------------
def _corpus(args: argparse.Namespace) -> dict:
    """--corpus with its column and split flags, as `Index.build` / `Index.add` take them."""
    return dict(text_col=args.text_col, id_col=args.id_col, title_col=args.title_col, require_ids=args.require_ids,
                data_split=args.data_split, data_config=args.data_config, batch_size=args.batch_size,
                progress=args.progress)


def index_build(args: argparse.Namespace) -> int:
    from bertforge.api import Index

    if args.merge:
        if args.shard_id is not None or args.ray:
            raise BertforgeError("--merge merges finished shards: drop --shard-id / --ray")
        index = Index.merge(args.out, args.kind or "flat", model=args.model, num_shards=args.num_shards,
                            pooling=args.pooling, overwrite=args.overwrite, progress=args.progress)
        print(f"merged {len(index)} passages ({index.kind}, dim {index.dim}) -> {args.out}", file=sys.stderr)
        return 0
    if args.method != "bm25" and not args.model:
        raise BertforgeError(f"--model: a {args.method} index needs the sentence encoder that embeds the passages")
    if args.method == "bm25":
        for flag, value in (("--kind", args.kind), ("--model", args.model), ("--pooling", args.pooling)):
            if value is not None:
                raise BertforgeError(f"{flag}: a bm25 index embeds nothing (it applies to --method dense and hybrid)")
    if args.method != "hybrid":
        for flag, value in (("--fusion", args.fusion), ("--alpha", args.alpha)):
            if value is not None:
                raise BertforgeError(f"{flag}: applies to --method hybrid")
    index = Index.build(args.model, args.corpus, args.out, method=args.method, kind=args.kind, fusion=args.fusion,
                        alpha=args.alpha, stopwords=args.stopwords, device=args.device, precision=args.precision,
                        pooling=args.pooling, compile=bool(args.compile), overwrite=args.overwrite,
                        num_shards=args.num_shards, shard_id=args.shard_id, ray=args.ray,
                        shard_dtype=args.shard_dtype, chunk_size=args.chunk_size, environ=True, **_corpus(args))
    if not isinstance(index, Index):  # one shard of several
        print(f"shard {index.shard_id} of {index.num_shards}: {index.count} passages ({index.embedded} embedded now)"
              f" -> {index.path}", file=sys.stderr)
        return 0
    what = "bm25" if index.method == "bm25" else f"{index.method}, {index.kind}, dim {index.dim}"
    print(f"indexed {len(index)} passages ({what}) -> {args.out}", file=sys.stderr)
    return 0


def index_add(args: argparse.Namespace) -> int:
    from bertforge.api import Index

    index = Index.load(args.index, args.model, device=args.device, compile=bool(args.compile))
    n = index.add(args.corpus, **_corpus(args))
    print(f"added {n} passages; {len(index)} in {args.index}", file=sys.stderr)
    return 0


def index_query(args: argparse.Namespace) -> int:
    from bertforge.api import Index

    index = Index.load(args.index, args.model, device=args.device, compile=bool(args.compile))
    results = index.search(args.question, k=args.k, rerank=args.rerank, fusion=args.fusion, alpha=args.alpha)
    for question, hits in zip(args.question, results):
        if args.json:
            print(json.dumps({"query": question, "hits": [h.to_dict() for h in hits]}, ensure_ascii=False))
            continue
        print(f"# {question}")
        for h in hits:
            extra = f"  rerank {h.rerank_score:8.4f}" if h.rerank_score is not None else ""
            text = f"{h.title}. {h.text}" if h.title else h.text
            text = text if len(text) <= 100 else text[:97] + "..."
            print(f"{h.rank:3d}  {h.score:7.4f}{extra}  [{h.id}]  {text}")
    return 0
