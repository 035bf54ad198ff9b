"""RoBERTa (Liu et al. 2019): BERT's encoder with a byte-level BPE of 50k, <pad> = 1, positions counted from 2
(514 = 512 + pad + 1) and one segment; its MLM head is `lm_head` (erf GELU whatever hidden_act says), its sequence
classifier `RobertaClassificationHead` on <s> (no pooler)."""
from typing import Any

from bertforge.families.family import (FIRST_TOKEN, CheckpointLayout, ConfigSchema, Defaults, Family, Heads, Rules,
                                       StackTraits, VerbDefaults, bert_write_config)
from bertforge.families.record.tokenizer import BOS_EOS, ROLE_ENTRIES, TokenizerLayout

# RoBERTa's MLM head names (Longformer keeps them).
LM_HEAD_RULES: Rules = (
    (r"^cls\.predictions\.transform\.dense\.", "lm_head.dense."),
    (r"^cls\.predictions\.transform\.LayerNorm\.", "lm_head.layer_norm."),
    (r"^cls\.predictions\.bias$", "lm_head.bias"),
    (r"^cls\.predictions\.decoder\.", "lm_head.decoder."),
)


def write_config(cfg: Any) -> dict[str, Any]:
    return {**bert_write_config(cfg), "bos_token_id": 0, "eos_token_id": 2}


RECIPES = (
    # Liu et al. 2019: no NSP, dynamic masking, contiguous full sentences, byte-level BPE.
    dict(name="roberta", objective="mlm", masking="token", dynamic=True, input_format="full-sentences",
         tokenizer_kind="bpe"),
)

# RoBERTa's byte-level BPE ("bpe"; BART's is the same): <s> <pad> </s> <unk> <mask>, always cased, <s> A </s></s> B </s>
PLAIN_TOKENIZERS = {"bpe": TokenizerLayout(
    model="bpe", specials={"cls": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "<unk>", "mask": "<mask>"},
    frame="double-sep", hf_class="RobertaTokenizerFast", special_map=ROLE_ENTRIES + BOS_EOS,
    config={"add_prefix_space": False, "trim_offsets": True, "errors": "replace"}, cased=True,
    mask_lstrip=True)}

FAMILY = Family(
    "roberta", "Roberta", "roberta",
    head_classes={"mlm": "RobertaForMaskedLM", "ltr": "RobertaForCausalLM"},
    presets={"roberta-base": ("base", {})},
    recipes=RECIPES,
    plain_tokenizers=PLAIN_TOKENIZERS,
    checkpoint=CheckpointLayout(
        weight_rules=(*LM_HEAD_RULES, (r"^bert\.", "roberta."))),
    schema=ConfigSchema(
        write_config=write_config),
    defaults=Defaults(
        vocab_size=50265,
        pad_token_id=1,
        max_position_embeddings=514,
        type_vocab_size=1,
        layer_norm_eps=1e-5),
    structure=StackTraits(
        positions_after_padding=True,
        causal_encoder=True),
    heads=Heads(
        mlm_head_act="gelu",
        sequence_head=FIRST_TOKEN,
        single_segment=True),
    verbs=VerbDefaults(
        long_variant="longformer"))
