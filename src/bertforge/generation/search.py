"""The decoding loops over any model that speaks the generation protocol (docs/generative.md):

    logits, cache, sequence = model.prefill(input_ids, attention_mask, max_new_tokens)
        # runs what must run once (a decoder: the prompt; an encoder-decoder: the encoder, and the decoder on its
        # start token); logits [B, V] for the next token; `sequence` [B, T0] is what generation continues
    logits, cache = model.step(tokens, cache)        # tokens [B]: one new token per row
    cache = cache.reorder(index)                     # keep / repeat rows (beam search)
    model.config.eos_token_id, model.config.pad_token_id

`TokenSteps` yields one token per row per step (greedy or sampled), which is what streaming prints;
`beam_search` keeps `num_beams` hypotheses per row and scores finished ones as transformers does (sum of log
probabilities / generated length ** length_penalty; its default early-stopping heuristic), so both give the same
sequence on the same weights.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from bertforge.generation.config import GenerationConfig
from bertforge.generation.logits import repetition_penalty, warp

NEG = -1.0e9  # "impossible" for a beam score (transformers' value, so ties break alike)


def _ends(model, cfg: GenerationConfig) -> tuple[int | None, int]:
    """(eos id or None when generation never stops early, the id that fills ended rows: transformers' rule, the
    pad token, else eos)."""
    eos = model.config.eos_token_id if cfg.stop_at_eos else None
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else eos
    return eos, int(pad if pad is not None else 0)


class TokenSteps:
    """Greedy or sampled tokens [B], one step per iteration; `prefix` [B, T0] is the sequence they continue. The
    prompt runs when this is made; a row that has produced eos gets the fill id from then on, and iteration ends
    when every row has ended or after max_new_tokens."""

    def __init__(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 config: GenerationConfig):
        self.model, self.cfg = model, config.resolved()
        with torch.inference_mode():
            self.logits, self.cache, self.prefix = model.prefill(input_ids, attention_mask, self.cfg.max_new_tokens)

    @torch.inference_mode()
    def __iter__(self) -> Iterator[torch.Tensor]:
        cfg, logits, cache = self.cfg, self.logits, self.cache
        eos, pad = _ends(self.model, cfg)
        gen = None
        if cfg.sampling and cfg.seed is not None:
            gen = torch.Generator(device=logits.device).manual_seed(cfg.seed)
        B, T0 = self.prefix.shape
        seen = torch.full((B, T0 + cfg.max_new_tokens), pad, dtype=torch.long, device=logits.device)
        seen[:, :T0] = self.prefix  # what the repetition penalty looks at: the prompt and every token so far
        running = torch.ones(B, dtype=torch.bool, device=logits.device)
        for step in range(cfg.max_new_tokens):
            scores = repetition_penalty(logits.float(), seen[:, :T0 + step], cfg.repetition_penalty)
            if cfg.sampling:
                probs = warp(scores, cfg.temperature, cfg.top_k, cfg.top_p).softmax(-1)
                token = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            else:
                token = scores.argmax(-1)
            token = torch.where(running, token, pad)
            seen[:, T0 + step] = token
            yield token
            if eos is not None:
                running &= token != eos
                if not bool(running.any()):
                    return
            if step + 1 < cfg.max_new_tokens:
                logits, cache = self.model.step(token, cache)


def _gather(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t [B, N, ...] -> [B, M, ...]: per row, the entries `index` [B, M]."""
    return t.gather(1, index.view(*index.shape, *[1] * (t.dim() - 2)).expand(*index.shape, *t.shape[2:]))


def beam_search(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                config: GenerationConfig) -> torch.Tensor:
    """The best finished hypothesis per row: [B, T0 + generated], padded with the fill id."""
    done, length = _beams(model, input_ids, attention_mask, config)
    return done[:, 0, :int(length[:, 0].max())]


def beam_hypotheses(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                    config: GenerationConfig) -> torch.Tensor:
    """Every row's `num_beams` finished hypotheses, best first: [B, num_beams, T0 + generated], padded with the
    fill id (what RAG-Sequence rescores against every passage)."""
    done, length = _beams(model, input_ids, attention_mask, config)
    return done[:, :, :int(length.max())]


@torch.inference_mode()
def _beams(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
           config: GenerationConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(the finished hypotheses [B, num_beams, T0 + max_new_tokens], best first; their lengths [B, num_beams])."""
    cfg = config.resolved()
    eos, pad = _ends(model, cfg)
    K, lp = cfg.num_beams, cfg.length_penalty
    logits, cache, sequence = model.prefill(input_ids, attention_mask, cfg.max_new_tokens)
    B, T0 = sequence.shape
    dev = sequence.device
    max_len = T0 + cfg.max_new_tokens
    # Every row's cache and first logits, repeated for its K beams (the prompt ran once per row).
    rows = torch.arange(B, device=dev).repeat_interleave(K)
    cache = cache.reorder(rows)
    logits = logits[rows]
    running = torch.full((B, K, max_len), pad, dtype=torch.long, device=dev)
    running[:, :, :T0] = sequence[:, None]
    running_scores = torch.zeros(B, K, device=dev)
    running_scores[:, 1:] = NEG  # the K copies are identical: only the first may spawn candidates at step 1
    done = running.clone()
    done_scores = torch.full((B, K), NEG, device=dev)
    done_len = torch.zeros(B, K, dtype=torch.long, device=dev)
    is_done = torch.zeros(B, K, dtype=torch.bool, device=dev)
    improvable = torch.ones(B, dtype=torch.bool, device=dev)
    n_cand = 2 * K  # enough that K candidates survive even if the best K all end here
    first_k = torch.arange(n_cand, device=dev) < K
    for cur in range(T0, max_len):
        logprobs = torch.log_softmax(logits.float(), -1)
        logprobs = repetition_penalty(logprobs, running.view(B * K, max_len)[:, :cur], cfg.repetition_penalty)
        V = logprobs.shape[-1]
        total = (logprobs.view(B, K, V) + running_scores[..., None]).view(B, K * V)
        cand_scores, flat = total.topk(n_cand)                        # [B, 2K]
        beam, token = flat // V, flat % V
        cand = _gather(running, beam)
        cand[:, :, cur] = token
        ends = torch.full_like(token, cur + 1 >= max_len, dtype=torch.bool)
        if eos is not None:
            ends |= token == eos
        # The K best candidates that did not end continue.
        open_scores = cand_scores + ends.float() * NEG
        keep = open_scores.topk(K).indices
        running, running_scores, from_beam = _gather(cand, keep), _gather(open_scores, keep), _gather(beam, keep)
        # Candidates among the first K that ended compete with the finished ones, length-normalised.
        new = ends & first_k
        fin_scores = cand_scores / float(cur + 1 - T0) ** lp
        fin_scores = fin_scores + (~improvable)[:, None].float() * NEG + (~new).float() * NEG
        all_scores = torch.cat([done_scores, fin_scores], 1)
        best = all_scores.topk(K).indices
        done = _gather(torch.cat([done, cand], 1), best)
        done_scores = _gather(all_scores, best)
        done_len = _gather(torch.cat([done_len, torch.full_like(token, cur + 1)], 1), best)
        is_done = _gather(torch.cat([is_done, new], 1), best)
        # Can an open beam still beat the worst finished one? (transformers' heuristic for early_stopping=False)
        best_open = running_scores[:, :1] / float(cur + 1 - T0) ** lp
        worst_done = torch.where(is_done, done_scores.min(1, keepdim=True).values, torch.full_like(done_scores, NEG))
        improvable &= (best_open > worst_done).any(-1)
        if not bool(improvable.any()) or bool(ends.all()):
            break
        cache = cache.reorder((from_beam + torch.arange(B, device=dev)[:, None] * K).view(-1))
        logits, cache = model.step(running[:, :, cur].reshape(-1), cache)
    return done, done_len.clamp(min=T0)


def generate_ids(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 config: GenerationConfig | None = None,
                 on_step: Callable[[torch.Tensor], None] | None = None, **options) -> torch.Tensor:
    """`sequence` + generated ids [B, T0 + n] (decoders: the prompt and its continuation), padded with the fill
    id after a row's eos. `options` override `config` fields (`max_new_tokens=20, greedy=True`, ...); `on_step`
    sees each step's tokens as they come (greedy and sampling)."""
    cfg = (config or GenerationConfig()).replace(**options).resolved()
    if cfg.mode == "beam":
        return beam_search(model, input_ids, attention_mask, cfg)
    steps = TokenSteps(model, input_ids, attention_mask, cfg)
    new = []
    for token in steps:
        new.append(token)
        if on_step is not None:
            on_step(token)
    return torch.cat([steps.prefix, torch.stack(new, 1)], 1)
