"""The lab's `realm` table: retrieval-augmented models against closed-book ones at equal compute, the REALM and RAG
papers' headline claims, answered with the lab's seeds-and-verdicts rule (`lab.report`).

Its world is built from the SQuAD 1.1 dev file under --downstream (`squad/dev-v1.1.json`): the paragraphs of its
first `KNOWLEDGE_ARTICLES` articles are the knowledge corpus; every `HELDOUT_EVERY`-th paragraph is held out (its
sentences are never trained on, its questions are the evaluation questions); the other paragraphs' sentences are
the MLM training text and their questions the QA training pairs.

Arms, per seed:
  realm         `pretrain --recipe realm`: reader and towers of --size, k = `REALM_K` + the null document
  realm-closed  the same run, reader, tokenizer, sentences and salient-span masks, reading the null document only
                (`pretraining.realm.ClosedBookRealm`): the same steps and examples (equal steps, not equal FLOPs: a
                REALM step reads k + 1 documents and embeds them)
  rag           `finetune --task rag` (RAG-Token, k = `RAG_K`, the question tower frozen) of a generator of
                --size initialised from the seed, over a dense index of the knowledge corpus
  rag-closed    the same generator (same seed, same initial weights) fine-tuned on the same question -> answer
                pairs for the same epochs and steps, reading the question alone
Scores: held-out MLM accuracy (salient-span tokens of the held-out sentences, the sentence's own paragraph never
retrieved; REALM reads its best-scoring document, the closed-book arm nothing); cloze EM (each evaluation question
followed by its answer, the answer masked whole, EM = every answer token right: open QA as the MLM answers it,
with the answer's length given); open-QA EM of the generators (SQuAD's normalised exact match, greedy decoding).
"""
from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bertforge.errors import BertforgeError
from bertforge.io.read import read_json
from bertforge.io.write import atomic_write_text
from bertforge.lab.tables import Table

SQUAD_FILE = Path("squad") / "dev-v1.1.json"
KNOWLEDGE_ARTICLES = 8     # ~400 paragraphs: a corpus a bert-tiny tower re-embeds in seconds
HELDOUT_EVERY = 5          # paragraphs 4, 9, 14, ... of each article are held out
EVAL_SENTENCES = 200       # held-out sentences with a salient span, scored by every REALM arm
EVAL_QUESTIONS = 200       # held-out questions (cloze EM and open-QA EM)
TRAIN_QUESTIONS = 300      # QA training questions (--train-limit overrides)
REALM_K, REFRESH_EVERY, PROJECTION_DIM = 3, 100, 64
RAG_K, RAG_SOURCE_LEN, CLOSED_SOURCE_LEN, TARGET_LEN = 3, 160, 64, 24
GENERATOR_LR, GENERATOR_BATCH = 5e-4, 8  # a generator from random initialisation needs more than RAG's 3e-5


def world(data_root: Path, out: Path, train_limit: int | None) -> dict[str, Any]:
    """OUT/world/: knowledge.jsonl, train.txt (training paragraphs, blank-line separated), heldout.json (held-out
    paragraph texts), train_questions.json / eval_questions.json ({question, answer: [...]}). Built once."""
    folder = out / "world"
    done = folder / "world.json"
    if done.is_file():
        return read_json(done)
    path = Path(data_root) / SQUAD_FILE
    if not path.is_file():
        raise BertforgeError(f"--downstream {data_root}: no {SQUAD_FILE} (the realm table's knowledge corpus)")
    articles = json.loads(path.read_text(encoding="utf-8"))["data"][:KNOWLEDGE_ARTICLES]
    folder.mkdir(parents=True, exist_ok=True)
    knowledge, train_paras, held_paras, train_q, eval_q = [], [], [], [], []
    for a, art in enumerate(articles):
        title = art["title"].replace("_", " ")
        for p, para in enumerate(art["paragraphs"]):
            text = " ".join(para["context"].split())
            knowledge.append({"id": f"a{a}p{p}", "title": title, "text": text})
            held = p % HELDOUT_EVERY == HELDOUT_EVERY - 1
            (held_paras if held else train_paras).append(text)
            for qa in para["qas"]:
                answers = list(dict.fromkeys(x["text"].strip() for x in qa["answers"] if x["text"].strip()))
                if answers:
                    (eval_q if held else train_q).append({"question": qa["question"].strip(), "answer": answers})
    limit = train_limit or TRAIN_QUESTIONS
    files = {"knowledge": folder / "knowledge.jsonl", "train_text": folder / "train.txt",
             "heldout": folder / "heldout.json", "train_questions": folder / "train_questions.jsonl",
             "eval_questions": folder / "eval_questions.json"}
    atomic_write_text(files["knowledge"], "".join(json.dumps(k) + "\n" for k in knowledge))
    atomic_write_text(files["train_text"], "\n\n".join(train_paras) + "\n")
    atomic_write_text(files["heldout"], json.dumps(held_paras) + "\n")
    atomic_write_text(files["train_questions"], "".join(json.dumps(q) + "\n" for q in train_q[:limit]))
    atomic_write_text(files["eval_questions"], json.dumps(eval_q[:EVAL_QUESTIONS]) + "\n")
    info = {**{k: str(v) for k, v in files.items()}, "passages": len(knowledge), "train_paragraphs": len(train_paras),
            "heldout_paragraphs": len(held_paras), "n_train_questions": len(train_q[:limit]),
            "n_eval_questions": len(eval_q[:EVAL_QUESTIONS]), "articles": len(articles)}
    atomic_write_text(done, json.dumps(info, indent=2) + "\n")
    return info


# ---- REALM and its closed-book twin ------------------------------------------------------------------------------
def _eval_items(model, info: dict[str, Any]) -> dict[str, list[dict]]:
    """The held-out sentences (masks drawn from seed 0: the same for every arm and seed) and the cloze questions."""
    from bertforge.retrieval.realm_data import RealmSentences

    held = RealmSentences(json.loads(Path(info["heldout"]).read_text(encoding="utf-8")), model.knowledge.sources_of,
                          seed=0)
    sentences = [held[i] for i in range(min(len(held), EVAL_SENTENCES))]
    cloze = []
    for q in json.loads(Path(info["eval_questions"]).read_text(encoding="utf-8")):
        answer = q["answer"][0]
        text = f"{q['question']} {answer}"
        cloze.append({"text": text, "spans": [(len(text) - len(answer), len(text))], "exclude": []})
    return {"heldout": sentences, "cloze": cloze}


@torch.no_grad()
def score_realm(model, info: dict[str, Any], seq_len: int, batch_size: int = 16) -> dict[str, float]:
    """Masked-token accuracy, whole-span EM and the span's NLL on the held-out sentences and the cloze questions,
    reading the best-scoring candidate (the closed-book model has only the null document). The index is first
    rebuilt by the final document tower (a closed-book model's is never searched)."""
    from bertforge.pretraining.realm import ClosedBookRealm
    from bertforge.retrieval.realm_data import RealmCollator

    model.eval()
    if not isinstance(model, ClosedBookRealm):
        model.refresh()
    collate = RealmCollator(model.tok, model.query.tokenizer.mask_token or model.tok.mask_token,
                            max(seq_len // 2, 16))
    out: dict[str, float] = {}
    device = next(model.parameters()).device
    for name, items in _eval_items(model, info).items():
        tokens = right = spans = exact = nll = 0.0
        for i in range(0, len(items), batch_size):
            batch = collate(items[i:i + batch_size])
            n_tok = float(batch["mlm_labels"].ne(-100).sum())
            n_span = float(batch["mlm_labels"].ne(-100).any(1).sum())
            if not n_span:
                continue
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            r = model(**batch)
            tokens, right = tokens + n_tok, right + n_tok * float(r["accuracy"])
            spans, exact = spans + n_span, exact + n_span * float(r["span_exact"])
            nll += len(batch["query_texts"]) * float(r["loss"])
        out[f"{name}_token_acc"] = right / max(tokens, 1)
        out[f"{name}_span_em"] = exact / max(spans, 1)
        out[f"{name}_nll"] = nll / max(len(items), 1)
        out[f"{name}_spans"] = spans
    return out


def pretrain_realm_arm(closed_book: bool, seed: int, opts, info: dict[str, Any], arm_dir: Path,
                       max_steps: int | None) -> dict[str, Any]:
    from bertforge.pretraining.options import PretrainOptions
    from bertforge.pretraining.realm import pretrain_realm
    from bertforge.pretraining.recipes import resolve

    popts = PretrainOptions(
        recipe=resolve("realm"), out=arm_dir, corpus=[info["train_text"]], knowledge=Path(info["knowledge"]),
        tokenizer=Path(info["tokenizer"]), size=opts.size, seq_len=opts.seq_len, batch_size=opts.batch_size,
        max_steps=max_steps, time_budget=None if max_steps else opts.budget, precision=opts.precision or "fp32",
        seed=seed, overwrite=True, log_every=10, threads=opts.threads, progress=False, device=opts.device,
        refresh_every=REFRESH_EVERY, realm_k=REALM_K, projection_dim=PROJECTION_DIM,
        extra_eval=lambda m: score_realm(m, info, opts.seq_len))
    rec = pretrain_realm(popts, closed_book=closed_book)
    shutil.rmtree(arm_dir / "checkpoints", ignore_errors=True)
    h = rec["heldout"]
    return {"pretrain": {"steps": rec["steps"], "examples": rec["steps"] * opts.batch_size,
                         "train_seconds": rec["seconds"]["train"], "heldout_mlm_acc": h["heldout_token_acc"],
                         "sentences": rec["sentences"], "passages": rec["passages"], "k": 0 if closed_book else REALM_K,
                         "train": rec["train"], "heldout": h},
            "tasks": {"heldout_mlm": {"metric": "accuracy", "score": h["heldout_token_acc"]},
                      "cloze_em": {"metric": "exact_match", "score": h["cloze_span_em"]}}}


# ---- RAG and its closed-book twin --------------------------------------------------------------------------------
def _tokenizers(info: dict[str, Any], out: Path, opts) -> None:
    """One WordPiece tokenizer for every REALM arm, one generator tokenizer (the generator family's kind) for
    every RAG arm, both trained on the knowledge corpus and the training questions."""
    from bertforge.families.bart import RECIPES as GENERATOR_RECIPES
    from bertforge.tokenization import Tokenizer

    folder = out / "world"
    texts = [json.loads(line)["text"] for line in Path(info["knowledge"]).read_text(encoding="utf-8").splitlines()]
    qs = [json.loads(line) for line in Path(info["train_questions"]).read_text(encoding="utf-8").splitlines()]
    texts += [q["question"] + " " + " ".join(q["answer"]) for q in qs]
    if not (folder / "tokenizer" / "tokenizer.json").is_file():
        Tokenizer.train(texts, kind="wordpiece", vocab_size=opts.vocab_size or 8192).save_pretrained(
            folder / "tokenizer")
    if not (folder / "generator_tokenizer" / "tokenizer.json").is_file():
        Tokenizer.train(texts, kind=GENERATOR_RECIPES[0]["tokenizer_kind"], vocab_size=opts.vocab_size or 8192
                        ).save_pretrained(folder / "generator_tokenizer")
    info["tokenizer"], info["generator_tokenizer"] = str(folder / "tokenizer"), str(folder / "generator_tokenizer")


def _generator(seed: int, opts, info: dict[str, Any]):
    """A new generator of the lab's size (its layers and width), initialised from `seed`."""
    from bertforge.config.seq2seq import compose_seq2seq
    from bertforge.config.sizes import SIZES
    from bertforge.families.bart import FAMILY as GENERATOR_FAMILY
    from bertforge.model import Seq2SeqLM
    from bertforge.tokenization import Tokenizer

    tok = Tokenizer.from_pretrained(info["generator_tokenizer"])
    size = opts.size.split("-", 1)[-1]
    cfg = compose_seq2seq(GENERATOR_FAMILY.model_type, size if size in SIZES else "tiny", vocab_size=tok.vocab_size)
    torch.manual_seed(seed)
    return Seq2SeqLM(cfg), tok


def _index(opts, info: dict[str, Any], out: Path, seed: int):
    """(question tower, PassageVectors, passages) of a dense index of the knowledge corpus: embedded by --retriever
    (one index for every seed), or without it by the seed's REALM document tower (that seed's own index)."""
    from bertforge.embedding.modules import SentenceEncoder
    from bertforge.retrieval.index import RetrievalIndex
    from bertforge.retrieval.passages import read_passages
    from bertforge.retrieval.rag_train import PassageVectors
    from bertforge.retrieval.towers import _trainable

    if opts.retriever is not None:
        source, folder = Path(opts.retriever), out / "world" / "index"
        question = source
    else:  # REALM's two towers: the passage tower embeds the corpus, the question tower the questions
        towers = out / "arms" / f"realm-s{seed}" / "retriever"
        source, question, folder = towers / "passage", towers / "question", out / "world" / f"index-s{seed}"
        if not source.is_dir():
            raise BertforgeError(f"{source}: the REALM arm of seed {seed} has no document tower to index with")
    if (folder / "meta.json").is_file():
        inner = RetrievalIndex.load(folder)
    else:
        model = SentenceEncoder.from_pretrained(source)
        inner = RetrievalIndex.build(None, read_passages(info["knowledge"]), model=model, progress=False)
        inner.path = folder
        inner.save()
    tower = _trainable(SentenceEncoder.from_pretrained(question), None)
    return tower, PassageVectors(inner.vectors.index, len(inner), str(folder)), inner.passages


def _em(predictions: list[str], questions: list[dict]) -> float:
    from bertforge.retrieval.metrics import answer_scores

    scores = [answer_scores(p, q["answer"]) for p, q in zip(predictions, questions)]
    return statistics.fmean(s[0] for s in scores if s is not None)


def train_rag_arm(closed_book: bool, seed: int, opts, info: dict[str, Any], arm_dir: Path) -> dict[str, Any]:
    from bertforge.retrieval.generative_answer import fid_answers, rag_answers
    from bertforge.retrieval.generative_train import GenerativeConfig, finetune_fid, finetune_rag
    from bertforge.retrieval.reader_train import read_questions

    questions = read_questions(info["train_questions"])
    evals = json.loads(Path(info["eval_questions"]).read_text(encoding="utf-8"))
    generator, tok = _generator(seed, opts, info)
    cfg = GenerativeConfig(
        generator=str(arm_dir), out=arm_dir, train=info["train_questions"], task="fid" if closed_book else "rag",
        k=1 if closed_book else RAG_K, marginalise="token", freeze_retriever=True,
        max_source_len=CLOSED_SOURCE_LEN if closed_book else RAG_SOURCE_LEN, max_target_len=TARGET_LEN,
        epochs=opts.finetune_epochs, lr=GENERATOR_LR, batch_size=GENERATOR_BATCH, seed=seed,
        precision=opts.precision or "fp32", device=opts.device, progress=False, overwrite=True)
    t0 = time.perf_counter()
    generator.train()
    if closed_book:
        rec = finetune_fid(cfg, generator, tok, questions, [[] for _ in questions])
        generator.eval()
        preds = [r["answer"] for r in fid_answers(generator, tok, [q["question"] for q in evals], [[] for _ in evals],
                                                   k=1, num_beams=1, max_new_tokens=TARGET_LEN,
                                                   max_source_len=CLOSED_SOURCE_LEN)]
    else:
        tower, vectors, passages = _index(opts, info, arm_dir.parent.parent, seed)
        rec = finetune_rag(cfg, tower, generator, tok, vectors, passages.titles, passages.texts, questions)
        generator.eval()
        tower.eval()
        with torch.no_grad():
            preds = []
            for i in range(0, len(evals), 16):
                preds += [r["answer"] for r in rag_answers(
                    tower, generator, tok, vectors, passages, [q["question"] for q in evals[i:i + 16]], k=RAG_K,
                    marginalise="token", num_beams=1, max_new_tokens=TARGET_LEN, max_source_len=RAG_SOURCE_LEN)]
    seconds = time.perf_counter() - t0
    em = _em(preds, evals)
    atomic_write_text(arm_dir / "predictions.json", json.dumps(
        [{"question": q["question"], "answer": q["answer"], "predicted": p} for q, p in zip(evals, preds)],
        indent=1) + "\n")
    for name in ("model.safetensors", "checkpoints"):
        shutil.rmtree(arm_dir / name, ignore_errors=True) if (arm_dir / name).is_dir() else \
            (arm_dir / name).unlink(missing_ok=True)
    return {"pretrain": {"steps": rec["steps"], "examples": rec["train_rows"] * opts.finetune_epochs,
                         "train_seconds": round(seconds, 1), "first_loss": rec["first_loss"],
                         "last_loss": rec["last_loss"], "k": 0 if closed_book else RAG_K},
            "tasks": {"open_qa_em": {"metric": "exact_match", "score": em}}}


# ---- the table ---------------------------------------------------------------------------------------------------
def run_realm_table(opts, table: Table, out: Path) -> None:
    """Every (arm, seed) of the realm table not yet in OUT/results, seed by seed (REALM first: its steps are the
    closed-book arm's, and without --retriever its document tower is RAG's index)."""
    info = world(Path(opts.data_root), out, opts.train_limit)
    _tokenizers(info, out, opts)
    for seed in range(opts.seeds):
        for arm in table.arms:
            path = out / "results" / f"{arm}-s{seed}.json"
            record = read_json(path) if path.is_file() else {"arm": arm, "seed": seed, "tasks": {}}
            if "pretrain" in record:
                continue
            record.pop("error", None)
            arm_dir = out / "arms" / f"{arm}-s{seed}"
            print(f"\nrealm table: {arm}, seed {seed}", flush=True)
            try:
                if arm.startswith("realm"):
                    steps = opts.steps
                    if arm == "realm-closed":  # equal steps and examples: what the REALM arm of this seed did
                        steps = read_json(out / "results" / f"realm-s{seed}.json")["pretrain"]["steps"]
                    record.update(pretrain_realm_arm(arm == "realm-closed", seed, opts, info, arm_dir, steps))
                else:
                    record.update(train_rag_arm(arm == "rag-closed", seed, opts, info, arm_dir))
                scores = ", ".join(f"{t} {r['score']:.4f}" for t, r in record["tasks"].items())
                print(f"realm table: {arm}, seed {seed}: {scores} ({record['pretrain']['steps']} steps, "
                      f"{record['pretrain']['train_seconds']:.0f}s)", flush=True)
            except Exception as err:  # noqa: BLE001 -- one arm's failure is reported; the table goes on
                record["error"] = f"{type(err).__name__}: {err}"
                print(f"realm table: {arm}, seed {seed}: FAILED, the table goes on without it ({record['error']})",
                      flush=True)
            atomic_write_text(path, json.dumps(record, indent=2, default=str) + "\n")


def markdown(rep: dict[str, Any]) -> str:
    """The realm table's report: per arm steps, seconds and each score's mean ± std over seeds; the claims."""
    s, tasks = rep["setup"], rep["tasks"]
    length = f"{s['steps']} steps" if s.get("steps") else f"{s['budget']} of wall clock"
    lines = [f"### {rep['table']}: {rep['source']}", "",
             f"REALM arms: {s['size']} reader and towers, seq {s['seq_len']}, batch {s['batch_size']}, k = {REALM_K} "
             f"+ the null document, REALM for {length}, the closed-book arm for the same steps. RAG arms: a "
             f"{s['size']}-shaped generator from random initialisation, {s['finetune_epochs']:g} epochs of the same "
             f"question -> answer pairs (k = {RAG_K} for RAG). Scores x100, mean ± standard deviation over seeds.",
             "", "| arm | label | seeds | steps | train s | " + " | ".join(tasks) + " |",
             "|---|---|---:|---:|---:|" + "---:|" * len(tasks)]
    for arm, a in rep["arms"].items():
        cells = [(f"{a['tasks'][t]['mean']:.1f} ± {a['tasks'][t]['std']:.1f}" if a["tasks"][t]["n"] > 1
                  else f"{a['tasks'][t]['mean']:.1f}") if t in a["tasks"] else "-" for t in tasks]
        steps = "-" if a["steps"] is None else f"{a['steps']:.0f}"
        secs = "-" if a["train_seconds"] is None else f"{a['train_seconds']:.0f}"
        lines.append(f"| {arm} | {a['label']} | {a['seeds']} | {steps} | {secs} | " + " | ".join(cells) + " |")
    lines += ["", "| claim | score | ours (a vs b) | verdict | paper |", "|---|---|---|---|---|"]
    for c in rep["claims"]:
        p = c.get("welch_p")
        welch = f" (Welch p {p:.2f})" if p is not None and p == p else ""  # no p when every seed ties (nan)
        ours = "-" if "a_mean" not in c else (  # pending: an arm has no score yet
            f"{c['a']} {c['a_mean']:.1f} ± {c['a_std']:.1f} vs {c['b']} {c['b_mean']:.1f} ± {c['b_std']:.1f}{welch}")
        why = f" ({c['why']})" if c.get("why") else ""
        lines.append(f"| {c['claim']} | {', '.join(c['tasks'])} | {ours} | **{c['verdict']}**{why} | {c['paper']} |")
    if rep["paper"]:
        cols = list(dict.fromkeys(k for v in rep["paper"].values() for k in v))
        lines += ["", "The papers' numbers, for direction:", "", "| system | " + " | ".join(cols) + " |",
                  "|---|" + "---:|" * len(cols)]
        for arm, scores in rep["paper"].items():
            lines.append(f"| {arm} | " + " | ".join("-" if scores.get(k) is None else f"{scores[k]:.1f}"
                                                     for k in cols) + " |")
    return "\n".join(lines) + "\n"
