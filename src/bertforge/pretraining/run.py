"""The pretraining run: corpus -> tokenizer -> shards -> examples -> objective -> Trainer -> HF checkpoint.

`pretrain(PretrainOptions(...))` is what `bertforge pretrain` calls; `ablate` calls it once per arm. Output layout:

    OUT/tokenizer/        the tokenizer (trained here unless given or taken from --init-from)   see prepare.py
    OUT/data/             prepared shards (manifest.json + memmaps)                              see prepare.py
    OUT/checkpoints/      trainer checkpoints (HF dirs + trainer_state.pt), for --resume
    OUT/metrics.jsonl     training and eval records: only what the seed determines (identical for identical runs)
    OUT/speed.jsonl       the timing of the training records (tokens_per_s, elapsed_s), same steps
    OUT/curves.png        when matplotlib is installed
    OUT/config.json, model.safetensors, tokenizer files   the final model (ELECTRA: + discriminator/, generator/)
    OUT/eval_results.json held-out metrics, baselines, fill-mask examples (a decoder: samples); tokens and wall times;
                          each --heldout corpus's MLM numbers (tokenised into OUT/heldout/NAME)
    OUT/run_options.json, OUT/.lock   the claim on OUT (see outdir.py): one run at a time, checked resumes
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.model.checkpoint import load_pretrained
from bertforge.config.positions import check_length
from bertforge.data import ShardedCorpus
from bertforge.errors import BertforgeError
from bertforge.families import DECODER, ENCODER, RTD_OBJECTIVE
from bertforge.model.folder import ModelFolder
from bertforge.io.write import atomic_write_text
from bertforge.pretraining.inputs import check_model_fits_recipe
from bertforge.pretraining.metrics import stuck_at_baseline
from bertforge.pretraining.objectives import ELECTRAObjective, build_objective, uses_pooler
from bertforge.pretraining.options import PretrainOptions, auto_threads, schedule
from bertforge.pretraining.outdir import run_in_claimed_out
from bertforge.pretraining.recipes import ICT, REALM
from bertforge.pretraining.prepare import barrier, corpus_paths, prepare_data, prepare_tokenizer
from bertforge.pretraining.report import curves_line, print_summary, setup_line, stuck_warning
from bertforge.pretraining import seq2seq as s2s
from bertforge.pretraining.scoring import kind_for
from bertforge.io.rundir import is_locked
from bertforge.device import resolve_device
from bertforge.training import ResumableLoader, TrainConfig, Trainer, distributed_context
from bertforge.training.distributed import init_distributed, is_distributed


# ---- the model ----------------------------------------------------------------------------------------------------
def build_model(opts: PretrainOptions, tok) -> nn.Module:
    """The objective module; with --init-from the encoder shape comes from that checkpoint and its weights load."""
    if s2s.is_seq2seq(opts.recipe):  # T5 / BART: bertforge.model.Seq2SeqLM
        return s2s.build_seq2seq(opts.recipe, opts.size, tok, opts.seq_len, opts.init_from)
    if opts.init_from is not None:
        src = opts.init_from
        folder = ModelFolder.open(src / "discriminator" if (src / "discriminator").is_dir() else src, "--init-from")
        cfg = folder.config_for(ENCODER, DECODER, verb="an encoder or decoder").replace(extra={})
        if opts.recipe.objective == RTD_OBJECTIVE and "rtd" not in cfg.family.head_classes:
            raise BertforgeError(f"--init-from {src}: a {cfg.model_type} checkpoint cannot continue as ELECTRA "
                                 "(replaced-token detection)")
        check_length(opts.seq_len, cfg, src, "--seq-len")
        check_model_fits_recipe(cfg, opts.recipe, f"--init-from {src}")
        model = build_objective(opts.recipe.objective, cfg, keep_pooler=True,
                                embedding_sharing=opts.recipe.embedding_sharing)
        load_objective(model, src)
        return model
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    cfg = opts.recipe.model_config(opts.size, tok.vocab_size, pad, opts.seq_len)
    ids = cfg.family.token_ids(tok)  # the special-token ids the family's config.json records
    if cfg.stack == DECODER:  # the decoder's own fields: where generation starts and stops
        cfg = cfg.replace(**ids)
    elif ids:
        cfg = cfg.replace(extra=ids)
    check_model_fits_recipe(cfg, opts.recipe, f"--recipe {opts.recipe.name}")
    return build_objective(opts.recipe.objective, cfg, embedding_sharing=opts.recipe.embedding_sharing)


def save_fn_for(tok):
    def save(model: nn.Module, directory: Path) -> None:
        model.save_pretrained(directory, tokenizer=tok)
    return save


def load_objective(model: nn.Module, directory: Path) -> None:
    """Load a bertforge/HF pretraining dir into an objective (ELECTRA: discriminator/ and generator/)."""
    directory = Path(directory)
    if isinstance(model, s2s.Seq2SeqObjective):
        s2s.load_seq2seq(model, directory)
        return
    if isinstance(model, ELECTRAObjective):
        model.load_pretrained(directory)
        return
    load_pretrained(model, directory)


# ---- the run ------------------------------------------------------------------------------------------------------
def _check_options(opts: PretrainOptions) -> None:
    opts.out = Path(opts.out)
    if opts.init_from is not None:
        opts.init_from = Path(opts.init_from)
        folder = ModelFolder.open(opts.init_from, "--init-from")
        # a model that cannot take the recipe's batches (XLNet vs MLM, no pooler for NSP) is refused before any work
        if not s2s.is_seq2seq(opts.recipe):
            check_model_fits_recipe(folder.config_for(ENCODER, DECODER, verb="an encoder or decoder"), opts.recipe,
                                    f"--init-from {opts.init_from}")
    if opts.max_steps is None and opts.time_budget is None:
        raise BertforgeError("give --max-steps or --time-budget")
    if opts.data is not None and is_locked(opts.data):
        raise BertforgeError(f"--data {opts.data}: another bertforge run is writing these shards (bertforge "
                             "prepare); wait for it to finish")


def pretrain(opts: PretrainOptions) -> dict[str, Any]:
    """Run one pretraining job; returns the final held-out metrics (rank 0; {} on other ranks)."""
    if opts.recipe.objective == ICT:  # a retriever's towers, not an objective module over shards
        from bertforge.pretraining.ict import pretrain_ict
        return pretrain_ict(opts)
    if opts.recipe.objective == REALM:  # a reader and a retriever's towers over a knowledge index
        from bertforge.pretraining.realm import pretrain_realm
        return pretrain_realm(opts)
    t_start, wall_start = time.perf_counter(), time.time()
    rank, world, local_rank = distributed_context()
    is_main = rank == 0
    # The process group is needed before the Trainer exists (rank 0 prepares, the others wait at a barrier);
    # the Trainer then finds it initialised and reuses it.
    device = resolve_device(opts.device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owns_group = init_distributed(device) if world > 1 else False
    _check_options(opts)
    paths = corpus_paths(opts, is_main, world)
    result = run_in_claimed_out(opts, paths, is_main, lambda: _pretrain(opts, paths, device, t_start, wall_start))
    if owns_group and is_distributed():
        barrier()
        torch.distributed.destroy_process_group()
    return result


def _pretrain(opts: PretrainOptions, paths: list[str], device: torch.device, t_start: float,
              wall_start: float) -> dict[str, Any]:
    rank, world, _ = distributed_context()
    is_main = rank == 0
    threads = opts.threads or auto_threads(world)
    torch.set_num_threads(threads)
    tok = prepare_tokenizer(opts, paths, is_main)
    data_dir = prepare_data(opts, paths, tok, is_main)
    t_prepared = time.perf_counter()

    train_corpus = ShardedCorpus(data_dir, split="train", heldout_fraction=opts.heldout_fraction, tokenizer=tok)
    held_corpus = ShardedCorpus(data_dir, split="heldout", heldout_fraction=opts.heldout_fraction)
    if len(held_corpus) == 0:
        frac = held_corpus.manifest.get("heldout_fraction") if opts.heldout_fraction is None else opts.heldout_fraction
        raise BertforgeError(f"{data_dir}: no held-out documents at heldout_fraction={frac} "
                             f"(corpus of {len(train_corpus)} documents); raise --heldout-fraction")
    torch.manual_seed(opts.seed)
    model = build_model(opts, tok)
    kind = kind_for(opts, model, tok)  # what it trains on and how it is scored (pretraining.scoring)
    train_ds, collate = kind.data(train_corpus)
    loader = ResumableLoader(train_ds, opts.batch_size, collate_fn=collate, shuffle=True,
                             seed=opts.seed, drop_last=True, rank=rank, world_size=world)
    if is_main:
        kind.heldout(held_corpus, train_corpus)
        if opts.heldout_sets:  # tokenised and masked now: a bad file fails before training, not after
            kind.named_heldout(opts.heldout_sets, opts.out / "heldout")
    lr, warmup, size = schedule(opts, model.config)
    warned: list[int] = []

    def eval_fn(m: nn.Module) -> dict[str, float]:
        metrics = kind.metrics(m)
        if not warned and stuck_at_baseline(metrics, trainer.step):  # one warning per run
            warned.append(trainer.step)
            trainer.pbar.write(stuck_warning(metrics, trainer.step, lr, opts.recipe.default_lr(size), size))
        return metrics

    cfg = TrainConfig(out_dir=opts.out, lr=lr, max_steps=opts.max_steps, time_budget_s=opts.time_budget,
                      warmup_ratio=warmup, schedule=opts.recipe.schedule, precision=opts.precision, seed=opts.seed,
                      resume=opts.resume, log_every=opts.log_every, save_every=opts.save_every,
                      progress=opts.progress and is_main,
                      # a continued checkpoint's pooler gets no gradient from an objective without a sentence task
                      ddp_find_unused_parameters=(getattr(model.config, "use_pooler", False)
                                                  and not uses_pooler(opts.recipe.objective)),
                      device=str(device), compile=opts.compile, report_to=opts.report_to,
                      logging_dir=opts.logging_dir,
                      extra={"recipe": asdict(opts.recipe), "size": size, "seq_len": opts.seq_len})
    trainer = Trainer(model, loader, cfg, eval_fn=eval_fn, save_fn=save_fn_for(tok), load_fn=load_objective)
    n_params = sum(p.numel() for p in model.parameters())
    if is_main:
        print(setup_line(opts, model.config.model_type, n_params, world, lr, warmup, threads, len(train_ds), size)
              + (f"; {trainer.matmul_note}" if trainer.matmul_note else ""), flush=True)
    t_train = time.perf_counter()
    history = trainer.train()
    earlier = trainer.train_seconds - (time.perf_counter() - t_train)  # training time of earlier segments

    result: dict[str, Any] = {}
    if is_main:
        model = trainer.model
        evals = [h for h in history if h.get("split") == "eval"]
        metrics = {k: v for k, v in evals[-1].items() if k not in ("step", "split")} if evals else eval_fn(model)
        model.save_pretrained(opts.out, tokenizer=tok)
        result = {
            "recipe": asdict(opts.recipe), "size": size, "seq_len": opts.seq_len, "batch_size": opts.batch_size,
            "steps": trainer.step, "parameters": n_params, "precision": opts.precision, "lr": lr,
            "warmup_ratio": warmup, "heldout": metrics, **kind.examples(model, held_corpus),
            # a resumed run: train counts every segment; total is this invocation plus earlier segments' training
            "seconds": {"prepare": round(t_prepared - t_start, 2), "train": round(trainer.train_seconds, 2),
                        "total": round(time.perf_counter() - t_start + max(earlier, 0.0), 2)},
            "segments": trainer.segments,
            # non-padding tokens trained on, all ranks, all segments
            "tokens_seen": trainer.tokens_seen,
        }
        if warned:
            result["stuck_at_baseline_step"] = warned[0]
        if opts.heldout_sets:
            result["heldout_sets"] = kind.named_metrics(model)
        if opts.extra_eval is not None:
            result["common"] = opts.extra_eval(model)
        atomic_write_text(opts.out / "eval_results.json", json.dumps(result, indent=2) + "\n")
        print_summary(result, opts.out, curves_line(opts.out, wall_start))
    return result
