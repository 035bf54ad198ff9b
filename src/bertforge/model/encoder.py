"""The one Transformer encoder behind BERT, RoBERTa, ALBERT, DistilBERT and ELECTRA.

Module names follow Hugging Face's `modeling_bert.py` (embeddings.word_embeddings,
encoder.layer.N.attention.self.query, ...) so a BERT checkpoint maps one-to-one; the other families' names are
translated in `bertforge.model.checkpoint`. Post-LN blocks (BERT): x = LN(x + Attn(x)); x = LN(x + FFN(x)). Pre-LN
blocks (ModernBERT, `norm_position="pre"`): x = x + Attn(attn_norm(x)); x = x + FFN(mlp_norm(x)), and a final norm.
The modern switches (rotary positions, GeGLU, no biases, sliding-window layers) are fields of `ModelConfig`; the
layers below read them, so every family runs the same code.
Longformer and BigBird (`Family.sparse_attention`) are the same encoder too: `model.sparse.prepare` turns a batch
into a `SparseLayout` that the layers get in place of the mask, and their self-attention is `long_attention` /
`block_sparse` (chosen per layer in `EncoderAttention`).

There is one forward pass. Its variants are chosen when a model is built, as transformers chooses attention
classes: `attn_implementation` "sdpa" (torch's fused kernel) or "eager" (probabilities materialised; forced when
attentions are requested), and `for_inference`, an eval-only copy whose layers use `FusedSelfAttention` (Q/K/V
pre-fused into one Linear) in fp32, bf16 or int8.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.model.checkpoint import load_pretrained, save_pretrained
from bertforge.config import ModelConfig
from bertforge.device import PRECISIONS, placement
from bertforge.families import DECODER, ENCODER
from bertforge.families.modernbert import SLIDING
from bertforge.errors import BertforgeError
from bertforge.model.folder import ModelFolder
from bertforge.model.attention import (FusedSelfAttention, MultiHeadAttention, SelfAttention, rotary_cos_sin,
                                       sliding_window_mask)
from bertforge.model.dropout import Dropout
from bertforge.model.int8 import INT8_SCHEME, load_int8, quantize_linears
from bertforge.model.relative_position import RelativePositionEmbeddings, relative_self_attention
from bertforge.model.sparse.longformer import sparse_self_attention
from bertforge.model.sparse.layout import prepare as prepare_sparse



def activation(name: str):
    """BERT's 'gelu' is the exact erf form; ALBERT's 'gelu_new' is the tanh approximation."""
    name = name.lower()
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    raise BertforgeError(f"unsupported hidden_act {name!r}")


def layer_norm(cfg: ModelConfig, width: int | None = None) -> nn.LayerNorm:
    return nn.LayerNorm(width or cfg.hidden_size, eps=cfg.layer_norm_eps, bias=cfg.norm_bias)


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor                      # [B, T, H]
    pooler_output: torch.Tensor | None = None            # [B, H]
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L+1 x [B, T, H], embeddings first
    attentions: tuple[torch.Tensor, ...] | None = None     # L x [B, heads, T, T]


class Embeddings(nn.Module):
    """Word + learned absolute position (+ token type) embeddings, then LayerNorm and dropout (size E). With rotary
    positions there is no position table: positions enter each attention layer instead."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        e = cfg.embedding_size
        self.word_embeddings = nn.Embedding(cfg.vocab_size, e, padding_idx=cfg.pad_token_id)
        self.position_embeddings = (nn.Embedding(cfg.max_position_embeddings, e)
                                    if cfg.position_embedding_type == "absolute" else None)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, e) if cfg.type_vocab_size > 0 else None
        self.LayerNorm = layer_norm(cfg, e)
        self.dropout = Dropout(cfg.hidden_dropout_prob)
        self.position_offset = cfg.position_offset
        self.pad_token_id = cfg.pad_token_id

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(self.position_ids(input_ids, position_ids))
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))

    def position_ids(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        if position_ids is None:
            if self.position_offset:  # RoBERTa: real tokens count from padding_idx + 1, padding sits at padding_idx
                not_pad = input_ids.ne(self.pad_token_id).long()
                position_ids = torch.cumsum(not_pad, dim=1) * not_pad + self.pad_token_id
            else:
                position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        return position_ids


class AddNorm(nn.Module):
    """dense -> dropout -> residual add -> LayerNorm (HF's BertSelfOutput / BertOutput); pre-norm blocks normalise
    their input instead (`EncoderLayer`), so here they stop at the residual add."""

    def __init__(self, d_in: int, cfg: ModelConfig, bias: bool = True):
        super().__init__()
        self.dense = nn.Linear(d_in, cfg.hidden_size, bias=bias)
        self.LayerNorm = layer_norm(cfg) if cfg.norm_position == "post" else None
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.dense(x)) + residual
        return x if self.LayerNorm is None else self.LayerNorm(x)


class EncoderAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa", n_heads: int | None = None,
                 index: int = 0):
        super().__init__()
        # Longformer / BigBird layers (`index`: the layer, for per-layer windows), DeBERTa's disentangled relative
        # attention, or the ordinary attention
        self.self: MultiHeadAttention = (sparse_self_attention(cfg, attn_implementation, n_heads, index)
                                         or relative_self_attention(cfg, attn_implementation, n_heads)
                                         or SelfAttention(cfg, attn_implementation, n_heads))
        self.output = AddNorm(self.self.n_heads * cfg.head_dim, cfg, cfg.attention_bias)

    def forward(self, x, mask, eager=False, head_mask=None, rotary=None, residual=None, relative=None):
        """`residual`: what the output is added to when `x` is a normalised copy of it (pre-norm blocks);
        `relative`: the encoder's `RelativePositions` (disentangled attention only)."""
        positions = {"rotary": rotary} if relative is None else {"relative": relative}
        ctx, probs = self.self(x, mask, eager, head_mask, **positions)
        return self.output(ctx, x if residual is None else residual), probs

    def prune_heads(self, heads: list[int]) -> None:
        """Remove `heads` physically (HF's `prune_heads`): fewer rows in query/key/value, fewer output columns."""
        attn = self.self
        if not isinstance(attn, SelfAttention):
            raise BertforgeError("prune heads on the trainable encoder, not on an inference copy")
        d = attn.head_dim
        keep = [h for h in range(attn.n_heads) if h not in set(heads)]
        if not keep:
            raise BertforgeError("cannot prune every head of a layer (keep at least one)")
        idx = torch.cat([torch.arange(h * d, (h + 1) * d) for h in keep])
        with torch.no_grad():
            for name in ("query", "key", "value", "query_global", "key_global", "value_global", "pos_key_proj",
                         "pos_query_proj"):
                if not hasattr(attn, name):  # the global projections: Longformer; the position ones: DeBERTa
                    continue
                old = getattr(attn, name)
                new = nn.Linear(old.in_features, len(idx), bias=old.bias is not None).to(old.weight)
                new.weight.copy_(old.weight[idx])
                if old.bias is not None:
                    new.bias.copy_(old.bias[idx])
                setattr(attn, name, new)
            old = self.output.dense
            new = nn.Linear(len(idx), old.out_features, bias=old.bias is not None).to(old.weight)
            new.weight.copy_(old.weight[:, idx])
            if old.bias is not None:
                new.bias.copy_(old.bias)
            self.output.dense = new
        attn.n_heads = len(keep)


class EncoderFeedForward(nn.Module):
    """act(x W) (BERT), or GeGLU act(x W_a) * (x W_g) with `dense` holding [W_a; W_g] (one matmul; ModernBERT's
    `Wi`, whose first half is activated and second half gates)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        width = 2 * cfg.intermediate_size if cfg.gated_mlp else cfg.intermediate_size
        self.dense = nn.Linear(cfg.hidden_size, width, bias=cfg.mlp_bias)
        self.act = activation(cfg.hidden_act)
        self.gated = cfg.gated_mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            a, gate = self.dense(x).chunk(2, dim=-1)
            return self.act(a) * gate
        return self.act(self.dense(x))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa", n_heads: int | None = None,
                 index: int = 0):
        super().__init__()
        self.attention = EncoderAttention(cfg, attn_implementation, n_heads, index)
        self.intermediate = EncoderFeedForward(cfg)
        self.output = AddNorm(cfg.intermediate_size, cfg, cfg.mlp_bias)
        # Pre-norm: a norm before each sub-block. Layer 0's input is already the embedding norm's output, so it
        # gets no second one (ModernBERT's Identity attn_norm).
        pre = cfg.norm_position == "pre"
        self.attn_norm = layer_norm(cfg) if pre and index > 0 else None
        self.mlp_norm = layer_norm(cfg) if pre else None

    def forward(self, x, mask, eager=False, head_mask=None, rotary=None, relative=None):
        h = x if self.attn_norm is None else self.attn_norm(x)
        x, probs = self.attention(h, mask, eager, head_mask, rotary, residual=x, relative=relative)
        h = x if self.mlp_norm is None else self.mlp_norm(x)
        return self.output(self.intermediate(h), x), probs


class LayerStack(nn.Module):
    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        heads = cfg.heads_per_layer or [cfg.num_attention_heads] * cfg.num_hidden_layers  # pruned: fewer
        layers = [EncoderLayer(cfg, attn_implementation, n, i) for i, n in enumerate(heads)]
        # Cross-layer sharing (ALBERT) ties modules by identity: state_dict() still lists every layer, which keeps
        # the Hugging Face layout, while named_parameters() (and so the optimiser) sees each tensor once.
        for layer in layers[1:]:
            if cfg.share_layers in ("all", "attention"):
                layer.attention = layers[0].attention
            if cfg.share_layers in ("all", "ffn"):
                layer.intermediate, layer.output = layers[0].intermediate, layers[0].output
        self.layer = nn.ModuleList(layers)
        # the relative-position table every layer's disentangled attention reads (DeBERTa), or None
        self.relative = (RelativePositionEmbeddings(cfg) if cfg.position_embedding_type == "disentangled"
                         else None)


class Pooler(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        act = cfg.family.pooler_act  # tanh (BERT); GELU (DeBERTa's ContextPooler)
        self.act = torch.tanh if act == "tanh" else activation(act)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None,
                causal: bool = False) -> torch.Tensor:
        """act(W h + b) of the first token ([CLS]); a left-to-right encoder's first token has seen nothing, so
        there it is the last real token's (GPT's classification token comes last for the same reason)."""
        if not causal:
            return self.act(self.dense(hidden[:, 0]))
        last = (attention_mask.sum(1) - 1 if attention_mask is not None and attention_mask.dim() == 2
                else torch.full(hidden.shape[:1], hidden.shape[1] - 1, device=hidden.device))
        return self.act(self.dense(hidden[torch.arange(hidden.shape[0], device=hidden.device), last.long()]))


def _normal(w: torch.Tensor, std: float, cutoff: float | None) -> None:
    if cutoff is None:
        nn.init.normal_(w, 0.0, std)
    else:
        nn.init.trunc_normal_(w, 0.0, std, -cutoff * std, cutoff * std)


def init_weights(module: nn.Module, std: float, cutoff: float | None = None) -> None:
    """BERT's (and GPT-2's) initialisation: N(0, std) matrices and embeddings (truncated at +-cutoff std when set:
    ModernBERT), zero biases, unit LayerNorms."""
    if isinstance(module, nn.Linear):
        _normal(module.weight, std, cutoff)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        _normal(module.weight, std, cutoff)
        if module.padding_idx is not None:
            module.weight.data[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


class Encoder(nn.Module):
    """Embeddings -> [projection to H] -> L layers -> [pooler]. `attn_implementation`: "sdpa" or "eager"."""

    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa"):
        if cfg.stack == DECODER:
            raise BertforgeError(f"model_type {cfg.model_type} is a decoder (GPT-2 layout), not an encoder: load it "
                                 "with bertforge.model.DecoderLM, or use `bertforge generate`")
        super().__init__()
        if cfg.family.streams == 2:
            raise BertforgeError(f"a {cfg.model_type} model is built by bertforge.model.XLNetEncoder (two-stream "
                                 "relative attention), not by the BERT encoder: bertforge pretrains XLNet and "
                                 "exchanges it with transformers, but does not fine-tune, embed or fill-mask with it")
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        # Factorised embeddings (ALBERT, ELECTRA): a small E projected up to H.
        self.embeddings_project = (nn.Linear(cfg.embedding_size, cfg.hidden_size)
                                   if cfg.embedding_size != cfg.hidden_size else None)
        self.encoder = LayerStack(cfg, attn_implementation)
        self.final_norm = layer_norm(cfg) if cfg.norm_position == "pre" else None  # pre-norm: the stream's norm
        self.pooler = Pooler(cfg) if cfg.use_pooler else None
        self.head_mask: torch.Tensor | list[torch.Tensor] | None = None  # see forward
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """init_weights with the config's std and cutoff. In pre-norm stacks the projections that write into the
        residual stream start smaller, std / sqrt(2L) (GPT-2, ModernBERT's "out" init): 2L of them add up along the
        stream, which no norm rescales."""
        cfg = self.config
        init_weights(module, cfg.initializer_range, cfg.initializer_cutoff_factor)
        if isinstance(module, AddNorm) and cfg.norm_position == "pre":  # children are initialised first
            _normal(module.dense.weight, cfg.initializer_range / (2 * cfg.num_hidden_layers) ** 0.5,
                    cfg.initializer_cutoff_factor)

    def dense_mask(self, attention_mask: torch.Tensor | None, length: int,
                   device: torch.device) -> torch.Tensor | None:
        """The one mask rule: bool [B, 1, 1, T], True where a key may be attended to; None when nothing is padded
        (SDPA then takes its unmasked, fastest kernel, which length-sorted inference batches mostly hit). A
        [B, T, T] mask (query x key, e.g. `segment_mask` for packed rows) is used as given. Causal models add
        "no query sees a later key" ([B, 1, T, T] with padding)."""
        mask = None
        if attention_mask is not None and attention_mask.dim() == 3:
            mask = attention_mask[:, None].bool()
        elif attention_mask is not None:
            # Dropping an all-ones mask (SDPA's unmasked kernel) means reading it: free on the CPU, which runs in
            # step with the host, but a host sync on a GPU, so a GPU keeps it while training. Compiled: no
            # data-dependent branch to split the graph.
            keep = torch.compiler.is_compiling() or (self.training and attention_mask.device.type != "cpu")
            if keep or not bool(attention_mask.all()):
                mask = attention_mask[:, None, None, :].bool()
        if self.config.causal:
            earlier = torch.ones(length, length, dtype=torch.bool, device=device).tril()
            mask = earlier[None, None] if mask is None else mask & earlier
        return mask

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                head_mask: torch.Tensor | list[torch.Tensor] | None = None,
                global_attention_mask: torch.Tensor | None = None) -> EncoderOutput:
        """`head_mask`: per layer, one weight per head ([L, heads], or a list when pruned layers differ); when
        None, `self.head_mask` is used, which lets analysis mask the encoder inside any task model.
        `global_attention_mask` [B, T] (1 = global): Longformer's global tokens. Sparse families (Longformer,
        BigBird) pass a `sparse.SparseLayout` to their layers instead of the mask (no attention maps then)."""
        head_mask = self.head_mask if head_mask is None else head_mask
        layout = None
        if self.config.family.sparse_attention:
            input_ids, token_type_ids, position_ids, layout = prepare_sparse(
                self.config, input_ids, attention_mask, token_type_ids, position_ids, global_attention_mask)
            if layout is not None and output_attentions:
                raise BertforgeError(f"a {self.config.model_type} model's sparse attention has no [T, T] attention "
                                     "maps (output_attentions); analyse a full-attention model")
        elif global_attention_mask is not None:
            raise BertforgeError(f"global_attention_mask is a Longformer input; a {self.config.model_type} model "
                                 "attends to every token already")
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        cfg, length = self.config, input_ids.shape[1]
        # a sparse layout replaces the mask (Longformer / BigBird layers read their own plan; no dense mask is built)
        mask = layout if layout is not None else self.dense_mask(attention_mask, length, input_ids.device)
        types = cfg.layer_types
        local = (sliding_window_mask(mask, length, cfg.local_attention // 2, input_ids.device)
                 if SLIDING in types else None)
        rotary = local_rotary = None
        if cfg.position_embedding_type == "rotary":  # one table per base, shared by the layers that use it
            pos = position_ids if position_ids is not None else torch.arange(length, device=input_ids.device)
            rotary = rotary_cos_sin(pos, cfg.head_dim, cfg.rope_theta)
            local_rotary = rotary_cos_sin(pos, cfg.head_dim, cfg.local_rope_theta) if SLIDING in types else None
        relative = self.encoder.relative(x) if self.encoder.relative is not None else None  # one table, all layers
        hidden, attentions = [x], []
        for i, layer in enumerate(self.encoder.layer):
            is_local = types[i] == SLIDING
            x, probs = layer(x, local if is_local else mask, output_attentions,
                             None if head_mask is None else head_mask[i], local_rotary if is_local else rotary,
                             relative)
            hidden.append(x)
            attentions.append(probs)
        if self.final_norm is not None:  # the last hidden state is the normalised one (as in transformers)
            x = hidden[-1] = self.final_norm(x)
        pooled = self.pooler(x, attention_mask, cfg.causal) if self.pooler is not None else None
        if layout is not None and layout.pad_len:  # BigBird's block padding (the pooler read token 0 already)
            x, hidden = layout.unpad(x), [layout.unpad(t) for t in hidden]
        return EncoderOutput(x, pooled, tuple(hidden) if output_hidden_states else None,
                             tuple(attentions) if output_attentions else None)

    def prune_heads(self, heads: dict[int, list[int]]) -> None:
        """Physically remove heads ({layer: [head indices in that layer now]}); config.heads_per_layer records the
        new counts, so a saved model rebuilds the smaller layers. (transformers v5 cannot load pruned heads.)"""
        if self.config.share_layers in ("all", "attention"):
            raise BertforgeError("cannot prune heads of an encoder whose layers share attention (ALBERT)")
        for i, hs in heads.items():
            if hs:
                self.encoder.layer[i].attention.prune_heads(sorted(set(hs)))
        counts = [layer.attention.self.n_heads for layer in self.encoder.layer]
        full = counts == [self.config.num_attention_heads] * self.config.num_hidden_layers
        self.config = self.config.replace(heads_per_layer=None if full else counts)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def is_inference_copy(self) -> bool:
        return any(isinstance(m, FusedSelfAttention) for m in self.modules())

    @classmethod
    def from_pretrained(cls, path: "str | Path | ModelFolder", attn_implementation: str = "sdpa",
                        revision: str | None = None) -> "Encoder":
        """The encoder saved in `path` (or an opened model folder); a folder written by `bertforge quantize` loads
        as its int8 inference copy."""
        folder = ModelFolder.open(path, revision=revision)
        model, _ = load_weights(cls(folder.config_for(ENCODER, verb="an encoder"), attn_implementation), folder)
        return model.eval()

    def save_pretrained(self, path: str | Path, tokenizer=None) -> None:
        if self.is_inference_copy:  # its fused `qkv` has no Hugging Face name
            raise BertforgeError("an inference copy (fused Q/K/V) cannot be saved; save the encoder it came from")
        save_pretrained(self, path, self.config, tokenizer=tokenizer)


def is_quantised(path: str | Path) -> bool:
    """Whether the model folder `path` was written by `bertforge quantize` (its config.json says so)."""
    return ModelFolder.open(path).quantised


def load_weights(model: nn.Module, folder: ModelFolder, require: Iterable[str] = ()) -> tuple[nn.Module, list[str]]:
    """`model` (an Encoder, or a model holding one as `.bert`) with `folder`'s weights as they are stored: int8
    weights (`bertforge quantize`) into the encoder's int8 inference copy, else the checkpoint's tensors (a folder
    quantised by an older bertforge holds fp32 weights: its int8 copy is made here). Returns (the model, with its
    encoder replaced by the int8 copy for a quantised folder; the canonical names the file did not have)."""
    def quantised(m: nn.Module, scheme: int) -> nn.Module:
        if isinstance(m, Encoder):
            return for_inference(m, "int8", scheme)
        m.bert = for_inference(m.bert, "int8", scheme)
        return m

    if folder.int8_weights:
        model = quantised(model, folder.int8_scheme)
        load_int8(model, folder.path)
        return model, []
    missing = load_pretrained(model, folder.path, require)
    return (quantised(model, folder.int8_scheme) if folder.quantised else model), missing


def for_inference(encoder: Encoder, precision: str = "fp32", int8_scheme: int = INT8_SCHEME) -> Encoder:
    """An eval-mode copy of `encoder` with Q/K/V fused per layer, in its own dtype ("fp32"), bf16, fp16 or int8
    (`int8_scheme`: the recipe, `model.int8.INT8_SCHEME`; a saved folder's own). It runs the same `Encoder.forward`;
    it shares no tensors with `encoder`, so rebuild it after the weights change."""
    if precision not in PRECISIONS:
        raise BertforgeError(f"unknown precision {precision!r} (expected {', '.join(PRECISIONS)})")
    fast = copy.deepcopy(encoder)
    for layer in fast.encoder.layer:
        if type(layer.attention.self) is SelfAttention:  # a shared (ALBERT) one is fused once; sparse ones stay
            layer.attention.self = FusedSelfAttention(layer.attention.self)
    fast.eval().requires_grad_(False)  # after the swap: new modules start in training mode (dropout on)
    if placement(fast) != placement(encoder):  # what the swap built must sit where the source's weights are
        raise BertforgeError(f"internal error: the inference copy holds {sorted(map(str, placement(fast)))}, its "
                             f"source {sorted(map(str, placement(encoder)))}")
    if precision in ("bf16", "fp16"):
        return fast.to(torch.bfloat16 if precision == "bf16" else torch.float16)
    if precision == "int8":
        # Dynamic quantisation: int8 weights (per output channel), activations quantised per batch on the fly, no
        # calibration data (`model.int8.quantize_linears`: the recipe and why). Scheme 1 kept the FFN output
        # projection fp32: its input (GELU of the up-projection) has outlier features that a 7-bit per-tensor
        # activation scale crushes; scheme 2's 8-bit activations quantise it too.
        keep_fp32 = {id(layer.output.dense) for layer in fast.encoder.layer} if int8_scheme == 1 else set()
        quantize_linears(fast, keep_fp32, int8_scheme)
    return fast
