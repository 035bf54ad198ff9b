"""How each kind of model is fed and scored while it pretrains. `pretraining.run` asks one `PretrainKind` for its
training data, its fixed held-out batches and baselines, its held-out metrics and the examples the run's
eval_results.json shows:

    MaskedKind       encoders (MLM and its NSP / SOP / span / StructBERT / ELECTRA / XLNet variants): masked-token
                     accuracy beside the most-frequent-token baseline; fill-mask examples
    LeftToRightKind  GPT and --recipe ltr: next-token perplexity beside unigram / bigram models; sampled text
    DenoisingKind    T5 and BART: the decoder's loss on held-out noise beside a unigram model; denoised examples
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from bertforge.data import ShardedCorpus, prepare_corpus
from bertforge.errors import BertforgeError
from bertforge.pretraining import seq2seq as s2s
from bertforge.pretraining.inputs import collator_for, heldout_batches, make_dataset, single_segment
from bertforge.pretraining.lm_eval import NgramBaselines, lm_metrics, samples
from bertforge.pretraining.metrics import evaluate, mlm_metrics, most_frequent_token
from bertforge.families import DECODER
from bertforge.pretraining.recipes import LEFT_TO_RIGHT, PLM
from bertforge.pretraining.options import PretrainOptions
from bertforge.pretraining.prompts import fill_mask, fill_mask_prompts


class PretrainKind:
    """The data and held-out scoring of one run; `heldout` fills `batches` and `baselines` (the main rank only)."""

    def __init__(self, opts: PretrainOptions, model: nn.Module, tok: Any) -> None:
        self.opts, self.model_config, self.tok = opts, model.config, tok
        self.batches: list[dict] = []
        self.baselines: dict[str, float] = {}

    def data(self, corpus) -> tuple[Any, Callable]:
        """(training dataset, collate function)."""
        raise NotImplementedError

    def heldout(self, held_corpus, train_corpus) -> None:
        raise NotImplementedError

    def metrics(self, model: nn.Module) -> dict[str, float]:
        raise NotImplementedError

    def examples(self, model: nn.Module, held_corpus) -> dict[str, list]:
        """What eval_results.json shows beside the numbers (always a `fill_mask` list, empty where nothing fills)."""
        return {"fill_mask": []}

    def named_heldout(self, sets: dict[str, list[str]], out: Path) -> None:
        """Prepare the named held-out corpora (`--heldout NAME=FILE`), scored by `named_metrics`."""
        raise BertforgeError(f"--heldout scores masked tokens; --objective {self.opts.recipe.objective} predicts "
                             "none (use the run's own held-out numbers)")

    def named_metrics(self, model: nn.Module) -> dict[str, dict[str, float]]:
        return {}

    def _device(self, model: nn.Module) -> torch.device:
        return next(model.parameters()).device


class MaskedKind(PretrainKind):
    def __init__(self, opts: PretrainOptions, model: nn.Module, tok: Any) -> None:
        super().__init__(opts, model, tok)
        self.one_segment = single_segment(model.config, opts.recipe)
        self.most_frequent = -1
        self.named: dict[str, list[dict]] = {}  # --heldout NAME -> its fixed masked batches

    def data(self, corpus) -> tuple[Any, Callable]:
        ds = make_dataset(corpus, self.opts.recipe, self.opts.seq_len, self.opts.seed)
        return ds, collator_for(ds, self.opts.recipe, self.one_segment)

    def heldout(self, held_corpus, train_corpus) -> None:
        o = self.opts
        self.batches = heldout_batches(held_corpus, o.recipe, o.seq_len, o.batch_size, o.eval_batches,
                                       self.one_segment)
        self.most_frequent = most_frequent_token(train_corpus)

    def metrics(self, model: nn.Module) -> dict[str, float]:
        return evaluate(model, self.batches, self.most_frequent, self._device(model), self.opts.precision)

    def named_heldout(self, sets: dict[str, list[str]], out: Path) -> None:
        """Each named corpus tokenised into OUT/NAME and masked once, as the held-out split is (the same seed, the
        same number of batches); its baseline is the training corpus's most frequent token, as the split's."""
        o = self.opts
        for name, paths in sets.items():
            prepare_corpus(paths, self.tok, out / name, workers=1, progress=False, heldout_fraction=0.0,
                           text_col=o.text_col)
            self.named[name] = heldout_batches(ShardedCorpus(out / name), o.recipe, o.seq_len, o.batch_size,
                                               o.eval_batches, self.one_segment)

    def named_metrics(self, model: nn.Module) -> dict[str, dict[str, float]]:
        return {name: mlm_metrics(model, batches, self.most_frequent, self._device(model), self.opts.precision)
                for name, batches in self.named.items()}

    def examples(self, model: nn.Module, held_corpus) -> dict[str, list]:
        if self.opts.recipe.objective == PLM:  # XLNet has no [MASK] to fill (fill-mask refuses its checkpoints)
            return {"fill_mask": []}
        prompts = fill_mask_prompts(held_corpus, self.tok, self.opts.fill_mask_examples)
        fills = fill_mask(model, self.tok, [p for p, _ in prompts]) if prompts else []
        for f, (_, answer) in zip(fills, prompts):
            f["answer"] = answer
        return {"fill_mask": fills}


class LeftToRightKind(PretrainKind):
    def data(self, corpus) -> tuple[Any, Callable]:
        ds = make_dataset(corpus, self.opts.recipe, self.opts.seq_len, self.opts.seed)
        return ds, collator_for(ds, self.opts.recipe)

    def heldout(self, held_corpus, train_corpus) -> None:
        o = self.opts
        self.batches = heldout_batches(held_corpus, o.recipe, o.seq_len, o.batch_size, o.eval_batches)
        # what a left-to-right LM is compared with: n-gram models of the same training text
        self.baselines = NgramBaselines.from_corpus(train_corpus).perplexities(self.batches)

    def metrics(self, model: nn.Module) -> dict[str, float]:
        return {**lm_metrics(model, self.batches, self._device(model), self.opts.precision), **self.baselines}

    def examples(self, model: nn.Module, held_corpus) -> dict[str, list]:
        if self.model_config.stack != DECODER:  # --recipe ltr on an encoder: nothing to sample from
            return {"fill_mask": []}
        return {"fill_mask": [], "samples": samples(model, self.tok, held_corpus, self.opts.fill_mask_examples,
                                                    seed=self.opts.seed)}


class DenoisingKind(PretrainKind):
    def data(self, corpus) -> tuple[Any, Callable]:
        return s2s.data(corpus, self.opts.recipe, self.tok, self.opts.seq_len, self.opts.seed)

    def heldout(self, held_corpus, train_corpus) -> None:
        o = self.opts
        self.batches = s2s.heldout_batches(held_corpus, o.recipe, self.tok, o.seq_len, o.batch_size, o.eval_batches)
        self.baselines = s2s.unigram_baseline(train_corpus, self.batches)

    def metrics(self, model: nn.Module) -> dict[str, float]:
        return {**s2s.metrics(model, self.batches, self._device(model), self.opts.precision), **self.baselines}

    def examples(self, model: nn.Module, held_corpus) -> dict[str, list]:
        return {"fill_mask": [], "denoising": s2s.denoise_examples(model, self.tok, self.batches,
                                                                   self.opts.fill_mask_examples)}


def kind_for(opts: PretrainOptions, model: nn.Module, tok: Any) -> PretrainKind:
    """The kind of `model` under `opts.recipe`."""
    if s2s.is_seq2seq(opts.recipe):
        return DenoisingKind(opts, model, tok)
    if model.config.stack == DECODER or opts.recipe.objective in LEFT_TO_RIGHT:
        return LeftToRightKind(opts, model, tok)
    return MaskedKind(opts, model, tok)
