"""ModernBERT (Warner et al. 2024; HF's ModernBertConfig defaults): pre-norm, RoPE (theta 160k global, 10k local),
GeGLU, no biases but the decoder's, a 128-token window with global attention every 3rd layer, no dropout, no token
types, no pooler, LN eps 1e-5, truncated-normal init at 2 std, a 50,368-token BPE.

ModernBERT names its settings differently from BERT (`hidden_activation`, `norm_eps`, `classifier_bias`, ...) and
describes attention per layer (`layer_types`) and rotary bases per layer type (`rope_parameters`); this module is
the one translation, both ways. Its checkpoints fuse Q, K and V into one `Wqkv` tensor.
"""
from __future__ import annotations

from typing import Any

from bertforge.errors import BertforgeError
from bertforge.families.family import (GATED_MLP, LAYER, TOKEN_IDS, CheckpointLayout, ConfigSchema, Defaults, Family,
                                       Heads, StackTraits, common_fields)
from bertforge.families.record.schema import (BERT_CHECKS, EPS, MAX_POSITIONS, RATE, SOME_LAYERS, SWITCH, TEXT, THETA,
                                              Field, checks)

FULL, SLIDING = "full_attention", "sliding_attention"  # layer types, as Hugging Face names them
# the ModelConfig switches ModernBertConfig can set per model (every other family's stay at its values)
MODERN_SWITCHES = frozenset({"attention_bias", "mlp_bias", "norm_bias", "head_bias", "decoder_bias",
                             "local_attention"})


def layer_types(num_layers: int, every: int, window: int | None) -> list[str]:
    """Per layer FULL or SLIDING: with a window, layer i is global when i % every == 0 (ModernBERT: 0, 3, 6, ...)."""
    return [FULL if window is None or i % every == 0 else SLIDING for i in range(num_layers)]


def write_config(cfg: Any) -> dict[str, Any]:
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
        **{k: cfg.extra.get(k) for k in TOKEN_IDS}, **common_fields(cfg))


def read_config(fam: Family, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
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
        initializer_cutoff_factor=d.get("initializer_cutoff_factor", 2.0), heads_per_layer=ours.get("heads_per_layer"))


RECIPES = (
    # Warner et al. 2024 (ModernBERT): MLM only, no NSP, 30% masking, dynamic masks, rows packed with contiguous
    # text so no row carries padding (ModernBERT unpads; full-sentences rows are full by construction), BPE, the
    # modernbert family (pre-norm, RoPE, GeGLU, no biases, local/global attention), the warm-up / stable /
    # 1-sqrt-decay schedule. Pre-norm stays stable at rates that make post-LN BERT collapse (see `lr_scale`).
    dict(name="modern", objective="mlm", masking="token", dynamic=True, input_format="full-sentences",
         tokenizer_kind="bpe", mask_prob=0.3, lr_scale=2.0, schedule="wsd"),
)

FAMILY = Family(
    "modernbert", "ModernBert", "model",
    head_classes={"mlm": "ModernBertForMaskedLM"},
    # Deeper and narrower than BERT's sizes (GLU expansion 2,304 / 5,248 = 2 x intermediate)
    presets={"modernbert-base": ("base", dict(num_hidden_layers=22, intermediate_size=1152)),
             "modernbert-large": ("large", dict(num_hidden_layers=28, intermediate_size=2624))},
    recipes=RECIPES,
    checkpoint=CheckpointLayout(
        weight_rules=(
            (r"^bert\.embeddings\.word_embeddings\.", "model.embeddings.tok_embeddings."),
            (r"^bert\.embeddings\.LayerNorm\.", "model.embeddings.norm."),
            (LAYER + r"attn_norm\.", r"model.layers.\1.attn_norm."),
            (LAYER + r"attention\.self\.(?:query|key|value)\.", r"model.layers.\1.attn.Wqkv."),  # see fused_weights
            (LAYER + r"attention\.output\.dense\.", r"model.layers.\1.attn.Wo."),
            (LAYER + r"mlp_norm\.", r"model.layers.\1.mlp_norm."),
            (LAYER + r"intermediate\.dense\.", r"model.layers.\1.mlp.Wi."),  # GeGLU [W_a; W_g] in both layouts
            (LAYER + r"output\.dense\.", r"model.layers.\1.mlp.Wo."),
            (r"^bert\.final_norm\.", "model.final_norm."),
            (r"^cls\.predictions\.transform\.dense\.", "head.dense."),
            (r"^cls\.predictions\.transform\.LayerNorm\.", "head.norm."),
            (r"^cls\.predictions\.bias$", "decoder.bias"),
            (r"^bert\.", "model."),
        ),
        fused_weights=(LAYER + r"attention\.self\.(query|key|value)\.", 2, ("query", "key", "value"))),
    schema=ConfigSchema(
        checks=checks((("mlp_dropout", "embedding_dropout", "attention_dropout"), RATE), (("norm_eps",), EPS),
                       (("initializer_cutoff_factor",), Field("number", 0, 100, open_low=True)),
                       (("rope_theta", "global_rope_theta", "local_rope_theta"), THETA),
                       (("local_attention",), Field("int", 2, MAX_POSITIONS)),
                       (("global_attn_every_n_layers",), SOME_LAYERS),
                       (("norm_bias", "mlp_bias", "attention_bias", "decoder_bias", "classifier_bias"), SWITCH),
                       (("hidden_activation", "classifier_activation"), TEXT), base=BERT_CHECKS),
        write_config=write_config,
        read_config=read_config,
        switches=MODERN_SWITCHES,
        keeps_token_ids=True,
        # its config.json names its special tokens (the tokenizer's), unlike BERT's
        token_ids_from_tokenizer={"cls_token_id": "cls", "sep_token_id": "sep", "bos_token_id": "cls",
                                  "eos_token_id": "sep"}),
    defaults=Defaults(
        vocab_size=50368,
        pad_token_id=50283,
        type_vocab_size=0,
        max_position_embeddings=8192,
        layer_norm_eps=1e-5,
        dropout=0.0,
        use_pooler=False,
        local_attention=128,
        global_attn_every_n_layers=3,
        rope_theta=160000.0,
        initializer_cutoff_factor=2.0,
        intermediate_scale=2 / 3),
    structure=StackTraits(
        norm_position="pre",
        position_embedding_type="rotary",
        mlp=GATED_MLP,
        bias=False),
    heads=Heads(
        # every ModernBertFor<Task> puts a dense-act-norm block before its classifier: bertforge's heads are its own
        hf_task_heads=(),
        single_segment=True))
