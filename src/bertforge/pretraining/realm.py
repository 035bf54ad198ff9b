"""`bertforge pretrain --recipe realm --knowledge PASSAGES`: REALM pre-training (Guu et al. 2020,
`retrieval.realm_model`) run through the pretraining verb's machinery (the corpus, the tokenizer trained or taken
from --init-from / --tokenizer, the claim on OUT and its checked resume, the size's learning rate, the shared Trainer).

The reader is the run's MLM encoder (--init-from, or a new one of --size); the towers start from an ICT-pretrained
retriever (--retriever, the paper's initialisation) or, without one, from the reader's initial encoder, each [CLS]
projected to --projection-dim. The training sentences are --corpus's, or the knowledge passages' own when no --corpus
is given. OUT:

    OUT/config.json, model.safetensors, tokenizer files   the reader (a masked LM: fill-mask, fine-tuning)
    OUT/retriever/     the towers as a retriever folder (`retrieval.towers`: question/, passage/)
    OUT/knowledge/     the knowledge index at its last refresh (`retrieval.realm_knowledge`)
    OUT/checkpoints/   trainer checkpoints: the modules and the index state (vectors + their step), for --resume
    OUT/metrics.jsonl, OUT/eval_results.json
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bertforge.data.corpus import iter_texts
from bertforge.errors import BertforgeError
from bertforge.families import ENCODER
from bertforge.io.write import atomic_write_text
from bertforge.model.folder import ModelFolder
from bertforge.pretraining.objectives import build_objective
from bertforge.pretraining.options import PretrainOptions, auto_threads, schedule
from bertforge.pretraining.outdir import run_in_claimed_out
from bertforge.pretraining.prepare import prepare_tokenizer
from bertforge.retrieval.passages import read_passages
from bertforge.retrieval.realm_data import RealmCollator, RealmSentences, heuristic_spans, ner_spans
from bertforge.retrieval.realm_knowledge import KNOWLEDGE_DIR, KnowledgeIndex
from bertforge.retrieval.realm_model import RealmModel, projected_tower, with_projection
from bertforge.retrieval.towers import BiEncoder, is_retriever, load_towers, save_retriever
from bertforge.training import ResumableLoader, TrainConfig, Trainer, distributed_context

READER_OBJECTIVE = "mlm"


def check_realm_options(opts: PretrainOptions) -> None:
    if opts.knowledge is None:
        raise BertforgeError("--recipe realm needs --knowledge PASSAGES (the corpus retrieved from)")
    if opts.refresh_every is None or opts.refresh_every < 1:
        raise BertforgeError(f"--refresh-every: the index refresh interval must be at least 1 step "
                             f"(got {opts.refresh_every})")
    if opts.realm_k < 1 or opts.projection_dim < 1:
        raise BertforgeError(f"-k and --projection-dim must be at least 1 (got {opts.realm_k}, {opts.projection_dim})")
    if distributed_context()[1] > 1:
        raise BertforgeError("--recipe realm runs in one process (start it without torchrun)")
    if opts.data is not None:
        raise BertforgeError("--recipe realm reads raw text (--corpus or the --knowledge passages), not --data shards")
    if opts.max_steps is None and opts.time_budget is None:
        raise BertforgeError("give --max-steps or --time-budget")
    for flag, path in (("--retriever", opts.retriever), ("--ner-model", opts.ner_model)):
        if path is not None and not Path(path).exists():
            raise BertforgeError(f"{flag} {path}: no such folder")


class ClosedBookRealm(RealmModel):
    """The same reader, masking and batches with retrieval taken away: every sentence reads the null document only
    (`[CLS] x [SEP] [SEP]`), so the loss is plain salient-span MLM. The closed-book arm of the lab's `realm` table:
    against REALM, only retrieval differs. The index is embedded once (checkpoints hold it) and never searched."""

    def _maybe_refresh(self) -> None:
        if self.knowledge.vectors is None:
            self.refresh()

    def candidates(self, query_vectors: torch.Tensor, exclude: list[list[int]]) -> list[list[int]]:
        return [[-1] for _ in exclude]


def pretrain_realm(opts: PretrainOptions, closed_book: bool = False) -> dict[str, Any]:
    """Run REALM pre-training as `opts` says; returns the run's record (also OUT/eval_results.json).
    `closed_book`: the same run without retrieval (`ClosedBookRealm`). `opts.extra_eval(model)`, when given, scores
    the final model (eval mode); its numbers are the record's `heldout`."""
    t_start = time.perf_counter()
    check_realm_options(opts)
    opts.out = Path(opts.out)
    torch.set_num_threads(opts.threads or auto_threads(1))
    paths = [str(p) for p in (opts.corpus or [opts.knowledge])]
    result = run_in_claimed_out(opts, paths, True, lambda: _run(opts, paths, t_start, closed_book))
    return result


def _reader(opts: PretrainOptions, tok):
    if opts.init_from is not None:
        from bertforge.model.checkpoint import load_pretrained

        cfg = ModelFolder.open(opts.init_from, "--init-from").config_for(ENCODER, verb="an encoder").replace(extra={})
        reader = build_objective(READER_OBJECTIVE, cfg)
        load_pretrained(reader, opts.init_from)
        return reader
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    cfg = opts.recipe.model_config(opts.size, tok.vocab_size, pad, opts.seq_len)
    return build_objective(READER_OBJECTIVE, cfg)


def build_realm(opts: PretrainOptions, paths: list[str],
                closed_book: bool = False) -> tuple[RealmModel, RealmSentences, Any]:
    """The model (reader, towers, knowledge index not yet embedded) and the training sentences."""
    tok = prepare_tokenizer(opts, paths, True)
    torch.manual_seed(opts.seed)
    reader = _reader(opts, tok)
    if opts.retriever is not None:  # the paper's initialisation: ICT-pretrained towers, two of them
        towers = load_towers(opts.retriever, separate=True, pooling=None if is_retriever(opts.retriever) else "cls")
        query = with_projection(towers.question, opts.projection_dim)
        document = with_projection(towers.passage_tower, opts.projection_dim)
    else:
        query = projected_tower(copy.deepcopy(reader.bert), tok, opts.projection_dim, opts.seq_len)
        document = projected_tower(copy.deepcopy(reader.bert), tok, opts.projection_dim, opts.seq_len)
    knowledge = KnowledgeIndex(read_passages(opts.knowledge))
    documents = iter_texts(opts.corpus, text_col=opts.text_col) if opts.corpus else read_passages(opts.knowledge).texts
    spans = (heuristic_spans if opts.ner_model is None
             else ner_spans(opts.ner_model, device=opts.device, progress=opts.progress))
    sentences = RealmSentences(documents, knowledge.sources_of, seed=opts.seed, spans=spans)
    model = (ClosedBookRealm if closed_book else RealmModel)(
        reader, query, document, knowledge, tok, k=opts.realm_k, refresh_every=opts.refresh_every,
        seq_len=opts.seq_len, out_dir=opts.out, progress=opts.progress)
    return model, sentences, tok


def _run(opts: PretrainOptions, paths: list[str], t_start: float, closed_book: bool = False) -> dict[str, Any]:
    model, sentences, tok = build_realm(opts, paths, closed_book)
    lr, warmup, size = schedule(opts, model.reader.config)
    collate = RealmCollator(tok, model.query.tokenizer.mask_token or tok.mask_token, max(opts.seq_len // 2, 16))
    loader = ResumableLoader(sentences, opts.batch_size, collate_fn=collate, shuffle=True, seed=opts.seed,
                             drop_last=len(sentences) >= opts.batch_size)
    cfg = TrainConfig(out_dir=opts.out, lr=lr, max_steps=opts.max_steps, time_budget_s=opts.time_budget,
                      warmup_ratio=warmup, schedule=opts.recipe.schedule, precision=opts.precision, seed=opts.seed,
                      resume=opts.resume, log_every=opts.log_every, save_every=opts.save_every,
                      progress=opts.progress, device=opts.device, compile=False, report_to=opts.report_to,
                      logging_dir=opts.logging_dir,
                      extra={"recipe": asdict(opts.recipe), "size": size, "seq_len": opts.seq_len})
    trainer = Trainer(model, loader, cfg, save_fn=lambda m, d: m.save_state(d), load_fn=lambda m, d: m.load_state(d))
    # a fresh run embeds the corpus before its first step (RealmModel._maybe_refresh); a resumed one takes the
    # index its checkpoint holds
    print(f"realm: {len(sentences):,} sentences with salient spans, {len(model.knowledge):,} knowledge passages, "
          f"k={opts.realm_k} + the null document, refresh every {opts.refresh_every} steps, batch "
          f"{opts.batch_size}, lr {lr:g}", flush=True)
    history = trainer.train()
    model = trainer.model
    model.eval()
    model.reader.save_pretrained(opts.out, tokenizer=tok)
    save_retriever(BiEncoder(model.query, model.document), opts.out / "retriever")
    model.knowledge.save(opts.out / KNOWLEDGE_DIR)  # what the last step searched (a killed run may leave a later one)
    train = [h for h in history if "loss" in h and h.get("split") != "eval"]
    result = {"recipe": asdict(opts.recipe), "size": size, "seq_len": opts.seq_len, "batch_size": opts.batch_size,
              "steps": trainer.step, "sentences": len(sentences), "passages": len(model.knowledge),
              "k": opts.realm_k, "refresh_every": opts.refresh_every, "projection_dim": opts.projection_dim,
              "index_step": model.knowledge.built_at, "lr": lr, "warmup_ratio": warmup,
              "precision": opts.precision, "closed_book": closed_book,
              "heldout": opts.extra_eval(model) if opts.extra_eval is not None else {},
              "train": {key: train[-1].get(key) for key in ("loss", "accuracy", "retrieval_utility",
                                                            "top_beats_null")} if train else {},
              "seconds": {"total": round(time.perf_counter() - t_start, 2), "train": round(trainer.train_seconds, 2)}}
    if train:
        result["train"]["first_loss"] = train[0]["loss"]
    atomic_write_text(opts.out / "eval_results.json", json.dumps(result, indent=2) + "\n")
    print(f"realm: {trainer.step} steps, loss {result['train'].get('first_loss', float('nan')):.3f} -> "
          f"{result['train'].get('loss', float('nan')):.3f} -> {opts.out} (the reader; retriever/, knowledge/)",
          flush=True)
    return result
