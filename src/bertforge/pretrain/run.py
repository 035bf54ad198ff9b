"""The pretraining run driver: corpus -> tokenizer -> shards -> examples -> objective -> Trainer -> HF checkpoint.

`pretrain(PretrainOptions(...))` is what `bertforge pretrain` calls; `ablate` calls it once per arm. Output layout:

    OUT/tokenizer/        the tokenizer (trained here unless given or taken from --init-from)
    OUT/data/             prepared shards (manifest.json + memmaps)
    OUT/checkpoints/      trainer checkpoints (HF dirs + trainer_state.pt), for --resume
    OUT/metrics.jsonl     training and eval records; OUT/curves.png
    OUT/config.json, model.safetensors, tokenizer files   the final model (ELECTRA: + discriminator/, generator/)
    OUT/eval_results.json held-out metrics, baseline, fill-mask examples, wall times
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from bertforge.checkpoint import atomic_write_text, load_pretrained
from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.pretrain.objectives import IGNORE, ELECTRAObjective, build_objective, uses_pooler
from bertforge.pretrain.recipes import Recipe

log = logging.getLogger("bertforge.pretrain")

DEFAULT_VOCAB_EMBEDDED = 8192   # the small stdlib-docs corpus: a small vocabulary trains fast and fits it
DEFAULT_VOCAB = 30522
PREPARE_HELDOUT = 0.05   # held-out share of shards this driver prepares itself
PAIR_FORMATS = ("segment-pair", "sentence-pair")


@dataclass
class PretrainOptions:
    recipe: Recipe
    out: Path
    corpus: list[str] | None = None        # None: the embedded stdlib-documentation corpus
    data: Path | None = None               # shards from `bertforge prepare` (skips tokenising)
    tokenizer: Path | None = None
    vocab_size: int | None = None
    size: str = "bert-mini"
    seq_len: int = 128
    batch_size: int = 32
    max_steps: int | None = None
    time_budget: str | float | None = None
    lr: float | None = None
    warmup_ratio: float = 0.06
    precision: str = "fp32"
    seed: int = 0
    resume: bool = False
    init_from: Path | None = None
    heldout_fraction: float | None = None  # None: what the shards' manifest says (PREPARE_HELDOUT when made here)
    eval_batches: int = 20
    log_every: int = 10
    save_every: int | None = None
    workers: int = 1
    threads: int | None = None             # torch threads per process; None: the cores not busy elsewhere
    progress: bool = True
    fill_mask_examples: int = 3
    extra_eval: Callable[[nn.Module], dict[str, float]] | None = None  # run on the final model (ablation)


def default_precision() -> str:
    """bf16 autocast where the hardware does bf16 matmuls natively (AVX512-BF16 / AMX CPUs, recent GPUs)."""
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="ignore")
    except OSError:
        return "fp32"
    return "bf16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "fp32"


def auto_threads(world_size: int = 1) -> int:
    """Torch threads per process: this process's share of the cores (`--threads` overrides).

    Not load-dependent: the load average counts this run's own tokenising and preparation, so subtracting it
    starved the training that follows. On a machine shared with other jobs, pass --threads.
    """
    import os
    return max(1, (os.cpu_count() or 1) // max(world_size, 1))


# ---- data ---------------------------------------------------------------------------------------------------------
BUILDER_FOR = {  # (input format, sentence task) -> bertforge.data example builder
    ("segment-pair", "nsp"): "segment_pair", ("sentence-pair", "nsp"): "sentence_pair",
    ("segment-pair", "sop"): "sop",
    ("segment-pair", None): "segment_pair", ("sentence-pair", None): "sentence_pair",
    ("full-sentences", None): "full_sentences", ("doc-sentences", None): "doc_sentences",
}


def builder_name(recipe: Recipe) -> str:
    key = (recipe.input_format, recipe.sentence_task)
    if key not in BUILDER_FOR:
        raise BertforgeError(f"--input-format {recipe.input_format} cannot make {recipe.sentence_task.upper()} "
                             f"examples (SOP needs segment-pair)")
    return BUILDER_FOR[key]


def make_dataset(corpus, recipe: Recipe, seq_len: int, seed: int, static: bool | None = None,
                 dupe_factor: int | None = None):
    """PretrainingDataset over `corpus` with the recipe's builder, masking mode and static/dynamic choice."""
    from bertforge.data import Masker, PretrainingDataset
    static = (not recipe.dynamic) if static is None else static
    masker = Masker(corpus.vocab_size, corpus.mask_id, corpus.special_ids, mlm_probability=recipe.mask_prob,
                    mode=recipe.masking)
    return PretrainingDataset(corpus, builder_name(recipe), masker, seq_len=seq_len,
                              masking="static" if static else "dynamic",
                              dupe_factor=(dupe_factor or recipe.dupe_factor) if static else 1, seed=seed)


def token_frequencies(corpus, chunk: int = 1 << 24) -> np.ndarray:
    """Token counts over every shard (for the most-frequent-token baseline; the held-out share is negligible)."""
    counts = np.zeros(corpus.vocab_size, np.int64)
    for start in range(0, corpus.total_tokens, chunk):
        ids = np.asarray(corpus.tokens(start, min(start + chunk, corpus.total_tokens)), np.int64)
        counts += np.bincount(ids, minlength=corpus.vocab_size)
    return counts


# ---- evaluation ---------------------------------------------------------------------------------------------------
@torch.no_grad()
def mlm_metrics(model: nn.Module, batches: list[dict], most_frequent: int, device: torch.device | None = None,
                precision: str = "fp32") -> dict[str, float]:
    """MLM accuracy / loss of `model.predict_masked` (any objective; ELECTRA's generator) at the masked positions
    of `batches`, and the accuracy of always predicting `most_frequent` there (the baseline)."""
    was_training = model.training
    model.eval()
    device = device or next(model.parameters()).device
    correct = total = base = 0
    loss_sum = 0.0
    for b in batches:
        b = {k: v.to(device) for k, v in b.items()}
        pos = b["mlm_labels"].ne(IGNORE)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model.predict_masked(b["input_ids"], b["attention_mask"], b.get("token_type_ids"), pos)
        logits = logits.float()
        targets = b["mlm_labels"][pos]
        correct += int(logits.argmax(-1).eq(targets).sum())
        base += int(targets.eq(most_frequent).sum())
        loss_sum += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        total += int(targets.numel())
    model.train(was_training)
    loss = loss_sum / max(total, 1)
    return {"mlm_acc": correct / max(total, 1), "mlm_loss": loss, "mlm_ppl": math.exp(min(loss, 50)),
            "baseline_acc": base / max(total, 1), "masked_tokens": float(total)}


@torch.no_grad()
def evaluate(model: nn.Module, loader_batches: list[dict], most_frequent: int, device: torch.device,
             precision: str = "fp32") -> dict[str, float]:
    """Held-out metrics: the objective's own numbers (NSP/SOP, SBO, RTD accuracy) from its forward, and MLM
    loss/accuracy/baseline from `mlm_metrics` (the one place they are computed; ablation uses it too)."""
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for batch in loader_batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model(**batch)
        k = int(batch["mlm_labels"].ne(IGNORE).sum())
        for name, value in out.items():
            if not isinstance(value, torch.Tensor) or value.ndim or name.startswith("mlm") or name == "loss":
                continue
            w = k if name.startswith("sbo") else 1  # SBO numbers are per masked token; the rest per batch
            sums[name] = sums.get(name, 0.0) + float(value) * w
            weights[name] = weights.get(name, 0.0) + w
    model.train(was_training)
    res = {name: sums[name] / max(weights[name], 1e-9) for name in sums}
    res.pop("replaced_frac", None)
    res.update(mlm_metrics(model, loader_batches, most_frequent, device, precision))
    return res


class _MaskedLMView:
    """An objective seen as the `MaskedLM` that `bertforge.analysis.fill_mask` expects (config, eval, __call__)."""

    def __init__(self, objective: nn.Module):
        self.objective, self.config = objective, objective.config

    def eval(self) -> "_MaskedLMView":
        self.objective.eval()
        return self

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, positions=None) -> torch.Tensor:
        device = next(self.objective.parameters()).device
        to = (lambda t: None if t is None else t.to(device))
        return self.objective.predict_masked(to(input_ids), to(attention_mask), to(token_type_ids), to(positions))


def fill_mask(model: nn.Module, tok, texts: list[str], top_k: int = 5) -> list[dict]:
    """Top-k predictions for the first mask token of each text (via bertforge.analysis.fill_mask)."""
    from bertforge.analysis.fill_mask import fill_mask as analysis_fill_mask
    view = _MaskedLMView(model)
    out = []
    for text in texts:
        first = analysis_fill_mask(view, tok, text, top_k=top_k)[0]
        out.append({"text": text, "predictions": [{"token": c.token, "score": round(float(c.probability), 4)}
                                                  for c in first]})
    return out


def fill_mask_prompts(corpus, tok, n: int) -> list[tuple[str, str]]:
    """(masked text, answer) pairs from held-out sentences: one whole-word token masked near the middle."""
    prompts = []
    for d in range(len(corpus)):
        for sent in corpus.document(d):
            ids = [int(i) for i in sent]
            if not 8 <= len(ids) <= 40:
                continue
            toks = tok.convert_ids_to_tokens(ids)
            # a whole word (not a continuation, next token starts a new word) of letters, near the middle
            order = sorted(range(2, len(ids) - 2), key=lambda i: abs(i - len(ids) // 2))
            for i in order:
                t = toks[i].lstrip("▁Ġ")
                if not (t.isalpha() and len(t) >= 3 and not toks[i].startswith("##")):
                    continue
                if tok.kind == "wordpiece" and toks[i + 1].startswith("##"):
                    continue
                if tok.kind in ("bpe", "unigram") and toks[i][0] not in "▁Ġ":
                    continue
                ids_masked = ids[:i] + [tok.mask_token_id] + ids[i + 1:]
                text = tok.decode(ids_masked, skip_special_tokens=False)
                prompts.append((text, t))
                break
            if len(prompts) >= n:
                return prompts
            break  # one sentence per document: variety
    return prompts


# ---- saving / loading the objective -----------------------------------------------------------------------------
def save_fn_for(tok):
    def save(model: nn.Module, directory: Path) -> None:
        model.save_pretrained(directory, tokenizer=tok)
    return save


def load_objective(model: nn.Module, directory: Path) -> None:
    """Load a bertforge/HF pretraining dir into an objective (ELECTRA: discriminator/ and generator/)."""
    directory = Path(directory)
    if isinstance(model, ELECTRAObjective):
        if (directory / "discriminator").is_dir():
            load_pretrained(model.discriminator, directory / "discriminator")
        else:
            load_pretrained(model.discriminator, directory)
        if (directory / "generator").is_dir():
            load_pretrained(model.generator, directory / "generator")
        return
    load_pretrained(model, directory)


# ---- the run ------------------------------------------------------------------------------------------------------
def _barrier():
    from bertforge.training.distributed import barrier
    barrier()


FINGERPRINT = "corpus_fingerprint.json"


def corpus_fingerprint(corpus_paths: list[str]) -> list[list]:
    """[path, size, mtime_ns] of every corpus file, sorted: what decides whether OUT/tokenizer and OUT/data were
    made from this corpus (a changed --corpus, or an edited file, must not silently reuse them)."""
    files = sorted(str(Path(p).resolve()) for p in _find(corpus_paths))
    return [[f, (st := Path(f).stat()).st_size, st.st_mtime_ns] for f in files]


def _fingerprint_matches(directory: Path, fingerprint: list[list]) -> bool:
    try:
        return json.loads((directory / FINGERPRINT).read_text()) == fingerprint
    except (OSError, ValueError):
        return False


def _write_fingerprint(directory: Path, fingerprint: list[list]) -> None:
    atomic_write_text(directory / FINGERPRINT, json.dumps(fingerprint) + "\n")


def prepare_tokenizer(opts: PretrainOptions, corpus_paths: list[str], is_main: bool):
    """The tokenizer: --init-from's, --tokenizer, a previously trained OUT/tokenizer, or one trained now."""
    from bertforge.tokenization import Tokenizer
    out_tok = opts.out / "tokenizer"
    if opts.init_from is not None:
        src = opts.init_from
    elif opts.tokenizer is not None:
        src = opts.tokenizer
    else:
        src = None
    if src is not None:
        return Tokenizer.from_pretrained(src)
    vocab = opts.vocab_size or (DEFAULT_VOCAB_EMBEDDED if opts.corpus is None else DEFAULT_VOCAB)
    fingerprint = corpus_fingerprint(corpus_paths)  # every rank: all must take the same branch below
    if (out_tok / "tokenizer.json").is_file():
        # A resumed run must keep its tokenizer; a fresh one reuses it only when it is what would be trained
        # anyway: same kind, same vocabulary size, same corpus files (paths, sizes, mtimes).
        old = Tokenizer.from_pretrained(out_tok)
        if opts.resume or (old.kind == opts.recipe.tokenizer_kind and old.vocab_size == vocab
                           and _fingerprint_matches(out_tok, fingerprint)):
            return old
    _barrier()  # every rank has looked at the old tokenizer before rank 0 replaces it
    if is_main:
        t0 = time.perf_counter()
        tok = Tokenizer.train(corpus_paths, kind=opts.recipe.tokenizer_kind, vocab_size=vocab,
                              model_max_length=max(512, opts.seq_len))
        tok.save_pretrained(out_tok)
        _write_fingerprint(out_tok, fingerprint)
        print(f"trained {opts.recipe.tokenizer_kind} tokenizer: vocab {tok.vocab_size} "
              f"({time.perf_counter() - t0:.1f} s) -> {out_tok}", flush=True)
    _barrier()
    return Tokenizer.from_pretrained(out_tok)


def prepare_data(opts: PretrainOptions, corpus_paths: list[str], tok, is_main: bool) -> Path:
    """Shards for the corpus (reused when OUT/data holds them for this tokenizer and these corpus files)."""
    from bertforge.data import ShardedCorpus, prepare_corpus
    if opts.data is not None:
        return opts.data
    data_dir = opts.out / "data"
    if is_main:
        reuse = False
        if (data_dir / "manifest.json").is_file():
            try:
                ShardedCorpus(data_dir, tokenizer=tok)  # raises when the shards were made by another tokenizer
                reuse = _fingerprint_matches(data_dir, corpus_fingerprint(corpus_paths))
            except BertforgeError:
                reuse = False
        if not reuse:
            fingerprint = corpus_fingerprint(corpus_paths)
            frac = PREPARE_HELDOUT if opts.heldout_fraction is None else opts.heldout_fraction
            manifest = prepare_corpus(corpus_paths, tok, data_dir, workers=opts.workers, progress=opts.progress,
                                      heldout_fraction=frac)
            _write_fingerprint(data_dir, fingerprint)
            print(f"prepared {manifest['num_tokens']:,} tokens in {manifest['num_documents']:,} documents "
                  f"({manifest['stats']['seconds']:.1f} s) -> {data_dir}", flush=True)
    _barrier()
    return data_dir


def _find(paths):
    from bertforge.data import find_files
    return find_files(paths)


def build_model(opts: PretrainOptions, tok) -> nn.Module:
    """The objective module; with --init-from the encoder shape comes from that checkpoint and its weights load."""
    if opts.init_from is not None:
        src = opts.init_from
        cfg = ModelConfig.from_file(src / "discriminator" if (src / "discriminator").is_dir() else src)
        cfg = cfg.replace(extra={})
        if opts.recipe.objective == "electra" and cfg.model_type != "electra":
            raise BertforgeError(f"--init-from {src}: a {cfg.model_type} checkpoint cannot continue as ELECTRA")
        if opts.seq_len > cfg.max_position_embeddings - cfg.position_offset:
            raise BertforgeError(f"--seq-len {opts.seq_len} exceeds {src}'s max_position_embeddings")
        model = build_objective(opts.recipe.objective, cfg, keep_pooler=True)
        check_model_fits_recipe(model.config, opts.recipe, f"--init-from {src}")
        load_objective(model, src)
        return model
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    cfg = opts.recipe.model_config(opts.size, tok.vocab_size, pad, opts.seq_len)
    model = build_objective(opts.recipe.objective, cfg)
    check_model_fits_recipe(model.config, opts.recipe, f"--recipe {opts.recipe.name}")
    return model


def single_segment(cfg: ModelConfig, recipe: Recipe) -> bool:
    """Pair inputs fed to a RoBERTa encoder (type_vocab_size 1) use one segment id for both segments, as RoBERTa
    itself does; the [SEP] between them still marks the boundary."""
    return recipe.input_format in PAIR_FORMATS and cfg.type_vocab_size < 2 and cfg.model_type == "roberta"


def check_model_fits_recipe(cfg: ModelConfig, recipe: Recipe, source: str) -> None:
    """One clear line, before any training, for a model that cannot take the recipe's batches."""
    if recipe.sentence_task is not None and not cfg.use_pooler:
        raise BertforgeError(f"{source}: a {cfg.model_type} model without a pooler cannot train "
                             f"{recipe.sentence_task.upper()} (use --objective mlm)")
    if recipe.input_format in PAIR_FORMATS and cfg.type_vocab_size < 2 and not single_segment(cfg, recipe):
        raise BertforgeError(f"{source}: --input-format {recipe.input_format} needs 2 token types, the "
                             f"{cfg.model_type} model has type_vocab_size {cfg.type_vocab_size} "
                             f"(use --input-format full-sentences or doc-sentences)")


class SingleSegmentCollator:
    """Wraps a collator so every token_type_id is 0 (see `single_segment`); set_epoch etc. pass through."""

    def __init__(self, collate: Callable[[list], dict]):
        self.collate = collate

    def __call__(self, items: list) -> dict:
        batch = self.collate(items)
        if "token_type_ids" in batch:
            batch["token_type_ids"] = torch.zeros_like(batch["token_type_ids"])
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.collate, name)


class TokenCounter:
    """Non-padding tokens (attention_mask sums) the objective trains on, counted by a forward pre-hook in training
    mode (evaluation forwards run in eval mode and are not counted)."""

    def __init__(self, model: nn.Module):
        self.tokens = 0
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if module.training:
            mask = kwargs.get("attention_mask", args[2] if len(args) > 2 else None)
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.tokens += int(mask.sum()) if mask is not None else int(ids.numel())

    def total(self, device: torch.device) -> int:
        """Summed over ranks (every rank must call it)."""
        from bertforge.training.distributed import is_distributed
        self.handle.remove()
        if not is_distributed():
            return self.tokens
        t = torch.tensor([self.tokens], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(t)
        return int(t.item())


def pretrain(opts: PretrainOptions) -> dict[str, Any]:
    """Run one pretraining job; returns the final held-out metrics (rank 0; {} on other ranks)."""
    from bertforge.data import ShardedCorpus
    from bertforge.train import ResumableLoader, TrainConfig, Trainer, distributed_context
    from bertforge.training.distributed import init_distributed, is_distributed
    from bertforge.training.trainer import resolve_device

    t_start = time.perf_counter()
    rank, world, local_rank = distributed_context()
    is_main = rank == 0
    # The process group is needed before the Trainer exists (rank 0 prepares, the others wait at a barrier);
    # the Trainer then finds it initialised and reuses it.
    device = resolve_device("auto", local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owns_group = init_distributed(device) if world > 1 else False
    opts.out = Path(opts.out)
    if opts.init_from is not None:
        opts.init_from = Path(opts.init_from)
        if not (opts.init_from / "config.json").is_file():
            raise BertforgeError(f"--init-from {opts.init_from}: not a checkpoint directory (no config.json)")
    if opts.max_steps is None and opts.time_budget is None:
        raise BertforgeError("give --max-steps or --time-budget")
    if not opts.resume and (opts.out / "checkpoints").is_dir() and rank == 0:
        # The Trainer (overwrite=True) deletes an earlier run's checkpoints; say so where the user looks.
        print(f"note: {opts.out} holds an earlier run; its checkpoints are replaced (--resume continues a run)",
              flush=True)
    opts.out.mkdir(parents=True, exist_ok=True)

    if opts.corpus is None and opts.data is None:
        from bertforge.pretrain.default_corpus import default_corpus
        corpus_paths = [str(default_corpus())] if is_main else []
        if world > 1:
            _barrier()
            corpus_paths = [str(default_corpus())]
        if is_main:
            print(f"corpus: the Python standard library's documentation ({corpus_paths[0]})", flush=True)
    else:
        corpus_paths = [str(p) for p in (opts.corpus or [])]

    threads = opts.threads or auto_threads(world)
    torch.set_num_threads(threads)
    tok = prepare_tokenizer(opts, corpus_paths, is_main)
    data_dir = prepare_data(opts, corpus_paths, tok, is_main)
    t_prepared = time.perf_counter()

    train_corpus = ShardedCorpus(data_dir, split="train", heldout_fraction=opts.heldout_fraction, tokenizer=tok)
    held_corpus = ShardedCorpus(data_dir, split="heldout", heldout_fraction=opts.heldout_fraction)
    if len(held_corpus) == 0:
        frac = held_corpus.manifest.get("heldout_fraction") if opts.heldout_fraction is None else opts.heldout_fraction
        raise BertforgeError(f"{data_dir}: no held-out documents at heldout_fraction={frac} "
                             f"(corpus of {len(train_corpus)} documents); raise --heldout-fraction")
    torch.manual_seed(opts.seed)
    model = build_model(opts, tok)
    one_segment = single_segment(model.config, opts.recipe)
    train_ds = make_dataset(train_corpus, opts.recipe, opts.seq_len, opts.seed)
    collate = SingleSegmentCollator(train_ds.collator()) if one_segment else train_ds.collator()
    loader = ResumableLoader(train_ds, opts.batch_size, collate_fn=collate, shuffle=True,
                             seed=opts.seed, drop_last=True, rank=rank, world_size=world)

    eval_batches: list[dict] = []
    most_frequent = -1
    if is_main:
        # Held-out: static masks with a fixed seed, so every evaluation (and every ablation arm) sees the same task.
        held_ds = make_dataset(held_corpus, opts.recipe, opts.seq_len, seed=12345, static=True, dupe_factor=1)
        collate = SingleSegmentCollator(held_ds.collator()) if one_segment else held_ds.collator()
        n = min(len(held_ds), opts.eval_batches * opts.batch_size)
        eval_batches = [collate([held_ds[i] for i in range(s, min(s + opts.batch_size, n))])
                        for s in range(0, n, opts.batch_size)]
        counts = token_frequencies(train_corpus)
        counts[list(train_corpus.special_ids)] = 0
        most_frequent = int(counts.argmax())

    def eval_fn(m: nn.Module) -> dict[str, float]:
        return evaluate(m, eval_batches, most_frequent, next(m.parameters()).device, opts.precision)

    lr = opts.lr or opts.recipe.lr
    cfg = TrainConfig(out_dir=opts.out, lr=lr, max_steps=opts.max_steps, time_budget_s=opts.time_budget,
                      warmup_ratio=opts.warmup_ratio, precision=opts.precision, seed=opts.seed,
                      resume=opts.resume, log_every=opts.log_every, save_every=opts.save_every,
                      progress=opts.progress and is_main,
                      # a continued checkpoint's pooler gets no gradient from an objective without a sentence task
                      ddp_find_unused_parameters=(getattr(model.config, "use_pooler", False)
                                                  and not uses_pooler(opts.recipe.objective)),
                      device=str(device),
                      extra={"recipe": asdict(opts.recipe), "size": opts.size, "seq_len": opts.seq_len})
    trainer = Trainer(model, loader, cfg, eval_fn=eval_fn, save_fn=save_fn_for(tok), load_fn=load_objective)
    n_params = sum(p.numel() for p in model.parameters())
    if is_main:
        r = opts.recipe
        print(f"pretraining {r.name}: objective {r.objective}, masking {r.masking} "
              f"({'dynamic' if r.dynamic else f'static x{r.dupe_factor}'}), input {r.input_format}, "
              f"{opts.size} ({model.config.model_type}, {n_params / 1e6:.1f}M parameters), seq {opts.seq_len}, "
              f"batch {opts.batch_size}x{world}, lr {lr:g}, {opts.precision}, {threads} thread(s), "
              f"{len(train_ds):,} training examples", flush=True)
    counter = TokenCounter(model)
    t_train = time.perf_counter()
    history = trainer.train()
    t_trained = time.perf_counter()
    tokens_seen = counter.total(device)

    result: dict[str, Any] = {}
    if is_main:
        model = trainer.model
        evals = [h for h in history if h.get("split") == "eval"]
        metrics = {k: v for k, v in evals[-1].items() if k not in ("step", "split")} if evals else eval_fn(model)
        model.save_pretrained(opts.out, tokenizer=tok)
        prompts = fill_mask_prompts(held_corpus, tok, opts.fill_mask_examples)
        fills = fill_mask(model, tok, [p for p, _ in prompts]) if prompts else []
        for f, (_, answer) in zip(fills, prompts):
            f["answer"] = answer
        result = {
            "recipe": asdict(opts.recipe), "size": opts.size, "seq_len": opts.seq_len, "batch_size": opts.batch_size,
            "steps": trainer.step, "parameters": n_params, "precision": opts.precision,
            "heldout": metrics, "fill_mask": fills,
            "seconds": {"prepare": round(t_prepared - t_start, 2), "train": round(t_trained - t_train, 2),
                        "total": round(time.perf_counter() - t_start, 2)},
            # non-padding tokens trained on by this invocation, all ranks (a resumed run counts its own part)
            "tokens_seen": tokens_seen,
        }
        if opts.extra_eval is not None:
            result["common"] = opts.extra_eval(model)
        atomic_write_text(opts.out / "eval_results.json", json.dumps(result, indent=2) + "\n")
        print_summary(result, opts.out)
    if owns_group and is_distributed():
        _barrier()
        torch.distributed.destroy_process_group()
    return result


def print_summary(result: dict[str, Any], out: Path) -> None:
    m = result["heldout"]
    print(f"\nheld-out after {result['steps']} steps ({result['seconds']['train']:.0f} s training, "
          f"{result['seconds']['total']:.0f} s total):")
    if "mlm_acc" in m:
        print(f"  MLM accuracy {m['mlm_acc']:.3f}   (most-frequent-token baseline {m['baseline_acc']:.3f})   "
              f"loss {m.get('mlm_loss', float('nan')):.3f}   perplexity {m.get('mlm_ppl', float('nan')):.1f}")
    for key, label in (("nsp_acc", "NSP accuracy"), ("sop_acc", "SOP accuracy"), ("sbo_acc", "SBO accuracy"),
                       ("rtd_acc", "RTD accuracy")):
        if key in m:
            print(f"  {label} {m[key]:.3f}")
    for f in result["fill_mask"]:
        preds = ", ".join(f"{p['token']} ({p['score']:.2f})" for p in f["predictions"])
        print(f"  fill-mask: {f['text'][:90]!r}\n     answer {f['answer']!r} -> {preds}")
    print(f"saved the model and tokenizer to {out} (eval_results.json, metrics.jsonl, curves.png)")
