"""Encoder-decoder pretraining through the one pretraining run (`pretraining.run`): T5's span corruption (`--recipe
t5`) and BART's text infilling + sentence permutation (`--recipe bart`).

The model is `bertforge.model.Seq2SeqLM` (saved as T5ForConditionalGeneration / BartForConditionalGeneration),
its shape the --size's (`config.seq2seq.compose_seq2seq`: the size's layers in the encoder and in the decoder);
the examples and their noise come from `data.seq2seq`. Held-out metrics: the decoder's loss, perplexity and
accuracy on the targets of fixed held-out noise, beside a unigram model of the training text (add-one smoothed)
scoring the same targets; a few held-out examples are denoised greedily for the run's eval_results.json.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.families import FAMILIES, SIZE_PREFIX
from bertforge.config.positions import check_length
from bertforge.config.seq2seq import Seq2SeqConfig, compose_seq2seq
from bertforge.data.masking import IGNORE_INDEX
from bertforge.data.seq2seq import INFILLING, SPAN_CORRUPTION, Seq2SeqCollator, Seq2SeqPretrainingDataset, make_noise
from bertforge.errors import BertforgeError
from bertforge.model import ModelFolder, Seq2SeqLM
from bertforge.pretraining.recipes import SEQ2SEQ_OBJECTIVES

# objective -> the noise of data.seq2seq; the recipe's mask_prob is the noise share, its span_mean the span length
NOISES = dict(zip(SEQ2SEQ_OBJECTIVES, (SPAN_CORRUPTION, INFILLING)))
HELDOUT_SEED = 12345  # as pretraining.inputs: the same held-out noise for every evaluation


def is_seq2seq(recipe) -> bool:
    return recipe.objective in SEQ2SEQ_OBJECTIVES


class Seq2SeqObjective(Seq2SeqLM):
    """The denoising loss: cross-entropy of the decoder on the targets (labels shifted right inside the model), and
    its accuracy, for the Trainer's logs."""

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **_: Any) -> dict[str, torch.Tensor]:
        out = super().forward(input_ids, attention_mask, labels=labels)
        keep = labels.ne(IGNORE_INDEX)
        acc = (out["logits"].detach().argmax(-1).eq(labels) & keep).sum() / keep.sum().clamp(min=1)
        return {"loss": out["loss"], "lm_loss": out["loss"].detach(), "lm_acc": acc}


def noise_ids(tok) -> dict[str, Any]:
    return {"sentinel_ids": tok.sentinel_ids, "eos_id": tok.sep_token_id, "bos_id": tok.cls_token_id,
            "mask_id": tok.mask_token_id}


def check_tokenizer(recipe, tok, source: str) -> None:
    """One line for a tokenizer the recipe cannot use (no sentinels for T5, no <mask> for BART)."""
    noise = NOISES[recipe.objective]
    if noise == SPAN_CORRUPTION and not tok.sentinel_ids:
        raise BertforgeError(f"{source}: a {tok.kind} tokenizer has no sentinel tokens (<extra_id_0>, ...); "
                             f"--recipe {recipe.name} trains its own (kind {recipe.tokenizer_kind})")
    if noise == INFILLING and tok.mask_token_id is None:
        raise BertforgeError(f"{source}: a {tok.kind} tokenizer has no <mask> token for BART's infilling")


def model_config(recipe, size: str, tok, seq_len: int) -> Seq2SeqConfig:
    """--size's shape in the recipe's family, with the tokenizer's vocabulary and special ids."""
    fam = FAMILIES[recipe.model_type]
    ids = dict(vocab_size=tok.vocab_size, pad_token_id=tok.pad_token_id, eos_token_id=tok.sep_token_id,
               # T5's decoder starts from <pad>, BART's from </s> (transformers' rule)
               decoder_start_token_id=tok.sep_token_id if fam.decoder_starts_with == "eos" else tok.pad_token_id)
    if fam.prompt_starts_with_bos:
        ids.update(bos_token_id=tok.cls_token_id)
    if fam.forces_eos:
        ids.update(forced_eos_token_id=tok.sep_token_id)
    return compose_seq2seq(recipe.model_type, size.removeprefix(SIZE_PREFIX),  # --size names the BERT shape
                           max_position_embeddings=max(fam.max_position_embeddings, seq_len), **ids)


def build_seq2seq(recipe, size: str, tok, seq_len: int, init_from: Path | None = None) -> Seq2SeqObjective:
    check_tokenizer(recipe, tok, "--tokenizer" if init_from is None else f"--init-from {init_from}")
    if init_from is None:
        return Seq2SeqObjective(model_config(recipe, size, tok, seq_len))
    folder = ModelFolder.open(init_from, "--init-from")
    cfg = folder.model_config
    if cfg is None or cfg.model_type != recipe.model_type:
        raise BertforgeError(f"--init-from {init_from}: a {getattr(cfg, 'model_type', folder.kind)} checkpoint cannot "
                             f"continue --recipe {recipe.name} (a {recipe.model_type} model)")
    check_length(seq_len, cfg, init_from, "--seq-len")
    return Seq2SeqObjective.from_pretrained(folder).train()


def load_seq2seq(model: nn.Module, directory: Path) -> None:
    """Load a saved encoder-decoder's weights into `model` (the Trainer's resume)."""
    saved = Seq2SeqLM.from_pretrained(directory)
    model.load_state_dict(saved.state_dict())


def data(corpus, recipe, tok, seq_len: int, seed: int) -> tuple[Seq2SeqPretrainingDataset, Seq2SeqCollator]:
    """The training examples and the collator that noises them (dynamically: a new noise every epoch)."""
    noise = NOISES[recipe.objective]
    ds = Seq2SeqPretrainingDataset(corpus, noise, seq_len, seed)
    collate = Seq2SeqCollator(make_noise(noise, noise_ids(tok), recipe.mask_prob, recipe.span_mean),
                              corpus.pad_id, seed, max_source=seq_len)
    return ds, collate


def heldout_batches(corpus, recipe, tok, seq_len: int, batch_size: int, n_batches: int) -> list[dict]:
    """Up to n_batches held-out batches, noised once with a fixed seed."""
    ds, collate = data(corpus, recipe, tok, seq_len, HELDOUT_SEED)
    n = min(len(ds), n_batches * batch_size)
    return [collate([ds[i] for i in range(s, min(s + batch_size, n))]) for s in range(0, n, batch_size)]


def unigram_baseline(corpus, batches: list[dict]) -> dict[str, float]:
    """Perplexity and accuracy on the held-out targets of a unigram model of the training text (add-one smoothed,
    so the sentinels it never saw keep a probability): what a decoder that ignores its input could reach."""
    from bertforge.pretraining.metrics import token_frequencies

    counts = token_frequencies(corpus).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    targets = np.concatenate([b["labels"][b["labels"] != IGNORE_INDEX].numpy() for b in batches])
    return {"unigram_ppl": math.exp(-float(logp[targets].mean())),
            "unigram_acc": float((targets == int(counts.argmax())).mean())}


@torch.no_grad()
def metrics(model: nn.Module, batches: list[dict], device: torch.device, precision: str = "fp32") -> dict[str, float]:
    """Per-target-token loss, perplexity and accuracy of the decoder over `batches`."""
    was_training = model.training
    model.eval()
    loss_sum = correct = total = 0.0
    for b in batches:
        b = {k: v.to(device) for k, v in b.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = Seq2SeqLM.forward(model, b["input_ids"], b["attention_mask"], labels=b["labels"])
        keep = b["labels"].ne(IGNORE_INDEX)
        n = int(keep.sum())
        loss_sum += float(out["loss"]) * n
        correct += float((out["logits"].argmax(-1).eq(b["labels"]) & keep).sum())
        total += n
    model.train(was_training)
    loss = loss_sum / max(total, 1)
    return {"lm_loss": loss, "lm_ppl": math.exp(min(loss, 50)), "lm_acc": correct / max(total, 1),
            "targets": float(total)}


def denoise_examples(model: Seq2SeqLM, tok, batches: list[dict], n: int = 3) -> list[dict[str, str]]:
    """The first n held-out examples: noised input, target and the model's greedy output, as text."""
    from bertforge.generation import generate_ids

    if not batches or n <= 0:
        return []
    b = batches[0]
    device = next(model.parameters()).device
    ids, mask, labels = (b[k][:n].to(device) for k in ("input_ids", "attention_mask", "labels"))
    width = int(labels.ne(IGNORE_INDEX).sum(-1).max())
    was_training = model.training
    model.eval()
    out = generate_ids(model, ids, mask, greedy=True, max_new_tokens=max(width, 1))[:, 1:]
    model.train(was_training)
    show = lambda x: tok.decode([int(t) for t in x if int(t) not in (IGNORE_INDEX, tok.pad_token_id)],  # noqa: E731
                                skip_special_tokens=False)
    return [{"input": show(i), "target": show(t), "output": show(o)} for i, t, o in zip(ids, labels, out)]
