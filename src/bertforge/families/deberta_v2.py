"""DeBERTa-v2 / v3 (He et al. 2021, 2023; transformers' `DebertaV2*`, model_type "deberta-v2"): BERT's post-norm
encoder whose positions enter attention only, as disentangled relative scores (content -> position and position
-> content from log-bucketed distances, one shared relative table with a LayerNorm: `model.relative_position`);
no absolute position table and no token types; a 128k SentencePiece vocabulary; LayerNorm eps 1e-7.

What this file fixes, and where the shared code reads it:
  - position_embedding_type "disentangled": the encoder builds `RelativePositionEmbeddings` and every layer's
    `DisentangledSelfAttention` (the numbers, position_buckets ..., are config fields; any length runs, as in
    transformers: distances past the buckets share the outermost one);
  - sequence_head OWN_POOLER, pooler_act "gelu": DebertaV2Model has no pooler; its sequence and multiple-choice
    heads own one (`ContextPooler`: dense then GELU on the first token, stored as `pooler.`);
  - the MLM head: transformers 5 has two layouts with the same maths (dense, hidden_act, LayerNorm, the tied word
    embeddings, a bias). `lm_predictions.lm_head.*` (`legacy: false`) is the layout of Microsoft's checkpoints and
    the one written here; the legacy `cls.predictions.*` (config.json without `legacy`, or `legacy: true`) is read
    too (`alternative_weight_rules`). The enhanced mask decoder's extra layer over absolute positions is not part of
    either: transformers runs none (z_steps 0), so neither does bertforge;
  - replaced-token detection in its own layout ("rtd": DebertaV2Model, the RTD head beside it), with a generator of
    the same width and half the depth (He et al. 2023), and the `deberta-v3` recipe;
  - its tokenizer: SentencePiece unigram with [PAD] = 0, [CLS] = 1, [SEP] = 2, [UNK] = 3, the pieces, [MASK] last,
    whitespace runs collapsed, cased, pairs as [CLS] A [SEP] B [SEP] with type ids 0 / 1 (transformers'
    DebertaV2Tokenizer).
Refused in one line: absolute positions added to the input (position_biased_input, v1's layout), no relative
attention, DeBERTa-v2's convolution beside the first layer (conv_kernel_size), a factorised embedding (embed_proj)
and a head size other than hidden / heads.
"""
from __future__ import annotations

from typing import Any

from bertforge.errors import BertforgeError
from bertforge.families.electra import RTD_OBJECTIVE
from bertforge.families.family import (LAYER, OWN_POOLER, SHALLOW_GENERATOR, CheckpointLayout, ConfigSchema, Defaults,
                                       Family, Heads, StackTraits, TokenizerLayout, bert_read_config, bert_write_config)
from bertforge.families.record.schema import BERT_CHECKS, MAX_POSITIONS, RATE, SOME_WIDTH, SWITCH, TEXT, Field, checks

MODEL_TYPE = "deberta-v2"
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


def write_config(cfg: Any) -> dict[str, Any]:
    """`cfg` in DebertaV2Config's schema: BertConfig's fields (but its absolute `position_embedding_type`) and
    DeBERTa's own."""
    d = {k: v for k, v in bert_write_config(cfg).items() if k != "position_embedding_type"}
    return {**d, "relative_attention": True, "position_biased_input": False,
            "position_buckets": cfg.position_buckets, "max_relative_positions": cfg.max_relative_positions,
            "pos_att_type": list(cfg.relative_attention_terms), "share_att_key": cfg.share_relative_projections,
            "norm_rel_ebd": "layer_norm" if cfg.norm_relative_embeddings else "none", "pooler_hidden_act": "gelu",
            "pooler_dropout": 0.0, "pooler_hidden_size": cfg.hidden_size, "legacy": False}


def _terms(value: Any) -> tuple[str, ...]:
    """pos_att_type: a list, or the older "p2c|c2p" string (transformers reads both; `config.checks` has checked
    that it is one of them)."""
    if value is None:
        return ()
    parts = value.split("|") if isinstance(value, str) else value
    return tuple(t.strip().lower() for t in parts if t.strip())


def read_config(fam: Family, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig keyword arguments from a DebertaV2Config dict (missing keys: transformers' defaults)."""
    hidden, heads = d["hidden_size"], d["num_attention_heads"]
    refuse = {
        "relative_attention": (not d.get("relative_attention", False),
                               "without relative attention (relative_attention: false); bertforge computes "
                               "DeBERTa-v2/v3's disentangled attention"),
        "position_biased_input": (d.get("position_biased_input", True),
                                  "with absolute positions added to the input (position_biased_input: true)"),
        "conv_kernel_size": ((d.get("conv_kernel_size") or 0) > 0,
                             "with DeBERTa-v2's convolution beside the first layer (conv_kernel_size > 0)"),
        "embedding_size": (d.get("embedding_size") not in (None, hidden),
                           "with embedding_size != hidden_size (the embed_proj factorisation)"),
        "attention_head_size": (d.get("attention_head_size") not in (None, hidden // heads),
                                "with attention_head_size != hidden_size / num_attention_heads"),
        "pooler_hidden_act": (d.get("pooler_hidden_act", fam.pooler_act) != fam.pooler_act,
                              f"with pooler_hidden_act {d.get('pooler_hidden_act')!r} (the pooler is GELU)"),
        "pooler_hidden_size": (d.get("pooler_hidden_size") not in (None, hidden),
                               "with pooler_hidden_size != hidden_size"),
    }
    for key, (bad, what) in refuse.items():
        if bad:
            raise BertforgeError(f"{source}: a {MODEL_TYPE} model {what} is not supported ({key})")
    norm = [t.strip() for t in str(d.get("norm_rel_ebd") or "none").lower().split("|")]
    return {**bert_read_config(fam, d, source, ours), "type_vocab_size": d.get("type_vocab_size", 0),
            "layer_norm_eps": d.get("layer_norm_eps", 1e-7), "position_embedding_type": fam.position_embedding_type,
            "position_buckets": d.get("position_buckets", -1),
            "max_relative_positions": d.get("max_relative_positions", -1),
            "relative_attention_terms": _terms(d.get("pos_att_type")),
            "share_relative_projections": bool(d.get("share_att_key", False)),
            "norm_relative_embeddings": "layer_norm" in norm}


# transformers' DebertaV2Tokenizer: [PAD] [CLS] [SEP] [UNK] at 0-3, [MASK] after the pieces; whitespace runs and line
# breaks to one space, NFC, no trailing space, "▁" before every word; [CLS] A [SEP] B [SEP] with type ids 0 / 1.
# Cased, as Microsoft's DeBERTa-v2 / v3 tokenizers are (do_lower_case: false).
TOKENIZER = TokenizerLayout(
    model="unigram", specials={"pad": "[PAD]", "cls": "[CLS]", "sep": "[SEP]", "unk": "[UNK]", "mask": "[MASK]"},
    frame="cls-sep", hf_class="DebertaV2Tokenizer",
    special_map=(("bos_token", "cls"), ("eos_token", "sep"), ("unk_token", "unk"), ("sep_token", "sep"),
                 ("pad_token", "pad"), ("cls_token", "cls"), ("mask_token", "mask")),
    config={"split_by_punct": False, "add_prefix_space": True, "vocab_type": "spm"},
    cased=True, after_pieces=("mask",), collapses_whitespace=True)

RECIPES = (
    # He et al. 2023 (DeBERTa-v3): ELECTRA's replaced-token detection on a DeBERTa encoder, a generator of the same
    # width and half the depth, gradient-disentangled embedding sharing, SentencePiece in DeBERTa's layout;
    # ELECTRA's rate and RTD weight (50).
    dict(name="deberta-v3", objective=RTD_OBJECTIVE, masking="token", dynamic=True, input_format="full-sentences",
         tokenizer_kind=MODEL_TYPE, lr_scale=2.0, embedding_sharing="gdes"),
)

FAMILY = Family(
    MODEL_TYPE, "DebertaV2", "deberta",
    head_classes={"mlm": "DebertaV2ForMaskedLM", "rtd": "DebertaV2Model"},
    presets={"deberta-v3-xsmall": ("l6-h384", dict(num_hidden_layers=12)),
             "deberta-v3-small": ("base", dict(num_hidden_layers=6)),
             "deberta-v3-base": ("base", {}), "deberta-v3-large": ("large", {})},
    recipes=RECIPES,
    tokenizer=TOKENIZER,
    checkpoint=CheckpointLayout(
        weight_rules=(*BODY_RULES, *LM_PREDICTIONS_RULES, (r"^bert\.", "deberta.")),
        alternative_weight_rules=(*BODY_RULES, (r"^bert\.", "deberta."))),  # the legacy MLM head: cls.predictions.*
    schema=ConfigSchema(
        checks=checks((("attention_head_size", "pooler_hidden_size"), SOME_WIDTH), (("pooler_dropout",), RATE),
                       # disentangled attention: log buckets and the longest distance told apart (<= 0: none / the
                       # positions), its terms ("c2p|p2c" or a list), the relative table's norm ("layer_norm" or "none")
                       (("position_buckets", "max_relative_positions"), Field("int", -1, MAX_POSITIONS)),
                       (("pos_att_type",), Field("texts")), (("conv_kernel_size",), Field("int", 0, MAX_POSITIONS)),
                       (("relative_attention", "position_biased_input", "share_att_key", "legacy"), SWITCH),
                       (("pooler_hidden_act", "norm_rel_ebd", "conv_act"), TEXT), base=BERT_CHECKS),
        write_config=write_config,
        read_config=read_config),
    defaults=Defaults(
        vocab_size=128100,
        type_vocab_size=0,
        layer_norm_eps=1e-7,
        use_pooler=False),
    structure=StackTraits(
        position_embedding_type="disentangled"),
    heads=Heads(
        sequence_head=OWN_POOLER,
        pooler_act="gelu",
        single_segment=True,
        rtd_generator=SHALLOW_GENERATOR))
