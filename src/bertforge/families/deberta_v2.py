"""DeBERTa-v2 / v3 (He et al. 2021, 2023; transformers' `DebertaV2*`, model_type "deberta-v2"): BERT's post-norm
encoder whose positions enter attention only, as disentangled relative scores (content -> position and position
-> content from log-bucketed distances, one shared relative table with a LayerNorm: `model.relative_position`);
no absolute position table and no token types; a 128k SentencePiece vocabulary; LayerNorm eps 1e-7.

What this file fixes, and where the shared code reads it:
  - position_embedding_type "disentangled": the encoder builds `RelativePositionEmbeddings` and every layer's
    `DisentangledSelfAttention` (the numbers, position_buckets ..., are config fields);
  - classifier_head "own_pooler", pooler_activation "gelu": DebertaV2Model has no pooler; its sequence and
    multiple-choice heads own one (`ContextPooler`: dense then GELU on the first token, stored as `pooler.`);
  - the MLM head: transformers 5 has two layouts with the same maths (dense, hidden_act, LayerNorm, the tied word
    embeddings, a bias). `lm_predictions.lm_head.*` (`legacy: false`) is the layout of Microsoft's checkpoints and
    the one written here; the legacy `cls.predictions.*` (config.json without `legacy`, or `legacy: true`) is read
    too. The enhanced mask decoder's extra layer over absolute positions is not part of either: transformers runs
    none (z_steps 0), so neither does bertforge;
  - its tokenizer: SentencePiece unigram with [PAD] = 0, [CLS] = 1, [SEP] = 2, [UNK] = 3, the pieces, [MASK] last,
    pairs as [CLS] A [SEP] B [SEP] with type ids 0 / 1 (transformers' DebertaV2Tokenizer).
Refused in one line: absolute positions added to the input (position_biased_input, v1's layout), no relative
attention, DeBERTa-v2's convolution beside the first layer (conv_kernel_size), a factorised embedding (embed_proj)
and a head size other than hidden / heads.
"""
from __future__ import annotations

from typing import Any

from tokenizers import Regex, decoders, normalizers, pre_tokenizers

from bertforge.errors import BertforgeError
from bertforge.families.family import LAYER, Family, TokenizerLayout, bert_config_json, bert_settings

SELF = LAYER + r"attention\.self\."
BODY_RULES = (
    (SELF + r"query\.", r"deberta.encoder.layer.\1.attention.self.query_proj."),
    (SELF + r"key\.", r"deberta.encoder.layer.\1.attention.self.key_proj."),
    (SELF + r"value\.", r"deberta.encoder.layer.\1.attention.self.value_proj."),
    (r"^bert\.encoder\.relative\.embeddings\.", "deberta.encoder.rel_embeddings."),
    (r"^bert\.encoder\.relative\.LayerNorm\.", "deberta.encoder.LayerNorm."),
    (r"^bert\.pooler\.", "pooler."),  # the classifier's ContextPooler sits beside the encoder
)
LM_PREDICTIONS_RULES = (
    (r"^cls\.predictions\.transform\.dense\.", "lm_predictions.lm_head.dense."),
    (r"^cls\.predictions\.transform\.LayerNorm\.", "lm_predictions.lm_head.LayerNorm."),
    (r"^cls\.predictions\.bias$", "lm_predictions.lm_head.bias"),
)


def config_json(cfg: Any) -> dict[str, Any]:
    """`cfg` in DebertaV2Config's schema: BertConfig's fields (but its absolute `position_embedding_type`) and
    DeBERTa's own."""
    d = {k: v for k, v in bert_config_json(cfg).items() if k != "position_embedding_type"}
    return {**d, "relative_attention": True, "position_biased_input": False,
            "position_buckets": cfg.position_buckets, "max_relative_positions": cfg.max_relative_positions,
            "pos_att_type": list(cfg.relative_attention_terms), "share_att_key": cfg.share_relative_projections,
            "norm_rel_ebd": "layer_norm" if cfg.norm_relative_embeddings else "none", "pooler_hidden_act": "gelu",
            "pooler_dropout": 0.0, "pooler_hidden_size": cfg.hidden_size, "legacy": False}


def _terms(value: Any, source: str) -> list[str]:
    """pos_att_type: a list, or the older "p2c|c2p" string (transformers reads both)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.lower().split("|") if t.strip()]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return [t.strip().lower() for t in value]
    raise BertforgeError(f"{source}: pos_att_type {value!r} is neither a list nor a 'c2p|p2c' string")


def settings(fam: Family, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig keyword arguments from a DebertaV2Config dict (missing keys: transformers' defaults)."""
    hidden, heads = d["hidden_size"], d["num_attention_heads"]
    refuse = {
        "relative_attention": (not d.get("relative_attention", False),
                               "without relative attention (relative_attention: false); bertforge computes "
                               "DeBERTa-v2/v3's disentangled attention"),
        "position_biased_input": (d.get("position_biased_input", True),
                                  "with absolute positions added to the input (position_biased_input: true)"),
        "conv_kernel_size": (d.get("conv_kernel_size", 0) > 0,
                             "with DeBERTa-v2's convolution beside the first layer (conv_kernel_size > 0)"),
        "embedding_size": (d.get("embedding_size", hidden) != hidden,
                           "with embedding_size != hidden_size (the embed_proj factorisation)"),
        "attention_head_size": (d.get("attention_head_size", hidden // heads) != hidden // heads,
                                "with attention_head_size != hidden_size / num_attention_heads"),
        "pooler_hidden_act": (d.get("pooler_hidden_act", "gelu") != fam.pooler_activation,
                              f"with pooler_hidden_act {d.get('pooler_hidden_act')!r} (the pooler is GELU)"),
        "pooler_hidden_size": (d.get("pooler_hidden_size", hidden) != hidden,
                               "with pooler_hidden_size != hidden_size"),
    }
    for key, (bad, what) in refuse.items():
        if bad:
            raise BertforgeError(f"{source}: a deberta-v2 model {what} is not supported ({key})")
    norm = [t.strip() for t in str(d.get("norm_rel_ebd") or "none").lower().split("|")]
    return {**bert_settings(fam, d, source, ours), "type_vocab_size": d.get("type_vocab_size", 0),
            "layer_norm_eps": d.get("layer_norm_eps", 1e-7), "position_embedding_type": fam.position_embedding_type,
            "position_buckets": d.get("position_buckets", -1),
            "max_relative_positions": d.get("max_relative_positions", -1),
            "relative_attention_terms": tuple(_terms(d.get("pos_att_type"), source)),
            "share_relative_projections": bool(d.get("share_att_key", False)),
            "norm_relative_embeddings": "layer_norm" in norm}


def _tokenizer_pipeline(backend: Any, lowercase: bool) -> None:
    """transformers' DebertaV2Tokenizer: whitespace runs and newlines to one space, NFC, no trailing space;
    "▁" before every word."""
    steps = [normalizers.Lowercase()] if lowercase else []
    steps += [normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "), normalizers.NFC(),
              normalizers.Strip(left=False, right=True)]
    backend.normalizer = normalizers.Sequence(steps)
    metaspace = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    backend.pre_tokenizer = pre_tokenizers.Sequence([metaspace])
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")


TOKENIZER = TokenizerLayout(
    tokenizer_class="DebertaV2Tokenizer",
    roles={"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
    first=("[PAD]", "[CLS]", "[SEP]", "[UNK]"), last=("[MASK]",), pair="segments", pipeline=_tokenizer_pipeline)

FAMILY = Family(
    "deberta-v2", "DebertaV2", "deberta", write_config=config_json, read_config=settings,
    weight_rules=(*BODY_RULES, *LM_PREDICTIONS_RULES, (r"^bert\.", "deberta.")),
    alternative_weight_rules=(*BODY_RULES, (r"^bert\.", "deberta.")),  # the legacy MLM head: cls.predictions.*
    presets={"deberta-v3-xsmall": ("l6-h384", dict(num_hidden_layers=12)),
             "deberta-v3-small": ("base", dict(num_hidden_layers=6)),
             "deberta-v3-base": ("base", {}), "deberta-v3-large": ("large", {})},
    vocab_size=128100, type_vocab_size=0, layer_norm_eps=1e-7, use_pooler=False,
    position_embedding_type="disentangled", classifier_head="own_pooler", pooler_activation="gelu",
    one_segment=True, tokenizer=TOKENIZER)
