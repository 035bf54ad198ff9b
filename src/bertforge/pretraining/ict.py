"""`bertforge pretrain --recipe ict`: the Inverse Cloze Task (Lee et al. 2019, `retrieval.ict`) run through the
pretraining verb's own machinery (the corpus, the tokenizer trained or taken from --init-from / --tokenizer, the
claim on OUT and its checked resume, the size's learning rate), training a retriever's towers on the shared Trainer.

OUT is a retriever folder (`retrieval.towers`: question/ and passage/ as sentence-transformers folders, transformers/ in
transformers' DPR layout, retriever.json), which `bertforge retriever train --model OUT` continues with DPR's
objective; plus OUT/tokenizer/ when one was trained, metrics.jsonl and eval_results.json (the run's record).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bertforge.data.corpus import iter_texts
from bertforge.embedding.modules import SentenceEncoder
from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write_text
from bertforge.model import Encoder
from bertforge.pretraining.options import PretrainOptions, auto_threads, schedule
from bertforge.pretraining.outdir import run_in_claimed_out
from bertforge.pretraining.prepare import corpus_paths, prepare_tokenizer
from bertforge.retrieval.ict import ICTDataset, make_blocks
from bertforge.retrieval.towers import BiEncoder, is_retriever, load_towers
from bertforge.retrieval.train import RetrievalCollator, fit
from bertforge.training import distributed_context

POOLING = "cls"  # ORQA reads each tower at [CLS], as DPR does


def pretrain_ict(opts: PretrainOptions) -> dict[str, Any]:
    """Run ICT as `opts` says; returns the run's record (also OUT/eval_results.json)."""
    t_start = time.perf_counter()
    if distributed_context()[1] > 1:
        raise BertforgeError("--recipe ict runs in one process (start it without torchrun)")
    if opts.data is not None:
        raise BertforgeError("--recipe ict reads raw text (--corpus), not prepared shards (--data)")
    if opts.max_steps is None and opts.time_budget is None:
        raise BertforgeError("give --max-steps or --time-budget")
    opts.out = Path(opts.out)
    torch.set_num_threads(opts.threads or auto_threads(1))
    paths = corpus_paths(opts, True, 1)
    result = run_in_claimed_out(opts, paths, True, lambda: _run(opts, paths, t_start))
    return result


def _model(opts: PretrainOptions, paths: list[str]):
    """The towers: --init-from's (a retriever, or any encoder: one shared tower read at [CLS]) or a new encoder of
    --size with the tokenizer prepared for the run."""
    if opts.init_from is not None:
        model = load_towers(opts.init_from, pooling=None if is_retriever(opts.init_from) else POOLING)
        return model, model.question.tokenizer, model.question.transformer.bert.config
    tok = prepare_tokenizer(opts, paths, True)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    cfg = opts.recipe.model_config(opts.size, tok.vocab_size, pad, opts.seq_len)
    torch.manual_seed(opts.seed)
    tower = SentenceEncoder.from_encoder(Encoder(cfg), tok, pooling=POOLING, max_seq_length=opts.seq_len)
    return BiEncoder(tower), tok, cfg


def _run(opts: PretrainOptions, paths: list[str], t_start: float) -> dict[str, Any]:
    model, tok, cfg = _model(opts, paths)
    blocks = make_blocks(iter_texts(paths, text_col=opts.text_col), tok, opts.seq_len - 2)
    if len(blocks) < 2:
        raise BertforgeError(f"--corpus: {len(blocks)} block(s) of two sentences or more; ICT needs a larger corpus")
    lr, warmup, size = schedule(opts, cfg)
    dataset = ICTDataset(blocks, seed=opts.seed)
    print(f"ict: {len(blocks):,} blocks of up to {opts.seq_len - 2} tokens, batch {opts.batch_size}, lr {lr:g}",
          flush=True)
    history, trainer = fit(model, dataset, opts.out, collate=RetrievalCollator(model), max_steps=opts.max_steps,
                           time_budget=opts.time_budget, batch_size=opts.batch_size, lr=lr, warmup_ratio=warmup,
                           seed=opts.seed, progress=opts.progress, device=opts.device, precision=opts.precision,
                           compile=opts.compile, report_to=opts.report_to, logging_dir=opts.logging_dir,
                           resume=opts.resume, save_every=opts.save_every, log_every=opts.log_every,
                           extra={"recipe": asdict(opts.recipe), "size": size, "seq_len": opts.seq_len})
    train = [h for h in history if "loss" in h and h.get("split") != "eval"]
    result = {"recipe": asdict(opts.recipe), "size": size, "seq_len": opts.seq_len, "batch_size": opts.batch_size,
              "steps": trainer.step, "blocks": len(blocks), "lr": lr, "warmup_ratio": warmup,
              "precision": opts.precision, "heldout": {},
              "train": {"first_loss": train[0]["loss"], "last_loss": train[-1]["loss"],
                        "last_accuracy": train[-1].get("accuracy")} if train else {},
              "seconds": {"total": round(time.perf_counter() - t_start, 2), "train": round(trainer.train_seconds, 2)}}
    atomic_write_text(opts.out / "eval_results.json", json.dumps(result, indent=2) + "\n")
    print(f"ict: {trainer.step} steps, loss {result['train'].get('first_loss', float('nan')):.3f} -> "
          f"{result['train'].get('last_loss', float('nan')):.3f} -> {opts.out} (a retriever: question/, passage/, "
          "transformers/)",
          flush=True)
    return result
