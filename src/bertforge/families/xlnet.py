"""XLNet (Yang et al. 2019): Transformer-XL relative attention, two streams, relative segments; a 32k SentencePiece
with <pad> = 5; no pooler (XLNet summarises the last token in its task heads). Its modules already carry
transformers' names (`bertforge.model.xlnet`); the LM head is `lm_loss`. Its config.json is `XLNetConfig`'s."""
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.families.family import CheckpointLayout, ConfigSchema, Defaults, Family, StackTraits
from bertforge.families.record.schema import (BERT_CHECKS, FFN, HEADS, LAYERS, MAX_POSITIONS, RATE, SOME_WIDTH, TEXT,
                                              WIDTH, Field, checks)


def write_config(cfg: Any) -> dict[str, Any]:
    """transformers' XLNetConfig schema (no max_position_embeddings: XLNetConfig's setter raises)."""
    return dict(
        model_type="xlnet", vocab_size=cfg.vocab_size, d_model=cfg.hidden_size,
        n_layer=cfg.num_hidden_layers, n_head=cfg.num_attention_heads, d_head=cfg.head_dim,
        d_inner=cfg.intermediate_size, ff_activation=cfg.hidden_act, dropout=cfg.hidden_dropout_prob,
        layer_norm_eps=cfg.layer_norm_eps, initializer_range=cfg.initializer_range,
        pad_token_id=cfg.pad_token_id, attn_type="bi", bi_data=False, clamp_len=cfg.clamp_len,
        mem_len=cfg.mem_len, reuse_len=None, same_length=False, untie_r=True)


def read_config(fam: Family, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
    """XLNetConfig -> ModelConfig keyword arguments; the settings bertforge's XLNet does not implement are refused
    by name."""
    unsupported = {"attn_type": (d.get("attn_type", "bi"), "bi"), "bi_data": (bool(d.get("bi_data")), False)}
    for name, (got, ours_value) in unsupported.items():
        if got != ours_value:
            raise BertforgeError(f"{source}: XLNet with {name}={got!r} is not supported (bertforge runs "
                                 f"{name}={ours_value!r})")
    n_head = d["n_head"]
    if d.get("d_head") not in (None, d["d_model"] // n_head):
        raise BertforgeError(f"{source}: d_head {d['d_head']} is not d_model // n_head")
    return dict(model_type="xlnet", vocab_size=d["vocab_size"], hidden_size=d["d_model"],
                num_hidden_layers=d["n_layer"], num_attention_heads=n_head, intermediate_size=d["d_inner"],
                hidden_act=d.get("ff_activation", "gelu"), hidden_dropout_prob=d.get("dropout", 0.1),
                attention_probs_dropout_prob=d.get("dropout", 0.1), type_vocab_size=2,
                initializer_range=d.get("initializer_range", 0.02), layer_norm_eps=d.get("layer_norm_eps", 1e-12),
                pad_token_id=d.get("pad_token_id") or 0, use_pooler=False,
                clamp_len=-1 if d.get("clamp_len") is None else d["clamp_len"], mem_len=d.get("mem_len"))


RECIPES = (
    # Yang et al. 2019: permutation LM with two-stream relative attention, the last 1/6 of each order predicted,
    # dynamic orders over contiguous text, SentencePiece (Unigram).
    dict(name="xlnet", objective="plm", masking="token", dynamic=True, input_format="full-sentences",
         tokenizer_kind="unigram"),
)

FAMILY = Family(
    "xlnet", "XLNet", "transformer",
    head_classes={"lm": "XLNetLMHeadModel"},
    presets={"xlnet-base": ("base", {}), "xlnet-large": ("large", {})},
    recipes=RECIPES,
    checkpoint=CheckpointLayout(
        weight_rules=((r"^bert\.", "transformer."),),
        bare_parts=("word_embedding", "layer")),
    schema=ConfigSchema(
        checks=checks((("n_layer",), LAYERS), (("n_head",), HEADS), (("d_model",), WIDTH), (("d_head",), SOME_WIDTH),
                       (("d_inner",), FFN), (("dropout",), RATE), (("clamp_len",), Field("int", -1, MAX_POSITIONS)),
                       (("mem_len",), Field("int", 0, MAX_POSITIONS)), (("ff_activation", "attn_type"), TEXT),
                       base=BERT_CHECKS),
        write_config=write_config,
        read_config=read_config),
    defaults=Defaults(
        vocab_size=32000,
        pad_token_id=5,
        use_pooler=False),
    structure=StackTraits(
        relative_positions=True,
        streams=2))
