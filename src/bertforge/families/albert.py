"""ALBERT (Lan et al. 2020): E=128 factorised embeddings, all layers shared, no dropout, gelu_new, a 30k
SentencePiece. transformers stores the shared layer once, as group 0 (`albert_layer_groups.0.albert_layers.0`)."""
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.families.family import (LAYER, CheckpointLayout, ConfigSchema, Defaults, Family, StackTraits,
                                       bert_read_config, bert_write_config)
from bertforge.families.record.tokenizer import BOS_EOS, ROLE_ENTRIES, TokenizerLayout
from bertforge.families.record.schema import BERT_CHECKS, SOME_LAYERS, checks

_GROUP = r"albert.encoder.albert_layer_groups.\1.albert_layers.0."


def write_config(cfg: Any) -> dict[str, Any]:
    return {**bert_write_config(cfg), "num_hidden_groups": 1 if cfg.share_layers == "all" else cfg.num_hidden_layers,
            "inner_group_num": 1}


def read_config(fam: Family, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
    groups = d.get("num_hidden_groups", 1)
    if d.get("inner_group_num", 1) != 1 or groups not in (1, d["num_hidden_layers"]):
        raise BertforgeError(f"{source}: ALBERT with num_hidden_groups={groups}, "
                             f"inner_group_num={d.get('inner_group_num')} is not supported")
    kwargs = bert_read_config(fam, d, source, ours)
    if groups == 1:
        kwargs["share_layers"] = "all"
    return kwargs


RECIPES = (
    # Lan et al. 2020: sentence-order prediction, factorised embeddings (E=128), all layers shared, unigram.
    dict(name="albert", objective="mlm+sop", masking="token", dynamic=False, input_format="segment-pair",
         tokenizer_kind="unigram", dupe_factor=5),
)

# ALBERT's SentencePiece Unigram ("unigram"): <pad> <unk> [CLS] [SEP] [MASK], "▁" word starts, [CLS] A [SEP] B [SEP]
PLAIN_TOKENIZERS = {"unigram": TokenizerLayout(
    model="unigram", specials={"pad": "<pad>", "unk": "<unk>", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
    frame="cls-sep", hf_class="AlbertTokenizerFast", special_map=ROLE_ENTRIES + BOS_EOS,
    config={"add_prefix_space": True, "trim_offsets": True,
            "model_input_names": ["input_ids", "token_type_ids", "attention_mask"]}, keep_accents=True)}

FAMILY = Family(
    "albert", "Albert", "albert",
    head_classes={"mlm": "AlbertForMaskedLM", "pretraining": "AlbertForPreTraining"},
    presets={"albert-base": ("base", {}), "albert-large": ("large", {})},
    recipes=RECIPES,
    plain_tokenizers=PLAIN_TOKENIZERS,
    checkpoint=CheckpointLayout(
        weight_rules=(
            (r"^bert\.embeddings_project\.", "albert.encoder.embedding_hidden_mapping_in."),
            (LAYER + r"attention\.self\.(query|key|value)\.", _GROUP + r"attention.\2."),
            (LAYER + r"attention\.output\.dense\.", _GROUP + "attention.dense."),
            (LAYER + r"attention\.output\.LayerNorm\.", _GROUP + "attention.LayerNorm."),
            (LAYER + r"intermediate\.dense\.", _GROUP + "ffn."),
            (LAYER + r"output\.dense\.", _GROUP + "ffn_output."),
            (LAYER + r"output\.LayerNorm\.", _GROUP + "full_layer_layer_norm."),
            (r"^bert\.pooler\.dense\.", "albert.pooler."),
            (r"^cls\.predictions\.transform\.dense\.", "predictions.dense."),
            (r"^cls\.predictions\.transform\.LayerNorm\.", "predictions.LayerNorm."),
            (r"^cls\.predictions\.", "predictions."),
            (r"^cls\.seq_relationship\.", "sop_classifier.classifier."),
            (r"^bert\.", "albert."),
        ),
        shared_layers_as_one=True),
    schema=ConfigSchema(
        checks=checks((("num_hidden_groups", "inner_group_num"), SOME_LAYERS), base=BERT_CHECKS),
        write_config=write_config,
        read_config=read_config),
    defaults=Defaults(
        vocab_size=30000,
        hidden_act="gelu_new",
        dropout=0.0,
        embedding_size=128,
        share_layers="all"),
    structure=StackTraits(
        factorised=True))
