"""The `config.json` schemas of the families that do not use BERT's field names <-> `ModelConfig` fields:
ModernBERT (`ModernBertConfig`), XLNet (`XLNetConfig`) and GPT-2 (`GPT2Config`). `config.ModelConfig.to_hf_dict` /
`from_hf_dict` call these for those model types; the functions that build a config take the class as `cls`
(this module does not import `config`, which imports it).

ModernBERT names its settings differently from BERT (`hidden_activation`, `norm_eps`, `classifier_bias`, ...) and
describes attention per layer (`layer_types`) and rotary bases per layer type (`rope_parameters`); this module is
the one translation, both ways.
"""
from __future__ import annotations

from typing import Any

from bertforge.errors import BertforgeError

FULL, SLIDING = "full_attention", "sliding_attention"  # layer types, as Hugging Face names them
TOKEN_IDS = ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")


def layer_types(num_layers: int, every: int, window: int | None) -> list[str]:
    """Per layer FULL or SLIDING: with a window, layer i is global when i % every == 0 (ModernBERT: 0, 3, 6, ...)."""
    return [FULL if window is None or i % every == 0 else SLIDING for i in range(num_layers)]


def modernbert_hf_dict(cfg: Any, common: dict[str, Any]) -> dict[str, Any]:
    """`cfg` (a ModelConfig) in ModernBertConfig's schema. Both rotary spellings are written: `rope_parameters`
    (transformers 5) and `global_rope_theta` / `local_rope_theta` / `global_attn_every_n_layers` (4.48+)."""
    rope = {FULL: {"rope_type": "default", "rope_theta": cfg.rope_theta},
            SLIDING: {"rope_type": "default", "rope_theta": cfg.local_rope_theta}}
    return dict(
        model_type="modernbert", hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, intermediate_size=cfg.intermediate_size,
        hidden_activation=cfg.hidden_act, classifier_activation=cfg.hidden_act, norm_eps=cfg.layer_norm_eps,
        norm_bias=cfg.norm_bias, attention_bias=cfg.attention_bias, mlp_bias=cfg.mlp_bias,
        classifier_bias=cfg.head_bias, decoder_bias=cfg.decoder_bias,
        embedding_dropout=cfg.hidden_dropout_prob, mlp_dropout=cfg.hidden_dropout_prob,
        attention_dropout=cfg.attention_probs_dropout_prob,
        local_attention=cfg.local_attention or 128,  # unused when every layer is global
        global_attn_every_n_layers=cfg.global_attn_every_n_layers, layer_types=cfg.layer_types,
        rope_parameters=rope, global_rope_theta=cfg.rope_theta, local_rope_theta=cfg.local_rope_theta,
        initializer_cutoff_factor=cfg.initializer_cutoff_factor,
        # special-token ids come from the tokenizer (kept in `extra` when a file is read); None rather than
        # transformers' defaults (50281...), which point past a small vocabulary
        **{k: cfg.extra.get(k) for k in TOKEN_IDS}, **common)


def modernbert_settings(d: dict[str, Any], source: str) -> dict[str, Any]:
    """ModelConfig keyword arguments from a ModernBERT config.json dict `d` (missing keys: transformers' defaults).
    Raises KeyError for a missing required field (the caller names it) and BertforgeError for what bertforge's
    encoder cannot express."""
    if d.get("hidden_activation", "gelu") != d.get("classifier_activation", "gelu"):
        raise BertforgeError(f"{source}: classifier_activation {d.get('classifier_activation')!r} differs from "
                             f"hidden_activation {d.get('hidden_activation')!r} (bertforge uses one activation)")
    layers = d["num_hidden_layers"]
    every, window = d.get("global_attn_every_n_layers", 3), d.get("local_attention", 128)
    types = d.get("layer_types")
    if types and all(t == FULL for t in types):
        every, window = 1, None
    if types is not None and list(types) != layer_types(layers, every, window):
        raise BertforgeError(f"{source}: layer_types {types} is not 'global every N layers' "
                             f"(global_attn_every_n_layers={every}); bertforge reads only that pattern")
    rope = d.get("rope_parameters") or {}
    return dict(
        model_type="modernbert", vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], num_hidden_layers=layers,
        num_attention_heads=d["num_attention_heads"], intermediate_size=d["intermediate_size"],
        hidden_act=d.get("hidden_activation", "gelu"), hidden_dropout_prob=d.get("mlp_dropout", 0.0),
        attention_probs_dropout_prob=d.get("attention_dropout", 0.0),
        max_position_embeddings=d.get("max_position_embeddings", 8192), type_vocab_size=0,
        initializer_range=d.get("initializer_range", 0.02), layer_norm_eps=d.get("norm_eps", 1e-5),
        pad_token_id=d.get("pad_token_id") or 0, use_pooler=False, norm_position="pre",
        position_embedding_type="rotary", gated_mlp=True, attention_bias=d.get("attention_bias", False),
        mlp_bias=d.get("mlp_bias", False), norm_bias=d.get("norm_bias", False),
        head_bias=d.get("classifier_bias", False), decoder_bias=d.get("decoder_bias", True),
        local_attention=window, global_attn_every_n_layers=every,
        rope_theta=rope.get(FULL, {}).get("rope_theta", d.get("global_rope_theta", 160000.0)),
        local_rope_theta=rope.get(SLIDING, {}).get("rope_theta", d.get("local_rope_theta", 10000.0)),
        initializer_cutoff_factor=d.get("initializer_cutoff_factor", 2.0))


# ---- XLNet ----------------------------------------------------------------------------------------------------
def xlnet_hf_dict(cfg: Any) -> dict[str, Any]:
    """transformers' XLNetConfig schema (no max_position_embeddings: XLNetConfig's setter raises)."""
    return dict(
        model_type="xlnet", vocab_size=cfg.vocab_size, d_model=cfg.hidden_size,
        n_layer=cfg.num_hidden_layers, n_head=cfg.num_attention_heads, d_head=cfg.head_dim,
        d_inner=cfg.intermediate_size, ff_activation=cfg.hidden_act, dropout=cfg.hidden_dropout_prob,
        layer_norm_eps=cfg.layer_norm_eps, initializer_range=cfg.initializer_range,
        pad_token_id=cfg.pad_token_id, attn_type="bi", bi_data=False, clamp_len=cfg.clamp_len,
        mem_len=cfg.mem_len, reuse_len=None, same_length=False, untie_r=True)


def xlnet_from_hf_dict(cls: Any, d: dict[str, Any], source: str, extra: dict[str, Any]) -> Any:
    """XLNetConfig -> ModelConfig; the settings bertforge's XLNet does not implement are refused by name."""
    unsupported = {"attn_type": (d.get("attn_type", "bi"), "bi"), "bi_data": (bool(d.get("bi_data")), False)}
    for name, (got, ours) in unsupported.items():
        if got != ours:
            raise BertforgeError(f"{source}: XLNet with {name}={got!r} is not supported (bertforge runs "
                                 f"{name}={ours!r})")
    n_head = d["n_head"]
    if d.get("d_head") not in (None, d["d_model"] // n_head):
        raise BertforgeError(f"{source}: d_head {d['d_head']} is not d_model // n_head")
    return cls(model_type="xlnet", vocab_size=d["vocab_size"], hidden_size=d["d_model"],
               num_hidden_layers=d["n_layer"], num_attention_heads=n_head, intermediate_size=d["d_inner"],
               hidden_act=d.get("ff_activation", "gelu"), hidden_dropout_prob=d.get("dropout", 0.1),
               attention_probs_dropout_prob=d.get("dropout", 0.1), type_vocab_size=2,
               initializer_range=d.get("initializer_range", 0.02), layer_norm_eps=d.get("layer_norm_eps", 1e-12),
               pad_token_id=d.get("pad_token_id") or 0, use_pooler=False,
               clamp_len=-1 if d.get("clamp_len") is None else d["clamp_len"],
               mem_len=d.get("mem_len"), extra=extra)


# ---- GPT-2 ----------------------------------------------------------------------------------------------------
def gpt2_hf_dict(cfg: Any) -> dict[str, Any]:
    """transformers' GPT2Config schema. GPT-2 has one residual dropout (resid_pdrop, also used after the
    embeddings: embd_pdrop) and one attention dropout (attn_pdrop)."""
    return dict(model_type="gpt2", vocab_size=cfg.vocab_size, n_positions=cfg.max_position_embeddings,
                n_embd=cfg.hidden_size, n_layer=cfg.num_hidden_layers, n_head=cfg.num_attention_heads,
                n_inner=cfg.intermediate_size, activation_function=cfg.hidden_act,
                resid_pdrop=cfg.hidden_dropout_prob, embd_pdrop=cfg.hidden_dropout_prob,
                attn_pdrop=cfg.attention_probs_dropout_prob, layer_norm_epsilon=cfg.layer_norm_eps,
                initializer_range=cfg.initializer_range, bos_token_id=cfg.bos_token_id,
                eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id, scale_attn_weights=True,
                scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False, tie_word_embeddings=True)


def gpt2_from_hf_dict(cls: Any, d: dict[str, Any], source: str, extra: dict[str, Any]) -> Any:
    # Variants of GPT-2's attention that bertforge's decoder does not compute: refused, not silently ignored.
    for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                    ("add_cross_attention", False), ("tie_word_embeddings", True)):
        if key in d and bool(d[key]) != ok:
            raise BertforgeError(f"{source}: GPT-2 with {key}={d[key]} is not supported")
    eos = d.get("eos_token_id", 50256)
    pad = d.get("pad_token_id")
    return cls(model_type="gpt2", vocab_size=d["vocab_size"], hidden_size=d["n_embd"],
               num_hidden_layers=d["n_layer"], num_attention_heads=d["n_head"],
               intermediate_size=d.get("n_inner") or 4 * d["n_embd"],
               hidden_act=d.get("activation_function", "gelu_new"), hidden_dropout_prob=d.get("resid_pdrop", 0.1),
               attention_probs_dropout_prob=d.get("attn_pdrop", 0.1),
               max_position_embeddings=d.get("n_positions", 1024), type_vocab_size=0,
               initializer_range=d.get("initializer_range", 0.02),
               layer_norm_eps=d.get("layer_norm_epsilon", 1e-5),
               pad_token_id=pad if pad is not None else (eos if eos is not None else 0), use_pooler=False,
               bos_token_id=d.get("bos_token_id", 50256), eos_token_id=eos, extra=extra)
