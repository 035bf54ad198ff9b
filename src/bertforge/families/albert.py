"""ALBERT (Lan et al. 2020): E=128 factorised embeddings, all layers shared, no dropout, gelu_new, a 30k
SentencePiece. transformers stores the shared layer once, as group 0 (`albert_layer_groups.0.albert_layers.0`)."""
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.families.family import LAYER, Family, bert_write_config, bert_read_config

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

FAMILY = Family(
    "albert", "Albert", "albert", write_config=write_config, read_config=read_config,
    head_classes={"mlm": "AlbertForMaskedLM", "pretraining": "AlbertForPreTraining"},
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
    presets={"albert-base": ("base", {}), "albert-large": ("large", {})},
    vocab_size=30000, hidden_act="gelu_new", dropout=0.0, embedding_size=128, share_layers="all", factorised=True,
    shared_layers_as_one=True, recipes=RECIPES)
