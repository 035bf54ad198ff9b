"""The encoder-decoder: T5 (Raffel et al. 2020) and BART (Lewis et al. 2020) as one model, `Seq2SeqLM`.

    src = shared(input_ids) [* sqrt(d)]  (+ positions, LayerNorm: BART)
    for each encoder layer:  src = sub(src, self-attention)   sub(src, FFN)          bidirectional
    tgt = shared(decoder_input_ids) ...                                                 decoder_input_ids = labels
    for each decoder layer:  tgt = sub(tgt, causal self-attention)  sub(tgt, cross-attention over src)  sub(FFN)
    logits = tgt @ shared^T  (* d_model**-0.5 first: T5; + final_logits_bias: BART)      shifted right (HF's rule)

`sub` is the residual around a sub-block, normalised before (T5, with a final norm per stack) or after (BART);
T5 adds a bucketed relative position bias to the scores (computed once per stack, shared by its layers), BART
learned absolute positions. Which one is a `Seq2SeqConfig` (`config.seq2seq`), not a class.

Inside, both families share one module tree (`shared`, `encoder.layers.N.self_attn.q`, `.ffn.wi`, ...); the
checkpoint engine (`model.checkpoint`, over each family's rules) maps each name to transformers'
T5ForConditionalGeneration / BartForConditionalGeneration name, so a directory saved here loads there unchanged,
and back. Generation (`bertforge.generation`) drives the model through
`prefill` (the encoder once, the decoder on its start token) and `step` (one token against a `Seq2SeqCache`).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.model.checkpoint import load_pretrained, read_state_dict, save_pretrained
from bertforge.config.seq2seq import Seq2SeqConfig
from bertforge.errors import BertforgeError
from bertforge.families import ENCODER_DECODER
from bertforge.model.cache import KVCache, Seq2SeqCache
from bertforge.model.dropout import Dropout
from bertforge.model.folder import ModelFolder
from bertforge.model.seq2seq.layers import INITS, Seq2SeqLayer, RelativePositionBias, make_norm


def _key_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """[B, S] 1/0 -> bool [B, 1, 1, S] (True = a real token), or None when nothing is padded (the fast path)."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return attention_mask.bool()[:, None, None, :]


class Stack(nn.Module):
    """The encoder (`cross=False`) or the decoder: embeddings in, hidden states out. Token embeddings come from
    the model's one `shared` table; the stack adds positions (a learned table, or T5's relative bias)."""

    def __init__(self, cfg: Seq2SeqConfig, cross: bool, attn_implementation: str = "sdpa"):
        super().__init__()
        side = "decoder" if cross else "encoder"
        n_heads, width = getattr(cfg, f"{side}_attention_heads"), getattr(cfg, f"{side}_ffn_dim")
        fam = cfg.family
        self.cross, self.offset = cross, fam.position_offset
        self.max_positions = cfg.max_position_embeddings
        if fam.relative_positions:
            self.position_bias = RelativePositionBias(cfg, n_heads, bidirectional=not cross)
        else:
            self.embed_positions = nn.Embedding(cfg.max_position_embeddings + fam.position_offset, cfg.d_model)
            self.layernorm_embedding = make_norm(cfg)
        self.layers = nn.ModuleList([Seq2SeqLayer(cfg, n_heads, width, cross, attn_implementation)
                                     for _ in range(getattr(cfg, f"{side}_layers"))])
        if fam.norm_position == "pre":
            self.final_norm = make_norm(cfg)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                cross_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                cross_mask: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        """x [B, T, H] token embeddings; `mask` bool key mask [B, 1, 1, T] or None; a decoder also takes the
        encoder output's keys / values per layer and its mask, and with a `cache` continues after cache.length."""
        T, past = x.shape[1], 0 if cache is None else cache.length
        bias = None
        if hasattr(self, "position_bias"):
            bias = self.position_bias(T, past + T, past)
        else:
            if past + T > self.max_positions:
                raise BertforgeError(f"{past + T} positions exceed the model's {self.max_positions} "
                                     "(max_position_embeddings)")
            positions = torch.arange(past, past + T, device=x.device) + self.offset
            x = self.layernorm_embedding(x + self.embed_positions(positions))
        x = self.dropout(x)
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, bias, None if cross_kv is None else cross_kv[i], cross_mask,
                      None if cache is None else cache.layers[i])
        if cache is not None:
            cache.advance(T)
        if hasattr(self, "final_norm"):
            x = self.dropout(self.final_norm(x))
        return x


class Seq2SeqLM(nn.Module):
    """T5ForConditionalGeneration / BartForConditionalGeneration: `shared` embeddings, encoder, decoder, and the
    output projection tied to `shared`."""

    prompt_padding = "right"  # the prompt is the encoder's input: real tokens first (BART's positions count from 0)

    def __init__(self, cfg: Seq2SeqConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        self.config = cfg
        fam = cfg.family
        self.shared = nn.Embedding(cfg.vocab_size, cfg.d_model,
                                   padding_idx=cfg.pad_token_id if fam.embedding_padding_idx else None)
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        self.encoder = Stack(cfg, cross=False, attn_implementation=attn_implementation)
        self.decoder = Stack(cfg, cross=True, attn_implementation=attn_implementation)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if fam.final_logits_bias:
            self.register_buffer("final_logits_bias", torch.zeros(1, cfg.vocab_size))
        self.apply(lambda m: INITS[fam.init](m, cfg))
        self.lm_head.weight = self.shared.weight  # tied: one matrix (saved once, as `shared`), unless untie_output
        # T5 rescales before the tied projection (Mesh TensorFlow); T5 v1.1's files say not to.
        self.output_scale = cfg.d_model ** -0.5 if fam.rescales_output and cfg.scale_decoder_outputs else 1.0

    # ---- the forward pass --------------------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.shared(ids) * self.embed_scale

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The encoder's output [B, S, H]."""
        return self.encoder(self.embed(input_ids), _key_mask(attention_mask))

    def cross_keys_values(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [layer.cross_attn.keys_values(memory) for layer in self.decoder.layers]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden * self.output_scale if self.output_scale != 1.0 else hidden)
        return logits + self.final_logits_bias if hasattr(self, "final_logits_bias") else logits

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """transformers' rule: decoder inputs = [start] + labels[:-1], the ignored -100 read as padding."""
        shifted = labels.new_full(labels.shape, self.config.decoder_start_token_id)
        shifted[:, 1:] = labels[:, :-1]
        return shifted.masked_fill(shifted == -100, self.config.pad_token_id)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None, decoder_attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, encoder_hidden_states: torch.Tensor | None = None) -> dict:
        """Returns {"logits": [B, T, V], "loss": mean cross-entropy over labels != -100 (when labels are given),
        "encoder_hidden_states": [B, S, H]}. Without decoder_input_ids they are `labels` shifted right."""
        if decoder_input_ids is None:
            if labels is None:
                raise BertforgeError("an encoder-decoder needs decoder_input_ids or labels (shifted right into "
                                     "decoder inputs)")
            decoder_input_ids = self.shift_right(labels)
        memory = self.encode(input_ids, attention_mask) if encoder_hidden_states is None else encoder_hidden_states
        hidden = self.decoder(self.embed(decoder_input_ids), _key_mask(decoder_attention_mask),
                              self.cross_keys_values(memory), _key_mask(attention_mask))
        logits = self.logits(hidden)
        out = {"logits": logits, "encoder_hidden_states": memory}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                          ignore_index=-100)
        return out

    # ---- generation (the protocol `bertforge.generation` drives; docs/generative.md) ----------------------------
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                max_new_tokens: int) -> tuple[torch.Tensor, Seq2SeqCache, torch.Tensor]:
        """Encode the (right-padded) sources once, project every decoder layer's cross-attention keys and values,
        run the decoder on its start token. Returns (next-token logits [B, V], the cache, the start tokens [B, 1]:
        the sequence generation continues)."""
        return self.prefill_encoded(self.encode(input_ids, attention_mask), attention_mask, max_new_tokens)

    def prefill_encoded(self, memory: torch.Tensor, attention_mask: torch.Tensor | None,
                        max_new_tokens: int) -> tuple[torch.Tensor, Seq2SeqCache, torch.Tensor]:
        """`prefill` from the encoder's output [B, S, H] (and its mask [B, S]): what a model that builds the memory
        its own way (Fusion-in-Decoder joins k passages' encodings) decodes from."""
        cfg = self.config
        if hasattr(self.decoder, "embed_positions") and max_new_tokens > cfg.max_position_embeddings:
            raise BertforgeError(f"--max-new-tokens {max_new_tokens} exceeds the decoder's "
                                 f"{cfg.max_position_embeddings} positions (max_position_embeddings)")
        B, w = memory.shape[0], self.shared.weight
        heads = cfg.decoder_attention_heads
        self_kv = KVCache(cfg.decoder_layers, B, heads, cfg.head_dim_for(heads), max_new_tokens + 1,
                          w.dtype, w.device)
        cache = Seq2SeqCache(self_kv, self.cross_keys_values(memory), _key_mask(attention_mask), max_new_tokens)
        start = torch.full((B, 1), cfg.decoder_start_token_id, dtype=torch.long, device=memory.device)
        return self._next(start, cache), cache, start

    def step(self, tokens: torch.Tensor, cache: Seq2SeqCache) -> tuple[torch.Tensor, Seq2SeqCache]:
        """One new decoder token per row ([B]) -> (next-token logits [B, V], the cache one position longer)."""
        return self._next(tokens[:, None], cache), cache

    def _next(self, tokens: torch.Tensor, cache: Seq2SeqCache) -> torch.Tensor:
        hidden = self.decoder(self.embed(tokens), None, cache.cross, cache.cross_mask, cache.self_attn)
        logits = self.logits(hidden[:, -1])
        # BART's generation defaults (transformers' ForcedBOS / ForcedEOS processors): the first token, and the
        # last one max_new_tokens allows, are forced when the config names them.
        generated = cache.length - 1  # tokens generated before the one these logits choose
        forced = self.config.forced_bos_token_id if generated == 0 else None
        if generated == cache.max_new_tokens - 1 and self.config.forced_eos_token_id is not None:
            forced = self.config.forced_eos_token_id
        if forced is not None:
            logits = torch.full_like(logits, float("-inf"))
            logits[:, forced] = 0.0
        return logits

    def max_prompt_tokens(self, max_new_tokens: int) -> int:
        """How long a source may be: the encoder's positions (BART) or T5's n_positions (new tokens do not count:
        they are the decoder's)."""
        return self.config.max_position_embeddings

    def prompt_ids(self, tokenizer, text: str) -> list[int]:
        """A source as the model reads it: the text's tokens and eos (T5: "text </s>"; BART: "<s> text </s>")."""
        ids = tokenizer.encode_ids([text])[0]
        bos = self.config.bos_token_id if self.config.family.prompt_starts_with_bos else None
        return ([] if bos is None else [bos]) + ids + [self.config.eos_token_id]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def tied(self) -> bool:
        return self.lm_head.weight is self.shared.weight

    def untie_output(self) -> None:
        """A separate output matrix (starting as a copy of `shared`): what transformers 5 does when a file holds
        its own `lm_head.weight` (T5 v1.1's checkpoints); it is then saved too."""
        if self.tied:
            self.lm_head.weight = nn.Parameter(self.shared.weight.detach().clone())

    # ---- checkpoints -------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: "str | Path | ModelFolder", attn_implementation: str = "sdpa",
                        revision: str | None = None) -> "Seq2SeqLM":
        folder = ModelFolder.open(path, revision=revision)
        model = cls(folder.config_for(ENCODER_DECODER, verb="an encoder-decoder"), attn_implementation)
        state, source = read_state_dict(folder.path)
        if "lm_head.weight" in state:
            model.untie_output()
        load_pretrained(model, folder.path, tensors=(state, source))
        return model.eval()

    def save_pretrained(self, path: str | Path, tokenizer=None) -> Path:
        """config.json + model.safetensors (+ the tokenizer's files) in transformers' layout."""
        return save_pretrained(self, path, self.config, tokenizer=tokenizer)
